//! The topology monitor: probes every member with the monitor account each interval (and
//! at once when nudged), picks the primary, and publishes the [`Topology`] sessions read.
//! What an HA operation decides (a deposed node, a promoted one) is published at once,
//! without waiting for a probe round.

use crate::config::Config;
use crate::control::{monitor_connect, BackendConn};
use crate::ha::probe::SlaveStatus;
use crate::topology::{LoadRef, Member, NodeState, ReplicaHealth, Topology};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

pub const MONITOR_INTERVAL: Duration = Duration::from_millis(1000);

/// A probe that takes longer than this counts as trouble reaching the node
/// ([`MonitorLinks::troubled`]): the probe is one short query.
pub const SLOW_PROBE: Duration = Duration::from_millis(1000);

/// The monitor's own connection to each node, as of its last probe round. A restart ends
/// every connection to a server: a node whose monitor connection was open before a moment
/// and still answered a probe after another did not restart between them (which a
/// server's uptime, in whole seconds, cannot tell of a restart within a second).
#[derive(Debug, Clone, Default)]
pub struct MonitorLinks {
    /// When the last round began (its probes were all sent after this).
    pub round_started: Option<Instant>,
    pub links: HashMap<String, MonitorLink>,
    /// When a probe of each node last failed, or was slow: the network between holdfast
    /// and the node (or the node) was in trouble then.
    pub troubled: HashMap<String, Trouble>,
}

/// When the monitor last had trouble probing a node (each set when the probe ended).
#[derive(Debug, Clone, Copy, Default)]
pub struct Trouble {
    /// A probe failed (no answer within the connect timeout, a reset, a refused login...).
    pub failed: Option<Instant>,
    /// A probe answered, but after more than [`SLOW_PROBE`].
    pub slow: Option<Instant>,
}

impl MonitorLinks {
    /// Whether the monitor lost `node` after `since`: its connection to it gone (none now,
    /// or one opened since) or a probe failed. `None` when no round ran since (no
    /// monitor, or one held): it cannot be told.
    pub fn lost_after(&self, node: &str, since: Instant) -> Option<bool> {
        let after = |t: Option<Instant>| t.is_some_and(|t| t > since);
        if self.troubled.get(node).is_some_and(|t| after(t.failed)) {
            return Some(true);
        }
        match self.links.get(node) {
            Some(link) => Some(link.open_since > since),
            None => self.round_started.filter(|&t| t > since).map(|_| true),
        }
    }

    /// [`MonitorLinks::lost_after`], or a probe of `node` slow after `since` (as a cut that
    /// heals before the probe's timeout makes it).
    pub fn trouble_after(&self, node: &str, since: Instant) -> Option<bool> {
        let slow = self
            .troubled
            .get(node)
            .and_then(|t| t.slow)
            .is_some_and(|t| t > since);
        match slow {
            true => Some(true),
            false => self.lost_after(node, since),
        }
    }
}

/// One node's monitor connection (see [`MonitorLinks`]).
#[derive(Debug, Clone, Copy)]
pub struct MonitorLink {
    /// Open since at least this moment.
    pub open_since: Instant,
    /// Answered a probe sent at or after this moment.
    pub answered_after: Instant,
}

/// Whether the monitor may probe the nodes now. The proxy's serverless lifecycle says no
/// while its instance is paused (probing would only hang on a frozen process).
pub trait ProbeGate: Send + Sync {
    fn may_probe(&self) -> bool;
}

/// Where the monitor publishes: the topology (sessions wait on it) and its own
/// connections (read on demand).
pub struct MonitorOutputs {
    pub topology: watch::Sender<Arc<Topology>>,
    pub links: watch::Sender<Arc<MonitorLinks>>,
}

