//! The durable usage ledger: per-second usage rolled up per billing period into SQLite rows
//! that survive restarts and crashes.
//!
//! A [`Meter`] per instance accumulates one-second [`UsageSample`]s into the open period's
//! [`UsageLine`] in memory and tells the caller which lines to persist: every settled line at
//! once, and the open line every `flush_every` samples. The [`Ledger`] stores lines as totals
//! (never deltas), so writing a line twice is harmless and a restart simply resumes the open
//! row. A crash loses at most the unflushed seconds of the open period, never a settled row:
//! the database runs in WAL mode with `synchronous=FULL`, so a committed write is on disk.
//!
//! Startup sequence: [`Ledger::open`], [`Ledger::settle_stale`] with the current time (periods
//! that ended while holdfast was down are final), then [`Ledger::open_line`] per instance to
//! resume the current period with [`Meter::new`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};

/// Schema version stored in `PRAGMA user_version`; bump with a migration step in `migrate`.
const SCHEMA_VERSION: i64 = 1;

/// Default number of samples between two writes of the open line.
const DEFAULT_FLUSH_EVERY: u32 = 10;

const SECS_PER_HOUR: f64 = 3600.0;
const BYTES_PER_GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// How long a call waits for another connection's write lock (another holdfast process or a
/// billing export reading the file) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// One second of an instance's life, as the lifecycle observed it.
#[derive(Debug, Clone, Copy)]
pub struct UsageSample {
    /// The second being recorded, in whole unix seconds.
    pub at_unix: i64,
    /// Whether the instance was running (billed compute) rather than paused.
    pub running: bool,
    /// The current size in CCU; counts only while running.
    pub ccu: f64,
    /// The data size, when it was measured this second; otherwise the last known value counts.
    pub storage_bytes: Option<u64>,
}

/// Usage of one instance during one billing period. Deserializable so a client of the admin
/// API can render a bill from the JSON it received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    pub instance: String,
    /// Unix seconds, aligned to `period_secs`.
    pub period_start: i64,
    pub period_secs: u32,
    pub running_secs: u32,
    pub paused_secs: u32,
    /// Sum of the size in CCU over the running seconds.
    pub ccu_seconds: f64,
    /// Sum of the data size over all recorded seconds, running or paused.
    pub storage_byte_seconds: f64,
    /// The last known data size.
    pub storage_bytes_last: u64,
    /// The period is over and the row is final.
    pub settled: bool,
}

impl UsageLine {
    /// Compute used, in CCU-hours.
    pub fn ccu_hours(&self) -> f64 {
        self.ccu_seconds / SECS_PER_HOUR
    }

    /// Storage used, in GiB-hours.
    pub fn storage_gib_hours(&self) -> f64 {
        self.storage_byte_seconds / BYTES_PER_GIB / SECS_PER_HOUR
    }

    /// The first second after the period.
    pub fn period_end(&self) -> i64 {
        self.period_start
            .saturating_add(i64::from(self.period_secs))
    }

    fn empty(instance: &str, period_start: i64, period_secs: u32, storage_bytes: u64) -> Self {
        UsageLine {
            instance: instance.to_string(),
            period_start,
            period_secs,
            running_secs: 0,
            paused_secs: 0,
            ccu_seconds: 0.0,
            storage_byte_seconds: 0.0,
            storage_bytes_last: storage_bytes,
            settled: false,
        }
    }
}

/// The start of the period holding `at_unix` (periods are aligned to the unix epoch, so every
/// holdfast process, before and after a restart, cuts them the same way).
fn period_start_of(at_unix: i64, period_secs: u32) -> i64 {
    let period = i64::from(period_secs.max(1));
    at_unix.div_euclid(period).saturating_mul(period)
}

/// In-memory accumulator for one instance: the open period.
///
/// Each sample counts as one second; the caller samples once per second and decides what a
/// missed or doubled tick means.
#[derive(Debug, Clone)]
pub struct Meter {
    instance: String,
    period_secs: u32,
    flush_every: u32,
    open: Option<UsageLine>,
    /// Samples added to the open line since it was last returned for persisting.
    unflushed: u32,
    /// The last known data size, carried across seconds and periods without a measurement.
    storage_bytes: u64,
}

impl Meter {
    /// A meter cutting usage into `period_secs` periods (at least 1).
    ///
    /// `resume` is the open row found in the ledger at start-up: samples in its period keep
    /// adding to its totals; the first sample of a later period settles it instead. A settled
    /// line or one for another instance is not resumed.
    pub fn new(instance: &str, period_secs: u32, resume: Option<UsageLine>) -> Self {
        let resume = resume.filter(|line| {
            let usable = !line.settled && line.instance == instance;
            if !usable {
                tracing::warn!(
                    instance,
                    line_instance = %line.instance,
                    settled = line.settled,
                    "usage meter does not resume a settled or foreign ledger row"
                );
            }
            usable
        });
        Meter {
            instance: instance.to_string(),
            period_secs: period_secs.max(1),
            flush_every: DEFAULT_FLUSH_EVERY,
            storage_bytes: resume.as_ref().map_or(0, |line| line.storage_bytes_last),
            open: resume,
            unflushed: 0,
        }
    }

    /// Adds a one-second sample. Returns the lines to persist now: a settled line when the
    /// sample starts a new period (the old period closes; periods with no samples at all
    /// produce no rows) — and the open line when `flush_every` samples have passed since its
    /// last flush (so a crash loses at most that many seconds of the open period and never a
    /// settled row).
    ///
    /// A sample older than the open period (the wall clock stepped back) is counted in the open
    /// period: settled periods are final.
    pub fn add(&mut self, s: &UsageSample) -> Vec<UsageLine> {
        let mut out = Vec::new();
        let period_secs = self.period_secs;
        let start = period_start_of(s.at_unix, period_secs);
        let ended = self
            .open
            .take_if(|line| line.period_secs != period_secs || start > line.period_start);
        if let Some(mut done) = ended {
            done.settled = true;
            out.push(done);
            self.unflushed = 0;
        }

        if let Some(bytes) = s.storage_bytes {
            self.storage_bytes = bytes;
        }
        let storage_bytes = self.storage_bytes;
        let instance = &self.instance;
        let line = self
            .open
            .get_or_insert_with(|| UsageLine::empty(instance, start, period_secs, storage_bytes));
        if s.running {
            line.running_secs = line.running_secs.saturating_add(1);
            if s.ccu.is_finite() && s.ccu >= 0.0 {
                line.ccu_seconds += s.ccu;
            } else {
                tracing::debug!(instance = %line.instance, ccu = s.ccu, "unusable CCU sample counted as 0");
            }
        } else {
            line.paused_secs = line.paused_secs.saturating_add(1);
        }
        line.storage_bytes_last = storage_bytes;
        // Exact up to 2^53 byte-seconds (2.5 TB held for an hour); past that, the relative
        // rounding error stays around 1e-16, far below what a bill shows.
        line.storage_byte_seconds += storage_bytes as f64;

        self.unflushed = self.unflushed.saturating_add(1);
        if self.unflushed >= self.flush_every {
            out.push(line.clone());
            self.unflushed = 0;
        }
        out
    }

