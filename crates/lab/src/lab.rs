//! Starting, inspecting and stopping a lab: one MariaDB primary and N GTID replicas on
//! loopback, plus a `holdfast.toml` that points holdfast at them.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_config::serverless::{
    InstanceDriverConfig, PauseTier, ProcessDriverConfig, ScalePolicy, ServerlessConfig,
};
use holdfast_config::{
    AdminConfig, AdminToken, AuthConfig, BackendConfig, BackendTlsConfig, BackendTlsMode, Config,
    DriverConfig, DriverKind, Durability, HaConfig, HaMode, ListenerConfig, ListenerMode,
    ProxyConfig, Routing, TlsConfig,
};
use serde::{Deserialize, Serialize};

use crate::certs::{self, LabTls};
use crate::procs;
use crate::template;
use holdfast_sql::quote;

/// Port of holdfast's MySQL listener, as an offset from the base port.
pub const PROXY_PORT_OFFSET: u16 = 0;
/// Port of holdfast's HTTP admin listener, as an offset from the base port.
pub const ADMIN_PORT_OFFSET: u16 = 1;
/// Port of holdfast's read/write-split listener (`routing = "split"`), as an offset from
/// the base port (not for serverless labs).
pub const SPLIT_PORT_OFFSET: u16 = 2;
/// With `--proxies 2`: the second member's proxy, admin and split listeners, from this
/// offset on (3, 4, 5).
pub const SECOND_PROXY_PORT_OFFSET: u16 = 3;
/// With `--proxies 2`: the lab's etcd, its client port (6) and its peer port (7).
pub const ETCD_PORT_OFFSET: u16 = 6;
/// Port of `node1`, as an offset from the base port; node *i* (1-based) listens on
/// `base + NODE_PORT_OFFSET + i - 1`, and a node added later ([`add_replica`]) on the first
/// free port from its own slot on (from `node1`'s for a name that is not `nodeK`). Offsets
/// 8 and 9 stay free for helpers (the benchmark picks free ports for HAProxy instead, so
/// they are unused today).
pub const NODE_PORT_OFFSET: u16 = 10;
/// The most holdfast members a lab writes configs for (`--proxies`).
pub const MAX_PROXIES: usize = 2;
/// The default base port of `holdfast lab up`: proxy 3310, admin 3311, split 3312, node1
/// 3320, node2 3321, …
pub const DEFAULT_BASE_PORT: u16 = 3310;

/// Application account (full privileges, `@'%'` and `@'localhost'`).
pub const APP_USER: &str = "app";
/// Password of [`APP_USER`].
pub const APP_PASSWORD: &str = "app_pass";
/// Database created on the primary (the sysbench schema).
pub const DATABASE: &str = "sbtest";
/// holdfast's monitor account (full privileges, `@'%'` and `@'localhost'`).
pub const MONITOR_USER: &str = "holdfast_monitor";
/// The global privileges the README grants the monitor account (besides SELECT on
/// mysql.* and ALL on holdfast.*): what `holdfast check` asks for with managed HA,
/// semi-sync, split reads and node removal.
pub const MONITOR_GLOBAL_PRIVILEGES: &str = "SLAVE MONITOR, CONNECTION ADMIN, PROCESS, \
     REPLICATION SLAVE ADMIN, REPLICATION MASTER ADMIN, READ_ONLY ADMIN, RELOAD, CREATE USER";
/// Password of [`MONITOR_USER`].
pub const MONITOR_PASSWORD: &str = "monitor_pass";
/// Replication account, created on every node without binlogging.
pub const REPL_USER: &str = "repl";
/// Password of [`REPL_USER`].
pub const REPL_PASSWORD: &str = "repl_pass";
/// Account using the `ed25519` plugin, created when the server has `auth_ed25519`.
pub const ED25519_USER: &str = "ed_user";
/// Password of [`ED25519_USER`].
pub const ED25519_PASSWORD: &str = "ed_pass";

/// How long a node may take to accept connections after it is spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long replicas may take to apply the primary's setup transactions.
const CATCH_UP_TIMEOUT_SECS: u32 = 60;
/// How long [`status`] waits for a running node to tell its role.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node gets to shut down cleanly after SIGTERM before SIGKILL.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);
/// `sun_path` is 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

const STATUS_FILE: &str = "lab.json";
const LAUNCH_FILE: &str = "lab-launch.json";
const AUX_FILE: &str = "lab-aux.json";
const CONFIG_FILE: &str = "holdfast.toml";
/// The monitor account's and the replication account's passwords (mode 0600), named by the
/// config.
const MONITOR_PASSWORD_FILE: &str = "monitor.password";
const REPL_PASSWORD_FILE: &str = "repl.password";
/// holdfast's admin API token (`[admin] token_file` of the lab's config), mode 0600.
const ADMIN_TOKEN_FILE: &str = "admin.token";
/// The CA, node and holdfast certificates ([`certs`]).
const TLS_DIR: &str = "tls";

/// [`NodeStatus::live_role`] of a writable node.
const LIVE_PRIMARY: &str = "primary";
/// [`NodeStatus::live_role`] of a read-only node with a replication source.
const LIVE_REPLICA: &str = "replica";
/// [`NodeStatus::live_role`] of a node that does not run.
const LIVE_DOWN: &str = "down";
/// [`NodeStatus::live_role`] of a running node whose role could not be told.
const LIVE_UNKNOWN: &str = "unknown";

/// What `up` should build.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// Directory holding everything of the lab: data directories, sockets, logs, `lab.json`
    /// and `holdfast.toml`. Created if missing; must be empty or hold a stopped lab.
    pub dir: PathBuf,
    /// Number of replicas besides the primary (node1).
    pub replicas: usize,
    /// Base port of the port layout (see [`NODE_PORT_OFFSET`]); `None` picks free ports for
    /// every listener.
    pub base_port: Option<u16>,
    /// Server binary; default: `mariadbd` on PATH, else `mysqld`.
    pub mariadbd: Option<PathBuf>,
    /// Extra `mariadbd` options appended to every node's command line.
    pub extra_server_args: Vec<String>,
    /// Make the lab a serverless instance: `holdfast.toml` gets a `[serverless]` section
    /// whose process driver runs node1 (replicas make no sense there and are refused).
    pub serverless: bool,
    /// holdfast processes the lab writes configs for (1 or 2): with 2, a fleet through an
    /// etcd the lab starts (`[cluster]` in each member's config).
    pub proxies: usize,
}

impl LabOptions {
    /// Options for a lab in `dir` with `replicas` replicas on free ports.
    pub fn new(dir: impl Into<PathBuf>, replicas: usize) -> Self {
        LabOptions {
            dir: dir.into(),
            replicas,
            base_port: None,
            mariadbd: None,
            extra_server_args: Vec::new(),
            serverless: false,
            proxies: 1,
        }
    }
}

/// A lab as recorded in `DIR/lab.json`, with liveness refreshed by [`status`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LabStatus {
    /// The lab directory (absolute).
    pub dir: PathBuf,
    /// Address holdfast's MySQL listener is configured on (`127.0.0.1:P`).
    pub proxy: String,
    /// Address holdfast's admin HTTP listener is configured on.
    pub admin: String,
    /// Address of holdfast's read/write-split listener (a `[[listener]]` with
    /// `routing = "split"`); none for a serverless lab and for labs made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// The file holding holdfast's admin API token (`[admin] token_file`, mode 0600).
    #[serde(default)]
    pub admin_token_file: PathBuf,
    /// holdfast's admin API token, read from `admin_token_file` by [`status`] and [`up`]
    /// (`holdfast lab status --json` shows it; `lab.json` does not keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<AdminToken>,
    /// The server binary the nodes run (`[driver] binaries` of the lab's config).
    #[serde(default)]
    pub mariadbd: PathBuf,
    /// Application user with all privileges.
    pub app_user: String,
    /// Password of `app_user` (mysql_native_password).
    pub app_password: String,
    /// Database created for applications and sysbench.
    pub database: String,
    /// holdfast's monitor user.
    pub monitor_user: String,
    /// Password of `monitor_user`.
    pub monitor_password: String,
    /// User authenticating with the `ed25519` plugin, if the server supports it.
    #[serde(default)]
    pub ed25519_user: Option<String>,
    /// Password of `ed25519_user`.
    #[serde(default)]
    pub ed25519_password: Option<String>,
    /// The holdfast configuration written for this lab (`DIR/holdfast.toml`).
    pub config: PathBuf,
    /// The nodes; `nodes[0]` is the primary.
    pub nodes: Vec<NodeStatus>,
    /// node1 is a serverless instance that holdfast starts, pauses and scales.
    #[serde(default)]
    pub serverless: bool,
    /// The CA that signed the nodes' and holdfast's certificates (PEM): what a client
    /// verifies holdfast's listener against. The other TLS files are beside it
    /// ([`LabStatus::tls`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// With `--proxies 2`: every holdfast member of the lab's fleet, the first being the
    /// one `proxy`, `admin`, `split` and `config` above describe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proxies: Vec<LabProxy>,
    /// With `--proxies 2`: the etcd the members coordinate through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<LabEtcd>,
}

/// One holdfast member of a lab's fleet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LabProxy {
    /// Its name in the fleet (`[cluster] member`): `proxy1`, `proxy2`.
    pub member: String,
    pub proxy: String,
    pub admin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Its config (`holdfast serve --config` it).
    pub config: PathBuf,
}

/// The lab's etcd (Debian's `etcd-server`), one member on loopback.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LabEtcd {
    /// Where clients connect (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    /// Its peer address (one member: only etcd itself uses it).
    pub peer: String,
    pub datadir: PathBuf,
}

/// The fleet name the lab's members share.
pub const LAB_FLEET: &str = "lab";

/// One MariaDB server of a lab.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// `node1`, `node2`, …
    pub name: String,
    /// `127.0.0.1:port`.
    pub address: String,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// `"primary"` or `"replica"` (the role the lab set up; failovers may change reality:
    /// see `live_role`).
    pub role: String,
    /// The role the running server has now, as [`status`] found it: `"primary"` (writable),
    /// `"replica"` (read-only, with a replication source), `"down"` (not running) or
    /// `"unknown"` (not answering, frozen, or read-only without a source). Not kept in
    /// `lab.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_role: Option<String>,
    /// The node (its name, or `host:port` outside the lab) this one replicates from now,
    /// as [`status`] found it. Not kept in `lab.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicates_from: Option<String>,
    /// Process id of the running `mariadbd`, if one was started and not stopped.
    pub pid: Option<u32>,
    /// Whether `pid` is a live `mariadbd` of this node (refreshed by [`status`]).
    pub alive: bool,
    /// Unix socket (root logs in here without a password).
    pub socket: PathBuf,
    /// Data directory.
    pub datadir: PathBuf,
}

impl NodeStatus {
    /// The error log of this node (`DIR/nodeN.err`).
    pub fn error_log(&self) -> PathBuf {
        self.socket.with_extension("err")
    }

    /// The pid file of this node (`DIR/nodeN.pid`).
    pub fn pid_file(&self) -> PathBuf {
        self.socket.with_extension("pid")
    }

    /// The node's own temporary directory (not the shared /tmp: nodes and test labs never
    /// see each other's temporary files).
    pub fn tmpdir(&self) -> PathBuf {
        self.socket.with_extension("tmp")
    }

    /// Whether this node was set up as the primary.
    pub fn is_primary(&self) -> bool {
        self.role == "primary"
    }

    /// Whether [`status`] found this node writable (the primary now).
    pub fn is_live_primary(&self) -> bool {
        self.live_role.as_deref() == Some(LIVE_PRIMARY)
    }

    /// 1-based index taken from the name (`node3` → 3).
    fn index(&self) -> Result<usize> {
        self.name
            .strip_prefix("node")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("unexpected node name {:?}", self.name))
    }
}

impl LabStatus {
    /// The primary: the node that is writable now, as [`status`] found it (the one set up as
    /// the primary if several are), else — nodes down or not asked — the node the lab set
    /// up as the primary.
    pub fn primary(&self) -> Result<&NodeStatus> {
        let live: Vec<&NodeStatus> = self.nodes.iter().filter(|n| n.is_live_primary()).collect();
        match live.iter().find(|n| n.is_primary()).or(live.first()) {
            Some(n) => Ok(n),
            None => self.recorded_primary(),
        }
    }

