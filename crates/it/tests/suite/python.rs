//! Python drivers through holdfast: scripts in crates/it/py/.

use holdfast_it::{have, run_with_deadline, Harness};
use std::process::Command;
use std::time::Duration;

/// Runs a check script; returns false (after saying why) when the driver is missing.
fn run_script(h: &Harness, script: &str) -> bool {
    run_script_at(h, h.proxy, script, &[])
}

fn run_script_at(h: &Harness, addr: std::net::SocketAddr, script: &str, extra: &[&str]) -> bool {
    if !have("python3") {
        eprintln!("SKIP {script}: python3 is not installed");
        return false;
    }
    let path = format!("{}/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("python3");
    cmd.arg(&path)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .args([h.user(), h.password(), h.database()])
        .args(extra)
        .env("HOLDFAST_ADMIN_TOKEN", h.admin_token());
    let out = run_with_deadline(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        eprintln!("SKIP {script}: {}", stdout.trim());
        return false;
    }
    assert!(
        out.status.success(),
        "{script} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    true
}

#[test]
fn mysql_connector_python() {
    let h = Harness::start();
    if run_script(&h, "connector_check.py") {
        // The driver really used prepared statements and resets.
        let m = h.metrics();
        assert!(
            holdfast_it::metric(&m, "holdfast_commands_total{command=\"COM_STMT_EXECUTE\"}")
                .unwrap_or(0.0)
                >= 4.0,
            "{m}"
        );
        assert!(
            holdfast_it::metric(
                &m,
                "holdfast_commands_total{command=\"COM_RESET_CONNECTION\"}"
            )
            .unwrap_or(0.0)
                >= 1.0,
            "{m}"
        );
    }
}

#[test]
fn pymysql() {
    let h = Harness::start();
    run_script(&h, "pymysql_check.py");
}

/// A connection pool from another ecosystem keeps its idle connections open while the
/// serverless instance is stopped; they all work afterwards without reconnecting.
#[test]
fn a_python_connection_pool_survives_a_pause() {
    let h = Harness::start_with(holdfast_it::Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
    }));
    let admin = h.admin.to_string();
    assert!(
        run_script_at(&h, h.proxy, "serverless_pool.py", &[&admin]),
        "mysql-connector-python is required (scripts/deps.sh installs it)"
    );
}
