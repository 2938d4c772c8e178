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
pub mod gtid;
pub mod ops;
pub mod probe;

pub use detect::{
    detect_primary_loss, find_writable, FailoverGuard, LossDetector, LossReport, LossVerdict,
};
pub use gtid::{Gtid, GtidParseError, GtidPos};
pub use ops::{
    failover, rejoin, switchover, FailoverReport, Phase, RejoinReport, SwitchoverReport,
};
pub use probe::{probe_all, probe_node, NodeReplication, SlaveStatus};

use crate::backend::BackendError;
use holdfast_sql::quote;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How holdfast treats replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HaMode {
    /// Something else manages replication; holdfast follows the writable node.
    #[default]
    External,
    /// holdfast runs switchovers and failovers itself.
    Managed,
}

/// The `[ha]` configuration section.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    pub mode: HaMode,
    /// Account the replicas connect to the primary with (`REPLICATION SLAVE`).
    pub repl_user: String,
    pub repl_password: String,
    /// `MASTER_CONNECT_RETRY` for re-pointed replicas, seconds.
    pub master_connect_retry_secs: u32,
    /// How long a switchover target (or a rejoining node) may take to catch up.
    pub catchup_timeout_ms: u64,
    /// `lock_wait_timeout` for fencing the old primary with `FLUSH TABLES WITH READ LOCK`.
    pub fence_timeout_ms: u64,
    /// Kill client connections on the old primary after `read_only=ON` (their open
    /// transactions roll back; accounts that bypass `read_only` cannot write any more).
    pub kill_old_primary_connections: bool,
    /// Upper bound for any single control statement.
    pub statement_timeout_ms: u64,
    /// Failure detector: time between probes of the primary.
    pub probe_interval_ms: u64,
    /// Failure detector: a probe slower than this counts as failed.
    pub probe_timeout_ms: u64,
    /// Failure detector: the primary is lost once probes have failed this long…
    pub failover_after_ms: u64,
    /// …and at least this many in a row.
    pub failure_threshold: u32,
    /// Only fail over when every reachable replica has lost the primary too.
    pub require_replica_confirmation: bool,
    /// During failover, how long replicas get to apply what their IO thread received.
    pub relay_apply_timeout_ms: u64,
    /// No second automatic failover within this window.
    pub failover_cooloff_ms: u64,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            mode: HaMode::External,
            repl_user: "repl".into(),
            repl_password: String::new(),
            master_connect_retry_secs: 1,
            catchup_timeout_ms: 30_000,
            fence_timeout_ms: 5_000,
            kill_old_primary_connections: true,
            statement_timeout_ms: 10_000,
            probe_interval_ms: 250,
            probe_timeout_ms: 500,
            failover_after_ms: 1_000,
            failure_threshold: 3,
            require_replica_confirmation: true,
            relay_apply_timeout_ms: 5_000,
            failover_cooloff_ms: 60_000,
        }
    }
}

impl std::fmt::Debug for HaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaConfig")
            .field("mode", &self.mode)
            .field("repl_user", &self.repl_user)
            .field("repl_password", &"<redacted>")
            .field("master_connect_retry_secs", &self.master_connect_retry_secs)
            .field("catchup_timeout_ms", &self.catchup_timeout_ms)
            .field("fence_timeout_ms", &self.fence_timeout_ms)
            .field(
                "kill_old_primary_connections",
                &self.kill_old_primary_connections,
            )
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .field("probe_interval_ms", &self.probe_interval_ms)
            .field("probe_timeout_ms", &self.probe_timeout_ms)
            .field("failover_after_ms", &self.failover_after_ms)
            .field("failure_threshold", &self.failure_threshold)
            .field(
                "require_replica_confirmation",
                &self.require_replica_confirmation,
            )
            .field("relay_apply_timeout_ms", &self.relay_apply_timeout_ms)
            .field("failover_cooloff_ms", &self.failover_cooloff_ms)
            .finish()
    }
}

