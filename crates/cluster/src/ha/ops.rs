//! Switchover, failover and rejoin.

use super::detect::{find_writable, replicas_confirm_loss};
use super::gtid::GtidPos;
use super::probe::{probe_all, NodeReplication, NodeSession};
use super::relay;
use super::{split_address, HaConfig, HaError};
use crate::config::{BackendConfig, Config, Durability};
use crate::control::BackendError;
use holdfast_sql::quote;
use serde::Serialize;
use std::time::{Duration, Instant};

/// MariaDB's "Unknown thread id" (the connection ended before we killed it).
const ER_NO_SUCH_THREAD: u16 = 1094;
/// MariaDB's replica IO error when the primary's binlog lacks the requested GTID.
const ER_MASTER_FATAL_ERROR_READING_BINLOG: u32 = 1236;
/// How often waits re-check.
const POLL: Duration = Duration::from_millis(100);

pub(crate) fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// One timed step of an operation.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: &'static str,
    #[serde(serialize_with = "ser_ms")]
    pub took: Duration,
}

/// Measures consecutive phases.
struct Timer {
    start: Instant,
    last: Instant,
    phases: Vec<Phase>,
}

impl Timer {
    fn new() -> Self {
        let now = Instant::now();
        Timer {
            start: now,
            last: now,
            phases: Vec::new(),
        }
    }

    fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        tracing::info!(phase = name, took = ?now.duration_since(self.last), "ha: phase done");
        self.phases.push(Phase {
            name,
            took: now.duration_since(self.last),
        });
        self.last = now;
    }
}

/// A node that was not re-pointed, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub node: String,
    pub reason: String,
}

/// What a switchover did.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchoverReport {
    pub old_primary: String,
    pub new_primary: String,
    /// The old primary's `gtid_binlog_pos` once fenced: every transaction it committed.
    pub fenced_at: GtidPos,
    /// Client connections killed on the old primary.
    pub killed_connections: usize,
    /// Nodes now replicating from the new primary (the old primary first).
    pub repointed: Vec<String>,
    pub skipped: Vec<Skipped>,
    pub phases: Vec<Phase>,
    /// From `read_only=ON` on the old primary to `read_only=OFF` on the new one.
    #[serde(serialize_with = "ser_ms")]
    pub writes_blocked: Duration,
    #[serde(serialize_with = "ser_ms")]
    pub total: Duration,
    pub warnings: Vec<String>,
}

/// What a failover did.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub lost_primary: String,
    pub new_primary: String,
    /// The promoted node's position: every transaction the new primary starts from.
    pub promoted_at: GtidPos,
    /// Each replica's applied position when the candidate was chosen.
    pub positions: Vec<(String, GtidPos)>,
    pub repointed: Vec<String>,
    pub skipped: Vec<Skipped>,
    /// The lost primary must be brought back with [`rejoin`].
    pub needs_rejoin: Vec<String>,
    pub phases: Vec<Phase>,
    #[serde(serialize_with = "ser_ms")]
    pub total: Duration,
    pub warnings: Vec<String>,
}

/// What a rejoin did.
#[derive(Debug, Clone, Serialize)]
pub struct RejoinReport {
    pub node: String,
    pub primary: String,
    /// The node's own position before it was re-pointed.
    pub node_was_at: GtidPos,
    /// The primary's position it caught up with.
    pub caught_up_to: GtidPos,
    pub phases: Vec<Phase>,
    #[serde(serialize_with = "ser_ms")]
    pub total: Duration,
}

fn find<'a>(nodes: &'a [BackendConfig], name: &str) -> Result<&'a BackendConfig, HaError> {
    nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| HaError::UnknownNode(name.to_string()))
}

fn probe_of<'a>(probes: &'a [NodeReplication], name: &str) -> Option<&'a NodeReplication> {
    probes.iter().find(|p| p.name == name)
}

