//! `[ha] commit_markers = true`: the table sessions write their commit markers to. Each
//! session upserts its own row (its random key, the sequence number of its commit) inside
//! every transaction that wrote, right before the COMMIT; after losing a COMMIT's answer it
//! reads the row back on the node that took over (see `session/markers.rs`). The row
//! replicates with the transaction, so it is there exactly when the transaction is.
//!
//! Created on the primary through the monitor account, which replicates it everywhere.
//! No client account may read or change the table itself: a forged `seq` would make a
//! failover answer OK for a COMMIT that rolled back, or run a committed one twice. Sessions
//! write their row through [`MARK`] and read it through [`MARKER_OF`], a procedure and a
//! function with `SQL SECURITY DEFINER` (the monitor account) that everyone may execute
//! (`GRANT EXECUTE ... TO PUBLIC`, MariaDB 10.11). A row belongs to the user name that
//! wrote it first (`USER()` inside a definer routine is the caller's login): another
//! account can neither change nor read it, even knowing its random 64-bit key (which only
//! holdfast and that session's own statements carry). Rows not touched for a day belong to
//! sessions long gone and are purged.

use super::probe::NodeSession;
use crate::config::Config;
use crate::topology::Topology;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The marker table.
pub const TABLE: &str = "holdfast.commit_marker";

/// The procedure a session writes its marker with: `CALL holdfast.mark_v1(key, seq,
/// ROW_COUNT(), LAST_INSERT_ID())`.
pub const MARK: &str = "holdfast.mark_v1";
/// The function a session reads its marker with: `SELECT holdfast.marker_of_v1(key)`,
/// `"seq affected insert_id"` or NULL.
pub const MARKER_OF: &str = "holdfast.marker_of_v1";

const CREATE: [&str; 5] = [
    "CREATE DATABASE IF NOT EXISTS holdfast",
    "CREATE TABLE IF NOT EXISTS holdfast.commit_marker (\
     session BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
     owner VARCHAR(128) NOT NULL DEFAULT '', \
     seq BIGINT UNSIGNED NOT NULL, \
     affected BIGINT NULL, \
     insert_id BIGINT UNSIGNED NULL, \
     at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP\
     ) ENGINE=InnoDB",
    // A table made by an earlier holdfast.
    "ALTER TABLE holdfast.commit_marker \
     ADD COLUMN IF NOT EXISTS owner VARCHAR(128) NOT NULL DEFAULT '' AFTER session",
    "CREATE PROCEDURE IF NOT EXISTS holdfast.mark_v1(\
     k BIGINT UNSIGNED, s BIGINT UNSIGNED, a BIGINT, i BIGINT UNSIGNED) \
     MODIFIES SQL DATA SQL SECURITY DEFINER \
     INSERT INTO holdfast.commit_marker (session, owner, seq, affected, insert_id) \
     VALUES (k, SUBSTRING_INDEX(USER(), '@', 1), s, a, i) \
     ON DUPLICATE KEY UPDATE \
     seq = IF(owner = VALUES(owner), VALUES(seq), seq), \
     affected = IF(owner = VALUES(owner), VALUES(affected), affected), \
     insert_id = IF(owner = VALUES(owner), VALUES(insert_id), insert_id)",
    "CREATE FUNCTION IF NOT EXISTS holdfast.marker_of_v1(k BIGINT UNSIGNED) \
     RETURNS VARCHAR(80) READS SQL DATA SQL SECURITY DEFINER \
     RETURN (SELECT CONCAT_WS(' ', seq, IFNULL(affected, -1), IFNULL(insert_id, 0)) \
     FROM holdfast.commit_marker \
     WHERE session = k AND owner = SUBSTRING_INDEX(USER(), '@', 1))",
];
/// Everyone may run the two routines.
const GRANT: [&str; 2] = [
    "GRANT EXECUTE ON PROCEDURE holdfast.mark_v1 TO PUBLIC",
    "GRANT EXECUTE ON FUNCTION holdfast.marker_of_v1 TO PUBLIC",
];
/// Nobody but the monitor touches the table: an earlier holdfast granted it to PUBLIC
/// (1141/1147, "no such grant", otherwise).
const REVOKE: &str = "REVOKE SELECT, INSERT, UPDATE ON holdfast.commit_marker FROM PUBLIC";
const PURGE: &str = "DELETE FROM holdfast.commit_marker WHERE at < NOW() - INTERVAL 1 DAY";

const RETRY_EVERY: Duration = Duration::from_secs(1);
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// Creates the marker table on the primary, then sets `ready` (sessions write markers from
/// then on) and purges old rows hourly.
pub async fn keep_marker_table(
    live: crate::LiveConfig,
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
        match run_on_primary(&live.load_full(), &topology, &CREATE).await {
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
    if let Err(e) = run_on_primary(&live.load_full(), &topology, &GRANT).await {
        tracing::warn!(error = %e, "commit markers: granting EXECUTE on {MARK} and {MARKER_OF} TO PUBLIC failed (the monitor account has no GRANT OPTION?); accounts without EXECUTE on them commit without a marker");
    }
    if run_on_primary(&live.load_full(), &topology, &[REVOKE])
        .await
        .is_ok()
    {
        tracing::info!("commit markers: PUBLIC's rights on {TABLE} taken back (the routines are the way in now)");
    }
    ready.store(true, Ordering::Release);
    tracing::info!("commit markers: {TABLE} ready");
    loop {
        tokio::time::sleep(PURGE_EVERY).await;
        if let Err(e) = run_on_primary(&live.load_full(), &topology, &[PURGE]).await {
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
