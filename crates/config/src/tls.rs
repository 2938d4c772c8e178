//! `[tls]` (TLS to clients) and `[backend_tls]` (TLS to the database nodes).

use crate::{invalid_key, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// TLS offered to clients on every listener. Without a certificate holdfast does not offer
/// TLS (and a client asking for it is refused with the server's error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first) presented to clients.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// Refuse logins that did not start TLS (as the server's `require_secure_transport`).
    pub require_tls: bool,
    /// Oldest protocol accepted: "1.2" or "1.3".
    pub min_version: TlsVersion,
    /// How often the certificate and key files are checked for changes; a changed pair is
    /// loaded for new connections (0: only at start).
    pub reload_check_secs: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: None,
            key: None,
            require_tls: false,
            min_version: TlsVersion::V1_2,
            reload_check_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl TlsConfig {
    /// Whether holdfast offers TLS to clients.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    pub fn reload_check(&self) -> Option<Duration> {
        (self.reload_check_secs > 0).then(|| Duration::from_secs(self.reload_check_secs))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match (&self.cert, &self.key) {
            (Some(_), Some(_)) | (None, None) => {}
            _ => {
                return Err(invalid_key(
                    "tls",
                    "[tls] needs both cert and key (PEM files), or neither",
                ))
            }
        }
        if self.require_tls && !self.enabled() {
            return Err(invalid_key(
                "tls.require_tls",
                "require_tls = true needs cert and key",
            ));
        }
        Ok(())
    }
}

/// TLS to the database nodes: every session's backend connection and every control
/// connection (monitor, HA, verifier loads, scaling).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendTlsConfig {
    pub mode: BackendTlsMode,
    /// PEM CA certificates the nodes' certificates must chain to (required for
    /// verify-ca and verify-full).
    pub ca: Option<PathBuf>,
    /// Client certificate chain and key, for nodes that require X509 accounts.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// How holdfast secures its connections to the nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendTlsMode {
    /// No TLS.
    #[default]
    Disabled,
    /// TLS, with the node's certificate checked against `ca` but not its name.
    VerifyCa,
    /// TLS, with the certificate checked against `ca` and the node's address (name or IP)
    /// matching it.
    VerifyFull,
}

impl BackendTlsConfig {
    pub fn enabled(&self) -> bool {
        self.mode != BackendTlsMode::Disabled
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled() && self.ca.is_none() {
            return Err(invalid_key(
                "backend_tls.mode",
                "verify-ca and verify-full need `ca` (a PEM file)",
            ));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(invalid_key(
                "backend_tls",
                "[backend_tls] needs both cert and key, or neither",
            ));
        }
        Ok(())
    }
}
