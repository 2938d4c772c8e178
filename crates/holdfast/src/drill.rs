//! `holdfast drill`: sysbench oltp_read_write through holdfast on a lab cluster while the
//! database goes through a maintenance event mid-run, then PolarDB's table: scenario,
//! connections kept, errors seen by sysbench, longest stall.

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Scenario {
    /// Planned switchover to a replica (holdfast's HA manager, over the admin API).
    Switchover,
    /// The primary is killed (kill -9); holdfast fails over to the most advanced replica.
    Failover,
    /// Planned restart of the primary with a server binary (a minor-version upgrade) through
    /// `POST /restart`: sessions move to a replica and back.
    Restart,
    /// Planned restart of the primary with another buffer pool size through `POST /resize`.
    Resize,
    /// A serverless instance (its own lab) that pauses whenever idle, frozen then stopped,
    /// with a pool of idle connections open throughout and sysbench connecting to it while
    /// it is paused.
    Serverless,
    /// Every scenario above, one after the other.
    All,
}

#[derive(clap::Args)]
pub struct DrillArgs {
    /// Lab directory; a lab with two replicas is started there if none runs.
    #[arg(long, default_value = "/tmp/holdfast-drill")]
    pub dir: PathBuf,
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    pub scenario: Scenario,
    /// Seconds of sysbench per scenario; the event happens a third of the way in.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    #[arg(long, default_value_t = 20)]
    pub threads: u32,
    #[arg(long, default_value_t = 20)]
    pub tables: u32,
    #[arg(long, default_value_t = 10_000)]
    pub table_size: u32,
    /// Leave the lab running afterwards.
    #[arg(long)]
    pub keep: bool,
}

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
}

/// A `holdfast serve` subprocess, killed when dropped (unless taken with [`Serve::keep`]).
pub(crate) struct Serve(Option<std::process::Child>);

impl Serve {
    /// Starts `holdfast serve --config CONFIG` (this executable) with its log in `log`, and
    /// waits until it accepts connections on `proxy`.
    pub(crate) fn start(
        config: &std::path::Path,
        log: &std::path::Path,
        proxy: &str,
    ) -> Result<Serve> {
        let child = Command::new(std::env::current_exe()?)
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("cannot start holdfast serve")?;
        let serve = Serve(Some(child));
        wait_for(
            "holdfast to accept connections",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(proxy).ok(),
        )?;
        Ok(serve)
    }

    /// Leaves the process running; returns its pid.
    pub(crate) fn keep(mut self) -> Option<u32> {
        self.0.take().map(|c| c.id())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn admin_post(admin: &str, path: &str) -> Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (code, body) = rt.block_on(holdfast_admin::http_post(admin, path, None))?;
    if !(200..300).contains(&code) {
        bail!("POST {path} answered HTTP {code}: {body}");
    }
    Ok(body)
}

fn admin_status(admin: &str) -> Result<holdfast_admin::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (code, body) = rt.block_on(holdfast_admin::http_get(admin, "/status"))?;
    if code != 200 {
        bail!("GET /status answered HTTP {code}");
    }
    Ok(serde_json::from_str(&body)?)
}

pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn closed_sessions(admin: &str) -> f64 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return 0.0,
    };
    let Ok((_, text)) = rt.block_on(holdfast_admin::http_get(admin, "/metrics")) else {
        return 0.0;
    };
    text.lines()
        .filter(|l| l.starts_with("holdfast_sessions_closed_by_holdfast_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub(crate) fn sysbench_args(
    lab: &holdfast_lab::LabStatus,
    args: &DrillArgs,
    host_port: &str,
    cmd: &str,
) -> Vec<String> {
    let (host, port) = host_port.rsplit_once(':').unwrap_or(("127.0.0.1", "3306"));
    vec![
        "oltp_read_write".into(),
        format!("--mysql-host={host}"),
        format!("--mysql-port={port}"),
        format!("--mysql-user={}", lab.app_user),
        format!("--mysql-password={}", lab.app_password),
        format!("--mysql-db={}", lab.database),
        format!("--tables={}", args.tables),
        format!("--table-size={}", args.table_size),
        cmd.into(),
    ]
}

pub fn run(args: &DrillArgs) -> Result<()> {
    if args.scenario == Scenario::Serverless {
        return crate::drill_serverless::run(args);
    }
    let lab = match holdfast_lab::status(&args.dir) {
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
    };
    let _serve = Serve::start(
        &lab.config,
        &args.dir.join("holdfast-drill.log"),
        &lab.proxy,
    )?;
    wait_for("holdfast to see a primary", Duration::from_secs(10), || {
        admin_status(&lab.admin).ok()?.topology.primary
    })?;
    let primary = lab.primary()?.address.clone();
    println!(
        "preparing sysbench: {} tables x {} rows",
        args.tables, args.table_size
    );
    let _ = Command::new("sysbench")
        .args(sysbench_args(&lab, args, &primary, "cleanup"))
        .output();
    let prep = Command::new("sysbench")
        .args(sysbench_args(&lab, args, &primary, "prepare"))
        .output()
        .context("cannot run sysbench (apt-get install sysbench)")?;
    if !prep.status.success() {
        bail!(
            "sysbench prepare failed: {}",
            String::from_utf8_lossy(&prep.stderr)
        );
    }
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => vec![
            Scenario::Switchover,
            Scenario::Restart,
            Scenario::Resize,
            Scenario::Failover,
        ],
        s => vec![s],
    };
    let mut rows = Vec::new();
    for s in scenarios {
        rows.push(run_scenario(&lab, args, s)?);
    }
    println!();
    println!("scenario     connections kept   sysbench errors (ignored/fatal)   reconnects   transactions   longest stall   event");
    for r in &rows {
        let pct = 100.0 * f64::from(r.kept) / f64::from(r.threads.max(1));
        let stall = format!(
            "{:.0} ms max latency, {} s without a transaction",
            r.max_latency_ms, r.longest_gap_s
        );
        println!(
            "{:<12} {:>3}/{:<3} ({:>5.1}%)   {:>6} / {:<24} {:>10}   {:>12}   {:<40}  {}",
            r.scenario,
            r.kept,
            r.threads,
            pct,
            r.ignored_errors,
            if r.fatal { "FATAL" } else { "0" },
            r.reconnects,
            r.transactions,
            stall,
            r.event
        );
    }
    println!(
        "holdfast log: {}",
        args.dir.join("holdfast-drill.log").display()
    );
    if !args.keep {
        drop(_serve);
        holdfast_lab::down(&args.dir)?;
    }
    if args.scenario == Scenario::All {
        println!();
        crate::drill_serverless::run(args)?;
    }
    Ok(())
}

