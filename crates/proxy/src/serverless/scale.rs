//! In-place scaling: the server's CPU use is sampled every second, the autoscaler decides the
//! size in capacity units, and the size is applied without a restart: the driver sets the
//! CPU limit and memory cap (cgroup), and the InnoDB buffer pool is resized online over
//! SQL, shrunk before the cap comes down and grown after it rises (see [`apply`]).
//! `/status` shows the last change's steps in order (`last_scale`).

use super::{Lifecycle, Phase, ScaleStep};
use crate::backend::BackendConn;
use crate::Shared;
use holdfast_cluster::control::monitor_connect;
use holdfast_serverless::autoscale::{Autoscaler, ScalePolicyExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples and scales until the process ends.
pub async fn run(shared: Arc<Shared>, lc: Arc<Lifecycle>) {
    // (A process taking over starts from the size the other one ran at.)
    lc.wait_in_charge().await;
    let mut scaler = Autoscaler::new(lc.config().scale.clone(), lc.ccu());
    let origin = Instant::now();
    let mut last: Option<(f64, Instant)> = None;
    // The size is applied again after every resume: a restarted server has its configured
    // buffer pool and a new process outside the cgroup.
    let mut applied_epoch: Option<u64> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        // A reloaded `[serverless.scale]` from the next sample on, at the size in force.
        let policy = lc.config().scale.clone();
        if *scaler.policy() != policy {
            let current = policy.snap(scaler.current());
            scaler = Autoscaler::new(policy, current);
        }
        if lc.phase() != Phase::Running {
            last = None;
            continue;
        }
        let Some(_acting) = lc.act().await else {
            // Another process runs the instance: this one applies nothing (and the size
            // again should it take charge back).
            last = None;
            applied_epoch = None;
            continue;
        };
        let requested = lc.lock().requested_ccu;
        if let Some(asked) = requested {
            let ccu = lc.config().scale.snap(asked);
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
                // An operator's size holds until `ctl scale auto`.
                if lc.config().autoscale && lc.manual_ccu().is_none() {
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

/// Applies a size: CPU limit and memory cap through the driver, buffer pool (and
/// max_connections when configured) over SQL. Failures are logged and shown in status; the
/// size is recorded either way (it is what is billed).
///
/// The order matters for memory: the cap must never fall below what the server holds, or
/// the kernel reclaims or (cgroup v2) OOM-kills it. Growing, the cap rises first and the
/// buffer pool grows after; shrinking, the buffer pool shrinks first (and its resize has
/// finished) before the cap comes down. A shrink that fails leaves the limits as they were.
async fn apply(shared: &Shared, lc: &Lifecycle, ccu: f64, why: &'static str) {
    let from = lc.ccu();
    let mut notes = Vec::new();
    let mut steps = Vec::new();
    let mut settings = Vec::new();
    let mib = lc.config().buffer_pool_mib_per_ccu;
    let pool = (mib > 0).then_some((ccu * mib as f64 * 1024.0 * 1024.0) as u64);
    if let Some(bytes) = pool {
        settings.push(("innodb_buffer_pool_size", bytes));
    }
    let per_ccu = lc.config().max_connections_per_ccu;
    if per_ccu > 0 {
        // Never below what is open now: lowering it does not close connections, but new
        // ones would be refused while the count is above it.
        let open = shared.sessions.len() as u64 + 10;
        settings.push(("max_connections", ((ccu * per_ccu as f64) as u64).max(open)));
    }
    let mut conn = None;
    if !settings.is_empty() {
        match monitor_connect(&shared.config_snapshot(), &lc.address).await {
            Ok(c) => conn = Some(c),
            Err(e) => notes.push(format!("server settings not changed: {e}")),
        }
    }
    // Shrinking when the size goes down, or when the server's pool is larger than the new
    // size's (a restarted server has its configured pool).
    let current_pool = match (&mut conn, pool) {
        (Some(c), Some(_)) => current_buffer_pool(c).await,
        _ => None,
    };
    let shrinking = ccu < from || matches!((current_pool, pool), (Some(c), Some(p)) if p < c);
    if !shrinking {
        set_limits(lc, ccu, &mut notes, &mut steps).await;
    }
    let mut settings_applied = settings.is_empty();
    if let Some(c) = conn.as_mut() {
        match set_globals(c, &settings, current_pool).await {
            Ok(done) => {
                settings_applied = true;
                steps.push(ScaleStep {
                    what: "server",
                    detail: done.join(", "),
                });
                notes.extend(done);
            }
            Err(e) => notes.push(format!("server settings not changed: {e}")),
        }
    }
    if shrinking {
        if settings_applied {
            set_limits(lc, ccu, &mut notes, &mut steps).await;
        } else {
            notes.push("limits kept: the buffer pool did not shrink".to_string());
        }
    }
    {
        let mut inner = lc.lock();
        inner.ccu = ccu;
        inner.last_scale = steps;
    }
    shared.metrics.instance_ccu.set(ccu);
    tracing::info!(instance = %lc.config().instance, from, to = ccu, why, applied = %notes.join("; "), "instance scaled");
    // (The fleet's members show the size too.)
    super::fleet::say_phase(shared, lc, 0).await;
}

/// The driver's limits (CPU, memory cap) for `ccu`.
async fn set_limits(lc: &Lifecycle, ccu: f64, notes: &mut Vec<String>, steps: &mut Vec<ScaleStep>) {
    let note = match lc.driver.scale(ccu).await {
        Ok(applied) => applied.note,
        Err(e) => format!("cpu limit not applied: {e}"),
    };
    steps.push(ScaleStep {
        what: "limits",
        detail: note.clone(),
    });
    notes.push(note);
}

/// The server's buffer pool size now, if it can be read.
async fn current_buffer_pool(conn: &mut BackendConn) -> Option<u64> {
    let r = conn
        .query("SELECT @@GLOBAL.innodb_buffer_pool_size")
        .await
        .ok()?;
    r.rows.first()?.first()?.as_deref()?.parse().ok()
}

/// How long a buffer pool resize may take before the scale goes on without it.
const RESIZE_DEADLINE: Duration = Duration::from_secs(60);

/// Sets global server variables over the monitor connection (all are dynamic: no
/// restart). A buffer pool resize (unless the size is already `current_pool`) is waited
/// for: older servers resize in the background (`Innodb_buffer_pool_resize_status` says
/// "Completed resizing buffer pool" when done); newer ones (MariaDB 10.11.12+, 11.8) resize
/// inside the SET and leave the status empty. Returns what was set.
async fn set_globals(
    conn: &mut BackendConn,
    settings: &[(&str, u64)],
    current_pool: Option<u64>,
) -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    for (name, value) in settings {
        let resize = *name == "innodb_buffer_pool_size" && current_pool != Some(*value);
        if *name == "innodb_buffer_pool_size" && !resize {
            done.push(format!("{name}={value} (unchanged)"));
            continue;
        }
        conn.query(&format!("SET GLOBAL {name} = {value}"))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        if resize {
            let status = wait_for_resize(conn).await?;
            done.push(format!("{name}={value} (resize done: {status:?})"));
        } else {
            done.push(format!("{name}={value}"));
        }
    }
    Ok(done)
}

/// Waits until the buffer pool resize the last SET started has finished; returns the
/// resize status as last read.
async fn wait_for_resize(conn: &mut BackendConn) -> Result<String, String> {
    let deadline = Instant::now() + RESIZE_DEADLINE;
    loop {
        let r = conn
            .query("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_resize_status'")
            .await
            .map_err(|e| format!("reading the resize status: {e}"))?;
        let status = r
            .rows
            .first()
            .and_then(|row| row.get(1).cloned().flatten())
            .unwrap_or_default();
        if status.is_empty() || status.starts_with("Completed") {
            return Ok(status);
        }
        if status.contains("failed") || status.contains("aborted") {
            return Err(format!("buffer pool resize: {status}"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "buffer pool resize not done after {} s: {status}",
                RESIZE_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
