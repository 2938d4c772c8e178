//! What the process tests share: the built `holdfast` binary, and a lab on ports nobody
//! else uses, stopped and deleted when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The built `holdfast`, with no admin token or address from the environment.
pub fn holdfast() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.env_remove("HOLDFAST_ADMIN_TOKEN")
        .env_remove("HOLDFAST_ADMIN")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    cmd
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("running a command")
}

/// A loopback port below the ephemeral range (32768 and up), free now, and different on
/// each call in this process. A port from the ephemeral range, freed and bound again
/// later, can be taken meanwhile as the local port of any connection another test opens;
/// below it, only another test's explicit choice can take it (and its bind then fails
/// loudly). `room` ports above the one returned stay below the range too.
pub fn low_port(room: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = 12_000 - u32::from(room);
    for _ in 0..1_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let offset = std::process::id()
            .wrapping_mul(7_919)
            .wrapping_add(n.wrapping_mul(613))
            % span;
        let port = 20_000 + offset as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below 32000")
}

/// `holdfast lab up --dir DIR ARGS` on a base port below the ephemeral range whose layout
/// is free (a few tries); returns the base port. (The lab checks its proxies' ports but
/// binds them only when a test serves them, seconds later.)
pub fn lab_up(dir: &Path, args: &[&str]) -> u16 {
    for _ in 0..20 {
        let base = low_port(64);
        let out = run(holdfast()
            .args(["lab", "up"])
            .args(args)
            .arg("--dir")
            .arg(dir)
            .args(["--base-port", &base.to_string()]));
        if out.status.success() {
            return base;
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("is in use"), "lab up failed: {why}");
    }
    panic!("no free port layout for a lab");
}

/// A lab directory: its servers are thawed (a failed run may leave one frozen, and `lab
/// down` would wait for it), stopped and deleted when dropped.
pub struct Lab(pub PathBuf);

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-CONT", "-f", "--"])
            .arg(format!("--datadir={}/node", self.0.display()))
            .status();
        let _ = run(holdfast()
            .args(["lab", "down", "--purge", "--dir"])
            .arg(&self.0));
    }
}
