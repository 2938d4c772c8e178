//! Metering: one usage sample per second (CCU while running, zero while paused, storage),
//! rolled up per billing period into the durable ledger.
//!
//! In a fleet only the leader meters. Every second it posts where the meter stands (the
//! open period's totals and the last second counted, [`UsageCursor`]) on the fleet's
//! board, fenced by its epoch, and each line it writes to its ledger goes on the board
//! too; the other members copy those lines into their own ledgers. A member elected next
//! reads the cursor from etcd, counts the seconds since it (the instance did what the
//! cursor says while no member led: only a leader pauses or resumes it), and goes on from
//! there: a leader change loses no second and counts none twice.

use super::{Lifecycle, Phase};
use crate::Shared;
use holdfast_fleet::{Fleet, Poster};
use holdfast_serverless::ledger::{Ledger, LedgerError, Meter, UsageLine, UsageSample};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The data directory is walked this often for the storage figure.
const STORAGE_EVERY: Duration = Duration::from_secs(30);

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    #[error("ledger task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

async fn blocking<T: Send + 'static>(
    ledger: &Arc<Ledger>,
    f: impl FnOnce(&Ledger) -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, UsageError> {
    let ledger = ledger.clone();
    Ok(tokio::task::spawn_blocking(move || f(&ledger)).await??)
}

/// The board key of the leader's [`UsageCursor`].
const CURSOR_KEY: &str = "usage/cursor";
/// The board directory of the ledger lines the leader wrote (`<period start, 20 digits>`).
const LINES_DIR: &str = "usage/lines/";
/// How many periods of lines the board keeps.
const LINES_KEPT: i64 = 48;
/// A longer time without a leader is not counted by the next one (the fleet was down).
const MAX_GAP_SECS: i64 = 3600;

/// Where the fleet's meter stands, as its leader posts it every second.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UsageCursor {
    /// The open period's totals, up to and including `metered_to`.
    line: Option<UsageLine>,
    /// The last second counted (unix seconds).
    metered_to: i64,
    /// What that second counted: the instance ran, at this size.
    running: bool,
    ccu: f64,
}

/// Samples the instance every second until the process ends.
pub async fn run(shared: Arc<Shared>, lc: Arc<Lifecycle>, ledger: Arc<Ledger>) {
    loop {
        // Only the process in charge meters (a process taking over opens the period the
        // other one flushed when it let go); when it lets go, it stops here. A member of a
        // fleet copies the leader's lines meanwhile.
        if let (Some(fleet), false) = (&shared.fleet, lc.is_in_charge()) {
            copy_the_leaders_lines(&lc, &ledger, fleet).await;
        }
        lc.wait_in_charge().await;
        meter(&shared, &lc, &ledger).await;
    }
}

/// Aborts the task when dropped.
struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Until this process is in charge: the lines the fleet's leader posts go into this
/// member's ledger, and its cursor's open period is the live one `/usage` shows.
async fn copy_the_leaders_lines(lc: &Lifecycle, ledger: &Arc<Ledger>, fleet: &Fleet) {
    let mut board = fleet.board();
    let mut in_charge = lc.in_charge.subscribe();
    let mut copied: std::collections::HashMap<String, Vec<u8>> = Default::default();
    while !lc.is_in_charge() {
        let now = board.borrow_and_update().clone();
        let mut new: Vec<UsageLine> = Vec::new();
        for (k, p) in now.iter().filter(|(k, _)| k.starts_with(LINES_DIR)) {
            if copied.get(k) != Some(&p.value) {
                copied.insert(k.clone(), p.value.clone());
                new.extend(p.read::<UsageLine>());
            }
        }
        if !new.is_empty() {
            if let Err(e) = blocking(ledger, move |l| {
                new.iter().try_for_each(|line| l.upsert(line))
            })
            .await
            {
                tracing::warn!(error = %e, "usage ledger: copying the fleet leader's lines failed");
            }
        }
        if let Some(cursor) = now.get(CURSOR_KEY).and_then(|p| p.read::<UsageCursor>()) {
            lc.lock().open_usage = cursor.line;
        }
        tokio::select! {
            changed = board.changed() => if changed.is_err() { return },
            _ = in_charge.changed() => {}
        }
    }
}

