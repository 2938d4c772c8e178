//! holdfast's TOML configuration (see `holdfast.example.toml` for every key with comments):
//! the serde types, their defaults and their validation, and nothing else. A leaf crate, so
//! that everything writing or reading a holdfast config (the proxy, the lab, the tests) names
//! the same types: a renamed key does not compile instead of being written wrong.
//!
//! * [`Config`]: the whole file, with [`Config::load`], [`Config::parse`],
//!   [`Config::validate`] and [`Config::to_toml`].
//! * [`admin`]: the `[admin]` section and the admin API's token ([`AdminToken`], its file).
//! * [`ha`]: the `[ha]` section.
//! * [`serverless`]: the `[serverless]` section, its scaling policy and instance drivers.
//! * [`tls`]: `[tls]` (to clients) and `[backend_tls]` (to the nodes).
//! * [`log`]: `[log]` (the log level).
//! * [`locate`]: the line and key of an error in the file.
//! * [`reload`]: what a reload changes, applies now or leaves for a restart.

pub mod admin;
pub mod cluster;
pub mod ha;
pub mod locate;
pub mod log;
pub mod net;
pub mod reload;
pub mod secret;
pub mod serverless;
pub mod split;
pub mod tls;

pub use admin::{AdminConfig, AdminToken, TokenSource};
pub use cluster::ClusterConfig;
pub use ha::{Durability, HaConfig, HaMode};
pub use locate::Location;
pub use log::LogConfig;
pub use secret::Secret;
pub use serverless::{PauseTier, ServerlessConfig};
pub use split::{Consistency, Routing, SplitConfig};
pub use tls::{BackendTlsConfig, BackendTlsMode, TlsConfig, TlsVersion};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The causes are in the messages and not chained as `source`s: anyhow would print
    // them a second time ("Caused by:").
    #[error("cannot read config {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// The file is refused: it is not TOML, a key is unknown or of the wrong type, or a
    /// value is one validation refuses; `at` says where (line, column, key) as far as known.
    #[error("invalid config {path}{at}: {message}")]
    Parse {
        path: String,
        at: Location,
        message: String,
    },
    #[error("cannot write the config as TOML: {0}")]
    Serialize(#[from] toml::ser::Error),
    #[error("invalid config: {0}")]
    Invalid(String),
    /// A value validation refuses, with its key (`proxy.max_connections`,
    /// `backend[1].name`); [`Config::parse`] and [`Config::load`] add its line.
    #[error("invalid config: {key}: {message}")]
    InvalidKey { key: String, message: String },
    #[error("admin token file {}: {message}{}", path.display(), cause.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    TokenFile {
        path: PathBuf,
        message: String,
        cause: Option<std::io::Error>,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub proxy: ProxyConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default, rename = "backend")]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub driver: DriverConfig,
    /// Switchover, failover and rejoin (`[ha]`); external mode by default.
    #[serde(default)]
    pub ha: HaConfig,
    /// More client listeners (`[[listener]]`), each with its own mode.
    #[serde(default, rename = "listener", skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerConfig>,
    /// The backend is a serverless instance (`[serverless]`): paused when idle, woken on
    /// connect, scaled in place, metered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serverless: Option<ServerlessConfig>,
    /// This process is one member of a fleet of holdfast processes (`[cluster]`),
    /// coordinated through etcd: one of them, the leader, runs HA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
    /// TLS offered to clients (`[tls]`). Written out only when set, so that a config
    /// without TLS reads in builds from before it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub tls: TlsConfig,
    /// TLS to the nodes (`[backend_tls]`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub backend_tls: BackendTlsConfig,
    /// How split listeners (`routing = "split"`) choose nodes for reads (`[split]`).
    #[serde(default)]
    pub split: SplitConfig,
    /// What holdfast logs (`[log]`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub log: LogConfig,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// A value validation refuses, by its key.
pub(crate) fn invalid_key(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::InvalidKey {
        key: key.into(),
        message: message.into(),
    }
}

/// A validation error of the file `origin` (whose text is `text`) as a located
/// [`ConfigError::Parse`]; other errors (a password file that cannot be read) as they are.
fn locate(e: ConfigError, text: &str, origin: &str) -> ConfigError {
    let (at, message) = match e {
        ConfigError::InvalidKey { key, message } => (locate::of_key(text, &key), message),
        ConfigError::Invalid(message) => (Location::default(), message),
        other => return other,
    };
    ConfigError::Parse {
        path: origin.to_string(),
        at,
        message,
    }
}

