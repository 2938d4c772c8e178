//! `holdfast-bench bench-resume`: how long a client waits for a paused serverless instance, per
//! pause tier, next to a raw cold start of the same `mariadbd` measured in the same run,
//! plus a burst of sysbench threads arriving at a stopped instance together.
//!
//! One cycle measures, in an order rotated every cycle:
//! * freeze / stop tier: `POST /pause?tier=T`, then TCP connect to holdfast's proxy
//!   listener → login → `SELECT 1` answered; holdfast's own `last_resume_ms` is read after;
//! * raw cold start: `POST /pause?tier=stop`, then the node's own command line is spawned
//!   and timed until `SELECT 1` is answered on the node's port; the server is stopped again
//!   and `POST /resume` hands the instance back to holdfast's process driver.

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use holdfast_config::serverless::InstanceDriverConfig;
use holdfast_lab::mysql_client::Conn;
use holdfast_lab::{self as lab, procs, LabOptions, LabStatus, NodeStatus};

use crate::admin;
use crate::report::{fmt_opt, median, percentile, ratio, shell_words, Doc, Provenance, Table};
use crate::serve::{config_variant, start_holdfast, LabGuard};
use crate::sysbench::{self, prepare_tables, Metrics, Sysbench, METRIC_HEADERS};

/// Goal for the stop tier's median, client connect → first `SELECT 1`.
const STOP_GOAL_MS: f64 = 400.0;
/// Goal for the freeze tier's median.
const FREEZE_GOAL_MS: f64 = 20.0;
/// How long one client gets for connect, login and `SELECT 1` through holdfast.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a raw cold start may take before it counts as failed.
const RAW_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between connection attempts during a raw cold start (the process driver's
/// readiness probe retries as often).
const RAW_RETRY: Duration = Duration::from_millis(5);
/// How long a stopped server gets for a clean shutdown after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);
/// After a resume, before the next pause: holdfast applies the instance's size (CPU limit,
/// buffer pool) on its 1 s scaling tick after a start; this keeps that out of the next
/// measurement.
const SETTLE: Duration = Duration::from_millis(1500);
/// Read timeout of admin requests (`POST /pause?tier=stop` answers once the server is down).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a refused (409) pause is asked again before the benchmark gives up.
const PAUSE_ATTEMPTS: usize = 5;
/// sysbench tables × rows for the burst, prepared directly on the node.
const SB_TABLES: u32 = 4;
const SB_TABLE_SIZE: u32 = 1000;
/// Config file written next to the lab's `holdfast.toml`.
const CONFIG_NAME: &str = "bench-resume.toml";
/// holdfast's output (stderr) goes here, in the lab directory.
const HOLDFAST_LOG: &str = "bench-resume-holdfast.log";

/// Options of `holdfast-bench bench-resume`.
#[derive(clap::Args, Debug, Clone)]
pub struct ResumeBenchArgs {
    /// Lab directory. A serverless lab is started there and stopped at the end; a lab that
    /// already runs there is refused.
    #[arg(long, default_value = "holdfast-bench-resume")]
    pub dir: PathBuf,
    /// Measurements per pause tier, and raw cold starts, interleaved.
    #[arg(long, default_value_t = 20)]
    pub cycles: usize,
    /// Base port of the lab [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Also write the report as Markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// sysbench threads that arrive together at the stopped instance.
    #[arg(long, default_value_t = 20)]
    pub sysbench_threads: u32,
    /// Seconds of that sysbench run.
    #[arg(long, default_value_t = 10)]
    pub sysbench_time: u32,
    /// Keep the lab's CPU limit: holdfast's process driver puts the server into a cgroup
    /// limited to its size (0.5 CCU = half a CPU at start). By default the benchmark sets
    /// `cgroup = "none"`, so holdfast's starts and the raw cold starts run alike.
    #[arg(long)]
    pub cpu_limit: bool,
}

/// What one measurement is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Freeze,
    Stop,
    Raw,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Freeze, Kind::Stop, Kind::Raw];

    fn label(self) -> &'static str {
        match self {
            Kind::Freeze => "freeze tier",
            Kind::Stop => "stop tier",
            Kind::Raw => "raw cold start",
        }
    }

    fn tier(self) -> &'static str {
        match self {
            Kind::Freeze => "freeze",
            Kind::Stop | Kind::Raw => "stop",
        }
    }
}

