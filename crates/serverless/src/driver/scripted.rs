//! A stand-in instance driver for tests: no server runs. It records every call, keeps a power
//! state the test can change behind the lifecycle's back (a crash is `set_state(Stopped)`),
//! and can be told to fail or delay the next calls of a kind.
//!
//! Readiness needs nothing here: the [`InstanceDriver`] contract is that `start` and `thaw`
//! return once the server answers, so the lifecycle never probes the server itself; a
//! scripted `start` that returns `Ok` stands for "started and ready".
//!
//! Clones share one script: give the lifecycle `Box::new(driver.clone())` and keep the
//! original to steer and inspect it.

use super::{DriverError, DriverFuture, InstanceDriver, PowerState, ScaleApplied};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A driver method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Start,
    Stop,
    Freeze,
    Thaw,
    Status,
    Scale,
    CpuSeconds,
    StorageBytes,
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub op: Op,
    /// When the call began (before any scripted delay).
    pub at: Instant,
    /// The size asked for, for [`Op::Scale`].
    pub ccu: Option<f64>,
    /// Whether the script made this call fail.
    pub failed: bool,
}

/// What the script does to one upcoming call.
#[derive(Debug, Clone, Copy, Default)]
struct Fault {
    delay: Duration,
    fail: bool,
}

#[derive(Debug)]
struct Script {
    state: PowerState,
    calls: Vec<Call>,
    faults: HashMap<Op, VecDeque<Fault>>,
}

/// The stand-in driver (see the module docs).
#[derive(Debug, Clone)]
pub struct ScriptedDriver {
    script: Arc<Mutex<Script>>,
    supports_freeze: bool,
}

impl ScriptedDriver {
    /// A driver whose server is in `state`, with the freeze tier supported.
    pub fn new(state: PowerState) -> ScriptedDriver {
        ScriptedDriver {
            script: Arc::new(Mutex::new(Script {
                state,
                calls: Vec::new(),
                faults: HashMap::new(),
            })),
            supports_freeze: true,
        }
    }

    /// Without the freeze tier (like an exec driver without freeze commands).
    pub fn without_freeze(mut self) -> ScriptedDriver {
        self.supports_freeze = false;
        self
    }

    /// The server's power state as the driver reports it.
    pub fn state(&self) -> PowerState {
        self.lock().state.clone()
    }

    /// Changes the power state behind the caller's back (a crash: `Stopped` while running).
    pub fn set_state(&self, state: PowerState) {
        self.lock().state = state;
    }

    /// The next `n` calls of `op` fail (after any delay scripted for them).
    pub fn fail_next(&self, op: Op, n: usize) {
        self.push(op, n, |f| f.fail = true);
    }

    /// The next `n` calls of `op` take `delay` before they act.
    pub fn delay_next(&self, op: Op, n: usize, delay: Duration) {
        self.push(op, n, |f| f.delay = delay);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls of `op` so far, in order.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.op == op)
            .cloned()
            .collect()
    }

    /// How many calls of `op` there were.
    pub fn count(&self, op: Op) -> usize {
        self.lock().calls.iter().filter(|c| c.op == op).count()
    }

    /// Calls other than the periodic ones (status, CPU, storage): what changed the server.
    pub fn actions(&self) -> Vec<Op> {
        self.lock()
            .calls
            .iter()
            .map(|c| c.op)
            .filter(|op| !matches!(op, Op::Status | Op::CpuSeconds | Op::StorageBytes))
            .collect()
    }

    /// Scripts the next `n` calls of `op`: the first `n` queued faults are changed by `f`,
    /// and new ones appended as needed, so a delay and a failure can be combined.
    fn push(&self, op: Op, n: usize, f: impl Fn(&mut Fault)) {
        let mut s = self.lock();
        let queue = s.faults.entry(op).or_default();
        while queue.len() < n {
            queue.push_back(Fault::default());
        }
        queue.iter_mut().take(n).for_each(f);
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        // Plain data: a panicking test thread must not hide the script from the others.
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the call and takes its scripted fault, if any.
    fn begin(&self, op: Op, ccu: Option<f64>) -> Fault {
        let mut s = self.lock();
        let fault = s
            .faults
            .get_mut(&op)
            .and_then(VecDeque::pop_front)
            .unwrap_or_default();
        s.calls.push(Call {
            op,
            at: Instant::now(),
            ccu,
            failed: fault.fail,
        });
        fault
    }

    /// Runs one call: records it, waits out its delay, fails if scripted to, else `act`s on
    /// the power state.
    async fn call<T>(
        &self,
        op: Op,
        ccu: Option<f64>,
        act: impl FnOnce(&mut PowerState) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        let fault = self.begin(op, ccu);
        if !fault.delay.is_zero() {
            tokio::time::sleep(fault.delay).await;
        }
        if fault.fail {
            return Err(DriverError::Failed(format!("scripted failure of {op:?}")));
        }
        act(&mut self.lock().state)
    }
}

