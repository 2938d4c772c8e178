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

/// The first port of this test process's own block of [`BLOCK`] loopback ports below the
/// ephemeral range (32768 and up). A port from the ephemeral range, freed and bound again
/// later, can be taken meanwhile as the local port of any connection another test
/// opens; below it, only another test's explicit choice could take it, and no two test
/// processes share a block: each holds a listener on its block's first port for as long
/// as it runs (the block's lock), and takes the first block whose lock it can bind.
fn block() -> u16 {
    static HELD: std::sync::OnceLock<(u16, std::net::TcpListener)> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        let blocks = (32_000 - 20_000) / BLOCK;
        let first = (std::process::id() % u32::from(blocks)) as u16;
        for i in 0..blocks {
            let start = 20_000 + ((first + i) % blocks) * BLOCK;
            if let Ok(lock) = std::net::TcpListener::bind(("127.0.0.1", start)) {
                return (start, lock);
            }
        }
        panic!("no free block of loopback ports below 32000")
    })
    .0
}

/// Ports in a test process's block (see [`block`]).
const BLOCK: u16 = 256;

/// A loopback port of this test process's block, free now, and different on each call;
/// `room` ports above it are this process's too.
pub fn low_port(room: u16) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(1);
    loop {
        let offset = NEXT.fetch_add(room + 1, Ordering::Relaxed);
        assert!(
            offset + room < BLOCK,
            "this test took more than its block of {BLOCK} ports"
        );
        let port = block() + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `holdfast lab up --dir DIR ARGS` on a base port below the ephemeral range whose layout
/// is free (a few tries); returns the base port. (The lab checks its proxies' ports but
/// binds them only when a test serves them, seconds later.)
pub fn lab_up(dir: &Path, args: &[&str]) -> u16 {
    for _ in 0..3 {
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

/// A process (`holdfast serve`, a browser) killed and reaped when dropped.
#[allow(dead_code)] // Not every test binary that shares this module starts one.
pub struct Serving(pub std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
