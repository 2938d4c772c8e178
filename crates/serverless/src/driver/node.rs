//! Restarting one node of a cluster (a minor-version upgrade with another binary, or a resize
//! with other server options). The proxy's planned restart (`Shared::restart_node`) parks
//! sessions and switches over around it; the lab implements it for its processes.

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;

/// What a restart changes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestartSpec {
    /// Another server binary to run (an upgrade).
    pub binary: Option<String>,
    /// Server options as `key=value` (a resize), e.g. `innodb_buffer_pool_size=256M`.
    pub set: Vec<String>,
}

pub type NodeFuture<'a> = Pin<Box<dyn Future<Output = Result<(), super::DriverError>> + Send + 'a>>;

/// Restarts one node and returns once it accepts connections again.
pub trait NodeDriver: Send + Sync {
    fn restart<'a>(&'a self, node: &'a str, spec: &'a RestartSpec) -> NodeFuture<'a>;
}
