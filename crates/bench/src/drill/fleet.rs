//! The fleet scenario of `holdfast-bench drill`: two holdfast processes, members of one
//! fleet through a local etcd (`[cluster]`), in front of one lab, sysbench through each,
//! while (1) a switchover is asked of the member that does not lead, (2) the primary is
//! killed (kill -9), (3) the leading member is killed (kill -9). Reported per event: each
//! surviving member's connections kept, sysbench's errors, the promotions the fleet made
//! (exactly one per cluster event), the writable nodes after it, and how long the lead
//! took to move.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_admin::AdminClient;
use holdfast_config::ClusterConfig;
use holdfast_lab::etcd::Etcd;
use holdfast_lab::{wait_for, LabStatus};

use super::common::{self, output_text, value_after, DrillArgs};
use super::ha::closed_sessions;
use crate::admin;
use crate::serve::{self, Helper};

/// The lease every member keeps (`[cluster] lease_ttl_secs`).
const LEASE_TTL_SECS: u64 = 3;

const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// One member: its name, config, client port, admin API and process.
struct Member {
    name: &'static str,
    port: u16,
    admin: AdminClient,
    process: Option<Helper>,
}

/// What one sysbench through one member did.
struct Load {
    member: &'static str,
    threads: u32,
    kept: u32,
    fatal: bool,
    transactions: u64,
    ignored_errors: u64,
    reconnects: u64,
    max_latency_ms: f64,
}

struct Row {
    event: String,
    loads: Vec<Load>,
    promotions: u64,
    writable: Vec<String>,
}

pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    let lab = super::ha::lab(args)?;
    let etcd = Etcd::start(&args.dir.join("etcd")).context("starting etcd")?;
    println!(
        "etcd at {} (data in {})",
        etcd.endpoint,
        args.dir.join("etcd").display()
    );
    let mut members = Vec::new();
    for (name, moved) in [("a", false), ("b", true)] {
        let config = member_config(&lab, &etcd, name, moved)?;
        let log = args.dir.join(format!("holdfast-fleet-{name}.log"));
        let (process, port) = serve::start_holdfast(holdfast, &lab, &config, &log, &[])?;
        let listen = holdfast_config::Config::load(&config)?.admin.listen;
        members.push(Member {
            name,
            port,
            admin: AdminClient::new(listen, lab.admin_token.clone()),
            process: Some(process),
        });
    }
    let leader = wait_leader(&members, None)?;
    println!("member {} leads", members[leader].name);
    println!(
        "preparing sysbench: {} tables x {} rows",
        args.tables, args.table_size
    );
    common::prepare(&common::sysbench(&lab, args), lab.primary()?.port)?;

    let mut rows = Vec::new();
    for event in [
        Event::SwitchoverAskedOfFollower,
        Event::PrimaryKilled,
        Event::LeaderKilled,
    ] {
        rows.push(run_event(&lab, args, &mut members, event)?);
    }
    drop(etcd);

    println!();
    println!("member  connections kept   sysbench errors (ignored/fatal)   reconnects   transactions   max latency");
    let mut failed = Vec::new();
    for r in &rows {
        println!(
            "{}\n  promotions by the fleet: {}; writable after: {}",
            r.event,
            r.promotions,
            r.writable.join(", ")
        );
        for l in &r.loads {
            let pct = 100.0 * f64::from(l.kept) / f64::from(l.threads.max(1));
            println!(
                "{:<7} {:>3}/{:<3} ({:>5.1}%)   {:>6} / {:<24} {:>10}   {:>12}   {:>8.0} ms",
                l.member,
                l.kept,
                l.threads,
                pct,
                l.ignored_errors,
                if l.fatal { "FATAL" } else { "0" },
                l.reconnects,
                l.transactions,
                l.max_latency_ms,
            );
            if l.fatal || l.kept < l.threads {
                failed.push(format!("{}: member {} lost connections", r.event, l.member));
            }
        }
        if r.writable.len() != 1 {
            failed.push(format!(
                "{}: writable nodes after it: {:?}",
                r.event, r.writable
            ));
        }
    }
    for (r, want) in rows.iter().zip([1, 1, 0]) {
        if r.promotions != want {
            failed.push(format!(
                "{}: {} promotions (expected {want})",
                r.event, r.promotions
            ));
        }
    }
    for m in &mut members {
        drop(m.process.take());
    }
    if !args.keep {
        holdfast_lab::down(&args.dir)?;
    }
    match failed.is_empty() {
        true => {
            println!("fleet: PASS");
            Ok(())
        }
        false => bail!("fleet: FAIL\n{}", failed.join("\n")),
    }
}

