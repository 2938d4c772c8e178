//! Prometheus metrics. Everything touched per query is a pre-resolved atomic counter or the
//! lock-free [`LatencyHistogram`]; label lookups happen only on rare paths (errors, rejects).

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod request;
use request::Direction;
pub use request::RequestStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabel {
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

const PHASES: [&str; 4] = ["running", "pausing", "paused", "resuming"];

/// Upper bounds in seconds.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The bucket a duration falls in (the last one: above every bound).
fn bucket_index(d: Duration) -> usize {
    let secs = d.as_secs_f64();
    BUCKETS
        .iter()
        .position(|&b| secs <= b)
        .unwrap_or(BUCKETS.len())
}

/// Encodes per-bucket counts (one per bound, then the overflow) as a Prometheus histogram;
/// prometheus-client accumulates them itself.
fn encode_histogram(
    encoder: &mut MetricEncoder,
    sum_secs: f64,
    counts: &[u64],
) -> Result<(), std::fmt::Error> {
    let bounds = BUCKETS.iter().copied().chain(std::iter::once(f64::MAX));
    let buckets: Vec<(f64, u64)> = bounds.zip(counts.iter().copied()).collect();
    let total = counts.iter().sum();
    encoder.encode_histogram::<()>(sum_secs, total, &buckets, None)
}

/// A fixed-bucket histogram built from atomics, so recording never takes a lock; for rare
/// events (moves, resumes). Clones share the same counts.
#[derive(Debug, Default, Clone)]
pub struct LatencyHistogram(Arc<HistogramCells>);

#[derive(Debug, Default)]
pub struct HistogramCells {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, d: Duration) {
        self.0.buckets[bucket_index(d)].fetch_add(1, Ordering::Relaxed);
        self.0.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }

    pub fn mean(&self) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.0.sum_nanos.load(Ordering::Relaxed) / n)
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self
            .0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encode_histogram(&mut encoder, sum, &counts)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Registers a new metric under `name` and returns a handle to it.
fn register<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: Default + Clone + EncodeMetric + std::fmt::Debug + Send + Sync + 'static,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Parked sockets (see `parking.rs`): each parked one holds this (one pointer) to count
/// itself out when it is taken back or dropped.
pub struct IdleSockets {
    /// Parked now.
    pub parked: Gauge,
    /// Taken back into the reactor: their session woke for a request, its server, a
    /// hand-over, its end of idling.
    pub woken: Counter,
}

