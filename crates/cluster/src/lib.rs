//! holdfast's view of the database cluster, and what changes it.
//!
//! **Owns:** the nodes holdfast fronts and what they are ([`topology`]; [`monitor`], which
//! probes them and publishes a [`topology::Topology`] through a watch channel), adding and
//! removing them at run time ([`membership`]), high availability ([`ha`]: replication
//! probes, switchover, failover, rejoin, the failure detector, semi-sync durability, the
//! commit-marker table), planned operations clients do not notice ([`planned`]: a
//! switchover that waits for sessions, a node restart through a [`driver`]), the start-up
//! check of the monitor account's privileges ([`preflight`]), and holdfast's own control
//! connections to the nodes ([`control`]).
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
pub mod membership;
pub mod monitor;
pub mod planned;
pub mod preflight;
pub mod topology;
