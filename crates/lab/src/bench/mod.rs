//! `holdfast bench`: sysbench against the primary directly, through HAProxy (TCP mode) and
//! through holdfast (session and pass-through listeners), interleaved over several rounds,
//! plus idle-session memory. `holdfast bench-resume` ([`resume`]) measures serverless
//! resume latency.

mod http;
mod idle;
mod resume;
mod sysbench;

pub use resume::{run_resume_bench, ResumeBenchArgs};

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::lab::{self, AuxProcess, LabOptions, LabStatus};
use crate::procs;
use sysbench::{Metrics, Sysbench};

/// How long holdfast and HAProxy get to start accepting TCP connections.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Which way the benchmark clients reach the primary.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Straight to the primary's port.
    Direct,
    /// Through HAProxy in TCP mode (a plain byte pump: the floor for any proxy).
    Haproxy,
    /// Through `holdfast serve` (its `[proxy] listen`, session mode).
    Holdfast,
    /// Through a `[[listener]]` of the same holdfast with `mode = "passthrough"`: login is
    /// handled by holdfast, then bytes are relayed unparsed.
    #[value(name = "holdfast_passthrough", alias = "holdfast-passthrough")]
    HoldfastPassthrough,
}

impl Target {
    /// Short name for file names and `--targets`.
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Haproxy => "haproxy",
            Target::Holdfast => "holdfast",
            Target::HoldfastPassthrough => "holdfast_passthrough",
        }
    }

    /// Name shown in reports.
    fn label(self) -> &'static str {
        match self {
            Target::HoldfastPassthrough => "holdfast (pass-through)",
            other => other.name(),
        }
    }

    /// Whether this target is a holdfast listener.
    fn is_holdfast(self) -> bool {
        matches!(self, Target::Holdfast | Target::HoldfastPassthrough)
    }
}

/// Options of `holdfast bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Lab directory. A lab is brought up there if none runs (and stopped again at the
    /// end); a running lab is used as it is.
    #[arg(long, default_value = "holdfast-bench")]
    pub dir: PathBuf,
    /// Replicas of a lab the benchmark starts itself (the benchmark only uses the primary).
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// Base port of a lab the benchmark starts itself [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Rounds; each round runs every workload against every target, in a rotated order.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per sysbench run.
    #[arg(long, default_value_t = 20)]
    pub time: u32,
    /// sysbench client threads (= connections).
    #[arg(long, default_value_t = 20)]
    pub threads: u32,
    /// sysbench tables (prepared once, directly on the primary).
    #[arg(long, default_value_t = 20)]
    pub tables: u32,
    /// Rows per sysbench table.
    #[arg(long, default_value_t = 10000)]
    pub table_size: u32,
    /// sysbench workloads, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "oltp_point_select,oltp_read_write"
    )]
    pub workloads: Vec<String>,
    /// Targets to compare, comma-separated: direct, haproxy, holdfast, holdfast_passthrough
    /// (a pass-through `[[listener]]` of the same holdfast process).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,haproxy,holdfast"
    )]
    pub targets: Vec<Target>,
    /// Also write the report as Markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// sysbench --mysql-ignore-errors: `none` makes any SQL error fail the run (reported
    /// as FAILED); `1213,1020,1205` (sysbench's own default) retries deadlocks and lock
    /// timeouts, which small tables provoke under oltp_read_write, and counts them as errors.
    #[arg(long, default_value = "none")]
    pub ignore_errors: String,
    /// Idle logged-in client connections for the per-session memory measurement (0 = skip).
    /// The file-descriptor soft limit is raised to the hard limit as needed (children,
    /// holdfast included, inherit it).
    #[arg(long, default_value_t = 1000)]
    pub idle_clients: usize,
}

/// One sysbench run's outcome.
#[derive(Clone, Debug)]
struct Run {
    round: usize,
    workload: String,
    target: Target,
    result: std::result::Result<Metrics, String>,
}

