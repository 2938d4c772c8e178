//! The HA controller: runs [`switchover`], [`failover`] and [`rejoin`] for the proxy, one
//! at a time, and in managed mode watches the primary and fails over on its own.
//!
//! * One operation at a time: every operation holds an owned `tokio::sync::Mutex` permit
//!   for its whole run. Requests from the admin API do not queue behind a running
//!   operation: they get [`HaError::Busy`] (HTTP 409). Nothing on the query path touches
//!   the controller.
//! * Operations run in their own task: a client that gives up (an HTTP request cancelled
//!   halfway) cannot abandon a fenced primary; the operation finishes regardless.
//! * [`HaState`] (mode, running operation, last result, counters) is published through a
//!   `watch` channel for `/status`.
//! * After each operation the topology monitor is nudged to re-probe at once, so new
//!   sessions find the new primary within a probe round instead of the next tick.
//! * Managed mode, automatic failover ([`HaController::run`]): probe the primary every
//!   `ha.probe_interval_ms` ([`LossDetector`]: `failure_threshold` failures spanning
//!   `failover_after_ms`), cross-check with the replicas (`require_replica_confirmation`),
//!   rate-limit ([`FailoverGuard`], `failover_cooloff_ms`), then [`failover`].
//! * External mode: the controller refuses every operation ([`HaError::NotManaged`]);
//!   the topology monitor follows `read_only` as always.

use super::detect::replicas_confirm_loss;
use super::probe::{probe_all, NodeSession};
use super::{
    failover_checked, rejoin, switchover, FailoverGuard, FailoverReport, HaError, HaMode,
    LossDetector, RejoinReport, SwitchoverReport,
};
use crate::config::{BackendConfig, Config};
use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{watch, Mutex, Notify, OwnedMutexGuard};

/// The kinds of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Switchover,
    Failover,
    Rejoin,
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpKind::Switchover => "switchover",
            OpKind::Failover => "failover",
            OpKind::Rejoin => "rejoin",
        })
    }
}

/// HA's state as one process hands it to the next (an upgrade): see
/// [`HaController::carried`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HaCarried {
    pub state: HaState,
    pub last_failover_ago_ms: Option<u64>,
}

/// The operation running now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningOp {
    pub operation: OpKind,
    /// Started by the failure detector rather than an operator.
    pub automatic: bool,
    pub started_unix_ms: u64,
}

/// How the last operation ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastOp {
    pub operation: OpKind,
    pub automatic: bool,
    pub started_unix_ms: u64,
    pub finished_unix_ms: u64,
    pub duration_ms: f64,
    pub ok: bool,
    /// One line for a person: what changed, or why it failed.
    pub summary: String,
    pub error: Option<String>,
    pub warnings: Vec<String>,
}

/// Operations since holdfast started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaCounters {
    pub switchovers: u64,
    /// Every completed failover, automatic ones included.
    pub failovers: u64,
    pub automatic_failovers: u64,
    pub rejoins: u64,
    /// Operations that failed on the servers. Refusals are not counted: busy and external
    /// mode leave no trace, an unknown node or "already the primary" show in `last` only.
    pub failed_operations: u64,
    /// Failovers not done because no replica had applied everything the replicas received
    /// (acknowledged writes would have been lost); each attempt counts.
    #[serde(default)]
    pub failovers_withheld: u64,
}

/// What `/status` shows about HA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HaState {
    pub mode: HaMode,
    pub in_progress: Option<RunningOp>,
    pub last: Option<LastOp>,
    pub counters: HaCounters,
    /// Managed mode: the primary the failure detector watches (kept after it stops
    /// answering), and its failed probes in a row.
    pub watching: Option<String>,
    pub failed_probes: u32,
    /// Nodes a failover left out; bring each back with `rejoin`.
    pub needs_rejoin: Vec<String>,
    /// The node a running failover moves away from (confirmed lost): sessions abandon their
    /// connections to it and it is never taken for the primary, from before the promotion
    /// on (then it is in `needs_rejoin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_over_from: Option<String>,
    /// Set while a lost primary is not failed over because that would lose transactions
    /// the replicas received (what and why); cleared by the next switchover or failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_withheld: Option<String>,
    /// With `durability = "semi-sync"`: whether the primary runs it now, and its fallbacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semi_sync: Option<super::durability::SemiSyncState>,
}

