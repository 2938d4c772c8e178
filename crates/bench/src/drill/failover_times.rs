//! `holdfast-bench drill --scenario failover-times`: how long an application waits when the
//! primary is killed. The primary is killed (kill -9) `--kills` times; each time a client
//! that holds one session through holdfast sends a statement right after the kill and the
//! time to its answer, from the new primary, is measured (what the application sees: the
//! failure detection, the replica cross-check, the promotion and the session's move). After
//! each kill the lab starts the old primary again (as a replica) and holdfast rejoins it.
//! Prints each kill and the median and maximum.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_client::Client;
use holdfast_lab::{wait_for, LabStatus};

use super::common::DrillArgs;
use crate::admin;
use crate::serve::{self, proxy_port};

const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let _ = holdfast_lab::down(&args.dir);
    let _ = holdfast_lab::purge(&args.dir);
    let mut opts = holdfast_lab::LabOptions::new(&args.dir, 2);
    opts.base_port = Some(holdfast_lab::DEFAULT_BASE_PORT + 100);
    let lab = holdfast_lab::up(&opts)?;
    // Kills come faster than any cool-off between automatic failovers would allow (with
    // one, the kills after the first would measure the cool-off too).
    let config = serve::config_variant(
        &lab,
        "holdfast-failover-times.toml",
        "failover_cooloff_ms = 0 (one kill after the other)",
        |c| {
            c.ha.failover_cooloff_ms = 0;
            Ok(())
        },
    )?;
    let log = args.dir.join("holdfast-failover-times.log");
    let (server, _) = serve::start_holdfast(holdfast, &lab, &config, &log, &[])?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let addr = format!("127.0.0.1:{}", proxy_port(&lab)?);
    let mut times = Vec::new();
    println!(
        "kill -9 of the primary, {} times; time from the kill to the answer of the next statement of a session held through holdfast",
        args.kills
    );
    for i in 1..=args.kills {
        let old = settle(&lab)?;
        let old_id = server_id(&lab, &old)?;
        let mut client = rt
            .block_on(Client::connect_native(
                &addr,
                &lab.app_user,
                &lab.app_password,
                Some("sbtest"),
                Duration::from_secs(10),
            ))
            .context("logging in through holdfast")?;
        rt.block_on(client.query("SELECT 1"))?;
        let killed = Instant::now();
        holdfast_lab::kill_node(&lab.dir, &old)?;
        let answered_by = loop {
            match rt.block_on(client.query("SELECT @@server_id, @@read_only")) {
                Ok(r) => {
                    let row = r.rows.first().cloned().unwrap_or_default();
                    let id = row.first().cloned().flatten().unwrap_or_default();
                    let read_only = row.get(1).cloned().flatten().unwrap_or_default();
                    if id != old_id && read_only == "0" {
                        break id;
                    }
                }
                Err(e) => {
                    // The session may be closed (it should not be): a new one, then.
                    println!("   kill {i}: the statement failed ({e}); logging in again");
                    client = rt.block_on(Client::connect_native(
                        &addr,
                        &lab.app_user,
                        &lab.app_password,
                        Some("sbtest"),
                        Duration::from_secs(10),
                    ))?;
                }
            }
            if killed.elapsed() > ANSWER_TIMEOUT {
                bail!("kill {i}: no answer from a new primary within {ANSWER_TIMEOUT:?}");
            }
        };
        let ms = killed.elapsed().as_secs_f64() * 1000.0;
        println!("   kill {i}: {old} killed; answered by server_id {answered_by} after {ms:.0} ms");
        times.push(ms);
        holdfast_lab::start_node(&lab.dir, &old)?;
        admin::post(&admin::client(&lab), &format!("/rejoin?node={old}"))
            .with_context(|| format!("rejoining {old}"))?;
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
    let max = times.last().copied().unwrap_or(0.0);
    let min = times.first().copied().unwrap_or(0.0);
    println!(
        "kill -9 -> first statement answered on the new primary: median {median:.0} ms, min {min:.0} ms, max {max:.0} ms over {} kills",
        times.len()
    );
    println!("holdfast log: {}", log.display());
    drop(server);
    if !args.keep {
        holdfast_lab::down(&args.dir)?;
    }
    Ok(())
}

/// Waits until holdfast sees a primary and every node is reachable and replicating;
/// returns the primary.
fn settle(lab: &LabStatus) -> Result<String> {
    let admin = admin::client(lab);
    wait_for(
        "every node up, a primary, no operation running",
        SETTLE_TIMEOUT,
        || {
            let st = admin::status(&admin).ok()?;
            let all_up = st.topology.nodes.iter().all(|n| n.reachable);
            let idle = st.ha.in_progress.is_none() && st.ha.needs_rejoin.is_empty();
            let primary = st.topology.primary.clone()?;
            (all_up && idle && st.ha.watching.as_deref() == Some(primary.as_str()))
                .then_some(primary)
        },
    )
}

fn server_id(lab: &LabStatus, node: &str) -> Result<String> {
    let status = holdfast_lab::status(&lab.dir)?;
    let rows = holdfast_lab::node_sql(status.node(node)?, "SELECT @@server_id")?;
    rows.first()
        .and_then(|r| r.first())
        .cloned()
        .context("no server_id")
}
