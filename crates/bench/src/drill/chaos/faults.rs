//! The chaos drill's faults, one at a time: each is injected, the lab is brought back
//! (a killed or frozen old primary restarted as a replica and rejoined, or, when it has
//! diverged, replaced by a fresh replica), and the drill waits until holdfast sees every
//! node again before the next.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use holdfast_admin::AdminClient;
use holdfast_lab::{wait_for, LabStatus};
use rand::Rng;

use super::net::{self, Firewall};
use crate::admin;
use crate::drill::common::CutMode;

/// How long the lab may take to be whole again after a fault.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long holdfast may take to promote a replica after the primary is lost.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a frozen primary stays frozen at most: past holdfast's detection (~1 s) and
/// the replicas' (the lab's `slave_net_timeout`, see `chaos::SLAVE_NET_TIMEOUT`), which
/// holdfast waits for before failing over.
const FREEZE: Duration = Duration::from_secs(15);
/// How long a frozen primary stays frozen after holdfast promoted another node.
const FROZEN_AFTER_PROMOTION: Duration = Duration::from_millis(500);
/// How long a replica's SQL thread stays stopped.
const SQL_THREAD_STOP: Duration = Duration::from_secs(3);
/// How long a network cut lasts: from under holdfast's failure detection (~1 s) to well
/// past it and past the replicas' `slave_net_timeout` (3 s), milliseconds.
const CUT_MS: std::ops::Range<u64> = 500..8_000;
/// How long a replica applies with a delay (`MASTER_DELAY`), milliseconds.
const SLOW_MS: std::ops::Range<u64> = 3_000..7_000;

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the primary: holdfast fails over; the old one comes back as a replica.
    Kill,
    /// A planned switchover (`POST /switchover`).
    Switchover,
    /// A planned restart of the primary (`POST /restart`).
    Restart,
    /// SIGSTOP of the primary past the failure detection, then SIGCONT.
    Freeze,
    /// A replica's SQL thread stopped for a while.
    ReplicaStall,
    /// A replica's SQL thread slowed for a while (`MASTER_DELAY` of 1-3 s, then 0).
    ReplicaSlow,
    /// holdfast cut off the primary (the replicas still see it), then healed.
    CutHoldfast,
    /// The replicas cut off the primary (holdfast still sees it), then healed.
    CutReplicas,
    /// A replica removed from holdfast (`POST /nodes/remove`), then added again (the same
    /// node, or a fresh replica the lab makes in its place).
    RemoveAdd,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Switchover,
        Fault::Restart,
        Fault::Freeze,
        Fault::ReplicaStall,
        Fault::ReplicaSlow,
        Fault::CutHoldfast,
        Fault::CutReplicas,
        Fault::RemoveAdd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9 primary",
            Fault::Switchover => "switchover",
            Fault::Restart => "restart primary",
            Fault::Freeze => "SIGSTOP primary",
            Fault::ReplicaStall => "replica SQL thread stop",
            Fault::ReplicaSlow => "replica SQL thread slow",
            Fault::CutHoldfast => "cut holdfast|primary",
            Fault::CutReplicas => "cut primary|replicas",
            Fault::RemoveAdd => "replica removed, added",
        }
    }

    /// The short name `--kinds` takes.
    pub fn key(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Switchover => "switchover",
            Fault::Restart => "restart",
            Fault::Freeze => "freeze",
            Fault::ReplicaStall => "stall",
            Fault::ReplicaSlow => "slow",
            Fault::CutHoldfast => "cut-holdfast",
            Fault::CutReplicas => "cut-replicas",
            Fault::RemoveAdd => "remove-add",
        }
    }

    pub fn from_key(key: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.key() == key)
    }

    pub fn is_network(self) -> bool {
        matches!(self, Fault::CutHoldfast | Fault::CutReplicas)
    }

    /// A random fault (no network cut when `network` is false).
    pub fn pick(rng: &mut impl Rng, network: bool) -> Fault {
        loop {
            let f = match rng.gen_range(0..100) {
                0..16 => Fault::Kill,
                16..28 => Fault::Switchover,
                28..37 => Fault::Restart,
                37..50 => Fault::Freeze,
                50..57 => Fault::ReplicaStall,
                57..65 => Fault::ReplicaSlow,
                65..78 => Fault::CutHoldfast,
                78..91 => Fault::CutReplicas,
                _ => Fault::RemoveAdd,
            };
            if network || !f.is_network() {
                return f;
            }
        }
    }
}