/// One measurement.
#[derive(Clone, Debug)]
struct Sample {
    cycle: usize,
    kind: Kind,
    /// Milliseconds to the first `SELECT 1`, or why there was none.
    result: std::result::Result<f64, String>,
    /// holdfast's `last_resume_ms` for this resume (tiers only).
    holdfast_ms: Option<f64>,
}

/// The instance as `GET /status` shows it.
#[derive(Clone, Debug, Default)]
struct View {
    phase: String,
    tier: Option<String>,
    resumes: u64,
    last_resume_ms: Option<f64>,
    last_error: Option<String>,
    accepted: u64,
    logins_failed: u64,
}

/// The sysbench burst's outcome.
struct Burst {
    result: std::result::Result<Metrics, String>,
    accepted: u64,
    logins_failed: u64,
    resumes: u64,
    verdict: std::result::Result<(), String>,
}

/// Things worth telling next to the numbers.
#[derive(Default)]
struct Notes {
    /// Pause requests answered with something else than 200 (then retried).
    pause_refusals: Vec<String>,
    /// Resumes whose counter did not advance by exactly one.
    resume_count_odd: Vec<String>,
    /// Raw cold starts after which the server left its pid file behind.
    stale_pid_files: usize,
    /// `POST /resume` after a raw cold start that brought up a fresh server of holdfast's.
    handbacks_ok: usize,
}

/// A server the benchmark started itself; stopped on drop.
struct RawServer(u32);

impl Drop for RawServer {
    fn drop(&mut self) {
        if let Err(e) = procs::terminate(self.0, SHUTDOWN_GRACE) {
            eprintln!("bench-resume: stopping mariadbd (pid {}): {e:#}", self.0);
        }
    }
}

/// Lets a frozen node run again on drop, so that `lab down` (SIGTERM) can stop it.
struct Thaw(PathBuf);

impl Drop for Thaw {
    fn drop(&mut self) {
        if let Some(pid) = fs::read_to_string(&self.0)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|&pid| procs::is_alive(pid))
        {
            let _ = procs::signal(pid, libc::SIGCONT);
        }
    }
}

