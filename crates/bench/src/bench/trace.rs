//! Tools attached to a proxy for the length of one extra sysbench run: `strace -c -f`
//! (syscalls per query) and `perf record -g` (profiles), and reading their output.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use holdfast_lab::procs;

/// A tracing tool attached to a process; stopped with SIGINT by [`Attached::stop`] (both
/// strace and perf record write their results on SIGINT).
pub struct Attached {
    child: Child,
    what: String,
}

/// How long a tool gets to attach before the run starts, and to finish after SIGINT.
const ATTACH_DELAY: Duration = Duration::from_millis(1000);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

impl Attached {
    /// Starts `exe args…` with its output to `log`, and gives it time to attach.
    pub fn start(exe: &Path, args: &[String], log: &Path) -> Result<Attached> {
        let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let file2 = file.try_clone().context("duplicating log handle")?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        std::thread::sleep(ATTACH_DELAY);
        if let Some(status) = child.try_wait().context("waiting for the tracer")? {
            bail!(
                "{} exited at once ({status}): {}",
                exe.display(),
                procs::tail_file(log, 5).replace('\n', " / ")
            );
        }
        Ok(Attached {
            child,
            what: exe.display().to_string(),
        })
    }

    /// Sends SIGINT and waits for the tool to write its output and exit.
    pub fn stop(mut self) -> Result<()> {
        procs::signal(self.child.id(), libc::SIGINT)?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("{} still running {STOP_TIMEOUT:?} after SIGINT", self.what);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // Only if stop() was not reached (an error in between): never leave a tracer behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `strace -c -f -o OUT -p PID`.
pub fn strace_args(pid: u32, out: &Path) -> Vec<String> {
    vec![
        "-c".into(),
        "-f".into(),
        "-o".into(),
        out.display().to_string(),
        "-p".into(),
        pid.to_string(),
    ]
}

/// `perf record -F 999 --call-graph CALL_GRAPH -o OUT -p PID`.
pub fn perf_record_args(pid: u32, call_graph: &str, out: &Path) -> Vec<String> {
    vec![
        "record".into(),
        "-F".into(),
        "999".into(),
        "--call-graph".into(),
        call_graph.into(),
        "-o".into(),
        out.display().to_string(),
        "-p".into(),
        pid.to_string(),
    ]
}

/// perf's event counting every syscall entry.
const ALL_SYSCALLS: &str = "raw_syscalls:sys_enter";
/// Prefix of perf's per-syscall entry events.
const SYSCALL_EVENT: &str = "syscalls:sys_enter_";

/// `raw_syscalls:sys_enter` plus `syscalls:sys_enter_NAME` for those of `names` this
/// kernel has a tracepoint for.
pub fn perf_stat_events(names: &[String]) -> Vec<String> {
    let mut events = vec![ALL_SYSCALLS.to_string()];
    for name in names {
        let known = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .any(|t| Path::new(&format!("{t}/events/syscalls/sys_enter_{name}")).exists());
        if known {
            events.push(format!("{SYSCALL_EVENT}{name}"));
        }
    }
    events
}

/// `perf stat -x, -o OUT -e EVENTS -p PID` (counts until SIGINT).
pub fn perf_stat_args(pid: u32, events: &[String], out: &Path) -> Vec<String> {
    vec![
        "stat".into(),
        "-x,".into(),
        "-o".into(),
        out.display().to_string(),
        "-e".into(),
        events.join(","),
        "-p".into(),
        pid.to_string(),
    ]
}

/// Parses `perf stat -x,` output (`value,unit,event,…` lines) of [`perf_stat_events`].
pub fn parse_perf_stat(text: &str) -> Result<SyscallCounts> {
    let mut counts = SyscallCounts::default();
    let mut total = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(',').collect();
        if line.starts_with('#') || fields.len() < 3 {
            continue;
        }
        let (value, event) = (fields[0].trim(), fields[2].trim());
        // `<not counted>` / `<not supported>`: perf could not count it.
        let Ok(n) = value.parse::<u64>() else {
            if event == ALL_SYSCALLS {
                bail!("perf stat: {event} {value}");
            }
            continue;
        };
        if event == ALL_SYSCALLS {
            total = Some(n);
        } else if let Some(name) = event.strip_prefix(SYSCALL_EVENT) {
            counts.calls.push((name.to_string(), n));
        }
    }
    counts.total = total.with_context(|| format!("no {ALL_SYSCALLS} count in perf stat output"))?;
    counts
        .calls
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(counts)
}

/// Syscall counts of an `strace -c` summary or of `perf stat`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyscallCounts {
    pub total: u64,
    /// Per syscall, most calls first.
    pub calls: Vec<(String, u64)>,
}