/// What one fault did.
#[derive(Debug, Clone)]
pub struct Done {
    pub fault: Fault,
    /// Milliseconds since the run started: injected, and the lab whole again.
    pub start_ms: u64,
    pub settled_ms: u64,
    /// What happened (`node1 killed; node2 primary after 412 ms`), or what went wrong.
    pub note: String,
    pub failed: bool,
}

/// What a fault needs besides the lab: the firewall for cuts, and the run's random
/// numbers (durations).
pub struct Env<'a, R> {
    pub lab: &'a LabStatus,
    pub firewall: Option<&'a Firewall>,
    pub rng: &'a mut R,
    pub cut_mode: CutMode,
}

/// Injects `fault`, brings the lab back and waits until it is settled.
pub fn inject<R: Rng>(env: &mut Env<R>, fault: Fault, epoch: Instant) -> Done {
    let lab = env.lab;
    let admin = admin::client(lab);
    let start_ms = epoch.elapsed().as_millis() as u64;
    let result = settle(lab, &admin).and_then(|primary| run(env, &admin, fault, &primary));
    let (mut note, mut failed) = match result {
        Ok(note) => (note, false),
        Err(e) => (format!("{e:#}"), true),
    };
    if let Err(e) = recover(lab, &admin) {
        note.push_str(&format!("; not settled afterwards: {e:#}"));
        failed = true;
    }
    Done {
        fault,
        start_ms,
        settled_ms: epoch.elapsed().as_millis() as u64,
        note,
        failed,
    }
}

