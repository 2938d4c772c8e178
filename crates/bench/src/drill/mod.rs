//! `holdfast-bench drill`: sysbench through holdfast on a lab while the database goes
//! through a maintenance event mid-run ([`ha`]: switchover, restart, resize, failover), and
//! a serverless instance pausing under a pool of idle connections ([`serverless`]). What the
//! scenarios share (options, sysbench, reading its output) is in [`common`]; the writers
//! that check no acknowledged write was lost are in [`ack`]; the chaos drill with its history checker is in [`chaos`]; holdfast's own upgrade
//! under load is in [`upgrade`].

mod ack;
mod chaos;
mod common;
mod failover_times;
mod fleet;
mod fleet_serverless;
mod ha;
mod serverless;
mod upgrade;

use std::path::Path;

use anyhow::Result;

pub use common::DrillArgs;
use common::Scenario;

/// Runs the scenario(s) `args` names against `holdfast`.
pub fn run(args: &DrillArgs, holdfast: &Path) -> Result<()> {
    match args.scenario {
        Scenario::Serverless => serverless::run(args, holdfast),
        Scenario::All => {
            ha::run(args, holdfast, &ha::SCENARIOS)?;
            println!();
            serverless::run(args, holdfast)
        }
        Scenario::FailoverTimes => failover_times::run(args, holdfast),
        Scenario::Chaos => chaos::run(args, holdfast),
        Scenario::ProxyUpgrade => upgrade::run(args, holdfast),
        Scenario::Fleet => fleet::run(args, holdfast),
        Scenario::FleetServerless => fleet_serverless::run(args, holdfast),
        one => ha::run(args, holdfast, &[one]),
    }
}
