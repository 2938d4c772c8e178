//! In-place scaling: the server's CPU use is sampled every second, the autoscaler decides the
//! size in capacity units, and the size is applied without a restart: the driver sets the
//! CPU limit (cgroup), and the InnoDB buffer pool is resized online over SQL.

use super::{Lifecycle, Phase};
use crate::verifiers::monitor_connect;
use crate::Shared;
use holdfast_serverless::autoscale::{Autoscaler, ScalePolicyExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples and scales until the process ends.
pub async fn run(shared: Arc<Shared>, lc: Arc<Lifecycle>) {
    let mut scaler = Autoscaler::new(lc.config.scale.clone(), lc.ccu());
    let origin = Instant::now();
    let mut last: Option<(f64, Instant)> = None;
    // The size is applied again after every resume: a restarted server has its configured
    // buffer pool and a new process outside the cgroup.
    let mut applied_epoch: Option<u64> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if lc.phase() != Phase::Running {
            last = None;
            continue;
        }
        let requested = lc.lock().requested_ccu;
        if let Some(asked) = requested {
            let ccu = lc.config.scale.snap(asked);
            apply(&shared, &lc, ccu, "requested").await;
            scaler.set_current(ccu);
            applied_epoch = Some(lc.epoch());
            let mut inner = lc.lock();
            if inner.requested_ccu == Some(asked) {
                inner.requested_ccu = None;
            }
            continue;
        }
        if applied_epoch != Some(lc.epoch()) {
            let ccu = scaler.current();
            apply(&shared, &lc, ccu, "start").await;
            applied_epoch = Some(lc.epoch());
        }
        let Ok(Some(cpu)) = lc.driver.cpu_seconds().await else {
            continue;
        };
        let now = Instant::now();
        if let Some((prev, at)) = last {
            let secs = now.duration_since(at).as_secs_f64();
            if secs > 0.0 && cpu >= prev {
                let used = (cpu - prev) / secs;
                lc.lock().cpu_used = used;
                shared.metrics.instance_cpu_used.set(used);
                if lc.config.autoscale {
                    if let Some(ccu) = scaler.sample(used, origin.elapsed()) {
                        apply(&shared, &lc, ccu, "autoscale").await;
                        scaler.set_current(ccu);
                    }
                }
            }
        }
        last = Some((cpu, now));
    }
}

/// Applies a size: CPU limit through the driver, buffer pool (and max_connections when
/// configured) over SQL. Failures are logged
/// and shown in status; the size is recorded either way (it is what is billed).
async fn apply(shared: &Shared, lc: &Lifecycle, ccu: f64, why: &'static str) {
    let from = lc.ccu();
    let mut notes = Vec::new();
    match lc.driver.scale(ccu).await {
        Ok(applied) => notes.push(applied.note),
        Err(e) => notes.push(format!("cpu limit not applied: {e}")),
    }
    let mut settings = Vec::new();
    let mib = lc.config.buffer_pool_mib_per_ccu;
    if mib > 0 {
        let bytes = (ccu * mib as f64 * 1024.0 * 1024.0) as u64;
        settings.push(("innodb_buffer_pool_size", bytes));
    }
    let per_ccu = lc.config.max_connections_per_ccu;
    if per_ccu > 0 {
        // Never below what is open now: lowering it does not close connections, but new
        // ones would be refused while the count is above it.
        let open = shared.sessions.len() as u64 + 10;
        settings.push(("max_connections", ((ccu * per_ccu as f64) as u64).max(open)));
    }
    if !settings.is_empty() {
        match set_globals(shared, &lc.address, &settings).await {
            Ok(()) => notes.extend(settings.iter().map(|(k, v)| format!("{k}={v}"))),
            Err(e) => notes.push(format!("server settings not changed: {e}")),
        }
    }
    lc.lock().ccu = ccu;
    shared.metrics.instance_ccu.set(ccu);
    tracing::info!(instance = %lc.config.instance, from, to = ccu, why, applied = %notes.join("; "), "instance scaled");
}

/// Sets global server variables over one monitor connection (all are dynamic: no restart).
async fn set_globals(
    shared: &Shared,
    address: &str,
    settings: &[(&str, u64)],
) -> Result<(), String> {
    let mut conn = monitor_connect(&shared.config, address)
        .await
        .map_err(|e| e.to_string())?;
    for (name, value) in settings {
        conn.query(&format!("SET GLOBAL {name} = {value}"))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}
