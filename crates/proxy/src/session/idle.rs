//! Between requests: the session reads the client's next request while watching what can
//! happen to an idle session (the topology changes, its backend goes away, its cool-down
//! ends). The watch arms only after a short silence, so a busy session pays no extra
//! syscall or lock per command for it.

use super::{CloseReason, End, Session};
use crate::conn::{ConnError, PacketConn};
use crate::error::ErrorKind;
use crate::state::Blocker;
use bytes::BytesMut;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

/// How long a client must be silent before its session watches for idle-time events.
pub(super) const IDLE_PROBE: Duration = Duration::from_millis(20);

enum IdleEvent {
    /// The process that replaces this one takes sessions.
    HandOver(std::sync::Arc<crate::upgrade::SessionChannel>),
    /// The topology changed (false: the monitor is gone).
    Topology(bool),
    /// A planned switchover starts (or ends).
    Switching,
    /// The backend connection closed or sent something (`Some`: it failed with that error,
    /// a reset for one).
    BackendGone(Option<std::io::Error>),
    /// The earlier of the cool-down's end and the idle timeout.
    Deadline,
}

/// What ended an idle session's wait.
enum Woke {
    Client(Result<(), ConnError>),
    Ring,
    Backend(Option<std::io::Error>),
    Timer,
}

/// The session's one timer: the idle probe between requests, the client watch during one,
/// the idle deadline or cool-down while the session idles. An idle session with neither
/// holds none (issue 22: memory per idle session); the next request makes it again.
#[derive(Default)]
pub(super) struct Timer(Option<Pin<Box<Sleep>>>);

impl Timer {
    /// Due at `at`: the timer moved, or made if the session had let it go.
    pub(super) fn arm(&mut self, at: tokio::time::Instant) {
        match &mut self.0 {
            Some(timer) => timer.as_mut().reset(at),
            None => self.0 = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// The timer as last armed; one made here is due at once (a wait cut short is
    /// harmless where this is asked: it only starts a watch earlier).
    pub(super) fn armed(&mut self) -> Pin<&mut Sleep> {
        self.0
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::ZERO)))
            .as_mut()
    }

    /// Completes when the timer is due; never while there is none.
    pub(super) async fn due(&mut self) {
        std::future::poll_fn(|cx| self.poll_due(cx)).await
    }

    /// [`Timer::due`] as a poll.
    fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.0 {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// When the timer is due, if the session holds one.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.0.as_ref().map(|timer| timer.deadline().into_std())
    }

    /// Lets the timer go.
    pub(super) fn release(&mut self) {
        self.0 = None;
    }

    #[cfg(test)]
    pub(super) fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

/// How long the client may stay silent, counted from the end of its last answer
/// (`client_idle_timeout_secs`; `None`: no limit).
pub(super) type IdleDeadline = Option<Instant>;

/// What a busy session's wait for the client ends with.
pub(super) enum Next {
    /// The client's request: the whole logical packet, headers included.
    Request(BytesMut),
    /// The client was silent for [`IDLE_PROBE`]: the session idles in [`Session::idle`]
    /// until this deadline at most.
    Quiet(IdleDeadline),
}

