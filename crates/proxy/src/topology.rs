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
                }) => {
                    node.reachable = true;
                    node.read_only = Some(read_only);
                    node.version = version;
                    node.autocommit = Some(autocommit);
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

/// What one monitor round reads from a node.
struct Probed {
    read_only: bool,
    version: String,
    autocommit: bool,
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
    Ok(Probed {
        read_only: flag(0),
        version: row.get(1).cloned().flatten().unwrap_or_default(),
        autocommit: flag(2),
    })
}