fn not_running(what: &str, state: &PowerState) -> DriverError {
    DriverError::Failed(format!("cannot {what}: the server is {state:?}"))
}

impl InstanceDriver for ScriptedDriver {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn start(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.call(Op::Start, None, |state| {
            *state = PowerState::Running;
            Ok(())
        }))
    }

    fn stop(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.call(Op::Stop, None, |state| {
            *state = PowerState::Stopped;
            Ok(())
        }))
    }

    fn supports_freeze(&self) -> bool {
        self.supports_freeze
    }

    fn freeze(&self) -> DriverFuture<'_, ()> {
        let supported = self.supports_freeze;
        Box::pin(self.call(Op::Freeze, None, move |state| {
            if !supported {
                return Err(DriverError::Unsupported {
                    driver: "scripted",
                    what: "freeze",
                });
            }
            match state {
                PowerState::Running | PowerState::Frozen => {
                    *state = PowerState::Frozen;
                    Ok(())
                }
                other => Err(not_running("freeze", other)),
            }
        }))
    }

    fn thaw(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.call(Op::Thaw, None, |state| match state {
            PowerState::Running | PowerState::Frozen => {
                *state = PowerState::Running;
                Ok(())
            }
            // Like a SIGCONT to a process that is gone.
            other => Err(not_running("thaw", other)),
        }))
    }

    fn status(&self) -> DriverFuture<'_, PowerState> {
        Box::pin(self.call(Op::Status, None, |state| Ok(state.clone())))
    }

    fn status_is_cheap(&self) -> bool {
        true
    }

    fn scale(&self, ccu: f64) -> DriverFuture<'_, ScaleApplied> {
        Box::pin(self.call(Op::Scale, Some(ccu), move |_| {
            Ok(ScaleApplied {
                cpu_limit: Some(ccu),
                note: "scripted".into(),
            })
        }))
    }

    fn cpu_seconds(&self) -> DriverFuture<'_, Option<f64>> {
        Box::pin(self.call(Op::CpuSeconds, None, |_| Ok(None)))
    }

    fn storage_bytes(&self) -> DriverFuture<'_, Option<u64>> {
        Box::pin(self.call(Op::StorageBytes, None, |_| Ok(None)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_calls_and_follows_the_power_state() {
        let d = ScriptedDriver::new(PowerState::Stopped);
        let lc: Box<dyn InstanceDriver> = Box::new(d.clone());
        assert!(
            lc.thaw().await.is_err(),
            "a stopped server cannot be thawed"
        );
        lc.start().await.unwrap();
        assert_eq!(d.state(), PowerState::Running);
        lc.freeze().await.unwrap();
        assert_eq!(lc.status().await.unwrap(), PowerState::Frozen);
        lc.thaw().await.unwrap();
        let applied = lc.scale(1.5).await.unwrap();
        assert_eq!(applied.cpu_limit, Some(1.5));
        lc.stop().await.unwrap();
        assert_eq!(d.state(), PowerState::Stopped);
        assert_eq!(
            d.actions(),
            [
                Op::Thaw,
                Op::Start,
                Op::Freeze,
                Op::Thaw,
                Op::Scale,
                Op::Stop
            ]
        );
        assert_eq!(d.calls_of(Op::Scale)[0].ccu, Some(1.5));
        assert_eq!(d.count(Op::Status), 1);
    }

    #[tokio::test]
    async fn scripted_failures_and_delays_apply_to_the_next_calls_only() {
        let d = ScriptedDriver::new(PowerState::Stopped);
        d.fail_next(Op::Start, 2);
        d.delay_next(Op::Start, 1, Duration::from_millis(30));
        let t = Instant::now();
        assert!(d.start().await.is_err());
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "first start delayed"
        );
        assert!(d.start().await.is_err());
        assert_eq!(
            d.state(),
            PowerState::Stopped,
            "a failed start changes nothing"
        );
        d.start().await.unwrap();
        assert_eq!(d.state(), PowerState::Running);
        let failed: Vec<bool> = d.calls_of(Op::Start).iter().map(|c| c.failed).collect();
        assert_eq!(failed, [true, true, false]);
        // A crash behind the driver's back.
        d.set_state(PowerState::Stopped);
        assert_eq!(d.status().await.unwrap(), PowerState::Stopped);
    }

    #[tokio::test]
    async fn without_freeze_refuses_to_freeze() {
        let d = ScriptedDriver::new(PowerState::Running).without_freeze();
        assert!(!d.supports_freeze());
        assert!(matches!(
            d.freeze().await,
            Err(DriverError::Unsupported { .. })
        ));
        assert_eq!(d.state(), PowerState::Running);
    }
}
