//! What holdfast knows of the nodes: the members it fronts and, per node, whether it
//! answers, whether it is writable, how it replicates, what runs on it. The monitor
//! ([`crate::monitor`]) publishes a [`Topology`] through a watch channel so sessions read
//! the current view without locks.

use crate::config::{BackendConfig, Config};
use crate::ha::probe::SlaveStatus;
pub use crate::node_name::NodeName;
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeState {
    pub name: NodeName,
    pub address: NodeName,
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
    /// The server requires TLS of its clients (`require_secure_transport`): holdfast
    /// requires it of the clients it logs in there.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub requires_secure_transport: bool,
    /// The monitor account cannot log in (a configuration problem, not an outage): what
    /// clients refused for want of a node are told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login_error: Option<String>,
    /// What `SHOW SLAVE STATUS` says, for a node that replicates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicaHealth>,
    /// The node takes reads of split sessions: a reachable replica whose replication runs
    /// within `[split] max_replica_lag_ms`.
    pub serves_reads: bool,
    /// Requests running on the node right now, over all sessions (split sessions count
    /// theirs; see [`NodeLoad`]).
    pub load: LoadRef,
    /// Being removed (`ctl node remove`): it takes no new work; what runs there gets the
    /// drain window.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// A failover moved away from this node and it has not been rejoined: it is never the
    /// primary (it may come back writable, e.g. after SIGSTOP and SIGCONT, with commits
    /// nobody else has), takes no reads, and what a session sent it counts as lost.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deposed: bool,
}

/// One node holdfast fronts: a `[[backend]]` of the configuration, or one added at run
/// time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub backend: BackendConfig,
    pub draining: bool,
}

/// The nodes holdfast fronts now (the `[[backend]]`s at start, then `node add` and `node
/// remove`), published to the monitor.
pub type Members = watch::Sender<Arc<Vec<Member>>>;

/// The member list of a configuration.
pub fn members_of(cfg: &Config) -> Members {
    watch::channel(Arc::new(member_list(cfg))).0
}

