//! CPU time and context switches of a process over a sysbench run, from /proc.

use std::fs;

use anyhow::{Context, Result};

/// A reading of one process's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// utime + stime of the whole process (all threads, exited ones included), clock ticks.
    pub cpu_ticks: u64,
    /// Voluntary context switches, summed over the threads alive now.
    pub voluntary: u64,
    /// Involuntary context switches, summed over the threads alive now.
    pub involuntary: u64,
}

/// What a process used between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub cpu_s: f64,
    pub voluntary: u64,
    pub involuntary: u64,
}

impl Usage {
    /// CPU microseconds per query.
    pub fn cpu_us_per(&self, queries: u64) -> Option<f64> {
        (queries > 0).then(|| self.cpu_s * 1e6 / queries as f64)
    }

    /// (voluntary, involuntary) context switches per query.
    pub fn switches_per(&self, queries: u64) -> Option<(f64, f64)> {
        (queries > 0).then(|| {
            (
                self.voluntary as f64 / queries as f64,
                self.involuntary as f64 / queries as f64,
            )
        })
    }
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux in practice).
pub fn ticks_per_sec() -> f64 {
    // SAFETY: plain libc call without pointers.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // comm (field 2) may hold spaces and parentheses: count fields after the last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// (voluntary_ctxt_switches, nonvoluntary_ctxt_switches) of a `/proc/…/status` text.
pub fn parse_status_switches(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().parse::<u64>().ok())
    };
    Some((
        field("voluntary_ctxt_switches:")?,
        field("nonvoluntary_ctxt_switches:")?,
    ))
}

/// Reads `pid`'s CPU ticks and its threads' context switches.
pub fn sample(pid: u32) -> Result<ProcSample> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let cpu_ticks =
        parse_stat_cpu_ticks(&stat).with_context(|| format!("parsing /proc/{pid}/stat"))?;
    // The process-level status counts the main thread only; sum the tasks.
    let mut s = ProcSample {
        cpu_ticks,
        ..ProcSample::default()
    };
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing /proc/{pid}/task"))?;
    for task in tasks.flatten() {
        // A thread may exit between listing and reading: skip it.
        let Ok(text) = fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        if let Some((v, i)) = parse_status_switches(&text) {
            s.voluntary += v;
            s.involuntary += i;
        }
    }
    Ok(s)
}

/// The whole machine's CPU time from `/proc/stat` (the `cpu` line), clock ticks: what
/// user space ran, and what the kernel ran (system, irq and softirq time: kernel threads
/// such as the sockmap's workers included, which no process's figures show).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineSample {
    pub user_ticks: u64,
    pub kernel_ticks: u64,
}

/// Parses the `cpu` line of `/proc/stat`: user + nice, and system + irq + softirq.
pub fn parse_machine(stat: &str) -> Option<MachineSample> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| f.get(i).copied();
    Some(MachineSample {
        user_ticks: at(0)? + at(1)?,
        kernel_ticks: at(2)? + at(5)? + at(6)?,
    })
}

/// What the machine ran between two readings: (user, kernel) seconds.
pub struct MachineWatch {
    before: Option<MachineSample>,
}

impl MachineWatch {
    pub fn start() -> MachineWatch {
        MachineWatch {
            before: fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| parse_machine(&s)),
        }
    }

    pub fn finish(self) -> Option<(f64, f64)> {
        let after = parse_machine(&fs::read_to_string("/proc/stat").ok()?)?;
        let before = self.before?;
        let t = ticks_per_sec();
        Some((
            after.user_ticks.saturating_sub(before.user_ticks) as f64 / t,
            after.kernel_ticks.saturating_sub(before.kernel_ticks) as f64 / t,
        ))
    }
}

/// A process watched over a run: [`Watch::start`] before, [`Watch::finish`] after. Any
/// failure to read /proc (no pid, the process gone) yields no figure rather than an error.
pub struct Watch {
    pid: Option<u32>,
    before: Option<ProcSample>,
}

impl Watch {
    pub fn start(pid: Option<u32>) -> Watch {
        Watch {
            pid,
            before: pid.and_then(|p| sample(p).ok()),
        }
    }

    pub fn finish(self) -> Option<Usage> {
        let after = sample(self.pid?).ok()?;
        Some(usage(self.before?, after, ticks_per_sec()))
    }
}

/// `after − before`; context switches of threads that came or went in between are lost.
pub fn usage(before: ProcSample, after: ProcSample, ticks_per_sec: f64) -> Usage {
    Usage {
        cpu_s: after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks_per_sec,
        voluntary: after.voluntary.saturating_sub(before.voluntary),
        involuntary: after.involuntary.saturating_sub(before.involuntary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_machine_cpu_line() {
        let stat = "cpu  100 5 40 900 7 1 2 0 0 0\ncpu0 50 2 20 450 3 0 1 0 0 0\n";
        assert_eq!(
            parse_machine(stat),
            Some(MachineSample {
                user_ticks: 105,
                kernel_ticks: 43
            })
        );
        assert_eq!(parse_machine("cpu0 1 2 3"), None);
    }

    #[test]
    fn parses_stat_cpu_fields() {
        // Real line of a holdfast process, with a comm holding a space and a ')'.
        let stat = "4242 (hold fast)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    731 402 0 0 20 0 3 0 98765 123456789 2048 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(731 + 402));
        assert_eq!(parse_stat_cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn parses_status_switches() {
        let status = "Name:\tholdfast\nThreads:\t3\nvoluntary_ctxt_switches:\t150\n\
                      nonvoluntary_ctxt_switches:\t7\n";
        assert_eq!(parse_status_switches(status), Some((150, 7)));
        assert_eq!(parse_status_switches("Name:\tx\n"), None);
    }

    #[test]
    fn usage_per_query() {
        let before = ProcSample {
            cpu_ticks: 100,
            voluntary: 10,
            involuntary: 1,
        };
        let after = ProcSample {
            cpu_ticks: 300,
            voluntary: 1010,
            involuntary: 101,
        };
        let u = usage(before, after, 100.0);
        assert_eq!(u.cpu_s, 2.0);
        assert_eq!(u.cpu_us_per(100_000), Some(20.0));
        assert_eq!(u.switches_per(1000), Some((1.0, 0.1)));
        assert_eq!(u.cpu_us_per(0), None);
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.voluntary + s.involuntary > 0 || s.cpu_ticks > 0);
    }
}
