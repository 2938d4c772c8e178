//! The HA scenarios of `holdfast-bench drill`: sysbench oltp_read_write through holdfast on
//! a lab cluster while the primary is switched over, restarted, resized or killed mid-run,
//! then PolarDB's table: scenario, connections kept, errors seen by sysbench, longest stall.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use holdfast_lab::{wait_for, LabStatus};

use super::ack::{AckReport, Writers};
use super::common::{self, output_text, value_after, DrillArgs, Scenario};
use crate::admin;
use crate::serve::{self, proxy_port, split_port};

/// The HA scenarios in the order `--scenario all` runs them (the failover last: it kills
/// a node).
pub const SCENARIOS: [Scenario; 6] = [
    Scenario::Switchover,
    Scenario::Restart,
    Scenario::Resize,
    Scenario::Failover,
    Scenario::AddNode,
    Scenario::RemoveNode,
];

/// The drain window of the remove-node scenario.
const REMOVE_DRAIN_MS: u64 = 10_000;

/// How long holdfast may take to see a primary, or a new one after a kill.
const PRIMARY_TIMEOUT: Duration = Duration::from_secs(10);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

struct Row {
    scenario: &'static str,
    threads: u32,
    kept: u32,
    fatal: bool,
    transactions: u64,
    ignored_errors: u64,
    reconnects: u64,
    max_latency_ms: f64,
    longest_gap_s: u64,
    event: String,
    ack: AckReport,
    /// Transactions replayed and lost COMMITs resolved by holdfast, by outcome.
    recovered: String,
    /// The readers beside sysbench in the node scenarios (reads outside transactions,
    /// which the split listener sends to the replicas).
    readers: Option<Readers>,
    /// sysbench's seconds (second, tps, p95 ms), and when the event began and ended, in
    /// seconds since sysbench started: for the report's chart.
    intervals: Vec<(f64, f64, f64)>,
    event_span: (f64, f64),
}

/// What the readers of a node scenario did.
struct Readers {
    transactions: u64,
    errors: u64,
    fatal: bool,
}

/// Threads of the read-only sysbench beside the main one in the node scenarios.
const READER_THREADS: u32 = 8;

/// Runs `scenarios` one after the other on a lab in `args.dir` (started unless one runs).
pub fn run(args: &DrillArgs, holdfast: &Path, scenarios: &[Scenario]) -> Result<()> {
    let lab = lab(args)?;
    let log = args.dir.join("holdfast-drill.log");
    // The upgrade scenario restarts into HOLDFAST_DRILL_BINARY: it must be in [driver]
    // binaries (the lab's config lists the lab's own binary).
    let config = match std::env::var_os("HOLDFAST_DRILL_BINARY") {
        Some(binary) => serve::config_variant(
            &lab,
            "holdfast-drill.toml",
            "HOLDFAST_DRILL_BINARY added to [driver] binaries",
            |c| {
                c.driver.binaries.push(binary.into());
                Ok(())
            },
        )?,
        None => lab.config.clone(),
    };
    let (server, _) = serve::start_holdfast(holdfast, &lab, &config, &log, &[])?;
    wait_for("holdfast to see a primary", PRIMARY_TIMEOUT, || {
        admin::status(&admin::client(&lab)).ok()?.topology.primary
    })?;
    println!(
        "preparing sysbench: {} tables x {} rows",
        args.tables, args.table_size
    );
    common::prepare(&common::sysbench(&lab, args), lab.primary()?.port)?;
    let mut rows = Vec::new();
    for &s in scenarios {
        rows.push(run_scenario(&lab, args, s)?);
    }
    println!();
    println!("scenario     connections kept   sysbench errors (ignored/fatal)   reconnects   transactions   acknowledged writes (lost / twice / errors)   longest stall   event");
    for r in &rows {
        let pct = 100.0 * f64::from(r.kept) / f64::from(r.threads.max(1));
        let stall = format!(
            "{:.0} ms max latency, {} s without a transaction",
            r.max_latency_ms, r.longest_gap_s
        );
        let ack = format!(
            "{} ({} / {} / {})",
            r.ack.acknowledged,
            r.ack.lost,
            r.ack.duplicated,
            r.ack.error_count()
        );
        println!(
            "{:<12} {:>3}/{:<3} ({:>5.1}%)   {:>6} / {:<24} {:>10}   {:>12}   {:<43}   {:<40}  {}",
            r.scenario,
            r.kept,
            r.threads,
            pct,
            r.ignored_errors,
            if r.fatal { "FATAL" } else { "0" },
            r.reconnects,
            r.transactions,
            ack,
            stall,
            r.event
        );
        println!("   {}: holdfast recovered: {}", r.scenario, r.recovered);
        if let Some(rd) = &r.readers {
            println!(
                "   {}: beside it {READER_THREADS} readers (oltp_read_only outside transactions, to the replicas): {} transactions, {} errors{}",
                r.scenario,
                rd.transactions,
                rd.errors,
                if rd.fatal { ", FATAL" } else { "" }
            );
        }
        if !r.ack.errors.is_empty() {
            println!(
                "   {}: the writers' errors by code: {:?}",
                r.scenario, r.ack.errors
            );
        }
    }
    println!(
        "ignored: sysbench's own list (1213: a deadlock, or a transaction lost with its node \
         whose replay read rows another transaction had changed meanwhile; 1205 lock wait \
         timeout; 1020) and 1180 (a COMMIT whose outcome holdfast could not tell); acknowledged writes: {} writers beside \
         sysbench insert numbered rows (autocommit and in transactions); every one acknowledged \
         is looked for on the primary afterwards",
        super::ack::WRITERS
    );
    println!("holdfast log: {}", log.display());
    let report = args.dir.join("drill-report.html");
    match write_report(&report, args, &rows) {
        Ok(()) => println!("report with charts: {}", report.display()),
        Err(e) => println!("no report with charts: {e:#}"),
    }
    drop(server);
    if !args.keep {
        holdfast_lab::down(&args.dir)?;
    }
    Ok(())
}