    /// The node the lab set up as the primary (`role`), whatever the servers say now.
    pub fn recorded_primary(&self) -> Result<&NodeStatus> {
        self.nodes
            .iter()
            .find(|n| n.is_primary())
            .context("the lab has no primary node")
    }

    /// The nodes other than [`LabStatus::primary`], in order.
    pub fn replicas(&self) -> impl Iterator<Item = &NodeStatus> {
        let primary = self.primary().ok().map(|p| p.name.clone());
        self.nodes
            .iter()
            .filter(move |n| Some(&n.name) != primary.as_ref())
    }

    /// The lab's TLS files, when it has them.
    pub fn tls(&self) -> Option<LabTls> {
        let dir = self.ca.as_deref()?.parent()?;
        Some(LabTls::in_dir(dir))
    }

    /// `[tls]` and `[backend_tls]` for holdfast in front of this lab: its certificate
    /// offered to clients, the nodes verified (verify-full) against the lab's CA. Both
    /// off for a lab without TLS files.
    pub fn tls_sections(&self) -> (TlsConfig, BackendTlsConfig) {
        match self.tls() {
            Some(t) => (
                TlsConfig {
                    cert: Some(t.holdfast_cert),
                    key: Some(t.holdfast_key),
                    ..TlsConfig::default()
                },
                BackendTlsConfig {
                    mode: BackendTlsMode::VerifyFull,
                    ca: Some(t.ca),
                    ..BackendTlsConfig::default()
                },
            ),
            None => Default::default(),
        }
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Result<&NodeStatus> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("the lab in {} has no node {name:?}", self.dir.display()))
    }
}

/// How the nodes were launched, for restarting them (`DIR/lab-launch.json`).
#[derive(Serialize, Deserialize, Clone, Debug)]
struct LaunchInfo {
    mariadbd: PathBuf,
    extra_server_args: Vec<String>,
    replicas: usize,
    /// Per-node binary and options set by [`restart_node`] (upgrades, resizes).
    #[serde(default)]
    node_overrides: BTreeMap<String, NodeOverride>,
    /// The lab's TLS files ([`certs`]); labs made before TLS have none.
    #[serde(default)]
    tls_dir: Option<PathBuf>,
    /// The base port of the lab's port layout; none for a lab on free ports (and labs made
    /// before it was recorded: [`layout_base`] works it out from their ports).
    #[serde(default)]
    base_port: Option<u16>,
    /// Server ids of the nodes added by [`add_replica`] (the others have their name's
    /// number, `nodeK` → K).
    #[serde(default)]
    server_ids: BTreeMap<String, u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
struct NodeOverride {
    mariadbd: Option<PathBuf>,
    /// `--key=value` options, appended last so they win.
    args: BTreeMap<String, String>,
}

/// A helper process (HAProxy, holdfast under benchmark) that `down` must also stop.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct AuxProcess {
    pub name: String,
    pub pid: u32,
    /// Its start time ([`procs::start_time`]), guarding against pid reuse.
    pub start_time: u64,
}

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// Brings a lab up in `opts.dir` and returns its status once every node accepts
/// connections and every replica has applied the primary's setup.
///
/// * An empty or missing directory gets a fresh lab: data directories copied from the
///   cached template, replication configured, accounts created on the primary.
/// * A directory holding a stopped lab (after [`down`] without purge) is restarted with
///   its data; its shape (replica count, ports) is kept.
/// * A directory holding a running lab, or anything else, is an error.
pub fn up(opts: &LabOptions) -> Result<LabStatus> {
    if opts.serverless && opts.replicas > 0 {
        bail!("a serverless lab is a single instance: use --replicas 0 with --serverless");
    }
    let dir = std::path::absolute(&opts.dir)
        .with_context(|| format!("resolving {}", opts.dir.display()))?;
    if dir.join(STATUS_FILE).exists() {
        return restart_existing(&dir, opts);
    }
    if dir.join(LAUNCH_FILE).exists() {
        bail!(
            "{} holds an incomplete lab (an earlier `up` failed); remove it with \
             `holdfast lab down --dir {} --purge`",
            dir.display(),
            dir.display()
        );
    }
    if dir.exists() {
        let mut entries =
            fs::read_dir(&dir).with_context(|| format!("reading directory {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty and holds no lab; choose an empty or new directory",
                dir.display()
            );
        }
    }
    fresh_lab(&dir, opts)
}

/// Reads `DIR/lab.json`, refreshes each node's `alive` flag (a recorded pid counts only
/// while it is a `mariadbd` serving that node's data directory) and asks every running node
/// for its role now (`live_role`, `replicates_from`; [`LabStatus::primary`] follows them).
pub fn status(dir: &Path) -> Result<LabStatus> {
    let mut st = load(dir)?;
    probe_live_roles(&mut st);
    Ok(st)
}

/// `DIR/lab.json` with fresh liveness, without asking the servers anything.
fn load(dir: &Path) -> Result<LabStatus> {
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let path = dir.join(STATUS_FILE);
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "no lab in {} (cannot read {})",
            dir.display(),
            path.display()
        )
    })?;
    let mut st: LabStatus =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    for node in &mut st.nodes {
        refresh_node(node);
    }
    if st.admin_token_file.as_os_str().is_empty() {
        st.admin_token_file = st.dir.join(ADMIN_TOKEN_FILE);
    }
    st.admin_token = holdfast_config::admin::read_token_file(&st.admin_token_file).ok();
    Ok(st)
}

/// Stops every process the lab started (mariadbd: SIGTERM, wait up to 60 s, then
/// SIGKILL; likewise benchmark helpers). Data stays; [`up`] on the same directory
/// restarts the lab. See [`purge`] to also delete the directory.
pub fn down(dir: &Path) -> Result<()> {
    stop_all(dir, false)
}

/// [`down`], then deletes the lab directory. Refuses directories that hold no lab files.
pub fn purge(dir: &Path) -> Result<()> {
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    if !dir.exists() {
        return Ok(());
    }
    if !dir.join(STATUS_FILE).exists() && !dir.join(LAUNCH_FILE).exists() {
        bail!(
            "refusing to delete {}: it holds no lab (no {STATUS_FILE} or {LAUNCH_FILE})",
            dir.display()
        );
    }
    stop_all(&dir, false)?;
    remove_dir_retrying(&dir)
}

/// Stops one node cleanly (SIGTERM, wait up to 60 s, then SIGKILL) and records it as stopped.
pub fn stop_node(dir: &Path, name: &str) -> Result<NodeStatus> {
    let mut st = load(dir)?;
    let node = node_mut(&mut st, name)?;
    if let Some(pid) = node.pid.filter(|_| node.alive) {
        procs::terminate(pid, SHUTDOWN_GRACE)
            .with_context(|| format!("stopping {} (pid {pid})", node.name))?;
    }
    node.pid = None;
    node.alive = false;
    let out = node.clone();
    write_status(&st)?;
    Ok(out)
}

/// Kills one node with SIGKILL (a crash, for failure tests) and records it as stopped.
pub fn kill_node(dir: &Path, name: &str) -> Result<NodeStatus> {
    let mut st = load(dir)?;
    let node = node_mut(&mut st, name)?;
    if let Some(pid) = node.pid.filter(|_| node.alive) {
        procs::kill_now(pid).with_context(|| format!("killing {} (pid {pid})", node.name))?;
    }
    node.pid = None;
    node.alive = false;
    let out = node.clone();
    write_status(&st)?;
    Ok(out)
}

/// Restarts one node cleanly with another binary (a minor-version upgrade) and/or other
/// server options (`key=value`, e.g. `innodb_buffer_pool_size=256M`: a resize). The choice
/// is remembered for later restarts of that node.
pub fn restart_node(
    dir: &Path,
    name: &str,
    mariadbd: Option<&Path>,
    set: &[String],
) -> Result<NodeStatus> {
    let mut launch = read_launch(dir)?;
    let o = launch.node_overrides.entry(name.to_string()).or_default();
    if let Some(bin) = mariadbd {
        if !bin.exists() {
            bail!("no server binary at {}", bin.display());
        }
        o.mariadbd = Some(bin.to_path_buf());
    }
    for kv in set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("server option {kv:?} is not KEY=VALUE"))?;
        o.args.insert(
            k.trim().trim_start_matches("--").replace('_', "-"),
            v.trim().to_string(),
        );
    }
    stop_node(dir, name)?;
    write_json(&dir.join(LAUNCH_FILE), &launch)?;
    start_node(dir, name)
}

/// Starts a stopped node again with its data and waits until it accepts connections.
/// A node that is already running is left alone.
///
/// While another node of the lab is writable, the node starts as a replica whatever role
/// it was created with (`--read-only=ON --init-rpl-role=SLAVE`): a killed primary that
/// comes back after a failover must not take writes, and MariaDB's crash recovery then
/// truncates the binary log transactions no replica acknowledged (semi-sync), so that
/// `holdfast ctl rejoin` finds it in line with the new primary instead of diverged.
pub fn start_node(dir: &Path, name: &str) -> Result<NodeStatus> {
    let mut st = load(dir)?;
    let launch = read_launch(&st.dir)?;
    let another_writable = st
        .nodes
        .iter()
        .filter(|n| n.name != name && n.alive)
        .any(|n| {
            node_sql(n, "SELECT @@read_only")
                .is_ok_and(|r| r.first().and_then(|r| r.first()).is_some_and(|v| v == "0"))
        });
    let node = node_mut(&mut st, name)?;
    let mut started = Vec::new();
    if !node.alive {
        let role = match another_writable {
            true => Role::Replica,
            false => Role::AsCreated,
        };
        let pid = spawn_node_as(&launch, node, role)?;
        let mut guard = KillGuard(vec![pid]);
        wait_ready(node, pid)?;
        node.pid = Some(pid);
        node.alive = true;
        started.append(&mut guard.0);
    }
    let out = node.clone();
    write_status(&st)?;
    forget_starting(&st, &started);
    Ok(out)
}

/// Adds a replica to a running lab and returns it once it replicates and has caught up.
///
/// The new node (default name: the next `nodeK`) runs with the options, TLS files and
/// server arguments of the lab's other nodes, on the next free port of the lab's port layout
/// ([`NODE_PORT_OFFSET`]). It is seeded from a consistent dump of the **current** primary
/// (the writable node, whatever `lab.json` recorded), so it works however much of the
/// primary's binary log was purged, then replicates from it by GTID. It is added to
/// `lab.json` and to `holdfast.toml`'s backends (a running holdfast does not reread them).
pub fn add_replica(dir: &Path, name: Option<&str>) -> Result<NodeStatus> {
    let st = status(dir)?;
    if st.serverless {
        bail!("a serverless lab is a single instance: it takes no replicas");
    }
    let launch = read_launch(&st.dir)?;
    let primary = live_primary(&st)?.clone();
    let (name, number) = match name {
        Some(name) => {
            check_new_name(&st, name)?;
            (name.to_string(), node_number(name))
        }
        None => next_node_name(&st),
    };
    let taken_ids = st
        .nodes
        .iter()
        .map(|n| server_id(&launch, n))
        .collect::<Result<Vec<u32>>>()?;
    let server_id = match number.and_then(|k| u32::try_from(k).ok()) {
        Some(k) if !taken_ids.contains(&k) => k,
        _ => taken_ids.iter().max().copied().unwrap_or(0) + 1,
    };
    let port = next_node_port(&st, &launch, number)?;
    let node = NodeStatus {
        address: format!("127.0.0.1:{port}"),
        port,
        role: "replica".into(),
        live_role: None,
        replicates_from: None,
        pid: None,
        alive: false,
        socket: st.dir.join(format!("{name}.sock")),
        datadir: st.dir.join(&name),
        name,
    };
    if node.socket.as_os_str().len() > MAX_SOCKET_PATH {
        bail!(
            "socket path {} is longer than {MAX_SOCKET_PATH} bytes (a unix socket limit); \
             choose a shorter name",
            node.socket.display()
        );
    }
    let mut launch = launch;
    launch.server_ids.insert(node.name.clone(), server_id);

    let template = template::ensure(&launch.mariadbd)?;
    if node.datadir.exists() {
        bail!("{} already exists", node.datadir.display());
    }
    // From here on, a failure leaves nothing behind.
    let mut guard = NewNodeGuard {
        node: node.clone(),
        pid: None,
        armed: true,
    };
    template::copy_to(&template, &[node.datadir.as_path()])?;
    let pid = spawn_node(&launch, &node)?;
    guard.pid = Some(pid);
    wait_ready(&node, pid)?;
    seed_and_replicate(&st, &primary, &node)?;

    // Recorded only now, from a fresh read: a node restarted meanwhile keeps its new pid.
    let mut st = load(&st.dir)?;
    if st.nodes.iter().any(|n| n.name == node.name) {
        bail!("a node {:?} appeared in the lab meanwhile", node.name);
    }
    let mut launch_now = read_launch(&st.dir)?;
    launch_now.server_ids.insert(node.name.clone(), server_id);
    let added = NodeStatus {
        pid: Some(pid),
        alive: true,
        live_role: Some(LIVE_REPLICA.into()),
        replicates_from: Some(primary.name.clone()),
        ..node
    };
    st.nodes.push(added.clone());
    launch_now.replicas = st.nodes.len().saturating_sub(1);
    write_json(&st.dir.join(LAUNCH_FILE), &launch_now)?;
    write_status(&st)?;
    write_config(&st)?;
    guard.armed = false;
    forget_starting(&st, &[pid]);
    Ok(added)
}

