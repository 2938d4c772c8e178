//! Network cuts on loopback with nftables, for the chaos drill. holdfast's connections to
//! the nodes leave from [`HOLDFAST_SOURCE`] (`[proxy] backend_source_address`) and the
//! replicas' IO threads from 127.0.0.1, so rules on the primary's port tell them apart:
//! a cut of holdfast from the primary (the replicas still see it) or of the replicas from
//! the primary (holdfast still sees it). Only the lab's own node ports on `lo` are touched
//! (other labs on the machine are not), in a table of the drill's own
//! (`inet holdfast_chaos_<base port>`), deleted when the [`Firewall`] is dropped (also on a
//! panic) and on Ctrl-C / SIGTERM.

use std::net::IpAddr;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

/// The address holdfast's connections to the nodes leave from in the chaos lab.
pub const HOLDFAST_SOURCE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 9));

/// Which side of the primary is cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// holdfast (every connection from [`HOLDFAST_SOURCE`]).
    Holdfast,
    /// Everyone else: the replicas' IO threads.
    Replicas,
}

/// How packets are cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Silently dropped: what a real partition does (TCP retransmits, then times out).
    Drop,
    /// Answered with a TCP reset: the peer learns at once.
    Reject,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Drop => "DROP",
            Mode::Reject => "REJECT",
        }
    }
}

/// Tables to delete on Ctrl-C / SIGTERM.
static TABLES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The drill's nftables table, with one chain on the output hook (loopback packets all
/// pass it once, in each direction).
pub struct Firewall {
    table: String,
}

fn nft(args: &[&str]) -> Result<()> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .context("running nft (apt-get install nftables)")?;
    if !out.status.success() {
        bail!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn delete_table(table: &str) {
    let _ = nft(&["delete", "table", "inet", table]);
}

impl Firewall {
    /// Creates the table (deleting one a killed earlier run left behind); an error when
    /// nftables cannot be used here (not installed, not root).
    pub fn new(base_port: u16) -> Result<Firewall> {
        let table = format!("holdfast_chaos_{base_port}");
        delete_table(&table);
        nft(&["add", "table", "inet", &table])?;
        let fw = Firewall { table };
        nft(&[
            "add",
            "chain",
            "inet",
            &fw.table,
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ])?;
        let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if tables.is_empty() {
            watch_signals();
        }
        tables.push(fw.table.clone());
        Ok(fw)
    }

    /// Cuts `side` off the node listening on `port`, both directions.
    pub fn cut(&self, side: Side, port: u16, mode: Mode) -> Result<()> {
        let (src, dst) = match side {
            Side::Holdfast => (
                format!("ip saddr {HOLDFAST_SOURCE}"),
                format!("ip daddr {HOLDFAST_SOURCE}"),
            ),
            Side::Replicas => (
                format!("ip saddr != {HOLDFAST_SOURCE}"),
                format!("ip daddr != {HOLDFAST_SOURCE}"),
            ),
        };
        // REJECT: the cut-off side gets a reset for each packet it sends the primary; the
        // primary's packets vanish (the resets pass), so its side of each connection stays
        // open, as behind a firewall that rejects one way.
        let (to, from) = match mode {
            Mode::Drop => ("drop", "drop"),
            Mode::Reject => ("reject with tcp reset", "tcp flags & rst == 0 drop"),
        };
        for rule in [
            format!("oifname \"lo\" {src} tcp dport {port} {to}"),
            format!("oifname \"lo\" {dst} tcp sport {port} {from}"),
        ] {
            nft(&["add", "rule", "inet", &self.table, "out", &rule])?;
        }
        Ok(())
    }

    /// Removes every cut.
    pub fn heal(&self) -> Result<()> {
        nft(&["flush", "chain", "inet", &self.table, "out"])
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        delete_table(&self.table);
        TABLES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| *t != self.table);
    }
}

/// On Ctrl-C or SIGTERM: delete the tables, then exit as the signal would have.
fn watch_signals() {
    let spawned = std::thread::Builder::new()
        .name("chaos-signals".into())
        .spawn(|| {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                for t in TABLES.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    delete_table(t);
                }
                eprintln!("chaos: interrupted; nftables rules removed");
                std::process::exit(130);
            });
        });
    if let Err(e) = spawned {
        eprintln!("chaos: no signal watcher ({e}); on Ctrl-C run: nft delete table inet holdfast_chaos_<base port>");
    }
}
