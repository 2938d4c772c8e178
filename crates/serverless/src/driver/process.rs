//! Local process driver: holdfast runs the server itself (`mariadbd` on the same machine).
//!
//! * start spawns the configured command in its own session, or adopts a server that is
//!   already running (found through its pid file, e.g. after holdfast restarted);
//! * freeze/thaw send SIGSTOP/SIGCONT, so a frozen server keeps its memory, connections and
//!   buffer pool and resumes in about a millisecond;
//! * scale sets a CPU limit through a cgroup (v2 `cpu.max` or v1 CFS quota);
//! * usage comes from `/proc/<pid>/stat` (CPU) and the data directory (storage).
//!
//! Every pid the driver acts on is checked against `/proc/<pid>/cmdline` first, so a stale
//! pid file whose pid now belongs to another program is never signalled.

use super::{ready, DriverError, DriverFuture, InstanceDriver, PowerState, ScaleApplied};
use holdfast_config::serverless::ProcessDriverConfig;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// CFS period used for CPU limits: 100 ms, the kernel default, so quota = CPUs x 100000.
const CFS_PERIOD_US: u64 = 100_000;
/// The kernel rejects CFS quotas below 1 ms.
const MIN_QUOTA_US: u64 = 1_000;
/// Poll interval while waiting for a process to exit during start-up or stop.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// Poll interval while confirming a SIGSTOP/SIGCONT took effect (it normally has at once).
const STATE_POLL: Duration = Duration::from_millis(1);
/// How long freeze/thaw wait for the kernel to report the new process state.
const STATE_DEADLINE: Duration = Duration::from_secs(2);
/// How long to wait for the process to disappear after SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Lines of the server's log quoted when it dies during start-up.
const LOG_TAIL_LINES: usize = 20;
/// At most this much of the log's end is read to find those lines.
const LOG_TAIL_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

/// The cgroup the server is placed in and limited through.
#[derive(Debug, Clone)]
struct Cgroup {
    version: CgroupVersion,
    dir: PathBuf,
    /// cgroup v1 keeps memory in its own hierarchy: the group there (auto mode only, nested
    /// under holdfast's own memory group). On v2 memory is limited in `dir`.
    memory_dir: Option<PathBuf>,
}

/// Memory that comes with one capacity unit.
const BYTES_PER_CCU: f64 = 2.0 * 1024.0 * 1024.0 * 1024.0;

impl Cgroup {
    fn describe(&self) -> String {
        let version = match self.version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        format!("cgroup {version} {}", self.dir.display())
    }

    /// Creates the group if it is missing; on v2 the parent must also hand the cpu
    /// controller down (`+cpu` in its cgroup.subtree_control) or `cpu.max` does not exist.
    ///
    /// The v2 path cannot be exercised on the development machine (cgroup v1 only); it
    /// follows the kernel's cgroup-v2 documentation.
    fn ensure(&self) -> io::Result<()> {
        if self.version == CgroupVersion::V2 {
            if let Some(parent) = self.dir.parent() {
                let control = parent.join("cgroup.subtree_control");
                let enabled = fs::read_to_string(&control)?;
                if !enabled.split_whitespace().any(|c| c == "cpu") {
                    fs::write(&control, "+cpu")?;
                }
            }
        }
        create_group(&self.dir)
    }

