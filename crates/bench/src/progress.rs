//! Progress on long runs: a sysbench run's seconds as they pass (its tps and p95), on one
//! line rewritten in place on a terminal, or a plain line every few seconds when stderr is
//! a file or a pipe (CI logs).

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::process::{Child, ExitStatus, Output};
use std::thread::JoinHandle;

/// How often a plain line is printed when stderr is not a terminal, in sysbench seconds.
const PLAIN_EVERY: u64 = 10;

/// A running sysbench whose per-second lines (`--report-interval=1`) are shown as progress.
pub struct Watched {
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
    tty: bool,
}

impl Watched {
    /// Watches `child` (stdout and stderr piped), labelled `label`, due to run `seconds`.
    pub fn new(mut child: Child, label: &str, seconds: u64) -> Watched {
        let tty = std::io::stderr().is_terminal();
        let out = child.stdout.take();
        let err = child.stderr.take();
        let label = label.to_string();
        let stdout = std::thread::spawn(move || {
            let mut kept = Vec::new();
            let Some(out) = out else { return kept };
            let mut reader = BufReader::new(out);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some((second, tps, p95)) = crate::chart::sysbench_intervals(&line).first() {
                    let second = *second as u64;
                    let text =
                        format!("   {label}: {second}/{seconds} s, {tps:.0} tps, p95 {p95:.1} ms");
                    if tty {
                        eprint!("\r{text}\x1b[K");
                    } else if second % PLAIN_EVERY == 0 {
                        eprintln!("{text}");
                    }
                    let _ = std::io::stderr().flush();
                }
                kept.extend_from_slice(line.as_bytes());
                line.clear();
            }
            kept
        });
        let stderr = std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut err) = err {
                let _ = err.read_to_end(&mut kept);
            }
            kept
        });
        Watched {
            child,
            stdout,
            stderr,
            tty,
        }
    }

    /// Waits for the end: the run's status and output, as `wait_with_output` gives them.
    pub fn wait(mut self) -> std::io::Result<Output> {
        let status: ExitStatus = self.child.wait()?;
        let stdout = self.stdout.join().unwrap_or_default();
        let stderr = self.stderr.join().unwrap_or_default();
        if self.tty {
            eprintln!();
        }
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }
}
