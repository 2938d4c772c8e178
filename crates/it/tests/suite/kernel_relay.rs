//! Pass-through sessions relayed in the kernel (`[proxy] kernel_relay = "auto"`, a BPF
//! sockmap; the tests run as root, as CI does): what a client sees is what it sees in user
//! space (prepared statements, a large result, an error), the session is listed, counted
//! and blocks nothing it did not before, its bytes are counted when it ends, and the end
//! of either side ends it.

use holdfast_it::{metric, wait_for, Harness, Options};
use holdfast_proxy::config::{
    BackendTlsConfig, Config, KernelRelayMode, ListenerConfig, ListenerMode,
};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// A harness with [`plain_passthrough`], the relay as `mode` says.
fn harness(mode: KernelRelayMode) -> Harness {
    Harness::start_with(Options::default().config(move |c| {
        plain_passthrough(c);
        c.proxy.kernel_relay = mode;
    }))
}

/// A pass-through listener, and plain TCP to the node (the kernel relays only plain TCP
/// on both sides).
fn plain_passthrough(c: &mut Config) {
    c.backend_tls = BackendTlsConfig::default();
    c.listeners.push(ListenerConfig {
        listen: "127.0.0.1:0".into(),
        mode: ListenerMode::Passthrough,
        routing: Default::default(),
        trusted_proxies: None,
    });
}

fn connect(h: &Harness) -> Conn {
    let url = format!(
        "mysql://{}:{}@127.0.0.1:{}/{}",
        h.user(),
        h.password(),
        h.listeners[0].port(),
        h.database()
    );
    let opts = OptsBuilder::from_opts(Opts::from_url(&url).expect("url"))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(20)));
    Conn::new(opts).expect("connect through the pass-through listener")
}

fn gauge(h: &Harness, name: &str) -> f64 {
    metric(&h.metrics(), name).unwrap_or(-1.0)
}

#[test]
fn a_pass_through_session_is_relayed_in_the_kernel_and_answers_as_the_server_does() {
    let h = harness(KernelRelayMode::Auto);
    let bytes_before = metric(&h.metrics(), "holdfast_client_bytes_received_total").unwrap_or(0.0);
    let mut c = connect(&h);
    wait_for("the session relayed in the kernel", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 1.0).then_some(())
    });
    let stmt = c.prep("SELECT ? + 40").expect("prepare");
    let v: Option<i64> = c.exec_first(&stmt, (2,)).expect("execute");
    assert_eq!(v, Some(42));
    let rows: Vec<(i64, String)> = c
        .query("SELECT seq, REPEAT('r', 300) FROM seq_1_to_5000")
        .expect("a large result");
    assert_eq!(rows.len(), 5000);
    // An error, as the server says it.
    let err = c
        .query_drop("SELECT * FROM no_such_table")
        .expect_err("1146");
    assert!(err.to_string().contains("1146"), "{err}");
    c.query_drop("SET @kept = 'in the kernel'").expect("set");
    let kept: Option<String> = c.query_first("SELECT @kept").expect("select");
    assert_eq!(kept.as_deref(), Some("in the kernel"));
    // Listed; `/status` says the kernel relays it.
    let status = h.status_json();
    let sessions = status["sessions"].clone();
    assert_eq!(sessions.as_array().map(Vec::len), Some(1), "{sessions}");
    assert_eq!(status["kernel_relay"]["on"], true, "{status}");
    assert_eq!(status["kernel_relay"]["sessions"], 1, "{status}");
    drop(c);
    wait_for("the session to end", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 0.0
            && gauge(&h, "holdfast_sessions") == 0.0)
            .then_some(())
    });
    // The bytes the client sent, counted though user space read none of them.
    let bytes =
        metric(&h.metrics(), "holdfast_client_bytes_received_total").unwrap_or(0.0) - bytes_before;
    assert!(bytes > 100.0, "{bytes} bytes from the client counted");
}