fn run<R: Rng>(
    env: &mut Env<R>,
    admin: &AdminClient,
    fault: Fault,
    primary: &str,
) -> Result<String> {
    let lab = env.lab;
    let t = Instant::now();
    let st = admin::status(admin)?;
    let replica = st
        .topology
        .nodes
        .iter()
        .find(|n| n.name != primary && n.reachable)
        .map(|n| n.name.clone())
        .context("no replica")?;
    match fault {
        Fault::Kill => {
            holdfast_lab::kill_node(&lab.dir, primary)?;
            let new = new_primary(admin, primary)?;
            let after = t.elapsed().as_millis();
            holdfast_lab::start_node(&lab.dir, primary)?;
            let rejoined = rejoin_or_replace(lab, admin, primary)?;
            Ok(format!(
                "{primary} killed; {new} primary after {after} ms; {primary} {rejoined}"
            ))
        }
        Fault::Switchover => {
            admin::post(admin, &format!("/switchover?to={replica}"))?;
            Ok(format!(
                "{primary} -> {replica} in {} ms",
                t.elapsed().as_millis()
            ))
        }
        Fault::Restart => match admin::post(admin, &format!("/restart?node={primary}")) {
            Ok(_) => Ok(format!(
                "{primary} restarted and back in {} ms",
                t.elapsed().as_millis()
            )),
            // Restarted, but holdfast refused to rejoin it (its unacknowledged tail).
            Err(e) if is_diverged(&e) => {
                let fresh = replace(lab, admin, primary)?;
                Ok(format!(
                    "{primary} restarted, {}; replaced by a fresh replica {fresh}",
                    diverged_detail(&e)
                ))
            }
            Err(e) => Err(e),
        },
        Fault::Freeze => freeze(lab, admin, primary),
        Fault::ReplicaStall => {
            let node = holdfast_lab::status(&lab.dir)?.node(&replica)?.clone();
            holdfast_lab::node_sql(&node, "STOP SLAVE SQL_THREAD")?;
            std::thread::sleep(SQL_THREAD_STOP);
            holdfast_lab::node_sql(&node, "START SLAVE SQL_THREAD")?;
            Ok(format!(
                "{replica}'s SQL thread stopped for {} ms",
                SQL_THREAD_STOP.as_millis()
            ))
        }
        Fault::ReplicaSlow => {
            let node = holdfast_lab::status(&lab.dir)?.node(&replica)?.clone();
            let delay = env.rng.gen_range(1..=3);
            let hold = Duration::from_millis(env.rng.gen_range(SLOW_MS));
            // MariaDB changes MASTER_DELAY with both threads stopped only.
            let set = |d: u32| {
                holdfast_lab::node_sql(
                    &node,
                    &format!("STOP SLAVE; CHANGE MASTER TO MASTER_DELAY={d}; START SLAVE"),
                )
            };
            set(delay)?;
            std::thread::sleep(hold);
            set(0)?;
            Ok(format!(
                "{replica} applied {delay} s late for {} ms",
                hold.as_millis()
            ))
        }
        Fault::CutHoldfast | Fault::CutReplicas => {
            let fw = env
                .firewall
                .context("no nftables: network cuts cannot be made here")?;
            let side = match fault {
                Fault::CutHoldfast => net::Side::Holdfast,
                _ => net::Side::Replicas,
            };
            cut(lab, admin, fw, env.rng, env.cut_mode, side, primary)
        }
        Fault::RemoveAdd => {
            let drain = env.rng.gen_range(0..2_000);
            let address = holdfast_lab::status(&lab.dir)?
                .node(&replica)?
                .address
                .clone();
            admin::post(
                admin,
                &format!("/nodes/remove?name={replica}&drain_ms={drain}"),
            )?;
            let removed = t.elapsed().as_millis();
            if env.rng.gen_bool(0.5) {
                // The same node back, replicating all along.
                std::thread::sleep(Duration::from_millis(env.rng.gen_range(200..2_000)));
                admin::post(
                    admin,
                    &format!("/nodes/add?name={replica}&address={address}&proxy_protocol=true"),
                )?;
                Ok(format!(
                    "{replica} removed (drain {drain} ms) in {removed} ms, added back"
                ))
            } else {
                holdfast_lab::remove_node(&lab.dir, &replica)?;
                let fresh = holdfast_lab::add_replica(&lab.dir, None)?;
                admin::post(
                    admin,
                    &format!(
                        "/nodes/add?name={}&address={}&proxy_protocol=true",
                        fresh.name, fresh.address
                    ),
                )?;
                Ok(format!(
                    "{replica} removed (drain {drain} ms) in {removed} ms and deleted; a fresh replica {} added",
                    fresh.name
                ))
            }
        }
    }
}

/// Cuts `side` off the primary for a random time (dropped or rejected), then heals: what
/// holdfast did meanwhile, for the note.
fn cut(
    lab: &LabStatus,
    admin: &AdminClient,
    fw: &Firewall,
    rng: &mut impl Rng,
    cut_mode: CutMode,
    side: net::Side,
    primary: &str,
) -> Result<String> {
    let port = holdfast_lab::status(&lab.dir)?.node(primary)?.port;
    // (Drawn whatever the mode, so that the rest of the schedule stays the same.)
    let reject = rng.gen_bool(0.25);
    let mode = match (cut_mode, reject) {
        (CutMode::Reject, _) | (CutMode::Random, true) => net::Mode::Reject,
        (CutMode::Drop, _) | (CutMode::Random, false) => net::Mode::Drop,
    };
    let hold = Duration::from_millis(rng.gen_range(CUT_MS));
    let made = fw.cut(side, port, mode);
    if made.is_ok() {
        std::thread::sleep(hold);
    }
    let healed = fw.heal();
    made?;
    healed?;
    let now = admin::status(admin)
        .ok()
        .and_then(|s| s.topology.primary)
        .unwrap_or_else(|| "none".into());
    let what = match side {
        net::Side::Holdfast => "holdfast",
        net::Side::Replicas => "the replicas",
    };
    Ok(format!(
        "{primary} cut from {what} ({}) for {} ms; primary at the heal: {now}",
        mode.name(),
        hold.as_millis()
    ))
}