/// All of holdfast's metrics, registered once.
pub struct Metrics {
    pub registry: Registry,
    pub connections_accepted: Counter,
    pub connections_rejected: Family<ReasonLabel, Counter>,
    pub logins: Counter,
    pub logins_failed: Counter,
    pub logins_delayed: Counter,
    pub logins_held: Counter,
    pub sessions_active: Gauge,
    pub sessions_passthrough_auth: Gauge,
    /// Pass-through sessions whose bytes the kernel relays (a BPF sockmap).
    pub sessions_kernel_relayed: Gauge,
    /// Sockets of long-idle sessions parked out of the reactor (see `parking.rs`).
    pub idle_sockets: Arc<IdleSockets>,
    /// Idle sessions woken by a change they may have to act on.
    pub idle_sessions_rung: Counter,
    pub errors_sent: Family<CodeLabel, Counter>,
    pub backend_connects: Counter,
    pub backend_connect_failures: Counter,
    /// Commands, client bytes and command latency: touched by every request.
    pub requests: RequestStats,
    pub sessions_moved: Counter,
    /// Sessions given to the process that replaced this one (an upgrade), and taken from
    /// the one this one replaced.
    pub sessions_handed_over: Counter,
    pub sessions_taken_over: Counter,
    pub move_latency: LatencyHistogram,
    pub move_failures: Family<ReasonLabel, Counter>,
    /// Transactions lost with their backend and run again, by outcome (`replayed`,
    /// `diverged`, `failed`).
    pub transaction_replays: Family<ReasonLabel, Counter>,
    /// COMMITs lost in flight whose marker was read, by outcome.
    pub commit_outcomes: Family<ReasonLabel, Counter>,
    pub sessions_closed: Family<ReasonLabel, Counter>,
    pub requests_held: Counter,
    pub requests_retried: Counter,
    /// Backend connections the network cut while their server kept them: killed by
    /// holdfast before the session recovered.
    pub cut_connections_fenced: Counter,
    pub requests_failed_on_backend_loss: Counter,
    /// Backend connections lost under a session, by when (`idle`, `request`), counted once
    /// holdfast has told whose loss it was (the network's or the server's).
    pub backend_connections_lost: Family<ReasonLabel, Counter>,
    /// Split sessions: reads run on a replica.
    pub reads_on_replicas: Counter,
    /// Split sessions: reads that could have run on a replica and ran on the primary, by
    /// why (`no_replica`, `replica_unreachable`, `causal_timeout`, `replica_lost`...).
    pub reads_fallback: Family<ReasonLabel, Counter>,
    /// Waits for a replica to catch up before a read (read-your-writes), and how long.
    pub causal_waits: LatencyHistogram,
    /// Serverless instance: one gauge per phase, 1 for the current one.
    instance_phase: Family<PhaseLabel, Gauge>,
    instance_transitions: Family<TransitionLabel, Counter>,
    pub instance_resume_latency: LatencyHistogram,
    pub instance_resume_failures: Counter,
    pub instance_ccu: Gauge<f64, AtomicU64>,
    pub instance_ccu_seconds: Counter<f64, AtomicU64>,
    pub instance_cpu_used: Gauge<f64, AtomicU64>,
    pub instance_storage_bytes: Gauge,
    /// Wakes asked for, by trigger (login, statement, admin).
    pub instance_wakes: Family<ReasonLabel, Counter>,
    /// Connections to a paused instance closed without waking it, by reason.
    pub closed_without_wake: Family<ReasonLabel, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("holdfast");
        let r = &mut registry;
        let requests = RequestStats::default();
        r.register(
            "commands",
            "Client commands, by command",
            requests.commands_metric(),
        );
        r.register(
            "client_bytes_received",
            "Bytes read from clients",
            requests.bytes_metric(Direction::FromClients),
        );
        r.register(
            "client_bytes_sent",
            "Bytes written to clients",
            requests.bytes_metric(Direction::ToClients),
        );
        r.register(
            "command_latency_seconds",
            "Time from a client command's arrival to the end of its response",
            requests.latency_metric(),
        );
        Metrics {
            connections_accepted: register(r, "client_connections", "Client TCP connections accepted"),
            connections_rejected: register(r, "client_connections_rejected", "Client connections closed before or during login, by reason"),
            logins: register(r, "logins", "Client logins completed"),
            logins_failed: register(r, "logins_failed", "Logins refused (wrong password)"),
            logins_held: register(
                r,
                "logins_held",
                "Logins that waited for a writable node (failover, switchover, restart)",
            ),
            logins_delayed: register(
                r,
                "logins_delayed",
                "Wrong-password refusals held back after repeated failures from an address or for an account",
            ),
            sessions_active: register(r, "sessions", "Client sessions currently open"),
            sessions_passthrough_auth: register(r, "sessions_passthrough_auth", "Open sessions whose login was relayed (they cannot re-authenticate elsewhere)"),
            sessions_kernel_relayed: register(r, "sessions_kernel_relayed", "Open pass-through sessions whose bytes the kernel relays (a BPF sockmap; [proxy] kernel_relay)"),
            idle_sockets: Arc::new(IdleSockets {
                parked: register(r, "idle_sockets_parked", "Sockets of sessions idle for a second or more, watched by one epoll set of the process instead of the async runtime (less memory per idle session)"),
                woken: register(r, "idle_sockets_woken", "Parked sockets taken back into the async runtime (their session woke: a request, its server, a hand-over); a topology change that does not concern a session leaves its sockets parked"),
            }),
            idle_sessions_rung: register(r, "idle_sessions_rung", "Wake-ups of idle sessions by a change they may have to act on: the topology (a replica's lag, a node's state), a switchover, a hand-over"),
            errors_sent: register(r, "errors", "ERR packets sent to clients, by MySQL error code"),
            backend_connects: register(r, "backend_connects", "Backend connections opened"),
            backend_connect_failures: register(r, "backend_connect_failures", "Backend connections that failed to open or log in"),
            sessions_moved: register(r, "sessions_moved", "Sessions moved to another backend connection with their state"),
            sessions_handed_over: register(r, "sessions_handed_over", "Sessions given, with their connections, to the process that replaced this one (holdfast ctl upgrade)"),
            sessions_taken_over: register(r, "sessions_taken_over", "Sessions taken, with their connections, from the process this one replaced (holdfast ctl upgrade)"),
            move_latency: register(r, "session_move_seconds", "Time to move a session: log in on the new node, restore state, re-prepare"),
            move_failures: register(r, "session_move_failures", "Attempts to move a session that failed, by reason"),
            transaction_replays: register(r, "transaction_replays", "Open transactions lost with their backend and replayed on the new one, by outcome: replayed (every answer compared equal), diverged (rolled back, the client got 1213), failed (the backend was lost again), too_large (its replay log outgrew replay_max_bytes; the client got 1213), not_replayable (for another reason; the client got 1213)"),
            commit_outcomes: register(r, "lost_commit_outcomes", "COMMITs whose answer was lost with their backend, by what their commit marker told: committed (the client got OK), replayed (not committed; replayed and committed again), rolled_back (not committed; the client got 1213), unknown (the marker could not be read, or the COMMIT had none: the client got 1180), nothing_written (the transaction wrote nothing: the client got OK)"),
            sessions_closed: register(r, "sessions_closed_by_holdfast", "Sessions holdfast had to close, by reason"),
            requests_held: register(r, "requests_held", "Requests that waited for a backend while it was switching"),
            requests_retried: register(r, "requests_retried", "In-flight requests re-run on a new backend after the old one was lost"),
            cut_connections_fenced: register(r, "cut_connections_fenced", "Backend connections the network cut while their server kept running them, killed by holdfast before the session recovered"),
            requests_failed_on_backend_loss: register(r, "requests_failed_on_backend_loss", "In-flight requests answered with an error because their backend was lost"),
            backend_connections_lost: register(r, "backend_connections_lost", "Backend connections lost under a session, by when: idle (between requests), request (during one)"),
            reads_on_replicas: register(r, "reads_on_replicas", "Split sessions: reads run on a replica"),
            reads_fallback: register(r, "reads_fallback", "Split sessions: reads that could run on a replica but ran on the primary, by reason"),
            causal_waits: register(r, "causal_wait_seconds", "Split sessions: waits for a replica to reach the position a read must see (MASTER_GTID_WAIT), fallbacks included"),
            instance_phase: register(r, "instance_phase", "Serverless instance: 1 for the phase it is in (running, pausing, paused, resuming)"),
            instance_transitions: register(r, "instance_transitions", "Serverless instance lifecycle transitions (running, frozen, stopped)"),
            instance_resume_latency: register(r, "instance_resume_seconds", "Time to resume a paused instance (thaw or start, until it answers)"),
            instance_resume_failures: register(r, "instance_resume_failures", "Resume attempts that failed (retried with backoff)"),
            instance_ccu: register(r, "instance_ccu", "Serverless instance size in capacity units (1 CCU = 1 CPU + 2 GiB)"),
            instance_ccu_seconds: register(r, "instance_ccu_seconds", "Capacity-unit seconds used (counted while the instance is not paused)"),
            instance_cpu_used: register(r, "instance_cpu_used", "CPUs the instance's server used over the last second"),
            instance_storage_bytes: register(r, "instance_storage_bytes", "Bytes the instance stores (its data directory)"),
            instance_wakes: register(r, "instance_wakes", "Requests to wake the paused instance, by trigger"),
            closed_without_wake: register(r, "closed_without_wake", "Connections to the paused instance closed without waking it, by reason"),
            requests,
            registry,
        }
    }

    pub fn set_instance_phase(&self, phase: &'static str) {
        for p in PHASES {
            self.instance_phase
                .get_or_create(&PhaseLabel { phase: p })
                .set(i64::from(p == phase));
        }
    }

    pub fn instance_transition(&self, from: &'static str, to: &'static str) {
        self.instance_transitions
            .get_or_create(&TransitionLabel { from, to })
            .inc();
    }

    pub fn wake(&self, trigger: &'static str) {
        self.instance_wakes
            .get_or_create(&ReasonLabel { reason: trigger })
            .inc();
    }

    pub fn count_closed_without_wake(&self, reason: &'static str) {
        self.closed_without_wake
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn count_error(&self, code: u16) {
        self.errors_sent.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn session_closed(&self, reason: &'static str) {
        self.sessions_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn backend_lost(&self, reason: &'static str) {
        self.backend_connections_lost
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn move_failed(&self, reason: &'static str) {
        self.move_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn read_fallback(&self, reason: &'static str) {
        self.reads_fallback
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn replay(&self, outcome: &'static str) {
        self.transaction_replays
            .get_or_create(&ReasonLabel { reason: outcome })
            .inc();
    }

    pub fn commit_outcome(&self, outcome: &'static str) {
        self.commit_outcomes
            .get_or_create(&ReasonLabel { reason: outcome })
            .inc();
    }

    pub fn reject(&self, reason: &'static str) {
        self.connections_rejected
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.push_str("# encoding failed\n");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histogram_and_counters() {
        let m = Metrics::new();
        m.requests.latency(Duration::from_micros(300));
        m.requests.latency(Duration::from_secs(20));
        m.requests.command(3);
        m.count_error(1045);
        let text = m.render();
        assert!(
            text.contains("holdfast_command_latency_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("holdfast_commands_total{command=\"COM_QUERY\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("holdfast_errors_total{code=\"1045\"} 1"),
            "{text}"
        );
    }
}