impl HaState {
    fn new(mode: HaMode) -> Self {
        HaState {
            mode,
            in_progress: None,
            last: None,
            counters: HaCounters::default(),
            watching: None,
            failed_probes: 0,
            needs_rejoin: Vec::new(),
            failing_over_from: None,
            failover_withheld: None,
            semi_sync: None,
        }
    }
}

/// What the permit protects: state only operations touch.
struct Ops {
    guard: FailoverGuard,
}

enum Request {
    Switchover(Option<String>),
    /// `lost: None`: the primary the detector watches (manual failover). `force`: promote
    /// even when that loses transactions a replica received (operators only).
    Failover {
        lost: Option<String>,
        automatic: bool,
        force: bool,
    },
    Rejoin(String),
}

impl Request {
    fn kind(&self) -> OpKind {
        match self {
            Request::Switchover(_) => OpKind::Switchover,
            Request::Failover { .. } => OpKind::Failover,
            Request::Rejoin(_) => OpKind::Rejoin,
        }
    }

    fn automatic(&self) -> bool {
        matches!(
            self,
            Request::Failover {
                automatic: true,
                ..
            }
        )
    }
}

enum Report {
    Switchover(SwitchoverReport),
    Failover(FailoverReport),
    Rejoin(RejoinReport),
}

impl Report {
    fn summary(&self) -> (String, Vec<String>) {
        match self {
            Report::Switchover(r) => (
                format!(
                    "{} -> {} (writes blocked {:.0} ms)",
                    r.old_primary,
                    r.new_primary,
                    r.writes_blocked.as_secs_f64() * 1000.0
                ),
                r.warnings.clone(),
            ),
            Report::Failover(r) => (
                format!(
                    "lost {}, promoted {}; {} needs rejoin",
                    r.lost_primary,
                    r.new_primary,
                    r.needs_rejoin.join(", ")
                ),
                r.warnings.clone(),
            ),
            Report::Rejoin(r) => (
                format!("{} replicates from {} again", r.node, r.primary),
                Vec::new(),
            ),
        }
    }
}

/// Runs HA operations one at a time and, in managed mode, the failure detector.
pub struct HaController {
    /// The configuration in force: each operation and each probe round reads it anew.
    cfg: crate::LiveConfig,
    topology: watch::Receiver<Arc<Topology>>,
    nudge: Arc<Notify>,
    ops: Arc<Mutex<Ops>>,
    state: watch::Sender<HaState>,
    /// This process runs HA (operations, the failure detector). Two processes do not:
    /// during an upgrade the old one hands it to the new one ([`HaController::release`],
    /// [`HaController::take_charge`]).
    in_charge: watch::Sender<bool>,
    /// Asked as each operation starts, when set: whether this process may still decide
    /// (a fleet member that still leads, as etcd says now).
    charge_check: std::sync::OnceLock<Arc<dyn ChargeCheck>>,
}