impl Session {
    /// The client's next request, or [`Next::Quiet`] once the client has been silent for
    /// [`IDLE_PROBE`]: the session waits in [`Session::idle`] then rather than here, so
    /// that a busy session's large futures are not kept while it idles.
    pub(super) async fn next_request(&mut self) -> Result<Next, End> {
        let max = self.shared.config().proxy.max_packet_size;
        // One timer, moved forward per request rather than a new one registered and
        // cancelled each time.
        self.idle_timer
            .arm(tokio::time::Instant::now() + IDLE_PROBE);
        let idle_timeout = self.shared.config().proxy.client_idle_timeout_secs;
        let idle_deadline =
            (idle_timeout > 0).then(|| Instant::now() + Duration::from_secs(idle_timeout));
        if let Some(sink) = self.hand_over_asked(false) {
            if let Some(end) = Box::pin(self.hand_over(sink, false)).await {
                return Err(end);
            }
        }
        loop {
            let read = tokio::select! {
                biased;
                r = self.client.buffer_packet(max) => r,
                Ok(()) = self.hand_over_to.changed() => {
                    if let Some(sink) = self.hand_over_asked(true) {
                        if let Some(end) = Box::pin(self.hand_over(sink, true)).await {
                            return Err(end);
                        }
                    }
                    continue;
                }
                () = self.idle_timer.due() => return Ok(Next::Quiet(idle_deadline)),
            };
            let wire_len = match read {
                Ok(n) => n,
                Err(ConnError::TooLarge { len, max }) => {
                    let msg = format!("Got a packet bigger than 'max_allowed_packet' bytes ({len} > {max}); holdfast closes the connection");
                    let _ = self
                        .send_error_kind(1, ErrorKind::PacketTooLarge, msg.clone())
                        .await;
                    return Err(End::Protocol(msg));
                }
                Err(e) => return Err(End::Client(e)),
            };
            self.shared
                .metrics
                .requests
                .bytes_from_client(wire_len as u64);
            return Ok(Next::Request(self.client.rbuf.split_to(wire_len)));
        }
    }

    /// The idle session: waits for the client's next byte while dealing with what can
    /// happen to an idle session, then returns (the caller reads the request). Its future
    /// is small, and what it rarely runs (a capture, a move, a hand-over) is boxed: this is
    /// what an idle session's task holds.
    pub(super) async fn idle(&mut self) -> Result<(), End> {
        Box::pin(self.capture_if_due(false)).await;
        self.release_buffers();
        // Until the session parks its sockets, the timer keeps the moment it does (a bool
        // held across the wait rather than an instant: what an idle session's task holds).
        let mut park = false;
        self.idle_timer
            .arm(tokio::time::Instant::now() + crate::parking::PARK_AFTER);
        loop {
            // The rings seen before the sources are asked: a change after this point rings
            // again and wakes the wait below.
            let seen = self.shared.idle_wake.rings();
            // What changed before the session began to wait, or woke it.
            let news = self.idle_news();
            let event = match news {
                Some(event) => event,
                None => {
                    // (Not kept across the wait: what an idle session's task holds.)
                    drop(news);
                    let due = self.idle_due();
                    let park_at = if park {
                        None
                    } else {
                        self.idle_timer.deadline()
                    };
                    match due.into_iter().chain(park_at).min() {
                        Some(at) => self.idle_timer.arm(at.into()),
                        None => self.idle_timer.release(),
                    }
                    if park {
                        // The waker the watcher's call wakes, in place before a socket is
                        // watched.
                        let waker =
                            std::future::poll_fn(|cx| std::task::Poll::Ready(cx.waker().clone()))
                                .await;
                        self.park_sockets(&waker);
                    }
                    // One poll of the sources, no future of their own: this is what an
                    // idle session's task holds.
                    let woke = std::future::poll_fn(|cx| self.poll_woken(cx, seen)).await;
                    match woke {
                        Woke::Client(r) => {
                            self.unpark_sockets();
                            return r.map_err(End::Client);
                        }
                        // The sockets stay parked: what the change asks of the session
                        // (often nothing: a replica's lag changed) wakes what it uses in
                        // place, and the next park takes it back.
                        Woke::Ring => {
                            self.shared.metrics.idle_sessions_rung.inc();
                            continue;
                        }
                        Woke::Backend(error) => {
                            self.unpark_sockets();
                            IdleEvent::BackendGone(error)
                        }
                        Woke::Timer if self.idle_due().is_some_and(|d| Instant::now() >= d) => {
                            self.unpark_sockets();
                            IdleEvent::Deadline
                        }
                        // The moment to park.
                        Woke::Timer => {
                            park = true;
                            continue;
                        }
                    }
                }
            };
            match event {
                IdleEvent::HandOver(sink) => {
                    // Handed over from the reactor (see `handover.rs`).
                    self.unpark_sockets();
                    if let Some(end) = Box::pin(self.hand_over(sink, true)).await {
                        return Err(end);
                    }
                }
                IdleEvent::Topology(false) => {
                    return Err(End::Protocol("topology monitor stopped".into()));
                }
                IdleEvent::Topology(true) => Box::pin(self.on_topology_change()).await?,
                IdleEvent::Switching => {
                    // The session moves next, its diagnostics lost anyway: what only the
                    // old primary knows is read before it is fenced (if the switchover
                    // fails, the client could tell; rare).
                    if *self.switching.borrow() {
                        Box::pin(self.capture_if_due(true)).await;
                    }
                }
                IdleEvent::BackendGone(_) if self.killed_on_purpose() => {
                    return Err(Box::pin(self.end_killed_while_idle()).await);
                }
                IdleEvent::BackendGone(error) => {
                    Box::pin(self.backend_lost_while_idle(error)).await
                }
                IdleEvent::Deadline if self.idle_deadline.is_some_and(|d| Instant::now() >= d) => {
                    let idle_timeout = self.shared.config().proxy.client_idle_timeout_secs;
                    return Err(End::Closed {
                        reason: CloseReason::IdleTimeout,
                        message: format!(
                            "closed: the client sent nothing for client_idle_timeout_secs = {idle_timeout}"
                        ),
                    });
                }
                IdleEvent::Deadline => return Err(self.cooldown_expired()),
            }
        }
    }