    /// The period being accumulated, if any sample (or a resumed row) opened one. Persist it
    /// on a clean shutdown so nothing is lost.
    pub fn open_line(&self) -> Option<&UsageLine> {
        self.open.as_ref()
    }

    /// How many samples may pass between two writes of the open line (at least 1).
    pub fn set_flush_every(&mut self, secs: u32) {
        self.flush_every = secs.max(1);
    }
}

/// Why the ledger could not be read or written. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("usage ledger {}: cannot create directory {}: {source}", path.display(), dir.display())]
    CreateDir {
        path: PathBuf,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("usage ledger {}: {op} failed: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        op: &'static str,
        source: rusqlite::Error,
    },
    #[error(
        "usage ledger {}: schema version {found} is newer than the {supported} this holdfast \
         understands; refusing to touch it",
        path.display()
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("usage ledger {}: unreadable row: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error("usage ledger {}: refusing to write a line for {instance:?}: {detail}", path.display())]
    InvalidLine {
        path: PathBuf,
        instance: String,
        detail: String,
    },
}

const COLUMNS: &str = "instance, period_start, period_secs, running_secs, paused_secs, \
                       ccu_seconds, storage_byte_seconds, storage_bytes_last, settled";

/// The usage rows in SQLite.
///
/// Wraps one connection in a std mutex: every call is a short statement or transaction, so an
/// async caller may run it inline or via `spawn_blocking`.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl Ledger {
    /// Opens (creating the directories, file and schema if needed) the ledger at `path`, in WAL
    /// mode with `synchronous=FULL` so a committed row survives a crash or power loss.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| LedgerError::CreateDir {
                path: path.to_path_buf(),
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let sqlite = |op: &'static str| {
            move |source| LedgerError::Sqlite {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        let mut conn = Connection::open(path).map_err(sqlite("open"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite("set busy timeout"))?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(sqlite("enable WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "usage ledger is not in WAL mode");
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sqlite("set synchronous=FULL"))?;
        migrate(&mut conn, path)?;
        Ok(Ledger {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    /// The file this ledger lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a line's totals. Idempotent: writing the same line again changes nothing, and a
    /// settled row is final, so writes to it (late or repeated) are ignored.
    pub fn upsert(&self, line: &UsageLine) -> Result<(), LedgerError> {
        self.check(line)?;
        let storage_bytes_last = i64::try_from(line.storage_bytes_last).unwrap_or(i64::MAX);
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "INSERT INTO usage_period ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (instance, period_start, period_secs) DO UPDATE SET
                     running_secs = excluded.running_secs,
                     paused_secs = excluded.paused_secs,
                     ccu_seconds = excluded.ccu_seconds,
                     storage_byte_seconds = excluded.storage_byte_seconds,
                     storage_bytes_last = excluded.storage_bytes_last,
                     settled = excluded.settled
                 WHERE usage_period.settled = 0"
            ))
            .map_err(self.sqlite("prepare upsert"))?;
        stmt.execute(params![
            line.instance,
            line.period_start,
            line.period_secs,
            line.running_secs,
            line.paused_secs,
            line.ccu_seconds,
            line.storage_byte_seconds,
            storage_bytes_last,
            line.settled,
        ])
        .map_err(self.sqlite("upsert"))?;
        Ok(())
    }

    /// The latest unsettled row of `instance`: the period to resume after a restart.
    pub fn open_line(&self, instance: &str) -> Result<Option<UsageLine>, LedgerError> {
        let conn = self.conn();
        let raw = conn
            .query_row(
                &format!(
                    "SELECT {COLUMNS} FROM usage_period WHERE instance = ?1 AND settled = 0
                     ORDER BY period_start DESC, period_secs DESC LIMIT 1"
                ),
                params![instance],
                RawLine::read,
            )
            .optional()
            .map_err(self.sqlite("read open line"))?;
        raw.map(|raw| raw.into_line(&self.path)).transpose()
    }

    /// Marks unsettled rows whose period ended at or before `now_unix` as settled (after a
    /// crash or restart nothing will add to them any more). Returns how many were settled.
    pub fn settle_stale(&self, now_unix: i64) -> Result<usize, LedgerError> {
        self.conn()
            .execute(
                "UPDATE usage_period SET settled = 1
                 WHERE settled = 0 AND period_start + period_secs <= ?1",
                params![now_unix],
            )
            .map_err(self.sqlite("settle stale rows"))
    }

    /// Rows of one instance (or all), of periods starting at or after `since_unix` (or all),
    /// ordered by instance, then period start. Filtering on the start keeps successive bills
    /// from counting a period twice.
    pub fn lines(
        &self,
        instance: Option<&str>,
        since_unix: Option<i64>,
    ) -> Result<Vec<UsageLine>, LedgerError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM usage_period
                 WHERE (?1 IS NULL OR instance = ?1) AND (?2 IS NULL OR period_start >= ?2)
                 ORDER BY instance, period_start, period_secs"
            ))
            .map_err(self.sqlite("prepare line query"))?;
        let raws = stmt
            .query_map(params![instance, since_unix], RawLine::read)
            .map_err(self.sqlite("query lines"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sqlite("read lines"))?;
        raws.into_iter()
            .map(|raw| raw.into_line(&self.path))
            .collect()
    }

    /// The connection. A panic while it was held cannot leave a transaction half-applied
    /// (rusqlite rolls back on drop), so a poisoned lock is still safe to use.
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sqlite(&self, op: &'static str) -> impl FnOnce(rusqlite::Error) -> LedgerError + '_ {
        move |source| LedgerError::Sqlite {
            path: self.path.clone(),
            op,
            source,
        }
    }

    /// Rejects lines that would make a bill wrong rather than storing them.
    fn check(&self, line: &UsageLine) -> Result<(), LedgerError> {
        let invalid = |detail: String| LedgerError::InvalidLine {
            path: self.path.clone(),
            instance: line.instance.clone(),
            detail,
        };
        if line.period_secs == 0 {
            return Err(invalid("period_secs is 0".to_string()));
        }
        if period_start_of(line.period_start, line.period_secs) != line.period_start {
            return Err(invalid(format!(
                "period start {} is not aligned to {}s periods",
                line.period_start, line.period_secs
            )));
        }
        for (name, value) in [
            ("ccu_seconds", line.ccu_seconds),
            ("storage_byte_seconds", line.storage_byte_seconds),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(format!("{name} is {value}")));
            }
        }
        Ok(())
    }
}

