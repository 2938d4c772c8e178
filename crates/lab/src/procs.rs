//! Process and port helpers: finding programs, spawning detached daemons, checking and
//! stopping them, picking free ports and waiting for listeners. Linux only (uses /proc).

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Finds the first of `names` on `PATH` (and in the sbin directories, which a non-root
/// `PATH` often lacks).
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for extra in ["/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin"] {
        let extra = PathBuf::from(extra);
        if !dirs.contains(&extra) {
            dirs.push(extra);
        }
    }
    for name in names {
        for dir in &dirs {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds a required program or fails with an install hint.
pub fn require_program(names: &[&str], package: &str) -> Result<PathBuf> {
    find_program(names)
        .with_context(|| format!("{} not found on PATH; install {package}", names.join(" / ")))
}

/// Spawns `cmd` in its own session (setsid), so that it survives the parent's exit and
/// does not get the terminal's Ctrl-C. Standard input is /dev/null; output goes to `log`
/// (appended) or /dev/null. Returns the pid; the process is not waited for here
/// ([`is_alive`] reaps it once it has exited).
pub fn spawn_detached(cmd: &mut Command, log: Option<&Path>) -> Result<u32> {
    cmd.stdin(Stdio::null());
    match log {
        Some(path) => {
            let file = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening log file {}", path.display()))?;
            let file2 = file
                .try_clone()
                .with_context(|| format!("duplicating log file handle {}", path.display()))?;
            cmd.stdout(file).stderr(file2);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child: Child = cmd
        .spawn()
        .with_context(|| format!("starting {}", cmd.get_program().to_string_lossy()))?;
    Ok(child.id())
}

/// Whether `pid` is a live (non-zombie) process. Reaps it if it is our own exited child.
pub fn is_alive(pid: u32) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid_t <= 0 {
        return false;
    }
    // Reap our own exited children so they don't linger as zombies. ECHILD (not our child)
    // is the normal case for a lab started by another process.
    let mut wstatus = 0;
    // SAFETY: plain syscall with a valid out-pointer.
    let reaped = unsafe { libc::waitpid(pid_t, &mut wstatus, libc::WNOHANG) };
    if reaped == pid_t {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Format: "pid (comm) S ..."; comm may contain spaces and parens, so look
            // after the last ')'.
            let mut fields = stat
                .rfind(')')
                .map(|i| stat[i + 1..].split_whitespace())
                .into_iter()
                .flatten();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<libc::pid_t>().ok());
            let dead = matches!(state, Some("Z") | Some("X") | None);
            // SAFETY: plain syscall.
            if dead && ppid == Some(unsafe { libc::getpid() }) {
                // Our child's leader thread is a zombie while its other threads finish
                // dying; WNOHANG above was too early. Reap it now (this returns as soon
                // as the last thread is gone) so it doesn't outlive us as a zombie.
                // SAFETY: plain syscall with a valid out-pointer.
                unsafe { libc::waitpid(pid_t, &mut wstatus, 0) };
            }
            !dead
        }
        Err(_) => false,
    }
}

/// Whether `pid` is stopped (SIGSTOP: state `T` or `t` in /proc/PID/stat), e.g. a frozen
/// serverless instance, which accepts connections into its backlog but never answers.
pub fn is_stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| matches!(state, "T" | "t"))
    })
}

/// Runs `cmd` (standard input /dev/null) and collects its output like
/// [`Command::output`], but kills it and fails once `timeout` has passed.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Result<std::process::Output> {
    use std::io::Read;
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    // Read both pipes on their own threads: a child blocked on a full pipe never exits.
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {program}"))?
        {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{program} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The command line of `pid` (program and arguments), if readable.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// Whether `pid` is alive and one of its command-line arguments equals `arg` (guards
/// against pid reuse: a recorded pid only counts while it still runs what we started).
pub fn is_alive_with(pid: u32, arg: &str) -> bool {
    is_alive(pid) && cmdline(pid).is_some_and(|args| args.iter().any(|a| a == arg))
}

/// The start time of `pid` (clock ticks since boot, field 22 of /proc/PID/stat). Together
/// with the pid it identifies a process across pid reuse.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after comm start at field 3 (state); starttime is field 22.
    after_comm.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether `pid` is alive and is still the process that started at `start` (see
/// [`start_time`]).
pub fn is_alive_since(pid: u32, start: u64) -> bool {
    is_alive(pid) && start_time(pid) == Some(start)
}

/// Sends `signal` to `pid`; a process that is already gone is not an error.
pub fn signal(pid: u32, signal: libc::c_int) -> Result<()> {
    let pid_t = libc::pid_t::try_from(pid).context("pid out of range")?;
    // SAFETY: plain syscall.
    let rc = unsafe { libc::kill(pid_t, signal) };
    if rc == -1 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err).with_context(|| format!("kill({pid}, {signal})"));
        }
    }
    Ok(())
}

