//! The built-in HA manager for MariaDB GTID replication.
//!
//! * [`probe`]: what each node reports about replication ([`NodeReplication`]), read with
//!   the monitor account.
//! * [`switchover`]: planned change of primary (fence the old primary, wait until the
//!   target has every transaction, promote it, re-point everyone else, the old primary
//!   included).
//! * [`failover`]: unplanned loss of the primary, cross-checked with the replicas; the
//!   most advanced replica is promoted, the dead node is left out until [`rejoin`].
//! * [`detect`]: the failure detector ([`detect_primary_loss`], [`LossDetector`]) and the
//!   cool-off between failovers ([`FailoverGuard`]).
//! * [`controller`]: the [`HaController`](controller::HaController) that runs these for
//!   the proxy, one at a time, with automatic failure detection in managed mode.
//! * [`find_writable`]: "external" mode, where something else manages replication and
//!   holdfast only follows the writable node.
//!
//! # MariaDB facts this relies on (10.11)
//! * `SET GLOBAL read_only=ON` waits for commits in flight, then refuses writes and
//!   commits of write transactions from accounts without `READ_ONLY ADMIN` (checked on
//!   10.11.19: `SUPER` alone does not bypass it, `READ_ONLY ADMIN` alone does, and
//!   `GRANT ALL PRIVILEGES` includes it — application accounts need
//!   `REVOKE READ_ONLY ADMIN`). Replication threads are never blocked.
//! * `FLUSH TABLES WITH READ LOCK` blocks writes and commits of *every* account while the
//!   connection holding it lives; a session holding it may still set `read_only`.
//! * `MASTER_GTID_WAIT(pos, timeout)` waits until `gtid_slave_pos` reaches `pos` (0) or
//!   times out (-1).
//! * With `log_slave_updates` every node's `gtid_binlog_pos` holds all it has applied; a
//!   node (re)pointed with `MASTER_USE_GTID=slave_pos` must first have `gtid_slave_pos`
//!   set to what it already has, or it fetches (or misses) transactions.
//! * A replica whose last GTID is not in the new primary's binlog while the primary has
//!   higher sequence numbers in that domain gets error 1236 (diverged) on connect.

pub mod controller;
pub mod detect;
pub mod durability;
pub mod gtid;
pub mod markers;
pub mod ops;
pub mod probe;
mod relay;

pub use detect::{
    detect_primary_loss, find_writable, FailoverGuard, LossDetector, LossReport, LossVerdict,
};
pub use gtid::{Gtid, GtidParseError, GtidPos};
pub use ops::{
    failover, failover_checked, rejoin, switchover, FailoverReport, Phase, RejoinReport,
    SwitchoverReport,
};
pub use probe::{probe_all, probe_node, NodeReplication, SlaveStatus};

use crate::control::BackendError;
use std::time::Duration;

pub use holdfast_config::ha::{HaConfig, HaMode};

