//! The TOML configuration (see `holdfast.example.toml` for every key with comments).

use crate::ha::{HaConfig, HaError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// The backend is a serverless instance (`[serverless]`): paused when idle, woken on
    /// connect, scaled in place, metered.
    #[serde(default)]
    pub serverless: Option<crate::serverless::ServerlessConfig>,
}

/// An extra client listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub listen: String,
    #[serde(default)]
    pub mode: ListenerMode,
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

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Runtime worker threads; 0 means half the CPU cores, at least one (see
    /// [`ProxyConfig::effective_worker_threads`]).
    pub worker_threads: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:6033".into(),
            max_connections: 10_000,
            max_packet_size: 64 << 20,
            handshake_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            server_version: String::new(),
            worker_threads: 0,
            hold_window_ms: 60_000,
            cooldown_ms: 60_000,
            switchover_drain_ms: 5_000,
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub listen: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: "127.0.0.1:6034".into(),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub monitor_user: String,
    pub monitor_password: String,
    pub verifier_refresh_secs: u64,
    pub verifier_miss_refresh_ms: u64,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("monitor_user", &self.monitor_user)
            .field("monitor_password", &"<redacted>")
            .field("verifier_refresh_secs", &self.verifier_refresh_secs)
            .field("verifier_miss_refresh_ms", &self.verifier_miss_refresh_ms)
            .finish()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            monitor_user: "holdfast_monitor".into(),
            monitor_password: String::new(),
            verifier_refresh_secs: 60,
            verifier_miss_refresh_ms: 1_000,
        }
    }
}

/// How holdfast restarts nodes for `ctl restart` / `ctl resize`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriverConfig {
    /// `"none"` (or empty): restart and resize are refused. `"lab"`: the nodes are processes
    /// of a `holdfast lab` in `lab_dir`.
    pub kind: String,
    pub lab_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub name: String,
    pub address: String,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: origin.to_string(),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.backends.is_empty() {
            return Err(ConfigError::Invalid(
                "no [[backend]] configured: holdfast needs at least one database node".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for b in &self.backends {
            if !names.insert(&b.name) {
                return Err(ConfigError::Invalid(format!(
                    "backend name {:?} used twice",
                    b.name
                )));
            }
        }
        if self.proxy.max_packet_size < 1024 {
            return Err(ConfigError::Invalid(
                "proxy.max_packet_size must be at least 1024".into(),
            ));
        }
        if self.proxy.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "proxy.max_connections must be at least 1".into(),
            ));
        }
        if let Some(sl) = &self.serverless {
            if self.backends.len() != 1 {
                return Err(ConfigError::Invalid(format!(
                    "[serverless] needs exactly one [[backend]] (the instance), found {}",
                    self.backends.len()
                )));
            }
            if self.ha.mode != crate::ha::HaMode::External {
                return Err(ConfigError::Invalid(
                    "[serverless] cannot be combined with [ha] mode = \"managed\": a paused instance would look failed".into(),
                ));
            }
            sl.validate().map_err(ConfigError::Invalid)?;
        }
        self.ha.validate().map_err(|e| match e {
            HaError::InvalidConfig(msg) => ConfigError::Invalid(msg),
            e => ConfigError::Invalid(e.to_string()),
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let text = include_str!("../../../holdfast.example.toml");
        let cfg = Config::parse(text, "example").unwrap();
        assert_eq!(cfg.backends.len(), 1);
        assert_eq!(cfg.proxy.max_packet_size, 64 << 20);
        // The example documents every [ha] key with its default value.
        let defaults = HaConfig::default();
        assert_eq!(cfg.ha.mode, crate::ha::HaMode::External);
        assert_eq!(format!("{:?}", cfg.ha), format!("{defaults:?}"));
        assert_eq!(cfg.ha.repl_password, defaults.repl_password);
    }

    #[test]
    fn serverless_example_config_parses() {
        let text = include_str!("../../../holdfast.serverless.example.toml");
        let cfg = Config::parse(text, "serverless example").unwrap();
        let sl = cfg.serverless.expect("[serverless]");
        assert_eq!(sl.idle_pause_secs, 300);
        assert_eq!(sl.pause_tier, crate::serverless::PauseTier::Freeze);
        assert_eq!(
            sl.scale,
            holdfast_serverless::autoscale::ScalePolicy::default()
        );
        assert_eq!(cfg.listeners.len(), 1);
        assert_eq!(cfg.listeners[0].mode, ListenerMode::Passthrough);
    }

    #[test]
    fn serverless_needs_one_backend_and_external_ha() {
        let text = include_str!("../../../holdfast.serverless.example.toml");
        let two = text.replace(
            "[serverless]\n",
            "[[backend]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\n\n[serverless]\n",
        );
        let err = Config::parse(&two, "t").unwrap_err().to_string();
        assert!(err.contains("exactly one [[backend]]"), "{err}");
        let managed = format!("{text}\n[ha]\nmode = \"managed\"\nrepl_user = \"r\"\n");
        let err = Config::parse(&managed, "t").unwrap_err().to_string();
        assert!(err.contains("managed"), "{err}");
        let bad = text.replace("min_ccu = 0.5", "min_ccu = 8.0");
        assert!(Config::parse(&bad, "t").is_err());
    }

    #[test]
    fn ha_section_is_validated() {
        let base = "[[backend]]\nname=\"a\"\naddress=\"127.0.0.1:1\"\n";
        let cfg = Config::parse(&format!("{base}[ha]\nmode = \"managed\"\n"), "t").unwrap();
        assert_eq!(cfg.ha.mode, crate::ha::HaMode::Managed);
        let err = Config::parse(&format!("{base}[ha]\nfailure_threshold = 0\n"), "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("failure_threshold"), "{err}");
        assert!(Config::parse(&format!("{base}[ha]\nmode = \"auto\"\n"), "t").is_err());
        assert!(Config::parse(&format!("{base}[ha]\nbogus = 1\n"), "t").is_err());
    }

    #[test]
    fn unknown_keys_and_missing_backends_are_refused() {
        assert!(Config::parse(
            "[proxy]\nlisen = \"x\"\n[[backend]]\nname=\"a\"\naddress=\"b\"",
            "t"
        )
        .is_err());
        assert!(Config::parse("", "t").is_err());
    }

    #[test]
    fn debug_redacts_monitor_password() {
        let a = AuthConfig {
            monitor_password: "hunter2".into(),
            ..Default::default()
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }
}