/// Runs `holdfast-bench bench-resume`; `holdfast_exe` is started as `holdfast_exe serve`.
/// Blocking; progress on stderr, the report on stdout (and in `--out`). Fails after
/// printing the report when a measurement failed or the sysbench burst missed its
/// requirements.
pub fn run_resume_bench(args: &ResumeBenchArgs, holdfast_exe: &Path) -> Result<()> {
    if args.cycles == 0 || args.sysbench_threads == 0 || args.sysbench_time == 0 {
        bail!("--cycles, --sysbench-threads and --sysbench-time must be at least 1");
    }
    let started_at = SystemTime::now();
    let sysbench_exe = procs::require_program(&["sysbench"], "sysbench")?;
    procs::raise_nofile(u64::from(args.sysbench_threads) * 4 + 1024)?;
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    if let Ok(st) = lab::status(&dir) {
        if st.nodes.iter().any(|n| n.alive) {
            bail!(
                "a lab runs in {d}; the benchmark starts and stops its own: stop it with \
                 `holdfast lab down --dir {d}` or choose another --dir",
                d = dir.display()
            );
        }
    }

    // The lab, stopped again on every way out.
    eprintln!(
        "bench-resume: starting a serverless lab in {}",
        dir.display()
    );
    let st = lab::up(&LabOptions {
        base_port: args.base_port,
        serverless: true,
        ..LabOptions::new(&dir, 0)
    })?;
    let _lab = LabGuard(Some(dir.clone()));
    if !st.serverless {
        bail!(
            "{} holds a lab that is not serverless; choose another --dir",
            dir.display()
        );
    }
    let node = st.primary()?.clone();
    let _thaw = Thaw(node.pid_file());
    let logs = dir.join("bench-logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let sb = Sysbench::for_lab(sysbench_exe.clone(), &st, SB_TABLES, SB_TABLE_SIZE, "none");
    prepare_tables(&sb, &st, &logs)?;
    let raw_command = lab::node_command(&dir, &node.name)?;

    // holdfast, which adopts the running node.
    let config = bench_config(&st, args.cpu_limit)?;
    let log = dir.join(HOLDFAST_LOG);
    let admin_port = st
        .admin
        .parse::<SocketAddr>()
        .with_context(|| format!("bad admin address {:?} in lab.json", st.admin))?
        .port();
    eprintln!(
        "bench-resume: starting holdfast serve --config {} (log {})",
        config.display(),
        log.display()
    );
    let (holdfast, proxy_port) = start_holdfast(holdfast_exe, &st, &config, &log, &[admin_port])?;
    let admin = admin::client(&st);
    wait_view(&admin, Duration::from_secs(30), "running", |v| {
        v.phase == "running"
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the Tokio runtime for the clients")?;
    let bench = Bench {
        rt: &rt,
        admin: &admin,
        proxy: format!("127.0.0.1:{proxy_port}"),
        st: &st,
        node: &node,
        raw_command: &raw_command,
    };

    // Cycles, interleaved.
    let mut notes = Notes::default();
    let mut samples = Vec::new();
    let total = args.cycles * Kind::ALL.len();
    for cycle in 0..args.cycles {
        for i in 0..Kind::ALL.len() {
            let kind = Kind::ALL[(i + cycle) % Kind::ALL.len()];
            eprint!(
                "bench-resume: [{}/{total}] cycle {} {:<14} … ",
                samples.len() + 1,
                cycle + 1,
                kind.label()
            );
            let sample = match kind {
                Kind::Freeze | Kind::Stop => bench.tier(cycle + 1, kind, &mut notes)?,
                Kind::Raw => bench.raw(cycle + 1, &mut notes)?,
            };
            match (&sample.result, sample.holdfast_ms) {
                (Ok(ms), Some(h)) => eprintln!("{ms:.1} ms (holdfast resume {h:.1} ms)"),
                (Ok(ms), None) => eprintln!("{ms:.1} ms"),
                (Err(e), _) => eprintln!("FAILED: {e}"),
            }
            samples.push(sample);
            std::thread::sleep(SETTLE);
        }
    }

    // sysbench threads arriving together at a stopped instance.
    eprint!(
        "bench-resume: {} sysbench threads at a stopped instance … ",
        args.sysbench_threads
    );
    let burst = bench.burst(
        &sb,
        proxy_port,
        args,
        &logs.join("resume-burst.log"),
        &mut notes,
    )?;
    match (&burst.result, &burst.verdict) {
        (Ok(m), Ok(())) => eprintln!("{:.0} tps, {} resume(s)", m.tps, burst.resumes),
        (_, Err(e)) => eprintln!("FAILED: {e}"),
        (Err(e), Ok(())) => eprintln!("FAILED: {e}"),
    }

    let report = Report {
        args,
        provenance: Provenance::of_this_run(started_at),
        mariadbd: raw_command
            .first()
            .map(|exe| {
                procs::run_capture(Path::new(exe), ["--version"])
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|e| format!("unknown ({e:#})"))
            })
            .unwrap_or_default(),
        sysbench: sysbench::version(&sysbench_exe),
        config,
        log,
        proxy: bench.proxy.clone(),
        node: node.address.clone(),
        sysbench_command: shell_words(sb.run_args(
            "oltp_read_only",
            proxy_port,
            args.sysbench_threads,
            args.sysbench_time,
        )),
        samples,
        burst,
        notes,
    };
    drop(holdfast);
    crate::report::publish(|md| report.render(md), args.out.as_deref(), "bench-resume")?;
    let failed = report.samples.iter().filter(|s| s.result.is_err()).count();
    if failed > 0 {
        bail!("{failed} measurement(s) failed; see the report");
    }
    if let Err(e) = &report.burst.verdict {
        bail!("the sysbench burst failed: {e}");
    }
    Ok(())
}

/// `DIR/bench-resume.toml`: the lab's config with pauses left to the benchmark.
fn bench_config(st: &LabStatus, cpu_limit: bool) -> Result<PathBuf> {
    let note = if cpu_limit {
        "idle_pause_secs = 0, stop_after_secs = 0 (only the benchmark pauses)"
    } else {
        "idle_pause_secs = 0, stop_after_secs = 0 (only the benchmark pauses), \
         cgroup = \"none\" (no CPU limit)"
    };
    config_variant(st, CONFIG_NAME, note, |c| {
        let sl = c
            .serverless
            .as_mut()
            .with_context(|| format!("no [serverless] in {}", st.config.display()))?;
        sl.idle_pause_secs = 0;
        sl.stop_after_secs = 0;
        if !cpu_limit {
            let InstanceDriverConfig::Process(driver) = &mut sl.driver else {
                bail!(
                    "{} has no process driver to lift the CPU limit of",
                    st.config.display()
                );
            };
            driver.cgroup = Some("none".into());
        }
        Ok(())
    })
}

/// What the measurements share.
struct Bench<'a> {
    rt: &'a tokio::runtime::Runtime,
    admin: &'a holdfast_admin::AdminClient,
    /// holdfast's proxy listener.
    proxy: String,
    st: &'a LabStatus,
    node: &'a NodeStatus,
    raw_command: &'a [String],
}

impl Bench<'_> {
    /// Pauses to `kind`'s tier, then times connect → login → `SELECT 1` through holdfast.
    fn tier(&self, cycle: usize, kind: Kind, notes: &mut Notes) -> Result<Sample> {
        pause(self.admin, kind.tier(), notes)?;
        let before = view(self.admin)?;
        let result = self
            .rt
            .block_on(select_one(
                &self.proxy,
                &self.st.app_user,
                &self.st.app_password,
                CLIENT_TIMEOUT,
            ))
            .map(|d| d.as_secs_f64() * 1e3)
            .map_err(|e| format!("{e:#}"));
        if result.is_err() {
            // Bring it back for the next measurement (this fails loudly if it cannot).
            resume(self.admin)?;
        }
        let after = wait_view(self.admin, Duration::from_secs(30), "running", |v| {
            v.phase == "running"
        })?;
        let holdfast_ms = if after.resumes == before.resumes + 1 {
            after.last_resume_ms
        } else {
            notes.resume_count_odd.push(format!(
                "cycle {cycle} {}: resumes went from {} to {}",
                kind.label(),
                before.resumes,
                after.resumes
            ));
            None
        };
        Ok(Sample {
            cycle,
            kind,
            result,
            holdfast_ms,
        })
    }

    /// Stops the instance through holdfast, then times the node's own command line from
    /// spawn to `SELECT 1` on its port; stops it and hands the instance back to holdfast.
    fn raw(&self, cycle: usize, notes: &mut Notes) -> Result<Sample> {
        pause(self.admin, "stop", notes)?;
        let addr: SocketAddr = self
            .node
            .address
            .parse()
            .with_context(|| format!("bad node address {:?}", self.node.address))?;
        if procs::tcp_accepts(&addr) {
            bail!(
                "something still accepts connections on {addr} although holdfast reports \
                 the instance stopped"
            );
        }
        let (program, rest) = self
            .raw_command
            .split_first()
            .context("the node's command line is empty")?;
        let mut cmd = Command::new(program);
        cmd.args(rest);
        let err_log = self.node.error_log();
        let began = Instant::now();
        let pid = procs::spawn_detached(&mut cmd, Some(&err_log))?;
        let server = RawServer(pid);
        let result = loop {
            let attempt = self.rt.block_on(select_one(
                &self.node.address,
                &self.st.app_user,
                &self.st.app_password,
                Duration::from_secs(5),
            ));
            match attempt {
                Ok(_) => break Ok(began.elapsed().as_secs_f64() * 1e3),
                Err(e) => {
                    if !procs::is_alive(pid) {
                        break Err(format!(
                            "mariadbd (pid {pid}) exited during start-up; last lines of {}: {}",
                            err_log.display(),
                            procs::tail_file(&err_log, 5).replace('\n', " / ")
                        ));
                    }
                    if began.elapsed() >= RAW_START_TIMEOUT {
                        break Err(format!("no SELECT 1 within {RAW_START_TIMEOUT:?}: {e:#}"));
                    }
                    std::thread::sleep(RAW_RETRY);
                }
            }
        };
        procs::terminate(pid, SHUTDOWN_GRACE)
            .with_context(|| format!("stopping the raw cold-start mariadbd (pid {pid})"))?;
        drop(server);
        let pid_file = self.node.pid_file();
        if fs::read_to_string(&pid_file).is_ok_and(|t| t.trim() == pid.to_string()) {
            notes.stale_pid_files += 1;
        }
        // Hand the instance back: holdfast's driver must notice the pid file is not its
        // server's (or gone) and start a fresh one.
        resume(self.admin).context("POST /resume after a raw cold start")?;
        let fresh = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|&p| p != pid && procs::is_alive(p));
        if fresh.is_some() {
            notes.handbacks_ok += 1;
        } else {
            bail!(
                "after POST /resume the pid file {} names no live server other than the \
                 benchmark's stopped one (pid {pid})",
                pid_file.display()
            );
        }
        Ok(Sample {
            cycle,
            kind: Kind::Raw,
            result,
            holdfast_ms: None,
        })
    }

    /// Stops the instance, then runs sysbench through holdfast: every thread logs in at once.
    fn burst(
        &self,
        sb: &Sysbench,
        proxy_port: u16,
        args: &ResumeBenchArgs,
        log: &Path,
        notes: &mut Notes,
    ) -> Result<Burst> {
        pause(self.admin, "stop", notes)?;
        let before = view(self.admin)?;
        let result = sb.run(
            "oltp_read_only",
            proxy_port,
            args.sysbench_threads,
            args.sysbench_time,
            log,
        )?;
        let after = wait_view(self.admin, Duration::from_secs(30), "running", |v| {
            v.phase == "running"
        })?;
        let accepted = after.accepted.saturating_sub(before.accepted);
        let logins_failed = after.logins_failed.saturating_sub(before.logins_failed);
        let resumes = after.resumes.saturating_sub(before.resumes);
        let verdict = match &result {
            Err(e) => Err(e.clone()),
            Ok(m) if m.errors > 0 => Err(format!("sysbench counted {} errors", m.errors)),
            Ok(m) if m.tps <= 0.0 => Err("sysbench ran no transactions".into()),
            Ok(_) if logins_failed > 0 => Err(format!("{logins_failed} logins failed")),
            Ok(_) if accepted < u64::from(args.sysbench_threads) => Err(format!(
                "holdfast accepted {accepted} connections for {} threads",
                args.sysbench_threads
            )),
            Ok(_) => Ok(()),
        };
        Ok(Burst {
            result,
            accepted,
            logins_failed,
            resumes,
            verdict,
        })
    }
}

