//! The admin API: /status, /metrics, and what `holdfast ctl status` prints.

use holdfast_it::raw::{RawConn, BASE_CAPS};
use holdfast_it::{metric, wait_for, Harness};
use std::time::Duration;

#[test]
fn status_shows_topology_and_open_sessions() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .unwrap();
    c.query("SELECT 1").unwrap();
    let v = h.status_json();
    assert_eq!(v["topology"]["primary"], "node1", "{v:#}");
    let node = &v["topology"]["nodes"][0];
    assert_eq!(node["name"], "node1");
    assert_eq!(node["address"], h.lab.primary().address.as_str());
    assert_eq!(node["reachable"], true);
    assert_eq!(node["read_only"], false);
    assert!(
        node["version"].as_str().unwrap().contains("MariaDB"),
        "{node}"
    );
    assert_eq!(v["verifiers_loaded"], true);
    assert!(v["verifier_accounts"].as_u64().unwrap() >= 2);
    let sessions = v["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{v:#}");
    let s = &sessions[0];
    assert_eq!(s["user"], "app");
    assert_eq!(s["backend"], "node1");
    assert_eq!(s["movable"], true);
    assert!(s["blocked_by"].is_null());
    assert_eq!(s["can_reauthenticate"], true);
    assert_eq!(s["client"], c.stream.local_addr().unwrap().to_string());
    assert!(s["commands"].as_u64().unwrap() >= 1);
    assert_eq!(v["counters"]["sessions_open"], 1);

    // A second session appears, and both go away when they close.
    let d = RawConn::connect(h.proxy, h.user(), h.password(), None, BASE_CAPS).unwrap();
    h.wait_sessions(2, Duration::from_secs(10));
    drop(c);
    drop(d);
    h.wait_sessions(0, Duration::from_secs(10));
}

#[test]
fn metrics_count_commands_errors_and_latency() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .unwrap();
    for _ in 0..5 {
        c.query("SELECT 1").unwrap();
    }
    c.ping().unwrap();
    let e = RawConn::connect(h.proxy, h.user(), "wrong", None, BASE_CAPS)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        holdfast_it::raw::server_err(&e).map(|s| s.code),
        Some(1045),
        "{e:#}"
    );
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_commands_total{command=\"COM_QUERY\"}"),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "holdfast_commands_total{command=\"COM_PING\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "holdfast_errors_total{code=\"1045\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "holdfast_logins_failed_total"), Some(1.0), "{m}");
    assert_eq!(metric(&m, "holdfast_sessions"), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "holdfast_command_latency_seconds_count"),
        Some(6.0),
        "{m}"
    );
    assert!(
        metric(&m, "holdfast_command_latency_seconds_sum").unwrap() > 0.0,
        "{m}"
    );
    let buckets = m
        .lines()
        .filter(|l| l.starts_with("holdfast_command_latency_seconds_bucket{"))
        .count();
    assert_eq!(buckets, 17, "{m}");
    assert!(
        metric(&m, "holdfast_client_connections_total").unwrap() >= 2.0,
        "{m}"
    );
    assert!(
        m.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );
}

#[test]
fn ctl_status_renders_topology_and_sessions() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .unwrap();
    c.query("START TRANSACTION").unwrap();
    // /status is refreshed when the command's bookkeeping is done.
    wait_for("the transaction to show", Duration::from_secs(10), || {
        (h.status().sessions.first()?.blocked_by.as_deref() == Some("open transaction"))
            .then_some(())
    });
    // What `holdfast ctl --admin ADDR status` does.
    let text = holdfast_admin::render_status(&h.status());
    assert!(text.contains("primary: node1"), "{text}");
    assert!(text.contains(&h.lab.primary().address), "{text}");
    assert!(text.contains("sessions open: 1"), "{text}");
    assert!(text.contains("no (open transaction)"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&c.stream.local_addr().unwrap().to_string()))
        .expect("session line");
    assert!(line.contains(" app "), "{line}");
    assert!(!text.contains("not loaded"), "{text}");
}

#[test]

fn latency_histogram_buckets_are_consistent() {
    let h = Harness::start();
    let mut c = RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .unwrap();
    for _ in 0..6 {
        c.query("SELECT 1").unwrap();
    }
    let m = h.metrics();
    let count = metric(&m, "holdfast_command_latency_seconds_count").unwrap();
    assert_eq!(count, 6.0, "{m}");
    assert_eq!(
        metric(&m, "holdfast_command_latency_seconds_bucket{le=\"+Inf\"}"),
        Some(count),
        "{m}"
    );
    let buckets: Vec<f64> = m
        .lines()
        .filter(|l| l.starts_with("holdfast_command_latency_seconds_bucket{"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        .collect();
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "not cumulative: {buckets:?}"
    );
    assert!(
        buckets.iter().all(|&b| b <= count),
        "a bucket exceeds the count: {buckets:?}"
    );
    // Each command here takes far less than 10 s.
    assert_eq!(
        metric(&m, "holdfast_command_latency_seconds_bucket{le=\"10.0\"}"),
        Some(count),
        "{m}"
    );
}