/// Parses the table `strace -c` writes:
/// `% time  seconds  usecs/call  calls  errors  syscall` rows, then a `total` row.
pub fn parse_strace_summary(text: &str) -> Result<SyscallCounts> {
    let mut counts = SyscallCounts::default();
    let mut total = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // The errors column is blank for syscalls that never failed: 5 or 6 words.
        if !(5..=6).contains(&words.len()) || words[0].parse::<f64>().is_err() {
            continue;
        }
        let (Ok(calls), Some(name)) = (words[3].parse::<u64>(), words.last()) else {
            continue;
        };
        if *name == "total" {
            total = Some(calls);
        } else {
            counts.calls.push((name.to_string(), calls));
        }
    }
    if counts.calls.is_empty() {
        bail!("no syscall rows in the strace -c summary");
    }
    counts
        .calls
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    counts.total = total.unwrap_or_else(|| counts.calls.iter().map(|c| c.1).sum());
    Ok(counts)
}

/// Names with counts, most first.
pub type Counted = Vec<(String, u64)>;

/// Files of one profile.
pub struct ProfileFiles {
    pub data: PathBuf,
    pub script: PathBuf,
    pub folded: PathBuf,
    pub flamegraph: PathBuf,
    pub summary: PathBuf,
}

impl ProfileFiles {
    pub fn in_dir(dir: &Path, name: &str) -> ProfileFiles {
        ProfileFiles {
            data: dir.join(format!("perf-{name}.data")),
            script: dir.join(format!("perf-{name}.script")),
            folded: dir.join(format!("perf-{name}.folded")),
            flamegraph: dir.join(format!("perf-{name}.svg")),
            summary: dir.join(format!("perf-{name}.top.txt")),
        }
    }
}

/// Folded stacks (`root;…;leaf` → samples), as `stackcollapse-perf.pl` makes them from
/// `perf script` output: one sample is a header line then one indented line per frame,
/// leaf first, and a blank line. The process name is the root frame.
pub fn fold_perf_script(text: &str) -> Vec<(String, u64)> {
    let mut folded: std::collections::BTreeMap<String, u64> = Default::default();
    let mut comm: Option<String> = None;
    let mut frames: Vec<String> = Vec::new();
    let mut flush = |comm: &mut Option<String>, frames: &mut Vec<String>| {
        if let Some(c) = comm.take() {
            let mut stack = vec![c];
            stack.extend(frames.drain(..).rev());
            *folded.entry(stack.join(";")).or_default() += 1;
        }
        frames.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            flush(&mut comm, &mut frames);
        } else if line.starts_with(|c: char| c.is_whitespace()) {
            if comm.is_some() {
                frames.push(frame_name(line.trim()));
            }
        } else if !line.starts_with('#') {
            flush(&mut comm, &mut frames);
            // `comm pid[/tid] [cpu] time: period event:`; comm may contain spaces, so take
            // everything before the first word that is a pid (or pid/tid).
            let words: Vec<&str> = line.split_whitespace().collect();
            let pid_at = words
                .iter()
                .position(|w| w.split('/').all(|p| p.parse::<u64>().is_ok()))
                .unwrap_or(1)
                .max(1);
            comm = Some(words[..pid_at.min(words.len())].join(" ").replace(';', ":"));
        }
    }
    flush(&mut comm, &mut frames);
    let mut out: Vec<(String, u64)> = folded.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// `ffffffff817003a2 __d_lookup_rcu+0x32 ([kernel.kallsyms])` → `__d_lookup_rcu`;
