//! `[ha] durability = "semi-sync"`: holdfast keeps MariaDB's semi-synchronous replication
//! on (`rpl_semi_sync_master_enabled` with wait point AFTER_SYNC on the primary, set when
//! a switchover or failover promotes it and off on every replica, whose own applier would
//! otherwise wait; `rpl_semi_sync_slave_enabled` everywhere, so every replica
//! acknowledges), and watches whether the primary runs it right now. MariaDB falls back to asynchronous replication when no
//! replica acknowledges within `rpl_semi_sync_master_timeout`: `/status` shows it, the log
//! says that writes acknowledged from then on may be lost in a failover, and each fallback
//! is counted. Checked once a second, never while an HA operation runs.

use super::controller::HaController;
use super::probe::{is_on, NodeSession};
use super::HaError;
use crate::config::{Config, Durability, HaConfig, HaMode};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What `/status` shows about semi-synchronous replication.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemiSyncState {
    /// The primary waits for a replica's acknowledgement right now
    /// (`Rpl_semi_sync_master_status`).
    pub active: bool,
    /// The primary it was read from.
    pub primary: Option<String>,
    /// Replicas connected as semi-synchronous (`Rpl_semi_sync_master_clients`).
    pub clients: u64,
    /// Commits acknowledged by a replica, and commits that were not (on that primary).
    pub acknowledged_commits: u64,
    pub unacknowledged_commits: u64,
    /// Times holdfast saw the primary fall back to asynchronous replication.
    pub fallbacks: u64,
}

const CHECK_EVERY: Duration = Duration::from_secs(1);

impl HaController {
    /// Keeps semi-synchronous replication on and `/status` current (managed mode with
    /// `durability = "semi-sync"`; returns at once otherwise).
    pub async fn keep_durability(self: Arc<Self>) {
        // Mode and durability are kept as they started by a reload (they need a restart);
        // the timeout and the probe timeout apply from the next check.
        let mut cfg = self.config();
        if cfg.ha.mode != HaMode::Managed || cfg.ha.durability != Durability::SemiSync {
            return;
        }
        tracing::info!(
            timeout_ms = cfg.ha.semi_sync_timeout_ms,
            "ha: durability semi-sync; keeping semi-synchronous replication on every node"
        );
        let mut sessions: HashMap<String, NodeSession> = HashMap::new();
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A primary newly watched (at start, when this member comes to lead, after an
        // operation) is checked at once: until its waiting side is on, it acknowledges
        // commits that no replica has.
        let mut state = self.subscribe();
        let mut checked_watching = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = state.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let watching = state.borrow_and_update().watching.clone();
                    if watching.is_none() || watching == checked_watching {
                        continue;
                    }
                }
            }
            checked_watching = self.state().watching;
            cfg = self.config();
            if self.state().in_progress.is_some() {
                // Operations repoint replicas and fence nodes; look again afterwards.
                sessions.clear();
                continue;
            }
            // The primary as both the monitor and the controller see it: right after an
            // operation they may disagree for a moment, and a replica must never be
            // turned into a semi-sync primary (its applier would wait for
            // acknowledgements).
            let primary = self.primary_name();
            if primary.is_none() || primary != self.state().watching {
                continue;
            }
            for node in &self.backends() {
                let is_primary = primary.as_deref() == Some(node.name.as_str());
                if !sessions.contains_key(&node.name) {
                    match NodeSession::connect(&cfg, node, cfg.ha.probe_timeout()).await {
                        Ok(s) => {
                            sessions.insert(node.name.clone(), s);
                        }
                        Err(_) => continue,
                    }
                }
                let Some(session) = sessions.get_mut(&node.name) else {
                    continue;
                };
                let checked = async {
                    ensure_settings(session, &cfg, is_primary).await?;
                    if is_primary {
                        let seen = read_status(session).await?;
                        self.note_semi_sync(&node.name, seen);
                    }
                    Ok::<_, HaError>(())
                }
                .await;
                if let Err(e) = checked {
                    tracing::debug!(node = %node.name, error = %e, "ha: semi-sync check failed");
                    sessions.remove(&node.name);
                }
            }
        }
    }

    /// Records what the primary reports, logging and counting a fallback to asynchronous
    /// replication (and the way back).
    fn note_semi_sync(&self, primary: &str, seen: SemiSyncState) {
        let before = self.state().semi_sync.unwrap_or_default();
        let same_primary = before.primary.as_deref() == Some(primary);
        let mut fallbacks = before.fallbacks;
        if same_primary && before.active && !seen.active {
            fallbacks += 1;
            tracing::warn!(
                node = %primary,
                clients = seen.clients,
                "ha: semi-sync fell back to asynchronous replication (no replica acknowledged in time): writes acknowledged from now on may be lost in a failover"
            );
        } else if seen.active && !(same_primary && before.active) {
            tracing::info!(node = %primary, clients = seen.clients, "ha: semi-sync active");
        } else if !seen.active && !same_primary {
            tracing::warn!(node = %primary, "ha: semi-sync not active on the primary: writes may be lost in a failover");
        }
        let now = SemiSyncState {
            primary: Some(primary.to_string()),
            fallbacks,
            ..seen
        };
        if before != now {
            self.update_state(|s| s.semi_sync = Some(now));
        }
    }
}

