//! `holdfast-bench drill --scenario chaos`: clients through holdfast's main and split
//! listeners ([`workload`]) record every operation ([`history`]) while random faults hit
//! the lab one at a time ([`faults`]); afterwards every key is read on the final primary
//! and the whole history is checked ([`check`], [`graph`], [`errors`]); [`report`] prints
//! one line per fault and the verdict. Exits non-zero on FAIL.

mod check;
#[cfg(test)]
mod check_tests;
mod errors;
mod faults;
mod graph;
mod history;
mod report;
mod txn;
mod workload;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_lab::{wait_for, LabStatus};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::common::DrillArgs;
use crate::admin;
use crate::serve::{self, proxy_port, split_port};

/// The nodes' `slave_net_timeout` (seconds; MariaDB's default is 60).
const SLAVE_NET_TIMEOUT: u32 = 3;

/// Load before the first fault and after the last.
const QUIET: Duration = Duration::from_secs(3);

pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let c = &args.chaos;
    let seed = c.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    println!(
        "chaos: seed {seed}, {} faults at most, {} clients, a fresh lab (1 primary, 2 replicas) in {}",
        c.faults,
        c.clients,
        args.dir.display()
    );
    let _ = holdfast_lab::down(&args.dir);
    let _ = holdfast_lab::purge(&args.dir);
    let mut opts = holdfast_lab::LabOptions::new(&args.dir, 2);
    opts.base_port = Some(c.base_port);
    // Replicas notice a frozen primary within seconds (holdfast fails over only once they
    // confirm the loss), as a production setup tuned for failover would.
    opts.extra_server_args = vec![format!("--slave-net-timeout={SLAVE_NET_TIMEOUT}")];
    let lab = holdfast_lab::up(&opts)?;
    let config = serve::config_variant(
        &lab,
        "holdfast-chaos.toml",
        "failover_cooloff_ms = 0 (one fault after the other)",
        |cfg| {
            cfg.ha.failover_cooloff_ms = 0;
            Ok(())
        },
    )?;
    let log = args.dir.join("holdfast-chaos.log");
    let (server, _) = serve::start_holdfast(holdfast, &lab, &config, &log, &[split_port(&lab)?])?;
    let admin = admin::client(&lab);
    wait_for("holdfast to see a primary", Duration::from_secs(30), || {
        admin::status(&admin).ok()?.topology.primary
    })?;
    let outcome = drive(args, &lab, seed);
    println!("holdfast log: {}", log.display());
    drop(server);
    if !args.keep {
        holdfast_lab::down(&args.dir)?;
    }
    if !outcome? {
        bail!("chaos: FAIL");
    }
    Ok(())
}

/// The run itself, on a lab with holdfast in front: whether it passed.
fn drive(args: &DrillArgs, lab: &LabStatus, seed: u64) -> Result<bool> {
    let c = &args.chaos;
    let admin = admin::client(lab);
    let target = workload::Target {
        host: "127.0.0.1".into(),
        main_port: proxy_port(lab)?,
        split_port: split_port(lab)?,
        user: lab.app_user.clone(),
        password: lab.app_password.clone(),
    };
    let total = workload::prepare(&target)?;
    let counters_before = super::ha::recovery_counters(&admin);
    let epoch = Instant::now();
    let load = workload::Workload::start(&target, c.clients, seed, epoch)?;
    std::thread::sleep(QUIET);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done = Vec::new();
    for i in 1..=c.faults {
        if epoch.elapsed() > Duration::from_secs(c.duration_limit) {
            println!(
                "   duration limit ({} s) reached after {} faults",
                c.duration_limit,
                i - 1
            );
            break;
        }
        let fault = faults::Fault::pick(&mut rng);
        let d = faults::inject(lab, fault, epoch);
        println!(
            "   fault {i}: {} at {:.1} s: {}{}",
            fault.name(),
            d.start_ms as f64 / 1000.0,
            d.note,
            if d.failed { " [FAULT FAILED]" } else { "" }
        );
        let abort = d.failed;
        done.push(d);
        if abort {
            println!("   the lab did not come back: no more faults");
            break;
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(1_000..3_000)));
    }
    std::thread::sleep(QUIET);
    let ops = load.finish()?;
    let recovered = report::recovered(&counters_before, &super::ha::recovery_counters(&admin));
    let fin = final_state(lab).context("reading the final state on the primary")?;
    report::save_history(&args.dir.join("chaos-history.txt"), &ops)?;
    let findings = check::check(&ops, &fin, total);
    let classified = errors::classify(ops.iter().enumerate(), Some(recovered));
    report::print(&report::Run {
        faults: &done,
        ops: &ops,
        findings: &findings,
        errors: &classified,
        recovered,
    });
    println!("history: {}", args.dir.join("chaos-history.txt").display());
    let pass = findings.lost.is_empty()
        && findings.duplicated.is_empty()
        && findings.anomalies.is_empty()
        && classified.unexplained.is_empty()
        && !done.iter().any(|d| d.failed);
    Ok(pass)
}

/// Every key's list and every balance, read as root on the node holdfast calls primary.
fn final_state(lab: &LabStatus) -> Result<check::Final> {
    let admin = admin::client(lab);
    let primary = wait_for("a primary", Duration::from_secs(30), || {
        admin::status(&admin).ok()?.topology.primary
    })?;
    let st = holdfast_lab::status(&lab.dir)?;
    let node = st.node(&primary)?;
    let mut fin = check::Final::default();
    for row in holdfast_lab::node_sql(node, &format!("SELECT k, v FROM {}", txn::LIST_TABLE))? {
        let (Some(k), v) = (row.first().and_then(|k| k.parse().ok()), row.get(1)) else {
            bail!("unexpected row {row:?}");
        };
        fin.lists
            .insert(k, history::parse_list(v.map(String::as_str)));
    }
    for row in holdfast_lab::node_sql(
        node,
        &format!("SELECT balance FROM {} ORDER BY id", txn::BANK_TABLE),
    )? {
        let b = row.first().and_then(|b| b.parse().ok());
        fin.balances
            .push(b.with_context(|| format!("unexpected row {row:?}"))?);
    }
    Ok(fin)
}