/// Probes every member each interval (and at once whenever `nudge` is notified: the HA
/// controller does after each operation, so sessions find a new primary without waiting a
/// tick, and so does a change of members), and publishes the result. A paused serverless
/// instance (`gate`) is left alone: while it is paused the last view stands (the node is
/// still where sessions go once it resumes), and probing would only hang on a frozen
/// process.
pub async fn run_monitor(
    live: crate::LiveConfig,
    outputs: MonitorOutputs,
    mut members: watch::Receiver<Arc<Vec<Member>>>,
    nudge: Arc<Notify>,
    gate: Option<Arc<dyn ProbeGate>>,
    switching: watch::Receiver<bool>,
    mut ha: watch::Receiver<crate::ha::controller::HaState>,
) {
    let MonitorOutputs {
        topology: tx,
        links: links_tx,
    } = outputs;
    // The node that was the only read-only root in the last round (see `choose_primary`).
    let mut root_before: Option<String> = None;
    let mut conns: HashMap<String, BackendConn> = Default::default();
    let mut links = MonitorLinks::default();
    let mut loads: std::collections::HashMap<String, LoadRef> = Default::default();
    let mut logged_problems: std::collections::HashMap<String, String> = Default::default();
    let mut ticker = tokio::time::interval(MONITOR_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = nudge.notified() => ticker.reset(),
            Ok(()) = members.changed() => ticker.reset(),
            Ok(()) = ha.changed() => {
                publish_ha_decisions(&tx, &ha);
                continue;
            }
        }
        if gate.as_ref().is_some_and(|g| !g.may_probe()) {
            continue;
        }
        let list = members.borrow_and_update().clone();
        conns.retain(|name, _| list.iter().any(|m| &m.backend.name == name));
        links.round_started = Some(Instant::now());
        loads.retain(|name, _| list.iter().any(|m| &m.backend.name == name));
        let mut topo = Topology::of_members(&list);
        topo.observed = true;
        {
            // A failover that deposes a node is published at once, also while this round
            // waits on a frozen node (seconds): sessions must drop their connections to it
            // before it wakes up and answers.
            let cfg = live.load_full();
            let round = probe_nodes(&cfg, &mut topo, &mut conns, &mut loads, &mut links);
            tokio::pin!(round);
            loop {
                tokio::select! {
                    () = &mut round => break,
                    Ok(()) = ha.changed() => publish_ha_decisions(&tx, &ha),
                }
            }
        }
        // Nobody wakes for this: sessions read it only when a lost connection's cause
        // is in doubt.
        links_tx.send_replace(Arc::new(links.clone()));
        let deposed = deposed_nodes(&ha);
        for node in topo.nodes.iter_mut() {
            node.deposed = deposed.iter().any(|d| node.name == *d);
            node.serves_reads &= !node.deposed;
        }
        topo.node_servers = topo
            .nodes
            .iter()
            .filter(|n| !n.version.is_empty())
            .map(|n| holdfast_sql::Server::from_version(n.version.as_bytes()))
            .reduce(holdfast_sql::Server::or);
        let previous = tx.borrow().clone();
        let (primary, read_only_primary) = choose_primary(
            &topo.nodes,
            &previous,
            *switching.borrow(),
            &mut root_before,
        );
        topo.primary = primary;
        topo.read_only_primary = read_only_primary;
        log_read_changes(&previous, &topo);
        log_node_problems(&mut logged_problems, &topo);
        let changed = previous.primary != topo.primary
            || previous.read_only_primary != topo.read_only_primary;
        if changed {
            match topo.primary_node() {
                Some(p) if read_only_primary => {
                    tracing::warn!(node = %p.name, address = %p.address, "primary is read-only (no node is writable, it replicates from nobody): sessions stay, writes get the server's error")
                }
                Some(p) => tracing::info!(node = %p.name, address = %p.address, "primary is now"),
                None => tracing::warn!("no writable node found"),
            }
        }
        if *tx.borrow().as_ref() != topo {
            tx.send_replace(Arc::new(topo));
        }
    }
}