    /// Moves the whole process (all its threads) into the group.
    fn attach(&self, pid: u32) -> io::Result<()> {
        self.ensure()?;
        fs::write(self.dir.join("cgroup.procs"), pid.to_string())?;
        if let Some(mem) = &self.memory_dir {
            create_group(mem)?;
            fs::write(mem.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    /// Caps the group's memory (v2 `memory.max`, v1 `memory.limit_in_bytes`). Returns the
    /// file written, or None where memory is not limited (v1 without a memory group). The
    /// kernel refuses a cap below what the server uses now (EBUSY on v1).
    fn limit_memory(&self, bytes: u64) -> io::Result<Option<PathBuf>> {
        let file = match (self.version, &self.memory_dir) {
            (CgroupVersion::V2, _) => {
                if let Some(parent) = self.dir.parent() {
                    let control = parent.join("cgroup.subtree_control");
                    let enabled = fs::read_to_string(&control)?;
                    if !enabled.split_whitespace().any(|c| c == "memory") {
                        fs::write(&control, "+memory")?;
                    }
                }
                self.dir.join("memory.max")
            }
            (CgroupVersion::V1, Some(mem)) => {
                create_group(mem)?;
                mem.join("memory.limit_in_bytes")
            }
            (CgroupVersion::V1, None) => return Ok(None),
        };
        fs::write(&file, bytes.to_string())?;
        Ok(Some(file))
    }

    fn limit_cpu(&self, quota_us: u64) -> io::Result<()> {
        self.ensure()?;
        match self.version {
            CgroupVersion::V2 => fs::write(
                self.dir.join("cpu.max"),
                format!("{quota_us} {CFS_PERIOD_US}"),
            ),
            CgroupVersion::V1 => {
                fs::write(
                    self.dir.join("cpu.cfs_period_us"),
                    CFS_PERIOD_US.to_string(),
                )?;
                fs::write(self.dir.join("cpu.cfs_quota_us"), quota_us.to_string())
            }
        }
    }
}

/// Caps the CPU of process `pid` (all its threads) at `cpus` in a cgroup of its own, named
/// from `key` like the driver's groups (e.g. the benchmark gives each lab node a share of
/// the machine, to stand for a host of its own). Returns the group's description.
pub fn limit_process_cpu(pid: u32, key: &Path, cpus: f64) -> Result<String, String> {
    if !(cpus.is_finite() && cpus > 0.0) {
        return Err(format!("{cpus} CPUs is not a limit"));
    }
    let group = auto_cgroup(key)?;
    let describe = group.describe();
    group
        .attach(pid)
        .map_err(|e| format!("{describe}: moving process {pid}: {e}"))?;
    let quota = (cpus * CFS_PERIOD_US as f64).round().max(1000.0) as u64;
    group
        .limit_cpu(quota)
        .map_err(|e| format!("{describe}: setting the quota: {e}"))?;
    Ok(describe)
}

fn create_group(dir: &Path) -> io::Result<()> {
    match fs::create_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// The cgroup v1 memory group for `name`, nested under the memory group holdfast itself runs
/// in (so the server stays inside whatever limits the host put on holdfast).
fn v1_memory_group(name: &str) -> Option<PathBuf> {
    let root = Path::new("/sys/fs/cgroup/memory");
    if !root.join("memory.limit_in_bytes").exists() {
        return None;
    }
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.trim_start_matches('/').to_string())
    })?;
    Some(root.join(path).join(name))
}

/// Which cgroup hierarchy a directory (or the directory it will be created in) belongs to.
fn detect_version(dir: &Path) -> Option<CgroupVersion> {
    let candidates = std::iter::once(dir).chain(dir.parent());
    for candidate in candidates {
        if candidate.join("cgroup.controllers").exists() {
            return Some(CgroupVersion::V2);
        }
        if candidate.join("cpu.cfs_quota_us").exists() {
            return Some(CgroupVersion::V1);
        }
    }
    None
}

/// Resolves the `cgroup` setting; the error is the note `scale` reports instead of a limit.
fn resolve_cgroup(setting: Option<&str>, pid_file: &Path) -> Result<Cgroup, String> {
    let Some(path) = setting.map(str::trim).filter(|_| !is_auto(setting)) else {
        return auto_cgroup(pid_file);
    };
    if path == "none" {
        return Err("no CPU limit: cgroup = \"none\"".to_string());
    }
    let dir = PathBuf::from(path);
    match detect_version(&dir) {
        Some(version) => Ok(Cgroup {
            version,
            dir,
            memory_dir: None,
        }),
        None => {
            let note = format!("no CPU limit: {path} is not in a cgroup hierarchy");
            tracing::warn!("process driver: {note}");
            Err(note)
        }
    }
}

/// Unset, empty or "auto": the driver picks (and owns) the group.
fn is_auto(setting: Option<&str>) -> bool {
    matches!(setting.map(str::trim), None | Some("") | Some("auto"))
}

fn auto_cgroup(pid_file: &Path) -> Result<Cgroup, String> {
    let name = group_name(pid_file);
    let v2_root = Path::new("/sys/fs/cgroup");
    if let Ok(controllers) = fs::read_to_string(v2_root.join("cgroup.controllers")) {
        if controllers.split_whitespace().any(|c| c == "cpu") {
            return Ok(Cgroup {
                version: CgroupVersion::V2,
                dir: v2_root.join(name),
                memory_dir: None,
            });
        }
    }
    let v1_root = Path::new("/sys/fs/cgroup/cpu");
    if v1_root.join("cpu.cfs_quota_us").exists() {
        return Ok(Cgroup {
            version: CgroupVersion::V1,
            memory_dir: v1_memory_group(&name),
            dir: v1_root.join(name),
        });
    }
    Err("no CPU limit: no cgroup v2 cpu controller or cgroup v1 cpu hierarchy here".to_string())
}

/// `holdfast-<pid file stem>-<hash of the pid file path>`: stable across holdfast restarts
/// (so an adopted server keeps its group) and distinct for instances whose pid files share
/// a name in different directories.
fn group_name(pid_file: &Path) -> String {
    let stem: String = pid_file
        .file_stem()
        .map(|s| s.to_string_lossy())
        .unwrap_or_default()
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // FNV-1a: std's hashers are not guaranteed stable across Rust releases.
    let mut hash: u32 = 0x811c_9dc5;
    for byte in pid_file.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    if stem.is_empty() {
        format!("holdfast-{hash:08x}")
    } else {
        format!("holdfast-{stem}-{hash:08x}")
    }
}

/// A server this driver spawned. Holding the `Child` keeps the pid reserved until we reap
/// it, so signalling it can never hit a recycled pid.
struct Spawned {
    child: Child,
    /// Length of the log when the server was spawned: its own output starts here.
    log_offset: u64,
}

#[derive(Default)]
struct ChildState {
    spawned: Option<Spawned>,
    /// How the last spawned server ended, once reaped (quoted in start-up errors).
    last_exit: Option<ExitStatus>,
}

impl ChildState {
    /// The spawned server's pid while it runs; reaps it (no zombie) once it has exited.
    fn poll(&mut self) -> Option<u32> {
        let spawned = self.spawned.as_mut()?;
        match spawned.child.try_wait() {
            Ok(None) => return Some(spawned.child.id()),
            Ok(Some(status)) => self.last_exit = Some(status),
            Err(e) => tracing::warn!("process driver: cannot check the spawned server: {e}"),
        }
        self.spawned = None;
        None
    }
}

/// Runs the server as a local child process; see the module docs.
pub struct ProcessDriver {
    cfg: ProcessDriverConfig,
    address: String,
    cgroup: Result<Cgroup, String>,
    state: Mutex<ChildState>,
    /// Serializes start/stop/freeze/thaw so concurrent callers cannot spawn two servers or
    /// freeze one that is being stopped.
    ops: tokio::sync::Mutex<()>,
}

impl ProcessDriver {
    /// `address` is the server's `host:port`, probed after a start.
    pub fn new(cfg: ProcessDriverConfig, address: &str) -> Self {
        let cgroup = resolve_cgroup(cfg.cgroup.as_deref(), &cfg.pid_file);
        ProcessDriver {
            cfg,
            address: address.to_string(),
            cgroup,
            state: Mutex::new(ChildState::default()),
            ops: tokio::sync::Mutex::new(()),
        }
    }

