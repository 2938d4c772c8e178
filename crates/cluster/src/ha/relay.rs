//! Before a failover promotes a replica: the relay logs.
//!
//! With semi-sync a client's COMMIT is acknowledged as soon as one replica's IO thread has
//! the transaction in its relay log, applied or not. Promotion runs `RESET SLAVE ALL`,
//! which deletes the relay log, so a replica promoted before its SQL thread applied what
//! it received throws acknowledged writes away (a stopped SQL thread, a slow one, an
//! applier error). Here every replica that received everything any replica received gets
//! its SQL thread started if it is stopped, and the failover waits until one of them has
//! applied it all; only such a replica may be promoted automatically.

use super::gtid::GtidPos;
use super::probe::{NodeReplication, NodeSession};
use super::HaError;
use crate::config::{BackendConfig, Config};
use std::time::{Duration, Instant};

/// How often the wait looks at the replicas' applied positions.
const POLL: Duration = Duration::from_millis(10);

/// What the replicas hold once they had their chance to apply their relay logs.
#[derive(Debug)]
pub(super) struct Applied {
    /// Every transaction any replica received from the lost primary or applied: what the
    /// new primary must have so that no acknowledged write is lost.
    pub received: GtidPos,
    /// The latest probe of every replica still reachable.
    pub replicas: Vec<NodeReplication>,
    pub warnings: Vec<String>,
}

impl Applied {
    /// The replicas that have applied everything in [`Applied::received`].
    pub fn complete(&self) -> Vec<&NodeReplication> {
        self.replicas
            .iter()
            .filter(|r| r.executed().contains(&self.received))
            .collect()
    }
}

/// What a replica has: applied, or received into its relay log.
pub(super) fn received_by(r: &NodeReplication) -> GtidPos {
    match &r.slave {
        Some(s) => r.executed().merge_max(&s.gtid_io_pos),
        None => r.executed(),
    }
}

/// Lets the replicas apply what they received, for at most `limit`: returns as soon as one
/// replica has applied everything any of them received, or when none of those that could
/// still can.
pub(super) async fn apply_received(
    cfg: &Config,
    nodes: &[BackendConfig],
    replicas: &[&NodeReplication],
    limit: Duration,
    statement_timeout: Duration,
) -> Applied {
    let received = replicas
        .iter()
        .fold(GtidPos::default(), |acc, r| acc.merge_max(&received_by(r)));
    let mut warnings = Vec::new();
    let mut latest: Vec<NodeReplication> = replicas.iter().map(|r| (*r).clone()).collect();
    let deadline = Instant::now() + limit;

    // Only a replica that received everything can apply everything: the others would need
    // transactions only the lost primary had.
    let mut waiting = Vec::new();
    for r in replicas {
        let has = received_by(r);
        if !has.contains(&received) {
            warnings.push(format!(
                "{} received only {has} of {received} before the primary was lost",
                r.name
            ));
            continue;
        }
        if r.executed().contains(&received) {
            // Nothing to apply: no wait at all on the common path.
            return Applied {
                received,
                replicas: latest,
                warnings,
            };
        }
        let Some(node) = nodes.iter().find(|n| n.name == r.name) else {
            continue;
        };
        match NodeSession::connect(cfg, node, statement_timeout).await {
            Ok(mut s) => {
                let stopped = r.slave.as_ref().is_some_and(|st| st.sql_running != "Yes");
                if stopped {
                    let why = r
                        .slave
                        .as_ref()
                        .map(|st| st.last_error.clone())
                        .filter(|e| !e.is_empty())
                        .unwrap_or_else(|| "stopped".into());
                    tracing::warn!(node = %r.name, reason = %why, "ha: the SQL thread of a failover candidate is not running; starting it to apply its relay log");
                    if let Err(e) = s.exec("START SLAVE SQL_THREAD").await {
                        warnings.push(format!("{}: START SLAVE SQL_THREAD: {e}", r.name));
                    }
                }
                waiting.push(s);
            }
            Err(e) => warnings.push(format!("{}: {e}", r.name)),
        }
    }

    while !waiting.is_empty() {
        let mut still = Vec::with_capacity(waiting.len());
        let mut done = false;
        for mut s in waiting {
            match s.replication().await {
                Ok(now) => {
                    done |= now.executed().contains(&received);
                    if let Some(slot) = latest.iter_mut().find(|l| l.name == now.name) {
                        *slot = now;
                    }
                    still.push(s);
                }
                Err(e) => {
                    warnings.push(format!("{}: {e}", s.name));
                    latest.retain(|l| l.name != s.name);
                }
            }
        }
        if done {
            break;
        }
        if Instant::now() >= deadline {
            for s in &still {
                if let Some(r) = latest.iter().find(|l| l.name == s.name) {
                    let error = r
                        .slave
                        .as_ref()
                        .map(|st| st.last_error.clone())
                        .filter(|e| !e.is_empty())
                        .map(|e| format!(" (SQL thread error: {e})"))
                        .unwrap_or_default();
                    warnings.push(format!(
                        "{} applied {} of the {received} it received within {limit:?}{error}",
                        s.name,
                        r.executed()
                    ));
                }
            }
            break;
        }
        waiting = still;
        tokio::time::sleep(POLL).await;
    }
    Applied {
        received,
        replicas: latest,
        warnings,
    }
}

/// The error for a failover that would lose `applied.received` beyond what the best
/// candidate has.
pub(super) fn would_lose(lost: &str, applied: &Applied, best: Option<&NodeReplication>) -> HaError {
    let detail = match best {
        Some(b) => format!(
            "promoting the most advanced, {} (at {}), would lose {}",
            b.name,
            b.executed(),
            applied.received.missing_from(&b.executed()).join("; ")
        ),
        None => "no replica is reachable".to_string(),
    };
    HaError::WouldLoseWrites {
        lost: lost.to_string(),
        received: applied.received.clone(),
        detail,
        warnings: applied.warnings.clone(),
    }
}
