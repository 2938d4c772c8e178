//! `[ha] commit_markers = true`: the table sessions write their commit markers to. Each
//! session upserts its own row (its random key, the sequence number of its commit) inside
//! every transaction that wrote, right before the COMMIT; after losing a COMMIT's answer it
//! reads the row back on the node that took over (see `session/markers.rs`). The row
//! replicates with the transaction, so it is there exactly when the transaction is.
//!
//! Created on the primary through the monitor account, which replicates it everywhere;
//! every account may write it (`GRANT ... TO PUBLIC`, MariaDB 10.11). Rows not touched for
//! a day belong to sessions long gone and are purged.

use super::probe::NodeSession;
use crate::config::Config;
use crate::topology::Topology;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The marker table.
pub const TABLE: &str = "holdfast.commit_marker";

const CREATE: [&str; 2] = [
    "CREATE DATABASE IF NOT EXISTS holdfast",
    "CREATE TABLE IF NOT EXISTS holdfast.commit_marker (\
     session BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
     seq BIGINT UNSIGNED NOT NULL, \
     affected BIGINT NULL, \
     insert_id BIGINT UNSIGNED NULL, \
     at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP\
     ) ENGINE=InnoDB",
];
const GRANT: &str = "GRANT SELECT, INSERT, UPDATE ON holdfast.commit_marker TO PUBLIC";
const PURGE: &str = "DELETE FROM holdfast.commit_marker WHERE at < NOW() - INTERVAL 1 DAY";

const RETRY_EVERY: Duration = Duration::from_secs(1);
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Creates the marker table on the primary, then sets `ready` (sessions write markers from
/// then on) and purges old rows hourly.
pub async fn keep_marker_table(
    cfg: Arc<Config>,
    topology: watch::Receiver<Arc<Topology>>,
    ready: Arc<AtomicBool>,
) {
    let mut failures = 0u32;
    let mut topology = topology;
    loop {
        if !has_writable_primary(&topology) {
            // Until the first probe says which node is writable.
            let _ = tokio::time::timeout(RETRY_EVERY, topology.changed()).await;
            continue;
        }
        match run_on_primary(&cfg, &topology, &CREATE).await {
            Ok(()) => break,
            Err(e) => {
                failures += 1;
                // Once, then every minute: a monitor without CREATE on holdfast.* would
                // flood the log.
                if failures % 60 == 1 {
                    tracing::warn!(error = %e, "commit markers: cannot create {TABLE} yet (the monitor account needs CREATE on holdfast.*); COMMITs carry no marker until it exists");
                }
                tokio::time::sleep(RETRY_EVERY).await;
            }
        }
    }
    if let Err(e) = run_on_primary(&cfg, &topology, &[GRANT]).await {
        tracing::warn!(error = %e, "commit markers: granting {TABLE} TO PUBLIC failed (the monitor account has no GRANT OPTION?); accounts without SELECT, INSERT, UPDATE on it commit without a marker");
    }
    ready.store(true, Ordering::Release);
    tracing::info!("commit markers: {TABLE} ready");
    loop {
        tokio::time::sleep(PURGE_EVERY).await;
        if let Err(e) = run_on_primary(&cfg, &topology, &[PURGE]).await {
            tracing::debug!(error = %e, "commit markers: purge failed");
        }
    }
}

fn has_writable_primary(topology: &watch::Receiver<Arc<Topology>>) -> bool {
    topology
        .borrow()
        .primary_node()
        .is_some_and(|n| n.read_only == Some(false))
}

async fn run_on_primary(
    cfg: &Config,
    topology: &watch::Receiver<Arc<Topology>>,
    statements: &[&str],
) -> Result<(), String> {
    let primary = topology
        .borrow()
        .primary_node()
        .filter(|n| n.read_only == Some(false))
        .map(|n| n.name.clone())
        .ok_or("no writable primary known")?;
    let backends = topology.borrow().backends();
    let node = backends
        .iter()
        .find(|b| b.name == primary)
        .ok_or("the primary is not a configured backend")?;
    let mut session = NodeSession::connect(cfg, node, cfg.ha.statement_timeout())
        .await
        .map_err(|e| e.to_string())?;
    for sql in statements {
        session.exec(sql).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
