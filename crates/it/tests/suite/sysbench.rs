//! sysbench through holdfast.

use holdfast_it::{run_with_deadline, Harness};
use std::process::Command;
use std::time::Duration;

fn sysbench(h: &Harness, test: &str, cmd: &str, extra: &[&str]) -> String {
    let mut c = Command::new("sysbench");
    c.arg(test)
        .arg(format!("--mysql-host={}", h.proxy.ip()))
        .arg(format!("--mysql-port={}", h.proxy.port()))
        .arg(format!("--mysql-user={}", h.user()))
        .arg(format!("--mysql-password={}", h.password()))
        .arg(format!("--mysql-db={}", h.database()))
        .args(["--tables=4", "--table-size=1000"])
        .args(extra)
        .arg(cmd);
    let out = run_with_deadline(c, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sysbench {test} {cmd} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        !stdout.contains("FATAL") && !stderr.contains("FATAL"),
        "sysbench {test} {cmd}:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The first number after `label` on its line of sysbench's summary.
fn number(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{out}"));
    line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

fn run(test: &str) {
    holdfast_it::require("sysbench").expect("sysbench");
    let h = Harness::start();
    sysbench(&h, test, "prepare", &[]);
    let out = sysbench(
        &h,
        test,
        "run",
        &[
            "--threads=8",
            "--time=5",
            "--db-ps-mode=auto",
            "--report-interval=0",
        ],
    );
    let transactions = number(&out, "transactions:");
    let ignored = number(&out, "ignored errors:");
    eprintln!("sysbench {test}: {transactions} transactions, {ignored} ignored errors");
    assert!(transactions > 0.0, "{out}");
    assert!(!out.to_lowercase().contains("error:"), "{out}");
    // Prepared statements really went through holdfast.
    let m = h.metrics();
    assert!(
        holdfast_it::metric(&m, "holdfast_commands_total{command=\"COM_STMT_EXECUTE\"}")
            .unwrap_or(0.0)
            >= transactions,
        "{m}"
    );
    h.wait_sessions(0, Duration::from_secs(30));
}

#[test]
fn oltp_point_select() {
    run("oltp_point_select");
}

#[test]
fn oltp_read_write() {
    run("oltp_read_write");
}

/// Twenty sysbench threads connect at once to a paused (stopped) serverless instance: all
/// log in, one resume serves them all, and the run has no errors.
#[test]
fn twenty_threads_connect_at_once_to_a_paused_instance() {
    holdfast_it::require("sysbench").expect("sysbench");
    let h = Harness::start_with(holdfast_it::Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
    }));
    sysbench(&h, "oltp_read_only", "prepare", &[]);
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    let out = sysbench(
        &h,
        "oltp_read_only",
        "run",
        &["--threads=20", "--time=5", "--report-interval=0"],
    );
    let transactions = number(&out, "transactions:");
    let ignored = number(&out, "ignored errors:");
    assert!(transactions > 0.0, "{out}");
    assert_eq!(ignored, 0.0, "{out}");
    assert!(
        out.contains("threads: 20") || out.contains("Number of threads: 20"),
        "{out}"
    );
    let v = h.status_json()["serverless"].clone();
    assert_eq!(
        v["resumes"].as_u64(),
        Some(1),
        "one resume for twenty threads: {v}"
    );
}
