//! Processes around a measurement: `holdfast serve` (and HAProxy) as helpers recorded in
//! the lab so that `holdfast lab down` stops them too, the lab itself when the tool started
//! it, and config variants of the lab's `holdfast.toml`.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use holdfast_config::Config;
use holdfast_lab::{procs, AuxProcess, LabStatus};

/// How long holdfast and HAProxy get to start accepting TCP connections.
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A helper process started by a tool; terminated on drop unless [`Helper::keep`] is called.
pub struct Helper {
    name: &'static str,
    pub pid: u32,
    dir: PathBuf,
    kept: bool,
}

impl Helper {
    /// Records the process in the lab in `dir` (see [`holdfast_lab::register_aux`]).
    pub fn register(dir: &Path, name: &'static str, pid: u32) -> Result<Helper> {
        let helper = Helper {
            name,
            pid,
            dir: dir.to_path_buf(),
            kept: false,
        };
        holdfast_lab::register_aux(
            dir,
            AuxProcess {
                name: name.to_string(),
                pid,
                // Unknown only if it already exited (then there is nothing to stop).
                start_time: procs::start_time(pid).unwrap_or(0),
            },
        )?;
        Ok(helper)
    }

    /// Leaves the process running (`holdfast lab down` still stops it); returns its pid.
    pub fn keep(mut self) -> u32 {
        self.kept = true;
        self.pid
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(e) = procs::terminate(self.pid, Duration::from_secs(10)) {
            eprintln!("stopping {} (pid {}): {e:#}", self.name, self.pid);
        }
        let _ = holdfast_lab::unregister_aux(&self.dir, self.pid);
    }
}

/// Stops a lab the tool started, on drop.
pub struct LabGuard(pub Option<PathBuf>);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            eprintln!("stopping the lab in {}", dir.display());
            if let Err(e) = holdfast_lab::down(&dir) {
                eprintln!("stopping the lab: {e:#}");
            }
        }
    }
}

/// Starts `EXE serve --config CONFIG` (output appended to `log`) and waits until its proxy
/// listener (the lab's proxy address) and every port in `also` accept connections.
/// Returns the helper and the proxy listener's port.
pub fn start_holdfast(
    exe: &Path,
    st: &LabStatus,
    config: &Path,
    log: &Path,
    also: &[u16],
) -> Result<(Helper, u16)> {
    let listen = Config::load(config)?.proxy.listen;
    let addr: SocketAddr = listen
        .parse()
        .with_context(|| format!("bad [proxy] listen {listen:?} in {}", config.display()))?;
    let mut addrs = vec![addr];
    addrs.extend(also.iter().map(|&p| SocketAddr::from(([127, 0, 0, 1], p))));
    if let Some(busy) = addrs.iter().find(|a| procs::tcp_accepts(a)) {
        bail!("something already listens on holdfast's address {busy}; stop it first");
    }
    let mut cmd = Command::new(exe);
    // A log file, not a terminal: no colour codes in it.
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1");
    let pid = procs::spawn_detached(&mut cmd, Some(log))?;
    let helper = Helper::register(&st.dir, "holdfast", pid)?;
    for a in &addrs {
        if let Err(e) = procs::wait_tcp(a, LISTEN_TIMEOUT, || procs::is_alive(helper.pid)) {
            let tail = procs::tail_file(log, 10);
            let tail = if tail.trim().is_empty() {
                format!("{} is empty", log.display())
            } else {
                format!("last lines of {}:\n{tail}", log.display())
            };
            bail!("holdfast ({}): {e:#}; {tail}", exe.display());
        }
    }
    Ok((helper, addr.port()))
}

/// holdfast's proxy listener in the lab.
pub fn proxy_addr(st: &LabStatus) -> Result<SocketAddr> {
    st.proxy
        .parse()
        .with_context(|| format!("bad proxy address {:?} in lab.json", st.proxy))
}

/// The port of holdfast's proxy listener in the lab.
pub fn proxy_port(st: &LabStatus) -> Result<u16> {
    Ok(proxy_addr(st)?.port())
}

/// The port of the lab's split listener (`routing = "split"`).
pub fn split_port(st: &LabStatus) -> Result<u16> {
    st.split
        .as_deref()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .context("the lab has no split listener (made before read/write splitting?)")
}

/// Writes `DIR/NAME`: the lab's `holdfast.toml` changed by `edit`, headed by `note`.
pub fn config_variant(
    st: &LabStatus,
    name: &str,
    note: &str,
    edit: impl FnOnce(&mut Config) -> Result<()>,
) -> Result<PathBuf> {
    let mut config = Config::load(&st.config)?;
    edit(&mut config)?;
    let body = config.to_toml()?;
    let path = st.dir.join(name);
    let text = format!(
        "# Written by holdfast-bench from {}: {note}\n\n{body}",
        st.config.display()
    );
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