/// Removes a node from a lab: stops its server, deletes its data directory and files, and
/// takes it out of `lab.json` and `holdfast.toml`. Refuses, changing nothing, an unknown
/// name, the primary ([`LabStatus::primary`]: the writable node now, else the one set up
/// as the primary), a node another one replicates from, and the lab's last node.
pub fn remove_node(dir: &Path, name: &str) -> Result<NodeStatus> {
    let st = status(dir)?;
    let Some(node) = st.nodes.iter().find(|n| n.name == name).cloned() else {
        let names: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
        bail!(
            "the lab in {} has no node {name:?} (its nodes: {})",
            st.dir.display(),
            names.join(", ")
        );
    };
    if st.nodes.len() == 1 {
        bail!(
            "{name} is the lab's last node; `holdfast lab down --dir {} --purge` deletes the \
             whole lab",
            st.dir.display()
        );
    }
    let primary = st.primary()?.clone();
    if primary.name == name {
        let how = if node.is_live_primary() {
            "it is writable now"
        } else {
            "no other node is writable now and the lab set it up as the primary"
        };
        bail!(
            "{name} is the lab's primary ({how}); switch over to another node first \
             (holdfast ctl switchover) or remove a replica"
        );
    }
    if let Some(r) = st
        .nodes
        .iter()
        .find(|n| n.replicates_from.as_deref() == Some(name))
    {
        bail!(
            "{} replicates from {name}; point it at another node before removing {name}",
            r.name
        );
    }

    if let Some(pid) = node.pid.filter(|_| node.alive) {
        procs::terminate(pid, SHUTDOWN_GRACE)
            .with_context(|| format!("stopping {name} (pid {pid})"))?;
    }
    let mut now = load(&st.dir)?;
    now.nodes.retain(|n| n.name != name);
    // The primary the lab restarts with (`up` on a stopped lab) is the recorded one: when
    // the node set up as the primary goes, the node that is the primary now takes its role.
    if node.is_primary() {
        for n in &mut now.nodes {
            n.role = if n.name == primary.name {
                "primary"
            } else {
                "replica"
            }
            .into();
        }
    }
    let mut launch = read_launch(&now.dir)?;
    launch.node_overrides.remove(name);
    launch.server_ids.remove(name);
    launch.replicas = now.nodes.len().saturating_sub(1);
    write_json(&now.dir.join(LAUNCH_FILE), &launch)?;
    write_status(&now)?;
    write_config(&now)?;
    delete_node_files(&node)?;
    Ok(NodeStatus {
        pid: None,
        alive: false,
        live_role: Some(LIVE_DOWN.into()),
        replicates_from: None,
        ..node
    })
}

/// While armed, kills the server [`add_replica`] started and deletes the node's files on
/// drop (the add failed); disarmed once the node is recorded.
struct NewNodeGuard {
    node: NodeStatus,
    pid: Option<u32>,
    armed: bool,
}

impl Drop for NewNodeGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(pid) = self.pid {
            let _ = procs::kill_now(pid);
            if let Some(dir) = self.node.socket.parent() {
                let _ = unregister_aux(dir, pid);
            }
        }
        if let Err(e) = delete_node_files(&self.node) {
            tracing::warn!(node = %self.node.name, "cleaning up after a failed add: {e:#}");
        }
    }
}

/// Deletes a node's data directory, temporary directory, socket, pid file and error log.
fn delete_node_files(node: &NodeStatus) -> Result<()> {
    for dir in [node.datadir.clone(), node.tmpdir()] {
        remove_dir_retrying(&dir)?;
    }
    for file in [node.socket.clone(), node.pid_file(), node.error_log()] {
        match fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", file.display())),
        }
    }
    Ok(())
}

/// The one writable node of a lab whose status was just probed.
fn live_primary(st: &LabStatus) -> Result<&NodeStatus> {
    let live: Vec<&NodeStatus> = st.nodes.iter().filter(|n| n.is_live_primary()).collect();
    match live.as_slice() {
        [one] => Ok(one),
        [] => {
            let roles: Vec<String> = st
                .nodes
                .iter()
                .map(|n| {
                    let role = n.live_role.as_deref().unwrap_or(LIVE_UNKNOWN);
                    format!("{} {role}", n.name)
                })
                .collect();
            bail!(
                "the lab in {} has no running writable node (@@read_only = 0) to copy a \
                 replica from ({})",
                st.dir.display(),
                roles.join(", ")
            )
        }
        many => {
            let names: Vec<&str> = many.iter().map(|n| n.name.as_str()).collect();
            bail!(
                "several nodes of the lab in {} are writable ({}); which one is the primary?",
                st.dir.display(),
                names.join(", ")
            )
        }
    }
}

/// `K` of a name `nodeK`.
fn node_number(name: &str) -> Option<usize> {
    name.strip_prefix("node")
        .filter(|k| !k.starts_with('0'))
        .and_then(|k| k.parse().ok())
}

/// The next `nodeK` after the highest one of the lab whose data directory is free.
fn next_node_name(st: &LabStatus) -> (String, Option<usize>) {
    let mut k = st
        .nodes
        .iter()
        .filter_map(|n| node_number(&n.name))
        .max()
        .unwrap_or(0)
        + 1;
    while st.dir.join(format!("node{k}")).exists() {
        k += 1;
    }
    (format!("node{k}"), Some(k))
}

/// A new node's name becomes file names in the lab directory (`NAME/`, `NAME.sock`, …).
fn check_new_name(st: &LabStatus, name: &str) -> Result<()> {
    let valid = (1..=32).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        bail!(
            "node name {name:?}: use 1 to 32 letters, digits, '_' or '-', starting with a letter"
        );
    }
    if st.nodes.iter().any(|n| n.name == name) {
        bail!("the lab in {} already has a node {name}", st.dir.display());
    }
    let datadir = st.dir.join(name);
    if datadir.exists() || name == TLS_DIR {
        bail!(
            "node name {name:?}: {} already exists in the lab directory",
            datadir.display()
        );
    }
    Ok(())
}

/// The base port of the lab's port layout: recorded at creation, or worked out from the
/// ports of a lab made before it was recorded; none for a lab on free ports.
fn layout_base(st: &LabStatus, launch: &LaunchInfo) -> Option<u16> {
    if launch.base_port.is_some() {
        return launch.base_port;
    }
    let node1 = st.nodes.iter().find(|n| n.name == "node1")?;
    let base = node1.port.checked_sub(NODE_PORT_OFFSET)?;
    let fits = st.proxy == format!("127.0.0.1:{}", base + PROXY_PORT_OFFSET)
        && st.nodes.iter().all(|n| {
            node_number(&n.name).is_some_and(|k| {
                usize::from(n.port) == usize::from(base + NODE_PORT_OFFSET) + k - 1
            })
        });
    fits.then_some(base)
}

/// The port of a new node: with a port layout, the first port from node `number`'s slot
/// (node1's without a number) that no listener of the lab uses and nothing listens on; on
/// a lab of free ports, a free port.
fn next_node_port(st: &LabStatus, launch: &LaunchInfo, number: Option<usize>) -> Result<u16> {
    let mut used: Vec<u16> = st.nodes.iter().map(|n| n.port).collect();
    used.extend(
        [Some(&st.proxy), Some(&st.admin), st.split.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|a| a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok())),
    );
    let bindable = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    match layout_base(st, launch) {
        Some(base) => {
            let slot = number.unwrap_or(1).saturating_sub(1);
            let first = usize::from(base) + usize::from(NODE_PORT_OFFSET) + slot;
            (first..=usize::from(u16::MAX))
                .filter_map(|p| u16::try_from(p).ok())
                .find(|&p| !used.contains(&p) && bindable(p))
                .with_context(|| format!("no free port from {first} on for a new node"))
        }
        None => {
            for _ in 0..10 {
                let port = procs::free_ports(1)?[0];
                if !used.contains(&port) {
                    return Ok(port);
                }
            }
            bail!("no free port for a new node")
        }
    }
}

/// Loads a consistent copy of `primary`'s data and accounts into the fresh `node` and makes
/// it replicate from `primary` by GTID; returns once it runs and has caught up.
fn seed_and_replicate(st: &LabStatus, primary: &NodeStatus, node: &NodeStatus) -> Result<()> {
    // The node's own part, outside its binlog, as `configure` makes it on every node: the
    // ed25519 plugin (the dump's accounts may use it) and the replication account.
    let user = quote::plain_string_literal(REPL_USER)?;
    let password = quote::plain_string_literal(REPL_PASSWORD)?;
    let mut sql = String::from("SET SESSION sql_log_bin=0; ");
    if st.ed25519_user.is_some() {
        sql.push_str("INSTALL SONAME 'auth_ed25519'; ");
    }
    sql.push_str(&format!(
        "CREATE USER {user}@'%' IDENTIFIED BY {password}; \
         GRANT REPLICATION SLAVE, REPLICATION SLAVE ADMIN, BINLOG MONITOR ON *.* TO {user}@'%';"
    ));
    node_sql(node, &sql).with_context(|| format!("preparing {}", node.name))?;

    copy_primary(primary, node)?;
    let pos = node_sql_value(node, "SELECT @@GLOBAL.gtid_slave_pos")?.unwrap_or_default();
    if pos.is_empty() {
        bail!(
            "the dump of {} set no GTID position on {}; cannot start replication",
            primary.name,
            node.name
        );
    }
    // Events come out of a dump enabled; on a replica they must not run (replication
    // brings their effects), as replicated events are: SLAVESIDE_DISABLED.
    let events = node_sql(
        node,
        "SELECT EVENT_SCHEMA, EVENT_NAME FROM information_schema.EVENTS WHERE STATUS = 'ENABLED'",
    )?;
    if !events.is_empty() {
        let mut sql = String::from("SET SESSION sql_log_bin=0; ");
        for e in &events {
            if let [schema, name] = e.as_slice() {
                sql.push_str(&format!(
                    "ALTER EVENT {}.{} DISABLE ON SLAVE; ",
                    quote::identifier(schema),
                    quote::identifier(name)
                ));
            }
        }
        node_sql(node, &sql)?;
    }
    node_sql(
        node,
        &format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, \
             MASTER_USER={user}, MASTER_PASSWORD={password}, \
             MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; START SLAVE;",
            primary.port
        ),
    )?;
    wait_replicating(node, primary)
}

