//! holdfast's view of the database cluster, and what changes it.
//!
//! **Owns:** the nodes holdfast fronts and what they are ([`topology`]; [`monitor`], which
//! probes them and publishes a [`topology::Topology`] through a watch channel), adding and
//! removing them at run time ([`membership`]), high availability ([`ha`]: replication
//! probes, switchover, failover, rejoin, the failure detector, semi-sync durability, the
//! commit-marker table), planned operations clients do not notice ([`planned`]: a
//! switchover that waits for sessions, a node restart through a [`driver`]), the start-up
//! check of the monitor account's privileges ([`preflight`]), and holdfast's own control
//! connections to the nodes ([`control`]). [`ClusterTasks::spawn`] starts what runs in the
//! background (the monitor, the HA controller, the durability and marker-table keepers).
//!
//! **Does not own:** client sessions, their backend connections, routing, authentication
//! of clients, serverless pausing, metrics or the admin API. Those live in
//! `holdfast-proxy`, which depends on this crate, never the reverse. The cluster tells
//! sessions what changed by publishing state (the topology watch channel, with a node's
//! `draining` and `deposed` flags; the `switching` flag of a planned switchover) and asks
//! them only through traits the proxy implements ([`planned::SessionDrain`],
//! [`monitor::ProbeGate`]).

/// The TOML configuration lives in the `holdfast-config` leaf crate; re-exported so that
/// `crate::config::X` paths read as in the proxy crate.
pub use holdfast_config as config;

pub mod control;
pub mod driver;
pub mod ha;
pub mod live;
pub mod membership;
pub mod monitor;
pub mod node_name;
pub mod planned;
pub mod preflight;
pub mod topology;

use ha::controller::HaController;
pub use live::LiveConfig;
use monitor::ProbeGate;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::watch;
use topology::{Member, Topology};

/// The cluster's background tasks and what they work with; [`ClusterTasks::spawn`] starts
/// them on the current tokio runtime.
pub struct ClusterTasks {
    /// The configuration in force (replaced by a reload).
    pub config: LiveConfig,
    /// Where the monitor publishes the topology (sessions hold its receivers).
    pub topology: watch::Sender<Arc<Topology>>,
    /// The members the monitor probes ([`membership::Membership::members`]).
    pub members: watch::Receiver<Arc<Vec<Member>>>,
    pub ha: Arc<HaController>,
    /// Asked before each probe round (none: always probe).
    pub probe_gate: Option<Arc<dyn ProbeGate>>,
    /// True while a planned switchover runs (see [`planned::Planned::switchover`]).
    pub switching: watch::Receiver<bool>,
    /// Set once the commit-marker table exists (with `[ha] commit_markers`).
    pub commit_markers_ready: Arc<AtomicBool>,
    /// Where the monitor publishes its own connections after each round.
    pub monitor_links: watch::Sender<Arc<monitor::MonitorLinks>>,
}

impl ClusterTasks {
    /// Starts the topology monitor, the HA controller (failure detection in managed mode),
    /// the keeper of semi-sync durability and, with `[ha] commit_markers`, the keeper of
    /// the marker table. They run until the runtime stops.
    pub fn spawn(self) {
        let ClusterTasks {
            config,
            topology,
            members,
            ha,
            probe_gate,
            switching,
            commit_markers_ready,
            monitor_links,
        } = self;
        let marker_topology = topology.subscribe();
        let outputs = monitor::MonitorOutputs {
            topology,
            links: monitor_links,
        };
        tokio::spawn(monitor::run_monitor(
            config.clone(),
            outputs,
            members,
            ha.topology_nudge(),
            probe_gate,
            switching,
            ha.subscribe(),
        ));
        tokio::spawn(ha.clone().run());
        tokio::spawn(ha.keep_durability());
        if config.load().ha.commit_markers {
            tokio::spawn(ha::markers::keep_marker_table(
                config,
                marker_topology,
                commit_markers_ready,
            ));
        }
    }
}