/// Connect, log in, `SELECT 1`, quit; returns the time to the answer of `SELECT 1`.
async fn select_one(addr: &str, user: &str, password: &str, timeout: Duration) -> Result<Duration> {
    let began = Instant::now();
    let mut conn = Conn::connect(addr, user, password, None, timeout).await?;
    let rows = tokio::time::timeout(timeout, conn.query("SELECT 1"))
        .await
        .with_context(|| format!("SELECT 1 through {addr} timed out after {timeout:?}"))??;
    let took = began.elapsed();
    if rows != 1 {
        bail!("SELECT 1 through {addr} returned {rows} rows");
    }
    let _ = conn.quit().await;
    Ok(took)
}

/// `GET /status`, the parts about the instance.
fn view(admin: &holdfast_admin::AdminClient) -> Result<View> {
    let v = admin::get_json(admin, "/status")?;
    let sl = v
        .get("serverless")
        .filter(|s| !s.is_null())
        .context("GET /status shows no serverless instance")?;
    let text = |o: &serde_json::Value, k: &str| o.get(k).and_then(|x| x.as_str()).map(String::from);
    let num = |o: Option<&serde_json::Value>, k: &str| {
        o.and_then(|o| o.get(k))
            .and_then(|x| x.as_u64())
            .unwrap_or(0)
    };
    Ok(View {
        phase: text(sl, "phase").unwrap_or_default(),
        tier: text(sl, "tier"),
        resumes: num(Some(sl), "resumes"),
        last_resume_ms: sl.get("last_resume_ms").and_then(|x| x.as_f64()),
        last_error: text(sl, "last_error"),
        accepted: num(v.get("counters"), "connections_accepted"),
        logins_failed: num(v.get("counters"), "logins_failed"),
    })
}

