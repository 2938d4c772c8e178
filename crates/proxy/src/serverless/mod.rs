//! Serverless instances: holdfast pauses the database when nobody uses it, wakes it when a
//! client connects or an idle session speaks again, scales it in place and meters it.
//!
//! The gate is one atomic ([`Lifecycle::is_running`]) that sessions read per request; when it
//! is closed they call [`Lifecycle::wake`], which is single-flight: however many clients
//! arrive together, the lifecycle task resumes the instance once. Idle sessions stay open
//! across a pause: with the freeze tier their backend connections survive as they are;
//! with the stop tier they are recreated by the keep-alive moves (`session::relocate`).

mod control;
mod fleet;
mod meter;
mod scale;

use holdfast_serverless::autoscale::ScalePolicyExt as _;
use holdfast_serverless::driver::InstanceDriver;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

pub use control::run as run_lifecycle;
pub use fleet::{InstanceSaid, MemberUse};
pub use meter::{flush_usage, run as run_meter, usage_lines, UsageError};
pub use scale::run as run_autoscaler;

pub use holdfast_config::serverless::{PauseTier, ServerlessConfig};

/// Where the instance is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Pausing,
    Paused,
    Resuming,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Pausing => "pausing",
            Phase::Paused => "paused",
            Phase::Resuming => "resuming",
        }
    }
}

/// What `/status` shows about the instance.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceView {
    pub instance: String,
    pub driver: &'static str,
    pub phase: Phase,
    /// The pause tier while paused (or pausing/resuming).
    pub tier: Option<PauseTier>,
    pub phase_secs: f64,
    pub idle_secs: f64,
    pub idle_pause_secs: u64,
    pub ccu: f64,
    pub cpu_used: f64,
    pub storage_bytes: Option<u64>,
    pub pauses: u64,
    pub resumes: u64,
    pub resume_failures: u64,
    pub last_resume_ms: Option<f64>,
    pub last_error: Option<String>,
    /// Why the instance is not pausing although it is idle (sessions that cannot move...).
    pub pause_blocked_by: Vec<String>,
    /// The steps of the last size change, in the order they were applied.
    pub last_scale: Vec<ScaleStep>,
    /// An operator's size (`ctl scale CCU`) the autoscaler leaves alone until `ctl scale
    /// auto`; none while the autoscaler decides (or is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manual_ccu: Option<f64>,
}

/// One step of a size change: the server's settings over SQL (`what` = "server") or the
/// driver's limits (`what` = "limits": CPU, and the cgroup memory cap).
#[derive(Debug, Clone, Serialize)]
pub struct ScaleStep {
    pub what: &'static str,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WakeError {
    #[error("instance '{instance}' did not resume within {deadline_ms} ms{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Timeout {
        instance: String,
        deadline_ms: u64,
        last_error: Option<String>,
    },
    #[error("instance '{instance}' failed to resume {failures} times in a row; not trying again for {retry_in_ms} ms")]
    CircuitOpen {
        instance: String,
        failures: u32,
        retry_in_ms: u64,
    },
}

/// Why a pause asked for over the admin API did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("sessions keep the instance from pausing: {}", .0.join("; "))]
    Blocked(Vec<String>),
    #[error("the instance did not pause: {0}")]
    Failed(String),
    #[error("the pause was abandoned: requests were in flight or a client arrived")]
    Abandoned,
    #[error("the lifecycle task is gone")]
    LifecycleGone,
    #[error("no answer within 180 s; the instance is {phase}")]
    NoAnswer { phase: &'static str },
}

impl WakeError {
    /// What a client is told: the instance and the deadline, not the driver's error text
    /// (that goes to the log and `/status`).
    pub fn client_message(&self) -> String {
        match self {
            WakeError::Timeout {
                instance,
                deadline_ms,
                ..
            } => format!("instance '{instance}' did not resume within {deadline_ms} ms"),
            WakeError::CircuitOpen { .. } => self.to_string(),
        }
    }
}

