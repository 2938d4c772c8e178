//! `holdfast lab …`: the command-line front end of the lab.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::lab::{self, LabOptions, LabStatus, DEFAULT_BASE_PORT};

/// Start, inspect and stop a local MariaDB lab (a primary plus GTID replicas) for trying
/// holdfast out.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum LabCommand {
    /// Start a primary and N replicas on 127.0.0.1 and write DIR/holdfast.toml for them.
    ///
    /// Ports: holdfast's proxy listener = BASE, its admin listener = BASE+1, its
    /// read/write-split listener = BASE+2 (not with --serverless), node i (1-based) =
    /// BASE+10+i-1 (a node added later by `lab add-replica` takes the first free port from
    /// its own slot on). Accounts: app/app_pass (all privileges),
    /// holdfast_monitor/monitor_pass, repl/repl_pass; root logs in without a password
    /// through DIR/nodeN.sock.
    /// A directory holding a stopped lab is restarted with its data.
    Up {
        /// Lab directory (data, sockets, logs, lab.json, holdfast.toml).
        #[arg(long, default_value = "holdfast-lab")]
        dir: PathBuf,
        /// Number of replicas besides the primary [default: 2, or 0 with --serverless].
        #[arg(long)]
        replicas: Option<usize>,
        /// A serverless instance instead of a cluster: one node that holdfast starts,
        /// pauses when idle, wakes on connect, scales and meters (`[serverless]` in
        /// DIR/holdfast.toml).
        #[arg(long)]
        serverless: bool,
        /// Base port of the port layout (proxy = BASE, admin = BASE+1, split = BASE+2, nodes
        /// from BASE+10).
        #[arg(long, default_value_t = DEFAULT_BASE_PORT)]
        base_port: u16,
        /// Server binary [default: mariadbd on PATH, else mysqld].
        #[arg(long)]
        mariadbd: Option<PathBuf>,
        /// Extra mariadbd option for every node (repeatable), e.g. --server-arg=--general-log=ON.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// holdfast processes to write configs for: with 2, a fleet (`[cluster]`) through
        /// an etcd the lab starts (Debian's etcd-server; client port BASE+6, peer BASE+7),
        /// members proxy1 (DIR/holdfast.toml) and proxy2 (DIR/holdfast-proxy2.toml: proxy
        /// BASE+3, admin BASE+4, split BASE+5). Serve each with `holdfast serve --config`.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        proxies: u8,
    },
    /// Show the nodes of a lab, whether they run and their role now (each running node is
    /// asked: writable = primary, read-only with a replication source = replica).
    Status {
        /// Lab directory.
        #[arg(long, default_value = "holdfast-lab")]
        dir: PathBuf,
        /// Print DIR/lab.json's content (with fresh liveness) as JSON, with holdfast's admin
        /// API token (`admin_token`, from DIR/admin.token) and each node's `live_role`
        /// (primary, replica, down or unknown) and `replicates_from`; `role` stays the role
        /// the node was set up with.
        #[arg(long)]
        json: bool,
    },
    /// Add a replica to a running lab: a new mariadbd, seeded from a dump of the current
    /// primary (the writable node), replicating from it by GTID; added to DIR/lab.json and
    /// DIR/holdfast.toml's backends (restart holdfast to use it).
    AddReplica {
        /// Lab directory.
        #[arg(long, default_value = "holdfast-lab")]
        dir: PathBuf,
        /// The new node's name [default: the next nodeK].
        #[arg(long)]
        name: Option<String>,
    },
    /// Remove a node from a lab: stops its mariadbd, deletes its data, and takes it out of
    /// DIR/lab.json and DIR/holdfast.toml. Refuses the primary and the last node.
    Remove {
        /// Lab directory.
        #[arg(long, default_value = "holdfast-lab")]
        dir: PathBuf,
        /// The node to remove (e.g. node3).
        name: String,
    },
    /// Stop every process of a lab (mariadbd gets SIGTERM, then SIGKILL after 60 s).
    Down {
        /// Lab directory.
        #[arg(long, default_value = "holdfast-lab")]
        dir: PathBuf,
        /// Also delete the lab directory (data, logs, config).
        #[arg(long)]
        purge: bool,
    },
}