/// `SET GLOBAL` of the primary's side of semi-sync as `ha` wants it.
pub fn enable_primary_side(ha: &HaConfig) -> String {
    format!(
        "SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC', \
         rpl_semi_sync_master_timeout = {}, rpl_semi_sync_master_enabled = ON",
        ha.semi_sync_timeout_ms
    )
}

/// Sets what semi-sync needs where it is missing: the waiting side on the primary only
/// (a replica with it would make its own applier wait for acknowledgements), the
/// acknowledging side everywhere. A replica whose acknowledging side was just turned on
/// restarts its IO thread (the setting applies when it connects).
async fn ensure_settings(
    session: &mut NodeSession,
    cfg: &Config,
    is_primary: bool,
) -> Result<(), HaError> {
    let r = session
        .query_within(
            "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_master_wait_point, \
             @@rpl_semi_sync_master_timeout, @@rpl_semi_sync_slave_enabled",
            cfg.ha.probe_timeout(),
        )
        .await?;
    let row = r.rows.first().cloned().unwrap_or_default();
    let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let on = |v: String| is_on(&v);
    let timeout = cfg.ha.semi_sync_timeout_ms;
    if is_primary
        && (!on(col(0))
            || !col(1).eq_ignore_ascii_case("AFTER_SYNC")
            || col(2) != timeout.to_string())
    {
        session.exec(&enable_primary_side(&cfg.ha)).await?;
    } else if !is_primary && on(col(0)) {
        session
            .exec("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
            .await?;
    }
    if !on(col(3)) {
        session
            .exec("SET GLOBAL rpl_semi_sync_slave_enabled = ON")
            .await?;
        let replicating = session
            .query_within("SHOW SLAVE STATUS", cfg.ha.probe_timeout())
            .await?
            .maps()
            .into_iter()
            .next()
            .is_some_and(|m| {
                m.get("Slave_IO_Running").cloned().flatten().as_deref() == Some("Yes")
            });
        if replicating {
            session.exec("STOP SLAVE IO_THREAD").await?;
            session.exec("START SLAVE IO_THREAD").await?;
        }
    }
    Ok(())
}

async fn read_status(session: &mut NodeSession) -> Result<SemiSyncState, HaError> {
    let r = session
        .query_within(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Rpl_semi_sync_master_status', \
             'Rpl_semi_sync_master_clients', 'Rpl_semi_sync_master_yes_tx', \
             'Rpl_semi_sync_master_no_tx')",
            Duration::from_secs(2),
        )
        .await?;
    let mut out = SemiSyncState::default();
    for row in &r.rows {
        let name = row.first().cloned().flatten().unwrap_or_default();
        let value = row.get(1).cloned().flatten().unwrap_or_default();
        let n = || value.parse().unwrap_or(0);
        match name.to_ascii_lowercase().as_str() {
            "rpl_semi_sync_master_status" => out.active = is_on(&value),
            "rpl_semi_sync_master_clients" => out.clients = n(),
            "rpl_semi_sync_master_yes_tx" => out.acknowledged_commits = n(),
            "rpl_semi_sync_master_no_tx" => out.unacknowledged_commits = n(),
            _ => {}
        }
    }
    Ok(out)
}
