//! Stand-alone front end of the lab, for trying it without the `holdfast` binary:
//!
//! ```text
//! cargo run -p holdfast-lab --example lab -- up --dir /tmp/lab --replicas 2
//! ```
//!
//! The benchmarks are `holdfast-bench` (crates/bench).

use clap::Parser;
use holdfast_lab::LabCommand;

#[derive(Parser)]
#[command(about = "holdfast lab (stand-alone example)")]
struct Cli {
    #[command(subcommand)]
    cmd: LabCommand,
}

fn main() -> anyhow::Result<()> {
    holdfast_lab::run(Cli::parse().cmd)
}