/// The lab in `args.dir`, started (1 primary, 2 replicas) unless one runs there.
pub(super) fn lab(args: &DrillArgs) -> Result<LabStatus> {
    Ok(match holdfast_lab::status(&args.dir) {
        Ok(st) if st.nodes.iter().all(|n| n.alive) && st.nodes.len() >= 3 => st,
        _ => {
            println!(
                "starting a lab (1 primary, 2 replicas) in {}",
                args.dir.display()
            );
            let _ = holdfast_lab::down(&args.dir);
            let _ = holdfast_lab::purge(&args.dir);
            let mut opts = holdfast_lab::LabOptions::new(&args.dir, 2);
            opts.base_port = Some(holdfast_lab::DEFAULT_BASE_PORT + 100);
            holdfast_lab::up(&opts)?
        }
    })
}

/// holdfast's counters of replays and lost COMMITs, by outcome (`replays: replayed=3 ...`).
pub(super) fn recovery_counters(admin_addr: &holdfast_admin::AdminClient) -> Vec<(String, f64)> {
    let Ok(text) = admin::get(admin_addr, "/metrics") else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| {
            l.starts_with("holdfast_transaction_replays_total")
                || l.starts_with("holdfast_lost_commit_outcomes_total")
        })
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let kind = match name.starts_with("holdfast_transaction_replays") {
                true => "replay",
                false => "lost COMMIT",
            };
            let reason = name.split('"').nth(1)?;
            Some((format!("{kind} {reason}"), value.parse().ok()?))
        })
        .collect()
}

/// What changed between two readings of [`recovery_counters`], as `name n, ...`.
fn recovery_delta(before: &[(String, f64)], after: &[(String, f64)]) -> String {
    let parts: Vec<String> = after
        .iter()
        .filter_map(|(name, v)| {
            let was = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, v)| *v);
            (v - was > 0.0).then(|| format!("{name} {}", v - was))
        })
        .collect();
    match parts.is_empty() {
        true => "none".into(),
        false => parts.join(", "),
    }
}

