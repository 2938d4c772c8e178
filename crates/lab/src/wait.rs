//! Polling until a condition holds: the one loop behind the tests' and tools' waits.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// How often [`poll`] asks again.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Calls `f` every 20 ms until it returns `Some`; `None` once `timeout` has passed.
/// `f` is always called at least once.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Like [`poll`], but a timeout is an error naming `what` was awaited.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> Result<T> {
    match poll(timeout, f) {
        Some(v) => Ok(v),
        None => bail!("timed out after {timeout:?} waiting for {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value_or_names_what_timed_out() {
        let mut calls = 0;
        let v = wait_for("three calls", Duration::from_secs(5), || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(v.unwrap(), 3);
        let e = wait_for("nothing", Duration::ZERO, || None::<()>).unwrap_err();
        assert_eq!(e.to_string(), "timed out after 0ns waiting for nothing");
    }
}