/// Probes every node of `topo` one after the other (reusing monitor connections) and fills
/// in what each reports.
async fn probe_nodes(
    cfg: &Config,
    topo: &mut Topology,
    conns: &mut HashMap<String, BackendConn>,
    loads: &mut HashMap<String, LoadRef>,
    monitor_links: &mut MonitorLinks,
) {
    let MonitorLinks {
        links, troubled, ..
    } = monitor_links;
    links.retain(|name, _| conns.contains_key(name));
    troubled.retain(|name, _| topo.nodes.iter().any(|n| &n.name == name));
    for node in topo.nodes.iter_mut() {
        node.load = loads.entry(node.name.to_string()).or_default().clone();
        let sent = Instant::now();
        let mut slot = conns.remove(node.name.as_str());
        let mut reused = slot.is_some();
        let mut result = probe(cfg, &node.name, &node.address, &mut slot).await;
        if result.is_err() && reused {
            // A monitor connection the server dropped (restart, KILL): one fresh try
            // before the node counts as unreachable.
            slot = None;
            reused = false;
            result = probe(cfg, &node.name, &node.address, &mut slot).await;
        }
        if result.is_err() {
            troubled.entry(node.name.to_string()).or_default().failed = Some(Instant::now());
        } else if sent.elapsed() > SLOW_PROBE {
            troubled.entry(node.name.to_string()).or_default().slow = Some(Instant::now());
        }
        let before = links.remove(node.name.as_str());
        if let (Ok(_), Some(conn)) = (&result, slot) {
            conns.insert(node.name.to_string(), conn);
            let open_since = match before {
                Some(link) if reused => link.open_since,
                // Opened during this probe: by its end at the latest.
                _ => Instant::now(),
            };
            let answered_after = sent;
            links.insert(
                node.name.to_string(),
                MonitorLink {
                    open_since,
                    answered_after,
                },
            );
        }
        match result {
            Ok(Probed {
                read_only,
                version,
                autocommit,
                requires_secure_transport,
                replication,
            }) => {
                node.reachable = true;
                node.requires_secure_transport = requires_secure_transport;
                node.read_only = Some(read_only);
                node.version = version;
                node.autocommit = Some(autocommit);
                node.serves_reads = read_only
                    && !node.draining
                    && replication
                        .as_ref()
                        .is_some_and(|r| r.within(cfg.split.max_replica_lag_ms));
                node.replication = replication;
            }
            Err(ProbeError::Login(e)) => {
                node.login_error = Some(e.clone());
                node.last_error = Some(e);
            }
            Err(ProbeError::Other(e)) => node.last_error = Some(e),
        }
    }
}

/// Logs each node's monitoring problem once when it starts (or changes) and once when it
/// ends: a monitor that cannot log in, or cannot read a replica's state, must be seen in
/// the log, not only in `ctl status`.
fn log_node_problems(logged: &mut std::collections::HashMap<String, String>, topo: &Topology) {
    logged.retain(|name, _| topo.nodes.iter().any(|n| &n.name == name));
    for n in &topo.nodes {
        let problem = n.last_error.clone().or_else(|| {
            n.replication
                .as_ref()
                .filter(|r| r.error.starts_with(REPLICATION_UNREADABLE))
                .map(|r| r.error.clone())
        });
        match (problem, logged.get(n.name.as_str())) {
            (Some(p), Some(before)) if &p == before => {}
            (Some(p), _) => {
                tracing::error!(node = %n.name, "{p}");
                logged.insert(n.name.to_string(), p);
            }
            (None, Some(_)) => {
                tracing::info!(node = %n.name, "monitor: the node answers again");
                logged.remove(n.name.as_str());
            }
            (None, None) => {}
        }
    }
}

/// Publishes what an HA operation decided on the current topology at once (no probe): the
/// deposed nodes (never the primary, no reads), and, once the operation is over, the node
/// it made the primary (a probe round may be waiting on a frozen node for seconds).
fn publish_ha_decisions(
    tx: &watch::Sender<Arc<Topology>>,
    ha: &watch::Receiver<crate::ha::controller::HaState>,
) {
    let deposed = deposed_nodes(ha);
    let promoted = {
        let h = ha.borrow();
        let after_failover = h.in_progress.is_none()
            && h.last
                .as_ref()
                .is_some_and(|l| l.ok && l.operation == crate::ha::controller::OpKind::Failover);
        after_failover.then(|| h.watching.clone()).flatten()
    };
    let now = tx.borrow().clone();
    let new_primary = promoted.and_then(|w| {
        let at = now
            .nodes
            .iter()
            .position(|n| n.name == w && n.reachable && !deposed.iter().any(|d| n.name == *d))?;
        (now.primary != Some(at)
            && now.primary.is_none_or(|p| {
                now.nodes
                    .get(p)
                    .is_none_or(|n| deposed.iter().any(|d| n.name == *d))
            }))
        .then_some(at)
    });
    if new_primary.is_none()
        && !now
            .nodes
            .iter()
            .any(|n| n.deposed != deposed.iter().any(|d| n.name == *d))
    {
        return;
    }
    let mut topo = (*now).clone();
    for n in topo.nodes.iter_mut() {
        n.deposed = deposed.iter().any(|d| n.name == *d);
        n.serves_reads &= !n.deposed;
    }
    if topo
        .primary
        .is_some_and(|i| topo.nodes.get(i).is_some_and(|n| n.deposed))
    {
        topo.primary = None;
        topo.read_only_primary = false;
    }
    if let Some(at) = new_primary {
        // Promoted and writable: the failover made it so (the next probe round confirms).
        topo.primary = Some(at);
        topo.read_only_primary = false;
        if let Some(n) = topo.nodes.get_mut(at) {
            n.read_only = Some(false);
            n.serves_reads = false;
            tracing::info!(node = %n.name, "primary is now (from the failover's report)");
        }
    }
    tracing::warn!(deposed = ?deposed, "nodes failed over away from");
    tx.send_replace(Arc::new(topo));
}

