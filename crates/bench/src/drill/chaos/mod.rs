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
mod net;
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
    // holdfast's connections leave from their own address (the network cuts tell them
    // from the replicas' by it), which the nodes take the PROXY header from.
    opts.extra_server_args = vec![
        format!("--slave-net-timeout={SLAVE_NET_TIMEOUT}"),
        format!(
            "--proxy-protocol-networks=127.0.0.1,{}",
            net::HOLDFAST_SOURCE
        ),
    ];
    let kinds = c
        .kinds
        .iter()
        .map(|k| {
            faults::Fault::from_key(k.trim()).with_context(|| {
                let all: Vec<&str> = faults::Fault::ALL.iter().map(|f| f.key()).collect();
                format!("no fault kind {k:?} (kinds: {})", all.join(", "))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let firewall = match net::Firewall::new(c.base_port) {
        Ok(fw) => Some(fw),
        Err(e) => {
            if kinds.iter().any(|k| k.is_network()) {
                return Err(e.context("network cuts were asked for"));
            }
            println!("   nftables unavailable ({e:#}): no network cuts");
            None
        }
    };
    let lab = holdfast_lab::up(&opts)?;
    // From here on the lab goes down however the run ends (after holdfast, which the
    // `server` guard stops).
    let _down = Down {
        dir: &args.dir,
        keep: args.keep,
    };
    let config = serve::config_variant(
        &lab,
        "holdfast-chaos.toml",
        "failover_cooloff_ms = 0 (one fault after the other); backend_source_address",
        |cfg| {
            cfg.ha.failover_cooloff_ms = 0;
            cfg.proxy.backend_source_address = Some(net::HOLDFAST_SOURCE);
            Ok(())
        },
    )?;
    let log = args.dir.join("holdfast-chaos.log");
    let (server, _) = serve::start_holdfast(holdfast, &lab, &config, &log, &[split_port(&lab)?])?;
    let admin = admin::client(&lab);
    wait_for("holdfast to see a primary", Duration::from_secs(30), || {
        admin::status(&admin).ok()?.topology.primary
    })?;
    let outcome = drive(args, &lab, seed, &kinds, firewall.as_ref());
    drop(firewall);
    println!("holdfast log: {}", log.display());
    drop(server);
    if !outcome? {
        print_session_ends(&log);
        bail!("chaos: FAIL");
    }
    Ok(())
}

/// The most lines of holdfast's log a failed run prints.
const LOG_LINES_SHOWN: usize = 60;

/// After a failed run: the lines of holdfast's log that say why a session ended or what
/// went wrong (warnings, errors, panics), so that a failure where the log is not kept (CI)
/// can be read from the output.
fn print_session_ends(log: &Path) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    let telling: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("session closed")
                || l.contains("closed:")
                || l.contains("panicked")
                || l.contains(" ERROR ")
                || (l.contains(" WARN ") && l.contains("holdfast_proxy"))
        })
        .collect();
    if telling.is_empty() {
        println!("holdfast's log says nothing of a session closed, a warning or an error");
        return;
    }
    let skipped = telling.len().saturating_sub(LOG_LINES_SHOWN);
    println!("holdfast's log, sessions closed, warnings and errors of the proxy:");
    if skipped > 0 {
        println!("   ({skipped} earlier lines left out)");
    }
    for line in &telling[skipped..] {
        println!("   {line}");
    }
}

/// Takes the lab down when dropped (unless `--keep`).
struct Down<'a> {
    dir: &'a Path,
    keep: bool,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        if !self.keep {
            if let Err(e) = holdfast_lab::down(self.dir) {
                eprintln!("chaos: taking the lab down: {e:#}");
            }
        }
    }
}

/// The run itself, on a lab with holdfast in front: whether it passed.
fn drive(
    args: &DrillArgs,
    lab: &LabStatus,
    seed: u64,
    kinds: &[faults::Fault],
    firewall: Option<&net::Firewall>,
) -> Result<bool> {
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
    // Every node has the accounts before the clients start: the split listener's first
    // reads may go to a replica, and another session's writes are not theirs to wait for.
    for node in holdfast_lab::status(&lab.dir)?.nodes {
        wait_for(
            "the accounts on every node",
            Duration::from_secs(30),
            || {
                let n = holdfast_lab::node_sql_value(
                    &node,
                    &format!("SELECT COUNT(*) FROM {}", txn::BANK_TABLE),
                );
                (n.ok()?? == workload::ACCOUNTS.to_string()).then_some(())
            },
        )?;
    }
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
        let fault = match kinds.is_empty() {
            true => faults::Fault::pick(&mut rng, firewall.is_some()),
            false => kinds[(i as usize - 1) % kinds.len()],
        };
        let mut env = faults::Env {
            lab,
            firewall,
            rng: &mut rng,
            cut_mode: c.cut_mode,
        };
        let d = faults::inject(&mut env, fault, epoch);
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
    for row in holdfast_lab::node_sql(
        node,
        &format!("SELECT transfer, account, delta FROM {}", txn::LEDGER_TABLE),
    )? {
        let n = |i: usize| row.get(i).and_then(|v| v.parse::<i64>().ok());
        let (Some(t), Some(a), Some(d)) = (n(0), n(1), n(2)) else {
            bail!("unexpected ledger row {row:?}");
        };
        fin.ledger.push((t as u64, a as u32, d));
    }
    Ok(fin)
}
