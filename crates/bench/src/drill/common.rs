//! What the drills share: their options, sysbench against the lab, and reading sysbench's
//! output.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use holdfast_lab::LabStatus;

use crate::sysbench::Sysbench;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Scenario {
    /// Planned switchover to a replica (holdfast's HA manager, over the admin API).
    Switchover,
    /// The primary is killed (kill -9); holdfast fails over to the most advanced replica.
    Failover,
    /// Planned restart of the primary with a server binary (a minor-version upgrade) through
    /// `POST /restart`: sessions move to a replica and back.
    Restart,
    /// Planned restart of the primary with another buffer pool size through `POST /resize`.
    Resize,
    /// A replica made (`holdfast lab add-replica`, seeded from the primary) and added to
    /// holdfast (`POST /nodes/add`) while sysbench runs through the split listener.
    AddNode,
    /// A replica removed (`POST /nodes/remove`, 10 s drain, then `lab remove`) while sysbench
    /// runs through the split listener: the one `add-node` added, else the last replica.
    RemoveNode,
    /// A serverless instance (its own lab) that pauses whenever idle, frozen then stopped,
    /// with a pool of idle connections open throughout and sysbench connecting to it while
    /// it is paused.
    Serverless,
    /// Every scenario above, one after the other.
    All,
    /// The primary killed (kill -9) `--kills` times on a fresh lab, no load: the time from
    /// each kill to the answer of a session's next statement, from the new primary; median
    /// and maximum. Not part of `all`.
    FailoverTimes,
    /// Clients (list-append and bank transactions, text and prepared, through the main and
    /// the split listener) while `--faults` random faults hit the lab one after the other;
    /// the whole history is checked afterwards (lost and duplicated writes, G0, G1a, G1b,
    /// G1c, G2, divergence, bank totals, read-your-writes). Not part of `all`.
    Chaos,
    /// holdfast itself upgraded twice (`POST /upgrade`, its binary replaced in between)
    /// while sysbench runs through the main and the split listener and a client keeps
    /// opening new connections: none may fail. Not part of `all`.
    ProxyUpgrade,
    /// Two holdfast processes, members of one fleet through a local etcd, sysbench through
    /// each: a switchover asked of the member that does not lead, the primary killed, the
    /// leading member killed (kill -9): every surviving connection kept, exactly one
    /// promotion per cluster event, the lead moved within the lease. Not part of `all`.
    Fleet,
    /// A serverless instance behind two fleet members (`lab up --serverless --proxies 2`),
    /// a pool of idle connections on each: it pauses when the fleet is idle; a burst of
    /// logins on both members wakes it once; the leading member killed while it is paused,
    /// a client of the other wakes it, and the usage meter counts every second once. Not
    /// part of `all`.
    FleetServerless,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Switchover => "switchover",
            Scenario::Failover => "failover",
            Scenario::Restart => "restart",
            Scenario::Resize => "resize",
            Scenario::AddNode => "add-node",
            Scenario::RemoveNode => "remove-node",
            Scenario::Serverless => "serverless",
            Scenario::All => "all",
            Scenario::FailoverTimes => "failover-times",
            Scenario::Chaos => "chaos",
            Scenario::ProxyUpgrade => "proxy-upgrade",
            Scenario::Fleet => "fleet",
            Scenario::FleetServerless => "fleet-serverless",
        }
    }
}

/// Options of `holdfast-bench drill`.
#[derive(clap::Args)]
pub struct DrillArgs {
    /// Lab directory; a lab with two replicas is started there if none runs (the serverless
    /// scenario uses DIR-serverless).
    #[arg(long, default_value = "/tmp/holdfast-drill")]
    pub dir: PathBuf,
    /// The maintenance event to drill, or all of them.
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    pub scenario: Scenario,
    /// Seconds of sysbench per scenario; the event happens a third of the way in.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// sysbench threads (and, in the serverless scenario, pooled idle connections).
    #[arg(long, default_value_t = 20)]
    pub threads: u32,
    /// sysbench tables.
    #[arg(long, default_value_t = 20)]
    pub tables: u32,
    /// Rows per sysbench table.
    #[arg(long, default_value_t = 10_000)]
    pub table_size: u32,
    /// Leave the lab running afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Kills in the failover-times scenario.
    #[arg(long, default_value_t = 10)]
    pub kills: u32,
    #[command(flatten)]
    pub chaos: ChaosArgs,
}

