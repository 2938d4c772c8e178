//! `holdfast-bench drill --scenario serverless`: a serverless lab instance that pauses whenever it
//! is idle, with a pool of idle client connections kept open throughout, and sysbench
//! connecting to the paused instance again and again. Reports what a user would notice:
//! connections kept (with their state), sysbench errors, the login delay on a paused
//! instance, and the pauses and resumes holdfast made.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_lab::mysql_client::Conn;
use holdfast_lab::wait_for;

use super::common::{self, output_text, value_after, DrillArgs};
use crate::admin;
use crate::serve::{self, config_variant};

/// Pause after this much idle time in the drill (the default is 300 s).
const IDLE_PAUSE_SECS: u64 = 2;
/// A frozen instance is stopped after this long in the drill, so both tiers occur.
const STOP_AFTER_SECS: u64 = 3;

fn instance(admin: &holdfast_admin::AdminClient) -> Result<serde_json::Value> {
    Ok(admin::get_json(admin, "/status")?["serverless"].clone())
}

fn wait_paused(admin: &holdfast_admin::AdminClient, tier: &str) -> Result<()> {
    wait_for(
        &format!("the instance to pause ({tier})"),
        Duration::from_secs(60),
        || {
            let v = instance(admin).ok()?;
            (v["phase"] == "paused" && v["tier"] == tier).then_some(())
        },
    )
}

struct Cycle {
    tier: &'static str,
    login_ms: f64,
    transactions: u64,
    errors: u64,
    fatal: bool,
    kept: usize,
}

pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let dir = args.dir.with_file_name(format!(
        "{}-serverless",
        args.dir.file_name().map_or("holdfast-drill".into(), |n| n
            .to_string_lossy()
            .into_owned())
    ));
    let _ = holdfast_lab::down(&dir);
    let _ = holdfast_lab::purge(&dir);
    println!("starting a serverless lab instance in {}", dir.display());
    let mut opts = holdfast_lab::LabOptions::new(&dir, 0);
    opts.serverless = true;
    opts.base_port = Some(holdfast_lab::DEFAULT_BASE_PORT + 200);
    let lab = holdfast_lab::up(&opts)?;
    let config = config_variant(
        &lab,
        "holdfast-drill.toml",
        &format!("idle_pause_secs = {IDLE_PAUSE_SECS}, stop_after_secs = {STOP_AFTER_SECS}"),
        |c| {
            let sl = c
                .serverless
                .as_mut()
                .context("no [serverless] in the lab's holdfast.toml")?;
            sl.idle_pause_secs = IDLE_PAUSE_SECS;
            sl.stop_after_secs = STOP_AFTER_SECS;
            Ok(())
        },
    )?;
    let log = dir.join("holdfast-drill.log");
    let (server, port) = serve::start_holdfast(holdfast, &lab, &config, &log, &[])?;
    let sb = common::sysbench(&lab, args);
    common::prepare(&sb, port)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let login = |rt: &tokio::runtime::Runtime| -> Result<Conn> {
        rt.block_on(Conn::connect(
            &lab.proxy,
            &lab.app_user,
            &lab.app_password,
            Some(&lab.database),
            Duration::from_secs(30),
        ))
    };
    // The application's pool: idle connections, each with its own session state.
    let pool_size = args.threads as usize;
    let mut pool = Vec::with_capacity(pool_size);
    for i in 0..pool_size {
        let mut c = login(&rt)?;
        rt.block_on(c.query(&format!("SET @pool_slot = {i}")))?;
        pool.push(c);
    }
    println!(
        "{pool_size} pooled connections open; the instance pauses after {IDLE_PAUSE_SECS} s idle (freeze), stops after {STOP_AFTER_SECS} s more"
    );
    let mut cycles = Vec::new();
    for tier in ["freeze", "stop", "freeze", "stop"] {
        wait_paused(&admin::client(&lab), tier)?;
        // A new client logs in to the paused instance.
        let t = Instant::now();
        let mut fresh = login(&rt)?;
        rt.block_on(fresh.query("SELECT 1"))?;
        let login_ms = t.elapsed().as_secs_f64() * 1e3;
        let _ = rt.block_on(fresh.quit());
        // Then sysbench: threads connecting at once, running for a few seconds.
        let options = [
            format!("--threads={}", args.threads),
            "--time=4".into(),
            "--db-ps-mode=auto".into(),
        ];
        let out = common::run_sysbench(&sb.command("oltp_read_write", port, &options, "run"))?;
        let text = output_text(&out);
        let fatal = !out.status.success() || text.contains("FATAL");
        // The idle pool: every connection still open, with its state.
        let mut kept = 0;
        for (i, c) in pool.iter_mut().enumerate() {
            let rows = rt.block_on(c.query(&format!("SELECT 1 FROM DUAL WHERE @pool_slot = {i}")));
            if matches!(rows, Ok(1)) {
                kept += 1;
            }
        }
        let row = Cycle {
            tier,
            login_ms,
            transactions: value_after(&text, "transactions:"),
            errors: value_after(&text, "ignored errors:"),
            fatal,
            kept,
        };
        println!(
            "   paused ({tier}): first login + SELECT 1 {:.1} ms; sysbench {} transactions, {} errors{}; pool {kept}/{pool_size} kept",
            row.login_ms,
            row.transactions,
            row.errors,
            if fatal { ", FATAL" } else { "" }
        );
        cycles.push(row);
    }
    let v = instance(&admin::client(&lab))?;
    println!();
    println!("paused tier   first login + SELECT 1   sysbench transactions   ignored errors   pooled connections kept");
    for c in &cycles {
        println!(
            "{:<13} {:>18.1} ms   {:>21}   {:>14}   {}/{} ({:.0}%){}",
            c.tier,
            c.login_ms,
            c.transactions,
            c.errors,
            c.kept,
            pool_size,
            100.0 * c.kept as f64 / pool_size.max(1) as f64,
            if c.fatal { "  sysbench FATAL" } else { "" }
        );
    }
    println!(
        "holdfast: {} pauses, {} resumes, {} failed resumes; usage ledger:",
        v["pauses"], v["resumes"], v["resume_failures"]
    );
    if let Ok(body) = admin::get(&admin::client(&lab), "/usage") {
        let lines: Vec<holdfast_serverless::ledger::UsageLine> = serde_json::from_str(&body)?;
        print!("{}", holdfast_serverless::ledger::render_bill(&lines));
    }
    println!("holdfast log: {}", log.display());
    drop(pool);
    if !args.keep {
        drop(server);
        holdfast_lab::down(&dir)?;
    }
    // Ignored errors are sysbench's retried deadlocks (1213, 1205), which its own row
    // contention causes with or without pauses; they are reported, not failed on.
    if cycles.iter().any(|c| c.fatal || c.kept < pool_size) {
        bail!("the serverless drill saw sysbench fail or lost pooled connections (see above)");
    }
    Ok(())
}
