//! `holdfast-bench drill --scenario fleet-serverless`: a serverless lab instance behind two
//! holdfast processes, members of one fleet through the lab's etcd (`holdfast lab up
//! --serverless --proxies 2`). Each member keeps a pool of idle connections open
//! throughout; the instance pauses whenever the fleet is idle (frozen, then stopped);
//! while it is paused, a burst of new clients logs in on both members at once. Then the
//! leading member is killed (kill -9) while the instance is paused, and a client of the
//! other member wakes it. Reported: each burst's logins and their longest wait, the
//! resumes each burst caused (one), the pools kept with their state, how long the lead
//! took to move, and the seconds the usage meter counted against the time that passed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_admin::AdminClient;
use holdfast_config::Config;
use holdfast_lab::mysql_client::Conn;
use holdfast_lab::{wait_for, LabStatus};

use super::common::{self, DrillArgs};
use crate::admin;
use crate::serve::{self, Helper};

/// Pause after this much idle time in the drill (the default is 300 s).
const IDLE_PAUSE_SECS: u64 = 2;
/// A frozen instance is stopped after this long, so both tiers occur.
const STOP_AFTER_SECS: u64 = 3;
const TIMEOUT: Duration = Duration::from_secs(60);

struct Member {
    name: String,
    proxy: String,
    admin: AdminClient,
    process: Option<Helper>,
}

/// One paused cycle: what the burst of logins on both members saw.
struct Burst {
    tier: String,
    logins: usize,
    failed: usize,
    longest_ms: f64,
    resumes: u64,
    kept: usize,
}

fn instance(admin: &AdminClient) -> Result<serde_json::Value> {
    Ok(admin::get_json(admin, "/status")?["serverless"].clone())
}

/// The seconds (running and paused) in a member's ledger, its live period included.
fn metered_secs(admin: &AdminClient) -> Result<u64> {
    let lines: Vec<holdfast_serverless::ledger::UsageLine> =
        serde_json::from_str(&admin::get(admin, "/usage")?)?;
    Ok(lines
        .iter()
        .map(|l| u64::from(l.running_secs) + u64::from(l.paused_secs))
        .sum())
}

