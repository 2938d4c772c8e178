//! The `[admin]` section and the admin API's bearer token: the [`AdminToken`] type (zeroized
//! on drop, redacted in `Debug`, compared in constant time) and its file (one line, mode
//! 0600), which `holdfast serve` creates when the config names no token and which
//! `holdfast ctl`, the lab and the tests read.

use crate::ConfigError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::io::Write;
use std::path::{Path, PathBuf};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// The shortest token holdfast accepts from a config or a token file.
pub const MIN_TOKEN_LEN: usize = 16;

/// The admin API's listener and how it is protected (`[admin]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub listen: String,
    /// The bearer token itself. Prefer `token_file`: a config file is often world-readable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<AdminToken>,
    /// A file holding the bearer token (one line). Relative paths are relative to the
    /// config file's directory. Must exist: holdfast only generates the default file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Host names (without port) a request's `Host` header may carry besides `localhost`,
    /// IP literals and the host of `listen` (DNS-rebinding protection).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: "127.0.0.1:6034".into(),
            token: None,
            token_file: None,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Where the token `holdfast serve` uses came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `[admin] token`.
    Inline,
    /// `[admin] token_file`, or the default file from an earlier start.
    File(PathBuf),
    /// Generated now into the default file.
    Generated(PathBuf),
}

impl AdminConfig {
    /// The host part of `listen` (`127.0.0.1`, `::1`, `localhost`, `admin.example`).
    pub fn listen_host(&self) -> &str {
        host_of(&self.listen)
    }

    /// Whether `listen` is a loopback address (`127.0.0.0/8`, `::1` or `localhost`).
    pub fn listens_on_loopback(&self) -> bool {
        is_loopback_host(self.listen_host())
    }

    /// Whether the config names the token (`token` or `token_file`).
    pub fn token_configured(&self) -> bool {
        self.token.is_some() || self.token_file.is_some()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, m: String| Err(crate::invalid_key(key, m));
        if self.token.is_some() && self.token_file.is_some() {
            return invalid(
                "admin",
                "[admin] sets both token and token_file: keep one".into(),
            );
        }
        if let Some(t) = &self.token {
            if let Err(e) = check_token_text(t.expose()) {
                return invalid("admin.token", format!("[admin] token {e}"));
            }
        }
        if !self.listens_on_loopback() && !self.token_configured() {
            return invalid(
                "admin.listen",
                format!(
                    "[admin] listen = {:?} is not a loopback address: set [admin] token_file (or \
                 token) explicitly before exposing the admin API; holdfast generates a token \
                 by itself only for a loopback listener",
                    self.listen
                ),
            );
        }
        for h in &self.allowed_hosts {
            if h.is_empty() || h.contains([':', '/', ' ']) {
                return invalid(
                    "admin.allowed_hosts",
                    format!("[admin] allowed_hosts: {h:?} is not a host name (no port, no scheme)"),
                );
            }
        }
        Ok(())
    }

    /// `token_file` as a path: relative ones are taken from `config_dir`.
    pub fn token_file_path(&self, config_dir: &Path) -> Option<PathBuf> {
        self.token_file.as_ref().map(|p| config_dir.join(p))
    }

    /// The token `holdfast serve` uses with the config at `config_path`: `token`, the file
    /// `token_file`, or else the default file ([`default_token_file`]), generated with a new
    /// random token on the first start.
    pub fn load_or_generate_token(
        &self,
        config_path: &Path,
    ) -> Result<(AdminToken, TokenSource), ConfigError> {
        if let Some(t) = &self.token {
            return Ok((t.clone(), TokenSource::Inline));
        }
        let dir = config_dir(config_path);
        if let Some(path) = self.token_file_path(&dir) {
            return Ok((read_token_file(&path)?, TokenSource::File(path)));
        }
        let path = default_token_file(config_path);
        match write_new_token_file(&path) {
            Ok(token) => Ok((token, TokenSource::Generated(path))),
            Err(ConfigError::TokenFile { cause: Some(e), .. })
                if e.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                Ok((read_token_file(&path)?, TokenSource::File(path)))
            }
            Err(e) => Err(e),
        }
    }

    /// The token a client (`holdfast ctl --config`) uses with the config at `config_path`:
    /// like [`AdminConfig::load_or_generate_token`], but never generates one.
    pub fn read_token(&self, config_path: &Path) -> Result<AdminToken, ConfigError> {
        if let Some(t) = &self.token {
            return Ok(t.clone());
        }
        let dir = config_dir(config_path);
        let path = self
            .token_file_path(&dir)
            .unwrap_or_else(|| default_token_file(config_path));
        read_token_file(&path)
    }
}