/// Creates or upgrades the schema inside one immediate transaction, so two processes opening a
/// new file at once cannot both create it.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), LedgerError> {
    let sqlite = |op: &'static str| {
        move |source| LedgerError::Sqlite {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite("begin schema transaction"))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(sqlite("read schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(LedgerError::SchemaTooNew {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < 1 {
        tx.execute_batch(
            "CREATE TABLE usage_period (
                 instance TEXT NOT NULL,
                 period_start INTEGER NOT NULL,
                 period_secs INTEGER NOT NULL CHECK (period_secs > 0),
                 running_secs INTEGER NOT NULL CHECK (running_secs >= 0),
                 paused_secs INTEGER NOT NULL CHECK (paused_secs >= 0),
                 ccu_seconds REAL NOT NULL CHECK (ccu_seconds >= 0),
                 storage_byte_seconds REAL NOT NULL CHECK (storage_byte_seconds >= 0),
                 storage_bytes_last INTEGER NOT NULL CHECK (storage_bytes_last >= 0),
                 settled INTEGER NOT NULL CHECK (settled IN (0, 1)),
                 PRIMARY KEY (instance, period_start, period_secs)
             ) WITHOUT ROWID;
             CREATE INDEX usage_period_open ON usage_period (instance, period_start)
                 WHERE settled = 0;
             PRAGMA user_version = 1;",
        )
        .map_err(sqlite("create schema"))?;
    }
    tx.commit().map_err(sqlite("commit schema"))
}

/// A row as stored, before range checks.
struct RawLine {
    instance: String,
    period_start: i64,
    period_secs: i64,
    running_secs: i64,
    paused_secs: i64,
    ccu_seconds: f64,
    storage_byte_seconds: f64,
    storage_bytes_last: i64,
    settled: bool,
}

impl RawLine {
    fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawLine> {
        Ok(RawLine {
            instance: row.get(0)?,
            period_start: row.get(1)?,
            period_secs: row.get(2)?,
            running_secs: row.get(3)?,
            paused_secs: row.get(4)?,
            ccu_seconds: row.get(5)?,
            storage_byte_seconds: row.get(6)?,
            storage_bytes_last: row.get(7)?,
            settled: row.get(8)?,
        })
    }

    fn into_line(self, path: &Path) -> Result<UsageLine, LedgerError> {
        let corrupt = |column: &str, value: i64| LedgerError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "{} period {}: {column} {value} out of range",
                self.instance, self.period_start
            ),
        };
        let secs =
            |column: &str, value: i64| u32::try_from(value).map_err(|_| corrupt(column, value));
        Ok(UsageLine {
            period_secs: secs("period_secs", self.period_secs)?,
            running_secs: secs("running_secs", self.running_secs)?,
            paused_secs: secs("paused_secs", self.paused_secs)?,
            storage_bytes_last: u64::try_from(self.storage_bytes_last)
                .map_err(|_| corrupt("storage_bytes_last", self.storage_bytes_last))?,
            period_start: self.period_start,
            ccu_seconds: self.ccu_seconds,
            storage_byte_seconds: self.storage_byte_seconds,
            settled: self.settled,
            instance: self.instance,
        })
    }
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month, day).
///
/// The Gregorian calendar repeats every 400 years, which hold exactly 146 097 days, so whole
/// cycles are skipped arithmetically and at most 400 years and 12 months are walked.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    const DAYS_PER_400_YEARS: i64 = 146_097;
    let mut year = 1970 + days.div_euclid(DAYS_PER_400_YEARS) * 400;
    let mut rest = days.rem_euclid(DAYS_PER_400_YEARS);
    loop {
        let year_len = if is_leap_year(year) { 366 } else { 365 };
        if rest < year_len {
            break;
        }
        rest -= year_len;
        year += 1;
    }
    let february = if is_leap_year(year) { 29 } else { 28 };
    let month_lengths = [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut month = 1;
    for month_len in month_lengths {
        if rest < month_len {
            break;
        }
        rest -= month_len;
        month += 1;
    }
    // `rest` < 31 here, so the cast cannot truncate.
    (year, month, rest as u32 + 1)
}

