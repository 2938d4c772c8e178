//! Sockets of a long-idle session, parked out of tokio's reactor (issue 22: memory per idle
//! session). tokio keeps a 256-byte registration (cache-line padded) for each socket it
//! watches, and a session has two: with the boxed sockets, a fifth of an idle session's
//! heap.
//! A session idle for [`PARK_AFTER`] hands its plain TCP sockets to the process's watcher
//! of sockets out of the reactor ([`crate::kernel_relay::SocketWatcher`],
//! [`HangupWatcher::watch_readable`]), whose thread wakes the session when either
//! has something to read or ends; the session takes them back into the reactor before it
//! does anything else. A busy session never parks, so requests pay nothing for it; a
//! session woken after a long silence pays four `epoll_ctl` calls a socket.
//!
//! TLS and compressed connections are not parked (their streams wrap the socket).

use holdfast_client::conn::PacketConn;
use holdfast_sockmap::{HangupWatcher, OnHangup, Watched};
use prometheus_client::metrics::gauge::Gauge;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a session idles before it parks its sockets.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// Parks `conn`'s socket if it is plain TCP with nothing buffered: `wake` is called
/// (once) when it has something to read or ends; `parked` counts it while it is.
/// `false` when it stays as it was.
///
/// Call [`unpark`] before anything but reading one byte happens on the connection.
pub fn park(
    watcher: &HangupWatcher,
    conn: &mut PacketConn,
    wake: &OnHangup,
    parked: &Gauge,
) -> bool {
    if !conn.rbuf.is_empty() || !conn.is_tcp() {
        return false;
    }
    // (Out of the reactor: a failure here drops the socket, and the connection reads
    // as lost; `into_std` fails only when epoll does.)
    let Some((tcp, _)) = conn.take_tcp() else {
        return false;
    };
    match watcher.watch_readable(tcp.as_fd(), wake.clone()) {
        Ok(watched) => {
            parked.inc();
            conn.replace_stream(Box::new(ParkedTcp {
                watched,
                counted: Counted(parked.clone()),
                tcp,
            }));
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "an idle socket could not be parked");
            back_in_reactor(conn, tcp);
            false
        }
    }
}

/// Takes `conn`'s socket back into the reactor if it is parked (the byte a wait read
/// stays buffered). Safe to call on any connection.
pub fn unpark(conn: &mut PacketConn) {
    if !conn.stream.as_ref().as_any().is::<ParkedTcp>() {
        return;
    }
    let (stream, buffered) = conn.take_stream();
    conn.rbuf = buffered;
    if let Ok(parked) = stream.into_any().downcast::<ParkedTcp>() {
        let ParkedTcp {
            watched,
            counted,
            tcp,
        } = *parked;
        // Out of the set first: the watcher's call is no longer wanted.
        drop((watched, counted));
        back_in_reactor(conn, tcp);
    }
}

/// Puts a socket taken out of the reactor back; if the reactor refuses it, the connection
/// stays detached and reads as lost.
fn back_in_reactor(conn: &mut PacketConn, tcp: std::net::TcpStream) {
    match tokio::net::TcpStream::from_std(tcp) {
        Ok(tcp) => {
            conn.replace_stream(Box::new(tcp));
        }
        Err(e) => {
            tracing::warn!(error = %e, "an idle socket could not return to the reactor: its connection is lost")
        }
    }
}

/// A parked socket (non-blocking, as tokio left it). Reads try the socket and, when it has
/// nothing, wait for the watcher's call, which wakes the session (its waker is in the
/// session's info, registered before it parked). Nothing writes to a parked socket.
struct ParkedTcp {
    // (Fields drop in this order: out of the set before the socket closes, so that the
    // set never loses the registration of another socket given the same number.)
    watched: Watched,
    counted: Counted,
    tcp: std::net::TcpStream,
}

/// A parked socket in the gauge, until it is taken back or dropped with its session.
struct Counted(Gauge);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl AsyncRead for ParkedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            return match (&self.tcp).read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    Poll::Ready(Ok(()))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Poll::Ready(Err(e)),
            };
        }
    }
}

impl AsyncWrite for ParkedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        // Not expected (the session takes the socket back first); a write that cannot go
        // at once fails rather than wait for a wake-up that would not come.
        Poll::Ready((&self.tcp).write(data))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.tcp.shutdown(std::net::Shutdown::Write))
    }
}