/// SIGSTOP of the primary until holdfast promotes another node (or `FREEZE` passes), then
/// SIGCONT: the old primary runs again beside the new one for a moment (it must take no
/// writes), then is restarted as a replica and rejoined. Usually it committed, when it
/// woke, the requests buffered in its sockets: it has diverged (holdfast deposed it and
/// refuses the rejoin) and is replaced by a fresh replica.
fn freeze(lab: &LabStatus, admin: &AdminClient, primary: &str) -> Result<String> {
    let t = Instant::now();
    let pid = holdfast_lab::status(&lab.dir)?
        .node(primary)?
        .pid
        .context("the primary has no pid")?;
    holdfast_lab::procs::signal(pid, libc::SIGSTOP)?;
    // Failed over: the old primary is left for a rejoin (the topology may follow later).
    let promoted = wait_for("a failover", FREEZE, || {
        let st = admin::status(admin).ok()?;
        let left_out = st.ha.needs_rejoin.iter().any(|n| n == primary);
        let other = st.topology.primary.filter(|p| p != primary);
        (left_out || other.is_some()).then(|| other.unwrap_or_else(|| "another node".into()))
    });
    std::thread::sleep(FROZEN_AFTER_PROMOTION);
    holdfast_lab::procs::signal(pid, libc::SIGCONT)?;
    let frozen = t.elapsed().as_millis();
    let Ok(new) = promoted else {
        return Ok(format!(
            "{primary} frozen {frozen} ms; no failover (it is the primary again)"
        ));
    };
    // Both writable for a moment: holdfast must send nothing to the old one.
    std::thread::sleep(Duration::from_secs(2));
    holdfast_lab::kill_node(&lab.dir, primary)?;
    holdfast_lab::start_node(&lab.dir, primary)?;
    let rejoined = rejoin_or_replace(lab, admin, primary)?;
    Ok(format!(
        "{primary} frozen {frozen} ms; {new} promoted; {primary} resumed 2 s, restarted, {rejoined}"
    ))
}

/// `POST /rejoin`; a node holdfast refuses because it has diverged (it has transactions
/// the primary has not) is replaced by a fresh replica: what happened, for the note.
fn rejoin_or_replace(lab: &LabStatus, admin: &AdminClient, node: &str) -> Result<String> {
    match admin::post(admin, &format!("/rejoin?node={node}")) {
        Ok(_) => Ok("rejoined".into()),
        Err(e) if is_diverged(&e) => {
            let fresh = replace(lab, admin, node)?;
            Ok(format!(
                "{}; replaced by a fresh replica {fresh}",
                diverged_detail(&e)
            ))
        }
        Err(e) => Err(e.context(format!("rejoining {node}"))),
    }
}

fn new_primary(admin: &AdminClient, old: &str) -> Result<String> {
    wait_for("a new primary", FAILOVER_TIMEOUT, || {
        admin::status(admin)
            .ok()?
            .topology
            .primary
            .filter(|p| p != old)
    })
}

/// Whether holdfast refused a rejoin because the node has diverged.
fn is_diverged(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("has diverged")
}

/// What holdfast said about a diverged node, for the note: `diverged: it has 0-1-17 which
/// node2 (at 0-1-16) lacks` (the transactions only that node has, shortened), or the
/// position the new primary refused.
fn diverged_detail(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    // The primary refused the node's position (error 1236): which one.
    if let Some((_, rest)) = text.split_once("requested to start from GTID ") {
        let gtid = rest.split([',', ' ']).next().unwrap_or_default();
        return format!("diverged: its position {gtid} is not in the new primary's binlog");
    }
    let why = text
        .split_once("was not rejoined: ")
        .map_or(text.as_str(), |(_, why)| why);
    let why = why.trim_end_matches(['"', '}']);
    let short: String = why.chars().take(120).collect();
    let more = if short.len() < why.len() { "..." } else { "" };
    format!("diverged: {short}{more}")
}