/// The nodes a failover moved away from, or is moving away from now.
fn deposed_nodes(ha: &watch::Receiver<crate::ha::controller::HaState>) -> Vec<String> {
    let h = ha.borrow();
    let mut d = h.needs_rejoin.clone();
    d.extend(h.failing_over_from.iter().cloned());
    d
}

/// Which node is the primary, and whether it is read-only.
///
/// A reachable writable node is. Failing that, and unless a switchover runs (`switching`:
/// its old primary is read-only for a moment on purpose), a read-only primary: the one
/// reachable node that replicates from nobody (the root of the replication tree; replicas
/// of a lost primary still name it), if it was the primary in the last round (an operator
/// set `read_only` on it) or was that root in the last round too (holdfast started on a
/// read-only server: one round more to be sure it is not a promotion half done).
pub(crate) fn choose_primary(
    nodes: &[NodeState],
    previous: &Topology,
    switching: bool,
    root_before: &mut Option<String>,
) -> (Option<usize>, bool) {
    if let Some(i) = nodes
        .iter()
        .position(|n| n.reachable && n.read_only == Some(false) && !n.deposed)
    {
        *root_before = None;
        return (Some(i), false);
    }
    let mut roots = nodes.iter().enumerate().filter(|(_, n)| {
        n.reachable
            && n.read_only == Some(true)
            && n.replication.is_none()
            && !n.draining
            && !n.deposed
    });
    let root = match (roots.next(), roots.next()) {
        (Some((i, n)), None) => Some((i, n.name.to_string())),
        _ => None,
    };
    let last_root = std::mem::replace(root_before, root.as_ref().map(|(_, n)| n.clone()));
    let Some((i, name)) = root else {
        return (None, false);
    };
    if switching {
        return (None, false);
    }
    let was_primary =
        previous.primary.is_some() && previous.primary_node().is_some_and(|p| p.name == name);
    if was_primary || last_root.as_deref() == Some(name.as_str()) {
        (Some(i), true)
    } else {
        (None, false)
    }
}

/// One line each way when a node starts or stops taking reads.
fn log_read_changes(before: &Topology, now: &Topology) {
    if !now.nodes.iter().any(|n| n.serves_reads) && !before.nodes.iter().any(|n| n.serves_reads) {
        return;
    }
    for n in &now.nodes {
        let was = before
            .nodes
            .iter()
            .find(|b| b.name == n.name)
            .is_some_and(|b| b.serves_reads);
        if was == n.serves_reads {
            continue;
        }
        if n.serves_reads {
            tracing::info!(node = %n.name, "replica takes reads");
        } else {
            let why = match (&n.replication, n.reachable) {
                (_, false) => "unreachable".to_string(),
                (None, _) if n.read_only == Some(false) => "writable (primary)".to_string(),
                (None, _) => "not replicating".to_string(),
                (Some(r), _) if !(r.io_running && r.sql_running) => {
                    format!("replication stopped: {}", r.error)
                }
                (Some(r), _) => format!("lag {} ms", r.lag_ms.map_or(-1, |l| l as i64)),
            };
            tracing::warn!(node = %n.name, reason = %why, "replica taken out of reads");
        }
    }
}