/// A member's config from the lab, pausing sooner.
fn member_config(path: &Path) -> Result<PathBuf> {
    let mut config = Config::load(path)?;
    let sl = config
        .serverless
        .as_mut()
        .context("no [serverless] in the lab's member config")?;
    sl.idle_pause_secs = IDLE_PAUSE_SECS;
    sl.stop_after_secs = STOP_AFTER_SECS;
    let out = path.with_extension("drill.toml");
    std::fs::write(
        &out,
        format!(
            "# Written by holdfast-bench from {}: idle_pause_secs = {IDLE_PAUSE_SECS}, stop_after_secs = {STOP_AFTER_SECS}\n\n{}",
            path.display(),
            config.to_toml()?
        ),
    )
    .with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

fn wait_leader(members: &[Member]) -> Result<usize> {
    wait_for("a member to lead", TIMEOUT, || {
        members.iter().position(|m| {
            m.process.is_some()
                && admin::status(&m.admin)
                    .ok()
                    .and_then(|s| s.fleet)
                    .is_some_and(|f| f.leader)
        })
    })
}

/// Waits until every running member says the instance is paused in `tier`.
fn wait_paused(members: &[Member], tier: &str) -> Result<()> {
    for m in members.iter().filter(|m| m.process.is_some()) {
        wait_for(
            &format!("the instance paused ({tier}) as member {} says", m.name),
            TIMEOUT,
            || {
                let v = instance(&m.admin).ok()?;
                (v["phase"] == "paused" && v["tier"] == tier).then_some(())
            },
        )?;
    }
    Ok(())
}

pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let dir = args.dir.with_file_name(format!(
        "{}-fleet-serverless",
        args.dir.file_name().map_or("holdfast-drill".into(), |n| n
            .to_string_lossy()
            .into_owned())
    ));
    let _ = holdfast_lab::down(&dir);
    let _ = holdfast_lab::purge(&dir);
    println!(
        "starting a serverless lab instance with an etcd and two members in {}",
        dir.display()
    );
    let mut opts = holdfast_lab::LabOptions::new(&dir, 0);
    opts.serverless = true;
    opts.proxies = 2;
    opts.base_port = Some(holdfast_lab::DEFAULT_BASE_PORT + 400);
    let lab: LabStatus = holdfast_lab::up(&opts)?;
    let mut members = Vec::new();
    for p in &lab.proxies {
        let config = member_config(&p.config)?;
        let log = dir.join(format!("holdfast-{}.log", p.member));
        let (process, _) = serve::start_holdfast(holdfast, &lab, &config, &log, &[])?;
        members.push(Member {
            name: p.member.clone(),
            proxy: p.proxy.clone(),
            admin: AdminClient::new(p.admin.clone(), lab.admin_token.clone()),
            process: Some(process),
        });
    }
    let leader = wait_leader(&members)?;
    println!("member {} leads", members[leader].name);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (user, password, database) = (
        lab.app_user.clone(),
        lab.app_password.clone(),
        lab.database.clone(),
    );
    let login = move |proxy: String| {
        let (user, password, database) = (user.clone(), password.clone(), database.clone());
        async move {
            Conn::connect(
                &proxy,
                &user,
                &password,
                Some(&database),
                Duration::from_secs(30),
            )
            .await
        }
    };
    // Each member's pool: idle connections with a state of their own.
    let pool_size = args.threads as usize;
    let mut pools: Vec<Vec<Conn>> = Vec::new();
    for m in &members {
        let mut pool = Vec::with_capacity(pool_size);
        for i in 0..pool_size {
            let mut c = rt.block_on(login(m.proxy.clone()))?;
            rt.block_on(c.query(&format!("SET @pool_slot = {i}")))?;
            pool.push(c);
        }
        pools.push(pool);
    }
    println!(
        "{pool_size} pooled connections open on each member; the instance pauses after {IDLE_PAUSE_SECS} s idle (freeze), stops after {STOP_AFTER_SECS} s more"
    );
    let mut bursts = Vec::new();
    for tier in ["freeze", "stop", "freeze", "stop"] {
        wait_paused(&members, tier)?;
        let leader = wait_leader(&members)?;
        let resumes_before = instance(&members[leader].admin)?["resumes"]
            .as_u64()
            .unwrap_or(0);
        // New clients on both members at once.
        let burst: Vec<_> = (0..2 * pool_size)
            .map(|i| {
                let proxy = members[i % members.len()].proxy.clone();
                let login = login.clone();
                rt.spawn(async move {
                    let t = Instant::now();
                    let mut c = login(proxy).await?;
                    c.query("SELECT 1").await?;
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    let _ = c.quit().await;
                    anyhow::Ok(ms)
                })
            })
            .collect();
        let mut times = Vec::new();
        let mut failed = 0;
        for b in burst {
            match rt.block_on(b) {
                Ok(Ok(ms)) => times.push(ms),
                _ => failed += 1,
            }
        }
        let resumes = instance(&members[leader].admin)?["resumes"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(resumes_before);
        let mut kept = 0;
        for pool in &mut pools {
            for (i, c) in pool.iter_mut().enumerate() {
                let rows =
                    rt.block_on(c.query(&format!("SELECT 1 FROM DUAL WHERE @pool_slot = {i}")));
                if matches!(rows, Ok(1)) {
                    kept += 1;
                }
            }
        }
        let b = Burst {
            tier: tier.to_string(),
            logins: times.len() + failed,
            failed,
            longest_ms: times.iter().copied().fold(0.0, f64::max),
            resumes,
            kept,
        };
        println!(
            "   paused ({tier}): {} logins on both members at once, {} failed, longest {:.1} ms; resumes: {}; pools {}/{} kept",
            b.logins, b.failed, b.longest_ms, b.resumes, b.kept, 2 * pool_size
        );
        bursts.push(b);
    }

    // The leading member killed while the instance is paused; a client of the other
    // member wakes it.
    wait_paused(&members, "freeze")?;
    let leader = wait_leader(&members)?;
    let other = 1 - leader;
    let before = metered_secs(&members[other].admin)?;
    let t0 = Instant::now();
    common::kill_holdfast(&mut members[leader].process)?;
    let t = Instant::now();
    let mut c = rt.block_on(login(members[other].proxy.clone()))?;
    rt.block_on(c.query("SELECT 1"))?;
    let woke_ms = t.elapsed().as_secs_f64() * 1e3;
    let _ = rt.block_on(c.quit());
    let next = wait_leader(&members)?;
    let mut survivors_kept = 0;
    for (i, c) in pools[other].iter_mut().enumerate() {
        let rows = rt.block_on(c.query(&format!("SELECT 1 FROM DUAL WHERE @pool_slot = {i}")));
        if matches!(rows, Ok(1)) {
            survivors_kept += 1;
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let after = metered_secs(&members[other].admin)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let counted = after.saturating_sub(before);
    println!(
        "   leading member {} killed (kill -9) while paused: a client of member {} logged in and answered after {woke_ms:.0} ms (member {} leads now); its pool {survivors_kept}/{pool_size} kept; usage counted {counted} s over {elapsed:.1} s",
        members[leader].name, members[other].name, members[next].name
    );

    println!();
    println!("paused tier   logins (both members)   failed   longest login   resumes   pooled connections kept");
    for b in &bursts {
        println!(
            "{:<13} {:>21}   {:>6}   {:>10.1} ms   {:>7}   {}/{}",
            b.tier,
            b.logins,
            b.failed,
            b.longest_ms,
            b.resumes,
            b.kept,
            2 * pool_size
        );
    }
    let v = instance(&members[next].admin)?;
    println!(
        "the leader now: {} pauses, {} resumes, {} failed resumes (counters go on from the last leader's only across an upgrade)",
        v["pauses"], v["resumes"], v["resume_failures"]
    );
    if let Ok(body) = admin::get(&members[next].admin, "/usage") {
        let lines: Vec<holdfast_serverless::ledger::UsageLine> = serde_json::from_str(&body)?;
        print!("{}", holdfast_serverless::ledger::render_bill(&lines));
    }
    let mut failed = Vec::new();
    for b in &bursts {
        if b.failed > 0 || b.resumes != 1 || b.kept < 2 * pool_size {
            failed.push(format!(
                "paused ({}): {} failed logins, {} resumes (expected 1), {}/{} pooled kept",
                b.tier,
                b.failed,
                b.resumes,
                b.kept,
                2 * pool_size
            ));
        }
    }
    if survivors_kept < pool_size {
        failed.push(format!(
            "after the leader's kill: {survivors_kept}/{pool_size} of the other member's pool kept"
        ));
    }
    if (counted as f64 - elapsed).abs() > 2.0 {
        failed.push(format!(
            "usage counted {counted} s over {elapsed:.1} s across the leader's kill"
        ));
    }
    drop(pools);
    for m in &mut members {
        drop(m.process.take());
    }
    if !args.keep {
        holdfast_lab::down(&dir)?;
    }
    match failed.is_empty() {
        true => {
            println!("fleet-serverless: PASS");
            Ok(())
        }
        false => bail!("fleet-serverless: FAIL\n{}", failed.join("\n")),
    }
}