/// Stops `pid`: SIGTERM, wait up to `grace`, then SIGKILL and wait up to 5 s more.
/// Returns an error only if the process is still alive after SIGKILL.
pub fn terminate(pid: u32, grace: Duration) -> Result<()> {
    if !is_alive(pid) {
        return Ok(());
    }
    // A frozen (SIGSTOP) server, e.g. a paused serverless instance, acts on SIGTERM only
    // once it runs again.
    signal(pid, libc::SIGCONT)?;
    signal(pid, libc::SIGTERM)?;
    if wait_dead(pid, grace) {
        return Ok(());
    }
    tracing::warn!(
        pid,
        "process ignored SIGTERM for {grace:?}; sending SIGKILL"
    );
    kill_now(pid)
}

/// SIGKILL and wait (up to 5 s) until the process is gone.
pub fn kill_now(pid: u32) -> Result<()> {
    signal(pid, libc::SIGKILL)?;
    if wait_dead(pid, Duration::from_secs(5)) {
        Ok(())
    } else {
        bail!("process {pid} is still alive 5 s after SIGKILL")
    }
}

/// Polls until `pid` is gone or `deadline` passes. Returns whether it is gone.
pub fn wait_dead(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if !is_alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Reserves `n` distinct free TCP ports on 127.0.0.1 (bind to port 0, hold all listeners
/// until every port is picked, then release them). Another process may still grab a port
/// before we use it; callers that start servers on these ports retry on "address in use".
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        let l =
            TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0 to find a free port")?;
        listeners.push(l);
    }
    listeners
        .iter()
        .map(|l| {
            Ok(l.local_addr()
                .context("local_addr of probe listener")?
                .port())
        })
        .collect()
}

/// Whether something accepts TCP connections on `addr` right now.
pub fn tcp_accepts(addr: &SocketAddr) -> bool {
    TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_ok()
}

/// Waits until `addr` accepts TCP connections, or until `timeout`. While waiting, `alive`
/// is polled; if it returns false the wait ends early with an error.
pub fn wait_tcp(
    addr: &SocketAddr,
    timeout: Duration,
    mut alive: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if tcp_accepts(addr) {
            return Ok(());
        }
        if !alive() {
            bail!("the process exited before it accepted connections on {addr}");
        }
        if Instant::now() >= deadline {
            bail!("nothing accepted TCP connections on {addr} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command to completion and returns its stdout; fails with stderr on a non-zero exit.
pub fn run_capture<I, S>(program: &Path, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} exited with {}: {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `n` lines of a text file (for error messages), or a note that it is unreadable.
pub fn tail_file(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            lines[start..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Raises this process's soft RLIMIT_NOFILE to at least `want` (capped by the hard
/// limit). Returns the resulting soft limit. Children inherit it.
// rlim_t is u64 on 64-bit Linux but not everywhere; keep the conversions explicit.
#[allow(clippy::useless_conversion, clippy::unnecessary_fallible_conversions)]
pub fn raise_nofile(want: u64) -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error()).context("getrlimit(RLIMIT_NOFILE)");
    }
    let current = u64::from(lim.rlim_cur);
    if current >= want {
        return Ok(current);
    }
    let target = want.min(u64::from(lim.rlim_max));
    if target > current {
        lim.rlim_cur = libc::rlim_t::try_from(target).context("RLIMIT_NOFILE out of range")?;
        // SAFETY: valid pointer to an initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error()).context("setrlimit(RLIMIT_NOFILE)");
        }
    }
    Ok(target.max(current))
}

/// Reads VmRSS of `pid` in KiB from /proc/PID/status.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("VmRSS:") {
            let num = rest.split_whitespace().next().context("empty VmRSS line")?;
            return num
                .parse()
                .with_context(|| format!("parsing VmRSS value {num:?}"));
        }
    }
    bail!("no VmRSS in /proc/{pid}/status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(8).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
    }

    #[test]
    fn own_process_is_alive_and_has_rss() {
        let me = std::process::id();
        assert!(is_alive(me));
        let start = start_time(me).unwrap();
        assert!(is_alive_since(me, start));
        assert!(!is_alive_since(me, start + 1));
        assert!(rss_kib(me).unwrap() > 0);
        assert!(!is_alive(0));
    }

    #[test]
    fn output_within_returns_output_or_times_out() {
        let out = output_within(Command::new("echo").arg("hi"), Duration::from_secs(10)).unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hi\n");
        let started = Instant::now();
        let err =
            output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap_err();
        assert!(format!("{err:#}").contains("did not finish"), "{err:#}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_stopped_process_is_seen_as_stopped() {
        let pid = spawn_detached(Command::new("sleep").arg("60"), None).unwrap();
        assert!(!is_stopped(pid));
        signal(pid, libc::SIGSTOP).unwrap();
        assert!(crate::poll(Duration::from_secs(5), || is_stopped(pid).then_some(())).is_some());
        kill_now(pid).unwrap();
        assert!(!is_stopped(pid));
    }

    #[test]
    fn terminate_stops_a_child() {
        let pid = spawn_detached(Command::new("sleep").arg("60"), None).unwrap();
        assert!(is_alive_with(pid, "60"));
        assert!(!is_alive_with(pid, "6"));
        terminate(pid, Duration::from_secs(5)).unwrap();
        assert!(!is_alive(pid));
    }
}
