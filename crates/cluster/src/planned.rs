//! Planned operations clients do not notice: a switchover that first lets sessions reach a
//! safe point, and a node restart (upgrade, resize) built on it.
//!
//! The sessions are the proxy's: this module raises the `switching` flag they watch, asks
//! them through [`SessionDrain`] whether all are parked, and lowers the flag once the
//! topology shows the new primary. It never touches a session itself.

use crate::config::Config;
use crate::driver::{self, NodeDriver, RestartSpec};
use crate::ha::controller::HaController;
use crate::ha::{HaError, SwitchoverReport};
use crate::topology::Topology;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a planned switchover asks of the sessions.
pub trait SessionDrain: Send + Sync {
    /// Whether every session is parked or idle outside a transaction with its state
    /// captured: nothing in flight that a switchover would cut, and nothing only the old
    /// primary knows.
    fn quiescent(&self) -> bool;
}

/// The other holdfast processes of a fleet, in a planned switchover: their sessions are
/// held at safe points too before the fence, and let go after.
pub trait FleetBarrier: Send + Sync {
    /// Tells the members a switchover starts; an epoch to wait for (`None`: it could not
    /// be said: the switchover goes ahead with this process's sessions alone).
    fn begin(&self) -> BoxFuture<'_, Option<i64>>;
    /// Whether every other member holds its sessions for the switchover of `epoch`.
    fn all_parked(&self, epoch: i64) -> BoxFuture<'_, bool>;
    /// Tells the members it is over: `new_primary` (none: it failed).
    fn end(&self, new_primary: Option<String>) -> BoxFuture<'_, ()>;
}

pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What a planned operation works with, borrowed from the proxy's shared state.
pub struct Planned<'a> {
    pub config: &'a Config,
    pub ha: &'a Arc<HaController>,
    pub topology: &'a watch::Receiver<Arc<Topology>>,
    /// True while a planned switchover runs: sessions at a safe point hold their requests.
    pub switching: &'a watch::Sender<bool>,
    /// Mirror of `switching` that sessions read per request without a lock.
    pub switching_now: &'a AtomicBool,
    pub sessions: &'a dyn SessionDrain,
    /// How nodes are restarted; none means restart/resize are refused.
    pub node_driver: Option<&'a Arc<dyn NodeDriver>>,
    /// The fleet's other members (`[cluster]`), held too.
    pub fleet: Option<&'a dyn FleetBarrier>,
}