impl HaConfig {
    pub fn catchup_timeout(&self) -> Duration {
        Duration::from_millis(self.catchup_timeout_ms)
    }
    pub fn fence_timeout(&self) -> Duration {
        Duration::from_millis(self.fence_timeout_ms)
    }
    pub fn statement_timeout(&self) -> Duration {
        Duration::from_millis(self.statement_timeout_ms)
    }
    pub fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms)
    }
    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_ms)
    }
    pub fn failover_after(&self) -> Duration {
        Duration::from_millis(self.failover_after_ms)
    }
    pub fn relay_apply_timeout(&self) -> Duration {
        Duration::from_millis(self.relay_apply_timeout_ms)
    }
    pub fn failover_cooloff(&self) -> Duration {
        Duration::from_millis(self.failover_cooloff_ms)
    }

    /// Checks the values the manager cannot work with.
    pub fn validate(&self) -> Result<(), HaError> {
        if self.mode == HaMode::Managed && self.repl_user.is_empty() {
            return Err(HaError::InvalidConfig(
                "ha.repl_user must be set in managed mode".into(),
            ));
        }
        if self.probe_interval_ms == 0 || self.probe_timeout_ms == 0 {
            return Err(HaError::InvalidConfig(
                "ha.probe_interval_ms and ha.probe_timeout_ms must be positive".into(),
            ));
        }
        if self.failure_threshold == 0 {
            return Err(HaError::InvalidConfig(
                "ha.failure_threshold must be at least 1".into(),
            ));
        }
        // CHANGE MASTER TO takes only plain literals: in managed mode, refuse now what a
        // switchover could not write (see `holdfast_sql::quote::plain_string_literal`).
        if self.mode == HaMode::Managed {
            for (what, value) in [
                ("ha.repl_user", self.repl_user.as_str()),
                ("ha.repl_password", self.repl_password.as_str()),
            ] {
                quote::plain_string_literal(value)
                    .map_err(|e| HaError::InvalidConfig(format!("{what}: {e}")))?;
            }
        }
        Ok(())
    }
}

/// Why an HA operation did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("no node named {0:?} is configured")]
    UnknownNode(String),
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
    #[error("{node} has diverged from the primary and was not rejoined: {detail}")]
    Diverged { node: String, detail: String },
    #[error("a failover ran {since:?} ago; the next is allowed in {remaining:?}")]
    CoolingOff {
        since: Duration,
        remaining: Duration,
    },
    #[error("invalid HA configuration: {0}")]
    InvalidConfig(String),
    /// Another operation holds the controller (HTTP 409 in the admin API).
    #[error("another HA operation is running: {0}")]
    Busy(String),
    /// `ha.mode = "external"`: holdfast only follows the writable node.
    #[error("ha.mode is \"external\": replication is managed elsewhere and holdfast only follows the writable node; set ha.mode = \"managed\" to let holdfast run switchovers and failovers")]
    NotManaged,
    /// The operation's task ended without a result (it panicked).
    #[error("the HA operation was aborted: {0}")]
    Aborted(String),
}

impl HaError {
    /// Whether the request itself was wrong or not applicable now (as opposed to the
    /// operation failing on the servers): HTTP 400 rather than 500.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            HaError::UnknownNode(_)
                | HaError::AlreadyPrimary(_)
                | HaError::PrimaryAlive(_)
                | HaError::CoolingOff { .. }
                | HaError::InvalidConfig(_)
                | HaError::NotManaged
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

    #[test]
    fn config_defaults_and_redaction() {
        let c: HaConfig = toml::from_str("repl_password = \"s3cret\"\nmode = \"managed\"").unwrap();
        assert_eq!(c.mode, HaMode::Managed);
        assert_eq!(c.repl_user, "repl");
        assert!(c.failover_after() <= Duration::from_secs(2));
        assert!(c.validate().is_ok());
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(toml::from_str::<HaConfig>("bogus = 1").is_err());
        let c: HaConfig = toml::from_str("repl_password = 'a\\b'\nmode = \"managed\"").unwrap();
        assert!(
            matches!(c.validate(), Err(HaError::InvalidConfig(m)) if m.contains("repl_password"))
        );
    }
}
