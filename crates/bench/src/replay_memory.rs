//! `holdfast-bench bench-replay-memory`: what an open transaction of many tiny statements
//! costs holdfast in memory per session (issue 18, item 11). N sessions each open a
//! transaction and run `INSERT INTO t VALUES (n)` M times, and keep it open; holdfast's
//! resident memory (VmRSS) is read once the sessions are logged in and idle, and again with
//! every transaction open, next to each session's replay account (`/status`
//! `replay_held_bytes`, what `replay_max_bytes` bounds). Run with transaction replay on and
//! off, each on a fresh holdfast, so the replay log's share shows.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use holdfast_lab::mysql_client::Conn;
use holdfast_lab::{self as lab, procs, LabOptions, LabStatus};
use tokio::sync::Semaphore;

use crate::admin;
use crate::serve::{config_variant, start_holdfast, LabGuard};

const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Sessions running their inserts at once (the machine has few cores; the memory measured
/// is the same however they are interleaved).
const CONCURRENCY: usize = 8;

/// Options of `holdfast-bench bench-replay-memory`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayMemoryArgs {
    /// Lab directory (started there and stopped at the end; a running lab is refused).
    #[arg(long, default_value = "holdfast-bench-replay-memory")]
    pub dir: PathBuf,
    /// Sessions, each with its transaction open at the measurement.
    #[arg(long, default_value_t = 50)]
    pub sessions: usize,
    /// Statements per transaction.
    #[arg(long, default_value_t = 10_000)]
    pub statements: usize,
    /// `replay_max_bytes` for the run with replay on [default: the lab's, 1 MiB].
    #[arg(long)]
    pub replay_max_bytes: Option<usize>,
    /// Base port of the lab [default: free ports].
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Also write the report as Markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One run: holdfast with replay on or off.
#[derive(Debug)]
struct Run {
    replay: bool,
    rss_start_kib: u64,
    rss_idle_kib: u64,
    rss_open_kib: u64,
    /// Per session: bytes of the statements' packets (header, command, text).
    sent_bytes: usize,
    /// Per session, from `/status`: min, mean, max of `replay_held_bytes`.
    held: (u64, f64, u64),
    /// Sessions whose transaction was not replayable any more, and why (the first).
    not_replayable: (usize, Option<String>),
    elapsed: Duration,
}

pub fn run(args: &ReplayMemoryArgs, holdfast_exe: &Path) -> Result<()> {
    if args.sessions == 0 || args.statements == 0 {
        bail!("--sessions and --statements must be at least 1");
    }
    let started_at = SystemTime::now();
    procs::raise_nofile(args.sessions as u64 * 4 + 1024)?;
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    if let Ok(st) = lab::status(&dir) {
        if st.nodes.iter().any(|n| n.alive) {
            bail!(
                "a lab runs in {d}; stop it with `holdfast lab down --dir {d}` or choose another --dir",
                d = dir.display()
            );
        }
    }
    eprintln!("bench-replay-memory: starting a lab in {}", dir.display());
    let st = lab::up(&LabOptions {
        base_port: args.base_port,
        ..LabOptions::new(&dir, 1)
    })?;
    let _lab = LabGuard(Some(dir.clone()));
    let primary = st.primary()?.clone();
    holdfast_lab::node_sql(
        &primary,
        "CREATE TABLE IF NOT EXISTS sbtest.replay_mem (n INT NOT NULL)",
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the Tokio runtime for the clients")?;
    let mut runs = Vec::new();
    for replay in [true, false] {
        let max = args.replay_max_bytes;
        let config = config_variant(
            &st,
            "bench-replay-memory.toml",
            &format!("transaction_replay = {replay}"),
            |c| {
                c.proxy.transaction_replay = replay;
                if let Some(max) = max {
                    c.proxy.replay_max_bytes = max;
                }
                Ok(())
            },
        )?;
        let log = dir.join("bench-replay-memory-holdfast.log");
        let admin_port = st
            .admin
            .parse::<SocketAddr>()
            .with_context(|| format!("bad admin address {:?} in lab.json", st.admin))?
            .port();
        let (holdfast, port) = start_holdfast(holdfast_exe, &st, &config, &log, &[admin_port])?;
        let run = rt.block_on(measure(args, &st, holdfast.pid, port, replay));
        drop(holdfast);
        wait_gone(admin_port);
        let run = run?;
        eprintln!(
            "bench-replay-memory: replay {}: {:.1} KiB per session over idle, replay account {:.1} KiB per session",
            if replay { "on" } else { "off" },
            (run.rss_open_kib as f64 - run.rss_idle_kib as f64) / args.sessions as f64,
            run.held.1 / 1024.0
        );
        runs.push(run);
    }
    let report = report(args, &runs, started_at);
    print!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// Waits (up to 10 s) until the stopped holdfast's admin port is free again.
fn wait_gone(admin_port: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while procs::tcp_accepts(&addr) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn measure(
    args: &ReplayMemoryArgs,
    st: &LabStatus,
    pid: u32,
    port: u16,
    replay: bool,
) -> Result<Run> {
    let addr = format!("127.0.0.1:{port}");
    let admin = admin::client(st);
    let rss_start_kib = stable_rss(pid).await?;
    let mut conns = Vec::with_capacity(args.sessions);
    for i in 0..args.sessions {
        let mut c = Conn::connect(&addr, &st.app_user, &st.app_password, None, LOGIN_TIMEOUT)
            .await
            .with_context(|| format!("session #{}", i + 1))?;
        c.query("SELECT 1").await?;
        conns.push(c);
    }
    let rss_idle_kib = stable_rss(pid).await?;
    let started = Instant::now();
    let sem = Arc::new(Semaphore::new(CONCURRENCY));
    let statements = args.statements;
    let mut tasks = Vec::new();
    for (i, mut c) in conns.into_iter().enumerate() {
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.context("semaphore closed")?;
            c.query("BEGIN").await?;
            let mut sent = 0;
            for n in 0..statements {
                let sql = format!(
                    "INSERT INTO sbtest.replay_mem VALUES ({})",
                    i * statements + n
                );
                sent += 5 + sql.len();
                c.query(&sql).await?;
            }
            anyhow::Ok((c, sent))
        }));
    }
    let mut conns = Vec::new();
    let mut sent_bytes = 0;
    for t in tasks {
        let (c, sent) = t.await.context("a session's task failed")??;
        sent_bytes = sent;
        conns.push(c);
    }
    let elapsed = started.elapsed();
    let rss_open_kib = stable_rss(pid).await?;
    // The admin client blocks on a runtime of its own: from a thread outside this one.
    let status = std::thread::scope(|s| {
        s.spawn(|| admin::get_json(&admin, "/status"))
            .join()
            .map_err(|_| anyhow::anyhow!("reading /status panicked"))
    })??;
    let sessions = status["sessions"].as_array().cloned().unwrap_or_default();
    let held: Vec<u64> = sessions
        .iter()
        .map(|s| s["replay_held_bytes"].as_u64().unwrap_or(0))
        .collect();
    let blocked: Vec<String> = sessions
        .iter()
        .filter_map(|s| s["replay_blocked_by"].as_str().map(str::to_string))
        .collect();
    if replay && held.len() != args.sessions {
        bail!(
            "/status lists {} sessions, not {}",
            held.len(),
            args.sessions
        );
    }
    let mean = held.iter().sum::<u64>() as f64 / held.len().max(1) as f64;
    let min = held.iter().copied().min().unwrap_or(0);
    let max = held.iter().copied().max().unwrap_or(0);
    for mut c in conns {
        let _ = c.query("ROLLBACK").await;
        let _ = c.quit().await;
    }
    Ok(Run {
        replay,
        rss_start_kib,
        rss_idle_kib,
        rss_open_kib,
        sent_bytes,
        held: (min, mean, max),
        not_replayable: (blocked.len(), blocked.first().cloned()),
        elapsed,
    })
}

/// Samples VmRSS every 250 ms until four samples in a row lie within 64 KiB, or 15 s pass.
async fn stable_rss(pid: u32) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut window: Vec<u64> = Vec::new();
    loop {
        let rss = procs::rss_kib(pid)?;
        window.push(rss);
        if window.len() > 4 {
            window.remove(0);
        }
        let spread = window.iter().max().unwrap_or(&0) - window.iter().min().unwrap_or(&0);
        if (window.len() == 4 && spread <= 64) || Instant::now() >= deadline {
            return Ok(rss);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn report(args: &ReplayMemoryArgs, runs: &[Run], started_at: SystemTime) -> String {
    let n = args.sessions as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "holdfast-bench bench-replay-memory: {} sessions, each a transaction of {} statements \
         `INSERT INTO sbtest.replay_mem VALUES (n)` kept open (started {} s after the epoch)\n",
        args.sessions,
        args.statements,
        started_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    let _ = writeln!(
        out,
        "| replay | RSS start | RSS idle sessions | RSS transactions open | per session over idle | statements sent per session | replay account per session (min / mean / max) | not replayable | inserts took |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let _ = writeln!(
            out,
            "| {} | {} KiB | {} KiB | {} KiB | {:.1} KiB | {:.1} KiB | {:.1} / {:.1} / {:.1} KiB | {}{} | {:.1} s |",
            if r.replay { "on" } else { "off" },
            r.rss_start_kib,
            r.rss_idle_kib,
            r.rss_open_kib,
            (r.rss_open_kib as f64 - r.rss_idle_kib as f64) / n,
            r.sent_bytes as f64 / 1024.0,
            r.held.0 as f64 / 1024.0,
            r.held.1 / 1024.0,
            r.held.2 as f64 / 1024.0,
            r.not_replayable.0,
            r.not_replayable
                .1
                .as_deref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default(),
            r.elapsed.as_secs_f64()
        );
    }
    out
}
