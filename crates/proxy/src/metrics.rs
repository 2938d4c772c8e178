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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    pub command: &'static str,
}

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

/// A fixed-bucket histogram built from atomics, so recording never takes a lock.
/// Clones share the same counts.
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
        let secs = d.as_secs_f64();
        let idx = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        self.0.buckets[idx].fetch_add(1, Ordering::Relaxed);
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
        // prometheus-client accumulates the per-bucket counts itself.
        let mut total = 0;
        let mut buckets = Vec::with_capacity(BUCKETS.len() + 1);
        for (i, bound) in BUCKETS.iter().chain(std::iter::once(&f64::MAX)).enumerate() {
            let n = self.0.buckets[i].load(Ordering::Relaxed);
            total += n;
            buckets.push((*bound, n));
        }
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<()>(sum, total, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// All of holdfast's metrics, registered once.
pub struct Metrics {
    pub registry: Registry,
    pub connections_accepted: Counter,
    pub connections_rejected: Family<ReasonLabel, Counter>,
    pub logins_failed: Counter,
    pub sessions_active: Gauge,
    pub sessions_passthrough_auth: Gauge,
    pub errors_sent: Family<CodeLabel, Counter>,
    pub bytes_from_clients: Counter,
    pub bytes_to_clients: Counter,
    pub backend_connects: Counter,
    pub backend_connect_failures: Counter,
    pub query_latency: LatencyHistogram,
    pub sessions_moved: Counter,
    pub move_latency: LatencyHistogram,
    pub move_failures: Family<ReasonLabel, Counter>,
    pub sessions_closed: Family<ReasonLabel, Counter>,
    pub requests_held: Counter,
    pub requests_retried: Counter,
    pub requests_failed_on_backend_loss: Counter,
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
    commands: Family<CommandLabel, Counter>,
    command_counters: Vec<Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("holdfast");
        let connections_accepted = Counter::default();
        registry.register(
            "client_connections",
            "Client TCP connections accepted",
            connections_accepted.clone(),
        );
        let connections_rejected = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "client_connections_rejected",
            "Client connections closed before or during login, by reason",
            connections_rejected.clone(),
        );
        let logins_failed = Counter::default();
        registry.register(
            "logins_failed",
            "Logins refused (wrong password)",
            logins_failed.clone(),
        );
        let sessions_active = Gauge::default();
        registry.register(
            "sessions",
            "Client sessions currently open",
            sessions_active.clone(),
        );
        let sessions_passthrough_auth = Gauge::default();
        registry.register(
            "sessions_passthrough_auth",
            "Open sessions whose login was relayed (they cannot re-authenticate elsewhere)",
            sessions_passthrough_auth.clone(),
        );
        let errors_sent = Family::<CodeLabel, Counter>::default();
        registry.register(
            "errors",
            "ERR packets sent to clients, by MySQL error code",
            errors_sent.clone(),
        );
        let bytes_from_clients = Counter::default();
        registry.register(
            "client_bytes_received",
            "Bytes read from clients",
            bytes_from_clients.clone(),
        );
        let bytes_to_clients = Counter::default();
        registry.register(
            "client_bytes_sent",
            "Bytes written to clients",
            bytes_to_clients.clone(),
        );
        let backend_connects = Counter::default();
        registry.register(
            "backend_connects",
            "Backend connections opened",
            backend_connects.clone(),
        );
        let backend_connect_failures = Counter::default();
        registry.register(
            "backend_connect_failures",
            "Backend connections that failed to open or log in",
            backend_connect_failures.clone(),
        );
        let query_latency = LatencyHistogram::default();
        registry.register(
            "command_latency_seconds",
            "Time from a client command's arrival to the end of its response",
            query_latency.clone(),
        );
        let sessions_moved = Counter::default();
        registry.register(
            "sessions_moved",
            "Sessions moved to another backend connection with their state",
            sessions_moved.clone(),
        );
        let move_latency = LatencyHistogram::default();
        registry.register(
            "session_move_seconds",
            "Time to move a session: log in on the new node, restore state, re-prepare",
            move_latency.clone(),
        );
        let move_failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "session_move_failures",
            "Attempts to move a session that failed, by reason",
            move_failures.clone(),
        );
        let sessions_closed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "sessions_closed_by_holdfast",
            "Sessions holdfast had to close, by reason",
            sessions_closed.clone(),
        );
        let requests_held = Counter::default();
        registry.register(
            "requests_held",
            "Requests that waited for a backend while it was switching",
            requests_held.clone(),
        );
        let requests_retried = Counter::default();
        registry.register(
            "requests_retried",
            "In-flight requests re-run on a new backend after the old one was lost",
            requests_retried.clone(),
        );
        let requests_failed_on_backend_loss = Counter::default();
        registry.register(
            "requests_failed_on_backend_loss",
            "In-flight requests answered with an error because their backend was lost",
            requests_failed_on_backend_loss.clone(),
        );
        let instance_phase = Family::<PhaseLabel, Gauge>::default();
        registry.register(
            "instance_phase",
            "Serverless instance: 1 for the phase it is in (running, pausing, paused, resuming)",
            instance_phase.clone(),
        );
        let instance_transitions = Family::<TransitionLabel, Counter>::default();
        registry.register(
            "instance_transitions",
            "Serverless instance lifecycle transitions (running, frozen, stopped)",
            instance_transitions.clone(),
        );
        let instance_resume_latency = LatencyHistogram::default();
        registry.register(
            "instance_resume_seconds",
            "Time to resume a paused instance (thaw or start, until it answers)",
            instance_resume_latency.clone(),
        );
        let instance_resume_failures = Counter::default();
        registry.register(
            "instance_resume_failures",
            "Resume attempts that failed (retried with backoff)",
            instance_resume_failures.clone(),
        );
        let instance_ccu = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "instance_ccu",
            "Serverless instance size in capacity units (1 CCU = 1 CPU + 2 GiB)",
            instance_ccu.clone(),
        );
        let instance_ccu_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "instance_ccu_seconds",
            "Capacity-unit seconds used (counted while the instance is not paused)",
            instance_ccu_seconds.clone(),
        );
        let instance_cpu_used = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "instance_cpu_used",
            "CPUs the instance's server used over the last second",
            instance_cpu_used.clone(),
        );
        let instance_storage_bytes = Gauge::default();
        registry.register(
            "instance_storage_bytes",
            "Bytes the instance stores (its data directory)",
            instance_storage_bytes.clone(),
        );
        let instance_wakes = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "instance_wakes",
            "Requests to wake the paused instance, by trigger",
            instance_wakes.clone(),
        );
        let closed_without_wake = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "closed_without_wake",
            "Connections to the paused instance closed without waking it, by reason",
            closed_without_wake.clone(),
        );
        let commands = Family::<CommandLabel, Counter>::default();
        registry.register("commands", "Client commands, by command", commands.clone());
        let command_counters = (0..=0x1fu8)
            .map(|c| {
                commands
                    .get_or_create(&CommandLabel {
                        command: holdfast_wire::command::name(c),
                    })
                    .clone()
            })
            .collect();
        Metrics {
            registry,
            connections_accepted,
            connections_rejected,
            logins_failed,
            sessions_active,
            sessions_passthrough_auth,
            errors_sent,
            bytes_from_clients,
            bytes_to_clients,
            backend_connects,
            backend_connect_failures,
            query_latency,
            sessions_moved,
            move_latency,
            move_failures,
            sessions_closed,
            requests_held,
            requests_retried,
            requests_failed_on_backend_loss,
            instance_phase,
            instance_transitions,
            instance_resume_latency,
            instance_resume_failures,
            instance_ccu,
            instance_ccu_seconds,
            instance_cpu_used,
            instance_storage_bytes,
            instance_wakes,
            closed_without_wake,
            commands,
            command_counters,
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

    pub fn count_command(&self, cmd: u8) {
        match self.command_counters.get(usize::from(cmd)) {
            Some(c) => {
                c.inc();
            }
            None => {
                self.commands
                    .get_or_create(&CommandLabel {
                        command: "COM_UNKNOWN",
                    })
                    .inc();
            }
        }
    }

    pub fn count_error(&self, code: u16) {
        self.errors_sent.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn session_closed(&self, reason: &'static str) {
        self.sessions_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn move_failed(&self, reason: &'static str) {
        self.move_failures
            .get_or_create(&ReasonLabel { reason })
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
        m.query_latency.observe(Duration::from_micros(300));
        m.query_latency.observe(Duration::from_secs(20));
        m.count_command(3);
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
