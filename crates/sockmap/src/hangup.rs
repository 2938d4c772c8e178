//! Noticing that a spliced socket ended, without waking anyone per message.
//!
//! The kernel calls a socket's data-ready callback for every chunk the verdict program
//! redirects; a socket registered in an epoll set for `EPOLLIN` (as an async runtime
//! registers it) then wakes the thread waiting on that set each time, only for it to find
//! nothing to read. Registered for `EPOLLRDHUP` alone, the wake-ups carrying `EPOLLIN`
//! are filtered out by epoll itself, while the end of the connection (a FIN, a reset:
//! a state change, which wakes without a filter) still reports. One thread per process
//! waits on such a set for every spliced socket and calls the callback given for it.
//!
//! The same set serves sockets no runtime watches for a while, such as those of an idle
//! session parked out of the async runtime's reactor ([`HangupWatcher::watch_readable`]):
//! the first byte or the end calls the callback, once.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What to call when a watched socket ends (possibly once per socket of a pair), or, for
/// [`HangupWatcher::watch_readable`], has something to read.
pub type OnHangup = Arc<dyn Hangup>;

/// A callback of the watcher's. Any `Fn()` is one; a type that lives in an `Arc` already
/// (an idle session's record) can be one itself, without an allocation of its own for
/// each socket it parks.
pub trait Hangup: Send + Sync {
    fn hangup(&self);
}

impl<F: Fn() + Send + Sync> Hangup for F {
    fn hangup(&self) {
        self()
    }
}

/// The epoll set and its thread.
pub struct HangupWatcher {
    epoll: Arc<OwnedFd>,
    callbacks: Arc<Mutex<HashMap<u64, OnHangup>>>,
    next: AtomicU64,
}

/// A socket watched until dropped (then taken out of the set).
pub struct Watched {
    epoll: Arc<OwnedFd>,
    callbacks: Arc<Mutex<HashMap<u64, OnHangup>>>,
    fd: RawFd,
    token: u64,
}

impl HangupWatcher {
    /// A new set, and the thread that waits on it (it runs as long as the process).
    pub fn start() -> io::Result<HangupWatcher> {
        // SAFETY: plain system call; a negative answer is an error.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let epoll = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let callbacks: Arc<Mutex<HashMap<u64, OnHangup>>> = Arc::default();
        let (e, c) = (epoll.clone(), callbacks.clone());
        std::thread::Builder::new()
            .name("holdfast-hangups".into())
            .spawn(move || wait_forever(&e, &c))?;
        Ok(HangupWatcher {
            epoll,
            callbacks,
            next: AtomicU64::new(1),
        })
    }

    /// How many callbacks the watcher's table has room for.
    #[cfg(test)]
    pub(crate) fn table_capacity(&self) -> usize {
        self.callbacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capacity()
    }

    /// Calls `on_hangup` when `fd` ends (its peer closed or reset it, or it failed), from
    /// the watcher's thread.
    pub fn watch(&self, fd: BorrowedFd<'_>, on_hangup: OnHangup) -> io::Result<Watched> {
        self.add(fd, libc::EPOLLRDHUP | libc::EPOLLONESHOT, on_hangup)
    }

    /// Calls `on_ready` once, from the watcher's thread, when `fd` has bytes to read or
    /// ends (already so when it is added: then at once). Watch it again for another call.
    pub fn watch_readable(&self, fd: BorrowedFd<'_>, on_ready: OnHangup) -> io::Result<Watched> {
        self.add(
            fd,
            libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT,
            on_ready,
        )
    }

    fn add(&self, fd: BorrowedFd<'_>, events: i32, callback: OnHangup) -> io::Result<Watched> {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.callbacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, callback);
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: `event` is a live local the call reads; both descriptors are open.
        let r = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut event,
            )
        };
        let watched = Watched {
            epoll: self.epoll.clone(),
            callbacks: self.callbacks.clone(),
            fd: fd.as_raw_fd(),
            token,
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(watched)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // SAFETY: plain system call; the socket is still open (the caller drops this
        // before closing it), and a socket already out of the set only fails the call.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                self.fd,
                std::ptr::null_mut(),
            );
        }
        let mut callbacks = self.callbacks.lock().unwrap_or_else(|p| p.into_inner());
        callbacks.remove(&self.token);
        // A wave of parked sessions that woke would leave the table at its peak size: it
        // gives most back once three quarters are empty (halving at most each time, so
        // the rehashes cost as the removals did).
        if callbacks.capacity() > SHRINK_ABOVE && callbacks.len() < callbacks.capacity() / 4 {
            let keep = callbacks.len() * 2;
            callbacks.shrink_to(keep);
        }
    }
}

/// Below this many slots, the table of callbacks is left as it is.
const SHRINK_ABOVE: usize = 256;

fn wait_forever(epoll: &OwnedFd, callbacks: &Mutex<HashMap<u64, OnHangup>>) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: `events` is a live buffer of the length given, which the call fills.
        let n = unsafe {
            libc::epoll_wait(
                epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                -1,
            )
        };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        for e in &events[..n as usize] {
            let token = e.u64;
            let callback = callbacks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&token)
                .cloned();
            if let Some(f) = callback {
                f.hangup();
            }
        }
    }
}
