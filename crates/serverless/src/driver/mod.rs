//! Control drivers: how holdfast starts, stops, freezes and scales a serverless instance.
//!
//! Two pause tiers: *freeze* suspends the server process (SIGSTOP or the cgroup freezer):
//! connections and buffers stay, resume takes milliseconds; *stop* shuts the server down and
//! frees its memory, resume is a cold start. Drivers report what they support.

use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

pub mod exec;
pub mod node;
pub mod process;
pub mod ready;
pub mod scripted;

pub use exec::ExecDriver;
pub use holdfast_config::serverless::{ExecDriverConfig, ProcessDriverConfig};
pub use process::ProcessDriver;
pub use scripted::ScriptedDriver;

/// What the instance's server is doing, as far as the driver can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerState {
    Running,
    Frozen,
    Stopped,
    /// The driver could not tell (its status command failed...), with why.
    Unknown(String),
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("the {driver} driver does not support {what}")]
    Unsupported {
        driver: &'static str,
        what: &'static str,
    },
    #[error("{0}")]
    Failed(String),
    #[error("timed out after {ms} ms waiting for {what}")]
    Timeout { what: String, ms: u64 },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// What a scale request could apply.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScaleApplied {
    /// CPU limit put in place, in CPUs (None: the driver could not limit CPU here).
    pub cpu_limit: Option<f64>,
    /// A human-readable note (e.g. "cgroup v2 cpu.max", "no writable cgroup").
    pub note: String,
}

pub type DriverFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DriverError>> + Send + 'a>>;

/// Controls one instance's server. Every method returns once the change is complete:
/// `start` and `thaw` once the server answers on its address, `stop` once it has exited.
pub trait InstanceDriver: Send + Sync {
    /// Short name for logs and errors: "process", "exec".
    fn kind(&self) -> &'static str;
    fn start(&self) -> DriverFuture<'_, ()>;
    fn stop(&self) -> DriverFuture<'_, ()>;
    fn supports_freeze(&self) -> bool;
    fn freeze(&self) -> DriverFuture<'_, ()>;
    fn thaw(&self) -> DriverFuture<'_, ()>;
    fn status(&self) -> DriverFuture<'_, PowerState>;
    /// Whether [`InstanceDriver::status`] is cheap enough to ask every few seconds (a /proc
    /// read) to notice a server that died while running. An operator's status command or a
    /// probe connection that often would load the server's host: such drivers say no.
    fn status_is_cheap(&self) -> bool {
        false
    }
    /// Applies a compute size in capacity units (1 CCU = 1 CPU and 2 GiB). Memory inside
    /// the server (buffer pool) is resized by the caller over SQL; the driver sets limits.
    fn scale(&self, ccu: f64) -> DriverFuture<'_, ScaleApplied>;
    /// Cumulative CPU seconds the server has used (user + system), if the driver can see it.
    fn cpu_seconds(&self) -> DriverFuture<'_, Option<f64>>;
    /// Bytes the instance stores (its data directory), if the driver can see it.
    fn storage_bytes(&self) -> DriverFuture<'_, Option<u64>>;
}

/// Which driver a serverless instance uses, from `[serverless.driver]` (the type lives in
/// `holdfast-config`).
pub use holdfast_config::serverless::InstanceDriverConfig as DriverConfig;

/// Builds the driver `config` names; `address` is the server's `host:port`, used to wait
/// until it is ready after a start or thaw.
pub fn build(config: &DriverConfig, address: &str) -> Box<dyn InstanceDriver> {
    match config {
        DriverConfig::Process(c) => Box::new(ProcessDriver::new(c.clone(), address)),
        DriverConfig::Exec(c) => Box::new(ExecDriver::new(c.clone(), address)),
    }
}
