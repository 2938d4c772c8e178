//! Stand-alone front end of the lab, for trying it without the `holdfast` binary:
//!
//! ```text
//! cargo run -p holdfast-lab --example lab -- up --dir /tmp/lab --replicas 2
//! cargo run -p holdfast-lab --example lab -- bench --holdfast-exe target/release/holdfast --dir /tmp/bench
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use holdfast_lab::{BenchArgs, LabCommand};

#[derive(Parser)]
#[command(about = "holdfast lab and benchmark (stand-alone example)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    #[command(flatten)]
    Lab(LabCommand),
    /// Compare direct, HAProxy and holdfast with sysbench.
    Bench {
        /// The holdfast binary to benchmark.
        #[arg(long, default_value = "target/release/holdfast")]
        holdfast_exe: PathBuf,
        #[command(flatten)]
        args: BenchArgs,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Lab(cmd) => holdfast_lab::run(cmd),
        Cmd::Bench { holdfast_exe, args } => holdfast_lab::run_bench(&args, &holdfast_exe),
    }
}