    /// The running server's pid (spawned by this driver or found through the pid file).
    pub fn pid(&self) -> Option<u32> {
        self.live_pid()
    }

    /// The cgroup directory the server is placed in and limited through, if any.
    pub fn cgroup_dir(&self) -> Option<&Path> {
        self.cgroup.as_ref().ok().map(|c| c.dir.as_path())
    }

    fn program(&self) -> &str {
        self.cfg.command.first().map(String::as_str).unwrap_or("")
    }

    fn lock_state(&self) -> MutexGuard<'_, ChildState> {
        // The state stays consistent even if a holder panicked: every update is one assignment.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn live_pid(&self) -> Option<u32> {
        if let Some(pid) = self.lock_state().poll() {
            return Some(pid);
        }
        let pid = read_pid_file(&self.cfg.pid_file)?;
        is_our_server(pid, self.program()).then_some(pid)
    }

    /// Sends `sig` to the server if `pid` is still it. Returns false if it is gone.
    fn signal(&self, pid: u32, sig: libc::c_int) -> Result<bool, DriverError> {
        // The lock is held across kill() so our own child cannot be reaped (and its pid
        // recycled) in between.
        let mut state = self.lock_state();
        let ours = state.poll() == Some(pid) || is_our_server(pid, self.program());
        if !ours {
            return Ok(false);
        }
        match send_signal(pid_t(pid)?, sig) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(DriverError::Failed(format!(
                "cannot signal the server (pid {pid}): {e}"
            ))),
        }
    }

    fn attach_cgroup(&self, pid: u32) {
        if let Ok(cgroup) = &self.cgroup {
            if let Err(e) = cgroup.attach(pid) {
                tracing::warn!(
                    pid,
                    "process driver: cannot put the server into {}: {e}; it runs without CPU limits",
                    cgroup.describe()
                );
            }
        }
    }

    fn spawn(&self) -> Result<(u32, u64), DriverError> {
        let Some((program, args)) = self.cfg.command.split_first() else {
            return Err(DriverError::Failed(
                "process driver: `command` is empty".to_string(),
            ));
        };
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null());
        let mut log_offset = 0;
        match &self.cfg.log {
            Some(path) => {
                let open = || -> io::Result<(File, File, u64)> {
                    let file = OpenOptions::new().create(true).append(true).open(path)?;
                    let len = file.metadata()?.len();
                    Ok((file.try_clone()?, file, len))
                };
                let (stdout, stderr, len) = open().map_err(|e| {
                    DriverError::Failed(format!("cannot open the log {}: {e}", path.display()))
                })?;
                log_offset = len;
                command.stdout(stdout).stderr(stderr);
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        // SAFETY: the closure runs in the forked child before exec, where only
        // async-signal-safe work is allowed: setsid(2) is, and the error path builds an
        // io::Error from errno without allocating. A session of its own detaches the server
        // from holdfast's terminal and process group, so signals aimed at holdfast (Ctrl-C)
        // do not reach it and it outlives a holdfast restart.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| DriverError::Failed(format!("cannot run {program}: {e}")))?;
        let pid = child.id();
        let mut state = self.lock_state();
        state.last_exit = None;
        state.spawned = Some(Spawned { child, log_offset });
        Ok((pid, log_offset))
    }

    /// Resolves once `pid` is no longer the running server, with the start-up error.
    async fn exited(&self, pid: u32, log_offset: u64) -> DriverError {
        while self.live_pid() == Some(pid) {
            tokio::time::sleep(EXIT_POLL).await;
        }
        self.exit_error(pid, log_offset)
    }

    fn exit_error(&self, pid: u32, log_offset: u64) -> DriverError {
        let status = self
            .lock_state()
            .last_exit
            .map(|s| s.to_string())
            .unwrap_or_else(|| "exited".to_string());
        let output = match &self.cfg.log {
            None => "its output was discarded (set `log` to keep it)".to_string(),
            Some(log) => match log_tail(log, log_offset, LOG_TAIL_LINES) {
                Ok(tail) if tail.trim().is_empty() => format!("{} has no output", log.display()),
                Ok(tail) => format!("last lines of {}:\n{tail}", log.display()),
                Err(e) => format!("cannot read {}: {e}", log.display()),
            },
        };
        DriverError::Failed(format!(
            "the server (pid {pid}) exited during start-up ({status}); {output}"
        ))
    }

    async fn start_server(&self) -> Result<(), DriverError> {
        let _op = self.ops.lock().await;
        let began = Instant::now();
        let (pid, log_offset) = match self.live_pid() {
            Some(pid) => {
                tracing::info!(pid, "process driver: adopting the running server");
                self.attach_cgroup(pid);
                if proc_state(pid) == Some('T') {
                    self.signal(pid, libc::SIGCONT)?;
                }
                // Still our child if an earlier start timed out: quote only its own output.
                let log_offset = self
                    .lock_state()
                    .spawned
                    .as_ref()
                    .filter(|s| s.child.id() == pid)
                    .map_or(0, |s| s.log_offset);
                (pid, log_offset)
            }
            None => {
                let (pid, log_offset) = self.spawn()?;
                tracing::info!(pid, "process driver: spawned {}", self.program());
                self.attach_cgroup(pid);
                (pid, log_offset)
            }
        };
        let timeout = Duration::from_millis(self.cfg.start_timeout_ms);
        tokio::select! {
            ready = ready::wait_ready(&self.address, timeout) => ready?,
            error = self.exited(pid, log_offset) => return Err(error),
        }
        // Something else may own the port; only our server staying alive makes this a start.
        if self.live_pid() != Some(pid) {
            return Err(self.exit_error(pid, log_offset));
        }
        tracing::info!(
            pid,
            ms = began.elapsed().as_millis() as u64,
            "process driver: server ready"
        );
        Ok(())
    }

    /// Polls until `pid` is no longer the running server; false if `limit` passed first.
    async fn wait_gone(&self, pid: u32, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.live_pid() != Some(pid) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    async fn stop_server(&self) -> Result<(), DriverError> {
        let _op = self.ops.lock().await;
        let Some(pid) = self.live_pid() else {
            return Ok(());
        };
        let began = Instant::now();
        // A frozen server cannot act on SIGTERM until it runs again.
        self.signal(pid, libc::SIGCONT)?;
        self.signal(pid, libc::SIGTERM)?;
        let grace = Duration::from_millis(self.cfg.stop_timeout_ms);
        if self.wait_gone(pid, grace).await {
            tracing::info!(
                pid,
                ms = began.elapsed().as_millis() as u64,
                "process driver: server stopped"
            );
            return Ok(());
        }
        tracing::warn!(
            pid,
            "process driver: the server ignored SIGTERM for {} ms; sending SIGKILL",
            self.cfg.stop_timeout_ms
        );
        self.signal(pid, libc::SIGKILL)?;
        if self.wait_gone(pid, KILL_GRACE).await {
            Ok(())
        } else {
            Err(DriverError::Timeout {
                what: format!("the server (pid {pid}) to exit after SIGKILL"),
                ms: self.cfg.stop_timeout_ms + KILL_GRACE.as_millis() as u64,
            })
        }
    }

    /// Sends `sig` and waits until the kernel reports a state accepted by `reached`.
    async fn signal_and_confirm(
        &self,
        sig: libc::c_int,
        action: &'static str,
        reached: fn(char) -> bool,
    ) -> Result<(), DriverError> {
        let _op = self.ops.lock().await;
        let not_running =
            || DriverError::Failed(format!("cannot {action}: the server is not running"));
        let pid = self.live_pid().ok_or_else(not_running)?;
        if !self.signal(pid, sig)? {
            return Err(not_running());
        }
        let deadline = Instant::now() + STATE_DEADLINE;
        loop {
            match proc_state(pid) {
                Some(state) if reached(state) => return Ok(()),
                None | Some('Z') | Some('X') => return Err(not_running()),
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(DriverError::Timeout {
                    what: format!("the server (pid {pid}) to {action}"),
                    ms: STATE_DEADLINE.as_millis() as u64,
                });
            }
            tokio::time::sleep(STATE_POLL).await;
        }
    }

    async fn scale_server(&self, ccu: f64) -> Result<ScaleApplied, DriverError> {
        if !(ccu.is_finite() && ccu > 0.0) {
            return Err(DriverError::Failed(format!(
                "invalid compute size {ccu} CCU"
            )));
        }
        let cgroup = match &self.cgroup {
            Ok(cgroup) => cgroup,
            Err(note) => {
                return Ok(ScaleApplied {
                    cpu_limit: None,
                    note: note.clone(),
                })
            }
        };
        // Saturating float-to-int cast; ccu is finite and positive here.
        let quota_us = ((ccu * CFS_PERIOD_US as f64).round() as u64).max(MIN_QUOTA_US);
        if let Err(e) = cgroup.limit_cpu(quota_us) {
            let note = format!("no CPU limit: {}: {e}", cgroup.describe());
            tracing::warn!("process driver: {note}");
            return Ok(ScaleApplied {
                cpu_limit: None,
                note,
            });
        }
        // An adopted server may not be in the group yet.
        if let Some(pid) = self.live_pid() {
            self.attach_cgroup(pid);
        }
        let memory = (ccu * BYTES_PER_CCU) as u64;
        let memory_note = match cgroup.limit_memory(memory) {
            Ok(Some(file)) => format!("memory {} MiB ({})", memory >> 20, file.display()),
            Ok(None) => "memory not limited (cgroup v1: only \"auto\" groups get a memory group)"
                .to_string(),
            Err(e) => {
                tracing::warn!(
                    "process driver: memory limit of {} MiB not applied: {e}",
                    memory >> 20
                );
                format!("memory not limited: {e}")
            }
        };
        Ok(ScaleApplied {
            cpu_limit: Some(quota_us as f64 / CFS_PERIOD_US as f64),
            note: format!("{}; {memory_note}", cgroup.describe()),
        })
    }
}

impl Drop for ProcessDriver {
    /// The server outlives its driver (a new driver adopts it through the pid file), but the
    /// child we spawned must still be reaped when it exits or it lingers as a zombie of this
    /// process: a small thread waits for it. A group the driver picked itself ("auto") is
    /// removed if the server is down, so short-lived instances do not pile up cgroups.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut spawned) = state.spawned.take() {
            if matches!(spawned.child.try_wait(), Ok(None)) {
                let reaper = std::thread::Builder::new()
                    .name("holdfast-reaper".to_string())
                    .spawn(move || {
                        let _ = spawned.child.wait();
                    });
                if let Err(e) = reaper {
                    tracing::warn!("process driver: cannot start a thread to reap the server: {e}");
                }
                return;
            }
        }
        if !is_auto(self.cfg.cgroup.as_deref()) || self.live_pid().is_some() {
            return;
        }
        if let Ok(cgroup) = &self.cgroup {
            // Fails harmlessly (EBUSY) if some process is still in the group.
            for dir in std::iter::once(&cgroup.dir).chain(cgroup.memory_dir.as_ref()) {
                match fs::remove_dir(dir) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        tracing::debug!("process driver: keeping {}: {e}", dir.display());
                    }
                    _ => {}
                }
            }
        }
    }
}