/// Why an HA operation did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("no node named {0:?} is configured")]
    UnknownNode(String),
    /// A replication account value `CHANGE MASTER TO` cannot carry under every sql_mode.
    #[error("ha.repl_user / ha.repl_password: {0}")]
    Unquotable(holdfast_sql::quote::QuoteError),
    #[error("backend address {0:?} is not host:port")]
    BadAddress(String),
    #[error("cannot reach {node}: {source}")]
    Unreachable {
        node: String,
        source: Box<BackendError>,
    },
    #[error("on {node}, `{sql}` failed: {source}")]
    Sql {
        node: String,
        sql: String,
        source: Box<BackendError>,
    },
    #[error("on {node}, `{sql}` did not answer within {after:?}")]
    StatementTimeout {
        node: String,
        sql: String,
        after: Duration,
    },
    #[error("on {node}: {detail}")]
    Unexpected { node: String, detail: String },
    #[error("{node} reports an unreadable GTID position: {source}")]
    BadGtid {
        node: String,
        source: GtidParseError,
    },
    #[error("no writable node")]
    NoPrimary,
    #[error("several writable nodes: {0:?}")]
    MultiplePrimaries(Vec<String>),
    #[error("{0} is the primary already")]
    AlreadyPrimary(String),
    #[error("no replica can be promoted: {0}")]
    NoCandidate(String),
    #[error("{0} still answers and is writable: not a failover situation")]
    PrimaryAlive(String),
    #[error("primary loss not confirmed by the replicas: {0}")]
    Unconfirmed(String),
    #[error("cannot fence the old primary {node}: {detail}")]
    Fence { node: String, detail: String },
    #[error("{node} did not reach {target} within {after:?} (reached {reached})")]
    CatchupTimeout {
        node: String,
        target: GtidPos,
        reached: GtidPos,
        after: Duration,
    },
    /// No replica has applied every transaction the replicas received from the lost
    /// primary (acknowledged writes among them): an automatic failover would throw them
    /// away, so it is withheld until one catches up or an operator forces it.
    #[error("failover from {lost} withheld: no replica has applied all it received ({received}); {detail}; bring a replica's SQL thread up to date, or run `holdfast ctl failover --force` to promote anyway")]
    WouldLoseWrites {
        lost: String,
        received: GtidPos,
        detail: String,
        warnings: Vec<String>,
    },
    #[error("{node} has diverged from the primary and was not rejoined: {detail}")]
    Diverged { node: String, detail: String },
    #[error("a failover ran {since:?} ago; the next is allowed in {remaining:?}")]
    CoolingOff {
        since: Duration,
        remaining: Duration,
    },
    /// Another operation holds the controller (HTTP 409 in the admin API).
    #[error("another HA operation is running: {0}")]
    Busy(String),
    /// `ha.mode = "external"`: holdfast only follows the writable node.
    #[error("ha.mode is \"external\": replication is managed elsewhere and holdfast only follows the writable node; set ha.mode = \"managed\" to let holdfast run switchovers and failovers")]
    NotManaged,
    /// Another holdfast process is in charge of HA: this one is handing over to it during
    /// an upgrade, or taking over and not yet in charge, or another member of its fleet
    /// leads.
    #[error("another holdfast process is in charge of HA now ({0})")]
    NotInCharge(&'static str),
    /// The operation's task ended without a result (it panicked).
    #[error("the HA operation was aborted: {0}")]
    Aborted(String),
}

impl HaError {
    /// Whether the node's host refused the connection: its server process is gone while
    /// the host is up (a stronger sign of loss than a timeout).
    pub fn is_connection_refused(&self) -> bool {
        matches!(
            self,
            HaError::Unreachable { source, .. }
                if matches!(&**source, BackendError::Connect { source, .. }
                    if source.kind() == std::io::ErrorKind::ConnectionRefused)
        )
    }

    /// A failover not done because it would lose transactions a replica received.
    pub fn is_withheld(&self) -> bool {
        matches!(self, HaError::WouldLoseWrites { .. })
    }

    /// Whether the request itself was wrong or not applicable now (as opposed to the
    /// operation failing on the servers): HTTP 400 rather than 500.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            HaError::UnknownNode(_)
                | HaError::AlreadyPrimary(_)
                | HaError::PrimaryAlive(_)
                | HaError::CoolingOff { .. }
                | HaError::NotManaged
                | HaError::NotInCharge(_)
        )
    }
}

/// Splits `host:port` (IPv6 as `[::1]:3306`).
pub(crate) fn split_address(addr: &str) -> Result<(String, u16), HaError> {
    let bad = || HaError::BadAddress(addr.to_string());
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            split_address("127.0.0.1:3306").unwrap(),
            ("127.0.0.1".into(), 3306)
        );
        assert_eq!(split_address("[::1]:33").unwrap(), ("::1".into(), 33));
        assert!(split_address("nohost").is_err());
        assert!(split_address(":1").is_err());
    }
}
