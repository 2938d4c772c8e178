//! Reloading the configuration file (`POST /reload`, `holdfast ctl reload`, SIGHUP): one
//! path for all three, [`Shared::reload`].
//!
//! 1. The file is read, parsed and validated whole, as `holdfast serve` does at start (its
//!    password files read, `[auth] strict_permissions` checked). Anything wrong refuses the
//!    reload with the error (file, line, key) and nothing changes.
//! 2. [`holdfast_config::reload::plan`] makes the configuration to run: the file's, with
//!    each setting only a restart can change kept as it runs (they are listed as
//!    `needs_restart`); it is validated again, and what it needs loaded (a new client
//!    certificate, the `[backend_tls]` files, the log filter) is loaded. A failure still
//!    changes nothing.
//! 3. It is put in force at once: stored in [`Shared`]'s live configuration, which every
//!    session and task reads where it uses a setting (the next request, login, connection,
//!    probe or scaling step sees it, without a lock); the parts held elsewhere (the
//!    admission limits, the client certificate, the serverless knobs, the log filter) are
//!    handed over. Then the `[[backend]]` list goes through the membership's checks (nodes
//!    added, removed, or refused, each reported).
//!
//! `/status` shows the file in force: its path, SHA-256 and when it was loaded.

use crate::config::reload::{plan, Change, RESTART_NOTE};
use crate::config::{Config, ConfigError};
use crate::Shared;
use holdfast_client::tls::TlsSetupError;
use holdfast_cluster::membership::Reloaded;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the configuration in force came from, and one reload at a time.
#[derive(Default)]
pub struct Reloader {
    source: arc_swap::ArcSwapOption<ConfigSource>,
    running: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// The file in force, once one is known.
    pub fn source(&self) -> Option<Arc<ConfigSource>> {
        self.source.load_full()
    }
}

/// The configuration file in force, as `/status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSource {
    pub path: PathBuf,
    /// SHA-256 of the file's bytes, hex (what `sha256sum` prints for it).
    pub hash: String,
    /// When it was loaded (RFC 3339, UTC).
    pub loaded_at: String,
    pub loaded_unix_ms: u64,
    /// Keys of the file whose values wait for a restart (the running ones are in force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs_restart: Vec<Change>,
}

impl ConfigSource {
    fn new(path: &Path, text: &str, needs_restart: Vec<Change>) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        ConfigSource {
            path: path.to_path_buf(),
            hash: sha256_hex(text.as_bytes()),
            loaded_at: rfc3339(now),
            loaded_unix_ms: now,
            needs_restart,
        }
    }
}

/// What a reload did (the answer of `POST /reload`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReloadReport {
    /// The file now in force.
    pub config: ConfigSource,
    /// Its bytes differ from those loaded before.
    pub file_changed: bool,
    /// Keys whose new values are in force now.
    pub applied: Vec<Change>,
    /// Keys whose new values wait for a restart of holdfast (see `restart_note`).
    pub needs_restart: Vec<Change>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_note: Option<String>,
    /// Files holding secrets that other users can read (the reload went ahead: `[auth]
    /// strict_permissions` is off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The `[[backend]]` list: nodes added, being removed, refused.
    #[serde(flatten)]
    pub backends: Reloaded,
}

/// Why a reload was refused. In every case nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("holdfast was not started from a configuration file: nothing to reload")]
    NoConfigFile,
    #[error("{0}; nothing changed")]
    Config(#[from] ConfigError),
    #[error("[auth] strict_permissions: {0}; nothing changed")]
    Permissions(String),
    #[error("invalid config {path}: together with the settings that need a restart (kept as they run: {kept}), {error}; nothing changed")]
    WithKept {
        path: String,
        kept: String,
        error: ConfigError,
    },
    #[error("invalid config {path}, key {key}: {error}; nothing changed")]
    Tls {
        path: String,
        key: &'static str,
        error: TlsSetupError,
    },
    #[error("invalid config {path}, key log.level: {error}; nothing changed")]
    LogLevel {
        path: String,
        error: crate::logging::LogError,
    },
}

