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

/// The allocator's own account of the heap, which the process's RSS blurs: bytes in live
/// allocations, and bytes it holds in free chunks between them.
#[derive(Debug, Clone, Copy)]
pub struct HeapUse {
    pub in_use: u64,
    pub free: u64,
}

/// glibc's figures over all its arenas (`mallinfo2`: it walks the free lists under each
/// arena's lock, so it is asked at a scrape, never per request).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_use() -> Option<HeapUse> {
    #[repr(C)]
    struct Mallinfo2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }
    unsafe extern "C" {
        fn mallinfo2() -> Mallinfo2;
    }
    // SAFETY: glibc's `mallinfo2` (2.33 and later; Debian 12 has 2.36) has no
    // preconditions and returns its figures by value, in this layout (`struct mallinfo2`,
    // ten `size_t`s); it takes each arena's lock itself.
    let m = unsafe { mallinfo2() };
    Some(HeapUse {
        // Small allocations, and large ones glibc maps on their own.
        in_use: (m.uordblks + m.hblkhd) as u64,
        free: m.fordblks as u64,
    })
}

/// Other allocators: not known here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_use() -> Option<HeapUse> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn the_heap_in_use_grows_with_live_allocations() {
        let before = heap_use().expect("glibc's figures").in_use;
        let held: Vec<Box<[u8; 512]>> = (0..1000).map(|_| Box::new([1u8; 512])).collect();
        let after = heap_use().expect("glibc's figures").in_use;
        assert!(
            after >= before + 500 * 1000,
            "{before} -> {after} bytes with 1000 allocations of 512 bytes held"
        );
        drop(held);
    }

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