/// Pipes `mariadb-dump` of `primary` (as root through its socket) into `mariadb` on `node`.
///
/// What is copied, in one transaction (`--single-transaction`) at one GTID position:
/// * every database but the system ones, with routines, events and triggers;
/// * the accounts, as `CREATE USER IF NOT EXISTS` and `GRANT` statements
///   (`--system=users --insert-ignore`), not as rows of `mysql.global_priv`: a dump of
///   the `mysql` schema would drop and recreate tables the new server is using, among them
///   `mysql.gtid_slave_pos` (the replication position the dump sets). Accounts the node
///   already has (root, `mariadb.sys` and the replication account its bootstrap made) stay
///   as they are; the others — the lab's application, monitor and ed25519 accounts and any
///   made since — come from the primary. Later account changes on the primary arrive by
///   replication, as with every other replica.
/// * `--gtid --master-data=1`: `CHANGE MASTER TO MASTER_USE_GTID=slave_pos` first and
///   `SET GLOBAL gtid_slave_pos` to the dump's position last.
///
/// The load runs with `sql_log_bin=0`: a replica's own binlog must hold only replicated
/// transactions (GTID strict mode), never local ones in the primary's domain.
fn copy_primary(primary: &NodeStatus, node: &NodeStatus) -> Result<()> {
    let databases: Vec<String> = node_sql(
        primary,
        "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME NOT IN \
         ('mysql', 'information_schema', 'performance_schema', 'sys') ORDER BY 1",
    )?
    .into_iter()
    .filter_map(|row| row.into_iter().next())
    .collect();
    let dump_exe = procs::require_program(&["mariadb-dump", "mysqldump"], "mariadb-client")?;
    let mut dump = Command::new(&dump_exe);
    dump.arg("--no-defaults")
        .arg("--user=root")
        .arg(format!("--socket={}", primary.socket.display()))
        .args([
            "--single-transaction",
            "--gtid",
            "--master-data=1",
            "--routines",
            "--events",
            "--triggers",
            "--system=users",
            "--insert-ignore",
        ]);
    if databases.is_empty() {
        // Accounts and the position only.
        dump.args(["--no-data", "--databases", "mysql"]);
    } else {
        dump.arg("--databases").args(&databases);
    }
    let mut dump = dump
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", dump_exe.display()))?;
    let Some(dump_out) = dump.stdout.take() else {
        let _ = dump.kill();
        let _ = dump.wait();
        bail!("{} gave no output pipe", dump_exe.display());
    };
    let client = mariadb_client()?;
    let load = Command::new(client)
        .arg("--no-defaults")
        .arg("--user=root")
        .arg(format!("--socket={}", node.socket.display()))
        .arg("--init-command=SET SESSION sql_log_bin=0")
        .arg("--batch")
        .stdin(dump_out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let load = match load {
        Ok(l) => l.wait_with_output(),
        Err(e) => {
            let _ = dump.kill();
            let _ = dump.wait();
            return Err(e).with_context(|| format!("running {}", client.display()));
        }
    };
    let dumped = dump
        .wait_with_output()
        .with_context(|| format!("waiting for {}", dump_exe.display()))?;
    let loaded = load.with_context(|| format!("waiting for {}", client.display()))?;
    if !dumped.status.success() {
        let stderr = String::from_utf8_lossy(&dumped.stderr);
        // Labs made before their template used --skip-name-resolve have root@<hostname>,
        // an account the nodes ignore (they run with --skip-name-resolve) and so cannot show.
        let hint = if stderr.contains("SHOW CREATE USER") {
            "\n(the primary has an account for a host name, which the lab's servers ignore \
             under --skip-name-resolve and so cannot dump; DROP USER it on the primary)"
        } else {
            ""
        };
        bail!(
            "dumping {} failed ({}): {}{hint}",
            primary.name,
            dumped.status,
            stderr.trim()
        );
    }
    if !loaded.status.success() {
        bail!(
            "loading the dump of {} into {} failed ({}): {}",
            primary.name,
            node.name,
            loaded.status,
            String::from_utf8_lossy(&loaded.stderr).trim()
        );
    }
    Ok(())
}

/// Waits until `replica`'s replication threads both run and it has applied what `primary`
/// had binlogged once they did.
fn wait_replicating(replica: &NodeStatus, primary: &NodeStatus) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(u64::from(CATCH_UP_TIMEOUT_SECS));
    loop {
        let row = node_sql_maps(replica, "SHOW SLAVE STATUS")?
            .into_iter()
            .next()
            .with_context(|| format!("{} has no replication set up", replica.name))?;
        let field = |k: &str| row.get(k).map(String::as_str).unwrap_or("");
        if field("Slave_IO_Running") == "Yes" && field("Slave_SQL_Running") == "Yes" {
            break;
        }
        // A thread that stopped on an error does not restart by itself ("Connecting" does
        // retry).
        let stopped = ["Slave_IO_Running", "Slave_SQL_Running"]
            .iter()
            .any(|k| field(k) == "No");
        let failed = !field("Last_IO_Error").is_empty() || !field("Last_SQL_Error").is_empty();
        if (stopped && failed) || Instant::now() >= deadline {
            bail!(
                "{} does not replicate from {}: {}",
                replica.name,
                primary.name,
                slave_status_detail(replica)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pos = node_sql_value(primary, "SELECT @@GLOBAL.gtid_binlog_pos")?.unwrap_or_default();
    let left = deadline
        .saturating_duration_since(Instant::now())
        .as_secs()
        .max(1);
    let waited = node_sql_value(
        replica,
        &format!(
            "SELECT MASTER_GTID_WAIT({}, {left})",
            quote::plain_string_literal(&pos)?
        ),
    )?;
    if waited.as_deref() != Some("0") {
        bail!(
            "{} did not reach {}'s GTID position {pos} within {CATCH_UP_TIMEOUT_SECS} s; {}",
            replica.name,
            primary.name,
            slave_status_detail(replica)
        );
    }
    Ok(())
}

/// The replication threads' states and errors of `node`, for error messages.
fn slave_status_detail(node: &NodeStatus) -> String {
    node_sql_maps(node, "SHOW SLAVE STATUS")
        .ok()
        .and_then(|rows| rows.into_iter().next())
        .map(|row| {
            [
                "Slave_IO_Running",
                "Slave_SQL_Running",
                "Gtid_IO_Pos",
                "Last_IO_Error",
                "Last_SQL_Error",
            ]
            .iter()
            .map(|k| format!("{k}={}", row.get(*k).map(String::as_str).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(", ")
        })
        .map(|d| format!("slave status: {d}"))
        .unwrap_or_else(|| "(no SHOW SLAVE STATUS row)".into())
}

/// Asks every running node for its role now: `live_role` and `replicates_from`.
fn probe_live_roles(st: &mut LabStatus) {
    let probes = in_parallel(&st.nodes, |n| Ok(probe(n)));
    let nodes: Vec<(String, u16)> = st.nodes.iter().map(|n| (n.name.clone(), n.port)).collect();
    for (node, probe) in st.nodes.iter_mut().zip(probes) {
        let (role, source) = probe.unwrap_or((LIVE_UNKNOWN, None));
        node.live_role = Some(role.into());
        node.replicates_from = source.map(|(host, port)| {
            let local = matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1");
            nodes
                .iter()
                .find(|(_, p)| local && *p == port)
                .map(|(name, _)| name.clone())
                .unwrap_or_else(|| format!("{host}:{port}"))
        });
    }
}

/// One node's role now and its replication source (`host`, `port`).
fn probe(node: &NodeStatus) -> (&'static str, Option<(String, u16)>) {
    let Some(pid) = node.pid.filter(|_| node.alive) else {
        return (LIVE_DOWN, None);
    };
    // A frozen server accepts a connection but never answers.
    if procs::is_stopped(pid) {
        return (LIVE_UNKNOWN, None);
    }
    let rows = match run_client_within(
        node,
        "SELECT @@GLOBAL.read_only; SHOW SLAVE STATUS",
        true,
        Some(PROBE_TIMEOUT),
    ) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(node = %node.name, "role probe failed: {e:#}");
            return (LIVE_UNKNOWN, None);
        }
    };
    // With column names: the first set's header and row, then SHOW SLAVE STATUS's header
    // and row (none without replication set up).
    let read_only = rows.get(1).and_then(|r| r.first()).map(String::as_str);
    let source = match (rows.get(2), rows.get(3)) {
        (Some(header), Some(values)) => {
            let get = |k: &str| {
                header
                    .iter()
                    .position(|h| h == k)
                    .and_then(|i| values.get(i))
                    .filter(|v| !v.is_empty())
            };
            match (
                get("Master_Host"),
                get("Master_Port").and_then(|p| p.parse().ok()),
            ) {
                (Some(host), Some(port)) => Some((host.clone(), port)),
                _ => None,
            }
        }
        _ => None,
    };
    match (read_only, source) {
        (Some("0"), source) => (LIVE_PRIMARY, source),
        (Some("1"), Some(source)) => (LIVE_REPLICA, Some(source)),
        (_, source) => (LIVE_UNKNOWN, source),
    }
}

/// Runs `sql` (one or more `;`-separated statements) on `node` as root through its unix
/// socket with the `mariadb` command-line client. Returns the rows of all result sets,
/// each a vector of column values; `NULL` comes back as the string `"NULL"`, and
/// `\t`, `\n`, `\\` and `\0` inside values are unescaped.
pub fn node_sql(node: &NodeStatus, sql: &str) -> Result<Vec<Vec<String>>> {
    run_client(node, sql, false)
}

/// Like [`node_sql`], but each row is a map from column name to value (handy for
/// `SHOW SLAVE STATUS` and friends). With several result sets, rows of later sets are
/// keyed by the first set's column names; use one statement.
pub fn node_sql_maps(node: &NodeStatus, sql: &str) -> Result<Vec<BTreeMap<String, String>>> {
    let mut lines = run_client(node, sql, true)?.into_iter();
    let Some(header) = lines.next() else {
        return Ok(Vec::new());
    };
    Ok(lines
        .map(|row| header.iter().cloned().zip(row).collect())
        .collect())
}

fn run_client(node: &NodeStatus, sql: &str, column_names: bool) -> Result<Vec<Vec<String>>> {
    run_client_within(node, sql, column_names, None)
}

/// [`run_client`], killed after `timeout` if one is given.
fn run_client_within(
    node: &NodeStatus,
    sql: &str,
    column_names: bool,
    timeout: Option<Duration>,
) -> Result<Vec<Vec<String>>> {
    let client = mariadb_client()?;
    let mut cmd = Command::new(client);
    cmd.arg("--no-defaults")
        .arg("--user=root")
        .arg(format!("--socket={}", node.socket.display()))
        .arg("--batch");
    if !column_names {
        cmd.arg("--skip-column-names");
    }
    cmd.arg("--execute").arg(sql);
    let out = match timeout {
        Some(t) => procs::output_within(cmd.arg("--connect-timeout=2"), t)?,
        None => cmd
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("running {}", client.display()))?,
    };
    if !out.status.success() {
        bail!(
            "SQL on {} failed: {}\nstatement: {}",
            node.name,
            String::from_utf8_lossy(&out.stderr).trim(),
            sql
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .map(|line| line.split('\t').map(unescape_batch).collect())
        .collect())
}

/// Runs `sql` on `node` and returns the first column of the first row, if any.
pub fn node_sql_value(node: &NodeStatus, sql: &str) -> Result<Option<String>> {
    Ok(node_sql(node, sql)?
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next()))
}

// ---------------------------------------------------------------------------------------
// TestLab
// ---------------------------------------------------------------------------------------

/// A lab for tests: a fresh directory under the system temp dir, free ports, and teardown
/// on drop (every process SIGKILLed — the data is thrown away anyway — and the directory
/// removed). Set `HOLDFAST_LAB_KEEP=1` to keep the directory (nodes are still stopped) for
/// a post-mortem; its path is printed to stderr.
#[derive(Debug)]
pub struct TestLab {
    /// The lab's status as of start (or the last [`TestLab::refresh`]).
    pub status: LabStatus,
}

impl TestLab {
    /// Starts a primary and `replicas` replicas.
    pub fn start(replicas: usize) -> Result<TestLab> {
        Self::start_with(replicas, Vec::new())
    }

    /// Like [`TestLab::start`], with extra `mariadbd` options for every node.
    pub fn start_with(replicas: usize, extra_server_args: Vec<String>) -> Result<TestLab> {
        Self::start_opts(replicas, extra_server_args, None)
    }

    /// Like [`TestLab::start`], on the port layout of `base_port` (see [`NODE_PORT_OFFSET`])
    /// instead of free ports: each test needs its own base port.
    pub fn start_on(replicas: usize, base_port: u16) -> Result<TestLab> {
        Self::start_opts(replicas, Vec::new(), Some(base_port))
    }

    fn start_opts(
        replicas: usize,
        extra_server_args: Vec<String>,
        base_port: Option<u16>,
    ) -> Result<TestLab> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "holdfast-lab-{}-{}-{:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>()
        ));
        let opts = LabOptions {
            extra_server_args,
            base_port,
            ..LabOptions::new(&dir, replicas)
        };
        match up(&opts) {
            Ok(status) => Ok(TestLab { status }),
            Err(e) => {
                if dir.exists() && std::env::var_os("HOLDFAST_LAB_KEEP").is_none() {
                    let _ = fs::remove_dir_all(&dir);
                }
                Err(e)
            }
        }
    }

    /// The lab directory.
    pub fn dir(&self) -> &Path {
        &self.status.dir
    }

    /// The primary node.
    pub fn primary(&self) -> &NodeStatus {
        // `up` always creates node1 as the primary.
        &self.status.nodes[0]
    }

    /// The replica nodes.
    pub fn replicas(&self) -> &[NodeStatus] {
        &self.status.nodes[1..]
    }

    /// Re-reads the status (after stopping or starting nodes).
    pub fn refresh(&mut self) -> Result<&LabStatus> {
        self.status = status(&self.status.dir)?;
        Ok(&self.status)
    }

    /// [`stop_node`] for this lab, then refresh.
    pub fn stop_node(&mut self, name: &str) -> Result<()> {
        stop_node(&self.status.dir, name)?;
        self.refresh().map(|_| ())
    }

    /// [`kill_node`] for this lab, then refresh.
    pub fn kill_node(&mut self, name: &str) -> Result<()> {
        kill_node(&self.status.dir, name)?;
        self.refresh().map(|_| ())
    }

    /// [`start_node`] for this lab, then refresh.
    pub fn start_node(&mut self, name: &str) -> Result<()> {
        start_node(&self.status.dir, name)?;
        self.refresh().map(|_| ())
    }

    /// [`add_replica`] for this lab, then refresh.
    pub fn add_replica(&mut self, name: Option<&str>) -> Result<NodeStatus> {
        let node = add_replica(&self.status.dir, name)?;
        self.refresh()?;
        Ok(node)
    }

    /// [`remove_node`] for this lab, then refresh.
    pub fn remove_node(&mut self, name: &str) -> Result<NodeStatus> {
        let node = remove_node(&self.status.dir, name)?;
        self.refresh()?;
        Ok(node)
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        let dir = self.status.dir.clone();
        if std::env::var_os("HOLDFAST_LAB_KEEP").is_some() {
            if let Err(e) = down(&dir) {
                eprintln!("holdfast-lab: stopping lab in {}: {e:#}", dir.display());
            }
            eprintln!("holdfast-lab: kept lab directory {}", dir.display());
            return;
        }
        if let Err(e) = stop_all(&dir, true) {
            eprintln!("holdfast-lab: killing lab in {}: {e:#}", dir.display());
        }
        if let Err(e) = remove_dir_retrying(&dir) {
            eprintln!("holdfast-lab: removing {}: {e:#}", dir.display());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers used by the benchmark
// ---------------------------------------------------------------------------------------

/// Records a helper process so that [`down`] stops it too.
pub fn register_aux(dir: &Path, aux: AuxProcess) -> Result<()> {
    let mut list = read_aux(dir);
    list.retain(|a| a.pid != aux.pid);
    list.push(aux);
    write_json(&dir.join(AUX_FILE), &list)
}

/// Forgets a helper process (after it was stopped).
pub fn unregister_aux(dir: &Path, pid: u32) -> Result<()> {
    let mut list = read_aux(dir);
    list.retain(|a| a.pid != pid);
    write_json(&dir.join(AUX_FILE), &list)
}

/// Drops the "(starting)" entries of nodes that lab.json now records.
fn forget_starting(st: &LabStatus, pids: &[u32]) {
    let mut list = read_aux(&st.dir);
    let before = list.len();
    list.retain(|a| !pids.contains(&a.pid));
    if list.len() != before {
        if let Err(e) = write_json(&st.dir.join(AUX_FILE), &list) {
            tracing::warn!("updating {AUX_FILE}: {e:#}");
        }
    }
}

fn read_aux(dir: &Path) -> Vec<AuxProcess> {
    fs::read_to_string(dir.join(AUX_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// The `mariadbd` binary named in the options, or found on PATH.
pub fn resolve_mariadbd(explicit: Option<&Path>) -> Result<PathBuf> {
    match explicit {
        Some(p) if p.is_file() => Ok(p.to_path_buf()),
        Some(p) => bail!("server binary {} does not exist", p.display()),
        None => procs::require_program(&["mariadbd", "mysqld"], "mariadb-server"),
    }
}

/// The `mariadb` command-line client.
pub(crate) fn mariadb_client() -> Result<&'static Path> {
    static CLIENT: OnceLock<Option<PathBuf>> = OnceLock::new();
    CLIENT
        .get_or_init(|| procs::find_program(&["mariadb", "mysql"]))
        .as_deref()
        .context("mariadb (or mysql) client not found on PATH; install mariadb-client")
}

// ---------------------------------------------------------------------------------------
// Internals
// ---------------------------------------------------------------------------------------

fn fresh_lab(dir: &Path, opts: &LabOptions) -> Result<LabStatus> {
    let started = Instant::now();
    let mariadbd = resolve_mariadbd(opts.mariadbd.as_deref())?;
    let n_nodes = opts.replicas + 1;
    if !(1..=MAX_PROXIES).contains(&opts.proxies) {
        bail!("--proxies is 1 or {MAX_PROXIES}");
    }
    if let Some(base) = opts.base_port {
        ports_free(base, n_nodes, opts.proxies)?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let longest_socket = dir.join(format!("node{n_nodes}.sock"));
    if longest_socket.as_os_str().len() > MAX_SOCKET_PATH {
        bail!(
            "socket path {} is longer than {MAX_SOCKET_PATH} bytes (a unix socket limit); \
             choose a shorter lab directory",
            longest_socket.display()
        );
    }
    let template = template::ensure(&mariadbd)?;
    let tls = certs::generate(&dir.join(TLS_DIR))?;

    let launch = LaunchInfo {
        mariadbd,
        extra_server_args: opts.extra_server_args.clone(),
        replicas: opts.replicas,
        node_overrides: BTreeMap::new(),
        tls_dir: Some(dir.join(TLS_DIR)),
        base_port: opts.base_port,
        server_ids: BTreeMap::new(),
    };
    write_json(&dir.join(LAUNCH_FILE), &launch)?;

    let (proxy_port, admin_port, split_port, node_ports) = match opts.base_port {
        Some(base) => {
            let last = u32::from(base) + u32::from(NODE_PORT_OFFSET) + n_nodes as u32 - 1;
            if last > u32::from(u16::MAX) {
                bail!("base port {base} leaves no room for {n_nodes} nodes");
            }
            let nodes = (0..n_nodes)
                .map(|i| base + NODE_PORT_OFFSET + i as u16)
                .collect::<Vec<_>>();
            (
                base + PROXY_PORT_OFFSET,
                base + ADMIN_PORT_OFFSET,
                base + SPLIT_PORT_OFFSET,
                nodes,
            )
        }
        None => {
            let ports = procs::free_ports(n_nodes + 3)?;
            (ports[0], ports[1], ports[2], ports[3..].to_vec())
        }
    };

    let mut nodes: Vec<NodeStatus> = node_ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let name = format!("node{}", i + 1);
            NodeStatus {
                address: format!("127.0.0.1:{port}"),
                port,
                role: if i == 0 { "primary" } else { "replica" }.to_string(),
                live_role: None,
                replicates_from: None,
                pid: None,
                alive: false,
                socket: dir.join(format!("{name}.sock")),
                datadir: dir.join(&name),
                name,
            }
        })
        .collect();
    let datadirs: Vec<&Path> = nodes.iter().map(|n| n.datadir.as_path()).collect();
    template::copy_to(&template, &datadirs)?;

    // Kills whatever we started if anything below fails.
    let mut guard = KillGuard(Vec::new());
    start_nodes(&launch, &mut nodes, opts.base_port.is_none(), &mut guard)?;
    tracing::debug!(elapsed = ?started.elapsed(), "lab nodes ready");

    let ed25519 = configure(&nodes, opts.serverless)?;
    tracing::debug!(elapsed = ?started.elapsed(), "lab configured");

    let admin_token_file = dir.join(ADMIN_TOKEN_FILE);
    let admin_token = holdfast_config::admin::write_new_token_file(&admin_token_file)?;
    let mut st = LabStatus {
        dir: dir.to_path_buf(),
        proxy: format!("127.0.0.1:{proxy_port}"),
        admin: format!("127.0.0.1:{admin_port}"),
        // A serverless instance has no replicas to split reads to.
        split: (!opts.serverless).then(|| format!("127.0.0.1:{split_port}")),
        admin_token_file,
        admin_token: Some(admin_token),
        mariadbd: launch.mariadbd.clone(),
        app_user: APP_USER.into(),
        app_password: APP_PASSWORD.into(),
        database: DATABASE.into(),
        monitor_user: MONITOR_USER.into(),
        monitor_password: MONITOR_PASSWORD.into(),
        ed25519_user: ed25519.then(|| ED25519_USER.into()),
        ed25519_password: ed25519.then(|| ED25519_PASSWORD.into()),
        config: dir.join(CONFIG_FILE),
        nodes,
        serverless: opts.serverless,
        ca: Some(tls.ca),
        proxies: Vec::new(),
        etcd: None,
    };
    let mut etcd_guard = KillGuard(Vec::new());
    if opts.proxies > 1 {
        let ports = match opts.base_port {
            Some(base) => (0..5)
                .map(|i| base + SECOND_PROXY_PORT_OFFSET + i)
                .collect::<Vec<_>>(),
            None => procs::free_ports(5)?,
        };
        st.proxies = vec![
            LabProxy {
                member: "proxy1".into(),
                proxy: st.proxy.clone(),
                admin: st.admin.clone(),
                split: st.split.clone(),
                config: st.config.clone(),
            },
            LabProxy {
                member: "proxy2".into(),
                proxy: format!("127.0.0.1:{}", ports[0]),
                admin: format!("127.0.0.1:{}", ports[1]),
                // (A serverless instance has no replicas to split reads to.)
                split: (!opts.serverless).then(|| format!("127.0.0.1:{}", ports[2])),
                config: dir.join("holdfast-proxy2.toml"),
            },
        ];
        let etcd = LabEtcd {
            endpoint: format!("http://127.0.0.1:{}", ports[3]),
            peer: format!("http://127.0.0.1:{}", ports[4]),
            datadir: dir.join("etcd"),
        };
        // (Its own guard: `forget_starting` is for the nodes' entries only.)
        etcd_guard.0.push(start_etcd(dir, &etcd)?);
        st.etcd = Some(etcd);
    }
    write_config(&st)?;
    write_status(&st)?;
    forget_starting(&st, &guard.0);
    guard.0.clear();
    etcd_guard.0.clear();
    probe_live_roles(&mut st);
    Ok(st)
}

fn restart_existing(dir: &Path, opts: &LabOptions) -> Result<LabStatus> {
    let mut st = load(dir)?;
    if let Some(n) = st.nodes.iter().find(|n| n.alive) {
        bail!(
            "{} already holds a running lab ({} is up, pid {}); use it, or stop it with \
             `holdfast lab down --dir {}`",
            dir.display(),
            n.name,
            n.pid.unwrap_or_default(),
            dir.display()
        );
    }
    let launch = read_launch(dir)?;
    if launch.replicas != opts.replicas {
        bail!(
            "{} holds a stopped lab with {} replica(s), not {}; start it with --replicas {} \
             or delete it with `holdfast lab down --dir {} --purge`",
            dir.display(),
            launch.replicas,
            opts.replicas,
            launch.replicas,
            dir.display()
        );
    }
    if let Some(base) = opts.base_port {
        let layout = layout_base(&st, &launch);
        if layout != Some(base) {
            bail!(
                "{} holds a stopped lab whose ports are {}, not those of base port {base}; \
                 its ports cannot change — delete it with --purge to start over",
                dir.display(),
                match layout {
                    Some(b) => format!("those of base port {b}"),
                    None => "free ports picked at its creation".into(),
                },
            );
        }
    }
    if st.mariadbd.as_os_str().is_empty() {
        st.mariadbd = launch.mariadbd.clone();
    }
    if st.admin_token.is_none() {
        // A lab from before admin tokens (or one whose token file was deleted).
        st.admin_token = Some(holdfast_config::admin::write_new_token_file(
            &st.admin_token_file,
        )?);
    }
    let mut guard = KillGuard(Vec::new());
    start_nodes(&launch, &mut st.nodes, false, &mut guard)?;
    let mut etcd_guard = KillGuard(Vec::new());
    if let Some(etcd) = &st.etcd {
        etcd_guard.0.push(start_etcd(dir, etcd)?);
    }
    wait_replicas_caught_up(&st.nodes)?;
    write_status(&st)?;
    forget_starting(&st, &guard.0);
    guard.0.clear();
    etcd_guard.0.clear();
    probe_live_roles(&mut st);
    Ok(st)
}

/// Kills the recorded pids on drop unless disarmed (cleared).
struct KillGuard(Vec<u32>);

impl Drop for KillGuard {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = procs::kill_now(pid);
        }
    }
}

/// Spawns every node, then waits for each. With `auto_ports`, a node whose port was taken
/// in the meantime is retried on a fresh free port.
fn start_nodes(
    launch: &LaunchInfo,
    nodes: &mut [NodeStatus],
    auto_ports: bool,
    guard: &mut KillGuard,
) -> Result<()> {
    let mut spawned = Vec::with_capacity(nodes.len());
    for node in nodes.iter() {
        let log_len = fs::metadata(node.error_log()).map(|m| m.len()).unwrap_or(0);
        let pid = spawn_node(launch, node)?;
        guard.0.push(pid);
        spawned.push((pid, log_len));
    }
    for (node, (mut pid, mut log_len)) in nodes.iter_mut().zip(spawned) {
        let mut attempt = 1;
        loop {
            match wait_ready(node, pid) {
                Ok(()) => break,
                Err(e) if auto_ports && attempt < 5 && port_conflict(node, log_len) => {
                    attempt += 1;
                    let port = procs::free_ports(1)?[0];
                    tracing::info!(node = %node.name, old = node.port, new = port, "port taken, retrying: {e:#}");
                    node.port = port;
                    node.address = format!("127.0.0.1:{port}");
                    log_len = fs::metadata(node.error_log()).map(|m| m.len()).unwrap_or(0);
                    pid = spawn_node(launch, node)?;
                    guard.0.push(pid);
                }
                Err(e) => return Err(e),
            }
        }
        node.pid = Some(pid);
        node.alive = true;
    }
    Ok(())
}

/// Every port of the layout of `base` is free on 127.0.0.1, or an error that names the
/// port taken and what to do (two labs on the default base port is the usual case).
fn ports_free(base: u16, n_nodes: usize, proxies: usize) -> Result<()> {
    let mut layout = vec![
        (PROXY_PORT_OFFSET, "holdfast's proxy listener".to_string()),
        (ADMIN_PORT_OFFSET, "holdfast's admin listener".to_string()),
        (SPLIT_PORT_OFFSET, "holdfast's split listener".to_string()),
    ];
    if proxies > 1 {
        for (i, what) in [
            "proxy2's proxy listener",
            "proxy2's admin listener",
            "proxy2's split listener",
        ]
        .iter()
        .enumerate()
        {
            layout.push((SECOND_PROXY_PORT_OFFSET + i as u16, what.to_string()));
        }
        layout.push((ETCD_PORT_OFFSET, "etcd's client port".into()));
        layout.push((ETCD_PORT_OFFSET + 1, "etcd's peer port".into()));
    }
    layout.extend((0..n_nodes).map(|i| (NODE_PORT_OFFSET + i as u16, format!("node{}", i + 1))));
    for (offset, what) in layout {
        let Some(port) = base.checked_add(offset) else {
            bail!("base port {base} leaves no room for {n_nodes} nodes");
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            bail!(
                "port {port} ({what} with --base-port {base}) is in use, by another lab \
                 or server; start this lab on other ports with --base-port (e.g. \
                 --base-port {}), or stop what holds it (`holdfast lab down --dir DIR` for a lab)",
                u32::from(base) + 100
            );
        }
    }
    Ok(())
}

fn port_conflict(node: &NodeStatus, log_offset: u64) -> bool {
    let Ok(bytes) = fs::read(node.error_log()) else {
        return false;
    };
    let start = usize::try_from(log_offset).unwrap_or(0).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    text.contains("Address already in use")
        || text.contains("Can't start server: Bind on TCP/IP port")
}

/// The role a node's server starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The role it was created with.
    AsCreated,
    /// A replica, whatever it was created as (another node is the primary now).
    Replica,
}