/// Mutable state the lifecycle task owns and `/status` reads (not on the query path).
#[derive(Debug)]
struct Inner {
    tier: Option<PauseTier>,
    phase_since: Instant,
    last_activity: Instant,
    ccu: f64,
    cpu_used: f64,
    storage_bytes: Option<u64>,
    last_resume: Option<Duration>,
    last_error: Option<String>,
    /// Resume attempts that failed in a row (reset by a resume).
    failed_in_a_row: u32,
    /// The circuit breaker is open until then: wakes fail at once.
    breaker_until: Option<Instant>,
    pause_blocked_by: Vec<String>,
    /// A size asked for over the admin API, applied by the scaling task.
    requested_ccu: Option<f64>,
    /// See [`InstanceView::manual_ccu`].
    manual_ccu: Option<f64>,
    last_scale: Vec<ScaleStep>,
    /// The meter's open period as of the last second (the ledger has it as of the last
    /// flush).
    open_usage: Option<holdfast_serverless::ledger::UsageLine>,
    /// A pause asked for over the admin API, run by the lifecycle task, which answers
    /// whether it paused (or why not).
    requested_pause: Option<(
        PauseTier,
        tokio::sync::oneshot::Sender<Result<(), PauseError>>,
    )>,
}

/// The instance's lifecycle as sessions and the admin API see it.
pub struct Lifecycle {
    /// `[serverless]` in force: a reload changes its knobs ([`Lifecycle::set_config`]).
    config: arc_swap::ArcSwap<ServerlessConfig>,
    /// The instance's server address (the single backend).
    pub address: String,
    pub driver: Box<dyn InstanceDriver>,
    /// The gate: true while statements may go to the server.
    running: AtomicBool,
    /// Bumped on every phase change; waiters watch it.
    phase_tx: watch::Sender<Phase>,
    /// Set by [`Lifecycle::wake`]; the lifecycle task resumes (or aborts a pause) when set.
    wake_requested: AtomicBool,
    wake_notify: Notify,
    /// Clients waiting in [`Lifecycle::wake`] right now.
    waiters: AtomicUsize,
    /// In a fleet, while this process leads: the other members that want the instance.
    remote_waiters: AtomicUsize,
    /// Logins between the wake check and their backend connection.
    logins_in_flight: AtomicUsize,
    /// Bumped when the server stops: backend connections opened before are gone.
    epoch: AtomicU64,
    pauses: AtomicU64,
    resumes: AtomicU64,
    resume_failures: AtomicU64,
    inner: Mutex<Inner>,
    /// This process runs the lifecycle (pauses, resumes, scaling, metering). Two
    /// processes do not: during an upgrade the old one hands it to the new one
    /// ([`Lifecycle::release`], [`Lifecycle::take_charge`]), as HA.
    in_charge: watch::Sender<bool>,
    /// Held by the lifecycle, scaling and metering tasks while they act on the instance
    /// or the ledger: [`Lifecycle::release`] waits for the action under way.
    acting: tokio::sync::Mutex<()>,
}

/// What a process taking over the lifecycle continues from: the size, the counters and
/// the idle clock (the phase it asks the driver).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LifecycleCarried {
    pub ccu: f64,
    pub manual_ccu: Option<f64>,
    pub idle_ms: u64,
    pub pauses: u64,
    pub resumes: u64,
    pub resume_failures: u64,
}