impl InstanceDriver for ProcessDriver {
    fn kind(&self) -> &'static str {
        "process"
    }

    fn status_is_cheap(&self) -> bool {
        true
    }

    fn start(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.start_server())
    }

    fn stop(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.stop_server())
    }

    fn supports_freeze(&self) -> bool {
        true
    }

    fn freeze(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.signal_and_confirm(libc::SIGSTOP, "freeze", |s| s == 'T'))
    }

    /// Only confirms the process runs again; readiness over TCP is the caller's business
    /// (a thaw has to take about a millisecond).
    fn thaw(&self) -> DriverFuture<'_, ()> {
        Box::pin(self.signal_and_confirm(libc::SIGCONT, "thaw", |s| s != 'T'))
    }

    fn status(&self) -> DriverFuture<'_, PowerState> {
        Box::pin(async move {
            Ok(match self.live_pid() {
                None => PowerState::Stopped,
                Some(pid) => match proc_state(pid) {
                    Some('T') => PowerState::Frozen,
                    Some('Z') | Some('X') | None => PowerState::Stopped,
                    Some(_) => PowerState::Running,
                },
            })
        })
    }

    fn scale(&self, ccu: f64) -> DriverFuture<'_, ScaleApplied> {
        Box::pin(self.scale_server(ccu))
    }

    fn cpu_seconds(&self) -> DriverFuture<'_, Option<f64>> {
        Box::pin(async move {
            let Some(pid) = self.live_pid() else {
                return Ok(None);
            };
            Ok(read_stat(pid)
                .and_then(|stat| cpu_ticks(&stat))
                .map(|ticks| ticks as f64 / clock_ticks_per_second()))
        })
    }

    fn storage_bytes(&self) -> DriverFuture<'_, Option<u64>> {
        Box::pin(async move {
            let Some(datadir) = self.cfg.datadir.clone() else {
                return Ok(None);
            };
            let bytes = tokio::task::spawn_blocking(move || tree_size(&datadir))
                .await
                .map_err(|e| DriverError::Failed(format!("storage size task failed: {e}")))??;
            Ok(Some(bytes))
        })
    }
}

