//! `holdfast-bench`: benchmarks, maintenance drills and the demo, run against a built
//! `holdfast` binary (started as `holdfast serve`), so the server binary carries none of it.

mod admin;
mod bare_relay;
mod bench;
mod chart;
mod demo;
mod drill;
mod fuzz;
mod progress;
mod record_layer;
mod replay_memory;
mod report;
mod resume;
mod serve;
mod sysbench;
mod uring_relay;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

/// Benchmarks, maintenance drills and the demo for holdfast, on a local lab cluster of real
/// mariadbd processes. Each starts the `holdfast` binary next to this one (same target
/// directory) as `holdfast serve`; build both with
/// `cargo build --release -p holdfast -p holdfast-bench`, or name another with --holdfast.
///
/// Quick start on a fresh machine:  holdfast-bench demo --dir /tmp/holdfast-demo
#[derive(Parser)]
#[command(name = "holdfast-bench", version, about, long_about)]
struct Cli {
    /// The holdfast binary to run [default: `holdfast` next to this executable].
    #[arg(long, global = true, value_name = "PATH", env = "HOLDFAST_BIN")]
    holdfast: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// sysbench through direct, HAProxy and holdfast, interleaved, with medians and ratios.
    ///
    /// Example: holdfast-bench bench --rounds 3 --time 20 --out bench.md
    Bench(Box<bench::BenchArgs>),
    /// Serverless resume latency per pause tier (freeze, stop) next to a raw mariadbd cold
    /// start, and sysbench threads arriving together at a stopped instance.
    ///
    /// Example: holdfast-bench bench-resume --cycles 20 --out resume.md
    BenchResume(resume::ResumeBenchArgs),
    /// Memory per session under an open transaction of many tiny statements, with
    /// transaction replay on and off: holdfast's RSS and each session's replay account.
    ///
    /// Example: holdfast-bench bench-replay-memory --sessions 50 --statements 10000
    BenchReplayMemory(replay_memory::ReplayMemoryArgs),
    /// sysbench through holdfast while the primary is switched over, restarted, resized or
    /// killed mid-run, and a serverless instance pausing under a pool of idle connections;
    /// prints connections kept, errors and the longest stall per scenario.
    ///
    /// Example: holdfast-bench drill --scenario all
    Drill(drill::DrillArgs),
    /// The embedded default: a lab cluster, the proxy in front of it, real clients through it.
    ///
    /// Example: holdfast-bench demo --dir /tmp/holdfast-demo
    Demo(demo::DemoArgs),
    /// The differential fuzzer for routing and rewriting: random sessions (comments,
    /// executable comments, multi-statements, locks, temporary tables, prepared statements,
    /// CALL, sequences...) directly and through the main and split listeners; answers,
    /// binlog events, data, locks held and replica writes must be the same.
    ///
    /// Example: holdfast-bench fuzz --seed 1 --duration 3600
    Fuzz(fuzz::FuzzArgs),
    /// A bare tokio relay (accept, connect, copy_bidirectional) to one server: the
    /// `bare_relay` target of `bench`, the floor of any user-space proxy. Runs until killed.
    ///
    /// Example: holdfast-bench bare-relay --listen 127.0.0.1:7000 --to 127.0.0.1:3306
    BareRelay(bare_relay::BareRelayArgs),
    /// CPU per round trip of a TLS connection on holdfast's own record layer (what a
    /// session goes on with after a hand-over, or once its idle sockets parked) next to
    /// rustls, both ends in this process over loopback.
    ///
    /// Example: holdfast-bench record-layer --round-trips 100000 --rounds 3
    RecordLayer(record_layer::RecordLayerArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let holdfast = || holdfast_exe(cli.holdfast.as_deref());
    match cli.command {
        Command::Bench(args) => bench::run_bench(&args, &holdfast()?),
        Command::BenchResume(args) => resume::run_resume_bench(&args, &holdfast()?),
        Command::BenchReplayMemory(args) => replay_memory::run(&args, &holdfast()?),
        Command::Drill(args) => drill::run(&args, &holdfast()?),
        Command::Demo(args) => demo::run(&args, &holdfast()?),
        Command::Fuzz(args) => fuzz::run(&args, &holdfast()?),
        Command::BareRelay(args) => bare_relay::run(&args),
        Command::RecordLayer(args) => record_layer::run(&args),
    }
}

/// The `holdfast` binary: `explicit` (a path, or a bare name looked up on PATH), else the
/// `holdfast` next to this executable, as cargo builds both into the same target directory.
fn holdfast_exe(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(exe) = explicit {
        if exe.is_file() {
            return Ok(exe.to_path_buf());
        }
        if exe.components().count() == 1 {
            let name = exe.to_string_lossy();
            return holdfast_lab::procs::find_program(&[&name])
                .with_context(|| format!("--holdfast {name:?}: not a file, nor on PATH"));
        }
        bail!("--holdfast {}: no such file", exe.display());
    }
    let me = std::env::current_exe().context("cannot find this executable's path")?;
    let sibling = me.with_file_name("holdfast");
    if !sibling.is_file() {
        bail!(
            "no holdfast binary next to {}: build it with `cargo build --release -p holdfast -p holdfast-bench` \
             (both into the same directory), or pass --holdfast PATH",
            me.display()
        );
    }
    Ok(sibling)
}