impl Lifecycle {
    /// The lifecycle of the instance at `address`, controlled by `driver` (the one
    /// `config.driver` names, from [`holdfast_serverless::driver::build`], or a stand-in
    /// such as [`holdfast_serverless::driver::ScriptedDriver`] in tests).
    pub fn new(
        config: ServerlessConfig,
        address: String,
        driver: Box<dyn InstanceDriver>,
    ) -> Arc<Lifecycle> {
        let ccu = config.start_ccu.unwrap_or(config.scale.min_ccu);
        let now = Instant::now();
        Arc::new(Lifecycle {
            driver,
            address,
            // Closed until the lifecycle task has asked the driver what the server does:
            // nothing (logins, the monitor, the verifier refresh) goes to it before that.
            running: AtomicBool::new(false),
            phase_tx: watch::channel(Phase::Resuming).0,
            wake_requested: AtomicBool::new(false),
            wake_notify: Notify::new(),
            waiters: AtomicUsize::new(0),
            remote_waiters: AtomicUsize::new(0),
            logins_in_flight: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            resumes: AtomicU64::new(0),
            resume_failures: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                tier: None,
                phase_since: now,
                last_activity: now,
                ccu,
                cpu_used: 0.0,
                storage_bytes: None,
                last_resume: None,
                last_error: None,
                failed_in_a_row: 0,
                breaker_until: None,
                pause_blocked_by: Vec::new(),
                requested_ccu: None,
                manual_ccu: None,
                last_scale: Vec::new(),
                requested_pause: None,
                open_usage: None,
            }),
            config: arc_swap::ArcSwap::from_pointee(config),
            in_charge: watch::Sender::new(true),
            acting: tokio::sync::Mutex::new(()),
        })
    }

    /// Not in charge until [`Lifecycle::take_charge`]: a process taking over from another
    /// during an upgrade, before that one has let go.
    pub fn stand_by(&self) {
        self.in_charge.send_replace(false);
    }

    /// In charge from now on.
    pub fn take_charge(&self) {
        self.in_charge.send_replace(true);
    }

    pub fn is_in_charge(&self) -> bool {
        *self.in_charge.borrow()
    }

    /// Waits until this process is in charge.
    pub(crate) async fn wait_in_charge(&self) {
        let mut rx = self.in_charge.subscribe();
        // (The sender lives as long as `self`.)
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Leave to act on the instance, held until dropped; `None` when this process is not
    /// in charge (checked under the lock, which [`Lifecycle::release`] takes after it
    /// lets go: no action starts after a release, and a release waits for one under way).
    pub(crate) async fn act(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let guard = self.acting.lock().await;
        self.is_in_charge().then_some(guard)
    }

    /// Lets go of the lifecycle (another process takes it over): a pause, resume, size
    /// change or ledger write under way finishes first; none starts after. Sessions of
    /// this process still see the gate as it is; a wake they ask for waits for the other
    /// process (it runs the instance now).
    pub async fn release(&self) {
        self.in_charge.send_replace(false);
        drop(self.acting.lock().await);
    }

    /// What a process taking over continues from.
    pub fn carried(&self) -> LifecycleCarried {
        let i = self.lock();
        LifecycleCarried {
            ccu: i.ccu,
            manual_ccu: i.manual_ccu,
            idle_ms: i.last_activity.elapsed().as_millis() as u64,
            pauses: self.pauses.load(Ordering::SeqCst),
            resumes: self.resumes.load(Ordering::SeqCst),
            resume_failures: self.resume_failures.load(Ordering::SeqCst),
        }
    }

    /// Continues from what the process this one took over from carried (before
    /// [`Lifecycle::take_charge`]).
    pub fn adopt(&self, carried: &LifecycleCarried) {
        let mut i = self.lock();
        i.ccu = carried.ccu;
        i.manual_ccu = carried.manual_ccu;
        i.last_activity = Instant::now()
            .checked_sub(Duration::from_millis(carried.idle_ms))
            .unwrap_or_else(Instant::now);
        drop(i);
        self.pauses.store(carried.pauses, Ordering::SeqCst);
        self.resumes.store(carried.resumes, Ordering::SeqCst);
        self.resume_failures
            .store(carried.resume_failures, Ordering::SeqCst);
    }

    /// `[serverless]` in force (a reload may change it; read it where it is used).
    pub fn config(&self) -> Arc<ServerlessConfig> {
        self.config.load_full()
    }

    /// A reloaded `[serverless]` (its driver, ledger, meter and start size are kept as
    /// they run by the reload: they need a restart). The lifecycle and the autoscaler
    /// read it at their next step.
    pub fn set_config(&self, config: ServerlessConfig) {
        self.config.store(Arc::new(config));
    }

    /// Whether statements may go to the server now. One atomic load: read per request.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Which run of the server this is: a backend connection opened under another epoch
    /// died when the server stopped.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub fn phase(&self) -> Phase {
        *self.phase_tx.borrow()
    }

    /// Waits until the instance runs, asking the lifecycle task to resume it. Returns at
    /// once when it already runs; fails after the resume deadline.
    pub async fn wake(&self, reason: &'static str) -> Result<(), WakeError> {
        if self.is_running() {
            return Ok(());
        }
        if reason == "admin" {
            // An operator's resume always tries.
            self.lock().breaker_until = None;
        } else if let Some(open) = self.breaker_open() {
            return Err(open);
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = InFlight(&self.waiters);
        let mut rx = self.phase_tx.subscribe();
        if !self.wake_requested.swap(true, Ordering::SeqCst) {
            tracing::info!(instance = %self.config().instance, reason, "wake requested");
        }
        self.wake_notify.notify_one();
        let deadline = self.config().resume_deadline();
        let ok = tokio::time::timeout(deadline, rx.wait_for(|_| self.is_running()))
            .await
            .is_ok_and(|r| r.is_ok());
        if ok {
            Ok(())
        } else {
            Err(WakeError::Timeout {
                instance: self.config().instance.clone(),
                deadline_ms: self.config().resume_deadline_ms,
                last_error: self.lock().last_error.clone(),
            })
        }
    }

    /// The error a wake gets now if the circuit breaker is open.
    pub fn breaker_open(&self) -> Option<WakeError> {
        let inner = self.lock();
        let until = inner.breaker_until?;
        let left = until.checked_duration_since(Instant::now())?;
        Some(WakeError::CircuitOpen {
            instance: self.config().instance.clone(),
            failures: inner.failed_in_a_row,
            retry_in_ms: left.as_millis() as u64,
        })
    }

    /// Marks a login that has passed the gate and is opening its backend connection, so a
    /// pause waits for it. Dropping the guard ends the mark.
    pub fn login_started(&self) -> InFlight<'_> {
        self.logins_in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.logins_in_flight)
    }

    /// Counts as activity for the idle timer (a login, an admin resume).
    pub fn touch(&self) {
        self.lock().last_activity = Instant::now();
    }

    /// Asks the scaling task to apply `ccu` (snapped to the policy's steps and bounds): an
    /// operator's size, which holds (the autoscaler does not undo it) until
    /// [`Lifecycle::scale_automatically`].
    pub fn request_scale(&self, ccu: f64) {
        let mut i = self.lock();
        i.requested_ccu = Some(ccu);
        i.manual_ccu = Some(self.config().scale.snap(ccu));
    }

    /// Lets the autoscaler decide the size again (`ctl scale auto`).
    pub fn scale_automatically(&self) {
        self.lock().manual_ccu = None;
    }

    /// An operator's size holds (see [`InstanceView::manual_ccu`]).
    pub fn manual_ccu(&self) -> Option<f64> {
        self.lock().manual_ccu
    }

    /// Whether a size asked for with [`Lifecycle::request_scale`] is still to be applied.
    pub fn scale_pending(&self) -> bool {
        self.lock().requested_ccu.is_some()
    }

    /// On a graceful stop of holdfast (SIGTERM, SIGINT): a server holdfast froze is thawed,
    /// so that clients that reach it directly get answers and its owner can stop it; a
    /// stopped one stays stopped. The next holdfast finds it running and adopts that.
    /// (After SIGKILL nothing can thaw it: `kill -CONT` does, as the README says.)
    pub async fn thaw_on_shutdown(&self) -> Result<bool, holdfast_serverless::driver::DriverError> {
        match self.driver.status().await? {
            holdfast_serverless::driver::PowerState::Frozen => {
                self.driver.thaw().await?;
                tracing::info!(instance = %self.config().instance, "thawed the frozen instance on the way out");
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Pauses now (sessions that cannot survive it still block): the lifecycle task runs
    /// the pause; the answer says why it did not happen.
    pub async fn pause_now(&self, tier: PauseTier) -> Result<(), PauseError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.lock().requested_pause = Some((tier, tx));
        self.wake_notify.notify_one();
        // A stop waits for the server's shutdown (stop_timeout_ms at most); this bound only
        // keeps an admin request from hanging if the lifecycle task is stuck.
        match tokio::time::timeout(Duration::from_secs(180), rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(PauseError::LifecycleGone),
            Err(_) => Err(PauseError::NoAnswer {
                phase: self.phase().name(),
            }),
        }
    }

    pub fn ccu(&self) -> f64 {
        self.lock().ccu
    }

    pub fn view(&self) -> InstanceView {
        let i = self.lock();
        InstanceView {
            instance: self.config().instance.clone(),
            driver: self.driver.kind(),
            phase: self.phase(),
            tier: i.tier,
            phase_secs: i.phase_since.elapsed().as_secs_f64(),
            idle_secs: i.last_activity.elapsed().as_secs_f64(),
            idle_pause_secs: self.config().idle_pause_secs,
            ccu: i.ccu,
            cpu_used: i.cpu_used,
            storage_bytes: i.storage_bytes,
            pauses: self.pauses.load(Ordering::Relaxed),
            resumes: self.resumes.load(Ordering::Relaxed),
            resume_failures: self.resume_failures.load(Ordering::Relaxed),
            last_resume_ms: i.last_resume.map(|d| d.as_secs_f64() * 1e3),
            last_error: i.last_error.clone(),
            pause_blocked_by: i.pause_blocked_by.clone(),
            last_scale: i.last_scale.clone(),
            manual_ccu: i.manual_ccu,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is plain data: a panic elsewhere cannot leave it half-updated in a way
        // that matters more than losing the lifecycle altogether.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_phase(&self, phase: Phase, tier: Option<PauseTier>) {
        let from = {
            // Under the state lock, so that `view` sees the phase with its tier and time.
            let mut i = self.lock();
            i.tier = tier;
            i.phase_since = Instant::now();
            self.phase_tx.send_replace(phase)
        };
        if from != phase {
            tracing::info!(instance = %self.config().instance, from = from.name(), to = phase.name(), tier = tier.map(PauseTier::name), "instance lifecycle");
        }
    }
}

impl crate::gate::BackendGate for Lifecycle {
    fn is_open(&self) -> bool {
        self.is_running()
    }

    fn epoch(&self) -> u64 {
        Lifecycle::epoch(self)
    }

    fn open(&self, trigger: &'static str) -> crate::gate::GateFuture<'_> {
        Box::pin(self.wake(trigger))
    }

    fn hold_open(&self) -> Option<InFlight<'_>> {
        Some(self.login_started())
    }

    fn login_grace(&self) -> Duration {
        self.config().resume_deadline()
    }

    fn wakes_on_login(&self) -> bool {
        true
    }
}

/// Milliseconds since the unix epoch (0 if the clock is before it).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Starts the lifecycle's tasks: the lifecycle, the autoscaler, the meter (with a
/// ledger), and in a fleet the leader's ear for the members' wakes.
pub fn spawn_tasks(shared: &Arc<crate::Shared>, lc: &Arc<Lifecycle>) {
    tokio::spawn(run_lifecycle(shared.clone(), lc.clone()));
    tokio::spawn(run_autoscaler(shared.clone(), lc.clone()));
    if let Some(ledger) = &shared.ledger {
        tokio::spawn(run_meter(shared.clone(), lc.clone(), ledger.clone()));
    }
    if let Some(f) = &shared.fleet {
        tokio::spawn(fleet::hear_wakes(lc.clone(), f.clone()));
    }
}

/// Counts one waiter or login in flight until dropped.
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