fn run_scenario(
    lab: &holdfast_lab::LabStatus,
    args: &DrillArgs,
    scenario: Scenario,
) -> Result<Row> {
    let name = match scenario {
        Scenario::Switchover => "switchover",
        Scenario::Failover => "failover",
        Scenario::Restart => "restart",
        Scenario::Resize => "resize",
        Scenario::Serverless => "serverless",
        Scenario::All => "all",
    };
    println!(
        "== {name}: sysbench oltp_read_write, {} threads, {} s, event at {} s",
        args.threads,
        args.seconds,
        args.seconds / 3
    );
    let closed_before = closed_sessions(&lab.admin);
    let mut sb = sysbench_args(lab, args, &lab.proxy, "run");
    sb.extend([
        format!("--threads={}", args.threads),
        format!("--time={}", args.seconds),
        "--db-ps-mode=auto".into(),
        "--report-interval=1".into(),
    ]);
    let child = Command::new("sysbench")
        .args(&sb)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run sysbench")?;
    std::thread::sleep(Duration::from_secs(args.seconds / 3));
    let event = perform(lab, scenario)?;
    println!("   {event}");
    let out = child.wait_with_output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    std::fs::write(args.dir.join(format!("drill-{name}.log")), &text)?;
    let closed = (closed_sessions(&lab.admin) - closed_before).max(0.0) as u32;
    let fatal = !out.status.success() || text.contains("FATAL");
    if scenario == Scenario::Failover {
        // Bring the killed node back as a replica for the next drill.
        if let Some(dead) = event.split_whitespace().nth(1) {
            let _ = holdfast_lab::start_node(&lab.dir, dead);
            let _ = admin_post(&lab.admin, &format!("/rejoin?node={dead}"));
        }
    }
    Ok(Row {
        scenario: name,
        threads: args.threads,
        kept: if fatal {
            0
        } else {
            args.threads.saturating_sub(closed)
        },
        fatal,
        transactions: number_after(&text, "transactions:"),
        ignored_errors: number_after(&text, "ignored errors:"),
        reconnects: number_after(&text, "reconnects:"),
        max_latency_ms: float_after(&text, "max:"),
        longest_gap_s: longest_gap(&text),
        event,
    })
}

fn perform(lab: &holdfast_lab::LabStatus, scenario: Scenario) -> Result<String> {
    let status = admin_status(&lab.admin)?;
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
            admin_post(&lab.admin, &format!("/switchover?to={target}"))?;
            Ok(format!(
                "switchover {primary} -> {target} took {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Failover => {
            holdfast_lab::kill_node(&lab.dir, &primary)?;
            let new = wait_for("a new primary", Duration::from_secs(30), || {
                admin_status(&lab.admin)
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
                        .find(|p| std::path::Path::new(p).exists())
                        .map(String::from)
                })
                .context("no mariadbd binary for the upgrade")?;
            admin_post(
                &lab.admin,
                &format!("/restart?node={primary}&binary={binary}"),
            )?;
            Ok(format!(
                "upgraded {primary} (restart with {binary}) and back in {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Resize => {
            admin_post(
                &lab.admin,
                &format!("/resize?node={primary}&set=innodb_buffer_pool_size=192M"),
            )?;
            Ok(format!(
                "resized {primary} (innodb_buffer_pool_size=192M) and back in {} ms",
                t.elapsed().as_millis()
            ))
        }
        Scenario::Serverless | Scenario::All => Ok(String::new()),
    }
}

pub(crate) fn number_after(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn float_after(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

/// The longest run of per-second reports with zero transactions per second.
fn longest_gap(text: &str) -> u64 {
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