/// The primary, if the lab is whole: holdfast fronts exactly the lab's nodes, each up and
/// neither deposed (a failover left it out) nor being removed; a primary, watched by the
/// failure detector; no operation running and no node waiting for a rejoin.
fn settled(lab: &LabStatus, admin: &AdminClient) -> Option<String> {
    let st = admin::status(admin).ok()?;
    let nodes = &st.topology.nodes;
    let whole = nodes
        .iter()
        .all(|n| n.reachable && !n.deposed && !n.draining);
    let idle = st.ha.in_progress.is_none() && st.ha.needs_rejoin.is_empty();
    let primary = st.topology.primary.clone()?;
    let watched = st.ha.watching.as_deref() == Some(primary.as_str());
    let lab_nodes = holdfast_lab::status(&lab.dir).ok()?.nodes;
    let same_nodes = lab_nodes.len() == nodes.len()
        && lab_nodes
            .iter()
            .all(|l| l.alive && nodes.iter().any(|n| n.name == l.name));
    (whole && idle && watched && same_nodes && replicating(&lab_nodes, &primary)).then_some(primary)
}

/// Every replica's IO and SQL threads run and the primary's semi-sync is on: the next
/// fault finds acknowledged writes on the replicas too (one fault at a time; a cut or a
/// stall can leave a replica reconnecting, or semi-sync fallen back to asynchronous).
fn replicating(nodes: &[holdfast_lab::NodeStatus], primary: &str) -> bool {
    nodes.iter().all(|n| {
        if n.name == primary {
            let on = holdfast_lab::node_sql_value(
                n,
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_STATUS'",
            );
            return matches!(on, Ok(Some(v)) if v == "ON");
        }
        let Ok(rows) = holdfast_lab::node_sql_maps(n, "SHOW SLAVE STATUS") else {
            return false;
        };
        rows.first().is_some_and(|r| {
            r.get("Slave_IO_Running").map(String::as_str) == Some("Yes")
                && r.get("Slave_SQL_Running").map(String::as_str) == Some("Yes")
        })
    })
}

/// Waits until the lab is whole (see [`settled`]): the primary.
fn settle(lab: &LabStatus, admin: &AdminClient) -> Result<String> {
    wait_for(
        "every node up and none deposed, a primary, no operation running",
        SETTLE_TIMEOUT,
        || settled(lab, admin),
    )
}

/// Starts any stopped node and rejoins what holdfast left out (replacing a node that has
/// diverged), then waits to settle.
fn recover(lab: &LabStatus, admin: &AdminClient) -> Result<()> {
    if settled(lab, admin).is_some() {
        return Ok(());
    }
    // A failover still running decides what is left out.
    wait_for("no operation running", SETTLE_TIMEOUT, || {
        admin::status(admin)
            .ok()?
            .ha
            .in_progress
            .is_none()
            .then_some(())
    })?;
    let st = holdfast_lab::status(&lab.dir)?;
    for n in st.nodes.iter().filter(|n| !n.alive) {
        holdfast_lab::start_node(&lab.dir, &n.name)?;
    }
    for n in admin::status(admin)?.ha.needs_rejoin {
        let done = rejoin_or_replace(lab, admin, &n)?;
        println!("   recovering: {n} {done}");
    }
    settle(lab, admin).map(|_| ())
}

/// Removes a diverged node from holdfast and the lab and adds a fresh replica seeded from
/// the primary in its place: the new node's name.
fn replace(lab: &LabStatus, admin: &AdminClient, node: &str) -> Result<String> {
    admin::post(admin, &format!("/nodes/remove?name={node}&drain_ms=0"))?;
    holdfast_lab::remove_node(&lab.dir, node)?;
    let fresh = holdfast_lab::add_replica(&lab.dir, None)?;
    admin::post(
        admin,
        &format!(
            "/nodes/add?name={}&address={}&proxy_protocol=true",
            fresh.name, fresh.address
        ),
    )?;
    Ok(fresh.name)
}