/// What one monitor round reads from a node.
struct Probed {
    read_only: bool,
    /// `@@global.require_secure_transport`: the server refuses clients without TLS.
    requires_secure_transport: bool,
    version: String,
    autocommit: bool,
    replication: Option<ReplicaHealth>,
}

/// Why a probe failed: the monitor could not log in (the server refused it: a
/// configuration problem), or anything else (the node is down, slow, went away).
enum ProbeError {
    Login(String),
    Other(String),
}

impl From<String> for ProbeError {
    fn from(e: String) -> Self {
        ProbeError::Other(e)
    }
}

impl From<&str> for ProbeError {
    fn from(e: &str) -> Self {
        ProbeError::Other(e.to_string())
    }
}

/// How a replica's replication error starts when the monitor may not read it.
const REPLICATION_UNREADABLE: &str = "the monitor account cannot read the replication state";

async fn probe(
    cfg: &Config,
    name: &str,
    addr: &str,
    slot: &mut Option<BackendConn>,
) -> Result<Probed, ProbeError> {
    if slot.is_none() {
        *slot = Some(monitor_connect(cfg, addr).await.map_err(|e| match &e {
            crate::control::BackendError::Server { .. } => {
                ProbeError::Login(crate::preflight::login_failure(cfg, name, &e))
            }
            _ => ProbeError::Other(e.to_string()),
        })?);
    }
    let Some(conn) = slot.as_mut() else {
        return Err("no monitor connection".into());
    };
    let fut = conn.query(
        "SELECT @@global.read_only, VERSION(), @@global.autocommit, \
         @@global.require_secure_transport",
    );
    let r = tokio::time::timeout(cfg.proxy.connect_timeout(), fut)
        .await
        .map_err(|_| "monitor query timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let row = r.rows.first().ok_or("monitor query returned no row")?;
    let flag = |i: usize| {
        row.get(i)
            .cloned()
            .flatten()
            .is_some_and(|v| crate::ha::probe::is_on(&v))
    };
    let read_only = flag(0);
    let replication = if read_only {
        let fut = conn.execute(b"SHOW SLAVE STATUS", 1 << 20);
        let r = tokio::time::timeout(cfg.proxy.connect_timeout(), fut)
            .await
            .map_err(|_| "replication status query timed out".to_string())?;
        match r {
            Ok(r) => SlaveStatus::of_answer(addr, r).map(|s| match s {
                Ok(s) => ReplicaHealth::from(&s),
                Err(e) => ReplicaHealth::not_running(e.to_string()),
            }),
            // The node answers; only its replication state is hidden (e.g. 1227 without
            // SLAVE MONITOR): reachable, takes no reads, and says why.
            Err(crate::control::BackendError::Server { code, message, .. }) => {
                Some(ReplicaHealth::not_running(format!(
                    "{REPLICATION_UNREADABLE} of {name} (SHOW SLAVE STATUS): {code} \
                     {message}; run `holdfast check`"
                )))
            }
            Err(e) => return Err(ProbeError::Other(e.to_string())),
        }
    } else {
        None
    };
    Ok(Probed {
        read_only,
        version: row.get(1).cloned().flatten().unwrap_or_default(),
        autocommit: flag(2),
        requires_secure_transport: flag(3),
        replication,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackendConfig;

    #[test]
    fn trouble_after_a_moment_is_a_lost_link_a_failed_or_slow_probe_and_lost_is_not_slow() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        let mut links = MonitorLinks::default();
        // No round yet: nothing can be told.
        assert_eq!(links.lost_after("n1", t1), None);
        links.round_started = Some(t2);
        // A round since, and no link: the monitor lost the node.
        assert_eq!(links.lost_after("n1", t1), Some(true));
        let link = |open_since| MonitorLink {
            open_since,
            answered_after: t2,
        };
        links.links.insert("n1".into(), link(t0));
        assert_eq!(links.lost_after("n1", t1), Some(false));
        assert_eq!(links.trouble_after("n1", t1), Some(false));
        // A link opened since: it was lost in between.
        links.links.insert("n1".into(), link(t2));
        assert_eq!(links.lost_after("n1", t1), Some(true));
        links.links.insert("n1".into(), link(t0));
        // A slow probe is trouble, not a loss.
        links.troubled.insert(
            "n1".into(),
            Trouble {
                failed: None,
                slow: Some(t2),
            },
        );
        assert_eq!(links.trouble_after("n1", t1), Some(true));
        assert_eq!(links.lost_after("n1", t1), Some(false));
        // Trouble before the moment does not count.
        assert_eq!(links.trouble_after("n1", t2), Some(false));
        links.troubled.insert(
            "n1".into(),
            Trouble {
                failed: Some(t2),
                slow: None,
            },
        );
        assert_eq!(links.lost_after("n1", t1), Some(true));
        assert_eq!(links.trouble_after("n1", t1), Some(true));
    }

    fn node(name: &str, reachable: bool, read_only: bool, replicates: bool) -> NodeState {
        let mut t = Topology::of_members(&[Member {
            backend: BackendConfig {
                name: name.into(),
                address: format!("127.0.0.1:{}", 3000 + name.len()),
                proxy_protocol: false,
            },
            draining: false,
        }]);
        let mut n = t.nodes.remove(0);
        n.reachable = reachable;
        n.read_only = reachable.then_some(read_only);
        n.replication = replicates.then(|| ReplicaHealth {
            io_running: true,
            sql_running: true,
            lag_ms: Some(0),
            source: "127.0.0.1:1".into(),
            error: String::new(),
        });
        n
    }

    fn topology(nodes: Vec<NodeState>, primary: Option<usize>) -> Topology {
        Topology {
            nodes,
            primary,
            read_only_primary: false,
            node_servers: None,
            observed: true,
        }
    }

    #[test]
    fn a_primary_made_read_only_stays_the_primary() {
        let before = topology(
            vec![node("a", true, false, false), node("b", true, true, true)],
            Some(0),
        );
        let now = vec![node("a", true, true, false), node("b", true, true, true)];
        let mut root = None;
        assert_eq!(
            choose_primary(&now, &before, false, &mut root),
            (Some(0), true)
        );
        // Not while a switchover runs: its old primary is read-only on purpose.
        let mut root = None;
        assert_eq!(
            choose_primary(&now, &before, true, &mut root),
            (None, false)
        );
        // A writable node wins.
        let now = vec![node("a", true, true, false), node("b", true, false, false)];
        assert_eq!(
            choose_primary(&now, &before, false, &mut root),
            (Some(1), false)
        );
    }

    #[test]
    fn a_deposed_node_is_never_the_primary() {
        let before = topology(
            vec![node("a", true, false, false), node("b", true, false, false)],
            Some(1),
        );
        // The old primary is back and writable (SIGCONT): the promoted one stays primary.
        let mut now = vec![node("a", true, false, false), node("b", true, false, false)];
        now[0].deposed = true;
        let mut root = None;
        assert_eq!(
            choose_primary(&now, &before, false, &mut root),
            (Some(1), false)
        );
        // Alone and fenced (read-only, replicating from nobody): still not the primary.
        let mut now = vec![node("a", true, true, false), node("b", false, false, false)];
        now[0].deposed = true;
        assert_eq!(
            choose_primary(&now, &before, false, &mut root),
            (None, false)
        );
    }

    #[test]
    fn a_lost_primary_is_not_replaced_by_a_replica() {
        let before = topology(
            vec![node("a", true, false, false), node("b", true, true, true)],
            Some(0),
        );
        // The replicas still replicate (from the lost primary): no root, hold.
        let now = vec![node("a", false, false, false), node("b", true, true, true)];
        let mut root = None;
        assert_eq!(
            choose_primary(&now, &before, false, &mut root),
            (None, false)
        );
    }

    #[test]
    fn a_read_only_server_at_start_is_the_primary_from_the_second_round() {
        let start = topology(vec![node("a", false, false, false)], None);
        let now = vec![node("a", true, true, false)];
        let mut root = None;
        assert_eq!(
            choose_primary(&now, &start, false, &mut root),
            (None, false)
        );
        assert_eq!(
            choose_primary(&now, &start, false, &mut root),
            (Some(0), true)
        );
        // Two roots (a promotion half done elsewhere): neither.
        let two = vec![node("a", true, true, false), node("b", true, true, false)];
        let mut root = Some("a".to_string());
        assert_eq!(
            choose_primary(&two, &start, false, &mut root),
            (None, false)
        );
    }
}
