//! Metering: one usage sample per second (CCU while running, zero while paused, storage),
//! rolled up per billing period into the durable ledger.

use super::{Lifecycle, Phase};
use crate::Shared;
use holdfast_serverless::ledger::{Ledger, LedgerError, Meter, UsageLine, UsageSample};
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

/// Samples the instance every second until the process ends.
pub async fn run(shared: Arc<Shared>, lc: Arc<Lifecycle>, ledger: Arc<Ledger>) {
    loop {
        // Only the process in charge meters (a process taking over opens the period the
        // other one flushed when it let go); when it lets go, it stops here.
        lc.wait_in_charge().await;
        meter(&shared, &lc, &ledger).await;
    }
}

/// Meters while this process is in charge.
async fn meter(shared: &Shared, lc: &Lifecycle, ledger: &Arc<Ledger>) {
    let instance = lc.config().instance.clone();
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
    let mut meter = Meter::new(&instance, lc.config().period_secs, open);
    meter.set_flush_every(lc.config().flush_secs);
    let mut storage: Option<u64> = None;
    let mut storage_at: Option<tokio::time::Instant> = None;
    let mut unwritten: Vec<UsageLine> = Vec::new();
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
        unwritten.extend(meter.add(&sample));
        lc.lock().open_usage = meter.open_line().cloned();
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
