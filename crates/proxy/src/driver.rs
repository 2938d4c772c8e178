//! Control drivers: how holdfast restarts a database node (a minor-version upgrade with
//! another binary, or a resize with other server options). The embedder installs one in
//! [`crate::Shared::driver`]; `holdfast serve` installs the lab's local process driver when
//! the config has `[driver] kind = "lab"`.

use std::future::Future;
use std::pin::Pin;

/// What a restart changes.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RestartSpec {
    /// Another server binary to run (an upgrade).
    pub binary: Option<String>,
    /// Server options as `key=value` (a resize), e.g. `innodb_buffer_pool_size=256M`.
    pub set: Vec<String>,
}

pub type DriverFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Restarts one node and returns once it accepts connections again.
pub trait NodeDriver: Send + Sync {
    fn restart<'a>(&'a self, node: &'a str, spec: &'a RestartSpec) -> DriverFuture<'a>;
}