/// The `mariadbd` command line of a node.
fn node_args(launch: &LaunchInfo, node: &NodeStatus, role: Role) -> Result<Vec<String>> {
    let index = server_id(launch, node)?;
    let tmpdir = node.tmpdir();
    std::fs::create_dir_all(&tmpdir).with_context(|| format!("creating {}", tmpdir.display()))?;
    let mut args = vec![
        "--no-defaults".to_string(),
        format!("--datadir={}", node.datadir.display()),
        format!("--tmpdir={}", tmpdir.display()),
        format!("--port={}", node.port),
        "--bind-address=127.0.0.1".into(),
        format!("--socket={}", node.socket.display()),
        format!("--pid-file={}", node.pid_file().display()),
        format!("--log-error={}", node.error_log().display()),
        format!("--server-id={index}"),
        "--log-bin=mysql-bin".into(),
        "--log-slave-updates".into(),
        "--binlog-format=ROW".into(),
        "--gtid-strict-mode=ON".into(),
        "--user=root".into(),
        "--skip-name-resolve".into(),
        // holdfast sends the PROXY header so the server sees each client's address.
        "--proxy-protocol-networks=127.0.0.1".into(),
        "--innodb-buffer-pool-size=128M".into(),
        format!("--innodb-log-file-size={}", template::INNODB_LOG_FILE_SIZE),
        "--max-connections=2000".into(),
        "--innodb-flush-log-at-trx-commit=2".into(),
        "--sync-binlog=0".into(),
        // With binary logging on, creating a stored function (holdfast's commit marker
        // reader) takes SUPER unless this is set; the monitor has the README's grants,
        // which leave SUPER out (`holdfast check` asks for one or the other).
        "--log-bin-trust-function-creators=1".into(),
    ];
    // The acknowledging side of semi-sync from the start (used when the primary asks
    // for it; holdfast's `durability = "semi-sync"` sets the rest).
    args.push("--rpl-semi-sync-slave-enabled=ON".into());
    if !node.is_primary() || role == Role::Replica {
        args.push("--read-only=ON".into());
    }
    if role == Role::Replica {
        args.push("--init-rpl-role=SLAVE".into());
    }
    if let Some(dir) = &launch.tls_dir {
        args.extend(LabTls::in_dir(dir).server_args());
    }
    args.extend(launch.extra_server_args.iter().cloned());
    if let Some(o) = launch.node_overrides.get(&node.name) {
        args.extend(o.args.iter().map(|(k, v)| format!("--{k}={v}")));
    }
    Ok(args)
}

