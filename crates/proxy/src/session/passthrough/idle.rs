//! A pass-through session relayed in user space parks its two sockets out of the reactor
//! (see [`crate::parking`]) once it has relayed nothing either way for
//! [`PARK_AFTER`](crate::parking::PARK_AFTER) and holds no bytes: a TLS relay (from the
//! client or to the node) lets its record layers' key schedules and buffers go, any relay
//! tokio's two registrations. The pump's reads over a parked stream wait on the watcher's call, which
//! wakes the relay's task; the first read or write wakes a stream in place, and the relay
//! parks again after the next quiet second. A busy relay pays a look at its timer per
//! wake-up (no system call) and the timer's reset once a second.

use super::Pump;
use crate::conn::PacketConn;
use crate::Shared;
use atomic_waker::AtomicWaker;
use holdfast_sockmap::{Hangup, OnHangup};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::{Instant, Sleep};

use super::Stopped;

/// When a relay parks. Its own waker rather than the session info's: the rings of a
/// topology change wake idle sessions through that one, and concern no relay.
#[derive(Default)]
pub(super) struct IdlePark {
    /// Due [`PARK_AFTER`](crate::parking::PARK_AFTER) after it was armed; none while
    /// parked (an idle relay holds no timer).
    timer: Option<Pin<Box<Sleep>>>,
    /// The bytes relayed when the timer was armed, or when the relay parked.
    seen: u64,
    parked: bool,
    /// Made at the first park, kept for the next ones.
    wake: Option<Arc<RelayWaker>>,
}

/// The relay's waker, which the watcher of parked sockets calls itself.
#[derive(Default)]
struct RelayWaker(AtomicWaker);

impl Hangup for RelayWaker {
    fn hangup(&self) {
        self.0.wake();
    }
}

impl IdlePark {
    /// Polls the pump; parks both sockets when the relay has been quiet long enough. Never
    /// parks while asked to stop (a hand-over takes the sockets).
    pub(super) fn poll_pump(
        &mut self,
        cx: &mut Context<'_>,
        shared: &Shared,
        pump: &mut Pump,
        client: &mut PacketConn,
        backend: &mut PacketConn,
        stop: bool,
    ) -> Poll<io::Result<Stopped>> {
        loop {
            if let Poll::Ready(r) = pump.poll(cx, &mut client.stream, &mut backend.stream, stop) {
                return Poll::Ready(r);
            }
            if stop {
                return Poll::Pending;
            }
            ready!(self.poll_quiet(cx, pump.relayed()));
            if pump.holds_nothing() {
                self.park(cx, shared, client, backend);
            } else {
                // A peer that does not read: the bytes wait in the pump; asked again later.
                self.arm(pump.relayed());
            }
            // Polled again: over parked streams the reads wait on the watcher's call.
        }
    }

    /// Takes both sockets back into the reactor (before a hand-over); the relay parks
    /// again after a quiet second.
    pub(super) fn unpark(&mut self, client: &mut PacketConn, backend: &mut PacketConn) {
        crate::parking::unpark(client);
        crate::parking::unpark(backend);
        self.parked = false;
        self.timer = None;
    }

    /// Ready when nothing was relayed since the timer was armed and it is due; the timer
    /// is armed again while bytes go by, and once the relay relays after a park.
    fn poll_quiet(&mut self, cx: &mut Context<'_>, relayed: u64) -> Poll<()> {
        if self.parked {
            if relayed == self.seen {
                // Asleep (or woken for nothing: a peek found the socket still empty).
                return Poll::Pending;
            }
            self.parked = false;
        }
        loop {
            let Some(timer) = self.timer.as_mut() else {
                self.arm(relayed);
                continue;
            };
            ready!(timer.as_mut().poll(cx));
            if relayed == self.seen {
                return Poll::Ready(());
            }
            self.arm(relayed);
        }
    }

    fn arm(&mut self, relayed: u64) {
        self.seen = relayed;
        let at = Instant::now() + crate::parking::PARK_AFTER;
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    fn park(
        &mut self,
        cx: &mut Context<'_>,
        shared: &Shared,
        client: &mut PacketConn,
        backend: &mut PacketConn,
    ) {
        // Tried once per quiet spell, parked or not (a watcher that did not start, a TLS
        // stream that cannot be taken apart): the next bytes arm the timer again.
        self.parked = true;
        self.timer = None;
        let Some(watcher) = shared.socket_watcher.get() else {
            return;
        };
        let waker = self.wake.get_or_insert_with(Arc::default);
        // In place before a socket is watched: the watcher's call finds it.
        waker.0.register(cx.waker());
        let wake: OnHangup = waker.clone();
        let tally = &shared.metrics.idle_sockets;
        let client_parked = crate::parking::park(watcher, client, &wake, tally);
        let backend_parked = crate::parking::park(watcher, backend, &wake, tally);
        if client_parked || backend_parked {
            shared.memory.released();
        }
    }
}