    /// The earlier of the cool-down's end (when the session's node is no longer the
    /// primary) and the idle deadline.
    fn idle_due(&self) -> Option<Instant> {
        let cooldown_end = self
            .move_pending_since
            .map(|t| t + self.shared.config().proxy.cooldown());
        cooldown_end.into_iter().chain(self.idle_deadline).min()
    }

    /// Hands the sockets to the process's watcher of sockets out of the reactor (see
    /// `parking.rs`), which wakes this task through its info when one has something to
    /// read or ends. A split session's replica connections park too: the select does not
    /// read them, so their call only wakes the task (a replica that closed one is heard
    /// at its next use, as in the reactor).
    fn park_sockets(&mut self, waker: &std::task::Waker) {
        use crate::parking::parkable;
        let backend = !self.backend_dead && parkable(&self.backend.conn);
        let readers = self
            .split
            .as_mut()
            .is_some_and(|split| split.reader_streams().any(|c| parkable(c)));
        if !parkable(&self.client) && !backend && !readers {
            return;
        }
        let Some(watcher) = self.shared.socket_watcher.get() else {
            return;
        };
        self.info.idle_waker.register(waker);
        let wake: holdfast_sockmap::OnHangup = self.info.clone();
        let tally = &self.shared.metrics.idle_sockets;
        let park = |conn: &mut PacketConn| crate::parking::park(watcher, conn, &wake, tally);
        let mut any = park(&mut self.client);
        if backend {
            any |= park(&mut self.backend.conn);
        }
        if let Some(split) = self.split.as_mut() {
            for reader in split.reader_streams() {
                any |= park(reader);
            }
        }
        if any {
            // What the streams let go (tokio's registrations, a TLS connection's state)
            // goes back to the system with the next trim.
            self.shared.memory.released();
        }
    }

    /// Takes the parked sockets back into the reactor (a byte the wait read stays
    /// buffered).
    fn unpark_sockets(&mut self) {
        crate::parking::unpark(&mut self.client);
        crate::parking::unpark(&mut self.backend.conn);
        if let Some(split) = self.split.as_mut() {
            split.reader_streams().for_each(crate::parking::unpark);
        }
    }

    /// What changed of the broadcasts an idle session watches, each asked without waiting,
    /// the hand-over first: `None` when nothing did. Seen once asked, as a `changed()`
    /// that completes marks it. (A node whose connection is dead is not watched: the
    /// session moves with its next request.)
    fn idle_news(&mut self) -> Option<IdleEvent> {
        if self.hand_over_to.has_changed().unwrap_or(false) {
            if let Some(sink) = self.hand_over_asked(true) {
                return Some(IdleEvent::HandOver(sink));
            }
        }
        if self.backend_dead {
            return None;
        }
        match self.topology.has_changed() {
            Ok(true) => {
                self.topology.mark_unchanged();
                return Some(IdleEvent::Topology(true));
            }
            Ok(false) => {}
            Err(_) => return Some(IdleEvent::Topology(false)),
        }
        if self.switching.has_changed().unwrap_or(false) {
            self.switching.mark_unchanged();
            return Some(IdleEvent::Switching);
        }
        None
    }

