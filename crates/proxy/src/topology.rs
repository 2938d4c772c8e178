//! Node monitoring: which nodes answer, which is writable. Published through a watch channel
//! so sessions read the current view without locks.

use crate::backend::BackendConn;
use crate::config::Config;
use crate::serverless::Lifecycle;
use crate::verifiers::monitor_connect;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub address: String,
    /// Sessions' connections to it start with the PROXY protocol header.
    pub proxy_protocol: bool,
    pub reachable: bool,
    pub read_only: Option<bool>,
    pub version: String,
    /// `@@global.autocommit`: what a new session starts with (holdfast's greeting says so,
    /// as the server's does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autocommit: Option<bool>,
    pub last_error: Option<String>,
    /// What `SHOW SLAVE STATUS` says, for a node that replicates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicaHealth>,
    /// The node takes reads of split sessions: a reachable replica whose replication runs
    /// within `[split] max_replica_lag_ms`.
    pub serves_reads: bool,
    /// Requests running on the node right now, over all sessions (split sessions count
    /// theirs; see [`NodeLoad`]).
    pub load: LoadRef,
}

/// A replica's replication, as the monitor last read it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReplicaHealth {
    pub io_running: bool,
    pub sql_running: bool,
    /// `Seconds_Behind_Master` in milliseconds (whole seconds); `None` while unknown.
    pub lag_ms: Option<u64>,
    /// Where it replicates from (`host:port`).
    pub source: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl ReplicaHealth {
    /// Replicating, and not further behind than `max_lag_ms`.
    pub fn within(&self, max_lag_ms: u64) -> bool {
        self.io_running && self.sql_running && self.lag_ms.is_some_and(|l| l <= max_lag_ms)
    }
}

/// Requests in flight on one node, counted by the sessions that route by load: an atomic
/// add and subtract around each request, no lock.
#[derive(Debug, Default)]
pub struct NodeLoad {
    pub active: std::sync::atomic::AtomicU32,
    /// Reads routed to the node since holdfast started.
    pub reads: std::sync::atomic::AtomicU64,
}

impl NodeLoad {
    pub fn active(&self) -> u32 {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A node's [`NodeLoad`], kept across monitor rounds. Equal to any other: a topology
/// does not change when only loads do.
#[derive(Debug, Clone, Default)]
pub struct LoadRef(pub Arc<NodeLoad>);

impl PartialEq for LoadRef {
    fn eq(&self, _: &LoadRef) -> bool {
        true
    }
}
impl Eq for LoadRef {}

impl Serialize for LoadRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("NodeLoad", 2)?;
        st.serialize_field("active_requests", &self.0.active())?;
        st.serialize_field(
            "reads",
            &self.0.reads.load(std::sync::atomic::Ordering::Relaxed),
        )?;
        st.end()
    }
}

#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<NodeState>,
    /// Index into `nodes` of the writable node, if one is known.
    pub primary: Option<usize>,
    /// Whether the monitor has completed at least one round.
    pub observed: bool,
}

impl Topology {
    pub fn from_config(cfg: &Config) -> Self {
        Topology {
            nodes: cfg
                .backends
                .iter()
                .map(|b| NodeState {
                    name: b.name.clone(),
                    address: b.address.clone(),
                    proxy_protocol: b.proxy_protocol,
                    reachable: false,
                    read_only: None,
                    version: String::new(),
                    autocommit: None,
                    last_error: None,
                    replication: None,
                    serves_reads: false,
                    load: LoadRef::default(),
                })
                .collect(),
            primary: None,
            observed: false,
        }
    }

    /// Where new sessions go: the writable node, or before the monitor knows better, the
    /// first configured node.
    pub fn primary_node(&self) -> Option<&NodeState> {
        match self.primary {
            Some(i) => self.nodes.get(i),
            None if !self.observed => self.nodes.first(),
            None => None,
        }
    }

    /// The nodes that take reads of split sessions now.
    pub fn read_nodes(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.iter().filter(|n| n.serves_reads)
    }
}

pub const MONITOR_INTERVAL: Duration = Duration::from_millis(1000);

/// Polls every node each interval and publishes the result.
pub async fn run_monitor(cfg: Arc<Config>, tx: watch::Sender<Arc<Topology>>) {
    run_monitor_nudged(cfg, tx, Arc::new(Notify::new())).await
}