/// Formats unix seconds as UTC `YYYY-MM-DD HH:MM:SS`.
pub fn format_utc(unix: i64) -> String {
    let (year, month, day) = civil_from_days(unix.div_euclid(86_400));
    let secs = unix.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Renders lines as a plain-text table, one row per period (grouped by instance, in the given
/// order within an instance) and a total row per instance.
pub fn render_bill(lines: &[UsageLine]) -> String {
    let mut sorted: Vec<&UsageLine> = lines.iter().collect();
    sorted.sort_by(|a, b| a.instance.cmp(&b.instance));

    let mut rows: Vec<[String; 7]> = vec![[
        "instance".to_string(),
        "period start (UTC)".to_string(),
        "running s".to_string(),
        "paused s".to_string(),
        "CCU-hours".to_string(),
        "storage GiB-hours".to_string(),
        "state".to_string(),
    ]];
    for group in sorted.chunk_by(|a, b| a.instance == b.instance) {
        let name = printable(&group[0].instance);
        let (mut running, mut paused, mut ccu_hours, mut gib_hours) = (0u64, 0u64, 0.0, 0.0);
        for line in group {
            running += u64::from(line.running_secs);
            paused += u64::from(line.paused_secs);
            ccu_hours += line.ccu_hours();
            gib_hours += line.storage_gib_hours();
            rows.push([
                name.clone(),
                format_utc(line.period_start),
                line.running_secs.to_string(),
                line.paused_secs.to_string(),
                format!("{:.4}", line.ccu_hours()),
                format!("{:.6}", line.storage_gib_hours()),
                if line.settled { "settled" } else { "open" }.to_string(),
            ]);
        }
        rows.push([
            name,
            "total".to_string(),
            running.to_string(),
            paused.to_string(),
            format!("{ccu_hours:.4}"),
            format!("{gib_hours:.6}"),
            String::new(),
        ]);
    }

    let mut widths = [0usize; 7];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut text = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            // Text columns are left-aligned, numbers right-aligned.
            if matches!(i, 0 | 1 | 6) {
                let _ = write!(text, "{cell:<width$}");
            } else {
                let _ = write!(text, "{cell:>width$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// An instance name safe to print in a one-line-per-row table.
fn printable(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::Instant;

    fn sample(at_unix: i64, running: bool, ccu: f64) -> UsageSample {
        UsageSample {
            at_unix,
            running,
            ccu,
            storage_bytes: None,
        }
    }

    /// Feeds samples and returns every line the meter asked to persist.
    fn feed(meter: &mut Meter, samples: impl IntoIterator<Item = UsageSample>) -> Vec<UsageLine> {
        samples.into_iter().flat_map(|s| meter.add(&s)).collect()
    }

    fn settled(lines: &[UsageLine]) -> Vec<&UsageLine> {
        lines.iter().filter(|l| l.settled).collect()
    }

    fn line(instance: &str, period_start: i64, running_secs: u32, settled: bool) -> UsageLine {
        UsageLine {
            instance: instance.to_string(),
            period_start,
            period_secs: 2,
            running_secs,
            paused_secs: 2 - running_secs,
            ccu_seconds: f64::from(running_secs) * 0.5,
            storage_byte_seconds: 2048.0,
            storage_bytes_last: 1024,
            settled,
        }
    }

    fn temp_ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = Ledger::open(&dir.path().join("usage.db")).expect("open ledger");
        (dir, ledger)
    }

    #[test]
    fn civil_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(86_399), "1970-01-01 23:59:59");
        assert_eq!(format_utc(31_536_000), "1971-01-01 00:00:00");
        assert_eq!(format_utc(-1), "1969-12-31 23:59:59");
        // 1972 was the first leap year after the epoch.
        assert_eq!(format_utc(68_169_600), "1972-02-29 00:00:00");
        assert_eq!(format_utc(68_256_000), "1972-03-01 00:00:00");
        // 2000 is a leap year (divisible by 400).
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(format_utc(951_868_800), "2000-03-01 00:00:00");
        assert_eq!(format_utc(1_709_164_800), "2024-02-29 00:00:00");
        assert_eq!(format_utc(1_709_251_199), "2024-02-29 23:59:59");
        assert_eq!(format_utc(1_735_689_599), "2024-12-31 23:59:59");
        assert_eq!(format_utc(1_796_169_600), "2026-12-02 00:00:00");
        assert_eq!(format_utc(1_796_173_445), "2026-12-02 01:04:05");
        // 1900 and 2100 are not leap years (divisible by 100 but not 400).
        assert_eq!(format_utc(-2_203_977_600), "1900-02-28 00:00:00");
        assert_eq!(format_utc(-2_203_891_200), "1900-03-01 00:00:00");
        assert_eq!(format_utc(4_107_456_000), "2100-02-28 00:00:00");
        assert_eq!(format_utc(4_107_542_400), "2100-03-01 00:00:00");
        // Across a 400-year cycle boundary.
        assert_eq!(format_utc(12_622_780_800), "2370-01-01 00:00:00");
        assert_eq!(format_utc(12_622_780_799), "2369-12-31 23:59:59");
    }

    #[test]
    fn civil_from_days_is_consistent_day_by_day() {
        // Walking day by day from 1600 to 2500 must advance the date by exactly one day.
        let start = civil_from_days(-135_140);
        assert_eq!(start, (1600, 1, 1));
        let mut prev = start;
        for days in -135_139..194_000 {
            let next = civil_from_days(days);
            let (y, m, d) = prev;
            let month_len = match m {
                2 if is_leap_year(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            let expected = if d < month_len {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            assert_eq!(next, expected, "day {days}");
            prev = next;
        }
        // Extreme timestamps do not panic.
        let _ = format_utc(i64::MAX);
        let _ = format_utc(i64::MIN);
    }

    #[test]
    fn usage_line_unit_conversions() {
        let l = UsageLine {
            ccu_seconds: 7200.0,
            storage_byte_seconds: BYTES_PER_GIB * 1800.0,
            ..line("db", 0, 0, false)
        };
        assert_eq!(l.ccu_hours(), 2.0);
        assert_eq!(l.storage_gib_hours(), 0.5);
        assert_eq!(l.period_end(), 2);
    }

    #[test]
    fn meter_settles_a_period_at_the_boundary_with_exact_seconds() {
        let mut meter = Meter::new("db", 60, None);
        meter.set_flush_every(1000);
        // 60 seconds of period [1200, 1260): 40 running at varying sizes, 20 paused.
        let samples = (1200..1260).map(|t| {
            let running = t < 1240;
            let ccu = if t < 1220 { 0.5 } else { 1.25 };
            UsageSample {
                storage_bytes: Some(1000),
                ..sample(t, running, ccu)
            }
        });
        assert_eq!(feed(&mut meter, samples), vec![]);
        let open = meter.open_line().expect("open line");
        assert_eq!((open.running_secs, open.paused_secs), (40, 20));

        let out = meter.add(&sample(1260, true, 2.0));
        assert_eq!(
            out,
            vec![UsageLine {
                instance: "db".to_string(),
                period_start: 1200,
                period_secs: 60,
                running_secs: 40,
                paused_secs: 20,
                // Paused seconds at 1.25 CCU count nothing.
                ccu_seconds: 20.0 * 0.5 + 20.0 * 1.25,
                storage_byte_seconds: 60_000.0,
                storage_bytes_last: 1000,
                settled: true,
            }]
        );
        let open = meter.open_line().expect("new open line");
        assert_eq!(open.period_start, 1260);
        assert_eq!((open.running_secs, open.paused_secs), (1, 0));
        assert_eq!(open.ccu_seconds, 2.0);
        // Storage is carried into the new period without a new measurement.
        assert_eq!(open.storage_bytes_last, 1000);
        assert_eq!(open.storage_byte_seconds, 1000.0);
        assert!(!open.settled);
    }

    #[test]
    fn meter_ignores_unusable_ccu_values() {
        let mut meter = Meter::new("db", 10, None);
        feed(
            &mut meter,
            [
                sample(0, true, f64::NAN),
                sample(1, true, -1.0),
                sample(2, true, 1.0),
            ],
        );
        let open = meter.open_line().expect("open line");
        assert_eq!((open.running_secs, open.ccu_seconds), (3, 1.0));
    }

    #[test]
    fn meter_flushes_the_open_line_every_n_samples() {
        let mut meter = Meter::new("db", 100, None);
        meter.set_flush_every(10);
        let mut flushed_at = Vec::new();
        for t in 0..35 {
            for l in meter.add(&sample(t, true, 1.0)) {
                assert!(!l.settled);
                assert_eq!(l.running_secs as i64, t + 1, "a flush carries all totals");
                flushed_at.push(t);
            }
        }
        assert_eq!(flushed_at, vec![9, 19, 29]);

        // A new period restarts the cadence; the settled line comes out at once.
        let mut meter = Meter::new("db", 2, None);
        meter.set_flush_every(3);
        let out: Vec<(i64, bool)> = (0..7)
            .flat_map(|t| meter.add(&sample(t, true, 1.0)))
            .map(|l| (l.period_start, l.settled))
            .collect();
        assert_eq!(out, vec![(0, true), (2, true), (4, true)]);
        // Flush every sample: each add persists the open line.
        meter.set_flush_every(0);
        let out = meter.add(&sample(7, false, 1.0));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].period_start, out[0].paused_secs), (6, 1));
    }

    #[test]
    fn meter_skips_periods_without_samples() {
        let mut meter = Meter::new("db", 2, None);
        let out = feed(
            &mut meter,
            [
                sample(10, true, 1.0),
                sample(11, true, 1.0),
                sample(30, false, 1.0),
                sample(31, false, 1.0),
                sample(32, true, 1.0),
            ],
        );
        let starts: Vec<i64> = settled(&out).iter().map(|l| l.period_start).collect();
        assert_eq!(starts, vec![10, 30]);
    }

    #[test]
    fn meter_counts_a_sample_from_the_past_in_the_open_period() {
        let mut meter = Meter::new("db", 10, None);
        feed(&mut meter, [sample(25, true, 1.0), sample(19, true, 1.0)]);
        let open = meter.open_line().expect("open line");
        assert_eq!((open.period_start, open.running_secs), (20, 2));
    }

    #[test]
    fn meter_resumes_the_current_period() {
        let resumed = UsageLine {
            instance: "db".to_string(),
            period_start: 100,
            period_secs: 10,
            running_secs: 3,
            paused_secs: 1,
            ccu_seconds: 1.5,
            storage_byte_seconds: 400.0,
            storage_bytes_last: 100,
            settled: false,
        };
        let mut meter = Meter::new("db", 10, Some(resumed.clone()));
        assert_eq!(meter.open_line(), Some(&resumed));
        let out = feed(&mut meter, (105..111).map(|t| sample(t, true, 0.5)));
        assert_eq!(
            settled(&out),
            vec![&UsageLine {
                running_secs: 3 + 5,
                ccu_seconds: 1.5 + 2.5,
                storage_byte_seconds: 400.0 + 500.0,
                settled: true,
                ..resumed.clone()
            }]
        );

        // A resumed row of an earlier period is settled by the first sample.
        let mut meter = Meter::new("db", 10, Some(resumed.clone()));
        let out = meter.add(&sample(250, true, 1.0));
        assert_eq!(
            out,
            vec![UsageLine {
                settled: true,
                ..resumed.clone()
            }]
        );
        assert_eq!(meter.open_line().map(|l| l.period_start), Some(250));

        // So is one cut with another period length (the configuration changed).
        let mut meter = Meter::new("db", 5, Some(resumed.clone()));
        let out = meter.add(&sample(105, true, 1.0));
        assert_eq!(settled(&out).len(), 1);
        assert_eq!(
            meter.open_line().map(|l| (l.period_start, l.period_secs)),
            Some((105, 5))
        );

        // Settled or foreign rows are not resumed.
        let done = UsageLine {
            settled: true,
            ..resumed.clone()
        };
        assert_eq!(Meter::new("db", 10, Some(done)).open_line(), None);
        assert_eq!(Meter::new("other", 10, Some(resumed)).open_line(), None);
    }

    #[test]
    fn ledger_open_creates_directories_and_a_versioned_wal_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a/b/usage.db");
        let ledger = Ledger::open(&path).expect("open");
        assert_eq!(ledger.path(), path);
        drop(ledger);
        let conn = Connection::open(&path).expect("raw open");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("user_version");
        assert_eq!(version, SCHEMA_VERSION);
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("journal_mode");
        assert_eq!(mode, "wal");
        drop(conn);
        // Reopening an existing ledger works and keeps the data.
        let ledger = Ledger::open(&path).expect("reopen");
        ledger.upsert(&line("db", 0, 1, false)).expect("upsert");
        drop(ledger);
        let ledger = Ledger::open(&path).expect("reopen again");
        assert_eq!(ledger.lines(None, None).expect("lines").len(), 1);
    }

    #[test]
    fn ledger_refuses_a_newer_schema() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.db");
        let conn = Connection::open(&path).expect("raw open");
        conn.execute_batch("PRAGMA user_version = 7")
            .expect("set version");
        drop(conn);
        let err = Ledger::open(&path).expect_err("must refuse");
        assert!(
            matches!(err, LedgerError::SchemaTooNew { found: 7, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("usage.db"), "{err}");
    }

    #[test]
    fn ledger_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("not-a-dir");
        std::fs::write(&blocker, b"x").expect("write");
        let err = Ledger::open(&blocker.join("usage.db")).expect_err("parent is a file");
        assert!(matches!(err, LedgerError::CreateDir { .. }), "{err:?}");
        assert!(err.to_string().contains("not-a-dir/usage.db"), "{err}");

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x42u8; 8192]).expect("write");
        let err = Ledger::open(&garbage).expect_err("not a database");
        assert!(err.to_string().contains("garbage.db"), "{err}");
    }

    #[test]
    fn upsert_is_idempotent_and_writes_totals() {
        let (_dir, ledger) = temp_ledger();
        let first = line("db", 10, 1, false);
        ledger.upsert(&first).expect("upsert");
        ledger.upsert(&first).expect("upsert again");
        assert_eq!(ledger.lines(None, None).expect("lines"), vec![first]);
        // A later flush replaces the totals (it does not add to them).
        let later = line("db", 10, 2, false);
        ledger.upsert(&later).expect("upsert later");
        ledger.upsert(&later).expect("upsert later again");
        assert_eq!(ledger.lines(None, None).expect("lines"), vec![later]);
    }

    #[test]
    fn upsert_never_unsettles_or_changes_a_settled_row() {
        let (_dir, ledger) = temp_ledger();
        let done = line("db", 10, 2, true);
        ledger.upsert(&done).expect("settle");
        // A stale open flush arriving late, and a different settled version, are both ignored.
        ledger
            .upsert(&line("db", 10, 1, false))
            .expect("late flush");
        ledger
            .upsert(&line("db", 10, 0, true))
            .expect("second settle");
        assert_eq!(ledger.lines(None, None).expect("lines"), vec![done]);
        assert_eq!(ledger.open_line("db").expect("open line"), None);
    }

    #[test]
    fn upsert_rejects_invalid_lines() {
        let (_dir, ledger) = temp_ledger();
        let bad = [
            UsageLine {
                period_start: 11,
                ..line("db", 10, 1, false)
            },
            UsageLine {
                period_secs: 0,
                ..line("db", 10, 1, false)
            },
            UsageLine {
                ccu_seconds: f64::NAN,
                ..line("db", 10, 1, false)
            },
            UsageLine {
                storage_byte_seconds: -1.0,
                ..line("db", 10, 1, false)
            },
        ];
        for l in bad {
            let err = ledger.upsert(&l).expect_err("invalid");
            assert!(matches!(err, LedgerError::InvalidLine { .. }), "{err:?}");
            assert!(err.to_string().contains("usage.db"), "{err}");
        }
        assert_eq!(ledger.lines(None, None).expect("lines"), vec![]);
        // Negative (pre-1970) aligned starts are fine.
        ledger
            .upsert(&line("db", -4, 1, true))
            .expect("negative start");
        // Huge storage sizes saturate instead of failing.
        let huge = UsageLine {
            storage_bytes_last: u64::MAX,
            ..line("db", 0, 1, true)
        };
        ledger.upsert(&huge).expect("huge");
        let stored = ledger.lines(None, Some(0)).expect("lines");
        assert_eq!(stored[0].storage_bytes_last, i64::MAX as u64);
    }

    #[test]
    fn open_line_is_the_latest_unsettled_row() {
        let (_dir, ledger) = temp_ledger();
        assert_eq!(ledger.open_line("db").expect("open line"), None);
        ledger.upsert(&line("db", 10, 1, true)).expect("upsert");
        ledger.upsert(&line("db", 12, 1, false)).expect("upsert");
        ledger.upsert(&line("db", 14, 2, false)).expect("upsert");
        ledger.upsert(&line("other", 20, 2, false)).expect("upsert");
        assert_eq!(
            ledger.open_line("db").expect("open line"),
            Some(line("db", 14, 2, false))
        );
        assert_eq!(ledger.open_line("nobody").expect("open line"), None);
    }

    #[test]
    fn settle_stale_marks_only_ended_periods() {
        let (_dir, ledger) = temp_ledger();
        ledger.upsert(&line("a", 10, 1, false)).expect("upsert");
        ledger.upsert(&line("b", 10, 1, false)).expect("upsert");
        ledger.upsert(&line("a", 12, 1, false)).expect("upsert");
        ledger.upsert(&line("a", 8, 1, true)).expect("upsert");
        // At 12, the periods [10, 12) have ended; [12, 14) has not.
        assert_eq!(ledger.settle_stale(12).expect("settle"), 2);
        let state: Vec<(String, i64, bool)> = ledger
            .lines(None, None)
            .expect("lines")
            .into_iter()
            .map(|l| (l.instance, l.period_start, l.settled))
            .collect();
        assert_eq!(
            state,
            vec![
                ("a".to_string(), 8, true),
                ("a".to_string(), 10, true),
                ("a".to_string(), 12, false),
                ("b".to_string(), 10, true),
            ]
        );
        assert_eq!(ledger.settle_stale(12).expect("settle again"), 0);
        assert_eq!(ledger.settle_stale(13).expect("settle mid-period"), 0);
        assert_eq!(ledger.settle_stale(14).expect("settle last"), 1);
        assert_eq!(ledger.open_line("a").expect("open line"), None);
    }

    #[test]
    fn lines_filter_by_instance_and_since() {
        let (_dir, ledger) = temp_ledger();
        for (instance, start) in [("b", 4), ("a", 6), ("a", 2), ("b", 0), ("a", 4)] {
            ledger
                .upsert(&line(instance, start, 1, true))
                .expect("upsert");
        }
        let keys = |lines: Vec<UsageLine>| -> Vec<(String, i64)> {
            lines
                .into_iter()
                .map(|l| (l.instance, l.period_start))
                .collect()
        };
        let all = keys(ledger.lines(None, None).expect("all"));
        assert_eq!(
            all,
            vec![
                ("a".to_string(), 2),
                ("a".to_string(), 4),
                ("a".to_string(), 6),
                ("b".to_string(), 0),
                ("b".to_string(), 4),
            ]
        );
        let a = keys(ledger.lines(Some("a"), None).expect("a"));
        assert_eq!(a.iter().map(|k| k.1).collect::<Vec<_>>(), vec![2, 4, 6]);
        // `since` keeps periods starting at or after it (a period straddling it is left out).
        let since = keys(ledger.lines(None, Some(3)).expect("since"));
        assert_eq!(
            since,
            vec![
                ("a".to_string(), 4),
                ("a".to_string(), 6),
                ("b".to_string(), 4)
            ]
        );
        let both = keys(ledger.lines(Some("b"), Some(4)).expect("both"));
        assert_eq!(both, vec![("b".to_string(), 4)]);
        assert_eq!(ledger.lines(Some("c"), None).expect("none"), vec![]);
    }

    /// Runs the meter over `samples` and persists what it asks for, like the lifecycle does.
    fn meter_into_ledger(ledger: &Ledger, meter: &mut Meter, samples: &[UsageSample]) {
        for s in samples {
            for l in meter.add(s) {
                ledger.upsert(&l).expect("upsert");
            }
        }
    }

    fn running_samples(range: std::ops::Range<i64>) -> Vec<UsageSample> {
        range
            .map(|t| UsageSample {
                storage_bytes: Some(2048),
                ..sample(t, t % 5 != 0, 0.25 * (1 + t % 3) as f64)
            })
            .collect()
    }

    fn totals(samples: &[UsageSample]) -> (u32, u32, f64) {
        let running = samples.iter().filter(|s| s.running).count() as u32;
        let paused = samples.len() as u32 - running;
        let ccu = samples.iter().filter(|s| s.running).map(|s| s.ccu).sum();
        (running, paused, ccu)
    }

    #[test]
    fn resume_after_clean_restart_adds_up_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.db");
        let all = running_samples(1000..1100);
        let (before, after) = all.split_at(37);

        let ledger = Ledger::open(&path).expect("open");
        let mut meter = Meter::new("db", 100, None);
        meter_into_ledger(&ledger, &mut meter, before);
        // Clean shutdown: persist the open line.
        ledger
            .upsert(meter.open_line().expect("open line"))
            .expect("final flush");
        drop(meter);
        drop(ledger);

        let ledger = Ledger::open(&path).expect("reopen");
        assert_eq!(ledger.settle_stale(1037).expect("settle"), 0);
        let resume = ledger.open_line("db").expect("open line");
        assert_eq!(
            resume.as_ref().map(|l| l.running_secs + l.paused_secs),
            Some(37)
        );
        let mut meter = Meter::new("db", 100, resume);
        meter_into_ledger(&ledger, &mut meter, after);
        meter_into_ledger(&ledger, &mut meter, &running_samples(1100..1101));

        let rows = ledger.lines(Some("db"), Some(1000)).expect("lines");
        let first = &rows[0];
        let (running, paused, ccu) = totals(&all);
        assert_eq!(first.period_start, 1000);
        assert!(first.settled);
        assert_eq!((first.running_secs, first.paused_secs), (running, paused));
        assert!((first.ccu_seconds - ccu).abs() < 1e-9);
        assert_eq!(first.storage_byte_seconds, 100.0 * 2048.0);
    }

    #[test]
    fn resume_after_crash_loses_at_most_the_unflushed_seconds_and_never_double_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.db");
        let all = running_samples(1000..1100);
        let (before, after) = all.split_at(25);

        let ledger = Ledger::open(&path).expect("open");
        let mut meter = Meter::new("db", 100, None);
        meter.set_flush_every(10);
        meter_into_ledger(&ledger, &mut meter, before);
        // Crash: the last 5 samples were never flushed.
        drop(meter);
        drop(ledger);

        let ledger = Ledger::open(&path).expect("reopen");
        assert_eq!(ledger.settle_stale(1030).expect("settle"), 0);
        let resume = ledger.open_line("db").expect("open line");
        assert_eq!(
            resume.as_ref().map(|l| l.running_secs + l.paused_secs),
            Some(20)
        );
        let mut meter = Meter::new("db", 100, resume);
        meter_into_ledger(&ledger, &mut meter, after);
        // A second restart, this one clean, right before the period ends.
        ledger
            .upsert(meter.open_line().expect("open line"))
            .expect("final flush");
        drop(meter);
        drop(ledger);
        let ledger = Ledger::open(&path).expect("reopen again");
        let mut meter = Meter::new("db", 100, ledger.open_line("db").expect("open line"));
        meter_into_ledger(&ledger, &mut meter, &running_samples(1100..1101));

        let rows = ledger.lines(Some("db"), None).expect("lines");
        let (running, paused, ccu) = totals(&[&before[..20], after].concat());
        assert!(rows[0].settled);
        assert_eq!(
            (rows[0].running_secs, rows[0].paused_secs),
            (running, paused)
        );
        assert!((rows[0].ccu_seconds - ccu).abs() < 1e-9);
    }

    #[test]
    fn restart_after_the_period_ended_settles_the_stale_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("usage.db");
        let ledger = Ledger::open(&path).expect("open");
        let mut meter = Meter::new("db", 2, None);
        meter.set_flush_every(1);
        meter_into_ledger(&ledger, &mut meter, &running_samples(10..11));
        drop(meter);
        drop(ledger);

        let ledger = Ledger::open(&path).expect("reopen");
        assert_eq!(ledger.settle_stale(20).expect("settle"), 1);
        assert_eq!(ledger.open_line("db").expect("open line"), None);
        let rows = ledger.lines(None, None).expect("lines");
        assert_eq!(rows.len(), 1);
        assert!(rows[0].settled);
        assert_eq!(rows[0].running_secs + rows[0].paused_secs, 1);
    }

    #[test]
    fn render_bill_lists_periods_and_totals() {
        let hour = |instance: &str, start: i64, running: u32, ccu: f64, settled: bool| UsageLine {
            instance: instance.to_string(),
            period_start: start,
            period_secs: 3600,
            running_secs: running,
            paused_secs: 3600 - running,
            ccu_seconds: ccu * f64::from(running),
            storage_byte_seconds: BYTES_PER_GIB * 3600.0,
            storage_bytes_last: 1 << 30,
            settled,
        };
        let lines = vec![
            hour("orders", 1_796_169_600, 3600, 1.0, true),
            hour("analytics", 1_796_169_600, 1800, 0.5, true),
            hour("orders", 1_796_173_200, 900, 2.0, false),
        ];
        let bill = render_bill(&lines);
        let expected = "\
instance   period start (UTC)   running s  paused s  CCU-hours  storage GiB-hours  state
analytics  2026-12-02 00:00:00       1800      1800     0.2500           1.000000  settled
analytics  total                     1800      1800     0.2500           1.000000
orders     2026-12-02 00:00:00       3600         0     1.0000           1.000000  settled
orders     2026-12-02 01:00:00        900      2700     0.5000           1.000000  open
orders     total                     4500      2700     1.5000           2.000000
";
        assert_eq!(bill, expected, "\n{bill}");

        let header_only = render_bill(&[]);
        assert_eq!(header_only.lines().count(), 1);
        let weird = render_bill(&[UsageLine {
            instance: "a\nb".to_string(),
            ..line("x", 0, 1, true)
        }]);
        assert_eq!(weird.lines().count(), 3, "{weird}");
        assert!(weird.contains("a?b"));
    }

    /// Set to a ledger path, turns [`crash_child_writer`] into the writer the crash test kills.
    const CRASH_CHILD_ENV: &str = "HOLDFAST_LEDGER_CRASH_CHILD";
    const CRASH_CHILD_TEST: &str = "ledger::tests::crash_child_writer";
    const CRASH_INSTANCE: &str = "crashy";

    fn encode(l: &UsageLine) -> String {
        // Rust prints floats with the shortest text that parses back to the same value.
        format!(
            "{} {} {} {} {} {} {} {}",
            l.period_start,
            l.period_secs,
            l.running_secs,
            l.paused_secs,
            l.ccu_seconds,
            l.storage_byte_seconds,
            l.storage_bytes_last,
            l.settled
        )
    }

    fn decode(text: &str) -> UsageLine {
        let f: Vec<&str> = text.split(' ').collect();
        assert_eq!(f.len(), 8, "{text:?}");
        UsageLine {
            instance: CRASH_INSTANCE.to_string(),
            period_start: f[0].parse().expect("period_start"),
            period_secs: f[1].parse().expect("period_secs"),
            running_secs: f[2].parse().expect("running_secs"),
            paused_secs: f[3].parse().expect("paused_secs"),
            ccu_seconds: f[4].parse().expect("ccu_seconds"),
            storage_byte_seconds: f[5].parse().expect("storage_byte_seconds"),
            storage_bytes_last: f[6].parse().expect("storage_bytes_last"),
            settled: f[7].parse().expect("settled"),
        }
    }

    /// Not a test on its own: in a child process started by
    /// [`settled_rows_survive_sigkill`], writes rows as fast as it can and reports each settled
    /// row before and after its upsert returns, until it is killed.
    #[test]
    fn crash_child_writer() {
        let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
            return;
        };
        let ledger = Ledger::open(Path::new(&path)).expect("child opens the ledger");
        let mut meter = Meter::new(CRASH_INSTANCE, 2, None);
        meter.set_flush_every(1);
        let mut out = std::io::stdout().lock();
        // libtest printed "test ... " without a newline: start the reports on a line of their own.
        writeln!(out).expect("stdout");
        for i in 0..1_000_000i64 {
            let s = UsageSample {
                at_unix: 1_700_000_000 + i,
                running: i % 3 != 0,
                ccu: 0.5 + (i % 4) as f64 * 0.25,
                storage_bytes: Some(1_000_000 + i as u64),
            };
            for l in meter.add(&s) {
                if l.settled {
                    writeln!(out, "WRITING {}", encode(&l)).expect("stdout");
                }
                ledger.upsert(&l).expect("child upsert");
                if l.settled {
                    writeln!(out, "SETTLED {}", encode(&l)).expect("stdout");
                    out.flush().expect("stdout");
                }
            }
        }
    }

    /// Makes sure a failing crash test does not leave its writer running.
    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn settled_rows_survive_sigkill() {
        use std::os::unix::process::ExitStatusExt;

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("crash/usage.db");
        let exe = std::env::current_exe().expect("test binary path");
        let child = Command::new(exe)
            .args([
                CRASH_CHILD_TEST,
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_CHILD_ENV, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let mut child = KillOnDrop(child);
        let stdout = child.0.stdout.take().expect("child stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                if tx.send(text).is_err() {
                    break;
                }
            }
        });

        let mut reported = Vec::new();
        let mut confirmed = 0;
        let deadline = Instant::now() + Duration::from_secs(120);
        while confirmed < 40 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(text) => {
                    if text.starts_with("SETTLED ") {
                        confirmed += 1;
                    }
                    reported.push(text);
                }
                Err(e) => {
                    panic!("child stopped reporting after {confirmed} rows: {e}");
                }
            }
        }
        // Let it get well into its next writes, then SIGKILL (what `Child::kill` sends on Unix).
        std::thread::sleep(Duration::from_millis(7));
        child.0.kill().expect("SIGKILL the child");
        let status = child.0.wait().expect("reap child");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        reported.extend(rx.iter());
        reader.join().expect("reader thread");

        let ledger = Ledger::open(&path).expect("ledger opens after the crash");
        let rows = ledger.lines(Some(CRASH_INSTANCE), None).expect("lines");
        let confirmed: Vec<UsageLine> = reported
            .iter()
            .filter_map(|t| t.strip_prefix("SETTLED "))
            .map(decode)
            .collect();
        let attempted: Vec<UsageLine> = reported
            .iter()
            .filter_map(|t| t.strip_prefix("WRITING "))
            .map(decode)
            .collect();
        assert!(confirmed.len() >= 40);
        for want in &confirmed {
            let found = rows.iter().find(|r| r.period_start == want.period_start);
            assert_eq!(found, Some(want), "settled row lost or altered");
        }
        // A row whose write was cut short is either fully there or not settled yet.
        for want in &attempted {
            if let Some(found) = rows
                .iter()
                .find(|r| r.period_start == want.period_start && r.settled)
            {
                assert_eq!(found, want);
            }
        }
        // Every settled row is a whole 2-second period; periods are contiguous.
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.period_start, 1_700_000_000 + 2 * i as i64, "{row:?}");
            if row.settled {
                assert_eq!(row.running_secs + row.paused_secs, 2, "{row:?}");
            }
        }
        assert!(rows.len() >= confirmed.len());
        drop(ledger);
        let conn = Connection::open(&path).expect("raw open");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(check, "ok");
        drop(conn);

        // Holdfast restarting on it carries on normally.
        let ledger = Ledger::open(&path).expect("reopen");
        let last = rows.last().expect("rows");
        ledger
            .settle_stale(last.period_end())
            .expect("settle stale");
        assert_eq!(ledger.open_line(CRASH_INSTANCE).expect("open line"), None);
    }
}