/// The nodes to re-point after an operation: all but `except` that answered the probe; the
/// unreachable ones are reported as skipped.
fn reachable_except<'a>(
    nodes: impl Iterator<Item = &'a BackendConfig>,
    except: &[&str],
    probes: &[NodeReplication],
    operation: &str,
    skipped: &mut Vec<Skipped>,
) -> Vec<&'a BackendConfig> {
    let mut reachable = Vec::new();
    for n in nodes.filter(|n| !except.contains(&n.name.as_str())) {
        match probe_of(probes, &n.name) {
            Some(p) if p.reachable => reachable.push(n),
            _ => skipped.push(Skipped {
                node: n.name.clone(),
                reason: format!("unreachable during {operation}; rejoin it"),
            }),
        }
    }
    reachable
}

/// Whole seconds for a server-side timeout, at least 1.
fn secs_ceil(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

/// The most advanced of `candidates` by applied position; `prefer` wins among the
/// equally advanced. Warns when positions are not comparable.
fn most_advanced<'a>(
    candidates: &[&'a NodeReplication],
    prefer: Option<&str>,
    warnings: &mut Vec<String>,
) -> Option<&'a NodeReplication> {
    let dominating: Vec<&NodeReplication> = candidates
        .iter()
        .copied()
        .filter(|c| {
            candidates
                .iter()
                .all(|o| c.executed().contains(&o.executed()))
        })
        .collect();
    if let Some(p) = prefer {
        if let Some(c) = dominating.iter().find(|c| c.name == p) {
            return Some(c);
        }
        warnings.push(format!(
            "preferred node {p} is not among the most advanced replicas"
        ));
    }
    if let Some(c) = dominating.first() {
        return Some(c);
    }
    let best = candidates
        .iter()
        .copied()
        .max_by_key(|c| c.executed().total())?;
    warnings.push(format!(
        "replica positions are not comparable ({}); chose {} by total sequence",
        candidates
            .iter()
            .map(|c| format!("{}={}", c.name, c.executed()))
            .collect::<Vec<_>>()
            .join(" "),
        best.name
    ));
    Some(best)
}

impl NodeSession {
    /// Makes this node a writable primary: replication stopped and forgotten; with
    /// semi-sync, its commits wait for a replica's acknowledgement from the first one.
    ///
    /// `must_have` is checked once replication is stopped, before `RESET SLAVE ALL` deletes
    /// the relay log: a node that lacks part of it is not promoted (replication restarts).
    async fn promote(&mut self, ha: &HaConfig, must_have: &GtidPos) -> Result<(), HaError> {
        self.exec("STOP SLAVE").await?;
        let has = self.replication().await?.executed();
        if !has.contains(must_have) {
            let _ = self.exec("START SLAVE").await;
            return Err(HaError::Unexpected {
                node: self.name.clone(),
                detail: format!(
                    "not promoted: at {has} once stopped, which lacks {}",
                    must_have.missing_from(&has).join("; ")
                ),
            });
        }
        self.exec("RESET SLAVE ALL").await?;
        if ha.durability == Durability::SemiSync {
            self.exec(&super::durability::enable_primary_side(ha))
                .await?;
        }
        self.exec("SET GLOBAL read_only=OFF").await
    }