/// an unknown symbol becomes `[dso]` (or `[unknown]`); kernel functions get the `_[k]`
/// suffix flamegraph.pl colours as kernel (as `stackcollapse-perf.pl --kernel` does).
fn frame_name(line: &str) -> String {
    let rest = line
        .split_once(char::is_whitespace)
        .map(|(_, r)| r.trim())
        .unwrap_or("");
    let (sym, dso) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (&rest[..i], &rest[i + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    let sym = match sym.rfind("+0x") {
        Some(i) => &sym[..i],
        None => sym,
    };
    let name = if dso == "[kernel.kallsyms]" && !sym.is_empty() {
        format!("{sym}{KERNEL_SUFFIX}")
    } else if sym.is_empty() || sym == "[unknown]" {
        match dso.rsplit('/').next().unwrap_or("") {
            "" => "[unknown]".to_string(),
            base if base.starts_with('[') => base.to_string(),
            base => format!("[{base}]"),
        }
    } else {
        sym.to_string()
    };
    name.replace(';', ":")
}

/// Marks kernel frames in folded stacks.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// The share of samples whose leaf frame is in the kernel.
pub fn kernel_share(folded: &[(String, u64)]) -> Option<f64> {
    let total: u64 = folded.iter().map(|(_, n)| n).sum();
    let kernel: u64 = folded
        .iter()
        .filter(|(s, _)| s.ends_with(KERNEL_SUFFIX))
        .map(|(_, n)| n)
        .sum();
    (total > 0).then(|| kernel as f64 / total as f64)
}

/// The `n` functions with the most samples as the leaf frame (self time) and as any frame
/// (inclusive, counted once per sample; frames without a symbol left out), as (function,
/// samples).
pub fn top_functions(folded: &[(String, u64)], n: usize) -> (Counted, Counted) {
    let mut selfs: std::collections::HashMap<&str, u64> = Default::default();
    let mut incl: std::collections::HashMap<&str, u64> = Default::default();
    for (stack, count) in folded {
        // Skip the root (process name).
        let frames: Vec<&str> = stack.split(';').skip(1).collect();
        if let Some(leaf) = frames.last() {
            *selfs.entry(leaf).or_default() += count;
        }
        let mut seen = std::collections::HashSet::new();
        // `[unknown]`/`[dso]` frames (where unwinding gave up) say nothing inclusive.
        for f in frames.into_iter().filter(|f| !f.starts_with('[')) {
            if seen.insert(f) {
                *incl.entry(f).or_default() += count;
            }
        }
    }
    let top = |m: std::collections::HashMap<&str, u64>| {
        let mut v: Vec<(String, u64)> = m.into_iter().map(|(k, c)| (k.to_string(), c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(n);
        v
    };
    (top(selfs), top(incl))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRACE: &str = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 45.10    0.134222          12     11000           sendto
 30.00    0.090000           8     11000      2000 recvfrom
 20.00    0.060000          20      3000           epoll_wait
  4.90    0.014000           7      2000           futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.298222          11     27000      2000 total
";

    #[test]
    fn parses_strace_c_summary() {
        let c = parse_strace_summary(STRACE).unwrap();
        assert_eq!(c.total, 27000);
        assert_eq!(
            c.calls,
            vec![
                ("recvfrom".to_string(), 11000),
                ("sendto".to_string(), 11000),
                ("epoll_wait".to_string(), 3000),
                ("futex".to_string(), 2000),
            ]
        );
        let no_total: String = STRACE.lines().take(6).collect::<Vec<_>>().join("\n");
        assert_eq!(parse_strace_summary(&no_total).unwrap().total, 27000);
        assert!(parse_strace_summary("strace: attach: ptrace(PTRACE_SEIZE, 1): EPERM").is_err());
    }

    #[test]
    fn parses_perf_stat_csv() {
        let text = "# started on Thu Dec  3 11:27:37 2026\n\n\
                    27000,,raw_syscalls:sys_enter,5001234567,100.00,,\n\
                    11000,,syscalls:sys_enter_sendto,5001234567,100.00,,\n\
                    <not counted>,,syscalls:sys_enter_futex,0,100.00,,\n\
                    12000,,syscalls:sys_enter_recvfrom,5001234567,100.00,,\n";
        let c = parse_perf_stat(text).unwrap();
        assert_eq!(c.total, 27000);
        assert_eq!(
            c.calls,
            vec![
                ("recvfrom".to_string(), 12000),
                ("sendto".to_string(), 11000)
            ]
        );
        let none = "<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n";
        assert!(parse_perf_stat(none).is_err());
        assert!(parse_perf_stat("").is_err());
        let args = perf_stat_args(7, &perf_stat_events(&[]), Path::new("/tmp/x.csv"));
        assert_eq!(
            args.join(" "),
            "stat -x, -o /tmp/x.csv -e raw_syscalls:sys_enter -p 7"
        );
    }

    const PERF_SCRIPT: &str = "\
holdfast 4242/4243 [001]  5450.669970:    1001001 cpu-clock:ppp: 
\tffffffff817003a2 __d_lookup_rcu+0x32 ([kernel.kallsyms])
\t    55d0c0ffee01 holdfast::proxy::relay+0x1a (/work/target/release/holdfast)
\t    55d0c0ffee00 main+0x10 (/work/target/release/holdfast)

holdfast 4242/4243 [001]  5450.670971:    1001001 cpu-clock:ppp: 
\t    55d0c0ffee01 holdfast::proxy::relay+0x1a (/work/target/release/holdfast)
\t    55d0c0ffee00 main+0x10 (/work/target/release/holdfast)

tokio-runtime-w 4242/4244 [000]  5450.671000:    1001001 cpu-clock:ppp: 
\t    7f0000000001 [unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t    55d0c0ffee01 <T as core::ops::Fn>::call+0x1 (/work/target/release/holdfast)

";

    #[test]
    fn folds_perf_script() {
        let folded = fold_perf_script(PERF_SCRIPT);
        assert_eq!(
            folded,
            vec![
                ("holdfast;main;holdfast::proxy::relay".to_string(), 1),
                (
                    "holdfast;main;holdfast::proxy::relay;__d_lookup_rcu_[k]".to_string(),
                    1
                ),
                (
                    "tokio-runtime-w;<T as core::ops::Fn>::call;[libc.so.6]".to_string(),
                    1
                ),
            ]
        );
        assert_eq!(kernel_share(&folded), Some(1.0 / 3.0));
        let (selfs, all) = top_functions(&folded, 10);
        assert!(selfs.iter().any(|(f, _)| f == "[libc.so.6]"));
        assert!(all.iter().all(|(f, _)| !f.starts_with('[')));
        let (selfs, incl) = top_functions(&folded, 2);
        assert_eq!(selfs[0].1, 1);
        assert_eq!(
            incl,
            vec![
                ("holdfast::proxy::relay".to_string(), 2),
                ("main".to_string(), 2)
            ]
        );
    }

    #[test]
    fn names_frames() {
        assert_eq!(
            frame_name("ffffffff81000130 entry_SYSCALL_64_after_hwframe+0x76 ([kernel.kallsyms])"),
            "entry_SYSCALL_64_after_hwframe_[k]"
        );
        assert_eq!(frame_name("0 [unknown] ([unknown])"), "[unknown]");
        assert_eq!(frame_name("55d0 a;b+0x1 (/x/holdfast)"), "a:b");
    }
}
