//! The lifecycle task: notices idleness, pauses the instance (freeze, then stop after a
//! while), resumes it when a client needs it, and retries failed resumes with backoff.

use super::fleet::{members_blockers, members_drained, members_idle, say_phase, NotDrained};
use super::{Lifecycle, PauseError, PauseTier, Phase};
use crate::Shared;
use holdfast_serverless::driver::PowerState;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often idleness is checked.
const TICK: Duration = Duration::from_secs(1);
/// How often a running instance's server is checked to be alive, with drivers that can
/// tell cheaply (process driver: a /proc read).
const HEALTH_CHECK: Duration = Duration::from_secs(2);
/// How long a pause waits for requests and logins in flight to finish before giving up.
pub(super) const PAUSE_DRAIN: Duration = Duration::from_secs(2);
/// Longest pause between failed resume attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// When a frozen instance cannot be stopped yet (sessions that could not survive it), try
/// again after this long.
const ESCALATE_RETRY: Duration = Duration::from_secs(30);

/// Runs the instance's lifecycle until the process ends.
pub async fn run(shared: Arc<Shared>, lc: Arc<Lifecycle>) {
    // (Before this process is in charge, the gate follows what the driver says, so that
    // sessions see the instance as it is; the other process still runs it.)
    let mut initial = adopt_initial_state(&shared, &lc).await;
    if !lc.is_in_charge() {
        wait_in_charge(&shared, &lc).await;
        initial = adopt_initial_state(&shared, &lc).await;
    }
    let mut activity = Activity::default();
    let mut escalate_at: Option<Instant> = initial.and_then(|t| escalation_deadline(&lc, t));
    let mut last_health_check = Instant::now();
    loop {
        if !lc.is_in_charge() {
            tracing::info!(instance = %lc.config().instance, "serverless: the lifecycle is another process's now; this one no longer pauses, resumes, scales or meters the instance");
            wait_in_charge(&shared, &lc).await;
            // In charge again (the process it handed over to went): from the instance as
            // it is now.
            let tier = adopt_initial_state(&shared, &lc).await;
            escalate_at = tier.and_then(|t| escalation_deadline(&lc, t));
            continue;
        }
        match lc.phase() {
            Phase::Running => {
                let notified = tokio::select! {
                    _ = tokio::time::sleep(TICK) => false,
                    _ = lc.wake_notify.notified() => true,
                };
                let Some(_acting) = lc.act().await else {
                    continue;
                };
                if notified {
                    // A wake that raced with a resume needs nothing.
                    lc.wake_requested.store(false, Ordering::SeqCst);
                }
                // A pause asked for over the admin API runs now.
                let requested = lc.lock().requested_pause.take();
                if let Some((tier, answer)) = requested {
                    let tier = if lc.driver.supports_freeze() {
                        tier
                    } else {
                        PauseTier::Stop
                    };
                    let outcome = if pause(&shared, &lc, tier, Asked::ByOperator).await {
                        escalate_at = escalation_deadline(&lc, tier);
                        Ok(())
                    } else {
                        Err(why_not_paused(&lc))
                    };
                    let _ = answer.send(outcome);
                    continue;
                }
                if notified {
                    continue;
                }
                // Only where asking is cheap (a /proc read): an exec driver's status command
                // or a probe connection every few seconds would load the server's host.
                if lc.driver.status_is_cheap() && last_health_check.elapsed() >= HEALTH_CHECK {
                    last_health_check = Instant::now();
                    match lc.driver.status().await {
                        Ok(PowerState::Stopped) => {
                            crashed(&shared, &lc);
                            say_phase(&shared, &lc, 0).await;
                            continue;
                        }
                        Ok(PowerState::Frozen) if shared.fleet.is_some() => {
                            // Not by this leader: a former one that lost the lead between
                            // its last check and the freeze (paused, cut off). Clients
                            // would wait on it: thawed.
                            tracing::warn!(instance = %lc.config().instance, "the instance's server is frozen, not by this leader (a former one?); thawing it");
                            if let Err(e) = lc.driver.thaw().await {
                                lc.lock().last_error = Some(format!(
                                    "thawing a server frozen outside this leader failed: {e}"
                                ));
                            }
                        }
                        _ => {}
                    }
                }
                if activity.changed(&shared) {
                    lc.touch();
                }
                let idle_limit = lc.config().idle_pause_secs;
                // The fleet's members' clients keep it awake too.
                let idle = lc.lock().last_activity.elapsed();
                let idle = members_idle(&shared).map_or(idle, |theirs| idle.min(theirs));
                if idle_limit > 0 && idle >= Duration::from_secs(idle_limit) {
                    let tier = first_tier(&lc);
                    if pause(&shared, &lc, tier, Asked::ByIdleness).await {
                        escalate_at = escalation_deadline(&lc, tier);
                    }
                } else {
                    lc.lock().pause_blocked_by.clear();
                }
            }
            Phase::Paused => {
                let mut escalate_now = false;
                if !lc.wake_requested.load(Ordering::SeqCst) {
                    tokio::select! {
                        _ = lc.wake_notify.notified() => {}
                        _ = sleep_until_opt(escalate_at) => escalate_now = true,
                    }
                }
                let Some(_acting) = lc.act().await else {
                    continue;
                };
                if escalate_now {
                    escalate_at = escalate(&shared, &lc).await;
                    continue;
                }
                if lc.wake_requested.load(Ordering::SeqCst) {
                    escalate_at = None;
                    resume(&shared, &lc).await;
                    activity.changed(&shared);
                    continue;
                }
                // A pause asked for while paused: already done, unless it asks to go
                // from frozen to stopped.
                let requested = lc.lock().requested_pause.take();
                if let Some((tier, answer)) = requested {
                    let frozen = lc.lock().tier == Some(PauseTier::Freeze);
                    let outcome = if tier == PauseTier::Stop && frozen {
                        escalate_at = escalate(&shared, &lc).await;
                        if lc.lock().tier == Some(PauseTier::Stop) {
                            Ok(())
                        } else {
                            Err(why_not_paused(&lc))
                        }
                    } else {
                        Ok(())
                    };
                    let _ = answer.send(outcome);
                }
            }
            // Transitional phases are entered and left inside pause() and resume().
            Phase::Pausing | Phase::Resuming => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Waits until this process is in charge: in a fleet, following the leader's lifecycle
/// meanwhile.
async fn wait_in_charge(shared: &Shared, lc: &Lifecycle) {
    match &shared.fleet {
        Some(fleet) => super::fleet::follow(shared, lc, fleet).await,
        None => lc.wait_in_charge().await,
    }
}

/// Asks the driver what the server is doing at start-up (or when this process takes
/// charge): a stopped or frozen server starts out paused, so the first client wakes it.
/// Returns the tier it is paused in, if any. In charge of a fleet's instance, it says so.
async fn adopt_initial_state(shared: &Shared, lc: &Lifecycle) -> Option<PauseTier> {
    let tier = read_initial_state(shared, lc).await;
    if lc.is_in_charge() {
        say_phase(shared, lc, 0).await;
    }
    tier
}

async fn read_initial_state(shared: &Shared, lc: &Lifecycle) -> Option<PauseTier> {
    let state = match lc.driver.status().await {
        Ok(s) => s,
        Err(e) => PowerState::Unknown(e.to_string()),
    };
    let tier = match state {
        PowerState::Running => {
            tracing::info!(instance = %lc.config().instance, driver = lc.driver.kind(), "serverless instance is running");
            lc.wake_requested.store(false, Ordering::SeqCst);
            lc.running.store(true, Ordering::SeqCst);
            lc.set_phase(Phase::Running, None);
            set_metrics_phase(shared, Phase::Running);
            return None;
        }
        PowerState::Frozen => PauseTier::Freeze,
        PowerState::Stopped => PauseTier::Stop,
        PowerState::Unknown(why) => {
            // Treat it as stopped: a start adopts a server that is in fact running.
            tracing::warn!(instance = %lc.config().instance, %why, "cannot tell whether the instance runs; treating it as paused");
            PauseTier::Stop
        }
    };
    lc.running.store(false, Ordering::SeqCst);
    lc.set_phase(Phase::Paused, Some(tier));
    set_metrics_phase(shared, Phase::Paused);
    tracing::info!(instance = %lc.config().instance, tier = tier.name(), "serverless instance is paused; the first client wakes it");
    Some(tier)
}

fn first_tier(lc: &Lifecycle) -> PauseTier {
    match lc.config().pause_tier {
        PauseTier::Freeze if lc.driver.supports_freeze() => PauseTier::Freeze,
        _ => PauseTier::Stop,
    }
}

fn escalation_deadline(lc: &Lifecycle, tier: PauseTier) -> Option<Instant> {
    (tier == PauseTier::Freeze && lc.config().stop_after_secs > 0)
        .then(|| Instant::now() + Duration::from_secs(lc.config().stop_after_secs))
}

/// Sessions and connections of this process that keep the instance from pausing to
/// `tier`. While an upgrade's two processes both serve, the other one's sessions are not
/// seen here (one may be inside a transaction): no pause until it is gone.
pub(super) fn local_blockers(shared: &Shared, tier: PauseTier) -> Vec<String> {
    let mut blocked = shared.sessions.pause_blockers(tier == PauseTier::Stop);
    if shared.upgrader.peer().is_some() {
        blocked.push("the previous process still serves sessions (an upgrade)".into());
    }
    blocked
}

/// What keeps the instance from pausing to `tier`: this process's sessions, and, in a
/// fleet, the other members' as they said.
fn blockers(shared: &Shared, tier: PauseTier) -> Vec<String> {
    let mut blocked = local_blockers(shared, tier);
    blocked.extend(members_blockers(shared, tier));
    blocked
}

/// Waits, with the gate closed, for the requests and logins that got through it to
/// finish. `Some(why)` when the pause must be abandoned: a client arrived, or requests are
/// still in flight after [`PAUSE_DRAIN`].
pub(super) async fn drain(shared: &Shared, lc: &Lifecycle) -> Option<&'static str> {
    let drained = Instant::now() + PAUSE_DRAIN;
    loop {
        if lc.wake_requested.load(Ordering::SeqCst) {
            return Some("a client arrived");
        }
        if shared.sessions.none_busy() && lc.logins_in_flight.load(Ordering::SeqCst) == 0 {
            return None;
        }
        if Instant::now() >= drained {
            return Some("requests still in flight");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Who asked for a pause.
#[derive(Clone, Copy)]
enum Asked {
    ByOperator,
    ByIdleness,
}

/// Pauses the instance unless something keeps it busy. Returns whether it paused.
async fn pause(shared: &Shared, lc: &Lifecycle, tier: PauseTier, asked: Asked) -> bool {
    // An operator's pause asks the fleet's members at its barrier, where they answer as
    // their sessions are now; the idle timer first reads what they said within the last
    // second (no gates closed on every member each second while one is blocked).
    let blocked = match asked {
        Asked::ByOperator => local_blockers(shared, tier),
        Asked::ByIdleness => blockers(shared, tier),
    };
    if !blocked.is_empty() {
        let mut inner = lc.lock();
        if inner.pause_blocked_by != blocked {
            tracing::info!(instance = %lc.config().instance, blocked_by = ?blocked, "idle, but not pausing");
            inner.pause_blocked_by = blocked;
        }
        return false;
    }
    lc.lock().pause_blocked_by.clear();
    // The accounts as of the pause (they cannot change while it lasts): a login they
    // refuse is then refused without waking the instance.
    let primary = shared
        .topology
        .borrow()
        .primary_node()
        .map(|n| n.address.clone());
    if let Some(addr) = primary {
        if let Err(e) = shared
            .verifiers
            .refresh_waiting(&shared.config_snapshot(), &addr, Duration::ZERO)
            .await
        {
            tracing::debug!(error = %e, "reading the accounts before a pause failed");
        }
    }
    // Close the gate first, then wait for what got through it: a session marks itself busy
    // before it reads the gate, and the pause reads the busy marks after closing it, so
    // every request either sees the gate closed or is seen here.
    lc.running.store(false, Ordering::SeqCst);
    lc.set_phase(Phase::Pausing, Some(tier));
    set_metrics_phase(shared, Phase::Pausing);
    let abort = drain(shared, lc)
        .await
        .or_else(|| {
            (!local_blockers(shared, tier).is_empty()).then_some("a session became unmovable")
        })
        .map(String::from);
    // In a fleet, every member closes its gate and drains too.
    let pause_number = super::unix_ms();
    let abort = match abort {
        Some(why) => Some(why),
        None => match members_drained(shared, lc, pause_number).await {
            Ok(()) => None,
            Err(NotDrained::Abandoned(why)) => Some(why),
            Err(NotDrained::Blocked(why)) => {
                // (Said to whoever asked for the pause.)
                lc.lock().pause_blocked_by = vec![why.clone()];
                Some(why)
            }
        },
    };
    if let Some(why) = abort {
        tracing::info!(instance = %lc.config().instance, %why, "pause abandoned");
        reopen(shared, lc);
        say_phase(shared, lc, 0).await;
        return false;
    }
    let t = Instant::now();
    let result = match tier {
        PauseTier::Freeze => lc.driver.freeze().await,
        PauseTier::Stop => lc.driver.stop().await,
    };
    match result {
        Ok(()) => {
            if tier == PauseTier::Stop {
                lc.epoch.fetch_add(1, Ordering::SeqCst);
            }
            lc.pauses.fetch_add(1, Ordering::Relaxed);
            lc.set_phase(Phase::Paused, Some(tier));
            set_metrics_phase(shared, Phase::Paused);
            shared
                .metrics
                .instance_transition("running", tier_state(tier));
            tracing::info!(instance = %lc.config().instance, tier = tier.name(), ms = t.elapsed().as_millis() as u64, sessions_kept = shared.sessions.len(), "instance paused");
            say_phase(shared, lc, 0).await;
            true
        }
        Err(e) => {
            tracing::warn!(instance = %lc.config().instance, tier = tier.name(), error = %e, "pause failed; the instance keeps running");
            lc.lock().last_error = Some(format!("pause ({}) failed: {e}", tier.name()));
            reopen(shared, lc);
            say_phase(shared, lc, 0).await;
            false
        }
    }
}

/// Why the last pause did not happen, for whoever asked for it.
fn why_not_paused(lc: &Lifecycle) -> PauseError {
    let inner = lc.lock();
    if !inner.pause_blocked_by.is_empty() {
        PauseError::Blocked(inner.pause_blocked_by.clone())
    } else if let Some(e) = &inner.last_error {
        PauseError::Failed(e.clone())
    } else {
        PauseError::Abandoned
    }
}

/// The server of a running instance is gone (crashed, killed, or stopped outside holdfast,
/// e.g. by `holdfast lab down`): the instance counts as paused in the stop tier. It is not
/// restarted at once (an operator's stop stays a stop); the next client or statement wakes
/// it, and sessions keep their client connections and move to the new server.
fn crashed(shared: &Shared, lc: &Lifecycle) {
    tracing::warn!(instance = %lc.config().instance, "the instance's server is not running (crashed or stopped outside holdfast); the next client starts it again");
    lc.running.store(false, Ordering::SeqCst);
    lc.epoch.fetch_add(1, Ordering::SeqCst);
    lc.lock().last_error = Some("the server stopped outside holdfast (crash or kill)".into());
    lc.set_phase(Phase::Paused, Some(PauseTier::Stop));
    set_metrics_phase(shared, Phase::Paused);
    shared.metrics.instance_transition("running", "crashed");
}

fn tier_state(tier: PauseTier) -> &'static str {
    match tier {
        PauseTier::Freeze => "frozen",
        PauseTier::Stop => "stopped",
    }
}

/// Back to running after an abandoned pause.
fn reopen(shared: &Shared, lc: &Lifecycle) {
    lc.touch();
    lc.running.store(true, Ordering::SeqCst);
    lc.set_phase(Phase::Running, None);
    set_metrics_phase(shared, Phase::Running);
}

/// A frozen instance that stayed paused long enough is stopped to free its memory. Idle
/// sessions survive: they reconnect and restore their state when they next speak.
async fn escalate(shared: &Shared, lc: &Lifecycle) -> Option<Instant> {
    let blocked = blockers(shared, PauseTier::Stop);
    if !blocked.is_empty() {
        tracing::info!(instance = %lc.config().instance, blocked_by = ?blocked, "staying frozen: stopping would lose these sessions");
        lc.lock().pause_blocked_by = blocked;
        return Some(Instant::now() + ESCALATE_RETRY);
    }
    lc.set_phase(Phase::Pausing, Some(PauseTier::Stop));
    set_metrics_phase(shared, Phase::Pausing);
    let result = lc.driver.stop().await;
    set_metrics_phase(shared, Phase::Paused);
    match result {
        Ok(()) => {
            lc.epoch.fetch_add(1, Ordering::SeqCst);
            lc.set_phase(Phase::Paused, Some(PauseTier::Stop));
            shared.metrics.instance_transition("frozen", "stopped");
            tracing::info!(instance = %lc.config().instance, "frozen instance stopped to free its memory");
            say_phase(shared, lc, 0).await;
            None
        }
        Err(e) => {
            tracing::warn!(instance = %lc.config().instance, error = %e, "stopping the frozen instance failed; it stays frozen");
            lc.lock().last_error = Some(format!("stop after freeze failed: {e}"));
            lc.set_phase(Phase::Paused, Some(PauseTier::Freeze));
            Some(Instant::now() + ESCALATE_RETRY)
        }
    }
}

/// After `breaker_after_failures` failed attempts in a row, wakes fail at once for
/// `breaker_open_secs` (see [`Lifecycle::wake`]).
fn open_breaker_if_due(lc: &Lifecycle) {
    let after = lc.config().breaker_after_failures;
    let mut inner = lc.lock();
    if after == 0 || inner.failed_in_a_row < after {
        return;
    }
    let open = Duration::from_secs(lc.config().breaker_open_secs);
    inner.breaker_until = Some(Instant::now() + open);
    tracing::warn!(
        instance = %lc.config().instance,
        failures = inner.failed_in_a_row,
        open_secs = open.as_secs(),
        "resume keeps failing: clients get an error at once until the breaker closes (an admin resume tries at once)"
    );
}

/// Resumes the paused instance: thaw or start, retried with backoff while clients wait.
async fn resume(shared: &Shared, lc: &Lifecycle) {
    let Some(mut tier) = lc.lock().tier else {
        return;
    };
    let started = Instant::now();
    lc.set_phase(Phase::Resuming, Some(tier));
    set_metrics_phase(shared, Phase::Resuming);
    say_phase(shared, lc, 0).await;
    let mut backoff = Duration::from_millis(lc.config().retry_backoff_ms.max(1));
    loop {
        let result = match tier {
            PauseTier::Freeze => lc.driver.thaw().await,
            PauseTier::Stop => lc.driver.start().await,
        };
        match result {
            Ok(()) => break,
            Err(e) => {
                lc.resume_failures.fetch_add(1, Ordering::Relaxed);
                shared.metrics.instance_resume_failures.inc();
                tracing::warn!(instance = %lc.config().instance, tier = tier.name(), error = %e, retry_in_ms = backoff.as_millis() as u64, "resume failed");
                {
                    let mut inner = lc.lock();
                    inner.last_error = Some(format!("resume ({}) failed: {e}", tier.name()));
                    inner.failed_in_a_row = inner.failed_in_a_row.saturating_add(1);
                }
                if tier == PauseTier::Freeze {
                    // A frozen server that is gone (killed, crashed) is started afresh.
                    if let Ok(PowerState::Stopped) = lc.driver.status().await {
                        tier = PauseTier::Stop;
                        lc.epoch.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let waiting =
                    lc.waiters.load(Ordering::SeqCst) + lc.remote_waiters.load(Ordering::SeqCst);
                if waiting == 0 {
                    // Nobody waits any more: stay paused; the next client tries again, or,
                    // after repeated failures, the first after the breaker's open time.
                    open_breaker_if_due(lc);
                    lc.wake_requested.store(false, Ordering::SeqCst);
                    lc.set_phase(Phase::Paused, Some(tier));
                    set_metrics_phase(shared, Phase::Paused);
                    say_phase(shared, lc, 0).await;
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    let took = started.elapsed();
    lc.wake_requested.store(false, Ordering::SeqCst);
    {
        let mut inner = lc.lock();
        inner.last_resume = Some(took);
        inner.last_error = None;
        inner.failed_in_a_row = 0;
        inner.breaker_until = None;
        inner.last_activity = Instant::now();
    }
    lc.resumes.fetch_add(1, Ordering::Relaxed);
    lc.running.store(true, Ordering::SeqCst);
    lc.set_phase(Phase::Running, None);
    set_metrics_phase(shared, Phase::Running);
    shared.metrics.instance_resume_latency.observe(took);
    shared
        .metrics
        .instance_transition(tier_state(tier), "running");
    shared.ha.topology_nudge().notify_one();
    tracing::info!(instance = %lc.config().instance, tier = tier.name(), ms = took.as_secs_f64() * 1e3, "instance resumed");
    say_phase(shared, lc, 0).await;
}

pub(super) fn set_metrics_phase(shared: &Shared, phase: Phase) {
    shared.metrics.set_instance_phase(phase.name());
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Notices statements and completed logins between ticks without touching the query path:
/// it compares counters the sessions keep anyway. A connection that does not log in (a
/// port scan, a health check, garbage) is not activity.
#[derive(Default)]
pub(super) struct Activity {
    last: Option<(u64, u64)>,
}

impl Activity {
    pub(super) fn changed(&mut self, shared: &Shared) -> bool {
        let (commands, busy) = shared.sessions.activity();
        let now = (commands, shared.metrics.logins.get());
        let changed = self.last != Some(now) || busy;
        self.last = Some(now);
        changed
    }
}
