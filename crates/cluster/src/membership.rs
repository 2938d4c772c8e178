//! Nodes added and removed at run time (`ctl node add`, `ctl node remove`).
//!
//! * **Add**: the address must answer as a MariaDB/MySQL server to the monitor account,
//!   be read-only and replicate from the current primary; it joins the member list, the
//!   monitor probes it, and it takes reads once its replication runs within the lag limit.
//! * **Remove**: from that instant the node takes no new reads (it is marked draining);
//!   requests running on it get the drain window to finish; past it, what still runs there
//!   is stopped with `KILL QUERY` (that statement gets the server's ERR, its session goes
//!   on); then the node leaves the member list and holdfast's remaining connections there
//!   are closed; a node a failover left out leaves the HA state's `needs_rejoin` (a node
//!   added later under its name is a new one). The primary and the last node cannot be
//!   removed.

use crate::config::BackendConfig;
use crate::control::monitor_connect;
use crate::ha::controller::HaController;
use crate::ha::split_address;
use crate::topology::{Member, Members, NodeState, Topology};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("no node named {0:?}")]
    UnknownNode(String),
    #[error("{0:?} is the only node; holdfast needs at least one")]
    LastNode(String),
    #[error("{0:?} is the primary; switch over to another node first")]
    Primary(String),
    #[error("a node named {0:?} exists already")]
    NameTaken(String),
    #[error("node {existing:?} has the address {address} already")]
    AddressTaken { existing: String, address: String },
    #[error("invalid node name {0:?}: use letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("invalid address {0:?}: expected HOST:PORT")]
    BadAddress(String),
    #[error("{address} is not a database server holdfast can use: {reason}")]
    NotAServer { address: String, reason: String },
    #[error("{address} is writable (read_only is OFF); only replicas of the primary can be added")]
    Writable { address: String },
    #[error("{address} does not replicate (SHOW SLAVE STATUS is empty); set it up as a replica of the primary first")]
    NotReplicating { address: String },
    #[error("{address} replicates from {replicates_from}, not from the primary {primary} ({primary_address})")]
    ReplicatesElsewhere {
        address: String,
        replicates_from: String,
        primary: String,
        primary_address: String,
    },
    #[error("no primary is known; nodes are added once one is")]
    NoPrimary,
    #[error("{0:?} is being removed already")]
    Draining(String),
}

impl MembershipError {
    /// Whether the request itself was wrong (400), rather than the cluster's state (409).
    pub fn is_bad_request(&self) -> bool {
        !matches!(
            self,
            MembershipError::NoPrimary | MembershipError::Draining(_)
        )
    }
}

/// What a reload did to the `[[backend]]` list.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq, Eq)]
pub struct Reloaded {
    pub added: Vec<String>,
    /// Being removed (each drains for `[split] drain_ms` in the background).
    pub removing: Vec<String>,
    /// Nodes of the file that could not be added, or changed in place, with why.
    pub refused: Vec<String>,
}

/// What `node add` did.
#[derive(Debug, Serialize)]
pub struct Added {
    pub node: String,
    pub address: String,
    /// It takes reads already (its replication runs within the lag limit).
    pub serves_reads: bool,
}

/// What `node remove` did.
#[derive(Debug, Serialize)]
pub struct Removed {
    pub node: String,
    /// How long the requests running on it took to finish (or the whole window).
    pub drained_ms: u64,
    /// Requests still running when the window closed, stopped with `KILL QUERY`.
    pub interrupted: u32,
    /// holdfast's connections to it closed at the end.
    pub connections_closed: usize,
    /// `KILL`s the server refused (the monitor account needs CONNECTION ADMIN to stop
    /// the connections of other accounts), each with the server's error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kill_failures: Vec<String>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The nodes holdfast fronts, and the operations that change them. Sessions are not
/// touched: they see a node drain and go through the published [`Topology`], and the
/// connections still open on a removed node are stopped on the server by thread id.
pub struct Membership {
    config: crate::LiveConfig,
    /// The nodes holdfast fronts (the `[[backend]]`s, then `node add` / `node remove`).
    pub members: Members,
    topology: watch::Receiver<Arc<Topology>>,
    ha: Arc<HaController>,
}

impl Membership {
    /// The `[[backend]]`s of `config`, watched by the monitor through `topology`.
    pub fn new(
        config: crate::LiveConfig,
        topology: watch::Receiver<Arc<Topology>>,
        ha: Arc<HaController>,
    ) -> Self {
        Membership {
            members: crate::topology::members_of(&config.load()),
            config,
            topology,
            ha,
        }
    }

