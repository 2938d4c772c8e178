//! `holdfast`: a session-aware MySQL-protocol proxy, with its lab and control CLI. The
//! benchmarks, drills and demo are the separate `holdfast-bench` binary (crates/bench).

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use holdfast_admin::AdminClient;
use holdfast_config::{AdminToken, Config, DriverKind, TokenSource};
use holdfast_proxy::logging::LogLevel;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// holdfast keeps MySQL/MariaDB client connections alive while the database behind them
/// changes, and can make an instance serverless (paused when idle with idle connections
/// kept open, woken on connect, scaled in place, metered). Point any MySQL client at
/// `holdfast serve` instead of the server.
///
/// Quick start on a fresh machine:  holdfast-bench demo --dir /tmp/holdfast-demo
///
/// A serverless instance:  holdfast lab up --serverless --dir /tmp/hf-sl
///
/// The benchmarks, maintenance drills and the demo are a separate binary built beside this
/// one: holdfast-bench --help
#[derive(Parser)]
#[command(name = "holdfast", version, about, long_about)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy. Log level: [log] level (default: info); RUST_LOG, when set, takes
    /// its place at start.
    ///
    /// SIGHUP (or `holdfast ctl reload`) reads the config again: what can change while
    /// holdfast runs applies at once, what needs a restart (listener addresses, the admin
    /// API, worker threads, drivers, the HA mode) is listed and keeps its running value; a
    /// file with an error is refused (file, line, key) and nothing changes.
    ///
    /// The admin API needs a bearer token: [admin] token or token_file, or else one
    /// generated on the first start into CONFIG-DIR/<config name>.admin-token (mode 0600;
    /// its path is logged).
    ///
    /// With a `[serverless]` section (holdfast.serverless.example.toml) holdfast also runs
    /// the instance's lifecycle: pauses, wakes, scaling and the usage ledger.
    ///
    /// Example: holdfast serve --config holdfast.example.toml
    Serve {
        /// The TOML config; see holdfast.example.toml for every key with comments.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check that holdfast can work with the servers a config names, before (or without)
    /// serving: the monitor account logs in to every `[[backend]]` and holds each
    /// privilege the features the config turns on need (split reads, managed HA,
    /// semi-sync, commit markers, serverless scaling); in managed HA mode the replication
    /// account logs in too. Every problem comes with the SQL that fixes it (a GRANT to run
    /// as an administrator); anonymous accounts that shadow holdfast's are warned about.
    ///
    /// `serve` runs the same check at start and logs each problem as an error; `ctl
    /// status` and `/status` (`preflight`) show what it found.
    ///
    /// Exits 1 when a problem is found.
    ///
    /// Example: holdfast check --config holdfast.toml
    Check {
        /// The TOML config to check.
        #[arg(long, short)]
        config: PathBuf,
        /// The report as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Talk to a running proxy through its admin API: status, metrics, the HA operations
    /// (switchover, failover, rejoin, restart, resize) and the serverless ones (pause,
    /// resume, scale, usage).
    ///
    /// The admin API wants its bearer token, taken from (first found): --token-file, the
    /// environment variable HOLDFAST_ADMIN_TOKEN, or the config (--config: [admin] token,
    /// token_file, or the file `holdfast serve` generated beside it).
    ///
    /// Exits non-zero when the proxy refuses or an operation fails (the error text on stderr).
    ///
    /// Example: holdfast ctl --config /etc/holdfast/holdfast.toml status
    Ctl {
        /// The admin listener [default: [admin] listen of --config, else 127.0.0.1:6034].
        #[arg(long, env = "HOLDFAST_ADMIN")]
        admin: Option<String>,
        /// A file holding the admin API token (one line).
        #[arg(long, value_name = "PATH")]
        token_file: Option<PathBuf>,
        /// holdfast's config: the admin listener and (after --token-file and
        /// HOLDFAST_ADMIN_TOKEN) the token.
        #[arg(long, short, value_name = "PATH")]
        config: Option<PathBuf>,
        #[command(subcommand)]
        command: CtlCommand,
    },
    /// Start, inspect and stop a local lab cluster of real mariadbd processes.
    #[command(subcommand)]
    Lab(holdfast_lab::LabCommand),
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Add a replica of the current primary; it takes reads of split listeners once its
    /// replication runs within `[split] max_replica_lag_ms`.
    ///
    /// The address must answer to the monitor account, be read-only and replicate from the
    /// primary; anything else is refused and nothing changes.
    ///
    /// Example: holdfast ctl node add --name node4 --address 127.0.0.1:3313
    Add {
        #[arg(long)]
        name: String,
        #[arg(long, value_name = "HOST:PORT")]
        address: String,
    },
    /// Remove a replica: no new work goes to it at once; requests running there get the
    /// drain window; past it they are stopped (each gets an ERR, its session goes on); then
    /// holdfast closes its connections there.
    ///
    /// The primary and the last node cannot be removed.
    ///
    /// Example: holdfast ctl node remove node3 --drain-ms 10000
    Remove {
        name: String,
        /// The drain window in milliseconds [default: [split] drain_ms, 60000].
        #[arg(long)]
        drain_ms: Option<u64>,
    },
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Topology, HA state, counters and sessions, for a person (or --json).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The Prometheus metrics text.
    Metrics,
    /// A one-time link that logs a browser in to the live dashboard (topology, sessions,
    /// commands/s, moves, the event log), served by the admin listener at `/`.
    ///
    /// The link is good once, for two minutes; the browser then keeps a cookie (HttpOnly,
    /// SameSite=Strict) that lets it read for 12 hours, never change anything. The admin
    /// token never goes into a URL. Open the link on the machine, or through an SSH tunnel
    /// to the admin address.
    ///
    /// Example: holdfast ctl dashboard
    Dashboard,
    /// Planned change of primary (needs `[ha] mode = "managed"`).
    ///
    /// Fences the current primary (read_only=ON, client connections killed, FLUSH TABLES WITH
    /// READ LOCK), waits until the target has applied every transaction, promotes it and
    /// re-points every other node, the old primary included. Writes are blocked only between
    /// the fence and the promotion (typically tens of milliseconds). If the target cannot
    /// catch up in time, the old primary is made writable again and nothing changes.
    ///
    /// Example: holdfast ctl switchover --to node2
    Switchover {
        /// The node to promote; by default the most advanced healthy replica.
        #[arg(long, value_name = "NODE")]
        to: Option<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Promote a replica because the primary is lost (needs `[ha] mode = "managed"`).
    ///
    /// The primary must not answer, and (unless ha.require_replica_confirmation = false) every
    /// reachable replica must have lost it too. The most advanced replica is promoted and the
    /// others re-pointed; the lost primary is left out until `holdfast ctl rejoin`. In managed
    /// mode holdfast does this on its own; this command is for when the cool-off holds the
    /// automatic failover back or the detector has not decided yet.
    ///
    /// Only a replica that applied every transaction the replicas received is promoted
    /// (acknowledged writes live in relay logs). When none has, the failover is withheld and
    /// the answer names the transactions that would be lost; --force promotes the most
    /// advanced replica anyway, losing exactly those.
    Failover {
        /// Promote even when that loses transactions a replica received.
        #[arg(long)]
        force: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// End one client session, as the server's `KILL` of its connection would.
    ///
    /// Its backend connection is killed (`KILL CONNECTION` as the monitor account, which
    /// needs CONNECTION ADMIN) and the session closes with it: its client's connection
    /// closes, and holdfast does not log it in again elsewhere. With `--query`, only the
    /// statement it runs is stopped (the client gets the server's 1317) and the session
    /// goes on. Session ids are those of `ctl status` (and of `CONNECTION_ID()` for the
    /// client).
    ///
    /// Example: holdfast ctl kill 1073741825
    Kill {
        /// The session's id.
        id: u32,
        /// Stop the statement it runs, not the session.
        #[arg(long)]
        query: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make NODE a replica of the current primary again (needs `[ha] mode = "managed"`).
    ///
    /// For a lost primary that runs again after a failover, or a replica that was down during
    /// a switchover. The node is made read-only first; a node with transactions the primary
    /// lacks (diverged) is refused and left read-only: rebuild it instead.
    ///
    /// Example: holdfast ctl rejoin node1
    Rejoin {
        /// The node to bring back (its [[backend]] name).
        node: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add or remove a node at run time (read scale-out).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Read holdfast's config file again and put it in force (as SIGHUP does).
    ///
    /// Limits, hold and cool-down windows, HA and serverless knobs, the split section, the
    /// log level, certificates and listeners' settings apply at once (the next request,
    /// login or connection); the [[backend]] list adds and removes nodes. What needs a
    /// restart (a listener's address, the admin API, worker threads, drivers, the HA mode)
    /// is listed and keeps its running value. A file with an error is refused with the
    /// error (file, line, key) and nothing changes (exit status 1).
    ///
    /// Example: holdfast ctl --config /etc/holdfast/holdfast.toml reload
    Reload {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace the running holdfast with the binary at its own path, with no connection
    /// attempt refused (as SIGUSR2 does).
    ///
    /// The running process starts the binary found at its executable's path now (a package
    /// upgrade or a copied new build) with the same arguments, and hands it the listening
    /// sockets and HA over a private unix socket. The new process serves new connections
    /// at once; open sessions follow as each goes idle outside a transaction, with their
    /// client, backend and replica connections (TLS too): the client notices nothing.
    /// Those that cannot go stay on the old one until they end, or until `[proxy]
    /// cooldown_ms` closes them, then the old process exits. `holdfast ctl status`
    /// shows the pid and generation. If the new process cannot start or take over, the old
    /// one keeps serving and this command fails with why (exit status 1).
    ///
    /// Example: holdfast ctl --config /etc/holdfast/holdfast.toml upgrade
    Upgrade {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pause the serverless instance now (needs `[serverless]`).
    ///
    /// Idle sessions stay open and wake it when they next speak; sessions that could not
    /// survive the pause (open transaction, temporary table, lock, pass-through) refuse it,
    /// and are listed.
    ///
    /// Example: holdfast ctl pause --tier stop
    Pause {
        /// freeze (suspend the process: resumes in milliseconds) or stop (frees its memory);
        /// by default serverless.pause_tier.
        #[arg(long, value_parser = ["freeze", "stop"])]
        tier: Option<String>,
    },
    /// Resume the paused serverless instance now (a client connecting does the same).
    Resume,
    /// Set the serverless instance's size in capacity units (1 CCU = 1 CPU + 2 GiB).
    ///
    /// Applied in place, no restart: CPU quota and memory cap (cgroup), buffer pool and
    /// (opt-in) max_connections. The size holds: the autoscaler leaves it alone until
    /// `holdfast ctl scale auto`.
    ///
    /// Example: holdfast ctl scale 2      then, later: holdfast ctl scale auto
    Scale {
        /// Capacity units, or `auto` to let the autoscaler decide again.
        #[arg(value_name = "CCU|auto")]
        size: String,
    },
    /// The usage ledger: one line per billing period, and a total per instance.
    ///
    /// Each line has running and paused seconds, CCU-hours and storage GiB-hours; periods
    /// are hourly by default (serverless.period_secs).
    ///
    /// Example: holdfast ctl usage --since 24h
    Usage {
        /// Only this instance.
        #[arg(long)]
        instance: Option<String>,
        /// Unix seconds, or an age: 90s, 30m, 6h, 7d.
        #[arg(long)]
        since: Option<String>,
        /// Print the lines as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Planned restart of NODE, e.g. a minor-version upgrade with --binary (needs a control
    /// driver: `[driver] kind = "lab"`).
    ///
    /// If NODE is the primary, sessions are first parked at safe points and switched over to
    /// another node; NODE restarts, rejoins as a replica, and is switched back. Clients keep
    /// their connections and session state throughout.
    ///
    /// Example: holdfast ctl restart node1 --binary /usr/sbin/mariadbd
    Restart {
        node: String,
        /// Server binary to run from now on; must be listed in `[driver] binaries`.
        #[arg(long, value_name = "PATH")]
        binary: Option<String>,
    },
    /// Planned restart of NODE with other server options (a resize), like `restart`.
    ///
    /// Only options listed in `[driver] allowed_options` are accepted (by default
    /// innodb_buffer_pool_size and max_connections).
    ///
    /// Example: holdfast ctl resize node1 --set innodb_buffer_pool_size=256M --set max_connections=500
    Resize {
        node: String,
        /// A server option as KEY=VALUE; repeat for several.
        #[arg(long = "set", value_name = "KEY=VALUE", required = true)]
        set: Vec<String>,
    },
}

/// `RUST_LOG` when set (and valid), else `info`; `serve` then puts `[log] level` in force
/// unless `RUST_LOG` is set.
fn init_logging(format: LogFormat) -> Option<Arc<LogLevel>> {
    // Colour only for a person at a terminal: not in files, journald or pipes.
    use std::io::IsTerminal as _;
    let json = matches!(format, LogFormat::Json);
    let ansi = std::io::stderr().is_terminal();
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|d| !d.trim().is_empty());
    if let Some(directives) = from_env {
        match LogLevel::install(&directives, json, ansi, std::io::stderr) {
            Ok(log) => return Some(log),
            Err(e) => eprintln!("RUST_LOG {e}; logging at info"),
        }
    }
    LogLevel::install("info", json, ansi, std::io::stderr).ok()
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let log = init_logging(cli.log_format);
    match cli.command {
        Command::Serve { config } => {
            let (cfg, text) = Config::load_text(&config)?;
            if let Some(log) = &log {
                if std::env::var_os("RUST_LOG").is_none() {
                    log.set(&cfg.log.level)?;
                }
            }
            // The main thread runs the control tasks and the acceptors; sessions run on
            // it too with one worker, else on that many threads of their own.
            let workers = cfg.proxy.effective_worker_threads();
            let session_threads = match workers {
                0 | 1 => None,
                n => Some(std::sync::Arc::new(
                    holdfast_proxy::session_threads::SessionThreads::start(n)
                        .context("cannot start the session threads")?,
                )),
            };
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(serve(cfg, &config, &text, log, session_threads))
        }
        Command::Ctl {
            admin,
            token_file,
            config,
            command,
        } => {
            let client = ctl_client(admin, token_file, config)?;
            runtime()?.block_on(ctl(&client, command))
        }
        Command::Check { config, json } => {
            let cfg = Config::load(&config)?;
            let report =
                runtime()?.block_on(holdfast_cluster::preflight::check(&cfg, &cfg.backends));
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", report.render());
            }
            if report.problem_count() > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Lab(cmd) => holdfast_lab::run(cmd),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// The admin client `ctl` uses: the address from --admin / HOLDFAST_ADMIN, else the
/// config's; the token from --token-file, else HOLDFAST_ADMIN_TOKEN, else the config.
fn ctl_client(
    admin: Option<String>,
    token_file: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<AdminClient> {
    let cfg = match &config {
        Some(path) => Some((path.as_path(), Config::load(path)?)),
        None => None,
    };
    let addr = admin
        .or_else(|| cfg.as_ref().map(|(_, c)| connectable(&c.admin.listen)))
        .unwrap_or_else(|| "127.0.0.1:6034".to_string());
    let from_env = std::env::var("HOLDFAST_ADMIN_TOKEN")
        .ok()
        .map(|t| AdminToken::new(t.trim()))
        .filter(|t| !t.expose().is_empty());
    let token = if let Some(file) = &token_file {
        Some(holdfast_config::admin::read_token_file(file)?)
    } else if from_env.is_some() {
        from_env
    } else if let Some((path, c)) = &cfg {
        Some(c.admin.read_token(path).with_context(|| {
            format!(
                "the admin token for {} (has `holdfast serve` started with it yet?)",
                path.display()
            )
        })?)
    } else {
        None
    };
    Ok(AdminClient::new(addr, token))
}

/// A listen address as a client connects to it: the wildcard address means this host.
fn connectable(listen: &str) -> String {
    let host = holdfast_config::admin::host_of(listen);
    let port = listen.rsplit_once(':').map_or("6034", |(_, p)| p);
    match host {
        "0.0.0.0" => format!("127.0.0.1:{port}"),
        "::" => format!("[::1]:{port}"),
        _ => listen.to_string(),
    }
}

/// The admin token `serve` requires, logged by where it is (never by value).
fn admin_token(cfg: &Config, config_path: &Path) -> Result<AdminToken> {
    let (token, source) = cfg
        .admin
        .load_or_generate_token(config_path)
        .context("the admin API token")?;
    match &source {
        TokenSource::Inline => tracing::info!("admin API token from [admin] token"),
        TokenSource::File(path) => {
            tracing::info!(file = %path.display(), "admin API token read");
        }
        TokenSource::Generated(path) => tracing::info!(
            file = %path.display(),
            "admin API token generated into a new file (mode 0600); `holdfast ctl --config {}` \
             or `--token-file {}` uses it",
            config_path.display(),
            path.display()
        ),
    }
    if let TokenSource::File(path) = &source {
        if let Some(mode) = holdfast_config::admin::loose_permissions(path) {
            tracing::warn!(file = %path.display(), mode = format!("{mode:o}"), "the admin API token file is readable by other users; chmod 600 it");
        }
    }
    Ok(token)
}

async fn serve(
    cfg: Config,
    config_path: &Path,
    text: &str,
    log: Option<Arc<LogLevel>>,
    session_threads: Option<Arc<holdfast_proxy::session_threads::SessionThreads>>,
) -> Result<()> {
    // A serverless server that cannot start is said now, not as a 3032 at the first login.
    if let Some(holdfast_config::serverless::InstanceDriverConfig::Process(p)) =
        cfg.serverless.as_ref().map(|s| &s.driver)
    {
        let missing = p.missing_paths();
        if !missing.is_empty() {
            bail!(
                "the serverless instance cannot start:\n  {}",
                missing.join("\n  ")
            );
        }
    }
    let admin_addr = cfg.admin.listen.clone();
    let admin_token = admin_token(&cfg, config_path)?;
    let loose = holdfast_config::secret::permission_warnings(config_path, &cfg);
    for warning in &loose {
        tracing::warn!("{warning}");
    }
    if cfg.auth.strict_permissions && !loose.is_empty() {
        bail!("[auth] strict_permissions: {}", loose.join("; "));
    }
    let node_driver: Option<std::sync::Arc<dyn holdfast_cluster::driver::NodeDriver>> =
        match cfg.driver.kind {
            DriverKind::None => None,
            DriverKind::Lab => match cfg.driver.lab_dir.clone() {
                Some(dir) => Some(std::sync::Arc::new(holdfast_lab::LabNodeDriver { dir })),
                None => bail!("[driver] kind = \"lab\" needs lab_dir"),
            },
        };
    // Started by an upgrade: the listening sockets come from the process it replaces.
    let take_over = match std::env::var_os(holdfast_proxy::upgrade::HANDOVER_ENV) {
        Some(path) => Some(
            holdfast_proxy::upgrade::TakeOver::connect(Path::new(&path))
                .await
                .context("taking over from the running holdfast")?,
        ),
        None => None,
    };
    let seams = holdfast_proxy::Seams {
        node_driver,
        take_over,
        session_threads,
        ..Default::default()
    };
    let mut proxy = holdfast_proxy::Proxy::start_with(cfg, seams)
        .await
        .context("cannot start the proxy")?;
    let admin = proxy
        .admin_listener(&admin_addr)
        .await
        .with_context(|| format!("cannot bind the admin listener {admin_addr}"))?;
    let take_over = proxy.take_over();
    let listeners: Vec<String> = proxy
        .listener_addrs()
        .iter()
        .map(|(addr, mode)| format!("{addr} ({mode:?})"))
        .collect();
    tracing::info!(proxy = %proxy.local_addr()?, admin = %admin_addr, listeners = ?listeners, "holdfast serving");
    let shared = proxy.shared.clone();
    shared.set_config_file(config_path, text);
    if let Some(log) = log {
        let _ = shared.log_level.set(log);
    }
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let reloading = shared.clone();
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            // The reload logs what it applied; a refusal is said here.
            if let Err(e) = reloading.reload().await {
                tracing::error!("reload refused: {e}");
            }
        }
    });
    let mut user2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let upgrading = shared.clone();
    tokio::spawn(async move {
        while user2.recv().await.is_some() {
            tracing::info!("SIGUSR2: upgrading");
            // The upgrade logs what it did, or why not.
            let _ = upgrading.upgrader.upgrade(&upgrading).await;
        }
    });
    // After an upgrade the admin API is the new process's: this one stops accepting.
    // (Again if the new process goes: `Upgrader::serve_again`; from a copy of the socket.)
    let mut handed_over = shared.upgrader.handed_over();
    let admin_shared = shared.clone();
    let admin_socket = std::os::fd::AsFd::as_fd(&admin).try_clone_to_owned()?;
    let admin_task = tokio::spawn(async move {
        let mut admin = Some(admin);
        loop {
            let listener = match admin.take() {
                Some(l) => l,
                None => {
                    let socket = std::net::TcpListener::from(admin_socket.try_clone()?);
                    socket.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(socket)?
                }
            };
            tokio::select! {
                r = holdfast_admin::serve(listener, admin_shared.clone(), admin_token.clone()) => return r,
                _ = async { drop(handed_over.wait_for(Option::is_some).await) } => {}
            }
            if handed_over.wait_for(Option::is_none).await.is_err() {
                return std::future::pending().await;
            }
        }
    });
    let proxy_task = tokio::spawn(proxy.run());
    if let Some(take_over) = take_over {
        take_over
            .ready(shared.clone())
            .await
            .context("telling the process it replaces that this one serves")?;
        tracing::info!(
            generation = shared.upgrader.generation(),
            "upgrade: serving in place of the previous process"
        );
    }
    notify_systemd();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = term.recv() => tracing::info!("terminated; stopping"),
        _ = drained_after_upgrade(&shared) => {}
        r = admin_task => bail!("admin listener stopped: {r:?}"),
        r = proxy_task => bail!("proxy listener stopped: {r:?}"),
    }
    if let Some(fleet) = &shared.fleet {
        // Another member leads at once, not when this one's lease runs out.
        fleet.leave().await;
    }
    // After an upgrade the instance is the new process's, which keeps it paused until a
    // client comes (left as it is) and meters it from the usage period this one wrote as
    // it let go (written again now, it would undo what the new one wrote since).
    if shared.upgrader.handed_over().borrow().is_some() {
        if let Some(lc) = &shared.serverless {
            tracing::info!(instance = %lc.config().instance, "the instance is the new process's; left as it is");
        }
        return Ok(());
    }
    // (In a fleet with other members, the instance is the next leader's to run: left as
    // it is.)
    let alone = shared
        .fleet
        .as_ref()
        .is_none_or(|f| f.seen().members.iter().all(|m| m.member == f.member()));
    if let (Some(lc), true) = (&shared.serverless, alone) {
        if let Err(e) = lc.thaw_on_shutdown().await {
            tracing::error!(error = %e, "could not thaw the frozen instance on the way out: it stays suspended (kill -CONT its server)");
        }
    }
    if let Err(e) = holdfast_proxy::serverless::flush_usage(&shared).await {
        tracing::warn!(error = %e, "could not write the open usage period on the way out");
    }
    Ok(())
}

/// Resolves once this process has handed over to a new one (an upgrade) and its sessions
/// have ended, or the drain window (`[proxy] cooldown_ms`) has passed: the process exits,
/// closing what is left.
async fn drained_after_upgrade(shared: &Arc<holdfast_proxy::Shared>) {
    let mut handed_over = shared.upgrader.handed_over();
    'upgrade: loop {
        if handed_over.wait_for(Option::is_some).await.is_err() {
            return std::future::pending().await;
        }
        let until = tokio::time::Instant::now() + shared.config().proxy.cooldown();
        drain(shared, &handed_over, until).await;
        if handed_over.borrow().is_some() {
            return;
        }
        // The new process went: this one serves again.
        continue 'upgrade;
    }
}

/// Waits until this process holds no connection or the drain window ends, or the process
/// it handed over to goes (then this one serves again).
async fn drain(
    shared: &Arc<holdfast_proxy::Shared>,
    handed_over: &tokio::sync::watch::Receiver<Option<u32>>,
    until: tokio::time::Instant,
) {
    loop {
        if handed_over.borrow().is_none() {
            return;
        }
        // (Connections still logging in count: they become sessions here. So do admin
        // connections: the answer to the upgrade's own request is being written.)
        let left = shared.open_connections();
        let admin = shared
            .admin_connections
            .load(std::sync::atomic::Ordering::Acquire);
        if left == 0 && admin == 0 {
            tracing::info!("upgrade: every session of this process has ended; exiting");
            return;
        }
        if tokio::time::Instant::now() >= until {
            tracing::warn!(
                sessions = left,
                "upgrade: the drain window passed; closing the sessions left and exiting"
            );
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Tells systemd (`Type=notify`, `NotifyAccess=all`) that this process serves and is the
/// service's main process (after an upgrade it is a new one); nothing without
/// `NOTIFY_SOCKET`.
fn notify_systemd() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let message = format!("READY=1\nMAINPID={}\n", std::process::id());
    let socket = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell systemd this process serves");
            return;
        }
    };
    let bytes = path.as_encoded_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        // An abstract socket.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| socket.send_to_addr(message.as_bytes(), &addr))
        }
        None => socket.send_to(message.as_bytes(), &path),
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot tell systemd this process serves");
    }
}

/// An answer other than 2xx as an error: the API's `error` text, and where a token comes
/// from when a 401 says it is missing or wrong.
fn refused(client: &AdminClient, what: &str, code: u16, body: String) -> anyhow::Error {
    let error = serde_json::from_str::<holdfast_admin::ErrorBody>(&body)
        .map(|e| e.error)
        .unwrap_or(body);
    let hint = match (code, client.has_token()) {
        (401, false) => "\nno admin token given: use --token-file PATH, HOLDFAST_ADMIN_TOKEN or --config holdfast.toml",
        (401, true) => "\nthe admin token given is not this holdfast's",
        _ => "",
    };
    anyhow::anyhow!("{what} (HTTP {code}): {error}{hint}")
}

/// `GET path`, requiring 200: the body.
async fn get(client: &AdminClient, path: &str) -> Result<String> {
    let (code, body) = client.get(path).await.with_context(|| {
        format!(
            "cannot reach the admin API at {} (is holdfast serve running?)",
            client.addr
        )
    })?;
    if code != 200 {
        return Err(refused(client, "refused", code, body));
    }
    Ok(body)
}

async fn ctl(client: &AdminClient, command: CtlCommand) -> Result<()> {
    match command {
        CtlCommand::Status { json } => {
            let body = get(client, "/status").await?;
            if json {
                println!("{body}");
            } else {
                let status: holdfast_admin::Status =
                    serde_json::from_str(&body).context("unexpected /status body")?;
                print!("{}", holdfast_admin::render_status(&status));
            }
        }
        CtlCommand::Metrics => print!("{}", get(client, "/metrics").await?),
        CtlCommand::Dashboard => {
            let (code, body) = post(client, "/dashboard/link").await?;
            if code != 200 {
                return Err(refused(client, "no dashboard link", code, body));
            }
            let link: holdfast_admin::dashboard::Link =
                serde_json::from_str(&body).context("unexpected /dashboard/link body")?;
            println!("http://{}{}", client.addr, link.path);
            eprintln!(
                "open it within {} s; it works once, then the browser stays logged in",
                link.expires_in_secs
            );
        }
        CtlCommand::Switchover { to, json } => {
            let path = match &to {
                Some(node) => format!("/switchover?to={}", query_escape(node)),
                None => "/switchover".to_string(),
            };
            ha_operation(client, &path, json).await?;
        }
        CtlCommand::Failover { force, json } => {
            let path = if force {
                "/failover?force=true"
            } else {
                "/failover"
            };
            ha_operation(client, path, json).await?
        }
        CtlCommand::Node(NodeCommand::Add { name, address }) => {
            let path = format!(
                "/nodes/add?name={}&address={}",
                query_escape(&name),
                query_escape(&address)
            );
            let v = post_json(client, &path).await?;
            let reads = v.get("serves_reads").and_then(|b| b.as_bool()) == Some(true);
            println!(
                "{name} ({address}) added; {}",
                if reads {
                    "it takes reads"
                } else {
                    "it takes reads once its replication runs within the lag limit"
                }
            );
        }
        CtlCommand::Node(NodeCommand::Remove { name, drain_ms }) => {
            let mut path = format!("/nodes/remove?name={}", query_escape(&name));
            if let Some(ms) = drain_ms {
                path.push_str(&format!("&drain_ms={ms}"));
            }
            let v = post_json(client, &path).await?;
            let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            println!(
                "{name} removed: drained in {} ms, {} statements stopped at the end of the window, {} connections closed",
                n("drained_ms"),
                n("interrupted"),
                n("connections_closed")
            );
        }
        CtlCommand::Restart { node, binary } => {
            let mut path = format!("/restart?node={}", query_escape(&node));
            if let Some(b) = binary {
                path.push_str(&format!("&binary={}", query_escape(&b)));
            }
            restart_operation(client, &path).await?
        }
        CtlCommand::Resize { node, set } => {
            let path = format!(
                "/resize?node={}&set={}",
                query_escape(&node),
                query_escape(&set.join(","))
            );
            restart_operation(client, &path).await?
        }
        CtlCommand::Pause { tier } => {
            let path = match tier {
                Some(t) => format!("/pause?tier={}", query_escape(&t)),
                None => "/pause".to_string(),
            };
            instance_operation(client, &path).await?
        }
        CtlCommand::Resume => instance_operation(client, "/resume").await?,
        CtlCommand::Reload { json } => {
            post_and_print(client, "/reload", "reload refused", json, |r| {
                holdfast_admin::render_reload(&r)
            })
            .await?
        }
        CtlCommand::Kill { id, query, json } => {
            let path = format!("/sessions/kill?id={id}&query={query}");
            post_and_print(client, &path, "kill refused", json, |k: holdfast_admin::SessionKilled| {
                let what = if k.query { "its statement stopped" } else { "ended" };
                format!(
                    "session {}: {what} (KILL of thread {} on {})\n",
                    k.session, k.thread, k.node
                )
            })
            .await?
        }
        CtlCommand::Upgrade { json } => {
            post_and_print(client, "/upgrade", "upgrade failed", json, |r: holdfast_proxy::upgrade::UpgradeReport| {
                format!(
                    "upgraded: process {} (holdfast {}, generation {}) serves; {} sessions were open on the old process: each goes over at its next safe point (idle, outside a transaction), or ends there\n",
                    r.pid, r.version, r.generation, r.sessions_left
                )
            })
            .await?
        }
        CtlCommand::Scale { size } => {
            let path = if size.eq_ignore_ascii_case("auto") {
                "/scale?auto=true".to_string()
            } else {
                let ccu: f64 = size.parse().with_context(|| {
                    format!("{size:?} is not a size in CCU (e.g. 1.5) nor auto")
                })?;
                format!("/scale?ccu={ccu}")
            };
            instance_operation(client, &path).await?
        }
        CtlCommand::Usage {
            instance,
            since,
            json,
        } => {
            let mut query = Vec::new();
            if let Some(i) = instance {
                query.push(format!("instance={}", query_escape(&i)));
            }
            if let Some(t) = since {
                query.push(format!("since={}", query_escape(&t)));
            }
            let body = get(client, &format!("/usage?{}", query.join("&"))).await?;
            if json {
                println!("{body}");
            } else {
                let lines: Vec<holdfast_serverless::ledger::UsageLine> =
                    serde_json::from_str(&body).context("unexpected /usage body")?;
                print!("{}", holdfast_serverless::ledger::render_bill(&lines));
            }
        }
        CtlCommand::Rejoin { node, json } => {
            ha_operation(
                client,
                &format!("/rejoin?node={}", query_escape(&node)),
                json,
            )
            .await?
        }
    }
    Ok(())
}

/// POSTs an operation: its status code and body.
async fn post(client: &AdminClient, path: &str) -> Result<(u16, String)> {
    client.post(path, None).await.with_context(|| {
        format!(
            "cannot reach the admin API at {} (is holdfast serve running?)",
            client.addr
        )
    })
}

/// POSTs `path` and prints its answer: as JSON with `--json`, else `render` of it; an
/// answer other than 2xx is an error (`what`, with the API's message).
async fn post_and_print<T: serde::de::DeserializeOwned>(
    client: &AdminClient,
    path: &str,
    what: &str,
    json: bool,
    render: impl FnOnce(T) -> String,
) -> Result<()> {
    let (code, body) = post(client, path).await?;
    if !(200..300).contains(&code) {
        return Err(refused(client, what, code, body));
    }
    if json {
        println!("{body}");
    } else {
        let report: T =
            serde_json::from_str(&body).with_context(|| format!("unexpected {path} body"))?;
        print!("{}", render(report));
    }
    Ok(())
}

/// POSTs an operation; its JSON answer, or an error with the API's message.
async fn post_json(client: &AdminClient, path: &str) -> Result<serde_json::Value> {
    let (code, body) = post(client, path).await?;
    if !(200..300).contains(&code) {
        return Err(refused(client, "failed", code, body));
    }
    Ok(serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

/// POSTs a serverless operation and prints the instance afterwards.
async fn instance_operation(client: &AdminClient, path: &str) -> Result<()> {
    let v = post_json(client, path).await?;
    print!("{}", holdfast_admin::render_instance(&v));
    Ok(())
}

/// POSTs a restart or resize and prints its steps.
async fn restart_operation(client: &AdminClient, path: &str) -> Result<()> {
    let v = post_json(client, path).await?;
    for step in v
        .get("steps")
        .and_then(|s| s.as_array())
        .into_iter()
        .flatten()
    {
        println!("{}", step.as_str().unwrap_or_default());
    }
    Ok(())
}

/// POSTs an HA operation and prints its report; non-2xx answers are errors.
async fn ha_operation(client: &AdminClient, path: &str, json: bool) -> Result<()> {
    let (code, body) = post(client, path).await?;
    if !(200..300).contains(&code) {
        let what = match code {
            409 => "busy",
            503 => "withheld",
            400 | 401 | 403 => "refused",
            _ => "failed",
        };
        return Err(refused(client, what, code, body));
    }
    if json {
        println!("{body}");
    } else {
        let report: serde_json::Value =
            serde_json::from_str(&body).context("unexpected report body")?;
        print!("{}", holdfast_admin::render_report(&report));
    }
    Ok(())
}

/// Percent-encodes a query parameter value.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::Parser;

    /// Every `holdfast ...` command in the README's shell blocks is one this binary accepts
    /// (issue 19: the README cannot drift from the product's command line).
    #[test]
    fn the_readmes_commands_parse() {
        let readme = include_str!("../../../README.md");
        let mut in_shell = false;
        let mut checked = 0;
        for line in readme.lines() {
            let trimmed = line.trim();
            if let Some(fence) = trimmed.strip_prefix("```") {
                in_shell = !in_shell && (fence == "sh" || fence == "bash");
                continue;
            }
            if !in_shell || !trimmed.starts_with("holdfast ") {
                continue;
            }
            let command = trimmed.split(" #").next().unwrap_or("").trim();
            let command = command.trim_end_matches('&').trim();
            let args: Vec<&str> = command.split_whitespace().collect();
            if let Err(e) = Cli::try_parse_from(&args) {
                panic!("README: `{command}` does not parse:\n{e}");
            }
            checked += 1;
        }
        assert!(checked >= 8, "only {checked} commands found in the README");
    }
}