    /// Makes this node a replica of `primary`: `gtid_slave_pos` is set to everything the
    /// node already has (binlog and applied position merged) so it neither fetches a
    /// transaction twice nor skips one, then `MASTER_USE_GTID=slave_pos`.
    async fn repoint(
        &mut self,
        primary: &BackendConfig,
        ha: &HaConfig,
    ) -> Result<GtidPos, HaError> {
        let (host, port) = split_address(&primary.address)?;
        self.exec("SET GLOBAL read_only=ON").await?;
        if ha.durability == Durability::SemiSync {
            // A replica waiting for acknowledgements would stall its own applier.
            self.exec("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
                .await?;
        }
        self.exec("STOP SLAVE").await?;
        let me = self.replication().await?;
        let pos = me.executed();
        self.exec(&format!(
            "SET GLOBAL gtid_slave_pos={}",
            quote::string_literal(&pos.to_string())
        ))
        .await?;
        self.exec(&format!(
            "CHANGE MASTER TO MASTER_HOST={}, MASTER_PORT={port}, MASTER_USER={}, \
             MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY={}, MASTER_PASSWORD={}",
            plain(&host)?,
            plain(&ha.repl_user)?,
            ha.master_connect_retry_secs.max(1),
            plain(ha.repl_password.expose())?,
        ))
        .await?;
        self.exec("START SLAVE").await?;
        Ok(pos)
    }

    /// Kills every client connection but this one and the server's own threads
    /// (replicas' binlog dump threads are kept: they must still receive the last
    /// transactions). Returns how many were killed.
    async fn kill_clients(&mut self) -> Result<usize, HaError> {
        let rows = self
            .rows(
                "SELECT ID, USER FROM information_schema.PROCESSLIST \
                 WHERE ID <> CONNECTION_ID() \
                 AND COMMAND NOT IN ('Binlog Dump', 'Daemon', 'Slave_IO', 'Slave_SQL', 'Slave_worker') \
                 AND USER NOT IN ('system user', 'event_scheduler', 'DELAYED')",
            )
            .await?;
        let mut killed = 0;
        for row in rows {
            let Some(id) = row.first().cloned().flatten() else {
                continue;
            };
            let Ok(id) = id.parse::<u64>() else { continue };
            let user = row.get(1).cloned().flatten().unwrap_or_default();
            tracing::info!(node = %self.name, id, %user, "ha: killing client connection");
            match self.exec(&format!("KILL CONNECTION {id}")).await {
                Ok(()) => killed += 1,
                Err(HaError::Sql { source, .. }) if matches!(*source, BackendError::Server { code, .. } if code == ER_NO_SUCH_THREAD) =>
                    {}
                Err(e) => return Err(e),
            }
        }
        Ok(killed)
    }

    /// Waits server-side (`MASTER_GTID_WAIT`) until `gtid_slave_pos` reaches `pos`.
    async fn wait_gtid(&mut self, pos: &GtidPos, limit: Duration) -> Result<bool, HaError> {
        let sql = format!(
            "SELECT MASTER_GTID_WAIT({}, {:.3})",
            quote::string_literal(&pos.to_string()),
            limit.as_secs_f64()
        );
        let r = self.query_within(&sql, limit + self_margin()).await?;
        let v = r
            .rows
            .first()
            .and_then(|row| row.first().cloned().flatten())
            .unwrap_or_default();
        Ok(v == "0")
    }
}

fn self_margin() -> Duration {
    Duration::from_secs(5)
}

/// Re-points every node in `targets` to `primary`; failures are collected, not fatal.
async fn repoint_all(
    cfg: &Config,
    targets: &[&BackendConfig],
    primary: &BackendConfig,
    ha: &HaConfig,
    repointed: &mut Vec<String>,
    skipped: &mut Vec<Skipped>,
) {
    for n in targets {
        let result = async {
            let mut s = NodeSession::connect(cfg, n, ha.statement_timeout()).await?;
            s.repoint(primary, ha).await
        }
        .await;
        match result {
            Ok(pos) => {
                tracing::info!(node = %n.name, primary = %primary.name, from = %pos, "ha: replica re-pointed");
                repointed.push(n.name.clone());
            }
            Err(e) => {
                tracing::warn!(node = %n.name, error = %e, "ha: cannot re-point replica; rejoin it later");
                skipped.push(Skipped {
                    node: n.name.clone(),
                    reason: e.to_string(),
                });
            }
        }
    }
}

/// Planned switchover to `target` (or the most advanced healthy replica).
///
/// 1. Fence the old primary: `read_only=ON` (waits for commits in flight), kill client
///    connections (optional), `FLUSH TABLES WITH READ LOCK` held on the manager's own
///    connection (blocks even accounts that bypass `read_only`), then read its
///    `gtid_binlog_pos`: no transaction can be added after this point.
/// 2. Wait until the target has applied that position (`MASTER_GTID_WAIT`, deadline
///    `catchup_timeout`). On timeout the old primary is unfenced and nothing changed.
/// 3. Promote the target (`STOP SLAVE; RESET SLAVE ALL; read_only=OFF`).
/// 4. Release the lock on the old primary and re-point it and every other node.
pub async fn switchover(
    cfg: &Config,
    nodes: &[BackendConfig],
    target: Option<&str>,
    ha: &HaConfig,
) -> Result<SwitchoverReport, HaError> {
    let mut t = Timer::new();
    let mut warnings = Vec::new();
    let probes = probe_all(cfg, nodes, ha.statement_timeout()).await;
    let old = find_writable(&probes)?.ok_or(HaError::NoPrimary)?;
    let old_cfg = find(nodes, &old.name)?;
    let target_probe = match target {
        Some(name) => {
            find(nodes, name)?;
            if name == old.name {
                return Err(HaError::AlreadyPrimary(name.to_string()));
            }
            let p = probe_of(&probes, name).ok_or_else(|| HaError::UnknownNode(name.into()))?;
            if !p.reachable {
                return Err(HaError::NoCandidate(format!(
                    "{name} is unreachable: {}",
                    p.error.as_deref().unwrap_or("?")
                )));
            }
            if !p.slave.as_ref().is_some_and(|s| s.points_at(&old.address)) {
                return Err(HaError::NoCandidate(format!(
                    "{name} does not replicate from {}",
                    old.name
                )));
            }
            p
        }
        None => {
            let healthy: Vec<&NodeReplication> = probes
                .iter()
                .filter(|p| {
                    p.reachable
                        && p.slave
                            .as_ref()
                            .is_some_and(|s| s.points_at(&old.address) && s.running())
                })
                .collect();
            most_advanced(&healthy, None, &mut warnings).ok_or_else(|| {
                HaError::NoCandidate(format!("no healthy replica of {}", old.name))
            })?
        }
    };
    let target_cfg = find(nodes, &target_probe.name)?.clone();
    tracing::info!(old = %old.name, target = %target_cfg.name, "ha: switchover starting");
    let mut target_s = NodeSession::connect(cfg, &target_cfg, ha.statement_timeout()).await?;
    let mut old_s = NodeSession::connect(cfg, old_cfg, ha.statement_timeout()).await?;
    t.mark("probe");

    // 1. Fence.
    let fence_start = Instant::now();
    let fenced = async {
        old_s.exec("SET GLOBAL read_only=ON").await?;
        let killed = if ha.kill_old_primary_connections {
            old_s.kill_clients().await?
        } else {
            0
        };
        old_s
            .exec(&format!(
                "SET SESSION lock_wait_timeout={}",
                secs_ceil(ha.fence_timeout())
            ))
            .await?;
        old_s
            .query_within(
                "FLUSH TABLES WITH READ LOCK",
                ha.fence_timeout() + self_margin(),
            )
            .await?;
        let pos: GtidPos = old_s
            .value("SELECT @@global.gtid_binlog_pos")
            .await?
            .unwrap_or_default()
            .parse()
            .map_err(|source| HaError::BadGtid {
                node: old_s.name.clone(),
                source,
            })?;
        Ok::<_, HaError>((killed, pos))
    }
    .await;
    let (killed, fenced_at) = match fenced {
        Ok(x) => x,
        Err(e) => {
            unfence(cfg, old_cfg, old_s, ha).await;
            return Err(HaError::Fence {
                node: old.name.clone(),
                detail: e.to_string(),
            });
        }
    };
    tracing::info!(node = %old.name, position = %fenced_at, killed, "ha: old primary fenced");
    t.mark("fence");

    // 2. Catch up.
    let caught_up = target_s.wait_gtid(&fenced_at, ha.catchup_timeout()).await;
    match caught_up {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            let reached = target_s
                .replication()
                .await
                .map(|r| r.gtid_slave_pos)
                .unwrap_or_default();
            unfence(cfg, old_cfg, old_s, ha).await;
            caught_up?;
            return Err(HaError::CatchupTimeout {
                node: target_cfg.name.clone(),
                target: fenced_at,
                reached,
                after: ha.catchup_timeout(),
            });
        }
    }
    t.mark("catchup");