/// Sends a signal with kill(2). `pid` may be negative (a process group) but never 0, 1 or
/// -1, which would mean our own group, init, or every process we may signal.
pub(crate) fn send_signal(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    if matches!(pid, -1..=1) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}"),
        ));
    }
    // SAFETY: kill(2) only takes integers and touches no memory of this process; the
    // wildcard pids were rejected above.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn pid_t(pid: u32) -> Result<libc::pid_t, DriverError> {
    libc::pid_t::try_from(pid)
        .map_err(|_| DriverError::Failed(format!("pid {pid} is out of range")))
}

fn read_pid_file(path: &Path) -> Option<u32> {
    let text = fs::read_to_string(path).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    // 0 and 1 are never a server; above i32::MAX kill() would read it as a group.
    (pid > 1 && libc::pid_t::try_from(pid).is_ok()).then_some(pid)
}

fn read_stat(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The fields after `comm`, which is parenthesized and may itself contain spaces and ')'.
fn after_comm(stat: &str) -> Option<&str> {
    stat.rfind(')').map(|i| &stat[i + 1..])
}

/// The process state letter: R, S, D, T (stopped), Z (zombie)...
fn proc_state(pid: u32) -> Option<char> {
    let stat = read_stat(pid)?;
    after_comm(&stat)?.trim_start().chars().next()
}

/// utime + stime in clock ticks (fields 14 and 15 of /proc/<pid>/stat; field 3, the state,
/// is the first after comm).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = after_comm(stat)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf(3) only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// True if `pid` is a live (not zombie) process running `program`: guards against a pid
/// file whose pid was recycled for something else.
fn is_our_server(pid: u32, program: &str) -> bool {
    match proc_state(pid) {
        None | Some('Z') | Some('X') => return false,
        Some(_) => {}
    }
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    program_matches(argv0, program.as_bytes())
}

/// The same path, or the same file name (the server may have been started through PATH or
/// with a different but equivalent path).
fn program_matches(argv0: &[u8], program: &[u8]) -> bool {
    fn base(path: &[u8]) -> &[u8] {
        path.rsplit(|b| *b == b'/').next().unwrap_or(path)
    }
    !argv0.is_empty() && !program.is_empty() && (argv0 == program || base(argv0) == base(program))
}

/// The last `lines` lines written to `path` since `offset`.
fn log_tail(path: &Path, offset: u64, lines: usize) -> io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = offset.max(len.saturating_sub(LOG_TAIL_BYTES)).min(len);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(len - start).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut all: Vec<&str> = text.lines().collect();
    if start > offset && !all.is_empty() {
        // Cut mid-line by the byte limit.
        all.remove(0);
    }
    let keep = all.len().saturating_sub(lines);
    Ok(all[keep..].join("\n"))
}