/// An extra client listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub listen: String,
    #[serde(default)]
    pub mode: ListenerMode,
    /// `primary` (the default) or `split` (reads to the replicas, see `[split]`).
    #[serde(default, skip_serializing_if = "Routing::is_primary")]
    pub routing: Routing,
    /// Load balancers this listener takes PROXY protocol headers from (`None`: those of
    /// `[proxy] trusted_proxies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_proxies: Option<Vec<net::IpNet>>,
}

/// What holdfast does with a client's connection after login.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListenerMode {
    /// Every packet is parsed: sessions survive switchovers, restarts and pauses.
    #[default]
    Session,
    /// After login, bytes are relayed unparsed (the cheapest path). Such connections do
    /// not survive a backend change, and they keep a serverless instance from pausing.
    Passthrough,
}

/// Whether pass-through connections are relayed in the kernel (`[proxy] kernel_relay`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KernelRelayMode {
    /// In a BPF sockmap when the kernel lets holdfast load one (root), with plain TCP on
    /// both sides; else in user space, the reason logged at start.
    #[default]
    Auto,
    /// Always in user space.
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    pub listen: String,
    pub max_connections: usize,
    pub max_packet_size: usize,
    pub handshake_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub server_version: String,
    /// How long a request waits for a writable primary while the backend is switching.
    pub hold_window_ms: u64,
    /// How long a session that must move gets to reach a safe point (end its transaction,
    /// drop its temporary tables, release its locks) before it is closed.
    pub cooldown_ms: u64,
    /// Before a planned switchover, sessions finish what they are doing (their transaction,
    /// their statement) and hold their next request; the switchover waits this long for all
    /// of them, then goes ahead anyway.
    pub switchover_drain_ms: u64,
    /// Threads that run client sessions, each a current-thread runtime with its sessions'
    /// sockets; 0 means half the CPU cores, at least one (see
    /// [`ProxyConfig::effective_worker_threads`]). With one, sessions run on the main
    /// thread beside the control tasks.
    pub worker_threads: usize,
    /// Connections open at once from one client address; 0: no limit but `max_connections`.
    pub max_connections_per_ip: usize,
    /// Connections from one client address that have not logged in yet (silent or slow
    /// sockets); over it, new ones are refused. 0: no limit.
    pub max_pending_logins_per_ip: usize,
    /// After three wrong passwords from an address or for an account, each refusal waits
    /// this long, doubling per further failure up to `max_login_failure_delay_ms` (keep it
    /// under `handshake_timeout_ms`); a success or ten quiet minutes reset it.
    pub login_failure_delay_ms: u64,
    pub max_login_failure_delay_ms: u64,
    /// TCP keepalive on client connections (idle seconds before the first probe): a client
    /// that vanished without closing is noticed. 0 turns it off.
    pub client_keepalive_secs: u64,
    /// Close a logged-in client connection that has sent nothing for this long, as the
    /// server's `wait_timeout` would (its session state goes with it). 0: never.
    pub client_idle_timeout_secs: u64,
    /// Keep the statements of each open transaction, with a checksum of every answer the
    /// client got, and run them again on the new primary when the backend is lost
    /// mid-transaction: the client carries on when every answer compares equal.
    pub transaction_replay: bool,
    /// A transaction whose replay log holds more than this many bytes of memory is not kept
    /// for a replay (a loss then rolls it back with ERR 1213, as without replay). Counted as
    /// the heap holds it: the statements, 16 bytes per statement, the log's own blocks and
    /// their spare capacity, with the allocator's overhead.
    pub replay_max_bytes: usize,
    /// The main listener's routing: `primary` or `split` (see `[split]`).
    pub routing: Routing,
    /// Load balancers in front of holdfast (networks): a connection from one of them must
    /// start with a PROXY protocol header (v1 or v2), whose client address then counts as
    /// the client's for everything. A header from any other address is refused.
    pub trusted_proxies: Vec<net::IpNet>,
    /// The local address holdfast's connections to the nodes leave from (sessions,
    /// monitor, HA), e.g. `127.0.0.9` or a dedicated interface's address; the system
    /// chooses when unset. Nodes that take the PROXY header must list it in
    /// `proxy_protocol_networks`. Read at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_source_address: Option<std::net::IpAddr>,
    /// Pass-through listeners: relay a connection's bytes in the kernel (see
    /// [`KernelRelayMode`]). Read at start.
    pub kernel_relay: KernelRelayMode,
    /// A connection to a node whose sent bytes stay unacknowledged this long is given up
    /// (`TCP_USER_TIMEOUT`) and its session recovers on a new one: after a network cut that
    /// healed, TCP alone may wait a minute and more for its next retransmission. A
    /// statement that runs long is not affected. 0: the system's behaviour.
    pub backend_tcp_user_timeout_ms: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:6033".into(),
            max_connections: 10_000,
            max_packet_size: 64 << 20,
            handshake_timeout_ms: 5_000,
            connect_timeout_ms: 5_000,
            server_version: String::new(),
            worker_threads: 0,
            hold_window_ms: 60_000,
            cooldown_ms: 60_000,
            switchover_drain_ms: 5_000,
            max_connections_per_ip: 0,
            max_pending_logins_per_ip: 256,
            login_failure_delay_ms: 250,
            max_login_failure_delay_ms: 4_000,
            client_keepalive_secs: 60,
            client_idle_timeout_secs: 0,
            transaction_replay: false,
            replay_max_bytes: 1 << 20,
            routing: Routing::Primary,
            trusted_proxies: Vec::new(),
            backend_source_address: None,
            kernel_relay: KernelRelayMode::Auto,
            backend_tcp_user_timeout_ms: 10_000,
        }
    }
}

