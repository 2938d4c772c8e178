//! A phase of a long run, shown while it lasts: its seconds so far and what a probe says
//! (tables made, nodes up...), on one line rewritten in place on a terminal, or a plain
//! line every [`PLAIN_EVERY`] when stderr is a file or a pipe (CI logs). A phase over
//! within its first interval prints nothing.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a terminal's line is rewritten.
const TTY_EVERY: Duration = Duration::from_secs(1);
/// How often a plain line is printed.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Shows a phase until dropped.
pub struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Starts showing `label`; `probe` (called once per line, on the ticker's thread) adds
    /// what it can tell of the phase's progress.
    pub fn start(
        label: impl Into<String>,
        probe: impl Fn() -> Option<String> + Send + 'static,
    ) -> Ticker {
        let label = label.into();
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = stop.clone();
        let tty = std::io::stderr().is_terminal();
        let every = if tty { TTY_EVERY } else { PLAIN_EVERY };
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let (lock, signal) = &*stopped;
            let mut shown = false;
            let Ok(mut done) = lock.lock() else { return };
            loop {
                done = match signal.wait_timeout_while(done, every, |d| !*d) {
                    Ok((d, _)) => d,
                    Err(_) => return,
                };
                if *done {
                    break;
                }
                let line = match probe() {
                    Some(p) => format!("   {label}: {:.0} s, {p}", started.elapsed().as_secs_f64()),
                    None => format!("   {label}: {:.0} s", started.elapsed().as_secs_f64()),
                };
                if tty {
                    eprint!("\r{line}\x1b[K");
                } else {
                    eprintln!("{line}");
                }
                let _ = std::io::stderr().flush();
                shown = true;
            }
            if shown && tty {
                eprint!("\r\x1b[K");
                let _ = std::io::stderr().flush();
            }
        });
        Ticker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let (lock, signal) = &*self.stop;
        if let Ok(mut done) = lock.lock() {
            *done = true;
        }
        signal.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_ticker_probes_while_its_phase_lasts_and_stops_when_dropped() {
        let probed = Arc::new(AtomicUsize::new(0));
        let counted = probed.clone();
        let started = Instant::now();
        let ticker = Ticker::start("a phase", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            None
        });
        // Dropped at once: it stops without waiting out its interval, having probed
        // nothing (a phase over within its first interval shows nothing).
        drop(ticker);
        assert!(started.elapsed() < TTY_EVERY);
        assert_eq!(probed.load(Ordering::SeqCst), 0);
    }
}
