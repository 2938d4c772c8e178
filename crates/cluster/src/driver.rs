//! Control drivers: how holdfast restarts a database node (a minor-version upgrade with
//! another binary, or a resize with other server options). The embedder passes one in
//! `holdfast_proxy::Seams::node_driver`; `holdfast serve` passes the lab's (`holdfast_lab::LabNodeDriver`)
//! when the config has `[driver] kind = "lab"`. The trait lives with the other control
//! drivers in `holdfast_serverless::driver`.

pub use holdfast_serverless::driver::node::{NodeDriver, NodeFuture as DriverFuture, RestartSpec};

use holdfast_config::DriverConfig;
use std::path::{Path, PathBuf};

/// `spec` as the driver may run it, or why not: its binary must be one of `[driver]
/// binaries` (the same file: symlinks and `..` resolved; the configured path is what runs)
/// and every option one of `[driver] allowed_options`, as `NAME=VALUE` with a value
/// without control characters.
pub fn allowed_spec(cfg: &DriverConfig, spec: &RestartSpec) -> Result<RestartSpec, String> {
    let binary = match spec.binary.as_deref() {
        None => None,
        Some(b) => Some(allowed_binary(cfg, Path::new(b))?),
    };
    for kv in &spec.set {
        let Some((name, value)) = kv.split_once('=') else {
            return Err(format!("server option {kv:?} is not NAME=VALUE"));
        };
        if !cfg.option_allowed(name) {
            return Err(format!(
                "server option {:?} is not in [driver] allowed_options ({})",
                name.trim(),
                cfg.allowed_options.join(", ")
            ));
        }
        if value.trim().is_empty() || value.chars().any(char::is_control) {
            return Err(format!(
                "server option {kv:?}: the value is empty or not text"
            ));
        }
    }
    Ok(RestartSpec {
        binary,
        set: spec.set.clone(),
    })
}

fn allowed_binary(cfg: &DriverConfig, binary: &Path) -> Result<String, String> {
    let refused = || {
        let list: Vec<String> = cfg
            .binaries
            .iter()
            .map(|b| b.display().to_string())
            .collect();
        format!(
            "server binary {} is not in [driver] binaries ({})",
            binary.display(),
            if list.is_empty() {
                "empty".to_string()
            } else {
                list.join(", ")
            }
        )
    };
    let real = |p: &Path| -> Option<PathBuf> { std::fs::canonicalize(p).ok() };
    if !binary.is_absolute() {
        return Err(refused());
    }
    let wanted = real(binary).ok_or_else(refused)?;
    cfg.binaries
        .iter()
        .find(|b| real(b).is_some_and(|r| r == wanted))
        .map(|b| b.display().to_string())
        .ok_or_else(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(binary: Option<&str>, set: &[&str]) -> RestartSpec {
        RestartSpec {
            binary: binary.map(String::from),
            set: set.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_listed_binaries_and_options_pass() {
        let dir =
            std::env::temp_dir().join(format!("holdfast-driver-allow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let server = dir.join("mariadbd");
        std::fs::write(&server, "").unwrap();
        let link = dir.join("mysqld");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&server, &link).unwrap();
        let cfg = DriverConfig {
            binaries: vec![server.clone()],
            ..DriverConfig::default()
        };
        let s = server.display().to_string();
        let ok = allowed_spec(&cfg, &spec(Some(&s), &["innodb_buffer_pool_size=256M"])).unwrap();
        assert_eq!(ok.binary.as_deref(), Some(s.as_str()));
        // The same file by another name runs as the configured path.
        let other = format!(
            "{}/../{}/mysqld",
            dir.display(),
            dir.file_name().unwrap().to_string_lossy()
        );
        let ok = allowed_spec(&cfg, &spec(Some(&other), &[])).unwrap();
        assert_eq!(ok.binary.as_deref(), Some(s.as_str()));
        assert!(allowed_spec(
            &cfg,
            &spec(None, &["max-connections=500", "--max_connections=10"])
        )
        .is_ok());

        for (bad, why) in [
            (spec(Some("/bin/sh"), &[]), "[driver] binaries"),
            (spec(Some("mariadbd"), &[]), "[driver] binaries"),
            (
                spec(Some(&format!("{}/nothing", dir.display())), &[]),
                "[driver] binaries",
            ),
            (spec(None, &["general_log_file=/tmp/x"]), "allowed_options"),
            (
                spec(None, &["max_connections=1", "plugin_dir=/tmp"]),
                "allowed_options",
            ),
            (spec(None, &["max_connections"]), "NAME=VALUE"),
            (spec(None, &["max_connections="]), "empty"),
            (
                spec(None, &["max_connections=1\n--plugin-dir=/tmp"]),
                "not text",
            ),
        ] {
            let err = allowed_spec(&cfg, &bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let none = DriverConfig::default();
        let err = allowed_spec(&none, &spec(Some(&s), &[])).unwrap_err();
        assert!(err.contains("(empty)"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
