//! Passwords in the configuration: a [`Secret`] is zeroized when dropped, prints as
//! `<redacted>`, and is never serialised (`Config::to_toml` leaves it out, so a config
//! written by the lab or the bench names a password file instead). Passwords can come from
//! files (`*_password_file`), read when the config is loaded; a config holding passwords
//! itself should not be readable by others ([`permission_warnings`]).

use crate::{Config, ConfigError};
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

#[derive(Clone, Default)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Zeroizing::new(value.into()))
    }

    /// The password itself, for the one place that sends or hashes it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret::new(s)
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_bytes() == other.0.as_bytes()
    }
}

impl Eq for Secret {}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Reads a password file: its first line, without the line end.
pub fn read_password_file(path: &Path) -> Result<Secret, ConfigError> {
    let text =
        Zeroizing::new(
            std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
                path: path.display().to_string(),
                cause,
            })?,
        );
    let line = text.lines().next().unwrap_or("");
    Ok(Secret::new(line))
}

/// Writes `password` to a new file only its owner can read (mode 0600).
pub fn write_password_file(path: &Path, password: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(Zeroizing::new(format!("{password}\n")).as_bytes())
}

/// `path` as named in a config at `base` (a relative path is relative to the config's
/// directory).
pub fn relative_to(base: Option<&Path>, path: &Path) -> PathBuf {
    match base {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// Files that hold secrets but are readable by the group or by anyone: the config itself
/// when it holds passwords inline, and the password files it names.
pub fn permission_warnings(config_path: &Path, cfg: &Config) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let loose = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o077 != 0)
            .unwrap_or(false)
    };
    let mut out = Vec::new();
    let inline = cfg.auth.monitor_password_file.is_none() && !cfg.auth.monitor_password.is_empty()
        || cfg.ha.repl_password_file.is_none() && !cfg.ha.repl_password.is_empty()
        || cfg.admin.token.is_some();
    if inline && loose(config_path) {
        out.push(format!(
            "{} holds passwords or the admin token and can be read by other users; chmod 600 it, or move the secrets to *_password_file / token_file",
            config_path.display()
        ));
    }
    let base = config_path.parent();
    for file in [&cfg.auth.monitor_password_file, &cfg.ha.repl_password_file]
        .into_iter()
        .flatten()
    {
        let file = relative_to(base, file);
        if loose(&file) {
            out.push(format!(
                "{} holds a password and can be read by other users; chmod 600 it",
                file.display()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_and_read_from_a_file() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(s.expose(), "hunter2");
        let dir = std::env::temp_dir().join(format!("hf-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        write_password_file(&f, "p'w\"d x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_password_file(&f).unwrap().expose(), "p'w\"d x");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