/// Sum of the sizes of the regular files under `root` (symlinks are not followed). Files
/// that vanish during the walk (the server deletes temporary files) are skipped.
fn tree_size(root: &Path) -> io::Result<u64> {
    let mut total = 0u64;
    let mut pending = vec![root.to_path_buf()];
    let mut first = true;
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if !first && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        first = false;
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let meta = match fs::symlink_metadata(entry.path()) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_parses_after_the_last_paren() {
        let stat = "4242 (my (odd) server) S 1 4242 4242 0 -1 4194560 1200 0 0 0 \
                    250 75 0 0 20 0 30 0 12345 1000000 5000";
        assert_eq!(cpu_ticks(stat), Some(325));
        assert_eq!(
            after_comm(stat).and_then(|s| s.trim_start().chars().next()),
            Some('S')
        );
    }

    #[test]
    fn program_matching() {
        assert!(program_matches(
            b"/usr/sbin/mariadbd",
            b"/usr/sbin/mariadbd"
        ));
        assert!(program_matches(b"mariadbd", b"/usr/sbin/mariadbd"));
        assert!(!program_matches(b"/usr/bin/sleep", b"/usr/sbin/mariadbd"));
        assert!(!program_matches(b"", b"/usr/sbin/mariadbd"));
        assert!(!program_matches(b"mariadbd", b""));
    }

    #[test]
    fn group_names_are_stable_and_sanitized() {
        let a = group_name(Path::new("/var/run/db one/mariadb.pid"));
        assert!(a.starts_with("holdfast-mariadb-"), "{a}");
        assert_eq!(a, group_name(Path::new("/var/run/db one/mariadb.pid")));
        assert_ne!(a, group_name(Path::new("/var/run/db two/mariadb.pid")));
        let b = group_name(Path::new("/x/we ird$.pid"));
        assert!(b.starts_with("holdfast-we_ird_-"), "{b}");
    }

    #[test]
    fn refuses_wildcard_pids() {
        for pid in [-1, 0, 1] {
            assert!(send_signal(pid, 0).is_err());
        }
    }

    #[test]
    fn log_tail_keeps_the_last_lines_after_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        fs::write(&path, "old\nline 1\nline 2\nline 3\n").unwrap();
        assert_eq!(log_tail(&path, 4, 2).unwrap(), "line 2\nline 3");
        assert_eq!(log_tail(&path, 4, 10).unwrap(), "line 1\nline 2\nline 3");
    }
}