impl ProxyConfig {
    /// The worker threads to run. By default half the cores: holdfast usually shares its
    /// host with the database or the application, and on the 2-core lab machine one worker
    /// measured 0.99-1.02x HAProxy against 0.85-0.88x with two (docs/benchmarks.md).
    pub fn effective_worker_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).max(1)
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn hold_window(&self) -> Duration {
        Duration::from_millis(self.hold_window_ms)
    }
    pub fn cooldown(&self) -> Duration {
        Duration::from_millis(self.cooldown_ms)
    }
    /// `TCP_USER_TIMEOUT` for connections to the nodes; `None` when off.
    pub fn backend_tcp_user_timeout(&self) -> Option<Duration> {
        (self.backend_tcp_user_timeout_ms > 0)
            .then(|| Duration::from_millis(self.backend_tcp_user_timeout_ms))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub monitor_user: String,
    /// Never written back by `Config::to_toml`: prefer `monitor_password_file`.
    #[serde(skip_serializing)]
    pub monitor_password: Secret,
    /// A file whose first line is the monitor account's password (read when the config is
    /// loaded; relative to the config's directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_password_file: Option<PathBuf>,
    /// Refuse to start when a file holding secrets (the config with inline passwords, a
    /// password file) can be read by other users, instead of warning.
    pub strict_permissions: bool,
    pub verifier_refresh_secs: u64,
    pub verifier_miss_refresh_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            monitor_user: "holdfast_monitor".into(),
            monitor_password: Secret::default(),
            monitor_password_file: None,
            strict_permissions: false,
            verifier_refresh_secs: 60,
            verifier_miss_refresh_ms: 1_000,
        }
    }
}

/// How holdfast restarts nodes for `ctl restart` / `ctl resize` (`[driver]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriverConfig {
    pub kind: DriverKind,
    /// With `kind = "lab"`: the lab's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lab_dir: Option<PathBuf>,
    /// The server binaries `restart --binary PATH` may run (absolute paths; none by default).
    pub binaries: Vec<PathBuf>,
    /// The server options `resize --set NAME=VALUE` may set (`-` and `_` alike).
    pub allowed_options: Vec<String>,
}

/// The server options a resize may set unless `[driver] allowed_options` says otherwise.
pub const DEFAULT_ALLOWED_OPTIONS: &[&str] = &["innodb_buffer_pool_size", "max_connections"];

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            kind: DriverKind::None,
            lab_dir: None,
            binaries: Vec::new(),
            allowed_options: DEFAULT_ALLOWED_OPTIONS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

impl DriverConfig {
    /// Whether `name` (`innodb-buffer-pool-size`, `--max_connections`) is one of
    /// `allowed_options`.
    pub fn option_allowed(&self, name: &str) -> bool {
        let name = option_name(name);
        !name.is_empty() && self.allowed_options.iter().any(|o| option_name(o) == name)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        for b in &self.binaries {
            if !b.is_absolute() {
                return Err(invalid_key(
                    "driver.binaries",
                    format!("{} is not an absolute path", b.display()),
                ));
            }
        }
        for o in &self.allowed_options {
            let n = option_name(o);
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid_key(
                    "driver.allowed_options",
                    format!("{o:?} is not a server option name"),
                ));
            }
        }
        Ok(())
    }
}

/// A server option's name as the server reads it: without leading dashes, `-` as `_`,
/// lower case.
pub fn option_name(name: &str) -> String {
    name.trim()
        .trim_start_matches('-')
        .replace('-', "_")
        .to_ascii_lowercase()
}

/// The node control driver of `[driver]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    /// Restart and resize are refused. An empty `kind` (what older configs wrote) means
    /// the same.
    #[default]
    #[serde(alias = "")]
    None,
    /// The nodes are processes of a `holdfast lab` in `lab_dir`.
    Lab,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub name: String,
    pub address: String,
    /// Send the PROXY protocol v2 header on client sessions' connections to this node, so
    /// that the server sees each client's own address: host-based accounts, grants,
    /// `max_connect_errors` and the audit log then apply to the client, not to holdfast.
    /// The server must list holdfast's address in `proxy_protocol_networks`. holdfast's
    /// own control connections (monitor, HA) go without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub proxy_protocol: bool,
}