    // 3. Promote.
    if let Err(e) = target_s.promote(ha, &fenced_at).await {
        // Not writable: put things back as they were, as far as possible.
        tracing::error!(node = %target_cfg.name, error = %e, "ha: promotion failed; rolling back");
        let _ = target_s.exec("SET GLOBAL read_only=ON").await;
        if let Err(e2) = target_s.repoint(old_cfg, ha).await {
            warnings.push(format!("re-pointing {} back failed: {e2}", target_cfg.name));
        }
        unfence(cfg, old_cfg, old_s, ha).await;
        return Err(e);
    }
    let writes_blocked = fence_start.elapsed();
    tracing::info!(node = %target_cfg.name, ?writes_blocked, "ha: new primary writable");
    t.mark("promote");

    // 4. Re-point the old primary, then the others.
    let mut repointed = Vec::new();
    let mut skipped = Vec::new();
    let old_result = async {
        old_s.exec("UNLOCK TABLES").await?;
        let pos = old_s.repoint(&target_cfg, ha).await?;
        Ok::<_, HaError>(pos)
    }
    .await;
    match old_result {
        Ok(pos) => {
            if pos != fenced_at {
                warnings.push(format!(
                    "old primary {} moved from {fenced_at} to {pos} after the fence \
                     (an account with READ_ONLY ADMIN/SUPER wrote after UNLOCK TABLES); \
                     it has probably diverged",
                    old.name
                ));
            }
            repointed.push(old.name.clone());
        }
        Err(e) => {
            warnings.push(format!("old primary {} not re-pointed: {e}", old.name));
            skipped.push(Skipped {
                node: old.name.clone(),
                reason: e.to_string(),
            });
        }
    }
    let others = reachable_except(
        nodes.iter(),
        &[&old.name, &target_cfg.name],
        &probes,
        "switchover",
        &mut skipped,
    );
    repoint_all(cfg, &others, &target_cfg, ha, &mut repointed, &mut skipped).await;
    t.mark("repoint");
    let report = SwitchoverReport {
        old_primary: old.name.clone(),
        new_primary: target_cfg.name.clone(),
        fenced_at,
        killed_connections: killed,
        repointed,
        skipped,
        writes_blocked,
        total: t.start.elapsed(),
        phases: t.phases,
        warnings,
    };
    tracing::info!(old = %report.old_primary, new = %report.new_primary, total = ?report.total, "ha: switchover done");
    Ok(report)
}