pub(super) fn closed_sessions(admin_addr: &holdfast_admin::AdminClient) -> f64 {
    let Ok(text) = admin::get(admin_addr, "/metrics") else {
        return 0.0;
    };
    text.lines()
        .filter(|l| l.starts_with("holdfast_sessions_closed_by_holdfast_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The drill as pictures: per scenario, sysbench's transactions per second and its 95th
/// percentile latency per second, the event marked and the seconds below half the run's
/// median throughput shaded (the stall); each throughput chart also as
/// `drill-<scenario>.svg`.
fn write_report(path: &Path, args: &DrillArgs, rows: &[Row]) -> Result<()> {
    use crate::chart::{self, Marks, Series};
    let mut sections = Vec::new();
    for r in rows {
        let marks = Marks {
            events: vec![(r.event_span.0, r.scenario.to_string())],
            shaded: chart::slow_seconds(&r.intervals),
        };
        let x_max = args.seconds as f64;
        // One chart a figure of sysbench's seconds: (what, unit, the figure).
        let per_second = |what: &str, unit: &str, figure: fn(&(f64, f64, f64)) -> f64| {
            chart::time_chart(
                &format!("{}: {what} per second", r.scenario),
                "seconds",
                unit,
                x_max,
                &[Series {
                    name: unit.into(),
                    points: r.intervals.iter().map(|i| (i.0, figure(i))).collect(),
                }],
                &marks,
            )
        };
        let throughput = per_second("transactions", "tps", |i| i.1);
        let latency = per_second("95th percentile latency", "p95 ms", |i| i.2);
        std::fs::write(
            path.with_file_name(format!("drill-{}.svg", r.scenario)),
            &throughput,
        )?;
        let summary = format!(
            "<p>{} of {} connections kept; {} transactions; {} errors ignored{}; max latency {:.0} ms, {} s without a transaction; the event ({:.1} s to {:.1} s): {}</p>",
            r.kept,
            r.threads,
            r.transactions,
            r.ignored_errors,
            if r.fatal { ", FATAL" } else { "" },
            r.max_latency_ms,
            r.longest_gap_s,
            r.event_span.0,
            r.event_span.1,
            chart::escape(&r.event)
        );
        sections.push((
            r.scenario.to_string(),
            format!("{summary}\n{throughput}\n{latency}"),
        ));
    }
    let context = vec![
        format!(
            "sysbench oltp_read_write through holdfast, {} threads, {} s per scenario, the event a third of the way in",
            args.threads, args.seconds
        ),
        "dashed line: the event; shaded: seconds below half the run's median throughput".into(),
    ];
    std::fs::write(path, chart::page("holdfast drill", &context, &sections))?;
    Ok(())
}

fn run_scenario(lab: &LabStatus, args: &DrillArgs, scenario: Scenario) -> Result<Row> {
    let admin = admin::client(lab);
    let name = scenario.name();
    println!(
        "== {name}: sysbench oltp_read_write, {} threads, {} s, event at {} s",
        args.threads,
        args.seconds,
        args.seconds / 3
    );
    let closed_before = closed_sessions(&admin);
    let recovered_before = recovery_counters(&admin);
    // sysbench's own list (deadlocks, retried), plus 1180 (with commit markers, only
    // when the marker cannot be read): the count is in the "ignored" column; the
    // connection stays.
    let options = common::run_options(args.threads, args.seconds);
    // Nodes come and go under the split listener, where reads reach them.
    let port = match scenario {
        Scenario::AddNode | Scenario::RemoveNode => split_port(lab)?,
        _ => proxy_port(lab)?,
    };
    let sb = common::sysbench(lab, args).command("oltp_read_write", port, &options, "run");
    let writers = Writers::start(lab, &format!("127.0.0.1:{port}"))?;
    let child = crate::progress::Watched::new(common::start_sysbench(&sb)?, name, args.seconds);
    let readers = match scenario {
        Scenario::AddNode | Scenario::RemoveNode => {
            let options = [
                format!("--threads={READER_THREADS}"),
                format!("--time={}", args.seconds),
                "--db-ps-mode=auto".into(),
                "--skip_trx=on".into(),
                "--report-interval=1".into(),
            ];
            let cmd = common::sysbench(lab, args).command("oltp_read_only", port, &options, "run");
            Some(common::start_sysbench(&cmd)?)
        }
        _ => None,
    };
    let started = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(args.seconds / 3));
    let event_began = started.elapsed().as_secs_f64();
    let event = perform(lab, scenario)?;
    let event_span = (event_began, started.elapsed().as_secs_f64());
    println!("   {event}");
    let out = child.wait()?;
    let readers = match readers {
        Some(r) => {
            let out = r.wait_with_output()?;
            let text = output_text(&out);
            std::fs::write(args.dir.join(format!("drill-{name}-readers.log")), &text)?;
            Some(Readers {
                transactions: value_after(&text, "transactions:"),
                errors: value_after(&text, "ignored errors:"),
                fatal: !out.status.success() || text.contains("FATAL"),
            })
        }
        None => None,
    };
    let ack = writers.finish()?;
    let text = output_text(&out);
    std::fs::write(args.dir.join(format!("drill-{name}.log")), &text)?;
    let closed = (closed_sessions(&admin) - closed_before).max(0.0) as u32;
    let recovered = recovery_delta(&recovered_before, &recovery_counters(&admin));
    let fatal = !out.status.success()
        || text.contains("FATAL")
        || readers.as_ref().is_some_and(|r| r.fatal);
    if scenario == Scenario::Failover {
        // Bring the killed node back as a replica for the next drill.
        if let Some(dead) = event.split_whitespace().nth(1) {
            let _ = holdfast_lab::start_node(&lab.dir, dead);
            let _ = admin::post(&admin, &format!("/rejoin?node={dead}"));
        }
    }
    // The readers' connections count as well.
    let threads = args.threads + if readers.is_some() { READER_THREADS } else { 0 };
    Ok(Row {
        scenario: name,
        threads,
        kept: if fatal {
            0
        } else {
            threads.saturating_sub(closed)
        },
        fatal,
        transactions: value_after(&text, "transactions:"),
        ignored_errors: value_after(&text, "ignored errors:"),
        reconnects: value_after(&text, "reconnects:"),
        max_latency_ms: value_after(&text, "max:"),
        longest_gap_s: longest_gap(&text),
        intervals: crate::chart::sysbench_intervals(&text),
        event_span,
        event,
        ack,
        recovered,
        readers,
    })
}

fn perform(lab: &LabStatus, scenario: Scenario) -> Result<String> {
    let admin = admin::client(lab);
    let status = admin::status(&admin)?;
    let primary = status
        .topology
        .primary
        .clone()
        .context("no primary before the event")?;
    let t = Instant::now();
    match scenario {
        Scenario::Switchover => {
            let target = status
                .topology
                .nodes
                .iter()
                .find(|n| n.name != primary && n.reachable)
                .map(|n| n.name.clone())
                .context("no replica to switch over to")?;
            admin::post(&admin, &format!("/switchover?to={target}"))?;
            Ok(format!(
                "switchover {primary} -> {target} took {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Failover => {
            holdfast_lab::kill_node(&lab.dir, &primary)?;
            let new = wait_for("a new primary", FAILOVER_TIMEOUT, || {
                admin::status(&admin)
                    .ok()?
                    .topology
                    .primary
                    .filter(|p| *p != primary)
            })?;
            Ok(format!(
                "killed {primary} (kill -9); {new} primary after {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Restart => {
            let binary = std::env::var("HOLDFAST_DRILL_BINARY")
                .ok()
                .or_else(|| {
                    ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]
                        .into_iter()
                        .find(|p| Path::new(p).exists())
                        .map(String::from)
                })
                .context("no mariadbd binary for the upgrade")?;
            admin::post(&admin, &format!("/restart?node={primary}&binary={binary}"))?;
            Ok(format!(
                "upgraded {primary} (restart with {binary}) and back in {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Resize => {
            admin::post(
                &admin,
                &format!("/resize?node={primary}&set=innodb_buffer_pool_size=192M"),
            )?;
            Ok(format!(
                "resized {primary} (innodb_buffer_pool_size=192M) and back in {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::AddNode => {
            let node = holdfast_lab::add_replica(&lab.dir, None)?;
            let made = t.elapsed().as_millis();
            admin::post(
                &admin,
                &format!("/nodes/add?name={}&address={}", node.name, node.address),
            )?;
            Ok(format!(
                "made {} (seeded from {primary}) in {made} ms, added to holdfast in {} ms",
                node.name,
                t.elapsed().as_millis() - made
            ))
        }
        Scenario::RemoveNode => {
            let st = holdfast_lab::status(&lab.dir)?;
            let victim = st
                .nodes
                .iter()
                .rev()
                .find(|n| n.name != primary && !lab.nodes.iter().any(|o| o.name == n.name))
                .or_else(|| st.nodes.iter().rev().find(|n| n.name != primary))
                .map(|n| n.name.clone())
                .context("no replica to remove")?;
            let body = admin::post(
                &admin,
                &format!("/nodes/remove?name={victim}&drain_ms={REMOVE_DRAIN_MS}"),
            )?;
            holdfast_lab::remove_node(&lab.dir, &victim)?;
            Ok(format!(
                "removed {victim} in {} ms (drain {REMOVE_DRAIN_MS} ms): {body}",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Serverless
        | Scenario::All
        | Scenario::FailoverTimes
        | Scenario::Chaos
        | Scenario::ProxyUpgrade
        | Scenario::Fleet
        | Scenario::FleetServerless => Ok(String::new()),
    }
}

/// The longest run of per-second reports with zero transactions per second.
pub(super) fn longest_gap(text: &str) -> u64 {
    let mut longest = 0;
    let mut run = 0;
    for l in text
        .lines()
        .filter(|l| l.starts_with('[') && l.contains(" tps: "))
    {
        let tps = l
            .split(" tps: ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        if tps == 0.0 {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_counters_are_shown_as_what_changed() {
        let before = vec![("replay replayed".to_string(), 2.0)];
        let after = vec![
            ("replay replayed".to_string(), 5.0),
            ("replay diverged".to_string(), 1.0),
            ("lost COMMIT unknown".to_string(), 0.0),
        ];
        assert_eq!(
            recovery_delta(&before, &after),
            "replay replayed 3, replay diverged 1"
        );
        assert_eq!(recovery_delta(&after, &after), "none");
    }

    #[test]
    fn longest_run_without_transactions() {
        let text = "[ 1s ] thds: 20 tps: 100.00 qps\n[ 2s ] thds: 20 tps: 0.00 qps\n\
                    [ 3s ] thds: 20 tps: 0.00 qps\n[ 4s ] thds: 20 tps: 50.00 qps\n";
        assert_eq!(longest_gap(text), 2);
    }
}
