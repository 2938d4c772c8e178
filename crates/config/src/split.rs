//! Read/write splitting: the `routing` of a listener and the `[split]` section.

use crate::{invalid_key, ConfigError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where a listener's sessions send their statements.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Everything goes to the primary.
    #[default]
    Primary,
    /// Reads that may run anywhere go to the replicas (least active requests first); all
    /// else, and every statement of a read-write transaction, to the primary.
    Split,
}

impl Routing {
    pub fn is_primary(&self) -> bool {
        *self == Routing::Primary
    }
}

/// What a read on a replica is guaranteed to see.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// The session's own writes: the replica first waits for the session's last GTID.
    #[default]
    Session,
    /// Every write committed before the read: the replica waits for the primary's GTID
    /// position at the time of the read (one more round trip to the primary per read).
    Global,
    /// Whatever the replica has applied (within `max_replica_lag_ms`).
    None,
}

/// The `[split]` section: how split listeners choose nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SplitConfig {
    /// A replica further behind its primary than this takes no reads until it catches up.
    pub max_replica_lag_ms: u64,
    pub consistency: Consistency,
    /// How long a replica may wait for the position a read must see (MASTER_GTID_WAIT)
    /// before the read goes to the primary instead.
    pub causal_wait_ms: u64,
    /// The primary's share of reads against a replica's 1.0 when it balances by active
    /// requests; 0 keeps reads off the primary while a replica qualifies.
    pub primary_read_weight: f64,
    /// How long a node removed with `ctl node remove` gives the requests running on it
    /// before holdfast closes its connections there (unless the command says otherwise).
    pub drain_ms: u64,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            max_replica_lag_ms: 5_000,
            consistency: Consistency::Session,
            causal_wait_ms: 500,
            primary_read_weight: 0.0,
            drain_ms: 60_000,
        }
    }
}

impl SplitConfig {
    pub fn causal_wait(&self) -> Duration {
        Duration::from_millis(self.causal_wait_ms)
    }
    pub fn drain(&self) -> Duration {
        Duration::from_millis(self.drain_ms)
    }
    pub fn max_replica_lag(&self) -> Duration {
        Duration::from_millis(self.max_replica_lag_ms)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.primary_read_weight.is_finite() && self.primary_read_weight >= 0.0) {
            return Err(invalid_key(
                "split.primary_read_weight",
                format!("must be 0 or more, not {}", self.primary_read_weight),
            ));
        }
        if self.causal_wait_ms == 0 && self.consistency != Consistency::None {
            return Err(invalid_key(
                "split.causal_wait_ms",
                "must be above 0 unless consistency = \"none\"",
            ));
        }
        Ok(())
    }
}