/// [`run_monitor`], also probing at once whenever `nudge` is notified (the HA controller
/// does after each operation, so sessions find a new primary without waiting a tick).
pub async fn run_monitor_nudged(
    cfg: Arc<Config>,
    tx: watch::Sender<Arc<Topology>>,
    nudge: Arc<Notify>,
) {
    run_monitor_gated(cfg, tx, nudge, None).await
}

/// [`run_monitor_nudged`] that leaves a paused serverless instance alone: while it is
/// paused the last view stands (the node is still where sessions go once it resumes), and
/// probing would only hang on a frozen process.
pub async fn run_monitor_gated(
    cfg: Arc<Config>,
    tx: watch::Sender<Arc<Topology>>,
    nudge: Arc<Notify>,
    gate: Option<Arc<Lifecycle>>,
) {
    let mut conns: Vec<Option<BackendConn>> = cfg.backends.iter().map(|_| None).collect();
    let loads: Vec<LoadRef> = cfg.backends.iter().map(|_| LoadRef::default()).collect();
    let mut ticker = tokio::time::interval(MONITOR_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = nudge.notified() => ticker.reset(),
        }
        if gate.as_ref().is_some_and(|l| !l.is_running()) {
            continue;
        }
        let mut topo = Topology::from_config(&cfg);
        topo.observed = true;
        for (i, node) in topo.nodes.iter_mut().enumerate() {
            node.load = loads[i].clone();
            let mut result = probe(&cfg, &node.address, &mut conns[i]).await;
            if result.is_err() && conns[i].is_some() {
                // A monitor connection the server dropped (restart, KILL): one fresh try
                // before the node counts as unreachable.
                conns[i] = None;
                result = probe(&cfg, &node.address, &mut conns[i]).await;
            }
            match result {
                Ok(Probed {
                    read_only,
                    version,
                    autocommit,
                    replication,
                }) => {
                    node.reachable = true;
                    node.read_only = Some(read_only);
                    node.version = version;
                    node.autocommit = Some(autocommit);
                    node.serves_reads = read_only
                        && replication
                            .as_ref()
                            .is_some_and(|r| r.within(cfg.split.max_replica_lag_ms));
                    node.replication = replication;
                }
                Err(e) => {
                    conns[i] = None;
                    node.last_error = Some(e);
                }
            }
        }
        topo.primary = topo
            .nodes
            .iter()
            .position(|n| n.reachable && n.read_only == Some(false));
        log_read_changes(&tx.borrow(), &topo);
        let changed = tx.borrow().primary != topo.primary;
        if changed {
            match topo.primary_node() {
                Some(p) => tracing::info!(node = %p.name, address = %p.address, "primary is now"),
                None => tracing::warn!("no writable node found"),
            }
        }
        if *tx.borrow().as_ref() != topo {
            tx.send_replace(Arc::new(topo));
        }
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
    version: String,
    autocommit: bool,
    replication: Option<ReplicaHealth>,
}

async fn probe(cfg: &Config, addr: &str, slot: &mut Option<BackendConn>) -> Result<Probed, String> {
    if slot.is_none() {
        *slot = Some(
            monitor_connect(cfg, addr)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let Some(conn) = slot.as_mut() else {
        return Err("no monitor connection".into());
    };
    let fut = conn.query("SELECT @@global.read_only, VERSION(), @@global.autocommit");
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
            .map_err(|_| "replication status query timed out".to_string())?
            .map_err(|e| e.to_string())?;
        replica_health(&r.columns, r.text_rows().first())
    } else {
        None
    };
    Ok(Probed {
        read_only,
        version: row.get(1).cloned().flatten().unwrap_or_default(),
        autocommit: flag(2),
        replication,
    })
}

/// The replication health in a `SHOW SLAVE STATUS` row (`None`: no replication set up).
fn replica_health(columns: &[String], row: Option<&Vec<Option<String>>>) -> Option<ReplicaHealth> {
    let row = row?;
    let get = |name: &str| {
        columns
            .iter()
            .position(|c| c == name)
            .and_then(|i| row.get(i).cloned().flatten())
            .unwrap_or_default()
    };
    let mut error = get("Last_SQL_Error");
    if error.is_empty() {
        error = get("Last_IO_Error");
    }
    Some(ReplicaHealth {
        io_running: get("Slave_IO_Running") == "Yes",
        sql_running: get("Slave_SQL_Running") == "Yes",
        lag_ms: get("Seconds_Behind_Master")
            .parse::<u64>()
            .ok()
            .map(|s| s * 1000),
        source: format!("{}:{}", get("Master_Host"), get("Master_Port")),
        error,
    })
}