fn member_list(cfg: &Config) -> Vec<Member> {
    cfg.backends
        .iter()
        .map(|b| Member {
            backend: b.clone(),
            draining: false,
        })
        .collect()
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

impl From<&SlaveStatus> for ReplicaHealth {
    fn from(s: &SlaveStatus) -> Self {
        let error = if s.last_error.is_empty() {
            &s.last_io_error
        } else {
            &s.last_error
        };
        ReplicaHealth {
            io_running: s.io_running == "Yes",
            sql_running: s.sql_running == "Yes",
            lag_ms: s.seconds_behind_master.map(|secs| secs * 1000),
            source: s.source(),
            error: error.clone(),
        }
    }
}

impl ReplicaHealth {
    /// A replica whose replication is not known to run, and why.
    pub(crate) fn not_running(error: String) -> Self {
        ReplicaHealth {
            io_running: false,
            sql_running: false,
            lag_ms: None,
            source: String::new(),
            error,
        }
    }

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
    /// The server threads of split sessions' connections there (locked when one opens or
    /// closes, never per request), for a removal to stop and close them.
    threads: std::sync::Mutex<Vec<u32>>,
}

impl NodeLoad {
    pub fn active(&self) -> u32 {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn threads(&self) -> Vec<u32> {
        self.threads.lock().map(|t| t.clone()).unwrap_or_default()
    }

    pub fn opened(&self, thread: u32) {
        if let Ok(mut t) = self.threads.lock() {
            t.push(thread);
        }
    }

    pub fn closed(&self, thread: u32) {
        if let Ok(mut t) = self.threads.lock() {
            t.retain(|&x| x != thread);
        }
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
    /// Index into `nodes` of the primary, if one is known: the writable node, or the
    /// [`Topology::read_only_primary`].
    pub primary: Option<usize>,
    /// The primary is read-only: no node is writable and an operator made the primary
    /// read-only (`SET GLOBAL read_only=1` on the only server, say). That is no failover:
    /// sessions stay and logins go on, reads work and writes get the server's own 1290.
    /// Only a reachable node that replicates from nobody is taken for one, and only while no
    /// switchover runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only_primary: bool,
    /// The servers the nodes with a known version are, together (how executable comments
    /// read on any of them; `None`: no version known yet). Computed once a round, not per
    /// request.
    #[serde(skip)]
    pub node_servers: Option<holdfast_sql::Server>,
    /// Whether the monitor has completed at least one round.
    pub observed: bool,
}

impl Topology {
    pub fn from_config(cfg: &Config) -> Self {
        Self::of_members(&member_list(cfg))
    }

    /// A topology of `members` before any of them was probed.
    pub fn of_members(members: &[Member]) -> Self {
        Topology {
            nodes: members
                .iter()
                .map(
                    |Member {
                         backend: b,
                         draining,
                     }| NodeState {
                        name: NodeName::from(&b.name),
                        address: NodeName::from(&b.address),
                        proxy_protocol: b.proxy_protocol,
                        reachable: false,
                        read_only: None,
                        version: String::new(),
                        autocommit: None,
                        last_error: None,
                        login_error: None,
                        requires_secure_transport: false,
                        replication: None,
                        serves_reads: false,
                        load: LoadRef::default(),
                        draining: *draining,
                        deposed: false,
                    },
                )
                .collect(),
            primary: None,
            read_only_primary: false,
            node_servers: None,
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

    /// With no primary seen: the unreachable node the reachable replicas replicate from
    /// (the one most of them name), the primary that was. What a failure detector
    /// starting now (a fleet member that just became the leader) watches, as the one
    /// that ran before would have.
    pub fn former_primary(&self) -> Option<&NodeState> {
        if self.primary.is_some() {
            return None;
        }
        let mut named: Vec<(&NodeState, usize)> = Vec::new();
        for replica in self.nodes.iter().filter(|n| n.reachable) {
            let Some(source) = replica.replication.as_ref().map(|r| r.source.as_str()) else {
                continue;
            };
            let Some(node) = self
                .nodes
                .iter()
                .find(|n| !n.reachable && same_address(&n.address, source))
            else {
                continue;
            };
            match named.iter_mut().find(|(n, _)| n.name == node.name) {
                Some((_, count)) => *count += 1,
                None => named.push((node, 1)),
            }
        }
        named
            .into_iter()
            .max_by_key(|(_, count)| *count)
            .map(|(n, _)| n)
    }

    /// The nodes HA operations consider (those being removed left out).
    pub fn backends(&self) -> Vec<BackendConfig> {
        self.nodes
            .iter()
            .filter(|n| !n.draining)
            .map(|n| BackendConfig {
                name: n.name.to_string(),
                address: n.address.to_string(),
                proxy_protocol: n.proxy_protocol,
            })
            .collect()
    }

    /// The node named `name`, if the topology has it.
    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Whether a failover moved away from node `name` (see [`NodeState::deposed`]).
    pub fn is_deposed(&self, name: &str) -> bool {
        self.nodes.iter().any(|n| n.deposed && n.name == name)
    }

    /// The nodes that take reads of split sessions now.
    pub fn read_nodes(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.iter().filter(|n| n.serves_reads)
    }
}

/// Whether two `host:port` addresses name the same server as far as their text tells
/// (`localhost` and `127.0.0.1` alike, case aside).
fn same_address(a: &str, b: &str) -> bool {
    let normal = |s: &str| {
        let (host, port) = crate::ha::split_address(s).ok()?;
        let host = match host.to_ascii_lowercase().as_str() {
            "localhost" | "::1" => "127.0.0.1".to_string(),
            other => other.to_string(),
        };
        Some((host, port))
    };
    normal(a).is_some_and(|x| normal(b) == Some(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Topology {
        let members: Vec<Member> = ["node1", "node2", "node3"]
            .iter()
            .enumerate()
            .map(|(i, name)| Member {
                backend: BackendConfig {
                    name: name.to_string(),
                    address: format!("127.0.0.1:{}", 3310 + i),
                    proxy_protocol: false,
                },
                draining: false,
            })
            .collect();
        let mut t = Topology::of_members(&members);
        t.observed = true;
        t
    }

    fn replicating(t: &mut Topology, i: usize, source: &str) {
        t.nodes[i].reachable = true;
        t.nodes[i].read_only = Some(true);
        t.nodes[i].replication = Some(ReplicaHealth {
            io_running: false,
            sql_running: true,
            lag_ms: None,
            source: source.into(),
            error: String::new(),
        });
    }

    #[test]
    fn the_former_primary_is_the_unreachable_node_the_replicas_name() {
        let mut t = nodes();
        replicating(&mut t, 1, "localhost:3310");
        replicating(&mut t, 2, "127.0.0.1:3310");
        assert_eq!(t.former_primary().map(|n| n.name.as_str()), Some("node1"));
        // A node that answers is not gone: nothing to watch for a failover.
        t.nodes[0].reachable = true;
        assert!(t.former_primary().is_none());
        // Nor while a primary is seen.
        t.nodes[0].reachable = false;
        t.primary = Some(1);
        assert!(t.former_primary().is_none());
        // A source no node has.
        let mut t = nodes();
        replicating(&mut t, 1, "10.0.0.9:3306");
        assert!(t.former_primary().is_none());
    }
}
