//! `holdfast-bench fuzz`: the differential fuzzer for routing and rewriting
//! (`holdfast_it::fuzz`) on a fresh lab (a primary, replicas) with the `holdfast` binary in
//! front of it, in the lab's own configuration (semi-sync, replay, commit markers, TLS, the
//! split listener). Prints a line per difference with a minimised reproduction, then a
//! verdict line; exits non-zero when anything differed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use holdfast_it::fuzz::{Fuzzer, Plan, Targets};
use holdfast_lab::wait_for;

use crate::admin;
use crate::serve::{self, split_port};

/// Options of `holdfast-bench fuzz`.
#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Seed of the generated sessions [default: from the clock].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds to fuzz for (sessions are started until then).
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Stop after this many sessions instead (whichever comes first).
    #[arg(long)]
    pub sessions: Option<u64>,
    /// Run only session number K of the seed (to reproduce a difference).
    #[arg(long, value_name = "K")]
    pub session: Option<u64>,
    /// Seconds allowed to minimise one difference.
    #[arg(long, default_value_t = 180)]
    pub shrink_secs: u64,
    /// Replicas in the lab.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Lab directory (a fresh lab is made there; an old one is removed).
    #[arg(long, default_value = "/tmp/holdfast-fuzz")]
    pub dir: PathBuf,
    /// Base port of the lab (holdfast at BASE, admin BASE+1, split BASE+2, nodes BASE+10..).
    #[arg(long, default_value_t = holdfast_lab::DEFAULT_BASE_PORT + 300)]
    pub base_port: u16,
    /// Leave the lab running afterwards.
    #[arg(long)]
    pub keep: bool,
}

pub fn run(args: &FuzzArgs, holdfast: &Path) -> Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    println!(
        "fuzz: seed {seed}, {} s{}, a fresh lab (1 primary, {} replicas) in {}",
        args.duration,
        args.sessions
            .map(|n| format!(" or {n} sessions"))
            .unwrap_or_default(),
        args.replicas,
        args.dir.display()
    );
    let _ = holdfast_lab::down(&args.dir);
    let _ = holdfast_lab::purge(&args.dir);
    let mut opts = holdfast_lab::LabOptions::new(&args.dir, args.replicas);
    opts.base_port = Some(args.base_port);
    let lab = holdfast_lab::up(&opts)?;
    let guard = serve::LabGuard((!args.keep).then(|| args.dir.clone()));
    let log = args.dir.join("holdfast-fuzz.log");
    let split = split_port(&lab)?;
    let (server, port) = serve::start_holdfast(holdfast, &lab, &lab.config, &log, &[split])?;
    let admin = admin::client(&lab);
    wait_for(
        "holdfast to see the primary, its replicas take reads and commit markers ready",
        Duration::from_secs(60),
        || {
            let st = admin::status(&admin).ok()?;
            let readers = st.topology.nodes.iter().filter(|n| n.serves_reads).count();
            (st.topology.primary.is_some()
                && readers >= args.replicas
                && st.commit_markers == "ready"
                && st.verifiers_loaded)
                .then_some(())
        },
    )?;
    // The lock checks read information_schema.METADATA_LOCK_INFO: each node's own plugin.
    for node in &lab.nodes {
        holdfast_lab::node_sql(
            node,
            "SET SESSION sql_log_bin = 0; INSTALL SONAME 'metadata_lock_info'",
        )
        .with_context(|| format!("loading metadata_lock_info on {}", node.name))?;
    }
    let addr =
        |a: &str| -> Result<SocketAddr> { a.parse().with_context(|| format!("bad address {a:?}")) };
    let primary = lab.primary()?;
    let targets = Targets {
        direct: addr(&primary.address)?,
        main: SocketAddr::from(([127, 0, 0, 1], port)),
        split: SocketAddr::from(([127, 0, 0, 1], split)),
        user: lab.app_user.clone(),
        password: lab.app_password.clone(),
        replicas: lab
            .nodes
            .iter()
            .filter(|n| n.name != primary.name)
            .map(|n| addr(&n.address))
            .collect::<Result<_>>()?,
    };
    let plan = Plan {
        seed,
        sessions: args.sessions,
        duration: Some(Duration::from_secs(args.duration)),
        only: args.session,
        shrink_budget: Duration::from_secs(args.shrink_secs),
    };
    let mut fuzzer = Fuzzer::new(targets)?;
    let report = fuzzer.run(&plan, &mut |line| println!("{line}"))?;
    for (signature, n) in &report.distinct {
        println!("   {n} x {signature}");
    }
    println!("{}", report.verdict(seed));
    println!("holdfast log: {}", log.display());
    drop(server);
    drop(guard);
    if !report.pass() {
        bail!("fuzz: FAIL");
    }
    Ok(())
}
