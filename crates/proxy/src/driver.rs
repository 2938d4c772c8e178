//! Control drivers: how holdfast restarts a database node (a minor-version upgrade with
//! another binary, or a resize with other server options). The embedder passes one in
//! [`crate::Seams::node_driver`]; `holdfast serve` passes the lab's (`holdfast_lab::LabNodeDriver`)
//! when the config has `[driver] kind = "lab"`. The trait lives with the other control
//! drivers in `holdfast_serverless::driver`.

pub use holdfast_serverless::driver::node::{NodeDriver, NodeFuture as DriverFuture, RestartSpec};
