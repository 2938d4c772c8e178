//! `holdfast-bench demo`: the README's first command. Brings up a lab cluster, starts the proxy in
//! front of it, and drives real clients (the mariadb CLI and sysbench) through it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use holdfast_lab::LabStatus;

use crate::serve::{self, proxy_port};
use crate::sysbench::Sysbench;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Where the lab lives (data dirs, logs, holdfast.toml).
    #[arg(long, default_value = "/tmp/holdfast-demo")]
    dir: PathBuf,
    /// Replicas beside the primary.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Seconds of sysbench oltp_read_write through holdfast.
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Leave the lab and proxy running afterwards.
    #[arg(long)]
    keep: bool,
}

fn mariadb(addr: &str, user: &str, password: &str, db: &str, sql: &str) -> Result<String> {
    let (host, port) = addr.rsplit_once(':').context("bad address")?;
    let out = Command::new("mariadb")
        .args([
            "-h",
            host,
            "-P",
            port,
            "-u",
            user,
            &format!("-p{password}"),
            "-D",
            db,
            "--batch",
            "-e",
            sql,
        ])
        .output()
        .context("cannot run the mariadb client (apt-get install mariadb-client)")?;
    if !out.status.success() {
        bail!(
            "mariadb client failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn run(args: &DemoArgs, holdfast: &Path) -> Result<()> {
    let lab = match holdfast_lab::status(&args.dir) {
        Ok(st) if st.nodes.iter().all(|n| n.alive) => {
            println!("using the lab already running in {}", args.dir.display());
            st
        }
        _ => {
            println!(
                "starting a lab cluster (1 primary, {} replicas) in {}",
                args.replicas,
                args.dir.display()
            );
            let _ = holdfast_lab::down(&args.dir);
            let _ = holdfast_lab::purge(&args.dir);
            let mut opts = holdfast_lab::LabOptions::new(&args.dir, args.replicas);
            opts.base_port = Some(holdfast_lab::DEFAULT_BASE_PORT);
            holdfast_lab::up(&opts)?
        }
    };
    print!("{}", holdfast_lab::status_table(&lab));
    let log = args.dir.join("holdfast.log");
    let (server, _) = serve::start_holdfast(holdfast, &lab, &lab.config, &log, &[])?;
    println!(
        "holdfast serving on {} (admin {}), log in {}",
        lab.proxy,
        lab.admin,
        log.display()
    );

    let out = mariadb(
        &lab.proxy,
        &lab.app_user,
        &lab.app_password,
        &lab.database,
        "SELECT @@hostname, @@port, VERSION(), CONNECTION_ID()",
    )?;
    println!("mariadb CLI through holdfast:\n{out}");
    match mariadb(
        &lab.proxy,
        &lab.app_user,
        "wrong-password",
        &lab.database,
        "SELECT 1",
    ) {
        Ok(_) => bail!("a wrong password was accepted"),
        Err(e) => println!("wrong password refused as the server would: {e}"),
    }
    sysbench(&lab, args.seconds)?;
    let status = Command::new(holdfast)
        .args(["ctl", "--config"])
        .arg(&lab.config)
        .arg("status")
        .output()?;
    println!("{}", String::from_utf8_lossy(&status.stdout));
    if args.keep {
        let pid = server.keep();
        println!(
            "left running: holdfast (pid {pid}), lab in {}; stop both with: holdfast lab down --dir {}",
            args.dir.display(),
            args.dir.display()
        );
    } else {
        drop(server);
        holdfast_lab::down(&args.dir)?;
        println!("lab stopped (data left in {})", args.dir.display());
    }
    Ok(())
}

fn sysbench(lab: &LabStatus, seconds: u32) -> Result<()> {
    let sb = Sysbench::for_lab("sysbench".into(), lab, 4, 1000, "");
    let port = proxy_port(lab)?;
    let common = |cmd: &str| sb.command("oltp_read_write", port, &[], cmd);
    let prep = Command::new("sysbench").args(common("cleanup")).output();
    if prep.is_err() {
        println!("sysbench not installed; skipping the load step");
        return Ok(());
    }
    run_checked(
        Command::new("sysbench").args(common("prepare")),
        "sysbench prepare",
    )?;
    let options = [
        format!("--time={seconds}"),
        "--threads=8".into(),
        "--db-ps-mode=auto".into(),
        "--report-interval=0".into(),
    ];
    let out = run_checked(
        Command::new("sysbench").args(sb.command("oltp_read_write", port, &options, "run")),
        "sysbench run",
    )?;
    println!(
        "sysbench oltp_read_write through holdfast ({seconds} s, 8 threads, prepared statements):"
    );
    for line in out.lines().filter(|l| {
        l.contains("transactions:")
            || l.contains("queries:")
            || l.contains("ignored errors")
            || l.contains("95th")
    }) {
        println!("  {}", line.trim());
    }
    Ok(())
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
