//! The serverless lifecycle with a scripted instance driver (no server): single-flight wake,
//! resume retries with backoff and the resume deadline, freeze→stop escalation, crash
//! detection, and the epoch that tells sessions their backend died.
//!
//! Every wait has a deadline; what the lifecycle did is read from the driver's recorded calls
//! and from `Lifecycle::view`.

use holdfast_cluster::topology::Topology;
use holdfast_proxy::config::{
    AuthConfig, BackendConfig, Config, PauseTier, ProxyConfig, ServerlessConfig,
};
use holdfast_proxy::registry::SessionInfo;
use holdfast_proxy::serverless::{self, Lifecycle, PauseError, Phase, WakeError};
use holdfast_proxy::state::Blocker;
use holdfast_proxy::{Seams, Shared};
use holdfast_serverless::driver::scripted::{Op, ScriptedDriver};
use holdfast_serverless::driver::{DriverConfig, ExecDriverConfig, PowerState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Generous: the lifecycle ticks once a second and checks health every two.
const WAIT: Duration = Duration::from_secs(10);

/// A lifecycle task running against a scripted driver.
struct Rig {
    shared: Arc<Shared>,
    lc: Arc<Lifecycle>,
    driver: ScriptedDriver,
    task: tokio::task::JoinHandle<()>,
    _topology: watch::Sender<Arc<Topology>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the lifecycle of an instance whose server is in `state`; idle pauses are off
/// unless `tweak` turns them on.
async fn rig(state: PowerState, tweak: impl FnOnce(&mut ServerlessConfig)) -> Rig {
    rig_with(ScriptedDriver::new(state), tweak).await
}

async fn rig_with(driver: ScriptedDriver, tweak: impl FnOnce(&mut ServerlessConfig)) -> Rig {
    // Never run: the scripted driver stands in for the one the section names.
    let mut sl = ServerlessConfig::new(DriverConfig::Exec(ExecDriverConfig::new("false", "false")));
    sl.idle_pause_secs = 0;
    sl.autoscale = false;
    sl.retry_backoff_ms = 50;
    tweak(&mut sl);
    let config = Arc::new(Config {
        proxy: ProxyConfig::default(),
        admin: Default::default(),
        auth: AuthConfig::default(),
        // Nothing connects to it: neither the monitor nor the autoscaler runs here.
        backends: vec![BackendConfig {
            name: "node1".into(),
            address: "127.0.0.1:1".into(),
            proxy_protocol: false,
        }],
        ha: Default::default(),
        driver: Default::default(),
        listeners: Vec::new(),
        serverless: Some(sl),
        ..Config::default()
    });
    config.validate().expect("test configuration");
    let (tx, rx) = watch::channel(Arc::new(Topology::from_config(&config)));
    let seams = Seams {
        instance_driver: Some(Box::new(driver.clone())),
        ..Seams::default()
    };
    let shared = Arc::new(Shared::with_seams(config, rx, seams));
    let lc = shared
        .serverless
        .clone()
        .expect("a lifecycle with [serverless]");
    assert_eq!(lc.view().driver, "scripted");
    let task = tokio::spawn(serverless::run_lifecycle(shared.clone(), lc.clone()));
    // The lifecycle starts out resuming until it has asked the driver.
    wait_until("the lifecycle to adopt the server's state", || {
        (lc.phase() != Phase::Resuming).then_some(())
    })
    .await;
    Rig {
        shared,
        lc,
        driver,
        task,
        _topology: tx,
    }
}

/// Polls `f` every few milliseconds until it answers, or panics naming `what`.
async fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Wakes the instance from `n` concurrent clients; every one must get in.
async fn wake_many(lc: &Arc<Lifecycle>, n: usize) {
    let waiters: Vec<_> = (0..n)
        .map(|_| {
            let lc = lc.clone();
            tokio::spawn(async move { lc.wake("test").await })
        })
        .collect();
    for w in waiters {
        w.await.expect("waiter task").expect("wake");
    }
}

fn paused_in(lc: &Lifecycle) -> Option<PauseTier> {
    let v = lc.view();
    (v.phase == Phase::Paused).then_some(v.tier).flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_resume_a_paused_instance_once() {
    let r = rig(PowerState::Running, |_| {}).await;
    assert_eq!(r.lc.phase(), Phase::Running);
    assert!(r.lc.is_running());

    r.lc.pause_now(PauseTier::Freeze).await.expect("freeze");
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Freeze));
    assert!(!r.lc.is_running(), "the gate closes with the pause");
    assert_eq!(r.lc.epoch(), 0, "a frozen server keeps its connections");
    // A slow thaw, so that every waiter arrives while it runs.
    r.driver.delay_next(Op::Thaw, 1, Duration::from_millis(200));
    wake_many(&r.lc, 50).await;
    assert_eq!(r.driver.actions(), [Op::Freeze, Op::Thaw]);

    r.lc.pause_now(PauseTier::Stop).await.expect("stop");
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Stop));
    assert_eq!(r.lc.epoch(), 1, "a stop ends the server's connections");
    r.driver
        .delay_next(Op::Start, 1, Duration::from_millis(200));
    wake_many(&r.lc, 50).await;
    assert_eq!(
        r.driver.actions(),
        [Op::Freeze, Op::Thaw, Op::Stop, Op::Start]
    );
    let v = r.lc.view();
    assert_eq!(v.phase, Phase::Running);
    assert_eq!((v.pauses, v.resumes, v.resume_failures), (2, 2, 0));
    assert_eq!(r.lc.epoch(), 1, "a start does not bump the epoch again");
    // Running: a wake returns at once and asks the driver nothing.
    r.lc.wake("test").await.expect("wake while running");
    assert_eq!(r.driver.count(Op::Start), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_resume_is_retried_with_backoff_while_the_client_waits() {
    let r = rig(PowerState::Stopped, |sl| sl.retry_backoff_ms = 100).await;
    assert_eq!(
        paused_in(&r.lc),
        Some(PauseTier::Stop),
        "adopted as stopped"
    );
    r.driver.fail_next(Op::Start, 2);
    r.lc.wake("test")
        .await
        .expect("wake after two failed starts");

    let starts = r.driver.calls_of(Op::Start);
    let failed: Vec<bool> = starts.iter().map(|c| c.failed).collect();
    assert_eq!(failed, [true, true, false]);
    // The backoff doubles: 100 ms, then 200 ms.
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(200), "{gaps:?}");
    let v = r.lc.view();
    assert_eq!(v.phase, Phase::Running);
    assert_eq!((v.resumes, v.resume_failures), (1, 2));
    assert_eq!(v.last_error, None, "a successful resume clears the error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_the_resume_deadline_gets_the_timeout_and_the_instance_stays_paused() {
    // The retry comes 1 s after the first attempt, long after the client gave up at
    // 150 ms: it fails too, nobody waits any more, and the lifecycle stops retrying.
    let r = rig(PowerState::Stopped, |sl| {
        sl.retry_backoff_ms = 1_000;
        sl.resume_deadline_ms = 150;
    })
    .await;
    r.driver.fail_next(Op::Start, 2);
    let t = Instant::now();
    let err =
        r.lc.wake("test")
            .await
            .expect_err("the resume keeps failing");
    assert!(t.elapsed() >= Duration::from_millis(150));
    let WakeError::Timeout {
        deadline_ms,
        last_error,
        ..
    } = &err
    else {
        panic!("expected the resume deadline, got {err}");
    };
    assert_eq!(*deadline_ms, 150);
    assert!(
        last_error
            .as_deref()
            .is_some_and(|e| e.contains("scripted failure")),
        "{err}"
    );
    assert!(
        !err.client_message().contains("scripted"),
        "clients are not shown the driver's error: {}",
        err.client_message()
    );

    wait_until("the lifecycle to give up and stay paused", || {
        (paused_in(&r.lc) == Some(PauseTier::Stop)).then_some(())
    })
    .await;
    assert!(!r.lc.is_running());
    assert_eq!(r.driver.count(Op::Start), 2, "no retry without a waiter");
    assert_eq!(r.lc.view().resume_failures, 2);

    // The next client tries again (and the script has no failures left).
    r.lc.wake("test").await.expect("the next wake");
    assert_eq!(r.driver.count(Op::Start), 3);
    assert_eq!(r.lc.phase(), Phase::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_repeated_failed_resumes_clients_get_the_error_at_once_until_the_breaker_closes() {
    // The client gives up at 100 ms; the retry 1 s later fails too, with nobody waiting:
    // two failures in a row open the breaker for 1 s.
    let r = rig(PowerState::Stopped, |sl| {
        sl.retry_backoff_ms = 1_000;
        sl.resume_deadline_ms = 100;
        sl.breaker_after_failures = 2;
        sl.breaker_open_secs = 1;
    })
    .await;
    r.driver.fail_next(Op::Start, 2);
    r.lc.wake("test").await.expect_err("the resume fails");
    wait_until("the breaker to open", || r.lc.breaker_open()).await;
    assert_eq!(r.driver.count(Op::Start), 2);
    // Open: the error comes at once and the driver is not asked again.
    let err = r.lc.wake("test").await.expect_err("the breaker is open");
    assert!(
        matches!(err, WakeError::CircuitOpen { failures: 2, .. }),
        "{err}"
    );
    assert!(err.client_message().contains("not trying again"), "{err}");
    assert_eq!(r.driver.count(Op::Start), 2);
    // After the open time, the next client tries (and the script has no failures left).
    let waited = Instant::now();
    loop {
        match r.lc.wake("test").await {
            Ok(()) => break,
            Err(WakeError::CircuitOpen { .. }) if waited.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the wake after the breaker closed: {e}"),
        }
    }
    assert_eq!(r.driver.count(Op::Start), 3);
    assert_eq!(r.lc.phase(), Phase::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_resume_tries_even_with_the_breaker_open() {
    let r = rig(PowerState::Stopped, |sl| {
        sl.retry_backoff_ms = 1_000;
        sl.resume_deadline_ms = 100;
        sl.breaker_after_failures = 2;
        sl.breaker_open_secs = 3600;
    })
    .await;
    r.driver.fail_next(Op::Start, 2);
    r.lc.wake("test").await.expect_err("the resume fails");
    wait_until("the breaker to open", || r.lc.breaker_open()).await;
    r.lc.wake("test").await.expect_err("clients get the error");
    r.lc.wake("admin").await.expect("an admin resume tries");
    assert_eq!(r.driver.count(Op::Start), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_is_frozen_then_stopped_after_stop_after_secs() {
    let r = rig(PowerState::Running, |sl| {
        sl.idle_pause_secs = 1;
        sl.pause_tier = PauseTier::Freeze;
        sl.stop_after_secs = 1;
    })
    .await;
    wait_until("the idle instance to freeze", || {
        paused_in(&r.lc).is_some().then_some(())
    })
    .await;
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Freeze));
    assert_eq!(r.lc.epoch(), 0);

    wait_until("the frozen instance to be stopped", || {
        (paused_in(&r.lc) == Some(PauseTier::Stop)).then_some(())
    })
    .await;
    assert_eq!(r.driver.actions(), [Op::Freeze, Op::Stop]);
    let frozen_at = r.driver.calls_of(Op::Freeze)[0].at;
    let stopped_at = r.driver.calls_of(Op::Stop)[0].at;
    assert!(
        stopped_at - frozen_at >= Duration::from_secs(1),
        "stopped {:?} after the freeze",
        stopped_at - frozen_at
    );
    assert_eq!(r.lc.epoch(), 1, "the stop ends the frozen connections");
    assert_eq!(r.lc.view().pauses, 1, "one pause, escalated");
    assert_eq!(r.driver.state(), PowerState::Stopped);

    // A stopped instance is started, not thawed.
    r.lc.wake("test").await.expect("wake");
    assert_eq!(r.driver.actions(), [Op::Freeze, Op::Stop, Op::Start]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_running_is_noticed_and_bumps_the_epoch() {
    let r = rig(PowerState::Running, |_| {}).await;
    assert_eq!(r.lc.epoch(), 0);
    // The server dies behind holdfast's back.
    r.driver.set_state(PowerState::Stopped);
    wait_until("the crash to be noticed", || paused_in(&r.lc)).await;
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Stop));
    assert!(!r.lc.is_running());
    assert_eq!(r.lc.epoch(), 1, "connections to the dead server are gone");
    let v = r.lc.view();
    assert!(
        v.last_error
            .as_deref()
            .is_some_and(|e| e.contains("outside holdfast")),
        "{v:?}"
    );
    // Not restarted on its own (an operator's stop stays a stop)...
    assert_eq!(r.driver.actions(), []);
    // ...but by the next client.
    r.lc.wake("test").await.expect("wake after the crash");
    assert_eq!(r.driver.actions(), [Op::Start]);
    assert_eq!(r.lc.epoch(), 1);
    assert_eq!(r.lc.view().resumes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pause_reopens_the_gate_and_without_freeze_the_stop_tier_is_used() {
    let r = rig_with(ScriptedDriver::new(PowerState::Running), |_| {}).await;
    r.driver.fail_next(Op::Freeze, 1);
    let err =
        r.lc.pause_now(PauseTier::Freeze)
            .await
            .expect_err("freeze fails");
    assert!(matches!(err, PauseError::Failed(_)), "{err}");
    assert_eq!(r.lc.phase(), Phase::Running);
    assert!(r.lc.is_running(), "the gate opens again");
    assert_eq!(r.driver.state(), PowerState::Running);

    let r = rig_with(
        ScriptedDriver::new(PowerState::Running).without_freeze(),
        |_| {},
    )
    .await;
    r.lc.pause_now(PauseTier::Freeze).await.expect("pause");
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Stop));
    assert_eq!(r.driver.actions(), [Op::Stop]);
    assert_eq!(r.lc.epoch(), 1);
}

/// A session as the registry shows it, with what keeps it from surviving a pause.
fn session(id: u32, blocker: Option<Blocker>, can_reauthenticate: bool) -> Arc<SessionInfo> {
    let info = SessionInfo::new(id, "127.0.0.1:50000".parse().expect("address"));
    info.set_blocker(blocker);
    info.can_reauthenticate
        .store(can_reauthenticate, std::sync::atomic::Ordering::Relaxed);
    Arc::new(info)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_that_cannot_survive_a_pause_block_it() {
    let r = rig(PowerState::Running, |_| {}).await;
    // An open transaction blocks every tier.
    r.shared
        .sessions
        .insert(session(1, Some(Blocker::OpenTransaction), true));
    let err =
        r.lc.pause_now(PauseTier::Freeze)
            .await
            .expect_err("blocked");
    let PauseError::Blocked(why) = &err else {
        panic!("{err}");
    };
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].starts_with("session 1 "), "{why:?}");
    assert!(r.lc.is_running());
    assert_eq!(r.driver.actions(), []);
    r.shared.sessions.remove(1);

    // A relayed login survives a freeze (its connection stays) but not a stop.
    r.shared.sessions.insert(session(2, None, false));
    r.lc.pause_now(PauseTier::Freeze).await.expect("freeze");
    let err = r.lc.pause_now(PauseTier::Stop).await.expect_err("no stop");
    assert!(matches!(err, PauseError::Blocked(_)), "{err}");
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Freeze), "stays frozen");
    assert_eq!(r.lc.epoch(), 0);
    r.shared.sessions.remove(2);
    r.lc.pause_now(PauseTier::Stop)
        .await
        .expect("stop once it is gone");
    assert_eq!(paused_in(&r.lc), Some(PauseTier::Stop));
    assert_eq!(r.driver.actions(), [Op::Freeze, Op::Stop]);
    assert_eq!(r.lc.epoch(), 1);
}
