//! The proxy-upgrade scenario of `holdfast-bench drill`: holdfast itself replaced twice
//! under load. It serves from a copy of its binary in the lab directory; a third of the way
//! in and two thirds of the way in, the copy is replaced (as a package upgrade would) and
//! `POST /upgrade` starts it. sysbench runs through the main listener (oltp_read_write) and
//! the split listener (oltp_point_select), prepared statements on; beside them a client
//! opens a new connection after another on both listeners. Reported: sysbench's errors,
//! reconnects and longest stall, the new connections refused or failed, and where the
//! sessions open at each upgrade ended up.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_lab::{wait_for, LabStatus};
use mysql::prelude::Queryable;

use super::common::{self, output_text, value_after, DrillArgs};
use crate::admin;
use crate::serve::{self, proxy_port, split_port, Helper};

/// Runs the scenario on a lab in `args.dir` (started unless one runs).
pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let lab = super::ha::lab(args)?;
    // Served from a copy: the file is replaced before each upgrade.
    let bin = args.dir.join("upgrade-bin");
    std::fs::create_dir_all(&bin)?;
    let exe = bin.join("holdfast");
    replace_binary(holdfast, &exe)?;
    let log = args.dir.join("holdfast-upgrade-drill.log");
    let (first, _) = serve::start_holdfast(&exe, &lab, &lab.config, &log, &[])?;
    let admin = admin::client(&lab);
    wait_for("holdfast to see a primary", Duration::from_secs(10), || {
        admin::status(&admin).ok()?.topology.primary
    })?;
    println!(
        "preparing sysbench: {} tables x {} rows",
        args.tables, args.table_size
    );
    common::prepare(&common::sysbench(&lab, args), lab.primary()?.port)?;
    let (main, split) = (proxy_port(&lab)?, split_port(&lab)?);
    println!(
        "== proxy-upgrade: sysbench oltp_read_write ({} threads, main listener) and oltp_point_select ({} threads, split listener), prepared statements, {} s; upgrades at {} s and {} s",
        args.threads / 2,
        args.threads - args.threads / 2,
        args.seconds,
        args.seconds / 3,
        2 * args.seconds / 3
    );
    let sysbench = |test: &str, port: u16, threads: u32| -> Result<std::process::Child> {
        let options = common::run_options(threads, args.seconds);
        let cmd = common::sysbench(&lab, args).command(test, port, &options, "run");
        common::start_sysbench(&cmd)
    };
    let writes = sysbench("oltp_read_write", main, args.threads / 2)?;
    let points = sysbench("oltp_point_select", split, args.threads - args.threads / 2)?;
    let connector = Connector::start(&lab, [main, split]);
    let pingers = [Pinger::start(&lab, main)?, Pinger::start(&lab, split)?];
    let start = Instant::now();
    let mut helpers: Vec<Helper> = Vec::new();
    let mut events = Vec::new();
    for k in 1..=2u64 {
        let at = Duration::from_secs(args.seconds * k / 3);
        std::thread::sleep(at.saturating_sub(start.elapsed()));
        replace_binary(holdfast, &exe)?;
        let t = Instant::now();
        let body = admin::post(&admin, "/upgrade")?;
        let took = t.elapsed().as_millis();
        let report: serde_json::Value =
            serde_json::from_str(&body).context("unexpected /upgrade body")?;
        let pid = report["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .context("no pid in the /upgrade answer")?;
        helpers.push(Helper::register(&lab.dir, "holdfast", pid)?);
        let event = format!(
            "upgrade {k}: process {pid} (generation {}) serves after {took} ms; {} connections open on the old process then",
            report["generation"], report["sessions_left"]
        );
        println!("   {event}");
        events.push(event);
    }
    let writes = writes.wait_with_output()?;
    let points = points.wait_with_output()?;
    let (made, failed, errors) = connector.finish();
    let pinged: Vec<(u64, Duration, Option<String>)> =
        pingers.into_iter().map(Pinger::finish).collect();
    let last = admin::status(&admin)?;
    println!();
    println!("listener   test               threads   transactions   errors (ignored/fatal)   reconnects   max latency   longest stall");
    for (name, test, threads, out) in [
        ("main", "oltp_read_write", args.threads / 2, &writes),
        (
            "split",
            "oltp_point_select",
            args.threads - args.threads / 2,
            &points,
        ),
    ] {
        let text = output_text(out);
        std::fs::write(
            args.dir.join(format!("drill-proxy-upgrade-{name}.log")),
            &text,
        )?;
        let fatal = !out.status.success() || text.contains("FATAL");
        println!(
            "{name:<10} {test:<18} {threads:>7}   {:>12}   {:>6} / {:<14} {:>10}   {:>8.0} ms   {} s without a transaction",
            value_after::<u64>(&text, "transactions:"),
            value_after::<u64>(&text, "ignored errors:"),
            if fatal { "FATAL" } else { "0" },
            value_after::<u64>(&text, "reconnects:"),
            value_after::<f64>(&text, "max:"),
            super::ha::longest_gap(&text),
        );
    }
    println!(
        "new connections beside them: {made} made, {failed} failed{}",
        match errors.first() {
            Some(e) => format!(" (first: {e})"),
            None => String::new(),
        }
    );
    for ((name, _), (statements, longest, error)) in
        [("main", main), ("split", split)].iter().zip(&pinged)
    {
        println!(
            "a session open throughout ({name} listener, `SELECT 1` every 5 ms): {statements} statements, longest {:.1} ms{}",
            longest.as_secs_f64() * 1000.0,
            match error {
                Some(e) => format!(", failed: {e}"),
                None => String::new(),
            }
        );
    }
    for e in &events {
        println!("{e}");
    }
    // What became of the sessions open at each upgrade, as the processes logged it.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let handed = text
        .matches("session handed over from the previous process")
        .count();
    let restored = text.matches("reason=\"upgrade\"").count();
    let mut stayed: std::collections::BTreeMap<&str, usize> = Default::default();
    for line in text
        .lines()
        .filter(|l| l.contains("the session stays in this process for now"))
    {
        let why = line
            .split("why=")
            .nth(1)
            .and_then(|w| w.split('"').nth(1))
            .unwrap_or("?");
        *stayed.entry(why).or_default() += 1;
    }
    println!(
        "serving now: process {} generation {}; sessions handed over: {handed} ({restored} of them logged in again and restored: their backend's TLS state could not be taken); staying on the old process when asked: {stayed:?} (a session in a transaction goes when it ends; the others end there)",
        last.pid, last.generation
    );
    println!("holdfast log: {}", log.display());
    drop(helpers);
    drop(first);
    if !args.keep {
        holdfast_lab::down(&args.dir)?;
    }
    if failed > 0 {
        bail!("{failed} new connections failed during the upgrades");
    }
    if let Some(e) = pinged.iter().find_map(|p| p.2.as_ref()) {
        bail!("a session open throughout failed: {e}");
    }
    Ok(())
}

