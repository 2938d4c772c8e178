//! A cached, freshly initialised MariaDB data directory.
//!
//! `mariadb-install-db` takes most of a second and lots of I/O; a lab node instead gets a
//! `cp -a` of a template made once per server version, in
//! `$TMPDIR/holdfast-lab-template-v2-<version>/`. Parallel processes (test binaries) coordinate
//! with an `flock` on `<template>.lock`, and the template only appears under its final name
//! through an atomic rename of a complete directory, so a reader never sees half of one.

use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::procs;

/// The InnoDB redo log size the template is made with (and the lab runs with), so that a
/// node doesn't resize it on first start.
pub const INNODB_LOG_FILE_SIZE: &str = "48M";

/// The template's own version, in its directory name: a template made by an older lab is
/// not reused. 2: without a `root@<hostname>` account, which the nodes, running with
/// `--skip-name-resolve`, ignore, and which `mariadb-dump --system=users` therefore cannot
/// dump (`lab add-replica` dumps the accounts).
const TEMPLATE_FORMAT: u32 = 2;

/// File inside a complete template; its absence means "not a template".
const MARKER: &str = ".holdfast-template-complete";

/// The version string of `mariadbd` (e.g. `10.11.19-MariaDB-0+deb12u1`).
pub fn server_version(mariadbd: &Path) -> Result<String> {
    let out = procs::run_capture(mariadbd, ["--version"])?;
    // "/usr/sbin/mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64 (Debian 12)"
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "Ver" {
            if let Some(v) = words.next() {
                return Ok(v.to_string());
            }
        }
    }
    bail!(
        "cannot find a version in `{} --version` output: {}",
        mariadbd.display(),
        out.trim()
    )
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Returns the template directory for `mariadbd`, creating it if needed.
pub fn ensure(mariadbd: &Path) -> Result<PathBuf> {
    let version = server_version(mariadbd)?;
    let base = std::env::temp_dir();
    let name = format!(
        "holdfast-lab-template-v{TEMPLATE_FORMAT}-{}",
        sanitize(&version)
    );
    let dir = base.join(&name);
    if dir.join(MARKER).exists() {
        return Ok(dir);
    }

    let lock_path = base.join(format!("{name}.lock"));
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening template lock {}", lock_path.display()))?;
    // SAFETY: flock on a valid fd; released when `lock` is closed.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("locking {}", lock_path.display()));
    }
    // Someone else may have finished it while we waited for the lock.
    if dir.join(MARKER).exists() {
        return Ok(dir);
    }
    // A directory without the marker is a leftover of a crashed attempt.
    if dir.exists() {
        fs::remove_dir_all(&dir)
            .with_context(|| format!("removing incomplete template {}", dir.display()))?;
    }

    let staging = base.join(format!("{name}.tmp-{}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    }
    let result = install(mariadbd, &staging).and_then(|()| {
        fs::write(staging.join(MARKER), format!("{version}\n"))
            .context("writing template marker")?;
        fs::rename(&staging, &dir)
            .with_context(|| format!("renaming {} to {}", staging.display(), dir.display()))
    });
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    tracing::info!(template = %dir.display(), "created MariaDB data directory template");
    drop(lock);
    Ok(dir)
}

fn install(mariadbd: &Path, datadir: &Path) -> Result<()> {
    let install_db = procs::require_program(
        &["mariadb-install-db", "mysql_install_db"],
        "mariadb-server",
    )?;
    let mut cmd = Command::new(&install_db);
    cmd.arg("--no-defaults")
        .arg("--auth-root-authentication-method=normal")
        .arg("--skip-test-db")
        // No account for this machine's host name (see TEMPLATE_FORMAT): the one thing
        // "cross bootstrap" changes, besides fewer messages, is to leave those out.
        .arg("--cross-bootstrap")
        .arg(format!("--datadir={}", datadir.display()))
        .arg("--user=root")
        .arg(format!("--innodb-log-file-size={INNODB_LOG_FILE_SIZE}"));
    // Let a non-default server binary pick its own basedir (share/ files).
    if let Some(bin_dir) = mariadbd.parent() {
        if let Some(prefix) = bin_dir.parent() {
            if prefix != Path::new("/usr") && prefix.join("share").is_dir() {
                cmd.arg(format!("--basedir={}", prefix.display()));
            }
        }
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", install_db.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}\n{}",
            install_db.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Copies the template into each of `dests` (which must not exist) with `cp -a`, all
/// copies running at once. Files are copied sparse: most of the redo log is zeros, so a
/// node takes ~7 MB of disk instead of ~66 MB.
pub fn copy_to(template: &Path, dests: &[&Path]) -> Result<()> {
    let mut children = Vec::with_capacity(dests.len());
    for dest in dests {
        if dest.exists() {
            bail!("{} already exists", dest.display());
        }
        let child = Command::new("cp")
            .arg("-a")
            .arg("--sparse=always")
            .arg(template)
            .arg(dest)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running cp")?;
        children.push((dest, child));
    }
    let mut failures = Vec::new();
    for (dest, child) in children {
        let out = child.wait_with_output().context("waiting for cp")?;
        if !out.status.success() {
            failures.push(format!(
                "cp -a {} {}: {}",
                template.display(),
                dest.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // The marker belongs to the template only.
        let _ = fs::remove_file(dest.join(MARKER));
    }
    if !failures.is_empty() {
        bail!(
            "copying the data directory template failed: {}",
            failures.join("; ")
        );
    }
    Ok(())
}
