//! The `[ha]` section: how holdfast treats replication.

use crate::{invalid_key, ConfigError, Secret};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
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

/// What a write acknowledged to a client is guaranteed to survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// MariaDB's default asynchronous replication: a failover can lose the primary's
    /// last acknowledged writes.
    #[default]
    Async,
    /// MariaDB's semi-synchronous replication, wait point AFTER_SYNC: a commit is
    /// acknowledged once a replica has it, so a failover to the most advanced replica loses
    /// no acknowledged write. holdfast sets it on every node in managed mode.
    SemiSync,
}

/// The `[ha]` configuration section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    pub mode: HaMode,
    /// Account the replicas connect to the primary with (`REPLICATION SLAVE`).
    pub repl_user: String,
    /// Never written back by `Config::to_toml`: prefer `repl_password_file`.
    #[serde(skip_serializing)]
    pub repl_password: Secret,
    /// A file whose first line is the replication password (read when the config is
    /// loaded; relative to the config's directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repl_password_file: Option<PathBuf>,
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
    /// Failure detector, fast path: the primary's host refusing connections this many
    /// times in a row (its server process is gone, the host is up: a much stronger signal
    /// than a slow probe) counts as lost without waiting for `failover_after_ms`; probes are
    /// repeated every `probe_interval_ms / 5` (at least 20 ms) while one is failing. The
    /// replica cross-check still applies. 0 turns the fast path off.
    pub refused_probes_to_fail: u32,
    /// Only fail over when every reachable replica has lost the primary too.
    pub require_replica_confirmation: bool,
    /// `async` or `semi-sync` (managed mode: holdfast checks and sets
    /// `rpl_semi_sync_master_enabled` with wait point AFTER_SYNC and
    /// `rpl_semi_sync_slave_enabled` on every node).
    pub durability: Durability,
    /// `rpl_semi_sync_master_timeout` with semi-sync: how long a commit waits for a
    /// replica's acknowledgement before MariaDB falls back to asynchronous replication
    /// (`/status` shows it, the log says so, and it is counted).
    pub semi_sync_timeout_ms: u64,
    /// Write a marker row (`holdfast.commit_marker`) inside each transaction that wrote,
    /// just before its COMMIT: a COMMIT whose answer was lost with its primary is then
    /// known to have committed or not, by reading the marker on the node that took over.
    pub commit_markers: bool,
    /// With commit markers: an autocommit INSERT/UPDATE/DELETE/REPLACE is wrapped in a
    /// transaction with a marker too, so one lost in flight is applied exactly once.
    pub mark_autocommit_writes: bool,
    /// During failover, how long replicas get to apply what their IO thread received. Only
    /// one that applied everything any replica received is promoted; otherwise the failover
    /// is withheld (an operator may force it).
    pub relay_apply_timeout_ms: u64,
    /// No second automatic failover within this window.
    pub failover_cooloff_ms: u64,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            mode: HaMode::External,
            repl_user: "repl".into(),
            repl_password: Secret::default(),
            repl_password_file: None,
            master_connect_retry_secs: 1,
            catchup_timeout_ms: 30_000,
            fence_timeout_ms: 5_000,
            kill_old_primary_connections: true,
            statement_timeout_ms: 10_000,
            probe_interval_ms: 250,
            probe_timeout_ms: 500,
            failover_after_ms: 1_000,
            failure_threshold: 3,
            refused_probes_to_fail: 2,
            require_replica_confirmation: true,
            durability: Durability::Async,
            semi_sync_timeout_ms: 10_000,
            commit_markers: false,
            mark_autocommit_writes: true,
            relay_apply_timeout_ms: 5_000,
            failover_cooloff_ms: 60_000,
        }
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mode == HaMode::Managed && self.repl_user.is_empty() {
            return Err(invalid_key("ha.repl_user", "must be set in managed mode"));
        }
        if self.probe_interval_ms == 0 {
            return Err(invalid_key("ha.probe_interval_ms", "must be positive"));
        }
        if self.probe_timeout_ms == 0 {
            return Err(invalid_key("ha.probe_timeout_ms", "must be positive"));
        }
        if self.failure_threshold == 0 {
            return Err(invalid_key("ha.failure_threshold", "must be at least 1"));
        }
        // CHANGE MASTER TO takes only plain '...' literals, and a backslash or control byte
        // reads differently with and without NO_BACKSLASH_ESCAPES: refuse now what a
        // switchover could not write.
        if self.mode == HaMode::Managed {
            for (what, value) in [
                ("ha.repl_user", self.repl_user.as_str()),
                ("ha.repl_password", self.repl_password.expose()),
            ] {
                if value.chars().any(|c| c == '\\' || c.is_control()) {
                    return Err(invalid_key(
                        what,
                        "must not contain a backslash or control character (CHANGE MASTER TO cannot carry it under every sql_mode)",
                    ));
                }
            }
        }
        Ok(())
    }
}
