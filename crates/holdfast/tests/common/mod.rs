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

/// `holdfast lab up --dir DIR ARGS` on a base port whose layout is free (a few tries);
/// returns the base port.
pub fn lab_up(dir: &Path, args: &[&str]) -> u16 {
    for _ in 0..10 {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if base > 65_000 {
            continue;
        }
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