impl Shared {
    /// Records the file the configuration in force was read from (`holdfast serve` does
    /// at start, with the text it parsed): what `/status` shows and a reload reads again.
    pub fn set_config_file(&self, path: &Path, text: &str) {
        let source = ConfigSource::new(path, text, Vec::new());
        self.reloader.source.store(Some(Arc::new(source)));
    }

    /// Reads the configuration file again and puts it in force (see the module
    /// documentation). Refused, with the error, when anything in it is wrong.
    pub async fn reload(self: &Arc<Self>) -> Result<ReloadReport, ReloadError> {
        let _one_at_a_time = self.reloader.running.lock().await;
        let before = self.reloader.source().ok_or(ReloadError::NoConfigFile)?;
        let path = before.path.clone();
        let origin = path.display().to_string();

        // Everything is read and checked before anything changes.
        let (file, text) = Config::load_text(&path)?;
        let warnings = holdfast_config::secret::permission_warnings(&path, &file);
        if file.auth.strict_permissions && !warnings.is_empty() {
            return Err(ReloadError::Permissions(warnings.join("; ")));
        }
        let running = self.config_snapshot();
        let plan = plan(&running, &file);
        plan.effective
            .validate()
            .map_err(|error| ReloadError::WithKept {
                path: origin.clone(),
                kept: keys(&plan.needs_restart),
                error,
            })?;
        let effective = Arc::new(plan.effective);
        let tls_error = |key, error| ReloadError::Tls {
            path: origin.clone(),
            key,
            error,
        };
        let client_tls = match &self.client_tls {
            Some(t) => Some(t.prepare(&effective.tls).map_err(|e| tls_error("tls", e))?),
            None => None,
        };
        let backend_tls = holdfast_cluster::control::load_backend_tls(&effective.backend_tls)
            .map_err(|e| tls_error("backend_tls", e))?;
        let level_changed = running.log.level != effective.log.level;
        if level_changed {
            crate::logging::LogLevel::check(&effective.log.level).map_err(|error| {
                ReloadError::LogLevel {
                    path: origin.clone(),
                    error,
                }
            })?;
        }

        // In force from here on.
        self.live.store(effective.clone());
        self.admission.apply(&effective.proxy);
        if let (Some(t), Some(prepared)) = (&self.client_tls, client_tls) {
            t.apply(prepared);
        }
        holdfast_cluster::control::install_backend_tls(&effective.backend_tls, backend_tls);
        if let (Some(lc), Some(sl)) = (&self.serverless, &effective.serverless) {
            lc.set_config(sl.clone());
        }
        if level_changed {
            if let Some(log) = self.log_level.get() {
                if let Err(e) = log.set(&effective.log.level) {
                    tracing::warn!(error = %e, "reload: the log level could not be changed");
                }
            }
        }
        let source = ConfigSource::new(&path, &text, plan.needs_restart.clone());
        let file_changed = source.hash != before.hash;
        self.reloader.source.store(Some(Arc::new(source.clone())));
        for w in &warnings {
            tracing::warn!("{w}");
        }
        tracing::info!(
            path = %origin,
            hash = %source.hash,
            applied = %keys(&plan.applied),
            "configuration reloaded"
        );
        if !plan.needs_restart.is_empty() {
            tracing::warn!(
                path = %origin,
                needs_restart = %keys(&plan.needs_restart),
                "reload: settings that need a restart keep their running values; {RESTART_NOTE}"
            );
        }
        let backends = self.membership.apply_backends(&effective.backends).await;
        Ok(ReloadReport {
            config: source,
            file_changed,
            applied: plan.applied,
            restart_note: (!plan.needs_restart.is_empty()).then(|| RESTART_NOTE.to_string()),
            needs_restart: plan.needs_restart,
            warnings,
            backends,
        })
    }
}

/// The keys of `changes`, comma-separated (`-` for none).
fn keys(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "-".into();
    }
    changes
        .iter()
        .map(|c| c.key.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `unix_ms` as RFC 3339 in UTC, to the second (`2026-12-05T10:11:12Z`).
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_hashes_read_as_tools_print_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_468_472_999), "2026-12-05T11:01:12Z");
        // `printf abc | sha256sum`
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