    async fn backend_lost_while_idle(&mut self, error: Option<std::io::Error>) {
        tracing::info!(session = self.info.id, node = %self.backend_name, error = ?error, "backend connection lost while idle");
        // Whose loss it was is told now, while a cut may still be in place: the move comes
        // with the next request.
        let lost = match error {
            Some(e) => self.lost_conn_after(&ConnError::Io(e), "idle").await,
            None => {
                self.shared.metrics.backend_lost("idle");
                self.lost_conn()
            }
        };
        self.mark_backend_dead();
        self.lost_while_idle = Some(Box::new(lost));
    }

    /// An idle session keeps no read buffers (nor what it keeps of a request in the
    /// client's): they are most of its memory, and the next read allocates them again.
    fn release_buffers(&mut self) {
        self.client.release_buffer();
        self.backend.conn.release_buffer();
        self.scratch = Vec::new();
        self.running.release();
        if let Some(split) = self.split.as_mut() {
            split.release_buffers();
        }
        self.shared.memory.released();
    }

    fn cooldown_expired(&mut self) -> End {
        let blocker = self.record.blocker().unwrap_or(Blocker::Untracked);
        End::Closed {
            reason: CloseReason::Cooldown(blocker),
            message: format!(
                "closed: its node is no longer the primary and the session did not reach a safe point within the cool-down of {} ms ({blocker})",
                self.shared.config().proxy.cooldown_ms
            ),
        }
    }
}

impl Session {
    /// What woke the idle session, each source asked in turn, first first (a byte from
    /// the client before anything else): the client's next byte, which is buffered for
    /// the read of the request (see [`PacketConn::poll_read_one`]: the released `rbuf` is
    /// not allocated again while the session idles); a ring since `seen`; the backend
    /// connection closing or sending something on its own (servers send an ERR before
    /// they close a connection on shutdown or KILL; a byte read is kept in `rbuf`, where
    /// the next packet read finds it), asked only while it is alive; the timer. Polls
    /// in place of futures of their own: an idle session's task holds only this wait's
    /// closure (issue 22: memory per idle session).
    fn poll_woken(&mut self, cx: &mut Context<'_>, seen: u64) -> Poll<Woke> {
        if let Poll::Ready(read) = self.client.poll_read_one(cx) {
            return Poll::Ready(Woke::Client(match read {
                Ok(0) => Err(ConnError::Closed),
                Ok(_) => Ok(()),
                Err(e) => Err(e.into()),
            }));
        }
        if self
            .shared
            .idle_wake
            .poll_rung_since(&self.info, seen, cx)
            .is_ready()
        {
            return Poll::Ready(Woke::Ring);
        }
        if !self.backend_dead {
            if let Poll::Ready(read) = self.backend.conn.poll_read_one(cx) {
                return Poll::Ready(Woke::Backend(read.err()));
            }
        }
        self.idle_timer.poll_due(cx).map(|()| Woke::Timer)
    }
}

#[cfg(test)]
mod tests {
    use super::Timer;
    use std::time::Duration;

    /// The timer an idle session with no deadline lets go, and makes again when it is armed.
    #[tokio::test]
    async fn a_released_timer_holds_nothing_and_never_fires_until_armed_again() {
        let mut timer = Timer::default();
        assert!(!timer.is_held(), "a new session holds no timer");
        timer.arm(tokio::time::Instant::now() + Duration::from_millis(10));
        assert!(timer.is_held());
        tokio::time::timeout(Duration::from_secs(5), timer.due())
            .await
            .expect("an armed timer fires");
        timer.release();
        assert!(!timer.is_held(), "released");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), timer.due())
                .await
                .is_err(),
            "a released timer never fires"
        );
        timer.arm(tokio::time::Instant::now() + Duration::from_millis(10));
        tokio::time::timeout(Duration::from_secs(5), timer.due())
            .await
            .expect("armed again, it fires");
        // Asked for without being armed, it is due at once (a watch starts early).
        timer.release();
        tokio::time::timeout(Duration::from_secs(5), timer.armed())
            .await
            .expect("due at once");
    }
}