/// A helper process started by the benchmark; terminated on drop.
struct Helper {
    name: &'static str,
    pid: u32,
    dir: PathBuf,
}

impl Drop for Helper {
    fn drop(&mut self) {
        if let Err(e) = procs::terminate(self.pid, Duration::from_secs(10)) {
            eprintln!("bench: stopping {} (pid {}): {e:#}", self.name, self.pid);
        }
        let _ = lab::unregister_aux(&self.dir, self.pid);
    }
}

/// Stops a lab the benchmark started, on drop.
struct LabGuard(Option<PathBuf>);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            eprintln!("bench: stopping the lab in {}", dir.display());
            if let Err(e) = lab::down(&dir) {
                eprintln!("bench: stopping the lab: {e:#}");
            }
        }
    }
}

/// Runs the benchmark described by `args`; `holdfast_exe` is the binary started as
/// `holdfast_exe serve --config DIR/holdfast.toml`. Blocking; prints progress to stderr
/// and the report to stdout. If holdfast (or HAProxy) cannot be started, that target is
/// reported as unavailable and the others still run.
pub fn run_bench(args: &BenchArgs, holdfast_exe: &Path) -> Result<()> {
    if args.rounds == 0 || args.time == 0 || args.threads == 0 || args.tables == 0 {
        bail!("--rounds, --time, --threads and --tables must be at least 1");
    }
    if args.workloads.is_empty() || args.targets.is_empty() {
        bail!("--workloads and --targets must not be empty");
    }
    let started_at = SystemTime::now();
    let sysbench_exe = procs::require_program(&["sysbench"], "sysbench")?;
    let haproxy_exe = if args.targets.contains(&Target::Haproxy) {
        procs::find_program(&["haproxy"])
    } else {
        None
    };
    // Idle clients, sysbench threads and the proxies' two sockets per client; children
    // (holdfast, HAProxy) inherit the raised limit.
    let want_fds = (args.idle_clients as u64 + u64::from(args.threads)) * 2 + 1024;
    let nofile = procs::raise_nofile(want_fds)?;
    if nofile < want_fds {
        eprintln!(
            "bench: warning: RLIMIT_NOFILE is {nofile} (hard limit), below the {want_fds} \
             wanted for {} idle clients",
            args.idle_clients
        );
    }

    // The lab.
    let mut lab_guard = LabGuard(None);
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    let st = match lab::status(&dir) {
        Ok(st) if st.nodes.first().is_some_and(|n| n.alive) => {
            eprintln!("bench: using the running lab in {}", dir.display());
            st
        }
        _ => {
            eprintln!("bench: starting a lab in {}", dir.display());
            let st = lab::up(&LabOptions {
                base_port: args.base_port,
                ..LabOptions::new(&dir, args.replicas)
            })?;
            lab_guard.0 = Some(dir.clone());
            st
        }
    };
    let primary = st.primary()?.clone();
    let logs = dir.join("bench-logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let sb = Sysbench {
        exe: sysbench_exe.clone(),
        user: st.app_user.clone(),
        password: st.app_password.clone(),
        db: st.database.clone(),
        tables: args.tables,
        table_size: args.table_size,
        ignore_errors: args.ignore_errors.clone(),
    };
    prepare_tables(&sb, &st, &logs)?;

    // Targets.
    let mut ports: Vec<(Target, u16)> = Vec::new();
    let mut unavailable: Vec<(Target, String)> = Vec::new();
    let mut helpers: Vec<Helper> = Vec::new();
    let mut pids: Vec<(Target, u32)> = Vec::new();
    if let Some(pid) = primary.pid {
        pids.push((Target::Direct, pid));
    }
    // One holdfast process serves both holdfast targets.
    let holdfast = if args.targets.iter().any(|t| t.is_holdfast()) {
        let started = if args.targets.contains(&Target::HoldfastPassthrough) {
            procs::free_ports(1).and_then(|p| {
                let config = passthrough_config(&st, p[0])?;
                start_holdfast(
                    holdfast_exe,
                    &st,
                    &config,
                    &st.dir.join("holdfast.log"),
                    &[p[0]],
                )
                .map(|(helper, port)| (helper, port, Some(p[0])))
            })
        } else {
            start_holdfast(
                holdfast_exe,
                &st,
                &st.config,
                &st.dir.join("holdfast.log"),
                &[],
            )
            .map(|(helper, port)| (helper, port, None))
        };
        match started {
            Ok((helper, port, passthrough)) => {
                let pid = helper.pid;
                helpers.push(helper);
                Ok((pid, port, passthrough))
            }
            Err(e) => {
                eprintln!("bench: holdfast unavailable: {e:#}");
                Err(format!("{e:#}"))
            }
        }
    } else {
        Err("not started".to_string())
    };
    for &target in &args.targets {
        match target {
            Target::Direct => ports.push((Target::Direct, primary.port)),
            Target::Haproxy => {
                let started = match haproxy_exe.as_deref() {
                    Some(exe) => start_haproxy(exe, &dir, primary.port),
                    None => Err(anyhow::anyhow!(
                        "haproxy not found on PATH; install haproxy"
                    )),
                };
                match started {
                    Ok((helper, port)) => {
                        pids.push((Target::Haproxy, helper.pid));
                        ports.push((Target::Haproxy, port));
                        helpers.push(helper);
                    }
                    Err(e) => {
                        eprintln!("bench: HAProxy unavailable: {e:#}");
                        unavailable.push((target, format!("{e:#}")));
                    }
                }
            }
            Target::Holdfast | Target::HoldfastPassthrough => match &holdfast {
                Ok((pid, session_port, passthrough_port)) => {
                    let port = if target == Target::Holdfast {
                        Some(*session_port)
                    } else {
                        *passthrough_port
                    };
                    if let Some(port) = port {
                        pids.push((target, *pid));
                        ports.push((target, port));
                    }
                }
                Err(e) => unavailable.push((target, e.clone())),
            },
        }
    }

    // Rounds.
    let mut runs = Vec::new();
    let total = args.rounds * args.workloads.len() * ports.len();
    let mut n = 0;
    for round in 0..args.rounds {
        for workload in &args.workloads {
            for i in 0..ports.len() {
                let (target, port) = ports[(i + round) % ports.len()];
                n += 1;
                let log = logs.join(format!("r{}-{workload}-{}.log", round + 1, target.name()));
                eprint!(
                    "bench: [{n}/{total}] round {} {workload} {:<23} … ",
                    round + 1,
                    target.label()
                );
                let result = sb.run(workload, port, args.threads, args.time, &log)?;
                match &result {
                    Ok(m) => eprintln!(
                        "{:.0} tps, {:.0} qps, avg {:.2} ms, p95 {:.2} ms",
                        m.tps, m.qps, m.lat_avg_ms, m.lat_p95_ms
                    ),
                    Err(e) => eprintln!("FAILED: {e}"),
                }
                runs.push(Run {
                    round: round + 1,
                    workload: workload.clone(),
                    target,
                    result,
                });
            }
        }
    }

    // Idle sessions.
    let mut idle = Vec::new();
    if args.idle_clients > 0 {
        for target in [
            Target::Holdfast,
            Target::HoldfastPassthrough,
            Target::Haproxy,
            Target::Direct,
        ] {
            let (Some(&(_, port)), Some(&(_, pid))) = (
                ports.iter().find(|(t, _)| *t == target),
                pids.iter().find(|(t, _)| *t == target),
            ) else {
                continue;
            };
            eprint!(
                "bench: idle sessions: {} clients to {} … ",
                args.idle_clients,
                target.label()
            );
            let r = idle::measure(
                &format!("127.0.0.1:{port}"),
                pid,
                args.idle_clients,
                &st.app_user,
                &st.app_password,
            );
            match &r {
                Ok(r) => eprintln!("{:.1} KiB per session", r.per_session_kib()),
                Err(e) => eprintln!("FAILED: {e:#}"),
            }
            idle.push((target, r.map_err(|e| format!("{e:#}"))));
            wait_sessions_closed(&primary);
        }
    }

    let versions = Versions {
        mariadbd: lab::resolve_mariadbd(None)
            .and_then(|p| procs::run_capture(&p, ["--version"]))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unknown ({e:#})")),
        sysbench: sysbench::version(&sysbench_exe),
        haproxy: haproxy_exe
            .as_deref()
            .map(|h| {
                procs::run_capture(h, ["-v"])
                    .map(|s| s.lines().next().unwrap_or("").trim().to_string())
                    .unwrap_or_else(|e| format!("unknown ({e:#})"))
            })
            .unwrap_or_else(|| "not used".into()),
    };
    drop(helpers);
    drop(lab_guard);

    let report = Report {
        args,
        command: command_line(),
        date: format_utc(started_at),
        nproc: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        versions,
        targets: ports.clone(),
        unavailable,
        runs,
        idle,
        sysbench_example: sb
            .run_args("WORKLOAD", 0, args.threads, args.time)
            .iter()
            .map(|a| {
                if a == "--mysql-port=0" {
                    "--mysql-port=PORT".to_string()
                } else {
                    shell_quote(a)
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    };
    println!("{}", report.render(false));
    if let Some(out) = &args.out {
        fs::write(out, report.render(true))
            .with_context(|| format!("writing {}", out.display()))?;
        eprintln!("bench: report written to {}", out.display());
    }
    Ok(())
}

/// Prepares the sysbench tables on the primary unless they already hold the right shape.
fn prepare_tables(sb: &Sysbench, st: &LabStatus, logs: &Path) -> Result<()> {
    let primary = st.primary()?;
    let db = &st.database;
    let count = |sql: &str| -> Result<u64> {
        Ok(lab::node_sql_value(primary, sql)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    };
    let tables = count(&format!(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA='{db}' \
         AND TABLE_NAME REGEXP '^sbtest[0-9]+$'"
    ))?;
    let ready = tables == u64::from(sb.tables)
        && [1, sb.tables].iter().all(|i| {
            count(&format!("SELECT COUNT(*) FROM `{db}`.`sbtest{i}`")).ok()
                == Some(u64::from(sb.table_size))
        });
    if ready {
        eprintln!(
            "bench: sysbench tables already prepared ({} × {} rows)",
            sb.tables, sb.table_size
        );
        return Ok(());
    }
    eprintln!(
        "bench: preparing {} sysbench tables × {} rows on {} …",
        sb.tables, sb.table_size, primary.name
    );
    let t = Instant::now();
    lab::node_sql(
        primary,
        &format!("DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`"),
    )?;
    sb.prepare(primary.port, &logs.join("prepare.log"))?;
    eprintln!("bench: prepared in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

fn start_haproxy(exe: &Path, dir: &Path, backend_port: u16) -> Result<(Helper, u16)> {
    let port = procs::free_ports(1)?[0];
    let cfg = dir.join("haproxy.cfg");
    let text = format!(
        "# Written by `holdfast bench`: a TCP pass-through to the primary, for comparison.\n\
         global\n    maxconn 8192\n    nbthread 2\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    \
         timeout server 1h\n    maxconn 8192\n\n\
         frontend mysql\n    bind 127.0.0.1:{port}\n    default_backend primary\n\n\
         backend primary\n    server primary 127.0.0.1:{backend_port} maxconn 8192\n"
    );
    fs::write(&cfg, text).with_context(|| format!("writing {}", cfg.display()))?;
    let check = Command::new(exe)
        .arg("-c")
        .arg("-f")
        .arg(&cfg)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !check.status.success() {
        bail!(
            "haproxy rejects {}: {}",
            cfg.display(),
            String::from_utf8_lossy(&check.stderr).trim()
        );
    }
    let mut cmd = Command::new(exe);
    cmd.arg("-db").arg("-f").arg(&cfg);
    let pid = procs::spawn_detached(&mut cmd, Some(&dir.join("haproxy.log")))?;
    let helper = register(dir, "haproxy", pid)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    procs::wait_tcp(&addr, LISTEN_TIMEOUT, || procs::is_alive(helper.pid)).with_context(|| {
        format!(
            "HAProxy did not listen on {addr}; see {}",
            dir.join("haproxy.log").display()
        )
    })?;
    Ok((helper, port))
}

/// Starts `holdfast serve --config CONFIG` (output appended to `log`) and waits until its
/// proxy listener (the lab's proxy address) and every port in `also` accept connections.
/// Returns the helper and the proxy listener's port.
fn start_holdfast(
    exe: &Path,
    st: &LabStatus,
    config: &Path,
    log: &Path,
    also: &[u16],
) -> Result<(Helper, u16)> {
    let exe = if exe.is_file() {
        exe.to_path_buf()
    } else if exe.components().count() == 1 {
        let name = exe.to_string_lossy();
        procs::find_program(&[&name])
            .with_context(|| format!("holdfast binary {name:?} not found on PATH"))?
    } else {
        bail!("holdfast binary {} does not exist", exe.display());
    };
    let exe = exe.as_path();
    let addr: SocketAddr = st
        .proxy
        .parse()
        .with_context(|| format!("bad proxy address {:?} in lab.json", st.proxy))?;
    let mut addrs = vec![addr];
    addrs.extend(also.iter().map(|&p| SocketAddr::from(([127, 0, 0, 1], p))));
    if let Some(busy) = addrs.iter().find(|a| procs::tcp_accepts(a)) {
        bail!("something already listens on holdfast's address {busy}; stop it first");
    }
    let mut cmd = Command::new(exe);
    // A log file, not a terminal: no colour codes in it.
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1");
    let pid = procs::spawn_detached(&mut cmd, Some(log))?;
    let helper = register(&st.dir, "holdfast", pid)?;
    for a in &addrs {
        if let Err(e) = procs::wait_tcp(a, LISTEN_TIMEOUT, || procs::is_alive(helper.pid)) {
            let tail = procs::tail_file(log, 10);
            let tail = if tail.trim().is_empty() {
                format!("{} is empty", log.display())
            } else {
                format!("last lines of {}:\n{tail}", log.display())
            };
            bail!("holdfast ({}): {e:#}; {tail}", exe.display());
        }
    }
    Ok((helper, addr.port()))
}

/// Writes `DIR/NAME`: the lab's `holdfast.toml` changed by `edit`, headed by `note`.
fn config_variant(
    st: &LabStatus,
    name: &str,
    note: &str,
    edit: impl FnOnce(&mut toml::Table) -> Result<()>,
) -> Result<PathBuf> {
    let text = fs::read_to_string(&st.config)
        .with_context(|| format!("reading {}", st.config.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", st.config.display()))?;
    edit(&mut table)?;
    let body = toml::to_string(&table).context("serialising the holdfast config")?;
    let path = st.dir.join(name);
    let text = format!(
        "# Written by holdfast's benchmark from {}: {note}\n\n{body}",
        st.config.display()
    );
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The lab's config plus a pass-through `[[listener]]` on 127.0.0.1:`port`.
fn passthrough_config(st: &LabStatus, port: u16) -> Result<PathBuf> {
    config_variant(
        st,
        "bench-holdfast.toml",
        "plus a pass-through listener",
        |t| {
            let mut listener = toml::Table::new();
            listener.insert("listen".into(), format!("127.0.0.1:{port}").into());
            listener.insert("mode".into(), "passthrough".into());
            let list = t
                .entry("listener")
                .or_insert_with(|| toml::Value::Array(Vec::new()));
            let Some(list) = list.as_array_mut() else {
                bail!(
                    "`listener` in {} is not an array of tables",
                    st.config.display()
                );
            };
            list.push(toml::Value::Table(listener));
            Ok(())
        },
    )
}

fn register(dir: &Path, name: &'static str, pid: u32) -> Result<Helper> {
    let helper = Helper {
        name,
        pid,
        dir: dir.to_path_buf(),
    };
    lab::register_aux(
        dir,
        AuxProcess {
            name: name.to_string(),
            pid,
            // Unknown only if it already exited (then there is nothing to stop).
            start_time: procs::start_time(pid).unwrap_or(0),
        },
    )?;
    Ok(helper)
}

/// After closing idle clients, waits (up to 20 s) until the primary is back to a handful
/// of sessions, so the next measurement does not run into max_connections.
fn wait_sessions_closed(primary: &crate::NodeStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let connected = lab::node_sql(primary, "SHOW GLOBAL STATUS LIKE 'Threads_connected'")
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|row| row.get(1).and_then(|v| v.parse::<u64>().ok()));
        if connected.is_some_and(|c| c < 100) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Versions {
    mariadbd: String,
    sysbench: String,
    haproxy: String,
}

struct Report<'a> {
    args: &'a BenchArgs,
    command: String,
    date: String,
    nproc: usize,
    versions: Versions,
    targets: Vec<(Target, u16)>,
    unavailable: Vec<(Target, String)>,
    runs: Vec<Run>,
    idle: Vec<(Target, std::result::Result<idle::IdleResult, String>)>,
    sysbench_example: String,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 0 {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

#[derive(Clone, Copy, Default)]
struct Summary {
    tps: Option<f64>,
    qps: Option<f64>,
    avg: Option<f64>,
    p95: Option<f64>,
    errors: u64,
    reconnects: u64,
    ok: usize,
    runs: usize,
}

impl Report<'_> {
    fn summary(&self, workload: &str, target: Target) -> Summary {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.workload == workload && r.target == target)
            .collect();
        let ok: Vec<&Metrics> = runs.iter().filter_map(|r| r.result.as_ref().ok()).collect();
        let pick = |f: fn(&Metrics) -> f64| median(ok.iter().map(|m| f(m)).collect());
        Summary {
            tps: pick(|m| m.tps),
            qps: pick(|m| m.qps),
            avg: pick(|m| m.lat_avg_ms),
            p95: pick(|m| m.lat_p95_ms),
            errors: ok.iter().map(|m| m.errors).sum(),
            reconnects: ok.iter().map(|m| m.reconnects).sum(),
            ok: ok.len(),
            runs: runs.len(),
        }
    }

    fn render(&self, md: bool) -> String {
        let a = self.args;
        let mut out = String::new();
        let h = |out: &mut String, title: &str| {
            if md {
                let _ = writeln!(out, "\n## {title}\n");
            } else {
                let _ = writeln!(out, "\n{title}\n{}", "-".repeat(title.len()));
            }
        };
        if md {
            let _ = writeln!(out, "# holdfast benchmark\n");
            let _ = writeln!(out, "- command: `{}`", self.command);
            let _ = writeln!(out, "- date: {}", self.date);
            let _ = writeln!(out, "- nproc: {}", self.nproc);
            let _ = writeln!(out, "- mariadbd: {}", self.versions.mariadbd);
            let _ = writeln!(out, "- sysbench: {}", self.versions.sysbench);
            let _ = writeln!(out, "- haproxy: {}", self.versions.haproxy);
            let _ = writeln!(
                out,
                "- setup: {} round(s) × {} s, {} threads, {} tables × {} rows; order rotated each round",
                a.rounds, a.time, a.threads, a.tables, a.table_size
            );
            let _ = writeln!(out, "- sysbench: `sysbench {}`", self.sysbench_example);
            let ports: Vec<String> = self
                .targets
                .iter()
                .map(|(t, p)| format!("{} 127.0.0.1:{p}", t.label()))
                .collect();
            let _ = writeln!(out, "- targets: {}", ports.join(", "));
        } else {
            let _ = writeln!(
                out,
                "holdfast benchmark — {} round(s) × {} s, {} threads, {} tables × {} rows, nproc {}",
                a.rounds, a.time, a.threads, a.tables, a.table_size, self.nproc
            );
        }
        for (t, why) in &self.unavailable {
            let _ = writeln!(
                out,
                "{}{} NOT MEASURED: {}",
                if md { "\n> **" } else { "" },
                t.label(),
                why.replace('\n', " / ")
            );
        }

        h(&mut out, "Medians");
        let mut t = Table::new(&[
            "workload",
            "target",
            "tps",
            "qps",
            "avg ms",
            "p95 ms",
            "errors",
            "reconnects",
            "ok/runs",
        ]);
        for w in &a.workloads {
            for &(target, _) in &self.targets {
                let s = self.summary(w, target);
                t.row(vec![
                    w.clone(),
                    target.label().into(),
                    fmt_opt(s.tps, 0),
                    fmt_opt(s.qps, 0),
                    fmt_opt(s.avg, 2),
                    fmt_opt(s.p95, 2),
                    s.errors.to_string(),
                    s.reconnects.to_string(),
                    format!("{}/{}", s.ok, s.runs),
                ]);
            }
        }
        out.push_str(&t.render(md));

        let proxied: Vec<Target> = self
            .targets
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| t.is_holdfast())
            .collect();
        if !proxied.is_empty() {
            h(&mut out, "Ratios (medians)");
            let mut t = Table::new(&[
                "workload",
                "target",
                "tps /direct",
                "tps /haproxy",
                "p95 /direct",
                "p95 /haproxy",
            ]);
            for w in &a.workloads {
                let d = self.summary(w, Target::Direct);
                let hp = self.summary(w, Target::Haproxy);
                for &target in &proxied {
                    let hf = self.summary(w, target);
                    t.row(vec![
                        w.clone(),
                        target.label().into(),
                        ratio(hf.tps, d.tps),
                        ratio(hf.tps, hp.tps),
                        ratio(hf.p95, d.p95),
                        ratio(hf.p95, hp.p95),
                    ]);
                }
            }
            out.push_str(&t.render(md));
        }

        h(&mut out, "Per run");
        let mut t = Table::new(&[
            "round",
            "workload",
            "target",
            "tps",
            "qps",
            "avg ms",
            "p95 ms",
            "max ms",
            "errors",
            "reconnects",
        ]);
        for r in &self.runs {
            let mut row = vec![
                r.round.to_string(),
                r.workload.clone(),
                r.target.label().into(),
            ];
            match &r.result {
                Ok(m) => row.extend([
                    format!("{:.0}", m.tps),
                    format!("{:.0}", m.qps),
                    format!("{:.2}", m.lat_avg_ms),
                    format!("{:.2}", m.lat_p95_ms),
                    format!("{:.2}", m.lat_max_ms),
                    m.errors.to_string(),
                    m.reconnects.to_string(),
                ]),
                Err(e) => {
                    row.push(format!("FAILED: {e}"));
                    row.extend(std::iter::repeat_n(String::new(), 6));
                }
            }
            t.row(row);
        }
        out.push_str(&t.render(md));

        if !self.idle.is_empty() {
            h(&mut out, "Idle session memory (RSS)");
            let mut t = Table::new(&[
                "process",
                "clients",
                "RSS before KiB",
                "RSS after KiB",
                "KiB per session",
                "note",
            ]);
            for (target, r) in &self.idle {
                let process = match target {
                    Target::Direct => "mariadbd (direct)",
                    Target::Haproxy => "haproxy",
                    Target::Holdfast => "holdfast",
                    Target::HoldfastPassthrough => "holdfast (pass-through)",
                };
                match r {
                    Ok(r) => t.row(vec![
                        process.into(),
                        r.clients.to_string(),
                        r.rss_before_kib.to_string(),
                        r.rss_after_kib.to_string(),
                        format!("{:.1}", r.per_session_kib()),
                        if r.stable {
                            ""
                        } else {
                            "RSS still moving after 15 s"
                        }
                        .into(),
                    ]),
                    Err(e) => t.row(vec![
                        process.into(),
                        self.args.idle_clients.to_string(),
                        String::new(),
                        String::new(),
                        "FAILED".into(),
                        e.replace('\n', " / "),
                    ]),
                }
            }
            out.push_str(&t.render(md));
            let _ = writeln!(
                out,
                "{}Each client logs in (app, mysql_native_password), runs SELECT 1 and stays idle. \
                 For haproxy and holdfast the server-side sessions live in mariadbd, not in the proxy.",
                if md { "\n" } else { "" }
            );
        }
        if !md {
            let _ = writeln!(
                out,
                "\n{} / {} / {}",
                self.versions.mariadbd, self.versions.sysbench, self.versions.haproxy
            );
        }
        out
    }
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".into(),
    }
}

/// A small text/Markdown table.
struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn render(&self, md: bool) -> String {
        let mut out = String::new();
        if md {
            let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
            let _ = writeln!(out, "| {} |", self.headers.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(self.headers.len()));
            for r in &self.rows {
                let cells: Vec<String> = r.iter().map(|c| esc(c)).collect();
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            return out;
        }
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                // A failure message spans the rest of the row; don't widen the column for it.
                if c.starts_with("FAILED: ") {
                    continue;
                }
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let w = widths.get(i).copied().unwrap_or(0);
                let numeric = c.parse::<f64>().is_ok() || c == "-";
                if i > 0 {
                    s.push_str("  ");
                }
                if numeric {
                    let _ = write!(s, "{c:>w$}");
                } else {
                    let _ = write!(s, "{c:<w$}");
                }
            }
            s.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(&self.headers));
        for r in &self.rows {
            let _ = writeln!(out, "{}", line(r));
        }
        out
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn command_line() -> String {
    std::env::args()
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `YYYY-MM-DD HH:MM:SS UTC` without a date crate (civil-from-days, H. Hinnant).
fn format_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(format_utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // 2024-02-29 12:34:56
        assert_eq!(format_utc(t), "2024-02-29 12:34:56 UTC");
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn quotes_shell_words() {
        assert_eq!(shell_quote("--time=5"), "--time=5");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn bench_args_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = Cli::try_parse_from([
            "bench",
            "--dir",
            "/tmp/x",
            "--workloads",
            "oltp_point_select",
            "--targets",
            "direct,haproxy",
        ])
        .unwrap();
        assert_eq!(cli.bench.rounds, 3);
        assert_eq!(cli.bench.idle_clients, 1000);
        assert_eq!(cli.bench.workloads, vec!["oltp_point_select"]);
        assert_eq!(cli.bench.targets, vec![Target::Direct, Target::Haproxy]);
        for list in [
            "direct,haproxy,holdfast,holdfast_passthrough",
            "direct,haproxy,holdfast,holdfast-passthrough",
        ] {
            let cli = Cli::try_parse_from(["bench", "--targets", list]).unwrap();
            assert_eq!(
                cli.bench.targets,
                vec![
                    Target::Direct,
                    Target::Haproxy,
                    Target::Holdfast,
                    Target::HoldfastPassthrough
                ]
            );
        }
        assert_eq!(
            Target::HoldfastPassthrough.label(),
            "holdfast (pass-through)"
        );
    }
}
