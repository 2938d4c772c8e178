//! Memory idle sessions let go, given back to the system. A session that goes idle frees
//! its read buffers (see `session/idle.rs`), but the allocator keeps freed chunks between
//! live ones resident: after a wave of sessions goes idle, most of what they freed would
//! still count in the process's RSS. A task trims the heap at most once a second, and
//! only after sessions let something go.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often, at most, the heap is trimmed.
const TRIM_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Trim {
    /// A session let buffers go since the last trim.
    pending: AtomicBool,
}

impl Trim {
    /// A session let its buffers go (once per idle spell, never per request).
    pub fn released(&self) {
        if !self.pending.load(Ordering::Relaxed) {
            self.pending.store(true, Ordering::Relaxed);
        }
    }

    /// Trims after releases, until the runtime stops.
    pub async fn run(&self) {
        let mut every = tokio::time::interval(TRIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if self.pending.swap(false, Ordering::Relaxed) {
                trim_heap();
            }
        }
    }
}

/// Returns the free pages of the allocator's heaps to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's `malloc_trim` has no preconditions: it takes each arena's lock
    // itself, only advises the kernel about pages inside free chunks (live allocations
    // are not touched), and may be called from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

/// Other allocators give memory back on their own (or not at all): nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn trims_only_after_a_release() {
        let trim = std::sync::Arc::new(Trim::default());
        let task = tokio::spawn({
            let trim = trim.clone();
            async move { trim.run().await }
        });
        trim.released();
        assert!(trim.pending.load(Ordering::Relaxed));
        tokio::time::sleep(TRIM_EVERY * 2).await;
        assert!(
            !trim.pending.load(Ordering::Relaxed),
            "the release was taken by a trim"
        );
        task.abort();
    }
}
