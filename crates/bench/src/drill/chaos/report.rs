//! What the chaos drill prints: one line per fault (what, when, stall, errors by kind), the
//! checker's findings, the unexplained errors, and the verdict line.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

use super::check::{Anomaly, Findings};
use super::errors::{self, Classified, Recovered};
use super::faults::Done;
use super::history::{Op, Outcome};

/// Findings printed in full per kind (the rest counted).
const SHOWN: usize = 10;

pub struct Run<'a> {
    pub faults: &'a [Done],
    pub ops: &'a [Op],
    pub findings: &'a Findings,
    pub errors: &'a Classified,
    pub recovered: Recovered,
}

/// holdfast's rollbacks and unknown COMMITs during the run, from its counters before and
/// after (see `ha::recovery_counters`).
pub fn recovered(before: &[(String, f64)], after: &[(String, f64)]) -> Recovered {
    let delta = |name: &str| {
        let get = |list: &[(String, f64)]| {
            list.iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, v)| *v)
        };
        (get(after) - get(before)).max(0.0)
    };
    Recovered {
        rolled_back: delta("replay diverged")
            + delta("replay failed")
            + delta("replay not_replayable")
            + delta("replay too_large")
            + delta("lost COMMIT rolled_back"),
        unknown: delta("lost COMMIT unknown"),
    }
}

/// The longest time without an acknowledged operation between `from` and `to` (ms).
fn stall(ok_ends: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for &t in ok_ends.iter().filter(|&&t| t > from && t <= to) {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(to.saturating_sub(last))
}

pub fn print(r: &Run) {
    let mut ok_ends: Vec<u64> = r
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok)
        .map(|o| o.end_ms)
        .collect();
    ok_ends.sort_unstable();
    println!();
    for (i, d) in r.faults.iter().enumerate() {
        let window_end = r
            .faults
            .get(i + 1)
            .map_or(d.settled_ms + 1_000, |n| n.start_ms);
        let errs = errors::classify(
            r.ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.end_ms >= d.start_ms && o.end_ms < window_end),
            None,
        );
        println!(
            "fault {:>2}: {:<24} at {:>6.1} s, {:>5} ms to settle, stall {:>5} ms, errors: {}",
            i + 1,
            d.fault.name(),
            d.start_ms as f64 / 1000.0,
            d.settled_ms.saturating_sub(d.start_ms),
            stall(&ok_ends, d.start_ms, d.settled_ms),
            errs.summary()
        );
    }
    println!();
    by_fault_kind(r, &ok_ends);
    println!();
    println!("errors by kind: {}", r.errors.summary());
    println!(
        "holdfast counted: {} transactions rolled back (1213), {} COMMIT outcomes unknown (1180)",
        r.recovered.rolled_back, r.recovered.unknown
    );
    for &i in r.errors.unexplained.iter().take(SHOWN) {
        if let (Some(op), Some(e)) = (r.ops.get(i), r.ops.get(i).and_then(|o| o.error.as_ref())) {
            println!("unexplained: {}: {} {}", op.label(i), e.code, e.message);
        }
    }
    show("lost", &r.findings.lost);
    show("duplicated", &r.findings.duplicated);
    show("anomaly", &r.findings.anomalies);
    let count = |o: Outcome| r.ops.iter().filter(|op| op.outcome == o).count();
    let pass = r.findings.lost.is_empty()
        && r.findings.duplicated.is_empty()
        && r.findings.anomalies.is_empty()
        && r.errors.unexplained.is_empty()
        && !r.faults.iter().any(|d| d.failed);
    let kinds = r.findings.anomaly_kinds();
    println!(
        "chaos: {} faults, {} ops ({}/{}/{}), {} lost, {} duplicated, {} anomalies{}, {} unexplained errors{}: {}",
        r.faults.len(),
        r.ops.len(),
        count(Outcome::Ok),
        count(Outcome::Fail),
        count(Outcome::Info),
        r.findings.lost.len(),
        r.findings.duplicated.len(),
        r.findings.anomalies.len(),
        if kinds.is_empty() { String::new() } else { format!(" ({kinds})") },
        r.errors.unexplained_count(),
        match r.faults.iter().filter(|d| d.failed).count() {
            0 => String::new(),
            n => format!(", {n} faults the lab did not recover from"),
        },
        if pass { "PASS" } else { "FAIL" }
    );
}

/// One line per kind of fault: how often, the stall (max, median), the time to settle
/// (median) and the errors of their windows together.
fn by_fault_kind(r: &Run, ok_ends: &[u64]) {
    for kind in super::faults::Fault::ALL {
        let mut stalls = Vec::new();
        let mut settles = Vec::new();
        let mut windows = Vec::new();
        for (i, d) in r.faults.iter().enumerate().filter(|(_, d)| d.fault == kind) {
            let end = r
                .faults
                .get(i + 1)
                .map_or(d.settled_ms + 1_000, |n| n.start_ms);
            stalls.push(stall(ok_ends, d.start_ms, d.settled_ms));
            settles.push(d.settled_ms.saturating_sub(d.start_ms));
            windows.push((d.start_ms, end));
        }
        if stalls.is_empty() {
            continue;
        }
        stalls.sort_unstable();
        settles.sort_unstable();
        let errs = errors::classify(
            r.ops.iter().enumerate().filter(|(_, o)| {
                windows
                    .iter()
                    .any(|&(from, to)| o.end_ms >= from && o.end_ms < to)
            }),
            None,
        );
        println!(
            "{:<24} x{:<3} stall max {:>5} ms, median {:>5} ms; settled in {:>5} ms (median); errors: {}",
            kind.name(),
            stalls.len(),
            stalls[stalls.len() - 1],
            stalls[stalls.len() / 2],
            settles[settles.len() / 2],
            errs.summary()
        );
    }
}

fn show(what: &str, list: &[Anomaly]) {
    for a in list.iter().take(SHOWN) {
        match what == a.kind {
            true => println!("{what}: {}", a.detail),
            false => println!("{what}: {}: {}", a.kind, a.detail),
        }
    }
    if list.len() > SHOWN {
        println!("{what}: ... and {} more", list.len() - SHOWN);
    }
}

/// The history, one operation a line, for a closer look.
pub fn save_history(path: &Path, ops: &[Op]) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for (i, op) in ops.iter().enumerate() {
        writeln!(f, "{i} {op:?}")?;
    }
    f.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_and_counters() {
        assert_eq!(stall(&[100, 150, 900, 1000], 0, 1000), 750);
        assert_eq!(stall(&[], 10, 20), 10);
        let before = vec![("replay diverged".to_string(), 2.0)];
        let after = vec![
            ("replay diverged".to_string(), 5.0),
            ("lost COMMIT unknown".to_string(), 1.0),
        ];
        let r = recovered(&before, &after);
        assert_eq!(r.rolled_back, 3.0);
        assert_eq!(r.unknown, 1.0);
    }
}