#[test]
fn the_server_ending_the_connection_ends_the_client_s() {
    let h = harness(KernelRelayMode::Auto);
    let mut c = connect(&h);
    wait_for("the session relayed in the kernel", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 1.0).then_some(())
    });
    let id: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("id");
    let id = id.expect("an id");
    h.root_sql(&format!("KILL {id}"));
    let err = c
        .query_drop("SELECT 1")
        .expect_err("the connection is gone");
    assert!(!err.to_string().is_empty());
    wait_for("the session to end", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 0.0
            && gauge(&h, "holdfast_sessions") == 0.0)
            .then_some(())
    });
}

#[test]
fn with_the_kernel_relay_off_sessions_copy_in_user_space() {
    let h = harness(KernelRelayMode::Off);
    let mut c = connect(&h);
    let v: Option<i64> = c.query_first("SELECT 7").expect("select");
    assert_eq!(v, Some(7));
    assert_eq!(gauge(&h, "holdfast_sessions_kernel_relayed"), 0.0);
    assert_eq!(gauge(&h, "holdfast_sessions"), 1.0);
    // `/status` says so, and why.
    let status = h.status_json();
    assert_eq!(status["kernel_relay"]["on"], false, "{status}");
    let why = status["kernel_relay"]["why_not"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("kernel_relay = \"off\""), "{status}");
}

/// As a pass-through session copied in user space: it keeps a serverless instance from
/// pausing (and says why), and once it is gone the instance pauses.
#[test]
fn a_session_relayed_in_the_kernel_keeps_the_instance_from_pausing() {
    let h = Harness::start_with(
        Options::default()
            .serverless(|s| s.idle_pause_secs = 1)
            .config(plain_passthrough),
    );
    let mut c = connect(&h);
    wait_for("the session relayed in the kernel", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 1.0).then_some(())
    });
    let v: Option<i64> = c.query_first("SELECT 3").expect("select");
    assert_eq!(v, Some(3));
    let why = wait_for("the pause to be blocked", WAIT, || {
        let s = h.status_json()["serverless"].clone();
        let list = s["pause_blocked_by"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!list.is_empty()).then_some(list)
    });
    assert!(format!("{why:?}").contains("pass-through"), "{why:?}");
    assert_eq!(h.status_json()["serverless"]["phase"], "running");
    drop(c);
    wait_for("the instance to pause", WAIT, || {
        (h.status_json()["serverless"]["phase"] == "paused").then_some(())
    });
}

/// As a pass-through session copied in user space: it cannot move, so a switchover ends
/// it with its backend connection (the client's next statement finds its connection
/// lost); a new pass-through connection reaches the new primary, relayed in the kernel.
#[test]
fn a_switchover_ends_a_session_relayed_in_the_kernel_as_any_pass_through_session() {
    let h = Harness::start_with(Options::default().replicas(1).config(plain_passthrough));
    let mut c = connect(&h);
    wait_for("the session relayed in the kernel", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 1.0).then_some(())
    });
    let before: Option<u64> = c.query_first("SELECT @@server_id").expect("server id");
    let status = h.status();
    let primary = status.topology.primary.clone().expect("a primary");
    let replica = status
        .topology
        .nodes
        .iter()
        .find(|n| n.name != primary)
        .map(|n| n.name.clone())
        .expect("a replica");
    h.switch_over_to(&replica);
    assert!(
        c.query_first::<u64, _>("SELECT @@server_id").is_err(),
        "the pass-through session ended with its backend connection"
    );
    wait_for("the session to end", WAIT, || {
        (gauge(&h, "holdfast_sessions_kernel_relayed") == 0.0).then_some(())
    });
    let mut fresh = connect(&h);
    let after: Option<u64> = fresh.query_first("SELECT @@server_id").expect("server id");
    assert_ne!(after, before, "a new connection reaches the new primary");
    assert_eq!(gauge(&h, "holdfast_sessions_kernel_relayed"), 1.0);
}
