//! The counters every request touches: commands by type, client bytes in and out, and the
//! command latency histogram. They are kept in one block per worker thread, so a request
//! only ever writes cache lines of its own core (an uncontended add), and `/metrics` sums the
//! blocks when it is read. A process-wide atomic would bounce its cache line between cores
//! on every command.

use super::{bucket_index, BUCKETS};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::MetricType;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Blocks to spread the threads over. More than the worker threads holdfast runs in
/// practice; two threads sharing a block stay correct (the adds are atomic), just slower.
const SHARDS: usize = 16;

/// Command bytes 0x00..=0x1f have names; anything above is counted as `COM_UNKNOWN`.
pub(crate) const NAMED_COMMANDS: usize = 0x20;

/// The per-thread block. Aligned so that two blocks never share a cache line (128 bytes
/// covers adjacent-line prefetching).
#[repr(align(128))]
struct Shard {
    commands: [AtomicU64; NAMED_COMMANDS + 1],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    latency_buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_nanos: AtomicU64,
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            commands: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            latency_buckets: Default::default(),
            latency_sum_nanos: AtomicU64::new(0),
        }
    }
}

/// Request-path counters, summed over the per-thread blocks on read. Clones share them.
#[derive(Clone)]
pub struct RequestStats(Arc<[Shard; SHARDS]>);

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats(Arc::new(std::array::from_fn(|_| Shard::default())))
    }
}

fn this_threads_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

impl RequestStats {
    fn local(&self) -> &Shard {
        &self.0[this_threads_shard()]
    }

    pub fn command(&self, cmd: u8) {
        let i = usize::from(cmd).min(NAMED_COMMANDS);
        self.local().commands[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn bytes_from_client(&self, n: u64) {
        self.local().bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    pub fn bytes_to_client(&self, n: u64) {
        self.local().bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    pub fn latency(&self, d: Duration) {
        let shard = self.local();
        shard.latency_buckets[bucket_index(d)].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        shard.latency_sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn sum(&self, field: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.0
            .iter()
            .map(|s| field(s).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Commands of one type (`NAMED_COMMANDS` for the unknown ones).
    pub fn commands_of(&self, i: usize) -> u64 {
        self.sum(|s| &s.commands[i.min(NAMED_COMMANDS)])
    }

    /// Commands whose latency was recorded: every command answered.
    pub fn latency_count(&self) -> u64 {
        (0..=BUCKETS.len())
            .map(|i| self.sum(|s| &s.latency_buckets[i]))
            .sum()
    }

    /// Views for the registry, each encoding one metric from the shared blocks.
    pub(super) fn commands_metric(&self) -> CommandsMetric {
        CommandsMetric(self.clone())
    }

    pub(super) fn bytes_metric(&self, direction: Direction) -> BytesMetric {
        BytesMetric(self.clone(), direction)
    }

    pub(super) fn latency_metric(&self) -> LatencyMetric {
        LatencyMetric(self.clone())
    }
}

impl std::fmt::Debug for RequestStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStats")
            .field("commands", &self.latency_count())
            .finish()
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Direction {
    FromClients,
    ToClients,
}

#[derive(Debug)]
pub(super) struct BytesMetric(RequestStats, Direction);

impl EncodeMetric for BytesMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let total = match self.1 {
            Direction::FromClients => self.0.sum(|s| &s.bytes_in),
            Direction::ToClients => self.0.sum(|s| &s.bytes_out),
        };
        encoder.encode_counter::<(), _, u64>(&total, None::<&Exemplar<(), u64>>)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

#[derive(Debug)]
pub(super) struct CommandsMetric(RequestStats);

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct CommandLabel {
    command: &'static str,
}

impl EncodeMetric for CommandsMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for i in 0..=NAMED_COMMANDS {
            let n = self.0.commands_of(i);
            let command = if i < NAMED_COMMANDS {
                holdfast_wire::command::name(i as u8)
            } else if n > 0 {
                "COM_UNKNOWN"
            } else {
                continue;
            };
            let label = CommandLabel { command };
            encoder
                .encode_family(&label)?
                .encode_counter::<(), _, u64>(&n, None::<&Exemplar<(), u64>>)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

#[derive(Debug)]
pub(super) struct LatencyMetric(RequestStats);

impl EncodeMetric for LatencyMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = (0..=BUCKETS.len())
            .map(|i| self.0.sum(|s| &s.latency_buckets[i]))
            .collect();
        let sum = self.0.sum(|s| &s.latency_sum_nanos) as f64 / 1e9;
        super::encode_histogram(&mut encoder, sum, &counts)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_from_many_threads_are_all_counted() {
        let stats = RequestStats::default();
        std::thread::scope(|s| {
            for _ in 0..(SHARDS + 3) {
                s.spawn(|| {
                    for _ in 0..1000 {
                        stats.command(3);
                        stats.command(0xfe);
                        stats.bytes_from_client(2);
                        stats.latency(Duration::from_micros(300));
                    }
                });
            }
        });
        let threads = (SHARDS + 3) as u64;
        assert_eq!(stats.commands_of(3), 1000 * threads);
        assert_eq!(stats.commands_of(NAMED_COMMANDS), 1000 * threads);
        assert_eq!(stats.sum(|s| &s.bytes_in), 2000 * threads);
        assert_eq!(stats.latency_count(), 1000 * threads);
    }
}