/// The `--server-id` of a node: recorded for nodes added by [`add_replica`], else its
/// name's number.
fn server_id(launch: &LaunchInfo, node: &NodeStatus) -> Result<u32> {
    match launch.server_ids.get(&node.name) {
        Some(&id) => Ok(id),
        None => u32::try_from(node.index()?)
            .with_context(|| format!("node number of {:?} out of range", node.name)),
    }
}

fn spawn_node(launch: &LaunchInfo, node: &NodeStatus) -> Result<u32> {
    spawn_node_as(launch, node, Role::AsCreated)
}

fn spawn_node_as(launch: &LaunchInfo, node: &NodeStatus, role: Role) -> Result<u32> {
    // A socket left by a killed server would make the readiness probe fail confusingly.
    let _ = fs::remove_file(&node.socket);
    let args = node_args(launch, node, role)?;
    let binary = launch
        .node_overrides
        .get(&node.name)
        .and_then(|o| o.mariadbd.clone())
        .unwrap_or_else(|| launch.mariadbd.clone());
    let mut cmd = Command::new(&binary);
    cmd.args(&args);
    let pid = procs::spawn_detached(&mut cmd, Some(&node.error_log()))
        .with_context(|| format!("starting {} for {}", launch.mariadbd.display(), node.name))?;
    // Until lab.json records it, `down` finds a starting node here (an `up` interrupted
    // by Ctrl-C must not leave servers behind that nothing knows about).
    if let Some(dir) = node.socket.parent() {
        register_aux(
            dir,
            AuxProcess {
                name: format!("{} (starting)", node.name),
                pid,
                start_time: procs::start_time(pid).unwrap_or(0),
            },
        )?;
    }
    Ok(pid)
}

/// Waits until the node's socket serves a MySQL greeting (protocol version 10).
fn wait_ready(node: &NodeStatus, pid: u32) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pause = Duration::from_millis(5);
    loop {
        if greeting_ok(&node.socket) {
            return Ok(());
        }
        if !procs::is_alive(pid) {
            bail!(
                "{} (mariadbd pid {pid}, port {}) exited during startup; last lines of {}:\n{}",
                node.name,
                node.port,
                node.error_log().display(),
                procs::tail_file(&node.error_log(), 15)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} (pid {pid}) did not accept connections on {} within {READY_TIMEOUT:?}; \
                 last lines of {}:\n{}",
                node.name,
                node.socket.display(),
                node.error_log().display(),
                procs::tail_file(&node.error_log(), 15)
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn greeting_ok(socket: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else {
        return false;
    };
    if s.set_read_timeout(Some(Duration::from_secs(2))).is_err() {
        return false;
    }
    let mut head = [0u8; 5];
    // 3-byte length, sequence id, then the protocol version byte (10) of HandshakeV10.
    s.read_exact(&mut head).is_ok() && head[4] == 10
}

/// Accounts and replication. Returns whether the ed25519 account was created.
fn configure(nodes: &[NodeStatus], serverless: bool) -> Result<bool> {
    let primary = &nodes[0];
    // Per node, outside the binlog: the plugin and the replication account (the replicas
    // must be able to connect before anything else happens on the primary).
    let user = quote::plain_string_literal(REPL_USER)?;
    let password = quote::plain_string_literal(REPL_PASSWORD)?;
    let prepared = in_parallel(nodes, |node| {
        let plugin = node_sql(
            node,
            "SET SESSION sql_log_bin=0; INSTALL SONAME 'auth_ed25519'",
        );
        if let Err(e) = &plugin {
            tracing::info!(node = %node.name, "auth_ed25519 not available: {e:#}");
        }
        node_sql(
            node,
            &format!(
                "SET SESSION sql_log_bin=0; \
                 CREATE USER {user}@'%' IDENTIFIED BY {password}; \
                 GRANT REPLICATION SLAVE, REPLICATION SLAVE ADMIN, BINLOG MONITOR ON *.* TO {user}@'%';"
            ),
        )?;
        Ok(plugin.is_ok())
    });
    let mut ed25519 = true;
    for r in prepared {
        ed25519 &= r?;
    }
    // Only now: a replica that connects before the primary has `repl` waits a retry.
    for r in in_parallel(&nodes[1..], |replica| {
        node_sql(
            replica,
            &format!(
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, \
                 MASTER_USER={user}, MASTER_PASSWORD={password}, \
                 MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; START SLAVE;",
                primary.port
            ),
        )
    }) {
        r?;
    }
    // Everything else on the primary, binlogged, so the replicas get it by replication.
    // Application accounts lose READ_ONLY ADMIN (part of ALL in MariaDB 10.11): with it they
    // could write to a node set read-only, which would defeat a switchover's write fence.
    let mut sql = format!("CREATE DATABASE IF NOT EXISTS {DATABASE};");
    for (user, pass, grant_option, app) in [
        (APP_USER, APP_PASSWORD, " WITH GRANT OPTION", true),
        (MONITOR_USER, MONITOR_PASSWORD, "", false),
    ] {
        let (user, pass) = (
            quote::plain_string_literal(user)?,
            quote::plain_string_literal(pass)?,
        );
        for host in ["%", "localhost"] {
            sql.push_str(&format!(
                "CREATE USER {user}@'{host}' IDENTIFIED BY {pass};"
            ));
            if app {
                sql.push_str(&format!(
                    "GRANT ALL PRIVILEGES ON *.* TO {user}@'{host}'{grant_option};"
                ));
            } else {
                // Exactly the README's grants (and `holdfast check`'s list), so that every
                // test runs holdfast with them; SUPER only where the serverless scaler
                // resizes the buffer pool.
                sql.push_str(&format!(
                    "GRANT SELECT ON mysql.* TO {user}@'{host}'; \
                     GRANT {MONITOR_GLOBAL_PRIVILEGES} ON *.* TO {user}@'{host}';"
                ));
                if serverless {
                    sql.push_str(&format!("GRANT SUPER ON *.* TO {user}@'{host}';"));
                }
            }
            if app {
                sql.push_str(&format!(
                    "REVOKE READ_ONLY ADMIN ON *.* FROM {user}@'{host}';"
                ));
            }
            if !app {
                // Commit markers: the monitor lets every account run its marker routines
                // (GRANT EXECUTE ... TO PUBLIC), and nothing more.
                sql.push_str(&format!(
                    "GRANT ALL PRIVILEGES ON holdfast.* TO {user}@'{host}' WITH GRANT OPTION;"
                ));
            }
        }
    }
    node_sql(primary, &sql)?;
    if ed25519 {
        if let Err(e) = node_sql(
            primary,
            &format!(
                "CREATE USER '{ED25519_USER}'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('{ED25519_PASSWORD}'); \
                 GRANT ALL PRIVILEGES ON *.* TO '{ED25519_USER}'@'%'; \
                 REVOKE READ_ONLY ADMIN ON *.* FROM '{ED25519_USER}'@'%';"
            ),
        ) {
            tracing::info!("creating the ed25519 account failed: {e:#}");
            ed25519 = false;
        }
    }
    wait_replicas_caught_up(nodes)?;
    Ok(ed25519)
}

/// Runs `f` for every node on its own thread; results in node order.
fn in_parallel<T: Send>(
    nodes: &[NodeStatus],
    f: impl Fn(&NodeStatus) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = nodes.iter().map(|n| s.spawn(|| f(n))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("setup thread panicked")))
            })
            .collect()
    })
}

