//! An etcd of its own for a fleet of holdfast processes (`[cluster]`): Debian's
//! `etcd-server`, one member, on loopback ports, its data in a directory given. Stopped
//! (killed) when dropped.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Etcd {
    child: Child,
    dir: PathBuf,
    /// Where clients connect: `http://127.0.0.1:PORT`.
    pub endpoint: String,
    peer: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// etcd with its data under `dir`, listening on `client` and `peer` (its log appended to
/// `dir/etcd.log`).
fn spawn(dir: &Path, client: &str, peer: &str) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("etcd.log"))?;
    Command::new("etcd")
        .args(["--name", "lab", "--data-dir"])
        .arg(dir.join("etcd-data"))
        .args([
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
        ])
        .args([
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
        ])
        .args(["--initial-cluster", &format!("lab={peer}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting etcd (Debian's etcd-server package)")
}

impl Etcd {
    /// Starts etcd with its data under `dir` (created), on free loopback ports, and waits
    /// until it answers.
    pub fn start(dir: &Path) -> Result<Etcd> {
        Etcd::start_on(dir, free_port()?, free_port()?)
    }

    /// [`Etcd::start`] on the loopback ports given: a test that stops etcd and starts it
    /// again picks ports no connection can take from the ephemeral range meanwhile.
    pub fn start_on(dir: &Path, client_port: u16, peer_port: u16) -> Result<Etcd> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = spawn(dir, &client, &peer)?;
        let etcd = Etcd {
            child,
            dir: dir.to_path_buf(),
            endpoint: client,
            peer,
        };
        etcd.wait_listening()?;
        Ok(etcd)
    }

    fn wait_listening(&self) -> Result<()> {
        let address = self.endpoint.trim_start_matches("http://").to_string();
        crate::wait_for("etcd to listen", Duration::from_secs(30), || {
            std::net::TcpStream::connect(&address).ok()
        })?;
        Ok(())
    }

    /// Starts it again after [`Etcd::kill`]: the same data, the same ports.
    pub fn start_again(&mut self) -> Result<()> {
        self.child = spawn(&self.dir, &self.endpoint, &self.peer)?;
        self.wait_listening()
    }

    /// Stops it now (a test of a fleet without etcd).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its data directory's parent, as given.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
