//! The lab's node driver: `holdfast ctl restart|resize` restarts a lab node's mariadbd with
//! its data, optionally with another binary or other options ([`crate::restart_node`]).

use holdfast_serverless::driver::node::{NodeDriver, NodeFuture, RestartSpec};
use holdfast_serverless::driver::DriverError;
use std::path::PathBuf;

pub struct LabNodeDriver {
    /// The lab directory.
    pub dir: PathBuf,
}

impl NodeDriver for LabNodeDriver {
    fn restart<'a>(&'a self, node: &'a str, spec: &'a RestartSpec) -> NodeFuture<'a> {
        Box::pin(async move {
            let (dir, node, spec) = (self.dir.clone(), node.to_string(), spec.clone());
            tokio::task::spawn_blocking(move || {
                let binary = spec.binary.as_deref().map(std::path::Path::new);
                crate::restart_node(&dir, &node, binary, &spec.set)
                    .map(|_| ())
                    .map_err(|e| DriverError::Failed(format!("{e:#}")))
            })
            .await
            .map_err(|e| DriverError::Failed(format!("restart task: {e}")))?
        })
    }
}