/// Polls `GET /status` until `done`; fails after `limit` with the last view, or at once
/// when the status cannot be read.
fn wait_view(
    admin: &holdfast_admin::AdminClient,
    limit: Duration,
    what: &str,
    done: impl Fn(&View) -> bool,
) -> Result<View> {
    let mut last = View::default();
    let outcome = holdfast_lab::poll(limit, || match view(admin) {
        Ok(v) if done(&v) => Some(Ok(v)),
        Ok(v) => {
            last = v;
            None
        }
        Err(e) => Some(Err(e)),
    });
    match outcome {
        Some(v) => v,
        None => bail!(
            "the instance was not {what} within {limit:?}: phase {}, tier {}, last error {}",
            last.phase,
            last.tier.as_deref().unwrap_or("-"),
            last.last_error.as_deref().unwrap_or("-")
        ),
    }
}

/// `POST /pause?tier=T` until it answers 200 (409s are noted and retried a few times),
/// then waits until the status shows the instance paused in that tier.
fn pause(admin: &holdfast_admin::AdminClient, tier: &str, notes: &mut Notes) -> Result<()> {
    let path = format!("/pause?tier={tier}");
    for attempt in 1..=PAUSE_ATTEMPTS {
        let (code, body) = admin::request(admin, "POST", &path, ADMIN_TIMEOUT)?;
        if code == 200 {
            break;
        }
        notes
            .pause_refusals
            .push(format!("POST {path}: HTTP {code}: {}", body.trim()));
        if code != 409 || attempt == PAUSE_ATTEMPTS {
            bail!("POST {path} answered HTTP {code}: {}", body.trim());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    wait_view(admin, Duration::from_secs(30), "paused", |v| {
        v.phase == "paused" && v.tier.as_deref() == Some(tier)
    })?;
    Ok(())
}

/// `POST /resume` (200 once running).
fn resume(admin: &holdfast_admin::AdminClient) -> Result<()> {
    let (code, body) = admin::request(admin, "POST", "/resume", ADMIN_TIMEOUT)?;
    if code != 200 {
        bail!("POST /resume answered HTTP {code}: {}", body.trim());
    }
    wait_view(admin, Duration::from_secs(30), "running", |v| {
        v.phase == "running"
    })?;
    Ok(())
}

/// p50 (median), p95, max, count of successful values.
#[derive(Clone, Copy, Default)]
struct Stats {
    p50: Option<f64>,
    p95: Option<f64>,
    max: Option<f64>,
    ok: usize,
}

fn stats(values: impl Iterator<Item = f64>) -> Stats {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    Stats {
        p50: median(v.clone()),
        p95: percentile(&v, 95.0),
        max: v.last().copied(),
        ok: v.len(),
    }
}

struct Report<'a> {
    args: &'a ResumeBenchArgs,
    provenance: Provenance,
    mariadbd: String,
    sysbench: String,
    config: PathBuf,
    log: PathBuf,
    proxy: String,
    node: String,
    sysbench_command: String,
    samples: Vec<Sample>,
    burst: Burst,
    notes: Notes,
}

impl Report<'_> {
    fn client(&self, kind: Kind) -> Stats {
        stats(
            self.samples
                .iter()
                .filter(|s| s.kind == kind)
                .filter_map(|s| s.result.as_ref().ok().copied()),
        )
    }

    fn holdfast(&self, kind: Kind) -> Stats {
        stats(
            self.samples
                .iter()
                .filter(|s| s.kind == kind)
                .filter_map(|s| s.holdfast_ms),
        )
    }

    fn render(&self, md: bool) -> String {
        let a = self.args;
        let mut out = Doc::new(md);
        self.provenance
            .header(&mut out, "holdfast resume benchmark");
        out.item(format_args!("mariadbd: {}", self.mariadbd));
        out.item(format_args!("sysbench: {}", self.sysbench));
        out.item(format_args!(
            "holdfast: `holdfast serve --config {}` (proxy {}, log {}); {}",
            self.config.display(),
            self.proxy,
            self.log.display(),
            if a.cpu_limit {
                "idle_pause_secs = 0, stop_after_secs = 0, the lab's CPU limit kept"
            } else {
                "idle_pause_secs = 0, stop_after_secs = 0, cgroup = \"none\" (no CPU limit)"
            }
        ));
        out.item(
            "client path (tiers): `POST /pause?tier=T` (200, status paused), then TCP \
             connect to holdfast's proxy listener → login (app, mysql_native_password) → \
             `SELECT 1` answered",
        );
        out.item(format_args!(
            "raw cold start: `POST /pause?tier=stop`, then the node's own mariadbd \
             command line spawned → `SELECT 1` answered on {} (same client, retried every \
             {} ms); SIGTERM, then `POST /resume` hands the instance back to holdfast",
            self.node,
            RAW_RETRY.as_millis()
        ));
        out.item(format_args!(
            "{} cycles, order rotated each cycle, {} ms settle after each measurement",
            a.cycles,
            SETTLE.as_millis()
        ));
        if !md {
            let _ = writeln!(
                out,
                "holdfast resume benchmark — {} cycles, nproc {}, {}",
                a.cycles, self.provenance.nproc, self.mariadbd
            );
        }

        out.heading("Resume latency: client connect → first SELECT 1 (ms)");
        let mut t = Table::new(&[
            "path",
            "cycles",
            "ok",
            "p50",
            "p95",
            "max",
            "holdfast resume p50",
            "goal p50",
            "goal met",
        ]);
        for kind in Kind::ALL {
            let c = self.client(kind);
            let hf = self.holdfast(kind);
            let goal = match kind {
                Kind::Freeze => Some(FREEZE_GOAL_MS),
                Kind::Stop => Some(STOP_GOAL_MS),
                Kind::Raw => None,
            };
            let label = match kind {
                Kind::Raw => "raw cold start (mariadbd)",
                k => k.label(),
            };
            t.row(vec![
                label.into(),
                a.cycles.to_string(),
                c.ok.to_string(),
                fmt_opt(c.p50, 1),
                fmt_opt(c.p95, 1),
                fmt_opt(c.max, 1),
                if kind == Kind::Raw {
                    "-".into()
                } else {
                    fmt_opt(hf.p50, 1)
                },
                goal.map(|g| format!("≤ {g:.0}"))
                    .unwrap_or_else(|| "-".into()),
                match (goal, c.p50) {
                    (Some(g), Some(p)) if p <= g => "yes".into(),
                    (Some(_), Some(_)) => "NO".into(),
                    _ => "-".into(),
                },
            ]);
        }
        out.table(&t);
        let stop = self.client(Kind::Stop);
        let raw = self.client(Kind::Raw);
        out.paragraph(format_args!(
            "p50(stop tier) / p50(raw cold start) = {}; holdfast's own resume p50 (stop) / \
             p50(raw) = {}",
            ratio(stop.p50, raw.p50),
            ratio(self.holdfast(Kind::Stop).p50, raw.p50)
        ));

        out.heading(&format!(
            "{} sysbench threads arriving at a stopped instance",
            a.sysbench_threads
        ));
        let b = &self.burst;
        let mut t = Table::new(
            &[
                &["threads", "seconds"][..],
                &METRIC_HEADERS,
                &[
                    "logins accepted",
                    "logins failed",
                    "resumes caused",
                    "verdict",
                ],
            ]
            .concat(),
        );
        let mut row = vec![a.sysbench_threads.to_string(), a.sysbench_time.to_string()];
        match &b.result {
            Ok(m) => row.extend(m.cells()),
            Err(_) => row.extend(std::iter::repeat_n("-".to_string(), METRIC_HEADERS.len())),
        }
        row.extend([
            b.accepted.to_string(),
            b.logins_failed.to_string(),
            b.resumes.to_string(),
            match &b.verdict {
                Ok(()) => "ok".into(),
                Err(e) => format!("FAILED: {e}"),
            },
        ]);
        t.row(row);
        out.table(&t);
        if md {
            let _ = writeln!(out, "\nsysbench: `sysbench {}`", self.sysbench_command);
        }

        out.heading("Notes");
        let n = &self.notes;
        let raw_runs = self.samples.iter().filter(|s| s.kind == Kind::Raw).count();
        let mut lines = vec![format!(
            "after each raw cold start, POST /resume brought up a fresh server through \
             holdfast's process driver: {}/{raw_runs}; pid files left behind by the raw \
             server: {}",
            n.handbacks_ok, n.stale_pid_files
        )];
        if n.pause_refusals.is_empty() {
            lines.push("every POST /pause answered 200 at once".into());
        } else {
            lines.push(format!(
                "{} pause request(s) refused, then retried: {}",
                n.pause_refusals.len(),
                n.pause_refusals.join("; ")
            ));
        }
        lines.extend(n.resume_count_odd.iter().cloned());
        for s in self.samples.iter().filter(|s| s.result.is_err()) {
            if let Err(e) = &s.result {
                lines.push(format!("cycle {} {} FAILED: {e}", s.cycle, s.kind.label()));
            }
        }
        for l in lines {
            if md {
                out.item(l);
            } else {
                let _ = writeln!(out, "{l}");
            }
        }

        out.heading("Per cycle (ms)");
        let mut t = Table::new(&[
            "cycle",
            "freeze",
            "freeze (holdfast)",
            "stop",
            "stop (holdfast)",
            "raw cold start",
        ]);
        for cycle in 1..=a.cycles {
            let get = |kind: Kind| {
                self.samples
                    .iter()
                    .find(|s| s.cycle == cycle && s.kind == kind)
            };
            let client = |kind: Kind| match get(kind).map(|s| &s.result) {
                Some(Ok(ms)) => format!("{ms:.1}"),
                Some(Err(_)) => "FAILED".into(),
                None => "-".into(),
            };
            let own = |kind: Kind| fmt_opt(get(kind).and_then(|s| s.holdfast_ms), 1);
            t.row(vec![
                cycle.to_string(),
                client(Kind::Freeze),
                own(Kind::Freeze),
                client(Kind::Stop),
                own(Kind::Stop),
                client(Kind::Raw),
            ]);
        }
        out.table(&t);
        out.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_values() {
        let s = stats([5.0, 1.0, 3.0].into_iter());
        assert_eq!((s.p50, s.max, s.ok), (Some(3.0), Some(5.0), 3));
    }

    #[test]
    fn resume_bench_args_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ResumeBenchArgs,
        }
        let cli = Cli::try_parse_from(["bench-resume", "--cycles", "3"]).unwrap();
        assert_eq!(cli.args.cycles, 3);
        assert_eq!(cli.args.sysbench_threads, 20);
        assert_eq!(cli.args.dir, PathBuf::from("holdfast-bench-resume"));
        assert!(!cli.args.cpu_limit);
    }
}