    /// Adds a replica of the primary at `address` under `name`.
    pub async fn add_node(
        &self,
        name: &str,
        address: &str,
        proxy_protocol: Option<bool>,
    ) -> Result<Added, MembershipError> {
        if !valid_name(name) {
            return Err(MembershipError::BadName(name.into()));
        }
        split_address(address).map_err(|_| MembershipError::BadAddress(address.into()))?;
        let members = self.members.borrow().clone();
        if members.iter().any(|m| m.backend.name == name) {
            return Err(MembershipError::NameTaken(name.into()));
        }
        if let Some(m) = members.iter().find(|m| m.backend.address == address) {
            return Err(MembershipError::AddressTaken {
                existing: m.backend.name.clone(),
                address: address.into(),
            });
        }
        let primary: NodeState = self
            .topology
            .borrow()
            .primary_node()
            .filter(|p| p.read_only == Some(false))
            .cloned()
            .ok_or(MembershipError::NoPrimary)?;
        self.check_replica(address, &primary).await?;
        let backend = BackendConfig {
            name: name.into(),
            address: address.into(),
            proxy_protocol: proxy_protocol.unwrap_or(primary.proxy_protocol),
        };
        self.members.send_modify(|list| {
            let mut next = list.as_ref().clone();
            next.push(Member {
                backend,
                draining: false,
            });
            *list = std::sync::Arc::new(next);
        });
        tracing::info!(node = name, address, "node added");
        // The monitor probes it at once (a member change nudges it).
        let mut topology = self.topology.clone();
        let seen = tokio::time::timeout(
            self.config.load().proxy.connect_timeout() + Duration::from_secs(2),
            topology.wait_for(|t| {
                t.observed
                    && t.nodes
                        .iter()
                        .any(|n| n.name == name && (n.reachable || n.last_error.is_some()))
            }),
        )
        .await;
        let serves_reads = matches!(seen, Ok(Ok(ref t)) if t.nodes.iter().any(|n| n.name == name && n.serves_reads));
        Ok(Added {
            node: name.into(),
            address: address.into(),
            serves_reads,
        })
    }

    /// The checks a node passes before it is added.
    async fn check_replica(
        &self,
        address: &str,
        primary: &NodeState,
    ) -> Result<(), MembershipError> {
        let not_a_server = |reason: String| MembershipError::NotAServer {
            address: address.into(),
            reason,
        };
        let cfg = self.config.load_full();
        let timeout = cfg.proxy.connect_timeout();
        let mut conn = tokio::time::timeout(timeout, monitor_connect(&cfg, address))
            .await
            .map_err(|_| not_a_server(format!("no answer within {} ms", timeout.as_millis())))?
            .map_err(|e| not_a_server(e.to_string()))?;
        let read_only = conn
            .query("SELECT @@global.read_only")
            .await
            .map_err(|e| not_a_server(e.to_string()))?;
        let on = read_only
            .rows
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .is_some_and(|v| crate::ha::probe::is_on(&v));
        if !on {
            return Err(MembershipError::Writable {
                address: address.into(),
            });
        }
        let answer = conn
            .execute(b"SHOW SLAVE STATUS", 1 << 20)
            .await
            .map_err(|e| not_a_server(e.to_string()))?;
        let status = match crate::ha::probe::SlaveStatus::of_answer(address, answer) {
            None => {
                return Err(MembershipError::NotReplicating {
                    address: address.into(),
                })
            }
            Some(s) => s.map_err(|e| not_a_server(e.to_string()))?,
        };
        if !status.points_at(&primary.address) {
            return Err(MembershipError::ReplicatesElsewhere {
                address: address.into(),
                replicates_from: status.source(),
                primary: primary.name.to_string(),
                primary_address: primary.address.to_string(),
            });
        }
        Ok(())
    }