/// Whether this process may still make cluster decisions, asked of what grants it (the
/// fleet's election) as each operation starts: a process that was in charge and lost it
/// (paused, partitioned) without noticing yet does not act on it.
pub trait ChargeCheck: Send + Sync {
    fn still_in_charge(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>>;
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl HaController {
    /// A controller for `cfg.ha`; nothing runs until [`HaController::run`] is spawned.
    pub fn new(cfg: crate::LiveConfig, topology: watch::Receiver<Arc<Topology>>) -> Arc<Self> {
        let start = cfg.load();
        let (state, _) = watch::channel(HaState::new(start.ha.mode));
        let guard = FailoverGuard::from_config(&start.ha);
        drop(start);
        Arc::new(HaController {
            ops: Arc::new(Mutex::new(Ops { guard })),
            cfg,
            topology,
            nudge: Arc::new(Notify::new()),
            state,
            in_charge: watch::Sender::new(true),
            charge_check: std::sync::OnceLock::new(),
        })
    }

    /// Not in charge until [`HaController::take_charge`]: a process taking over from
    /// another during an upgrade, before that one has let go.
    pub fn stand_by(&self) {
        self.in_charge.send_replace(false);
    }

    /// What each operation asks first from now on (once; a second is ignored).
    pub fn set_charge_check(&self, check: Arc<dyn ChargeCheck>) {
        let _ = self.charge_check.set(check);
    }

    /// In charge from now on.
    pub fn take_charge(&self) {
        self.in_charge.send_replace(true);
    }

    /// What a process taking over HA continues from: the state `/status` shows (counters,
    /// the last operation, the nodes a failover left out) and when the last failover was
    /// (its cool-off goes on).
    pub async fn carried(&self) -> HaCarried {
        let ops = self.ops.lock().await;
        HaCarried {
            state: self.state(),
            last_failover_ago_ms: ops.guard.since_last().map(|d| d.as_millis() as u64),
        }
    }

    /// Continues from what the process this one took over from carried (before
    /// [`HaController::take_charge`]).
    pub async fn adopt(&self, carried: HaCarried) {
        let mut ops = self.ops.lock().await;
        if let Some(ms) = carried.last_failover_ago_ms {
            ops.guard.set_last_ago(Duration::from_millis(ms));
        }
        let old = carried.state;
        self.state.send_modify(|s| {
            s.counters = old.counters;
            s.last = old.last;
            s.needs_rejoin = old.needs_rejoin;
            s.failover_withheld = old.failover_withheld;
        });
    }

    /// Lets go of HA (another process takes it over): the operation running, if any,
    /// finishes first; the failure detector stops; new operations are refused.
    pub async fn release(&self) {
        self.in_charge.send_replace(false);
        // Waits for a running operation (it holds the lock).
        drop(self.ops.lock().await);
    }

    /// The current state (a copy).
    pub fn state(&self) -> HaState {
        self.state.borrow().clone()
    }

    /// The configuration in force now.
    pub(super) fn config(&self) -> Arc<Config> {
        self.cfg.load_full()
    }

    /// The nodes operations consider now (the topology's members, those being removed
    /// left out).
    pub(super) fn backends(&self) -> Vec<BackendConfig> {
        self.topology.borrow().backends()
    }

    /// The writable node the topology monitor sees now.
    pub(super) fn primary_name(&self) -> Option<String> {
        self.topology
            .borrow()
            .primary_node()
            .map(|n| n.name.to_string())
    }

    /// A node removed from the members leaves `needs_rejoin`: it is waited for no more,
    /// and a node added later under its name is a new one (not deposed).
    pub fn forget_node(&self, name: &str) {
        self.state.send_if_modified(|s| {
            let before = s.needs_rejoin.len();
            s.needs_rejoin.retain(|n| n != name);
            s.needs_rejoin.len() != before
        });
    }

    pub(super) fn update_state(&self, f: impl FnOnce(&mut HaState)) {
        self.state.send_modify(f);
    }

    /// Follows state changes.
    pub fn subscribe(&self) -> watch::Receiver<HaState> {
        self.state.subscribe()
    }

    /// Notified after every operation: the topology monitor re-probes at once.
    pub fn topology_nudge(&self) -> Arc<Notify> {
        self.nudge.clone()
    }

    /// Planned switchover to `target` (or the most advanced healthy replica).
    pub async fn switchover(
        self: &Arc<Self>,
        target: Option<String>,
    ) -> Result<SwitchoverReport, HaError> {
        let permit = self.try_acquire()?;
        match self.run_op(permit, Request::Switchover(target)).await? {
            Report::Switchover(r) => Ok(r),
            _ => unreachable!("switchover returns a switchover report"),
        }
    }

    /// Failover away from the primary the detector watches (which must be down; the
    /// replicas must confirm unless `ha.require_replica_confirmation = false`). An operator
    /// failover ignores the cool-off but starts a new one (unless it was refused). Without
    /// `force` it is withheld, as an automatic one, when no replica has applied everything
    /// the replicas received; with `force` the most advanced replica is promoted anyway and
    /// the report says which transactions were lost.
    pub async fn failover(self: &Arc<Self>, force: bool) -> Result<FailoverReport, HaError> {
        let permit = self.try_acquire()?;
        let req = Request::Failover {
            lost: None,
            automatic: false,
            force,
        };
        match self.run_op(permit, req).await? {
            Report::Failover(r) => Ok(r),
            _ => unreachable!("failover returns a failover report"),
        }
    }

    /// Makes `node` a replica of the current primary again (after a failover, or a
    /// replica that was down during a switchover).
    pub async fn rejoin(self: &Arc<Self>, node: String) -> Result<RejoinReport, HaError> {
        let permit = self.try_acquire()?;
        match self.run_op(permit, Request::Rejoin(node)).await? {
            Report::Rejoin(r) => Ok(r),
            _ => unreachable!("rejoin returns a rejoin report"),
        }
    }

    fn check_managed(&self) -> Result<(), HaError> {
        if !*self.in_charge.borrow() {
            return Err(HaError::NotInCharge(
                "this process is handing over to, or taking over from, another in an upgrade, or another member of its fleet leads: ask the leader",
            ));
        }
        match self.cfg.load().ha.mode {
            HaMode::Managed => Ok(()),
            HaMode::External => Err(HaError::NotManaged),
        }
    }

    fn busy_error(&self) -> HaError {
        match &self.state.borrow().in_progress {
            Some(op) => HaError::Busy(format!(
                "{}{} started {:.1} s ago",
                if op.automatic { "automatic " } else { "" },
                op.operation,
                unix_ms().saturating_sub(op.started_unix_ms) as f64 / 1000.0
            )),
            None => HaError::Busy("another operation holds the controller".into()),
        }
    }

    fn try_acquire(&self) -> Result<OwnedMutexGuard<Ops>, HaError> {
        self.check_managed()?;
        self.ops
            .clone()
            .try_lock_owned()
            .map_err(|_| self.busy_error())
    }

    /// Runs `req` in its own task holding `permit`, and publishes the outcome.
    async fn run_op(
        self: &Arc<Self>,
        mut permit: OwnedMutexGuard<Ops>,
        req: Request,
    ) -> Result<Report, HaError> {
        let kind = req.kind();
        let automatic = req.automatic();
        let started = Instant::now();
        let started_unix_ms = unix_ms();
        self.state.send_modify(|s| {
            s.in_progress = Some(RunningOp {
                operation: kind,
                automatic,
                started_unix_ms,
            })
        });
        tracing::info!(operation = %kind, automatic, "ha: operation starting");
        let this = self.clone();
        let task = tokio::spawn(async move {
            let result = this.execute(&mut permit, req).await;
            this.finish(kind, automatic, started, started_unix_ms, &result);
            // Released only after the state says the operation is over.
            drop(permit);
            this.nudge.notify_one();
            result
        });
        match task.await {
            Ok(r) => r,
            Err(e) => {
                let err = HaError::Aborted(e.to_string());
                tracing::error!(operation = %kind, error = %err, "ha: operation task failed");
                self.state.send_modify(|s| {
                    s.in_progress = None;
                    s.counters.failed_operations += 1;
                });
                Err(err)
            }
        }
    }

    async fn execute(&self, ops: &mut Ops, req: Request) -> Result<Report, HaError> {
        if let Some(check) = self.charge_check.get() {
            if !check.still_in_charge().await {
                return Err(HaError::NotInCharge(
                    "this member no longer leads its fleet (its lease was not renewed in time)",
                ));
            }
        }
        let cfg = self.config();
        let cfg = &*cfg;
        let ha = &cfg.ha;
        ops.guard.set_config(ha);
        match req {
            Request::Switchover(target) => switchover(cfg, &self.backends(), target.as_deref(), ha)
                .await
                .map(Report::Switchover),
            Request::Failover {
                lost,
                automatic,
                force,
            } => {
                let lost = match lost {
                    Some(l) => l,
                    None => self.failover_source()?,
                };
                let now = Instant::now();
                if automatic {
                    ops.guard.check(now)?;
                }
                self.state
                    .send_modify(|s| s.failing_over_from = Some(lost.clone()));
                self.nudge.notify_one();
                let charge = self.charge_check.get().map(|c| &**c);
                let result =
                    failover_checked(cfg, &self.backends(), &lost, None, force, ha, charge).await;
                // A refusal (the primary answers after all) changed nothing: no cool-off.
                // Neither did a withheld failover, which the detector must try again (a
                // replica may catch up). Anything else starts one, a failed attempt included.
                if !matches!(&result, Err(e) if e.is_refusal() || e.is_withheld()) {
                    ops.guard.record(now);
                }
                result.map(Report::Failover)
            }
            Request::Rejoin(node) => rejoin(cfg, &self.backends(), &node, None, ha)
                .await
                .map(Report::Rejoin),
        }
    }

    /// The primary a manual failover moves away from: the one the detector watches, or
    /// the monitor's current primary.
    fn failover_source(&self) -> Result<String, HaError> {
        if let Some(w) = self.state.borrow().watching.clone() {
            return Ok(w);
        }
        self.topology
            .borrow()
            .primary
            .and_then(|i| {
                self.topology
                    .borrow()
                    .nodes
                    .get(i)
                    .map(|n| n.name.to_string())
            })
            .ok_or(HaError::NoPrimary)
    }

    fn finish(
        &self,
        kind: OpKind,
        automatic: bool,
        started: Instant,
        started_unix_ms: u64,
        result: &Result<Report, HaError>,
    ) {
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        // A failover from a primary that had fallen back to asynchronous replication may
        // have lost writes it acknowledged: said in the log and in /status.
        let unprotected = matches!(result, Ok(Report::Failover(_)))
            && self.cfg.load().ha.durability == crate::config::Durability::SemiSync
            && self
                .state
                .borrow()
                .semi_sync
                .as_ref()
                .is_some_and(|s| !s.active);
        let (ok, summary, error, warnings) = match result {
            Ok(r) => {
                let (summary, mut warnings) = r.summary();
                if unprotected {
                    let w = "semi-sync was not active on the lost primary (it had fallen back to asynchronous replication): writes it acknowledged since may be lost".to_string();
                    tracing::warn!("ha: {w}");
                    warnings.push(w);
                }
                tracing::info!(operation = %kind, automatic, duration_ms, %summary, "ha: operation done");
                (true, summary, None, warnings)
            }
            Err(e) => {
                tracing::error!(operation = %kind, automatic, duration_ms, error = %e, "ha: operation failed");
                (false, e.to_string(), Some(e.to_string()), Vec::new())
            }
        };
        self.state.send_modify(|s| {
            s.in_progress = None;
            s.failing_over_from = None;
            match result {
                Ok(Report::Switchover(r)) => {
                    s.counters.switchovers += 1;
                    s.failover_withheld = None;
                    s.watching = Some(r.new_primary.clone());
                    s.failed_probes = 0;
                }
                Ok(Report::Failover(r)) => {
                    s.counters.failovers += 1;
                    s.failover_withheld = None;
                    if automatic {
                        s.counters.automatic_failovers += 1;
                    }
                    s.watching = Some(r.new_primary.clone());
                    s.failed_probes = 0;
                    for n in &r.needs_rejoin {
                        if !s.needs_rejoin.contains(n) {
                            s.needs_rejoin.push(n.clone());
                        }
                    }
                }
                Ok(Report::Rejoin(r)) => {
                    s.counters.rejoins += 1;
                    s.needs_rejoin.retain(|n| *n != r.node);
                }
                Err(e) if e.is_withheld() => {
                    s.counters.failovers_withheld += 1;
                    s.failover_withheld = Some(e.to_string());
                }
                Err(e) if !e.is_refusal() => s.counters.failed_operations += 1,
                Err(_) => {}
            }
            s.last = Some(LastOp {
                operation: kind,
                automatic,
                started_unix_ms,
                finished_unix_ms: unix_ms(),
                duration_ms,
                ok,
                summary,
                error,
                warnings,
            });
        });
    }

    /// The failure detector (managed mode only; returns at once in external mode). Runs
    /// until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        // The mode is kept as it started by a reload (it needs a restart).
        let start = self.config();
        if start.ha.mode != HaMode::Managed {
            tracing::info!("ha: external mode; following the writable node only");
            return;
        }
        let ha = &start.ha;
        tracing::info!(
            probe_interval_ms = ha.probe_interval_ms,
            failure_threshold = ha.failure_threshold,
            failover_after_ms = ha.failover_after_ms,
            "ha: managed mode; watching the primary"
        );
        let mut watched: Option<BackendConfig> = None;
        let mut last_seen: Option<String> = None;
        let mut detector = LossDetector::from_config(ha);
        let mut session: Option<NodeSession> = None;
        // The last "not failing over because…" line, so it is logged once per reason.
        let mut held_back = String::new();
        let mut next_probe = tokio::time::Instant::now();
        let mut in_charge = self.in_charge.subscribe();
        loop {
            tokio::time::sleep_until(next_probe).await;
            if !*in_charge.borrow_and_update() {
                // Another process runs the detector: from scratch once this one is back
                // in charge.
                tracing::info!(
                    "ha: not in charge (an upgrade hands HA over, or another fleet member leads); the failure detector waits"
                );
                if in_charge.wait_for(|c| *c).await.is_err() {
                    return;
                }
                tracing::info!("ha: in charge; watching the primary");
                watched = None;
                last_seen = None;
                session = None;
                held_back.clear();
                next_probe = tokio::time::Instant::now();
                continue;
            }
            // A reload's settings from the next probe on.
            let cfg = self.config();
            let cfg = &*cfg;
            let ha = &cfg.ha;
            detector.set_config(ha);
            next_probe += ha.probe_interval();

            // Which primary to watch: the monitor's, or the one we watched before while
            // the monitor sees none (it stopped answering).
            let seen = {
                let t = self.topology.borrow();
                t.primary
                    .and_then(|i| t.nodes.get(i))
                    .map(|n| n.name.to_string())
            };
            let differs = |name: &String| watched.as_ref().is_none_or(|w| w.name != *name);
            let mut switch_to = None;
            let none_seen = seen.is_none();
            if seen != last_seen {
                last_seen = seen.clone();
                switch_to = seen.filter(differs);
            }
            if switch_to.is_none() && none_seen && watched.is_none() {
                // In charge since the primary went (the fleet's new leader, say): the node
                // the replicas replicate from, as the detector before would have watched.
                let former = self
                    .topology
                    .borrow()
                    .former_primary()
                    .map(|n| n.name.to_string());
                if former.is_some() {
                    tracing::info!(node = ?former, "ha: no primary seen; watching the node the replicas replicate from");
                }
                switch_to = former;
            }
            if switch_to.is_none() {
                // An operation changed the primary before the monitor noticed.
                let w = self.state.borrow().watching.clone();
                switch_to = w.filter(|w| watched.is_some() && differs(w));
            }
            if let Some(name) = switch_to {
                if let Some(b) = self.backends().into_iter().find(|b| b.name == name) {
                    tracing::info!(node = %b.name, address = %b.address, "ha: watching primary");
                    watched = Some(b);
                    detector = LossDetector::from_config(ha);
                    session = None;
                    held_back.clear();
                    self.state.send_modify(|s| {
                        s.watching = Some(name);
                        s.failed_probes = 0;
                    });
                }
            }
            self.fence_returning_nodes().await;
            let Some(node) = watched.clone() else {
                continue;
            };

            // An operation changes nodes on purpose: do not judge the primary meanwhile.
            if self.state.borrow().in_progress.is_some() {
                detector = LossDetector::from_config(ha);
                session = None;
                continue;
            }

            let probe = probe_primary(cfg, &node, &mut session, ha.probe_timeout()).await;
            let now = Instant::now();
            let lost = match &probe {
                Err(e) if e.is_connection_refused() => detector.observe_refused(now),
                _ => detector.observe(probe.is_ok(), now),
            };
            if probe.is_err() {
                // While the primary is failing, look again sooner.
                next_probe = tokio::time::Instant::now() + super::detect::retry_interval(ha);
            } else if next_probe < tokio::time::Instant::now() {
                next_probe = tokio::time::Instant::now() + ha.probe_interval();
            }
            let failures = detector.consecutive_failures();
            if self.state.borrow().failed_probes != failures {
                self.state.send_modify(|s| s.failed_probes = failures);
            }
            match &probe {
                Ok(()) => held_back.clear(),
                Err(e) => {
                    session = None;
                    tracing::debug!(node = %node.name, error = %e, failures, "ha: primary probe failed");
                    if failures == 1 {
                        tracing::warn!(node = %node.name, error = %e, "ha: primary probe failed");
                    }
                }
            }
            if !lost {
                continue;
            }

            // Rate limit (cheap; re-checked under the permit).
            if let Ok(mut ops) = self.ops.try_lock() {
                ops.guard.set_config(ha);
                if let Err(e) = ops.guard.check(now) {
                    note(&mut held_back, &node.name, &e.to_string());
                    continue;
                }
            } else {
                continue;
            }

            // Cross-check: every reachable replica must have lost the primary too.
            if ha.require_replica_confirmation {
                let others: Vec<BackendConfig> = self
                    .backends()
                    .into_iter()
                    .filter(|b| b.name != node.name)
                    .collect();
                let probes = probe_all(cfg, &others, ha.probe_timeout()).await;
                match replicas_confirm_loss(&probes, &node) {
                    Ok(views) => tracing::warn!(
                        node = %node.name,
                        replicas = %views.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(","),
                        "ha: replicas confirm the primary is lost"
                    ),
                    Err(reason) => {
                        note(
                            &mut held_back,
                            &node.name,
                            &format!("replicas do not confirm: {reason}"),
                        );
                        continue;
                    }
                }
            }

            tracing::warn!(
                node = %node.name,
                failed_probes = failures,
                since = ?detector.first_failure().map(|f| now.duration_since(f)),
                "ha: primary lost; failing over"
            );
            let permit = self.ops.clone().lock_owned().await;
            let req = Request::Failover {
                lost: Some(node.name.clone()),
                automatic: true,
                force: false,
            };
            match self.run_op(permit, req).await {
                Ok(Report::Failover(r)) => {
                    if let Some(b) = self
                        .backends()
                        .into_iter()
                        .find(|b| b.name == r.new_primary)
                    {
                        watched = Some(b);
                    }
                }
                Ok(_) => {}
                Err(e) if e.is_withheld() => {
                    tracing::error!(node = %node.name, error = %e, "ha: automatic failover withheld; trying again while the primary stays lost");
                }
                Err(e) => {
                    tracing::error!(node = %node.name, error = %e, cooloff = ?ha.failover_cooloff(), "ha: automatic failover failed; no new attempt before the cool-off ends");
                }
            }
            detector = LossDetector::from_config(ha);
            session = None;
            held_back.clear();
        }
    }
}

impl HaController {
    /// Fences every node a failover moved away from that the monitor sees writable again
    /// (see [`super::ops::fence_deposed`]).
    async fn fence_returning_nodes(&self) {
        let returning: Vec<BackendConfig> = {
            let t = self.topology.borrow();
            t.nodes
                .iter()
                .filter(|n| n.deposed && n.reachable && n.read_only == Some(false))
                .map(|n| BackendConfig {
                    name: n.name.to_string(),
                    address: n.address.to_string(),
                    proxy_protocol: n.proxy_protocol,
                })
                .collect()
        };
        for node in returning {
            tracing::warn!(node = %node.name, "ha: a node failed over away from is back and writable; fencing it");
            let cfg = self.config();
            match super::ops::fence_deposed(&cfg, &node, &cfg.ha).await {
                Ok(killed) => {
                    tracing::warn!(node = %node.name, killed, "ha: fenced (read-only, client connections killed); it needs a rejoin or a rebuild");
                    self.nudge.notify_one();
                }
                Err(e) => {
                    tracing::error!(node = %node.name, error = %e, "ha: fencing a returning node failed")
                }
            }
        }
    }
}

/// Logs why a lost primary is not failed over, once per reason.
fn note(last: &mut String, node: &str, reason: &str) {
    if last != reason {
        tracing::warn!(node = %node, %reason, "ha: primary lost but not failing over");
        *last = reason.to_string();
    }
}

async fn probe_primary(
    cfg: &Config,
    node: &BackendConfig,
    session: &mut Option<NodeSession>,
    timeout: Duration,
) -> Result<(), HaError> {
    if session.is_none() {
        *session = Some(NodeSession::connect(cfg, node, timeout).await?);
    }
    match session.as_mut() {
        Some(s) => s.query_within("SELECT 1", timeout).await.map(|_| ()),
        None => Ok(()),
    }
}