impl Planned<'_> {
    /// A planned restart of `node` (upgrade or resize) that clients do not notice: if it is
    /// the primary, sessions are first switched over to another node (parked at safe
    /// points); the node restarts through the driver, rejoins as a replica, and, if it was
    /// the primary, becomes primary again by another switchover. Returns the steps taken.
    pub async fn restart_node(
        &self,
        node: &str,
        spec: &RestartSpec,
    ) -> Result<Vec<String>, RestartError> {
        let spec =
            &driver::allowed_spec(&self.config.driver, spec).map_err(RestartError::NotAllowed)?;
        let driver = self.node_driver.cloned().ok_or(RestartError::NoDriver)?;
        let mut steps = Vec::new();
        let was_primary = self
            .topology
            .borrow()
            .primary_node()
            .is_some_and(|n| n.name == node);
        if was_primary {
            steps.push(self.switchover_step(None, "away from", node).await?);
        }
        let t = Instant::now();
        driver
            .restart(node, spec)
            .await
            .map_err(|source| RestartError::Driver {
                node: node.to_string(),
                source,
            })?;
        steps.push(format!("restarted {node} ({} ms)", t.elapsed().as_millis()));
        let t = Instant::now();
        self.ha
            .rejoin(node.to_string())
            .await
            .map_err(|source| RestartError::Rejoin {
                node: node.to_string(),
                source,
            })?;
        steps.push(format!(
            "{node} replicates again ({} ms)",
            t.elapsed().as_millis()
        ));
        if was_primary {
            let back = Some(node.to_string());
            steps.push(self.switchover_step(back, "back to", node).await?);
        }
        Ok(steps)
    }

    /// One switchover of a planned restart, described for its step list.
    async fn switchover_step(
        &self,
        target: Option<String>,
        step: &'static str,
        node: &str,
    ) -> Result<String, RestartError> {
        let t = Instant::now();
        let r = self
            .switchover(target)
            .await
            .map_err(|source| RestartError::Switchover {
                step,
                node: node.to_string(),
                source,
            })?;
        Ok(format!(
            "switched over {} -> {} ({} ms)",
            r.old_primary,
            r.new_primary,
            t.elapsed().as_millis()
        ))
    }

    /// A planned switchover clients do not notice: sessions first finish their transactions
    /// and hold their next request (up to `proxy.switchover_drain_ms`), the HA manager
    /// switches, and the sessions resume on the new primary with their state.
    pub async fn switchover(&self, target: Option<String>) -> Result<SwitchoverReport, HaError> {
        self.switching_now.store(true, Ordering::SeqCst);
        self.switching.send_replace(true);
        let drain = Duration::from_millis(self.config.proxy.switchover_drain_ms);
        let start = Instant::now();
        let fleet_epoch = match self.fleet {
            Some(f) => f.begin().await,
            None => None,
        };
        while !self.sessions.quiescent() && start.elapsed() < drain {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let (Some(f), Some(epoch)) = (self.fleet, fleet_epoch) {
            loop {
                if f.all_parked(epoch).await {
                    tracing::info!(
                        ms = start.elapsed().as_millis() as u64,
                        "switchover: every member of the fleet holds its sessions"
                    );
                    break;
                }
                if start.elapsed() >= drain {
                    tracing::warn!(
                        drain_ms = drain.as_millis() as u64,
                        "switchover: some members of the fleet did not say their sessions are held in time; going ahead"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if !self.sessions.quiescent() {
            tracing::warn!(
                drain_ms = drain.as_millis() as u64,
                "switchover: some sessions did not reach a safe point in time; going ahead"
            );
        } else {
            tracing::info!(
                ms = start.elapsed().as_millis() as u64,
                "switchover: sessions parked"
            );
        }
        let result = self.ha.switchover(target).await;
        if let (Some(f), Some(_)) = (self.fleet, fleet_epoch) {
            f.end(result.as_ref().ok().map(|r| r.new_primary.clone()))
                .await;
        }
        if let Ok(report) = &result {
            // Let sessions resume only once the topology shows the new primary.
            wait_for_primary(self.topology, &report.new_primary).await;
        }
        self.switching_now.store(false, Ordering::SeqCst);
        self.switching.send_replace(false);
        result
    }
}

/// Waits (5 s at most) until `topology` shows `primary` as the primary: after a
/// switchover, before sessions held for it go on.
pub async fn wait_for_primary(topology: &watch::Receiver<Arc<Topology>>, primary: &str) {
    let mut topology = topology.clone();
    let seen = async {
        loop {
            let now = topology
                .borrow_and_update()
                .primary_node()
                .is_some_and(|n| n.name == primary);
            if now || topology.changed().await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), seen).await;
}

/// Why a planned restart of a node stopped.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    #[error(
        "no control driver is configured ([driver] kind = \"lab\"); holdfast cannot restart nodes"
    )]
    NoDriver,
    /// A binary or a server option the config does not allow (`[driver] binaries`,
    /// `allowed_options`); nothing was done.
    #[error("{0}")]
    NotAllowed(String),
    #[error("switchover {step} {node}: {source}")]
    Switchover {
        step: &'static str,
        node: String,
        source: HaError,
    },
    #[error("restarting {node}: {source}")]
    Driver {
        node: String,
        source: holdfast_serverless::driver::DriverError,
    },
    #[error("rejoining {node}: {source}")]
    Rejoin { node: String, source: HaError },
}