    /// Removes `name` after draining it for `drain`.
    pub async fn remove_node(
        &self,
        name: &str,
        drain: Duration,
    ) -> Result<Removed, MembershipError> {
        let members = self.members.borrow().clone();
        let Some(member) = members.iter().find(|m| m.backend.name == name) else {
            return Err(MembershipError::UnknownNode(name.into()));
        };
        if member.draining {
            return Err(MembershipError::Draining(name.into()));
        }
        if members.iter().filter(|m| !m.draining).count() <= 1 {
            return Err(MembershipError::LastNode(name.into()));
        }
        if self.is_primary(name) {
            return Err(MembershipError::Primary(name.into()));
        }
        let address = member.backend.address.clone();
        self.set_draining(name, true);
        tracing::info!(
            node = name,
            drain_ms = drain.as_millis() as u64,
            "node removal: draining"
        );
        let load = self
            .topology
            .borrow()
            .node(name)
            .map(|n| n.load.0.clone())
            .unwrap_or_default();
        let started = Instant::now();
        let deadline = started + drain;
        while load.active() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let drained_ms = started.elapsed().as_millis() as u64;
        let interrupted = load.active();
        let threads: Vec<u32> = load.threads();
        let mut kill_failures = Vec::new();
        if interrupted > 0 {
            tracing::warn!(
                node = name,
                running = interrupted,
                "node removal: drain window over; stopping the statements still running there"
            );
            kill_failures.extend(self.kill_on(&address, &threads, "KILL QUERY").await.1);
            // Their sessions get the server's ERR; a little while for it to arrive.
            let grace = Instant::now() + Duration::from_secs(2);
            while load.active() > 0 && Instant::now() < grace {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.members.send_modify(|list| {
            let next: Vec<Member> = list
                .iter()
                .filter(|m| m.backend.name != name)
                .cloned()
                .collect();
            *list = std::sync::Arc::new(next);
        });
        // A node left out by a failover is no longer waited for (nor deposed).
        self.ha.forget_node(name);
        // Sessions drop their connections there when they next route a read; idle ones
        // are closed here.
        let threads = load.threads();
        let (closed, failed) = self.kill_on(&address, &threads, "KILL CONNECTION").await;
        kill_failures.extend(failed);
        tracing::info!(node = name, drained_ms, interrupted, closed, "node removed");
        if !kill_failures.is_empty() {
            tracing::warn!(node = name, failures = ?kill_failures, "node removal: the server refused to stop some of holdfast's connections there (the monitor account needs CONNECTION ADMIN)");
        }
        Ok(Removed {
            node: name.into(),
            drained_ms,
            interrupted,
            connections_closed: closed,
            kill_failures,
        })
    }

    /// Applies a reloaded configuration's `[[backend]]` list: nodes new to it are added
    /// (with the same checks as `node add`), nodes gone from it are removed with the
    /// configured drain (in the background). A node whose address or `proxy_protocol`
    /// changed is refused: remove it, then add it.
    pub async fn apply_backends(self: &Arc<Self>, backends: &[BackendConfig]) -> Reloaded {
        let members = self.members.borrow().clone();
        let mut report = Reloaded::default();
        for b in backends {
            match members.iter().find(|m| m.backend.name == b.name) {
                Some(m) if m.backend.address != b.address => report.refused.push(format!(
                    "{}: its address changed ({} -> {}); remove it, then add it",
                    b.name, m.backend.address, b.address
                )),
                Some(m) if m.backend.proxy_protocol != b.proxy_protocol => {
                    report.refused.push(format!(
                        "{}: its proxy_protocol changed ({} -> {}); remove it, then add it",
                        b.name, m.backend.proxy_protocol, b.proxy_protocol
                    ))
                }
                Some(_) => {}
                None => match self
                    .add_node(&b.name, &b.address, Some(b.proxy_protocol))
                    .await
                {
                    Ok(_) => report.added.push(b.name.clone()),
                    Err(e) => report.refused.push(format!("{}: {e}", b.name)),
                },
            }
        }
        for m in members.iter().filter(|m| !m.draining) {
            if backends.iter().any(|b| b.name == m.backend.name) {
                continue;
            }
            let shared = self.clone();
            let name = m.backend.name.clone();
            // Checked now, so that the answer says what will not happen.
            if self.is_primary(&name) {
                report.refused.push(format!(
                    "{name}: {}",
                    MembershipError::Primary(name.clone())
                ));
                continue;
            }
            report.removing.push(name.clone());
            let drain = self.config.load().split.drain();
            tokio::spawn(async move {
                if let Err(e) = shared.remove_node(&name, drain).await {
                    tracing::warn!(node = %name, error = %e, "reload: the node was not removed");
                }
            });
        }
        if report != Reloaded::default() {
            tracing::info!(added = ?report.added, removing = ?report.removing, refused = ?report.refused, "reload: the [[backend]] list applied");
        }
        report
    }

    fn is_primary(&self, name: &str) -> bool {
        self.topology
            .borrow()
            .primary_node()
            .is_some_and(|p| p.name == name)
    }

    fn set_draining(&self, name: &str, draining: bool) {
        self.members.send_modify(|list| {
            let next: Vec<Member> = list
                .iter()
                .map(|m| Member {
                    draining: if m.backend.name == name {
                        draining
                    } else {
                        m.draining
                    },
                    backend: m.backend.clone(),
                })
                .collect();
            *list = std::sync::Arc::new(next);
        });
    }

    /// Runs `kill` (`KILL QUERY`, `KILL CONNECTION`) for each thread on the node at
    /// `address`, with the monitor account: how many it stopped (a thread already gone,
    /// 1094, counts) and what the server refused.
    /// Runs `KILL CONNECTION` (or `KILL QUERY`, `query`) of `thread` on `node` as the monitor
    /// account (which needs CONNECTION ADMIN): an operator's kill of one session. A thread
    /// the server no longer knows counts as ended.
    pub async fn kill_thread(&self, node: &str, thread: u32, query: bool) -> Result<(), String> {
        let address = self
            .members
            .borrow()
            .iter()
            .find(|m| m.backend.name == node)
            .map(|m| m.backend.address.clone())
            .ok_or_else(|| format!("{node} is not a node holdfast serves"))?;
        let kill = if query {
            "KILL QUERY"
        } else {
            "KILL CONNECTION"
        };
        match self.kill_on(&address, &[thread], kill).await.1.pop() {
            None => Ok(()),
            Some(failed) => Err(failed),
        }
    }

    async fn kill_on(&self, address: &str, threads: &[u32], kill: &str) -> (usize, Vec<String>) {
        if threads.is_empty() {
            return (0, Vec::new());
        }
        let cfg = self.config.load_full();
        let mut conn = match monitor_connect(&cfg, address).await {
            Ok(c) => c,
            Err(e) => {
                return (
                    0,
                    vec![format!(
                        "{kill}: cannot connect as the monitor account: {e}"
                    )],
                )
            }
        };
        let (mut done, mut failed) = (0, Vec::new());
        for t in threads {
            match conn.query(&format!("{kill} {t}")).await {
                Ok(_) => done += 1,
                Err(crate::control::BackendError::Server { code: 1094, .. }) => done += 1,
                Err(e) => failed.push(format!("{kill} {t}: {e}")),
            }
        }
        (done, failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_plain() {
        assert!(valid_name("node4"));
        assert!(valid_name("db-2.eu_west"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("x;DROP"));
        assert!(!valid_name(&"n".repeat(65)));
    }
}