/// Where the fleet's meter stands as etcd says now, with the lines on the board copied
/// into this member's ledger first (they are the fleet's record).
async fn take_up_from_the_fleet(fleet: &Fleet, ledger: &Arc<Ledger>) -> Option<UsageCursor> {
    let lines: Vec<UsageLine> = fleet
        .board()
        .borrow()
        .iter()
        .filter(|(k, _)| k.starts_with(LINES_DIR))
        .filter_map(|(_, p)| p.read())
        .collect();
    let cursor: Option<UsageCursor> = fleet.fetch(CURSOR_KEY).await.and_then(|p| p.read());
    let open = cursor.as_ref().and_then(|c| c.line.clone());
    let copied = blocking(ledger, move |l| {
        lines
            .iter()
            .chain(open.as_ref())
            .try_for_each(|line| l.upsert(line))
    })
    .await;
    if let Err(e) = copied {
        tracing::warn!(error = %e, "usage ledger: copying the fleet's lines failed");
    }
    cursor
}

/// Posts the latest cursor whenever it changes (as the leader, fenced), in order; a post
/// that fails is overtaken by the next second's.
async fn post_cursors(
    fleet: Arc<Fleet>,
    mut cursors: tokio::sync::watch::Receiver<Option<UsageCursor>>,
) {
    while cursors.changed().await.is_ok() {
        let cursor = cursors.borrow_and_update().clone();
        if let Some(c) = cursor {
            fleet.post(CURSOR_KEY, &c, Poster::Leader).await;
        }
    }
}

/// Posts lines written to the ledger on the board (as the leader, fenced), and clears
/// lines older than [`LINES_KEPT`] periods.
async fn post_lines(fleet: Arc<Fleet>, lines: Vec<UsageLine>) {
    for line in &lines {
        let key = format!("{LINES_DIR}{:020}", line.period_start.max(0));
        if !fleet.post(&key, line, Poster::Leader).await {
            tracing::warn!(
                period_start = line.period_start,
                "usage: could not post a ledger line on the fleet's board"
            );
        }
    }
    if let Some(last) = lines
        .iter()
        .map(|l| l.period_start - LINES_KEPT * i64::from(l.period_secs))
        .max()
    {
        fleet
            .clear_before(LINES_DIR, &format!("{:020}", last.max(0)))
            .await;
    }
}

