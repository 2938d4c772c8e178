//! Deciding that the primary is lost, and keeping a flapping node from causing a series of
//! failovers. Also the "external" mode helper: which node is writable.

use super::probe::{probe_all, NodeReplication, NodeSession};
use super::{HaConfig, HaError};
use crate::config::{BackendConfig, Config};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Counts failed probes: the primary is lost after `threshold` failures in a row that span
/// at least `window` (from the first failed probe). One successful probe resets it.
#[derive(Debug, Clone)]
pub struct LossDetector {
    threshold: u32,
    window: Duration,
    consecutive: u32,
    first_failure: Option<Instant>,
    /// Refused connections in a row, and how many make the node lost at once (0: never).
    refused: u32,
    refused_threshold: u32,
}

impl LossDetector {
    pub fn new(threshold: u32, window: Duration) -> Self {
        LossDetector {
            threshold: threshold.max(1),
            window,
            consecutive: 0,
            first_failure: None,
            refused: 0,
            refused_threshold: 0,
        }
    }

    /// Also lost after `n` refused connections in a row (0: not on that alone).
    pub fn with_refused_threshold(mut self, n: u32) -> Self {
        self.refused_threshold = n;
        self
    }

    pub fn from_config(ha: &HaConfig) -> Self {
        Self::new(ha.failure_threshold, ha.failover_after())
            .with_refused_threshold(ha.refused_probes_to_fail)
    }

    /// The thresholds of `ha` (a reload), keeping what was observed so far.
    pub fn set_config(&mut self, ha: &HaConfig) {
        self.threshold = ha.failure_threshold.max(1);
        self.window = ha.failover_after();
        self.refused_threshold = ha.refused_probes_to_fail;
    }

    /// Records one probe whose connection was refused (the host answered, no server
    /// listens): true once the node counts as lost.
    pub fn observe_refused(&mut self, now: Instant) -> bool {
        let by_window = self.failed(now);
        self.refused = self.refused.saturating_add(1);
        by_window || (self.refused_threshold > 0 && self.refused >= self.refused_threshold)
    }

    /// Records one probe; true once the node counts as lost.
    pub fn observe(&mut self, ok: bool, now: Instant) -> bool {
        self.refused = 0;
        if ok {
            self.consecutive = 0;
            self.first_failure = None;
            return false;
        }
        self.failed(now)
    }

    fn failed(&mut self, now: Instant) -> bool {
        self.consecutive = self.consecutive.saturating_add(1);
        let first = *self.first_failure.get_or_insert(now);
        self.consecutive >= self.threshold && now.duration_since(first) >= self.window
    }

    /// Failed probes in a row so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }

    /// When the current run of failures began.
    pub fn first_failure(&self) -> Option<Instant> {
        self.first_failure
    }
}

/// How long to wait before the next probe of a node whose last probe failed: shorter
/// when refused connections may decide quickly (`ha.refused_probes_to_fail`).
pub fn retry_interval(ha: &HaConfig) -> Duration {
    if ha.refused_probes_to_fail > 0 {
        (ha.probe_interval() / 5).max(Duration::from_millis(20))
    } else {
        ha.probe_interval()
    }
}

/// Allows one failover per cool-off window, so a node that keeps dropping out and coming
/// back cannot trigger failover after failover.
#[derive(Debug, Clone)]
pub struct FailoverGuard {
    cooloff: Duration,
    last: Option<Instant>,
}

impl FailoverGuard {
    pub fn new(cooloff: Duration) -> Self {
        FailoverGuard {
            cooloff,
            last: None,
        }
    }

    pub fn from_config(ha: &HaConfig) -> Self {
        Self::new(ha.failover_cooloff())
    }

    /// How long ago the last failover was, if any (carried to a process that takes over).
    pub fn since_last(&self) -> Option<Duration> {
        self.last.map(|t| t.elapsed())
    }

    /// The last failover was `ago` (in the process this one took over from).
    pub fn set_last_ago(&mut self, ago: Duration) {
        self.last = Instant::now().checked_sub(ago);
    }

    /// The cool-off of `ha` (a reload); the last failover's time is kept.
    pub fn set_config(&mut self, ha: &HaConfig) {
        self.cooloff = ha.failover_cooloff();
    }

    /// Ok when a failover may start now.
    pub fn check(&self, now: Instant) -> Result<(), HaError> {
        match self.last {
            Some(last) if now.duration_since(last) < self.cooloff => {
                let since = now.duration_since(last);
                Err(HaError::CoolingOff {
                    since,
                    remaining: self.cooloff - since,
                })
            }
            _ => Ok(()),
        }
    }

