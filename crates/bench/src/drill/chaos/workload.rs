//! The chaos drill's clients: one thread each, logged in through holdfast's main or split
//! listener, running list-append transactions (at SERIALIZABLE) or bank transfers and
//! balance reads, text or prepared, autocommit or in transactions, and recording every
//! operation until stopped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mysql::prelude::Queryable;
use mysql::{Conn, OptsBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::history::{Body, Listener, Mop, Op, OpError, Outcome};
use super::txn::{self, BANK_TABLE, LEDGER_TABLE, LIST_TABLE};

/// Bank accounts and each one's starting balance.
pub const ACCOUNTS: u32 = 8;
pub const INITIAL_BALANCE: i64 = 100;
/// The keys written move on every `KEY_SPAN` appends (lists stay short), over a window of
/// `KEY_WINDOW` keys.
const KEY_SPAN: u64 = 150;
const KEY_WINDOW: u32 = 6;
/// Driver timeouts: longer than any failover holdfast should hide.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two operations of one client.
const PAUSE: Duration = Duration::from_millis(2);

/// Where the clients log in.
#[derive(Clone, Debug)]
pub struct Target {
    pub host: String,
    pub main_port: u16,
    pub split_port: u16,
    pub user: String,
    pub password: String,
}

impl Target {
    fn connect(&self, port: u16) -> mysql::Result<Conn> {
        let opts = OptsBuilder::new()
            .ip_or_hostname(Some(self.host.clone()))
            .tcp_port(port)
            // The driver would otherwise ask the server for its unix socket and log in
            // there directly, past holdfast.
            .prefer_socket(false)
            .user(Some(self.user.clone()))
            .pass(Some(self.password.clone()))
            .read_timeout(Some(IO_TIMEOUT))
            .write_timeout(Some(IO_TIMEOUT))
            .tcp_connect_timeout(Some(IO_TIMEOUT));
        Conn::new(opts)
    }
}

/// Makes the tables (through the main listener): empty lists, the bank's accounts.
/// Returns the bank's total.
pub fn prepare(t: &Target) -> Result<i64> {
    let mut c = t
        .connect(t.main_port)
        .context("logging in through holdfast")?;
    for sql in [
        "CREATE DATABASE IF NOT EXISTS chaos".to_string(),
        format!("DROP TABLE IF EXISTS {LIST_TABLE}, {BANK_TABLE}, {LEDGER_TABLE}"),
        format!("CREATE TABLE {LIST_TABLE} (k INT PRIMARY KEY, v TEXT NOT NULL) ENGINE=InnoDB"),
        format!(
            "CREATE TABLE {BANK_TABLE} (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE {LEDGER_TABLE} (transfer BIGINT NOT NULL, account INT NOT NULL, \
             delta BIGINT NOT NULL, PRIMARY KEY (transfer, account)) ENGINE=InnoDB"
        ),
        format!(
            "INSERT INTO {BANK_TABLE} (id, balance) VALUES {}",
            (0..ACCOUNTS)
                .map(|id| format!("({id}, {INITIAL_BALANCE})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ] {
        c.query_drop(&sql)
            .with_context(|| format!("preparing: {sql}"))?;
    }
    Ok(i64::from(ACCOUNTS) * INITIAL_BALANCE)
}

/// The running clients.
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Op>>>,
}

impl Workload {
    /// Starts `clients` clients: every fourth a bank client, every other one on the split
    /// listener. Times are measured from `epoch`.
    pub fn start(t: &Target, clients: u32, seed: u64, epoch: Instant) -> Result<Workload> {
        let stop = Arc::new(AtomicBool::new(false));
        let appends = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for id in 0..clients {
            let c = Client {
                id,
                listener: match id % 2 {
                    0 => Listener::Main,
                    _ => Listener::Split,
                },
                bank: id % 4 == 3,
                target: t.clone(),
                rng: StdRng::seed_from_u64(
                    seed ^ (u64::from(id) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
                stop: stop.clone(),
                appends: appends.clone(),
                epoch,
                seq: 0,
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("chaos-client-{id}"))
                    .spawn(move || c.run())
                    .context("starting a client thread")?,
            );
        }
        Ok(Workload { stop, threads })
    }

    /// Stops the clients (each finishes its operation) and returns the whole history.
    pub fn finish(self) -> Result<Vec<Op>> {
        self.stop.store(true, Ordering::SeqCst);
        let mut ops = Vec::new();
        for t in self.threads {
            ops.extend(
                t.join()
                    .map_err(|_| anyhow::anyhow!("a client thread panicked"))?,
            );
        }
        ops.sort_by_key(|o| (o.start_ms, o.client));
        Ok(ops)
    }
}

struct Client {
    id: u32,
    listener: Listener,
    bank: bool,
    target: Target,
    rng: StdRng,
    stop: Arc<AtomicBool>,
    appends: Arc<AtomicU64>,
    epoch: Instant,
    seq: u64,
}

impl Client {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn run(mut self) -> Vec<Op> {
        let mut history = Vec::new();
        let mut conn: Option<Conn> = None;
        let port = match self.listener {
            Listener::Main => self.target.main_port,
            Listener::Split => self.target.split_port,
        };
        while !self.stop.load(Ordering::SeqCst) {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => match self.login(port) {
                    Ok(c) => conn.insert(c),
                    Err(op) => {
                        history.push(*op);
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                },
            };
            let (mut body, explicit, read_only) = self.next_body();
            let prepared = self.rng.gen_bool(0.5);
            let start_ms = self.now();
            let result = txn::execute(c, &mut body, explicit, read_only, prepared);
            let end_ms = self.now();
            let (outcome, error) = match result {
                Ok(()) => (Outcome::Ok, None),
                Err(f) => {
                    if f.broken {
                        conn = None;
                    }
                    (f.outcome, Some(f.error))
                }
            };
            history.push(Op {
                client: self.id,
                listener: self.listener,
                prepared,
                explicit,
                start_ms,
                end_ms,
                body,
                outcome,
                error,
            });
            std::thread::sleep(PAUSE);
        }
        history
    }

    /// Logs in (list-append clients at SERIALIZABLE); a failure is recorded as an operation.
    fn login(&mut self, port: u16) -> Result<Conn, Box<Op>> {
        let start_ms = self.now();
        let result = self.target.connect(port).and_then(|mut c| {
            if !self.bank {
                c.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")?;
            }
            Ok(c)
        });
        result.map_err(|e| {
            let code = match &e {
                mysql::Error::MySqlError(m) => m.code,
                _ => 0,
            };
            Box::new(Op {
                client: self.id,
                listener: self.listener,
                prepared: false,
                explicit: false,
                start_ms,
                end_ms: self.now(),
                body: Body::Connect,
                outcome: Outcome::Fail,
                error: Some(OpError {
                    code,
                    message: format!("login: {e}"),
                    at_commit: false,
                }),
            })
        })
    }

    /// The next operation: its body, whether in a transaction, whether read-only.
    fn next_body(&mut self) -> (Body, bool, bool) {
        if self.bank {
            if self.rng.gen_bool(0.5) {
                let from = self.rng.gen_range(0..ACCOUNTS);
                let to = (from + self.rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                let amount = self.rng.gen_range(1..=20);
                self.seq += 1;
                let id = (u64::from(self.id) + 1) * 1_000_000_000 + self.seq;
                return (
                    Body::Transfer {
                        id,
                        from,
                        to,
                        amount,
                    },
                    true,
                    false,
                );
            }
            let explicit = self.rng.gen_bool(0.5);
            return (Body::Balances(None), explicit, explicit);
        }
        let explicit = self.rng.gen_bool(0.6);
        let n = match explicit {
            true => self.rng.gen_range(1..=4),
            false => 1,
        };
        let mut mops = Vec::new();
        for _ in 0..n {
            let base = self.appends.load(Ordering::Relaxed) / KEY_SPAN * 2;
            let key = u32::try_from(base).unwrap_or(u32::MAX - KEY_WINDOW)
                + self.rng.gen_range(0..KEY_WINDOW);
            if self.rng.gen_bool(0.5) {
                self.seq += 1;
                self.appends.fetch_add(1, Ordering::Relaxed);
                let value = (u64::from(self.id) + 1) * 1_000_000_000 + self.seq;
                mops.push(Mop::Append { key, value });
            } else {
                mops.push(Mop::Read { key, list: None });
            }
        }
        let read_only = explicit && mops.iter().all(|m| matches!(m, Mop::Read { .. }));
        (Body::List(mops), explicit, read_only)
    }
}