impl Config {
    /// Whether a `[[listener]]` relays connections unparsed after login.
    pub fn has_passthrough_listener(&self) -> bool {
        self.listeners
            .iter()
            .any(|l| l.mode == ListenerMode::Passthrough)
    }
    /// Reads, parses and validates the file at `path`, with the passwords its
    /// `*_password_file` keys name.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Ok(Self::load_text(path)?.0)
    }

    /// [`Config::load`], and the file's text as it was read (what a reload compares and
    /// `/status` hashes).
    pub fn load_text(path: &Path) -> Result<(Config, String), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.display().to_string(),
            cause,
        })?;
        let origin = path.display().to_string();
        let mut cfg = Self::deserialize(&text, &origin)?;
        cfg.read_password_files(path.parent())
            .map_err(|e| locate(e, &text, &origin))?;
        Ok((cfg, text))
    }

    /// Fills the passwords named by `*_password_file` (relative to `base`, the config's
    /// directory).
    pub fn read_password_files(&mut self, base: Option<&Path>) -> Result<(), ConfigError> {
        if let Some(f) = &self.auth.monitor_password_file {
            self.auth.monitor_password = secret::read_password_file(&secret::relative_to(base, f))?;
        }
        if let Some(f) = &self.ha.repl_password_file {
            self.ha.repl_password = secret::read_password_file(&secret::relative_to(base, f))?;
        }
        self.validate()
    }

    /// Parses and validates `text`; `origin` names it in errors, which say where in it
    /// (line, column, key) the problem is.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg = Self::deserialize(text, origin)?;
        cfg.validate().map_err(|e| locate(e, text, origin))?;
        Ok(cfg)
    }

    /// The TOML of `text` as a config, not validated yet.
    fn deserialize(text: &str, origin: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|cause| {
            let message = cause.message().trim().replace('\n', "; ");
            ConfigError::Parse {
                path: origin.to_string(),
                at: cause
                    .span()
                    .map(|span| locate::of_span(text, span, &message))
                    .unwrap_or_default(),
                message,
            }
        })
    }

    /// The config as TOML that [`Config::parse`] reads back to an equal value.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        Ok(toml::to_string(self)?)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.backends.is_empty() {
            return Err(ConfigError::Invalid(
                "no [[backend]] configured: holdfast needs at least one database node".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, b) in self.backends.iter().enumerate() {
            if !names.insert(&b.name) {
                return Err(invalid_key(
                    format!("backend[{i}].name"),
                    format!("backend name {:?} used twice", b.name),
                ));
            }
        }
        if self.proxy.max_packet_size < 1024 {
            return Err(invalid_key(
                "proxy.max_packet_size",
                "must be at least 1024",
            ));
        }
        if self.proxy.max_connections == 0 {
            return Err(invalid_key("proxy.max_connections", "must be at least 1"));
        }
        self.admin.validate()?;
        self.driver.validate()?;
        self.tls.validate()?;
        self.backend_tls.validate()?;
        self.split.validate()?;
        self.log.validate()?;
        let split = self.proxy.routing == Routing::Split
            || self.listeners.iter().any(|l| l.routing == Routing::Split);
        if split && self.serverless.is_some() {
            return Err(ConfigError::Invalid(
                "routing = \"split\" needs replicas; a [serverless] instance has none".into(),
            ));
        }
        if let Some(i) = self
            .listeners
            .iter()
            .position(|l| l.routing == Routing::Split && l.mode == ListenerMode::Passthrough)
        {
            return Err(invalid_key(
                format!("listener[{i}].routing"),
                "a pass-through listener cannot split reads: it does not parse statements",
            ));
        }
        if self.driver.kind == DriverKind::Lab && self.driver.lab_dir.is_none() {
            return Err(invalid_key(
                "driver.kind",
                "[driver] kind = \"lab\" needs lab_dir",
            ));
        }
        if let Some(sl) = &self.serverless {
            if self.backends.len() != 1 {
                return Err(ConfigError::Invalid(format!(
                    "[serverless] needs exactly one [[backend]] (the instance), found {}",
                    self.backends.len()
                )));
            }
            if self.ha.mode != HaMode::External {
                return Err(invalid_key(
                    "ha.mode",
                    "[serverless] cannot be combined with [ha] mode = \"managed\": a paused instance would look failed",
                ));
            }
            sl.validate()?;
        }
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        self.ha.validate()
    }
}

#[cfg(test)]
mod tests;
