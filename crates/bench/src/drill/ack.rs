//! The drills' own writers, which know what was acknowledged: beside sysbench, a few
//! connections through holdfast write numbered rows (autocommit inserts, and transactions
//! of two inserts) and note each one whose OK (or whose COMMIT's OK) they got. After the
//! event every acknowledged row is looked for on the primary: one missing is an
//! acknowledged write lost, one there twice a write applied twice. The table has no key
//! that would refuse a second copy, and no auto-increment column: a transaction replayed
//! while others insert would get other ids than the client saw, and be refused (1213).
//! sysbench's own transactions show that cost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use holdfast_client::{Client, ClientError};
use holdfast_lab::LabStatus;

pub const WRITERS: u32 = 4;
/// Between two writes of one writer: the writers check, sysbench loads.
const PAUSE: Duration = Duration::from_millis(5);
const TABLE: &str = "sbtest.drill_ack";

/// What the writers saw and what the primary has.
#[derive(Debug, Default, Clone)]
pub struct AckReport {
    pub acknowledged: u64,
    /// Acknowledged, not on the primary after the event.
    pub lost: u64,
    /// On the primary more than once.
    pub duplicated: u64,
    /// Errors the writers got (a statement not acknowledged), by code (0: not a server
    /// error: the connection).
    pub errors: HashMap<u16, u64>,
}

impl AckReport {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// The writers, running until [`Writers::finish`].
pub struct Writers {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Vec<Outcome>>>,
    /// Where the acknowledged rows are looked for: holdfast's main listener, which sends
    /// every statement to the primary (through a split listener a new session's read goes
    /// to a replica, which may not have the last rows yet: they looked lost).
    check_addr: String,
    user: String,
    password: String,
}

#[derive(Debug, Default)]
pub struct Outcome {
    writer: u32,
    acknowledged: Vec<u32>,
    errors: HashMap<u16, u64>,
}

impl Writers {
    /// Empties the table (through holdfast: on whichever node is the primary now) and
    /// starts the writers against holdfast at `addr`.
    pub fn start(lab: &LabStatus, addr: &str) -> Result<Writers> {
        let (user, password) = (lab.app_user.clone(), lab.app_password.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let mut c = Client::connect_native(
                addr,
                &user,
                &password,
                Some("sbtest"),
                Duration::from_secs(30),
            )
            .await?;
            c.query(&format!(
                "CREATE TABLE IF NOT EXISTS {TABLE} (writer INT NOT NULL, n INT NOT NULL, \
                 KEY (writer, n))"
            ))
            .await?;
            c.query(&format!("TRUNCATE TABLE {TABLE}")).await?;
            anyhow::Ok(())
        })
        .context("preparing the writers' table through holdfast")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, addr, user, password) = (
                stop.clone(),
                addr.to_string(),
                user.clone(),
                password.clone(),
            );
            std::thread::spawn(move || -> Result<Vec<Outcome>> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let tasks: Vec<_> = (0..WRITERS)
                        .map(|w| {
                            tokio::spawn(write(
                                w,
                                addr.clone(),
                                user.clone(),
                                password.clone(),
                                stop.clone(),
                            ))
                        })
                        .collect();
                    let mut outcomes = Vec::new();
                    for t in tasks {
                        outcomes.push(t.await.context("a writer panicked")?);
                    }
                    Ok(outcomes)
                })
            })
        };
        Ok(Writers {
            stop,
            thread,
            check_addr: lab.proxy.clone(),
            user,
            password,
        })
    }

    /// Stops the writers and checks every acknowledged row on the primary (read through
    /// holdfast, once it answers).
    pub fn finish(self) -> Result<AckReport> {
        self.stop.store(true, Ordering::SeqCst);
        let outcomes = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the writers' thread panicked"))??;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let present: HashMap<(u32, u32), u64> = rt.block_on(async {
            let mut c = Client::connect_native(
                &self.check_addr,
                &self.user,
                &self.password,
                Some("sbtest"),
                Duration::from_secs(30),
            )
            .await
            .context("logging in to check the acknowledged writes")?;
            let r = c
                .query(&format!(
                    "SELECT writer, n, COUNT(*) FROM {TABLE} GROUP BY writer, n"
                ))
                .await
                .context("reading the writers' rows")?;
            let mut present = HashMap::new();
            for row in r.rows {
                let at = |i: usize| {
                    row.get(i)
                        .cloned()
                        .flatten()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                present.insert((at(0) as u32, at(1) as u32), at(2));
            }
            anyhow::Ok(present)
        })?;
        let mut report = AckReport::default();
        for o in outcomes {
            report.acknowledged += o.acknowledged.len() as u64;
            for n in &o.acknowledged {
                if !present.contains_key(&(o.writer, *n)) {
                    report.lost += 1;
                }
            }
            for (code, k) in o.errors {
                *report.errors.entry(code).or_default() += k;
            }
        }
        report.duplicated = present.values().filter(|&&k| k > 1).count() as u64;
        Ok(report)
    }
}

/// One writer: autocommit inserts and two-insert transactions, in turn.
async fn write(
    writer: u32,
    addr: String,
    user: String,
    password: String,
    stop: Arc<AtomicBool>,
) -> Outcome {
    let mut outcome = Outcome {
        writer,
        ..Outcome::default()
    };
    let mut client: Option<Client> = None;
    let mut n = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let c = match client.as_mut() {
            Some(c) => c,
            None => {
                match Client::connect_native(
                    &addr,
                    &user,
                    &password,
                    Some("sbtest"),
                    Duration::from_secs(30),
                )
                .await
                {
                    Ok(c) => client.insert(c),
                    Err(e) => {
                        note(&mut outcome, &e);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
        let result = if n % 2 == 0 {
            n += 1;
            autocommit(c, writer, n).await.map(|()| vec![n])
        } else {
            n += 2;
            transaction(c, writer, n - 1).await.map(|()| vec![n - 1, n])
        };
        match result {
            Ok(rows) => outcome.acknowledged.extend(rows),
            Err(e) => {
                if !matches!(e, ClientError::Server { .. }) {
                    client = None;
                }
                note(&mut outcome, &e);
            }
        }
        tokio::time::sleep(PAUSE).await;
    }
    outcome
}

async fn autocommit(c: &mut Client, writer: u32, n: u32) -> Result<(), ClientError> {
    c.query(&format!(
        "INSERT INTO {TABLE} (writer, n) VALUES ({writer}, {n})"
    ))
    .await
    .map(|_| ())
}

async fn transaction(c: &mut Client, writer: u32, first: u32) -> Result<(), ClientError> {
    let result = async {
        c.query("BEGIN").await?;
        for n in [first, first + 1] {
            c.query(&format!(
                "INSERT INTO {TABLE} (writer, n) VALUES ({writer}, {n})"
            ))
            .await?;
        }
        c.query("COMMIT").await.map(|_| ())
    }
    .await;
    if result.is_err() {
        // Whatever is left of it goes; the next transaction starts clean.
        let _ = c.query("ROLLBACK").await;
    }
    result
}

fn note(outcome: &mut Outcome, e: &ClientError) {
    let code = match e {
        ClientError::Server { code, .. } => *code,
        _ => 0,
    };
    *outcome.errors.entry(code).or_default() += 1;
}