/// One session open throughout, a `SELECT 1` every 5 ms: the longest any statement took
/// (the stall a session sees while it is handed over).
struct Pinger {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Duration, Option<String>)>,
}

impl Pinger {
    fn start(lab: &LabStatus, port: u16) -> Result<Pinger> {
        let opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(port)
            .user(Some(lab.app_user.clone()))
            .pass(Some(lab.app_password.clone()))
            .prefer_socket(false);
        let mut conn = mysql::Conn::new(opts).context("a session for the pinger")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut statements, mut longest) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match conn.query_first::<u32, _>("SELECT 1") {
                        Ok(Some(1)) => {}
                        other => return (statements, longest, Some(format!("{other:?}"))),
                    }
                    longest = longest.max(t.elapsed());
                    statements += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                (statements, longest, None)
            })
        };
        Ok(Pinger { stop, thread })
    }

    fn finish(self) -> (u64, Duration, Option<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or((0, Duration::ZERO, Some("the pinger panicked".into())))
    }
}

/// Puts a copy of `from` at `to` the way a package manager does: a new file renamed over
/// the old one (a running process keeps its own).
fn replace_binary(from: &Path, to: &Path) -> Result<()> {
    let next = to.with_extension("next");
    std::fs::copy(from, &next).with_context(|| format!("copying {}", from.display()))?;
    std::fs::rename(&next, to).with_context(|| format!("replacing {}", to.display()))?;
    Ok(())
}

/// Opens a new connection after another on each port (one statement each), counting those
/// that fail.
struct Connector {
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Connector {
    fn start(lab: &LabStatus, ports: [u16; 2]) -> Connector {
        let stop = Arc::new(AtomicBool::new(false));
        let made = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (user, password) = (lab.app_user.clone(), lab.app_password.clone());
        let thread = {
            let (stop, made, failed, errors) =
                (stop.clone(), made.clone(), failed.clone(), errors.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for port in ports {
                        let opts = mysql::OptsBuilder::new()
                            .ip_or_hostname(Some("127.0.0.1"))
                            .tcp_port(port)
                            .user(Some(user.clone()))
                            .pass(Some(password.clone()))
                            .prefer_socket(false);
                        let result = mysql::Conn::new(opts)
                            .and_then(|mut c| c.query_first::<u32, _>("SELECT 1"));
                        match result {
                            Ok(Some(1)) => {
                                made.fetch_add(1, Ordering::Relaxed);
                            }
                            other => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                if let Ok(mut e) = errors.lock() {
                                    e.push(format!("port {port}: {other:?}"));
                                }
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Connector {
            stop,
            made,
            failed,
            errors,
            thread,
        }
    }

    fn finish(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let errors = self.errors.lock().map(|e| e.clone()).unwrap_or_default();
        (
            self.made.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            errors,
        )
    }
}