/// Runs a lab subcommand, printing its result to stdout.
pub fn run(cmd: LabCommand) -> Result<()> {
    match cmd {
        LabCommand::Up {
            dir,
            replicas,
            base_port,
            mariadbd,
            server_args,
            serverless,
            proxies,
        } => {
            let opts = LabOptions {
                dir,
                replicas: replicas.unwrap_or(if serverless { 0 } else { 2 }),
                base_port: Some(base_port),
                mariadbd,
                extra_server_args: server_args,
                serverless,
                proxies: usize::from(proxies),
            };
            let started = std::time::Instant::now();
            let dir = opts.dir.clone();
            let nodes = opts.replicas + 1;
            // (Long on a first start: the server's data directory template is made.)
            let ticker = crate::progress::Ticker::start("starting the lab", move || {
                let up = (1..=nodes)
                    .filter(|i| dir.join(format!("node{i}.sock")).exists())
                    .count();
                Some(format!("{up} of {nodes} nodes up"))
            });
            let st = lab::up(&opts);
            drop(ticker);
            let st = st?;
            print!("{}", describe_up(&st, started.elapsed()));
        }
        LabCommand::Status { dir, json } => {
            let st = lab::status(&dir)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&st).context("serialising status")?
                );
            } else {
                print!("{}", status_table(&st));
            }
        }
        LabCommand::AddReplica { dir, name } => {
            let node = lab::add_replica(&dir, name.as_deref())?;
            println!(
                "added {} at {} (replica of {}); holdfast.toml lists it",
                node.name,
                node.address,
                node.replicates_from.as_deref().unwrap_or("?")
            );
        }
        LabCommand::Remove { dir, name } => {
            let node = lab::remove_node(&dir, &name)?;
            println!(
                "removed {} ({}): stopped, data deleted, gone from lab.json and holdfast.toml",
                node.name, node.address
            );
        }
        LabCommand::Down { dir, purge } => {
            if purge {
                lab::purge(&dir)?;
                println!("lab in {} stopped and deleted", dir.display());
            } else {
                lab::down(&dir)?;
                println!(
                    "lab in {} stopped (data kept; `holdfast lab up --dir {}` restarts it, \
                     --purge deletes it)",
                    dir.display(),
                    dir.display()
                );
            }
        }
    }
    Ok(())
}

/// The table printed by `holdfast lab status`.
pub fn status_table(st: &LabStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "lab {}", st.dir.display());
    let _ = writeln!(
        out,
        "{:<8} {:<8} {:<8} {:<17} {:<8} {:<8} socket",
        "node", "role", "from", "address", "pid", "state"
    );
    for n in &st.nodes {
        // The role now when the node was asked; the one it was set up with otherwise.
        let role = match n.live_role.as_deref() {
            Some(live) => live.to_string(),
            None => format!("{}?", n.role),
        };
        let _ = writeln!(
            out,
            "{:<8} {:<8} {:<8} {:<17} {:<8} {:<8} {}",
            n.name,
            role,
            n.replicates_from.as_deref().unwrap_or("-"),
            n.address,
            n.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            if n.alive { "running" } else { "stopped" },
            n.socket.display()
        );
    }
    let split = match &st.split {
        Some(s) => format!(" / split {s}"),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "holdfast proxy {}{split} / admin {} (config {})",
        st.proxy,
        st.admin,
        st.config.display()
    );
    out
}

fn describe_up(st: &LabStatus, took: std::time::Duration) -> String {
    let mut out = format!("lab up in {:.1} s\n", took.as_secs_f64());
    out.push_str(&status_table(st));
    let _ = writeln!(out, "accounts:");
    let _ = writeln!(
        out,
        "  application  {} / {}  (all privileges; database {})",
        st.app_user, st.app_password, st.database
    );
    let _ = writeln!(
        out,
        "  monitor      {} / {}",
        st.monitor_user, st.monitor_password
    );
    if let (Some(u), Some(p)) = (&st.ed25519_user, &st.ed25519_password) {
        let _ = writeln!(out, "  ed25519      {u} / {p}");
    }
    let _ = writeln!(
        out,
        "  replication  {} / {}",
        lab::REPL_USER,
        lab::REPL_PASSWORD
    );
    let _ = writeln!(
        out,
        "  root         no password, via the unix sockets above"
    );
    if let Ok(p) = st.primary() {
        let _ = writeln!(
            out,
            "primary:  mariadb -h127.0.0.1 -P{} -u{} -p{} {}",
            p.port, st.app_user, st.app_password, st.database
        );
    }
    if let Some(split) = &st.split {
        let _ = writeln!(
            out,
            "split:    {split} (holdfast's listener with routing = \"split\": reads to the replicas)"
        );
    }
    if let Some(etcd) = &st.etcd {
        let _ = writeln!(
            out,
            "fleet:    {} members through etcd at {} (data in {})",
            st.proxies.len(),
            etcd.endpoint,
            etcd.datadir.display()
        );
        for p in &st.proxies {
            let _ = writeln!(
                out,
                "  {}: clients {}, admin {}{}: holdfast serve --config {}",
                p.member,
                p.proxy,
                p.admin,
                p.split
                    .as_deref()
                    .map(|s| format!(", split {s}"))
                    .unwrap_or_default(),
                p.config.display()
            );
        }
    }
    let _ = writeln!(out, "config:   {}", st.config.display());
    let _ = writeln!(
        out,
        "admin:    token in {} (holdfast ctl --config {} status)",
        st.admin_token_file.display(),
        st.config.display()
    );
    let _ = writeln!(
        out,
        "next:     holdfast serve --config {}",
        st.config.display()
    );
    let _ = writeln!(
        out,
        "stop:     holdfast lab down --dir {}",
        st.dir.display()
    );
    out
}
