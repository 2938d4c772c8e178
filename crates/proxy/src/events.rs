//! What happened, for people: the HA and serverless events (a new primary, an operation
//! started, done or failed, a node lost or back, the instance paused, resumed or resized),
//! each with its time, the last [`KEPT`] of them. `/status` shows them and the dashboard
//! draws them. A task looks at the state the rest of holdfast already publishes twice a
//! second and notes what changed: nothing on the per-query path.

use crate::Shared;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Events remembered.
pub const KEPT: usize = 100;
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// How long the events wait for the monitor's first look at the nodes.
const FIRST_LOOK_WITHIN: Duration = Duration::from_secs(10);

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub unix_ms: u64,
    /// `primary`, `switchover`, `failover`, `rejoin`, `node`, `instance`.
    pub kind: String,
    pub text: String,
    /// Something went wrong (an operation failed, a node was lost).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bad: bool,
}

/// The last events, oldest first.
#[derive(Default)]
pub struct EventLog {
    events: Mutex<VecDeque<Event>>,
}

impl EventLog {
    pub fn note(&self, kind: &str, text: String, bad: bool) {
        let event = Event {
            unix_ms: unix_ms(),
            kind: kind.into(),
            text,
            bad,
        };
        if bad {
            tracing::warn!(kind, text = %event.text, "event");
        }
        let mut events = self.lock();
        if events.len() >= KEPT {
            events.pop_front();
        }
        events.push_back(event);
    }

    pub fn recent(&self) -> Vec<Event> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Event>> {
        // A panic while pushing leaves a whole queue.
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the events are told from.
#[derive(Clone, PartialEq)]
struct Seen {
    primary: Option<String>,
    running: Option<(String, bool, u64)>,
    last: Option<(u64, String, bool, String)>,
    reachable: Vec<(String, bool)>,
    phase: Option<(String, Option<String>)>,
    ccu: Option<f64>,
}

fn look(shared: &Shared) -> Seen {
    let topology = shared.topology.borrow().clone();
    let ha = shared.ha.state();
    let instance = shared.serverless.as_ref().map(|l| l.view());
    Seen {
        primary: topology
            .primary
            .and_then(|i| topology.nodes.get(i))
            .map(|n| n.name.to_string()),
        running: ha
            .in_progress
            .as_ref()
            .map(|r| (r.operation.to_string(), r.automatic, r.started_unix_ms)),
        last: ha.last.as_ref().map(|l| {
            let what = if l.ok {
                l.summary.clone()
            } else {
                l.error.clone().unwrap_or_default()
            };
            (
                l.finished_unix_ms,
                l.operation.to_string(),
                l.ok,
                format!("in {:.0} ms: {what}", l.duration_ms),
            )
        }),
        reachable: topology
            .nodes
            .iter()
            .map(|n| (n.name.to_string(), n.reachable))
            .collect(),
        phase: instance.as_ref().map(|v| {
            (
                v.phase.name().to_string(),
                v.tier.map(|t| t.name().to_string()),
            )
        }),
        ccu: instance.as_ref().map(|v| v.ccu),
    }
}

/// Notes in `log` what changed from `before` to `now`.
fn compare(log: &EventLog, before: &Seen, now: &Seen) {
    if before.primary != now.primary {
        let name = |p: &Option<String>| p.clone().unwrap_or_else(|| "none".into());
        log.note(
            "primary",
            format!("primary {} → {}", name(&before.primary), name(&now.primary)),
            now.primary.is_none(),
        );
    }
    if let Some((op, automatic, started)) = &now.running {
        if before.running.as_ref().map(|r| r.2) != Some(*started) {
            let how = if *automatic { " (automatic)" } else { "" };
            log.note(op, format!("{op} started{how}"), false);
        }
    }
    if let Some((finished, op, ok, what)) = &now.last {
        if before.last.as_ref().map(|l| l.0) != Some(*finished) {
            let how = if *ok { "done" } else { "failed" };
            log.note(op, format!("{op} {how} {what}"), !ok);
        }
    }
    for (name, reachable) in &now.reachable {
        match before.reachable.iter().find(|(n, _)| n == name) {
            None => log.note("node", format!("node {name} added"), false),
            Some((_, was)) if was != reachable => {
                let what = if *reachable {
                    "reachable again"
                } else {
                    "unreachable"
                };
                log.note("node", format!("node {name} {what}"), !reachable);
            }
            Some(_) => {}
        }
    }
    for (name, _) in &before.reachable {
        if !now.reachable.iter().any(|(n, _)| n == name) {
            log.note("node", format!("node {name} removed"), false);
        }
    }
    if let Some((phase, tier)) = &now.phase {
        if before.phase.as_ref().map(|p| &p.0) != Some(phase) {
            let tier = tier.as_ref().map(|t| format!(" ({t})")).unwrap_or_default();
            log.note("instance", format!("instance {phase}{tier}"), false);
        }
    }
    if let (Some(was), Some(is)) = (before.ccu, now.ccu) {
        if (was - is).abs() > f64::EPSILON {
            log.note(
                "instance",
                format!("instance resized {was} → {is} CCU"),
                false,
            );
        }
    }
}

/// Follows holdfast's state for as long as the process runs.
pub async fn follow(shared: Arc<Shared>) {
    // From the monitor's first look at the nodes on: before it, every node counts as
    // unreachable and no primary is known, which is no event.
    let mut topology = shared.topology.clone();
    let _ = tokio::time::timeout(FIRST_LOOK_WITHIN, topology.changed()).await;
    let mut before = look(&shared);
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = look(&shared);
        if now != before {
            compare(&shared.events, &before, &now);
            before = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> Seen {
        Seen {
            primary: Some("node1".into()),
            running: None,
            last: None,
            reachable: vec![("node1".into(), true), ("node2".into(), true)],
            phase: None,
            ccu: None,
        }
    }

    #[test]
    fn a_switchover_is_told_as_it_went() {
        let log = EventLog::default();
        let before = seen();
        let mut running = seen();
        running.running = Some(("switchover".into(), false, 10));
        compare(&log, &before, &running);
        let mut done = seen();
        done.primary = Some("node2".into());
        done.last = Some((
            20,
            "switchover".into(),
            true,
            "in 45 ms: node1 -> node2".into(),
        ));
        compare(&log, &running, &done);
        let texts: Vec<String> = log.recent().into_iter().map(|e| e.text).collect();
        assert_eq!(
            texts,
            [
                "switchover started",
                "primary node1 → node2",
                "switchover done in 45 ms: node1 -> node2"
            ]
        );
    }

    #[test]
    fn nodes_lost_and_the_instance_paused_are_told_and_the_log_is_bounded() {
        let log = EventLog::default();
        let before = seen();
        let mut now = seen();
        now.reachable[1].1 = false;
        now.phase = Some(("paused".into(), Some("freeze".into())));
        compare(&log, &before, &now);
        let events = log.recent();
        assert!(events
            .iter()
            .any(|e| e.text == "node node2 unreachable" && e.bad));
        assert!(events.iter().any(|e| e.text == "instance paused (freeze)"));
        for i in 0..2 * KEPT {
            log.note("node", format!("{i}"), false);
        }
        assert_eq!(log.recent().len(), KEPT);
    }
}