/// Waits (server-side, `MASTER_GTID_WAIT`) until every replica has applied the primary's
/// current `gtid_binlog_pos`.
fn wait_replicas_caught_up(nodes: &[NodeStatus]) -> Result<()> {
    let Some(primary) = nodes.iter().find(|n| n.is_primary()) else {
        return Ok(());
    };
    let pos = node_sql_value(primary, "SELECT @@GLOBAL.gtid_binlog_pos")?.unwrap_or_default();
    if pos.is_empty() {
        return Ok(());
    }
    for replica in nodes.iter().filter(|n| !n.is_primary()) {
        let waited = node_sql_value(
            replica,
            &format!("SELECT MASTER_GTID_WAIT('{pos}', {CATCH_UP_TIMEOUT_SECS})"),
        )?;
        if waited.as_deref() != Some("0") {
            let detail = slave_status_detail(replica);
            bail!(
                "{} did not reach the primary's GTID position {pos} within {CATCH_UP_TIMEOUT_SECS} s; \
                 {detail}",
                replica.name
            );
        }
    }
    Ok(())
}

fn refresh_node(node: &mut NodeStatus) {
    let marker = format!("--datadir={}", node.datadir.display());
    if let Some(pid) = node.pid {
        if procs::is_alive_with(pid, &marker) {
            node.alive = true;
            return;
        }
    }
    // Maybe it was (re)started by other means: trust its pid file if the process matches.
    let from_file = fs::read_to_string(node.pid_file())
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .filter(|&pid| procs::is_alive_with(pid, &marker));
    node.pid = from_file;
    node.alive = from_file.is_some();
}

fn stop_all(dir: &Path, hard: bool) -> Result<()> {
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let mut st = match load(&dir) {
        Ok(st) => Some(st),
        Err(e) if !dir.join(LAUNCH_FILE).exists() => return Err(e),
        // A failed or interrupted `up` leaves no lab.json; a failed one killed its
        // nodes, an interrupted one (Ctrl-C) may have left some running.
        Err(_) => {
            kill_orphan_nodes(&dir);
            None
        }
    };
    let mut errors = Vec::new();
    // Helpers first: they hold connections to the nodes.
    for aux in read_aux(&dir) {
        if procs::is_alive_since(aux.pid, aux.start_time) {
            let r = if hard {
                procs::kill_now(aux.pid)
            } else {
                procs::terminate(aux.pid, Duration::from_secs(10))
            };
            if let Err(e) = r {
                errors.push(format!("{} (pid {}): {e:#}", aux.name, aux.pid));
            }
        }
    }
    let _ = fs::remove_file(dir.join(AUX_FILE));
    if let Some(st) = st.as_mut() {
        let live: Vec<(String, u32)> = st
            .nodes
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.pid.map(|p| (n.name.clone(), p)))
            .collect();
        // Signal all, then wait for each: shutdowns run in parallel.
        let sig = if hard { libc::SIGKILL } else { libc::SIGTERM };
        for (name, pid) in &live {
            if let Err(e) = procs::signal(*pid, sig) {
                errors.push(format!("{name} (pid {pid}): {e:#}"));
            }
        }
        let deadline = Instant::now()
            + if hard {
                Duration::from_secs(5)
            } else {
                SHUTDOWN_GRACE
            };
        for (name, pid) in &live {
            let left = deadline.saturating_duration_since(Instant::now());
            if !procs::wait_dead(*pid, left) {
                if let Err(e) = procs::kill_now(*pid) {
                    errors.push(format!("{name} (pid {pid}): {e:#}"));
                }
            }
        }
        for node in &mut st.nodes {
            node.pid = None;
            node.alive = false;
        }
        write_status(st)?;
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("could not stop: {}", errors.join("; "))
    }
}

/// `remove_dir_all`, retried for up to 5 s while the tree is still changing (a `cp` of an
/// interrupted `up` may still be writing into it).
fn remove_dir_retrying(dir: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e).with_context(|| format!("deleting {}", dir.display())),
        }
    }
}

/// SIGKILLs every `mariadbd` found through `DIR/node*.pid` that serves `DIR/node*`.
fn kill_orphan_nodes(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(node) = name.strip_suffix(".pid").filter(|n| n.starts_with("node")) else {
            continue;
        };
        let marker = format!("--datadir={}", dir.join(node).display());
        if let Some(pid) = fs::read_to_string(entry.path())
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|&pid| procs::is_alive_with(pid, &marker))
        {
            tracing::info!(node, pid, "killing a node left by an interrupted `up`");
            let _ = procs::kill_now(pid);
        }
    }
}

fn node_mut<'a>(st: &'a mut LabStatus, name: &str) -> Result<&'a mut NodeStatus> {
    let dir = st.dir.display().to_string();
    st.nodes
        .iter_mut()
        .find(|n| n.name == name)
        .with_context(|| format!("the lab in {dir} has no node {name:?}"))
}

fn read_launch(dir: &Path) -> Result<LaunchInfo> {
    let path = dir.join(LAUNCH_FILE);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes `DIR/lab.json` (without the admin token: that stays in its 0600 file).
fn write_status(st: &LabStatus) -> Result<()> {
    let mut kept = st.clone();
    kept.admin_token = None;
    for n in &mut kept.nodes {
        n.live_role = None;
        n.replicates_from = None;
    }
    write_json(&st.dir.join(STATUS_FILE), &kept)
}

/// Writes JSON through a temp file and a rename, so readers never see half a file.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).context("serialising JSON")?;
    write_atomic(path, &(text + "\n"))
}

/// Writes `path` through a temporary file renamed over it, readable by its owner only: the
/// lab's files name passwords (lab.json holds the lab's account passwords for scripts).
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// The full command line (binary first) that runs `name`, as the lab would start it: what a
/// serverless process driver needs to start the node itself.
pub fn node_command(dir: &Path, name: &str) -> Result<Vec<String>> {
    let st = load(dir)?;
    node_command_for(&read_launch(dir)?, st.node(name)?)
}

fn node_command_for(launch: &LaunchInfo, node: &NodeStatus) -> Result<Vec<String>> {
    let binary = launch
        .node_overrides
        .get(&node.name)
        .and_then(|o| o.mariadbd.clone())
        .unwrap_or_else(|| launch.mariadbd.clone());
    let mut cmd = vec![binary.display().to_string()];
    cmd.extend(node_args(launch, node, Role::AsCreated)?);
    Ok(cmd)
}

/// The `[serverless]` section for a lab's node1: pauses after 60 s idle (freeze, then stop
/// after 5 minutes), small sizes for a laptop, the ledger in the lab directory.
pub fn serverless_section(dir: &Path, node: &NodeStatus) -> Result<ServerlessConfig> {
    let command = node_command_for(&read_launch(dir)?, node)?;
    Ok(serverless_config(dir, node, command))
}

fn serverless_config(dir: &Path, node: &NodeStatus, command: Vec<String>) -> ServerlessConfig {
    let driver = ProcessDriverConfig {
        datadir: Some(node.datadir.clone()),
        log: Some(node.error_log()),
        ..ProcessDriverConfig::new(command, node.pid_file())
    };
    ServerlessConfig {
        instance: "lab".into(),
        idle_pause_secs: 60,
        pause_tier: PauseTier::Freeze,
        stop_after_secs: 300,
        resume_deadline_ms: 10_000,
        buffer_pool_mib_per_ccu: 128,
        max_connections_per_ccu: 200,
        scale: ScalePolicy {
            min_ccu: 0.5,
            max_ccu: 2.0,
            step_ccu: 0.5,
            ..ScalePolicy::default()
        },
        ledger: dir.join("usage.db"),
        period_secs: 3600,
        ..ServerlessConfig::new(InstanceDriverConfig::Process(driver))
    }
}

/// The holdfast configuration for a lab: every node a backend, holdfast managing the lab's
/// replication and restarting its processes; or, with `serverless` (node1's section), one
/// serverless instance without replication to manage.
pub fn holdfast_config(st: &LabStatus, serverless: Option<ServerlessConfig>) -> Result<Config> {
    // Every lab node lists 127.0.0.1 in proxy_protocol_networks (see `node_args`).
    let backend = |n: &NodeStatus| BackendConfig {
        name: n.name.clone(),
        address: n.address.clone(),
        proxy_protocol: true,
    };
    let mut cfg = Config {
        proxy: ProxyConfig {
            listen: st.proxy.clone(),
            // What a careful operator runs: a transaction lost with its primary is replayed.
            transaction_replay: true,
            ..ProxyConfig::default()
        },
        admin: AdminConfig {
            listen: st.admin.clone(),
            token_file: Some(st.admin_token_file.clone()),
            ..AdminConfig::default()
        },
        auth: AuthConfig {
            monitor_user: st.monitor_user.clone(),
            monitor_password: st.monitor_password.as_str().into(),
            monitor_password_file: Some(st.dir.join(MONITOR_PASSWORD_FILE)),
            ..AuthConfig::default()
        },
        ..Config::default()
    };
    (cfg.tls, cfg.backend_tls) = st.tls_sections();
    match serverless {
        Some(section) => {
            cfg.backends = vec![backend(st.primary()?)];
            cfg.serverless = Some(section);
        }
        None => {
            cfg.backends = st.nodes.iter().map(backend).collect();
            // Reads spread over the replicas (the proxy side of `routing = "split"`).
            cfg.listeners = st
                .split
                .iter()
                .map(|listen| ListenerConfig {
                    listen: listen.clone(),
                    mode: ListenerMode::Session,
                    routing: Routing::Split,
                    trusted_proxies: None,
                })
                .collect();
            cfg.ha = HaConfig {
                mode: HaMode::Managed,
                repl_user: REPL_USER.into(),
                repl_password: REPL_PASSWORD.into(),
                repl_password_file: Some(st.dir.join(REPL_PASSWORD_FILE)),
                // What a careful operator runs: no acknowledged write lost in a failover.
                durability: Durability::SemiSync,
                semi_sync_timeout_ms: 2_000,
                // And the outcome of a COMMIT lost in flight is known.
                commit_markers: true,
                ..HaConfig::default()
            };
            cfg.driver = DriverConfig {
                kind: DriverKind::Lab,
                lab_dir: Some(st.dir.clone()),
                // The lab's own server binary for `ctl restart --binary`, and the options
                // `ctl resize` may set (the defaults, written out).
                binaries: Some(&st.mariadbd)
                    .filter(|b| b.is_absolute())
                    .cloned()
                    .into_iter()
                    .collect(),
                ..DriverConfig::default()
            };
        }
    }
    Ok(cfg)
}

