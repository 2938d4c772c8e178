//! The `[cluster]` section: this holdfast is one member of a fleet of holdfast processes in
//! front of the same database cluster, coordinated through etcd (membership, one leader).

use crate::{invalid_key, ConfigError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[cluster]`: present means this process is one member of a fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The fleet's name: its keys in etcd are under `/holdfast/<name>/`, so two fleets
    /// never share state. Letters, digits, `-` and `_`.
    pub name: String,
    /// The etcd endpoints (`http://host:port`), any of which may answer.
    pub etcd: Vec<String>,
    /// This member's name in the fleet, unique in it (default: the admin API's address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// The lease every member keeps: a member that cannot renew it within this time stops
    /// leading (it makes no cluster decision after), and the others see it gone.
    #[serde(default = "default_lease_ttl_secs")]
    pub lease_ttl_secs: u64,
}

fn default_lease_ttl_secs() -> u64 {
    3
}

impl ClusterConfig {
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_secs)
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&self.name) {
            return Err(invalid_key(
                "cluster.name",
                format!(
                    "{:?}: 1 to 64 letters, digits, '-' or '_' (it names the fleet's keys in etcd)",
                    self.name
                ),
            ));
        }
        if self.etcd.is_empty() {
            return Err(invalid_key(
                "cluster.etcd",
                "name at least one etcd endpoint (\"http://127.0.0.1:2379\")",
            ));
        }
        if let Some((i, e)) = self
            .etcd
            .iter()
            .enumerate()
            .find(|(_, e)| !e.starts_with("http://"))
        {
            return Err(invalid_key(
                format!("cluster.etcd[{i}]"),
                format!(
                    "{e:?}: an endpoint is http://host:port (TLS to etcd is not supported yet)"
                ),
            ));
        }
        if let Some(m) = &self.member {
            if m.is_empty() || m.contains('/') {
                return Err(invalid_key(
                    "cluster.member",
                    format!("{m:?}: a member name is not empty and has no '/'"),
                ));
            }
        }
        if !(2..=60).contains(&self.lease_ttl_secs) {
            return Err(invalid_key("cluster.lease_ttl_secs", "must be 2 to 60"));
        }
        Ok(())
    }
}