    /// Records that a failover started at `now`.
    pub fn record(&mut self, now: Instant) {
        self.last = Some(now);
    }

    /// [`check`](Self::check) and, when allowed, [`record`](Self::record).
    pub fn try_begin(&mut self, now: Instant) -> Result<(), HaError> {
        self.check(now)?;
        self.record(now);
        Ok(())
    }
}

/// How a replica sees the primary during the cross-check.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaView {
    pub name: String,
    pub io_running: String,
    pub last_io_errno: u32,
    pub last_io_error: String,
}

/// The evidence for "primary lost".
#[derive(Debug, Clone, Serialize)]
pub struct LossReport {
    pub primary: String,
    pub failed_probes: u32,
    /// From the first failed probe to the decision.
    #[serde(serialize_with = "super::ops::ser_ms")]
    pub decided_after: Duration,
    pub last_error: String,
    pub replicas: Vec<ReplicaView>,
}

/// Outcome of [`detect_primary_loss`].
#[derive(Debug, Clone, Serialize)]
pub enum LossVerdict {
    /// The primary is lost and (if configured) every reachable replica agrees.
    Lost(LossReport),
    /// The primary answered at the end of the watch.
    Alive,
    /// Probes failed but the replicas did not confirm (or there were none to ask).
    Unconfirmed { failed_probes: u32, reason: String },
}

/// Whether every replica of `primary` among `probes` has lost it; `Err(reason)` if not.
pub fn replicas_confirm_loss(
    probes: &[NodeReplication],
    primary: &BackendConfig,
) -> Result<Vec<ReplicaView>, String> {
    let mut views = Vec::new();
    let mut still_connected = Vec::new();
    for p in probes
        .iter()
        .filter(|p| p.name != primary.name && p.reachable)
    {
        let Some(s) = p.slave.as_ref().filter(|s| s.points_at(&primary.address)) else {
            continue;
        };
        if s.io_connected() && s.last_io_errno == 0 {
            still_connected.push(p.name.clone());
        }
        views.push(ReplicaView {
            name: p.name.clone(),
            io_running: s.io_running.clone(),
            last_io_errno: s.last_io_errno,
            last_io_error: s.last_io_error.clone(),
        });
    }
    if views.is_empty() {
        return Err(format!("no reachable replica of {}", primary.name));
    }
    if !still_connected.is_empty() {
        return Err(format!(
            "still connected to {}: {}",
            primary.name,
            still_connected.join(", ")
        ));
    }
    Ok(views)
}

/// Probes `primary` every `ha.probe_interval` for up to `watch_for` and decides whether
/// it is lost: [`LossDetector`] rules, then (with `ha.require_replica_confirmation`) every
/// reachable replica must have lost its connection to it as well.
pub async fn detect_primary_loss(
    cfg: &Config,
    nodes: &[BackendConfig],
    primary: &str,
    ha: &HaConfig,
    watch_for: Duration,
) -> Result<LossVerdict, HaError> {
    let node = nodes
        .iter()
        .find(|n| n.name == primary)
        .ok_or_else(|| HaError::UnknownNode(primary.to_string()))?;
    let deadline = Instant::now() + watch_for;
    let mut detector = LossDetector::from_config(ha);
    let mut session: Option<NodeSession> = None;
    let mut last_ok;
    let mut last_error = String::new();
    let mut unconfirmed = String::new();
    loop {
        let started = Instant::now();
        let probe = async {
            if session.is_none() {
                session = Some(NodeSession::connect(cfg, node, ha.probe_timeout()).await?);
            }
            match session.as_mut() {
                Some(s) => s
                    .query_within("SELECT 1", ha.probe_timeout())
                    .await
                    .map(|_| ()),
                None => Ok(()),
            }
        };
        let result = probe.await;
        last_ok = result.is_ok();
        let refused = result
            .as_ref()
            .err()
            .is_some_and(HaError::is_connection_refused);
        if let Err(e) = &result {
            session = None;
            last_error = e.to_string();
            tracing::debug!(node = %primary, error = %e, failures = detector.consecutive_failures() + 1, "ha: primary probe failed");
        }
        let now = Instant::now();
        let lost = match refused {
            true => detector.observe_refused(now),
            false => detector.observe(last_ok, now),
        };
        if lost {
            let confirmed = if ha.require_replica_confirmation {
                let others: Vec<BackendConfig> = nodes
                    .iter()
                    .filter(|n| n.name != primary)
                    .cloned()
                    .collect();
                let probes = probe_all(cfg, &others, ha.probe_timeout()).await;
                replicas_confirm_loss(&probes, node)
            } else {
                Ok(Vec::new())
            };
            match confirmed {
                Ok(replicas) => {
                    let decided_after = detector
                        .first_failure()
                        .map_or(Duration::ZERO, |f| Instant::now().duration_since(f));
                    tracing::warn!(node = %primary, failed_probes = detector.consecutive_failures(), ?decided_after, error = %last_error, "ha: primary lost");
                    return Ok(LossVerdict::Lost(LossReport {
                        primary: primary.to_string(),
                        failed_probes: detector.consecutive_failures(),
                        decided_after,
                        last_error,
                        replicas,
                    }));
                }
                Err(reason) => {
                    if reason != unconfirmed {
                        tracing::warn!(node = %primary, %reason, "ha: primary probes fail but the replicas do not confirm");
                    }
                    unconfirmed = reason;
                }
            }
        }
        if now >= deadline {
            break;
        }
        let next = started
            + match last_ok {
                true => ha.probe_interval(),
                false => retry_interval(ha),
            };
        tokio::time::sleep_until(next.min(deadline).into()).await;
    }
    Ok(if last_ok {
        LossVerdict::Alive
    } else {
        LossVerdict::Unconfirmed {
            failed_probes: detector.consecutive_failures(),
            reason: if unconfirmed.is_empty() {
                format!("probes failing ({last_error}) but not yet long enough")
            } else {
                unconfirmed
            },
        }
    })
}