/// `cfg` as the text of `DIR/holdfast.toml`: a comment header, then the serialised config.
fn config_text(st: &LabStatus, cfg: &Config) -> Result<String> {
    let (what, command, about) = if cfg.serverless.is_some() {
        (
            "serverless lab",
            "holdfast lab up --serverless",
            "# node1 is a serverless instance: holdfast pauses it when idle (idle sessions stay\n\
             # open), wakes it when a client connects or speaks, scales it and meters it.\n",
        )
    } else {
        (
            "lab",
            "holdfast lab up",
            "# holdfast manages the lab's replication: `holdfast ctl switchover|failover|rejoin`,\n\
             # automatic failover when the primary is lost. The lab's processes ([driver]):\n\
             # `holdfast ctl restart|resize NODE` restarts them.\n",
        )
    };
    let roles: Vec<String> = st
        .nodes
        .iter()
        .filter(|n| cfg.backends.iter().any(|b| b.name == n.name))
        .map(|n| format!("{} ({})", n.name, n.role))
        .collect();
    let body = cfg.to_toml().context("serialising the holdfast config")?;
    Ok(format!(
        "# holdfast configuration for the {what} in {dir}\n\
         # Written by `{command}`; start with: holdfast serve --config {config}\n\
         # Every key is documented in holdfast.example.toml / holdfast.serverless.example.toml.\n\
         {about}\
         # Backends: {roles}\n\n\
         {body}",
        dir = st.dir.display(),
        config = st.config.display(),
        roles = roles.join(", "),
    ))
}

/// Writes `DIR/holdfast.toml` (schema of `holdfast.example.toml`, or of
/// `holdfast.serverless.example.toml` for a serverless lab).
fn write_config(st: &LabStatus) -> Result<()> {
    let serverless = if st.serverless {
        Some(serverless_section(&st.dir, st.primary()?)?)
    } else {
        None
    };
    let cfg = holdfast_config(st, serverless)?;
    // Passwords go in files only holdfast's user can read; the config names them.
    for (file, password) in [
        (&cfg.auth.monitor_password_file, &cfg.auth.monitor_password),
        (&cfg.ha.repl_password_file, &cfg.ha.repl_password),
    ] {
        if let Some(file) = file {
            holdfast_config::secret::write_password_file(file, password.expose())
                .with_context(|| format!("writing {}", file.display()))?;
        }
    }
    let Some(etcd) = &st.etcd else {
        return write_config_file(st, &cfg, &st.config);
    };
    // A fleet: one config per member, each on its own listeners.
    for p in &st.proxies {
        let mut member = cfg.clone();
        member.cluster = Some(holdfast_config::ClusterConfig {
            name: LAB_FLEET.into(),
            etcd: vec![etcd.endpoint.clone()],
            member: Some(p.member.clone()),
            lease_ttl_secs: 3,
        });
        member.proxy.listen = p.proxy.clone();
        member.admin.listen = p.admin.clone();
        if let (Some(sl), true) = (member.serverless.as_mut(), p.config != st.config) {
            // Each member keeps its own copy of the fleet's usage ledger.
            let name = format!("usage-{}.db", p.member);
            sl.ledger = sl.ledger.with_file_name(name);
        }
        if let Some(split) = &p.split {
            for l in member
                .listeners
                .iter_mut()
                .filter(|l| l.routing == holdfast_config::Routing::Split)
            {
                l.listen = split.clone();
            }
        }
        write_config_file(st, &member, &p.config)?;
    }
    Ok(())
}

/// Writes `cfg` to `path`, having checked that it reads back as it is.
fn write_config_file(st: &LabStatus, cfg: &Config, path: &Path) -> Result<()> {
    let out = config_text(st, cfg)?;
    // Fail here, not in holdfast, if we ever write something holdfast would not read back.
    let mut back = Config::parse(&out, "generated holdfast.toml")?;
    back.read_password_files(Some(&st.dir))?;
    if back != *cfg {
        bail!("generated holdfast.toml does not read back to the config it was written from");
    }
    write_atomic(path, &out)
}

/// Starts the lab's etcd (detached, its log in `DIR/etcd.log`), registered as a helper
/// that `down` stops; waits until it answers. Returns its pid.
fn start_etcd(dir: &Path, etcd: &LabEtcd) -> Result<u32> {
    let program = procs::require_program(&["etcd"], "etcd-server")?;
    let mut cmd = Command::new(program);
    cmd.args(["--name", "lab", "--data-dir"])
        .arg(&etcd.datadir)
        .args(["--listen-client-urls", &etcd.endpoint])
        .args(["--advertise-client-urls", &etcd.endpoint])
        .args(["--listen-peer-urls", &etcd.peer])
        .args(["--initial-advertise-peer-urls", &etcd.peer])
        .args(["--initial-cluster", &format!("lab={}", etcd.peer)]);
    let pid = procs::spawn_detached(&mut cmd, Some(&dir.join("etcd.log")))?;
    register_aux(
        dir,
        AuxProcess {
            name: "etcd".into(),
            pid,
            start_time: procs::start_time(pid).unwrap_or(0),
        },
    )?;
    let address: std::net::SocketAddr = etcd
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .with_context(|| format!("etcd endpoint {}", etcd.endpoint))?;
    procs::wait_tcp(&address, Duration::from_secs(30), || procs::is_alive(pid))
        .with_context(|| format!("etcd did not start: see {}", dir.join("etcd.log").display()))?;
    Ok(pid)
}

/// Undoes the escaping of `mariadb --batch` output.
fn unescape_batch(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_string();
    }
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_batch_fields() {
        assert_eq!(unescape_batch(r"a\tb\nc\\d"), "a\tb\nc\\d");
        assert_eq!(unescape_batch("plain"), "plain");
    }

    #[test]
    fn node_args_cover_the_required_options() {
        let launch = LaunchInfo {
            mariadbd: "/usr/sbin/mariadbd".into(),
            extra_server_args: vec!["--general-log=ON".into()],
            replicas: 1,
            node_overrides: BTreeMap::from([(
                "node2".to_string(),
                NodeOverride {
                    mariadbd: None,
                    args: BTreeMap::from([("max-connections".to_string(), "500".to_string())]),
                },
            )]),
            tls_dir: Some("/x/tls".into()),
            base_port: None,
            server_ids: BTreeMap::new(),
        };
        let node = NodeStatus {
            name: "node2".into(),
            address: "127.0.0.1:3321".into(),
            port: 3321,
            role: "replica".into(),
            live_role: None,
            replicates_from: None,
            pid: None,
            alive: false,
            socket: "/x/node2.sock".into(),
            datadir: "/x/node2".into(),
        };
        let args = node_args(&launch, &node, Role::AsCreated).unwrap();
        for want in [
            "--no-defaults",
            "--server-id=2",
            "--port=3321",
            "--read-only=ON",
            "--log-error=/x/node2.err",
            "--pid-file=/x/node2.pid",
            "--general-log=ON",
            "--ssl-ca=/x/tls/ca.pem",
            "--ssl-cert=/x/tls/node.pem",
            "--ssl-key=/x/tls/node-key.pem",
        ] {
            assert!(args.iter().any(|a| a == want), "missing {want} in {args:?}");
        }
        assert_eq!(args[0], "--no-defaults");
        // A resize's option comes last, so it wins over the defaults.
        assert_eq!(
            args.last().map(String::as_str),
            Some("--max-connections=500")
        );
    }

    fn lab_status(nodes: usize, serverless: bool) -> LabStatus {
        LabStatus {
            dir: "/tmp/lab \"x\"".into(),
            proxy: "127.0.0.1:6033".into(),
            admin: "127.0.0.1:6034".into(),
            split: (!serverless).then(|| "127.0.0.1:6035".into()),
            admin_token_file: "/tmp/lab/admin.token".into(),
            admin_token: None,
            mariadbd: "/usr/sbin/mariadbd".into(),
            app_user: APP_USER.into(),
            app_password: APP_PASSWORD.into(),
            database: DATABASE.into(),
            monitor_user: MONITOR_USER.into(),
            monitor_password: "p'w\"d".into(),
            ed25519_user: None,
            ed25519_password: None,
            config: "/tmp/lab/holdfast.toml".into(),
            nodes: (1..=nodes)
                .map(|i| NodeStatus {
                    name: format!("node{i}"),
                    address: format!("127.0.0.1:{}", 3300 + i),
                    port: 3300 + i as u16,
                    role: if i == 1 { "primary" } else { "replica" }.into(),
                    live_role: None,
                    replicates_from: None,
                    pid: None,
                    alive: false,
                    socket: format!("/tmp/lab/node{i}.sock").into(),
                    datadir: format!("/tmp/lab/node{i}").into(),
                })
                .collect(),
            serverless,
            ca: Some("/tmp/lab/tls/ca.pem".into()),
            proxies: Vec::new(),
            etcd: None,
        }
    }

    /// `cfg` as it reads back from its text: passwords are in files, not in the config.
    fn without_secrets(cfg: &Config) -> Config {
        let mut c = cfg.clone();
        c.auth.monitor_password = Default::default();
        c.ha.repl_password = Default::default();
        c
    }

    #[test]
    fn written_config_reads_back_equal() {
        let st = lab_status(3, false);
        let cfg = holdfast_config(&st, None).unwrap();
        let text = config_text(&st, &cfg).unwrap();
        assert_eq!(
            Config::parse(&text, "t").unwrap(),
            without_secrets(&cfg),
            "{text}"
        );
        assert!(!text.contains(&format!("\"{MONITOR_PASSWORD}\"")), "{text}");
        assert!(
            text.starts_with("# holdfast configuration for the lab in"),
            "{text}"
        );
        assert!(text.contains("# Backends: node1 (primary), node2 (replica), node3 (replica)"));
        assert_eq!(cfg.backends.len(), 3);
        assert_eq!(
            cfg.listeners,
            vec![ListenerConfig {
                listen: "127.0.0.1:6035".into(),
                mode: ListenerMode::Session,
                routing: Routing::Split,
                trusted_proxies: None,
            }]
        );
        assert!(text.contains("routing = \"split\""), "{text}");
        assert_eq!(cfg.ha.mode, HaMode::Managed);
        assert_eq!(cfg.driver.kind, DriverKind::Lab);
        assert_eq!(
            cfg.driver.binaries,
            vec![PathBuf::from("/usr/sbin/mariadbd")]
        );
        assert!(cfg.driver.option_allowed("innodb_buffer_pool_size"));
        assert_eq!(
            cfg.admin.token_file,
            Some(PathBuf::from("/tmp/lab/admin.token"))
        );
        assert!(
            text.contains("token_file = \"/tmp/lab/admin.token\""),
            "{text}"
        );
        assert!(
            cfg.serverless.is_none() && !text.contains("[serverless"),
            "{text}"
        );

        let st = lab_status(1, true);
        let command = vec!["/usr/sbin/mariadbd".to_string(), "--port=3301".to_string()];
        let section = serverless_config(&st.dir, st.primary().unwrap(), command);
        let cfg = holdfast_config(&st, Some(section)).unwrap();
        let text = config_text(&st, &cfg).unwrap();
        assert_eq!(
            Config::parse(&text, "t").unwrap(),
            without_secrets(&cfg),
            "{text}"
        );
        assert!(!text.contains(&format!("\"{MONITOR_PASSWORD}\"")), "{text}");
        assert_eq!(cfg.driver.kind, DriverKind::None);
        assert!(cfg.listeners.is_empty(), "no split listener: {text}");
        assert!(!text.contains("lab_dir"), "{text}");
        let sl = cfg.serverless.as_ref().unwrap();
        assert_eq!(sl.ledger, st.dir.join("usage.db"));
        match &sl.driver {
            InstanceDriverConfig::Process(p) => {
                assert_eq!(p.pid_file, PathBuf::from("/tmp/lab/node1.pid"));
                assert_eq!(p.log, Some(PathBuf::from("/tmp/lab/node1.err")));
            }
            other => panic!("{other:?}"),
        }
        // `holdfast drill` edits these two lines of the serverless lab's config.
        for line in ["\nidle_pause_secs = 60\n", "\nstop_after_secs = 300\n"] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }

    #[test]
    fn refuses_a_non_empty_foreign_directory() {
        let dir = std::env::temp_dir().join(format!("holdfast-lab-foreign-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("something"), "x").unwrap();
        let err = up(&LabOptions::new(&dir, 0)).unwrap_err();
        assert!(format!("{err:#}").contains("not empty"), "{err:#}");
        assert!(purge(&dir).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
