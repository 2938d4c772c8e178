//! The `[log]` section: what holdfast logs.

use crate::ConfigError;
use serde::{Deserialize, Serialize};

/// The levels a directive may name.
pub const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or comma-separated
    /// `tracing` directives with targets (`info,holdfast_proxy=debug`). `RUST_LOG`, when set,
    /// takes its place at start; a reload applies this key when it changed in the file.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

impl LogConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_directives(&self.level).map_err(|message| ConfigError::InvalidKey {
            key: "log.level".into(),
            message,
        })
    }
}

/// Whether `directives` are a level or `target=level` directives. Stricter than `tracing`'s
/// own parser, which takes any bare word as a target: `infoo` would log everything of a
/// target of that name and nothing else, silently.
pub fn check_directives(directives: &str) -> Result<(), String> {
    let is_level = |s: &str| LEVELS.contains(&s.trim().to_ascii_lowercase().as_str());
    if directives.split(',').all(|d| d.trim().is_empty()) {
        return Err(
            "is empty: give a level (info) or directives (info,holdfast_proxy=debug)".into(),
        );
    }
    for d in directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let ok = match d.rsplit_once('=') {
            Some((target, level)) => !target.trim().is_empty() && is_level(level),
            None => is_level(d),
        };
        if !ok {
            return Err(format!(
                "{d:?} is neither a level ({}) nor target=level",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_levels_or_targets_with_levels() {
        for ok in [
            "info",
            "WARN",
            "info,holdfast_proxy=debug",
            "holdfast_proxy::session=trace",
        ] {
            assert!(check_directives(ok).is_ok(), "{ok}");
        }
        for bad in ["", "infoo", "info,holdfast_proxy=loud", "=debug", " , "] {
            assert!(check_directives(bad).is_err(), "{bad:?}");
        }
    }
}