#[derive(Clone, Copy)]
enum Event {
    SwitchoverAskedOfFollower,
    PrimaryKilled,
    LeaderKilled,
}

/// The lab's config as member `name` of the fleet, on ports of its own when `moved`.
fn member_config(lab: &LabStatus, etcd: &Etcd, name: &str, moved: bool) -> Result<PathBuf> {
    let endpoint = etcd.endpoint.clone();
    serve::config_variant(
        lab,
        &format!("holdfast-fleet-{name}.toml"),
        &format!("member {name} of the drill's fleet"),
        |c| {
            c.cluster = Some(ClusterConfig {
                name: "drill".into(),
                etcd: vec![endpoint],
                member: Some(name.into()),
                lease_ttl_secs: LEASE_TTL_SECS,
            });
            if moved {
                let ports = holdfast_lab::procs::free_ports(2 + c.listeners.len())?;
                c.proxy.listen = format!("127.0.0.1:{}", ports[0]);
                c.admin.listen = format!("127.0.0.1:{}", ports[1]);
                for (l, port) in c.listeners.iter_mut().zip(&ports[2..]) {
                    l.listen = format!("127.0.0.1:{port}");
                }
            }
            Ok(())
        },
    )
}

/// Waits until one running member (not `not`) says it leads; its index.
fn wait_leader(members: &[Member], not: Option<usize>) -> Result<usize> {
    wait_for("a member to lead", EVENT_TIMEOUT, || {
        members
            .iter()
            .enumerate()
            .filter(|(i, m)| Some(*i) != not && m.process.is_some())
            .find(|(_, m)| {
                admin::status(&m.admin)
                    .ok()
                    .and_then(|s| s.fleet)
                    .is_some_and(|f| f.leader)
            })
            .map(|(i, _)| i)
    })
}

/// Promotions (failovers and switchovers) the members have made so far.
fn promotions(members: &[Member]) -> u64 {
    members
        .iter()
        .filter(|m| m.process.is_some())
        .filter_map(|m| admin::status(&m.admin).ok())
        .map(|s| s.ha.counters.failovers + s.ha.counters.switchovers)
        .sum()
}