/// Undoes the fence on the old primary after an aborted switchover, from a connection of
/// its own: the fence's connection is ended first (its read lock goes with it), and once
/// it is gone the primary is made writable. A fence statement that did not answer in time
/// (`read_only=ON` waits for the statements running) is still pending on the server and
/// would take effect later, leaving no node writable (chaos seed 83): ending its
/// connection stops it.
async fn unfence(cfg: &Config, node: &BackendConfig, fence: NodeSession, ha: &HaConfig) {
    tracing::warn!(node = %node.name, "ha: switchover aborted; unfencing the old primary");
    let thread = fence.thread();
    drop(fence);
    let undone = async {
        let mut s = NodeSession::connect(cfg, node, ha.statement_timeout()).await?;
        match s.exec(&format!("KILL CONNECTION {thread}")).await {
            Ok(()) => {}
            Err(HaError::Sql { source, .. }) if matches!(*source, BackendError::Server { code, .. } if code == ER_NO_SUCH_THREAD) =>
                {}
            Err(e) => return Err(e),
        }
        let deadline = Instant::now() + ha.statement_timeout();
        let gone =
            format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {thread}");
        while s.value(&gone).await?.as_deref() != Some("0") {
            if Instant::now() >= deadline {
                return Err(HaError::Fence {
                    node: node.name.clone(),
                    detail: format!("the fence's connection {thread} did not end"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.exec("SET GLOBAL read_only=OFF").await
    };
    if let Err(e) = undone.await {
        tracing::error!(node = %node.name, error = %e, "ha: cannot make the old primary writable again");
    }
}

/// Unplanned failover away from `lost` (which must be unreachable).
///
/// The replicas must confirm the loss (their IO thread is not connected) when
/// `ha.require_replica_confirmation`. Then the replicas apply what their IO threads
/// received (a stopped SQL thread is started), for up to `relay_apply_timeout`: only a
/// replica that applied every transaction any replica received is promoted (`prefer`
/// among equals) and the others re-pointed. When none gets there, nothing is promoted
/// ([`HaError::WouldLoseWrites`] names what would be lost) unless `force`, which promotes
/// the most advanced and says what it lost. `lost` is left out: bring it back with
/// [`rejoin`].
pub async fn failover(
    cfg: &Config,
    nodes: &[BackendConfig],
    lost: &str,
    prefer: Option<&str>,
    force: bool,
    ha: &HaConfig,
) -> Result<FailoverReport, HaError> {
    failover_checked(cfg, nodes, lost, prefer, force, ha, None).await
}

/// [`failover`], asking `charge` once more right before the promotion whether this
/// process may still make the decision: the confirmation and the relay apply before it
/// take seconds, and a fleet leader that lost its lease meanwhile (paused, cut off) must
/// not make a node writable after another leader has.
pub async fn failover_checked(
    cfg: &Config,
    nodes: &[BackendConfig],
    lost: &str,
    prefer: Option<&str>,
    force: bool,
    ha: &HaConfig,
    charge: Option<&dyn super::controller::ChargeCheck>,
) -> Result<FailoverReport, HaError> {
    let mut t = Timer::new();
    let mut warnings = Vec::new();
    let lost_cfg = find(nodes, lost)?;
    let others: Vec<BackendConfig> = nodes.iter().filter(|n| n.name != lost).cloned().collect();

    // Confirm: the primary does not answer and the replicas have lost it too.
    let deadline = Instant::now() + ha.failover_after();
    let probes = loop {
        let lost_probe = super::probe::probe_node(cfg, lost_cfg, ha.probe_timeout()).await;
        if lost_probe.reachable {
            return Err(HaError::PrimaryAlive(lost.to_string()));
        }
        let probes = probe_all(cfg, &others, ha.statement_timeout()).await;
        match replicas_confirm_loss(&probes, lost_cfg) {
            Ok(_) => break probes,
            Err(reason) if !ha.require_replica_confirmation => {
                warnings.push(format!("not confirmed by replicas ({reason}); proceeding"));
                break probes;
            }
            Err(reason) if Instant::now() >= deadline => return Err(HaError::Unconfirmed(reason)),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    };
    t.mark("confirm");

    // Let every replica apply what it received: only one that applied everything any
    // replica received may become writable (its relay log goes with RESET SLAVE ALL).
    let replicas: Vec<&NodeReplication> = probes
        .iter()
        .filter(|p| {
            p.reachable
                && p.slave
                    .as_ref()
                    .is_some_and(|s| s.points_at(&lost_cfg.address))
        })
        .collect();
    if replicas.is_empty() {
        return Err(HaError::NoCandidate(format!(
            "no reachable replica of {lost}"
        )));
    }
    let applied = relay::apply_received(
        cfg,
        nodes,
        &replicas,
        ha.relay_apply_timeout(),
        ha.statement_timeout(),
    )
    .await;
    warnings.extend(applied.warnings.iter().cloned());
    t.mark("relay_apply");

    let complete = applied.complete();
    let reachable: Vec<&NodeReplication> = applied.replicas.iter().collect();
    let chosen = match most_advanced(&complete, prefer, &mut warnings) {
        Some(c) => c,
        None => {
            let best = most_advanced(&reachable, prefer, &mut Vec::new());
            let refusal = relay::would_lose(lost, &applied, best);
            match best {
                Some(b) if force => {
                    let lose = applied.received.missing_from(&b.executed());
                    tracing::error!(lost = %lost, new = %b.name, would_lose = ?lose, "ha: forced failover promotes a replica that lacks transactions the replicas received");
                    warnings.push(format!(
                        "forced: {} was promoted without {}",
                        b.name,
                        lose.join("; ")
                    ));
                    b
                }
                _ => return Err(refusal),
            }
        }
    };
    let positions: Vec<(String, GtidPos)> = reachable
        .iter()
        .map(|c| (c.name.clone(), c.executed()))
        .collect();
    let must_have = chosen.executed();
    let new_cfg = find(nodes, &chosen.name)?.clone();
    if let Some(charge) = charge {
        if !charge.still_in_charge().await {
            tracing::warn!(lost = %lost, candidate = %new_cfg.name, "ha: no longer in charge before the promotion; nothing promoted");
            return Err(HaError::NotInCharge(
                "this member stopped leading its fleet while it prepared the failover: nothing was promoted",
            ));
        }
    }
    tracing::warn!(lost = %lost, new = %new_cfg.name, position = %must_have, "ha: failover promoting");
    t.mark("choose");

    let mut s = NodeSession::connect(cfg, &new_cfg, ha.statement_timeout()).await?;
    s.promote(ha, &must_have).await?;
    let promoted_at = s.replication().await?.gtid_binlog_pos;
    t.mark("promote");

    let mut repointed = Vec::new();
    let mut skipped = Vec::new();
    let rest = reachable_except(
        others.iter(),
        &[&new_cfg.name],
        &probes,
        "failover",
        &mut skipped,
    );
    repoint_all(cfg, &rest, &new_cfg, ha, &mut repointed, &mut skipped).await;
    t.mark("repoint");
    let report = FailoverReport {
        lost_primary: lost.to_string(),
        new_primary: new_cfg.name.clone(),
        promoted_at,
        positions,
        repointed,
        skipped,
        needs_rejoin: vec![lost.to_string()],
        total: t.start.elapsed(),
        phases: t.phases,
        warnings,
    };
    tracing::warn!(new = %report.new_primary, total = ?report.total, "ha: failover done; {} needs rejoin", lost);
    Ok(report)
}

/// A node a failover moved away from answers again and is writable (it was frozen or cut
/// off, not dead): it is made read-only and its client connections are killed at once, so
/// that it takes no more writes. It serves again only after [`rejoin`] (or a rebuild, if it
/// committed what the cluster never got). Returns the connections killed.
pub async fn fence_deposed(
    cfg: &Config,
    node: &BackendConfig,
    ha: &HaConfig,
) -> Result<usize, HaError> {
    let mut s = NodeSession::connect(cfg, node, ha.statement_timeout()).await?;
    s.exec("SET GLOBAL read_only=ON").await?;
    s.kill_clients().await
}

/// Makes `node` (a returning old primary or a lost replica) a replica of the writable
/// node (`primary`, or the one writable node among the others).
///
/// The node is made read-only first (a crashed primary restarts writable). If it has
/// transactions the primary lacks — visible in the positions, or reported by the server
/// as error 1236 when it connects — it is left stopped and read-only and
/// [`HaError::Diverged`] is returned: it needs to be rebuilt, not rejoined.
pub async fn rejoin(
    cfg: &Config,
    nodes: &[BackendConfig],
    node: &str,
    primary: Option<&str>,
    ha: &HaConfig,
) -> Result<RejoinReport, HaError> {
    let mut t = Timer::new();
    let node_cfg = find(nodes, node)?.clone();
    let mut s = NodeSession::connect(cfg, &node_cfg, ha.statement_timeout()).await?;
    s.exec("SET GLOBAL read_only=ON").await?;
    if ha.kill_old_primary_connections {
        let killed = s.kill_clients().await?;
        if killed > 0 {
            tracing::warn!(node = %node, killed, "ha: killed client connections on the rejoining node");
        }
    }
    t.mark("fence");

    let primary_cfg = match primary {
        Some(p) => find(nodes, p)?.clone(),
        None => {
            let others: Vec<BackendConfig> =
                nodes.iter().filter(|n| n.name != node).cloned().collect();
            let probes = probe_all(cfg, &others, ha.statement_timeout()).await;
            let w = find_writable(&probes)?.ok_or(HaError::NoPrimary)?;
            find(nodes, &w.name)?.clone()
        }
    };
    if primary_cfg.name == node_cfg.name {
        return Err(HaError::AlreadyPrimary(node.to_string()));
    }
    let mut p = NodeSession::connect(cfg, &primary_cfg, ha.statement_timeout()).await?;
    // The node first: one that already replicates from the primary (restarted as a
    // replica) would otherwise apply a transaction between the two reads and look ahead.
    let me = s.replication().await?;
    let primary_pos = p.replication().await?.gtid_binlog_pos;
    let node_was_at = me.executed();
    let extra = node_was_at.ahead_of(&primary_pos);
    if !extra.is_empty() {
        let list: Vec<String> = extra.iter().map(ToString::to_string).collect();
        tracing::error!(node = %node, primary = %primary_cfg.name, extra = ?list, "ha: node has diverged; not rejoining");
        return Err(HaError::Diverged {
            node: node.to_string(),
            detail: format!(
                "it has {} which {} (at {primary_pos}) lacks",
                list.join(","),
                primary_cfg.name
            ),
        });
    }
    t.mark("check");

    s.repoint(&primary_cfg, ha).await?;
    t.mark("repoint");

    // Wait until it replicates and has the primary's position from the start of the rejoin.
    let deadline = Instant::now() + ha.catchup_timeout();
    loop {
        let r = s.replication().await?;
        if let Some(st) = &r.slave {
            if st.last_io_errno == ER_MASTER_FATAL_ERROR_READING_BINLOG {
                let _ = s.exec("STOP SLAVE").await;
                tracing::error!(node = %node, error = %st.last_io_error, "ha: primary refused the node's position; diverged");
                return Err(HaError::Diverged {
                    node: node.to_string(),
                    detail: st.last_io_error.clone(),
                });
            }
            if st.running() && r.gtid_slave_pos.contains(&primary_pos) {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err(HaError::CatchupTimeout {
                node: node.to_string(),
                target: primary_pos,
                reached: r.gtid_slave_pos,
                after: ha.catchup_timeout(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
    t.mark("catchup");
    let report = RejoinReport {
        node: node.to_string(),
        primary: primary_cfg.name.clone(),
        node_was_at,
        caught_up_to: primary_pos,
        total: t.start.elapsed(),
        phases: t.phases,
    };
    tracing::info!(node = %node, primary = %report.primary, total = ?report.total, "ha: rejoined");
    Ok(report)
}

/// A plain `'…'` literal for `CHANGE MASTER TO`, which takes no expressions (and so no hex
/// form); values it cannot write under every `sql_mode` are a configuration error.
fn plain(value: &str) -> Result<String, HaError> {
    quote::plain_string_literal(value).map_err(HaError::Unquotable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(secs_ceil(Duration::from_millis(1)), 1);
        assert_eq!(secs_ceil(Duration::from_millis(1001)), 2);
        assert_eq!(secs_ceil(Duration::ZERO), 1);
    }
}