/// Options of the chaos scenario.
#[derive(clap::Args, Clone, Debug)]
pub struct ChaosArgs {
    /// Faults injected one after the other (chaos).
    #[arg(long, default_value_t = 50)]
    pub faults: u32,
    /// Concurrent clients (chaos): a quarter run bank transfers and reads, the others
    /// list-append transactions; half go through the split listener.
    #[arg(long, default_value_t = 16)]
    pub clients: u32,
    /// Seed of the fault schedule and the clients' choices (chaos) [default: from the clock].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds after which no further fault is injected (chaos); the run then ends.
    #[arg(long, default_value_t = 540)]
    pub duration_limit: u64,
    /// Base port of the chaos scenario's fresh lab (holdfast at BASE, admin BASE+1, split
    /// BASE+2, nodes from BASE+10).
    #[arg(long, default_value_t = holdfast_lab::DEFAULT_BASE_PORT + 200)]
    pub base_port: u16,
    /// Faults to inject in this order, repeated (chaos), instead of random ones: kill,
    /// switchover, restart, freeze, stall, slow, cut-holdfast, cut-replicas, remove-add
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// How network cuts cut (chaos): `random` (a quarter rejected, the rest dropped),
    /// `drop` (packets vanish, as in a partition) or `reject` (answered with a reset).
    #[arg(long, value_enum, default_value_t = CutMode::Random)]
    pub cut_mode: CutMode,
}

/// How the chaos drill's network cuts cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CutMode {
    Random,
    Drop,
    Reject,
}

/// The options of a drill's sysbench run: `threads` for `seconds`, prepared statements
/// where the test has them, a report each second, and the errors holdfast may answer
/// that sysbench is to count and go on from (its own list, deadlocks retried, plus 1180:
/// a COMMIT whose outcome holdfast cannot tell).
pub fn run_options(threads: u32, seconds: u64) -> Vec<String> {
    vec![
        format!("--threads={threads}"),
        format!("--time={seconds}"),
        "--db-ps-mode=auto".into(),
        "--report-interval=1".into(),
        "--mysql-ignore-errors=1213,1020,1205,1180".into(),
    ]
}

/// Kills the holdfast `process` now (kill -9), leaving its registration for the lab's
/// `down` to see it gone; its pid.
pub fn kill_holdfast(process: &mut Option<crate::serve::Helper>) -> Result<u32> {
    let pid = process
        .as_ref()
        .map(|p| p.pid)
        .context("the member's process")?;
    holdfast_lab::procs::kill_now(pid)?;
    if let Some(p) = process.take() {
        p.keep();
    }
    Ok(pid)
}

/// sysbench (from PATH) against `lab` with the drill's table sizes.
pub fn sysbench(lab: &LabStatus, args: &DrillArgs) -> Sysbench {
    // The drills leave --mysql-ignore-errors at sysbench's default (deadlocks retried).
    Sysbench::for_lab("sysbench".into(), lab, args.tables, args.table_size, "")
}

/// Starts sysbench with `args`, its output kept for `wait_with_output`.
pub fn start_sysbench(args: &[String]) -> Result<std::process::Child> {
    Command::new("sysbench")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run sysbench (apt-get install sysbench)")
}

/// Runs sysbench with `args` to its end.
pub fn run_sysbench(args: &[String]) -> Result<Output> {
    Command::new("sysbench")
        .args(args)
        .output()
        .context("cannot run sysbench (apt-get install sysbench)")
}

/// sysbench `cleanup` (errors ignored), then `prepare` of the oltp tables through `port`.
pub fn prepare(sb: &Sysbench, port: u16) -> Result<()> {
    let _ = run_sysbench(&sb.command("oltp_read_write", port, &[], "cleanup"));
    let ticker = holdfast_lab::progress::Ticker::start("sysbench prepare", || None);
    let prep = run_sysbench(&sb.command("oltp_read_write", port, &[], "prepare"));
    drop(ticker);
    let prep = prep?;
    if !prep.status.success() {
        bail!(
            "sysbench prepare failed: {}",
            String::from_utf8_lossy(&prep.stderr)
        );
    }
    Ok(())
}

/// stdout then stderr of a finished process, as text.
pub fn output_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The first word after `key` at the start of a (trimmed) line, parsed; the default when
/// there is none (sysbench leaves out what did not happen).
pub fn value_after<T: FromStr + Default>(text: &str, key: &str) -> T {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sysbench_figures() {
        let text = "    transactions:  1234  (41.1 per sec.)\n         max:   20.11\n";
        assert_eq!(value_after::<u64>(text, "transactions:"), 1234);
        assert_eq!(value_after::<f64>(text, "max:"), 20.11);
        assert_eq!(value_after::<u64>(text, "reconnects:"), 0);
    }

    #[test]
    fn drill_args_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: DrillArgs,
        }
        let cli =
            Cli::try_parse_from(["drill", "--scenario", "switchover", "--seconds", "9"]).unwrap();
        assert_eq!(cli.args.scenario, Scenario::Switchover);
        assert_eq!(cli.args.seconds, 9);
        assert_eq!(cli.args.threads, 20);
    }
}