fn run_event(
    lab: &LabStatus,
    args: &DrillArgs,
    members: &mut [Member],
    event: Event,
) -> Result<Row> {
    let name = match event {
        Event::SwitchoverAskedOfFollower => "switchover asked of the member that does not lead",
        Event::PrimaryKilled => "primary killed (kill -9)",
        Event::LeaderKilled => "leading member killed (kill -9)",
    };
    println!(
        "== {name}: sysbench oltp_read_write, {} threads through each member, {} s, event at {} s",
        args.threads,
        args.seconds,
        args.seconds / 3
    );
    let before = promotions(members);
    let closed_before: Vec<f64> = members.iter().map(|m| closed_sessions(&m.admin)).collect();
    let loads: Vec<Child> = members
        .iter()
        .filter(|m| m.process.is_some())
        .map(|m| {
            let options = common::run_options(args.threads, args.seconds);
            let cmd =
                common::sysbench(lab, args).command("oltp_read_write", m.port, &options, "run");
            common::start_sysbench(&cmd)
        })
        .collect::<Result<_>>()?;
    std::thread::sleep(Duration::from_secs(args.seconds / 3));
    let leader = wait_leader(members, None)?;
    let follower = 1 - leader;
    let t = Instant::now();
    let primary = admin::status(&members[leader].admin)?
        .topology
        .primary
        .context("no primary before the event")?;
    let mut killed = None;
    let said = match event {
        Event::SwitchoverAskedOfFollower => {
            let st = admin::status(&members[follower].admin)?;
            let target = st
                .topology
                .nodes
                .iter()
                .find(|n| n.name != primary && n.reachable)
                .map(|n| n.name.clone())
                .context("no replica to switch over to")?;
            admin::post(
                &members[follower].admin,
                &format!("/switchover?to={target}"),
            )?;
            format!(
                "asked of member {}: {primary} -> {target} in {} ms",
                members[follower].name,
                t.elapsed().as_millis()
            )
        }
        Event::PrimaryKilled => {
            holdfast_lab::kill_node(&lab.dir, &primary)?;
            let new = wait_for("a new primary on every member", EVENT_TIMEOUT, || {
                let seen: Option<Vec<String>> = members
                    .iter()
                    .map(|m| admin::status(&m.admin).ok()?.topology.primary)
                    .collect();
                let seen = seen?;
                (seen.iter().all(|p| *p != primary && *p == seen[0])).then(|| seen[0].clone())
            })?;
            format!(
                "killed {primary}; {new} the primary on both members after {} ms",
                t.elapsed().as_millis()
            )
        }
        Event::LeaderKilled => {
            let victim = common::kill_holdfast(&mut members[leader].process)?;
            killed = Some(leader);
            let next = wait_leader(members, Some(leader))?;
            format!(
                "killed member {} (pid {victim}); member {} leads after {} ms (lease {LEASE_TTL_SECS} s)",
                members[leader].name,
                members[next].name,
                t.elapsed().as_millis()
            )
        }
    };
    println!("   {said}");
    let mut results = Vec::new();
    let running: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].process.is_some() || killed == Some(i))
        .collect();
    for (child, i) in loads.into_iter().zip(running) {
        let out = child.wait_with_output()?;
        let text = output_text(&out);
        let m = &members[i];
        std::fs::write(
            args.dir
                .join(format!("drill-fleet-{}-{}.log", rows_name(event), m.name)),
            &text,
        )?;
        if killed == Some(i) {
            // Its clients lost their proxy, as with any proxy crash: not a survivor.
            continue;
        }
        let closed = (closed_sessions(&m.admin) - closed_before[i]).max(0.0) as u32;
        let fatal = !out.status.success() || text.contains("FATAL");
        results.push(Load {
            member: m.name,
            threads: args.threads,
            kept: if fatal {
                0
            } else {
                args.threads.saturating_sub(closed)
            },
            fatal,
            transactions: value_after(&text, "transactions:"),
            ignored_errors: value_after(&text, "ignored errors:"),
            reconnects: value_after(&text, "reconnects:"),
            max_latency_ms: value_after(&text, "max:"),
        });
    }
    let promotions = promotions(members).saturating_sub(before);
    let writable = writable_nodes(lab)?;
    if let Event::PrimaryKilled = event {
        // The killed node back, as a replica, for the next event.
        let _ = holdfast_lab::start_node(&lab.dir, &primary);
        let leader = wait_leader(members, None)?;
        let _ = admin::post(&members[leader].admin, &format!("/rejoin?node={primary}"));
    }
    Ok(Row {
        event: format!("{name}: {said}"),
        loads: results,
        promotions,
        writable,
    })
}

fn rows_name(event: Event) -> &'static str {
    match event {
        Event::SwitchoverAskedOfFollower => "switchover",
        Event::PrimaryKilled => "failover",
        Event::LeaderKilled => "leader-killed",
    }
}

/// The lab's nodes that are writable now.
fn writable_nodes(lab: &LabStatus) -> Result<Vec<String>> {
    let st = holdfast_lab::status(&lab.dir)?;
    Ok(st
        .nodes
        .iter()
        .filter(|n| n.is_live_primary())
        .map(|n| n.name.clone())
        .collect())
}