/// "External" mode: the one reachable node with `read_only=OFF`, `None` when there is
/// none, an error when there are several (split brain: route nowhere rather than guess).
pub fn find_writable(probes: &[NodeReplication]) -> Result<Option<&NodeReplication>, HaError> {
    let writable: Vec<&NodeReplication> = probes.iter().filter(|p| p.writable()).collect();
    match writable.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => Err(HaError::MultiplePrimaries(
            many.iter().map(|p| p.name.clone()).collect(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detector_needs_count_and_time() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = LossDetector::new(3, ms(1000));
        assert!(!d.observe(false, t0));
        assert!(!d.observe(false, t0 + ms(250)));
        assert!(!d.observe(false, t0 + ms(500)), "3 failures but only 0.5 s");
        assert!(d.observe(false, t0 + ms(1000)));
        // A success resets.
        assert!(!d.observe(true, t0 + ms(1100)));
        assert_eq!(d.consecutive_failures(), 0);
        assert!(!d.observe(false, t0 + ms(5000)));
        assert!(!d.observe(false, t0 + ms(7000)), "2 failures only");
        assert!(d.observe(false, t0 + ms(7001)));
    }

    #[test]
    fn refused_connections_in_a_row_decide_at_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut d = LossDetector::new(3, ms(1000)).with_refused_threshold(2);
        assert!(!d.observe_refused(t0));
        assert!(d.observe_refused(t0 + ms(50)), "two refusals in a row");
        // A timeout in between breaks the run; a success resets everything.
        let mut d = LossDetector::new(3, ms(1000)).with_refused_threshold(2);
        assert!(!d.observe_refused(t0));
        assert!(!d.observe(false, t0 + ms(50)));
        assert!(!d.observe_refused(t0 + ms(100)));
        assert!(d.observe_refused(t0 + ms(150)));
        assert!(!d.observe(true, t0 + ms(200)));
        assert!(!d.observe_refused(t0 + ms(250)));
        // Turned off: refusals count as any failure.
        let mut d = LossDetector::new(3, ms(1000));
        assert!(!d.observe_refused(t0));
        assert!(!d.observe_refused(t0 + ms(50)));
        assert!(
            !d.observe_refused(t0 + ms(100)),
            "3 failures but only 0.1 s"
        );
        assert!(d.observe_refused(t0 + ms(1000)));
    }

    #[test]
    fn guard_cools_off() {
        let t0 = Instant::now();
        let mut g = FailoverGuard::new(Duration::from_secs(60));
        assert!(g.try_begin(t0).is_ok());
        assert!(matches!(
            g.try_begin(t0 + Duration::from_secs(10)),
            Err(HaError::CoolingOff { .. })
        ));
        assert!(g.try_begin(t0 + Duration::from_secs(61)).is_ok());
    }
}