fn config_dir(config_path: &Path) -> PathBuf {
    match config_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The token file holdfast generates when the config names none: beside the config,
/// named after it (`/etc/holdfast/holdfast.toml` -> `/etc/holdfast/holdfast.admin-token`).
pub fn default_token_file(config_path: &Path) -> PathBuf {
    let stem = config_path
        .file_stem()
        .map_or_else(|| "holdfast".into(), |s| s.to_string_lossy().into_owned());
    config_dir(config_path).join(format!("{stem}.admin-token"))
}

/// The host part of `host:port`, `[v6]:port` or a bare host.
pub fn host_of(addr: &str) -> &str {
    let a = addr.trim();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(h, _)| h);
    }
    match a.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, _)) if !h.contains(':') => h,
        Some(_) => a,
        None => a,
    }
}

/// Whether `host` names this machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Why `text` cannot be a token, if it cannot.
fn check_token_text(text: &str) -> Result<(), String> {
    if text.len() < MIN_TOKEN_LEN {
        return Err(format!("is too short: at least {MIN_TOKEN_LEN} characters"));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may only hold visible ASCII characters (no spaces)".into());
    }
    Ok(())
}

/// Reads a token file: one line, surrounding whitespace ignored.
pub fn read_token_file(path: &Path) -> Result<AdminToken, ConfigError> {
    let text =
        Zeroizing::new(
            std::fs::read_to_string(path).map_err(|e| ConfigError::TokenFile {
                path: path.to_path_buf(),
                message: "cannot read it".into(),
                cause: Some(e),
            })?,
        );
    let token = text.trim();
    check_token_text(token).map_err(|m| ConfigError::TokenFile {
        path: path.to_path_buf(),
        message: format!("the token in it {m}"),
        cause: None,
    })?;
    Ok(AdminToken::new(token))
}

/// Creates `path` (mode 0600; it must not exist yet) with a new random token.
pub fn write_new_token_file(path: &Path) -> Result<AdminToken, ConfigError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |message: &str, e: std::io::Error| ConfigError::TokenFile {
        path: path.to_path_buf(),
        message: message.into(),
        cause: Some(e),
    };
    let token = AdminToken::generate();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| err("cannot create it", e))?;
    let line = Zeroizing::new(format!("{}\n", token.expose()));
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| err("cannot write it", e))?;
    Ok(token)
}

/// The permission bits of `path` when group or others may read it.
pub fn loose_permissions(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then_some(mode)
}

/// The admin API's bearer token: zeroized on drop, `<redacted>` in `Debug`, compared in
/// constant time. Serialises as the plain string (a config that sets `token` round-trips).
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct AdminToken(String);

impl AdminToken {
    pub fn new(text: impl Into<String>) -> Self {
        AdminToken(text.into())
    }

    /// 32 bytes from the operating system's CSPRNG, as 64 hex digits.
    pub fn generate() -> Self {
        use rand::RngCore;
        let mut bytes = Zeroizing::new([0u8; 32]);
        rand::rngs::OsRng.fill_bytes(bytes.as_mut());
        let mut text = String::with_capacity(64);
        for b in bytes.iter() {
            text.push(char::from(HEX[usize::from(b >> 4)]));
            text.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
        AdminToken(text)
    }

    /// The token text, for a request header or a file.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this token. The time taken depends on the lengths only, not
    /// on where the bytes differ.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        if mine.len() != candidate.len() {
            return false;
        }
        let diff = mine
            .iter()
            .zip(candidate)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl PartialEq for AdminToken {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for AdminToken {}

impl Serialize for AdminToken {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AdminToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(AdminToken)
    }
}