/// Meters while this process is in charge.
async fn meter(shared: &Shared, lc: &Lifecycle, ledger: &Arc<Ledger>) {
    let instance = lc.config().instance.clone();
    let from_the_fleet = match &shared.fleet {
        Some(fleet) => take_up_from_the_fleet(fleet, ledger).await,
        None => None,
    };
    let now = unix_now();
    if let Err(e) = blocking(ledger, move |l| l.settle_stale(now)).await {
        tracing::warn!(error = %e, "usage ledger: settling old periods failed");
    }
    let name = instance.clone();
    let open = match blocking(ledger, move |l| l.open_line(&name)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "usage ledger: cannot read the open period; starting a new one");
            None
        }
    };
    // The fleet's open period, where it has one, is the one to go on with.
    let open = from_the_fleet
        .as_ref()
        .and_then(|c| c.line.clone())
        .filter(|l| l.instance == instance)
        .or(open);
    let mut meter = Meter::new(&instance, lc.config().period_secs, open);
    meter.set_flush_every(lc.config().flush_secs);
    let mut storage: Option<u64> = None;
    let mut storage_at: Option<tokio::time::Instant> = None;
    let mut unwritten: Vec<UsageLine> = Vec::new();
    if let Some(c) = &from_the_fleet {
        // The seconds no member metered (the last leader's last cursor up to now), as the
        // instance was then.
        let now = unix_now();
        let gap = (now - 1 - c.metered_to).clamp(0, MAX_GAP_SECS);
        for at_unix in (now - gap)..now {
            unwritten.extend(meter.add(&UsageSample {
                at_unix,
                running: c.running,
                ccu: c.ccu,
                storage_bytes: None,
            }));
        }
        tracing::info!(instance = %instance, seconds = gap, running = c.running, "usage: this member meters the fleet's instance now; counted the seconds since the last leader's last");
    }
    let (cursor_tx, cursor_rx) = tokio::sync::watch::channel(None);
    let _poster = shared
        .fleet
        .clone()
        .map(|f| Aborting(tokio::spawn(post_cursors(f, cursor_rx))));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let Some(_acting) = lc.act().await else {
            // Let go: the open period was flushed by the release.
            return;
        };
        if storage_at.is_none_or(|t| t.elapsed() >= STORAGE_EVERY) {
            storage_at = Some(tokio::time::Instant::now());
            if let Ok(Some(bytes)) = lc.driver.storage_bytes().await {
                storage = Some(bytes);
                lc.lock().storage_bytes = Some(bytes);
                shared.metrics.instance_storage_bytes.set(bytes as i64);
            }
        }
        let running = lc.phase() != Phase::Paused;
        let ccu = lc.ccu();
        if running {
            shared.metrics.instance_ccu_seconds.inc_by(ccu);
        }
        let sample = UsageSample {
            at_unix: unix_now(),
            running,
            ccu,
            storage_bytes: storage,
        };
        // Lines that could not be written are kept and written again (an upsert of the
        // same totals is harmless), so a settled period is never lost to a transient error.
        let to_write = meter.add(&sample);
        if let (Some(fleet), false) = (&shared.fleet, to_write.is_empty()) {
            tokio::spawn(post_lines(fleet.clone(), to_write.clone()));
        }
        unwritten.extend(to_write);
        lc.lock().open_usage = meter.open_line().cloned();
        cursor_tx.send_replace(Some(UsageCursor {
            line: meter.open_line().cloned(),
            metered_to: sample.at_unix,
            running,
            ccu,
        }));
        if unwritten.is_empty() {
            continue;
        }
        // Only the latest totals of each period matter (an outage must not pile up lines).
        let mut lines: Vec<UsageLine> = Vec::new();
        for line in std::mem::take(&mut unwritten) {
            lines.retain(|l| l.period_start != line.period_start);
            lines.push(line);
        }
        let result = blocking(ledger, move |l| {
            let mut failed = Vec::new();
            let mut first_error = None;
            for line in lines {
                if let Err(e) = l.upsert(&line) {
                    first_error.get_or_insert(e.to_string());
                    failed.push(line);
                }
            }
            Ok((failed, first_error))
        })
        .await;
        match result {
            Ok((failed, error)) => {
                if let Some(e) = error {
                    tracing::warn!(error = %e, lines = failed.len(), "usage ledger write failed; retrying next second");
                }
                unwritten = failed;
            }
            Err(e) => tracing::warn!(error = %e, "usage ledger task failed"),
        }
    }
}

/// The ledger's lines for `instance` (all when None) from `since` (unix seconds), with the
/// open period as of the last second rather than the last flush.
pub async fn usage_lines(
    ledger: &Arc<Ledger>,
    lc: Option<&Lifecycle>,
    instance: Option<String>,
    since: Option<i64>,
) -> Result<Vec<UsageLine>, UsageError> {
    let mut lines = blocking(ledger, {
        let instance = instance.clone();
        move |l| l.lines(instance.as_deref(), since)
    })
    .await?;
    let live = lc.and_then(|lc| lc.lock().open_usage.clone());
    if let Some(live) = live {
        let wanted = instance.as_deref().is_none_or(|i| i == live.instance)
            && since.is_none_or(|t| live.period_start >= t);
        if wanted {
            match lines.iter_mut().find(|l| {
                l.instance == live.instance
                    && l.period_start == live.period_start
                    && l.period_secs == live.period_secs
            }) {
                Some(stored) if !stored.settled => *stored = live,
                Some(_) => {}
                None => lines.push(live),
            }
        }
    }
    Ok(lines)
}

/// Writes the open period's totals now (on a clean shutdown, so a stop of holdfast loses
/// none of them; a crash loses at most `flush_secs`).
pub async fn flush_usage(shared: &crate::Shared) -> Result<(), UsageError> {
    let (Some(lc), Some(ledger)) = (&shared.serverless, &shared.ledger) else {
        return Ok(());
    };
    let open = lc.lock().open_usage.clone();
    match open {
        Some(line) => blocking(ledger, move |l| l.upsert(&line)).await,
        None => Ok(()),
    }
}
