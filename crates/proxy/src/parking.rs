//! Sockets of a long-idle session, parked out of tokio's reactor (issue 22: memory per idle
//! session). tokio keeps a 256-byte registration (cache-line padded) for each socket it
//! watches, and a session has two; a TLS connection also keeps its record layer's state
//! (keys and buffers; rustls' connection only until its login is done, see
//! `PacketConn::leave_rustls`).
//!
//! A session idle for [`PARK_AFTER`] takes each socket out of its stream as a hand-over
//! to another process does ([`PacketConn::take_socket`]: the TCP socket, the TLS record
//! layer's keys and sequence numbers, the compressed protocol's sequence) and hands the
//! socket to the process's watcher of sockets out of the reactor
//! ([`crate::kernel_relay::SocketWatcher`], [`HangupWatcher::watch_readable`]), whose
//! thread wakes the session when it has something to read or ends. The session takes
//! them back into the reactor before it reads a request or hands them over ([`unpark`]);
//! a change it deals with while idle (the topology, a switchover) leaves them parked, and
//! what it uses then wakes in place. A TLS connection goes on with holdfast's own record
//! layer ([`holdfast_client::tls_resume::ResumedTls`], as after a hand-over); parked, its
//! state is kept dormant ([`DormantTls`]: a TLS 1.3 direction keeps its traffic secret, not
//! the keys it derives, 136 bytes where the state is 272). A parked stream
//! that is read (the idle wait's one byte) wakes in place first, so that what it reads
//! is the stream's bytes (plaintext, decompressed), never the socket's.
//!
//! A busy session never parks, so requests pay nothing for it; a session woken after a
//! long silence pays four `epoll_ctl` calls a socket, and a TLS one its keys derived
//! again and two key schedules.

use crate::metrics::IdleSockets;
use holdfast_client::compress::CompressedState;
use holdfast_client::conn::{stream_of, BoxedIo, PacketConn, TakenSocket};
use holdfast_client::tls_resume::{DormantTls, TlsState};
use holdfast_sockmap::{HangupWatcher, OnHangup, Watched};
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a session idles before it parks its sockets.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// Parks `conn`'s socket if its stream can be taken apart (plain TCP, TLS, the compressed
/// protocol over either) with nothing buffered: `wake` is called (once) when it has
/// something to read or ends; `tally` counts it while it is. `false` when it stays in the
/// reactor, or was parked already. A parked stream that woke in place is parked again.
///
/// A parked stream serves anything done on it (waking in place); call [`unpark`] before
/// the connection is taken apart otherwise (a hand-over) or used for long.
pub fn park(
    watcher: &HangupWatcher,
    conn: &mut PacketConn,
    wake: &OnHangup,
    tally: &Arc<IdleSockets>,
) -> bool {
    match conn.stream.as_ref().as_any().downcast_ref::<Parked>() {
        // Still watched.
        Some(Parked::Asleep { .. }) => return false,
        Some(_) => unpark(conn),
        None => {}
    }
    if !conn.rbuf.is_empty() || !conn.can_take_socket() {
        return false;
    }
    // (`None` after `can_take_socket`: taking the TLS state failed half-way, and the
    // connection reads as lost, as a hand-over's would.)
    let Some(taken) = conn.take_socket() else {
        tracing::warn!("an idle connection could not be taken apart to park it: it is lost");
        return false;
    };
    if !taken.unread.is_empty() {
        // Plaintext nobody read yet (not seen on an idle connection): it stays awake.
        back_in_reactor(conn, taken);
        return false;
    }
    let TakenSocket {
        socket,
        tls,
        compressed,
        ..
    } = taken;
    let tls = tls.map(TlsState::into_dormant);
    let compressed = compressed.map(Box::new);
    let layers =
        (tls.is_some() || compressed.is_some()).then(|| Box::new(Layers { tls, compressed }));
    match watcher.watch_readable(socket.as_fd(), wake.clone()) {
        Ok(watched) => {
            tally.parked.inc();
            conn.replace_stream(Box::new(Parked::Asleep {
                watched,
                counted: Counted(tally.clone()),
                socket,
                layers,
            }));
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "an idle socket could not be parked");
            match layers_back(socket, layers) {
                Ok(stream) => {
                    conn.replace_stream(stream);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "an idle socket could not return to the reactor: its connection is lost")
                }
            }
            false
        }
    }
}

/// The stream over `socket` again, with what its layers kept.
fn layers_back(socket: std::net::TcpStream, layers: Option<Box<Layers>>) -> io::Result<BoxedIo> {
    let (tls, compressed) = layers.map_or((None, None), |l| (l.tls, l.compressed.map(|c| *c)));
    stream_of(socket, tls.map(DormantTls::wake).transpose()?, compressed)
}

/// Whether [`park`] would park `conn` now: a stream it can take apart with nothing
/// buffered, or a parked one that woke in place.
pub fn parkable(conn: &PacketConn) -> bool {
    match conn.stream.as_ref().as_any().downcast_ref::<Parked>() {
        Some(Parked::Awake(_)) => true,
        Some(_) => false,
        None => conn.rbuf.is_empty() && conn.can_take_socket(),
    }
}

/// Takes `conn`'s socket back into the reactor if it is parked (a byte the wait read stays
/// buffered). Safe to call on any connection.
pub fn unpark(conn: &mut PacketConn) {
    if !conn.stream.as_ref().as_any().is::<Parked>() {
        return;
    }
    let (stream, buffered) = conn.take_stream();
    conn.rbuf = buffered;
    let Ok(parked) = stream.into_any().downcast::<Parked>() else {
        return;
    };
    match parked.into_stream() {
        Ok(stream) => {
            conn.replace_stream(stream);
        }
        Err(e) => {
            tracing::warn!(error = %e, "an idle socket could not return to the reactor: its connection is lost")
        }
    }
}

/// Puts a socket taken for parking back as it was; if that fails, the connection stays
/// detached and reads as lost.
fn back_in_reactor(conn: &mut PacketConn, taken: TakenSocket) {
    if let Err(e) = conn.put_back_socket(taken) {
        tracing::warn!(error = %e, "an idle socket could not return to the reactor: its connection is lost");
    }
}

/// What the stream was over its socket, besides TCP.
struct Layers {
    tls: Option<DormantTls>,
    /// Boxed: rare, and every parked TLS stream would keep its room.
    compressed: Option<Box<CompressedState>>,
}

/// A parked connection's stream. Asleep, it holds the socket (non-blocking, out of the
/// reactor) and what its layers need to go on; anything done on it wakes it in place: it
/// rebuilds the stream in the reactor and passes the call on. A read finds out first,
/// without consuming anything, whether the socket has something (or ended): while it has
/// not, the read waits for the watcher's call, which wakes the session (its waker is in
/// the session's info, registered before it parked).
enum Parked {
    Asleep {
        // (Fields drop in this order: out of the set before the socket closes, so that
        // the set never loses the registration of another socket given the same number.)
        watched: Watched,
        counted: Counted,
        socket: std::net::TcpStream,
        layers: Option<Box<Layers>>,
    },
    Awake(BoxedIo),
    /// Waking failed; the connection reads as lost.
    Lost,
}

/// A parked socket in the gauge, until it is taken back or dropped with its session.
struct Counted(Arc<IdleSockets>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.parked.dec();
    }
}

impl Parked {
    /// The stream in the reactor again.
    fn into_stream(self) -> io::Result<BoxedIo> {
        match self {
            Parked::Asleep {
                watched,
                counted,
                socket,
                layers,
            } => {
                // Out of the set first: the watcher's call is no longer wanted.
                counted.0.woken.inc();
                drop((watched, counted));
                layers_back(socket, layers)
            }
            Parked::Awake(stream) => Ok(stream),
            Parked::Lost => Err(lost()),
        }
    }

    /// The stream, woken in place if it was asleep.
    fn awake(&mut self) -> io::Result<&mut BoxedIo> {
        if let Parked::Asleep { .. } = self {
            let asleep = std::mem::replace(self, Parked::Lost);
            *self = Parked::Awake(asleep.into_stream()?);
        }
        match self {
            Parked::Awake(stream) => Ok(stream),
            _ => Err(lost()),
        }
    }

    /// `call` on the stream, woken in place if it was asleep.
    fn on_awake<T>(
        &mut self,
        call: impl FnOnce(Pin<&mut BoxedIo>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match self.awake() {
            Ok(stream) => call(Pin::new(stream)),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Whether an asleep socket has nothing to read and has not ended.
    fn sleeps_on(&self) -> bool {
        let Parked::Asleep { socket, .. } = self else {
            return false;
        };
        let mut byte = [0u8; 1];
        loop {
            return match socket.peek(&mut byte) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => e.kind() == io::ErrorKind::WouldBlock,
                // A byte, or the end: the stream reads it.
                Ok(_) => false,
            };
        }
    }
}

fn lost() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "an idle connection could not return to the reactor",
    )
}

impl AsyncRead for Parked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.sleeps_on() {
            return Poll::Pending;
        }
        this.on_awake(|stream| stream.poll_read(cx, buf))
    }
}

// Writes are not expected (the session takes the socket back first): they wake it too.
impl AsyncWrite for Parked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .on_awake(|stream| stream.poll_write(cx, data))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().on_awake(|stream| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().on_awake(|stream| stream.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    /// Every parked TLS stream keeps its `Layers` (issue 22: memory per idle session).
    #[test]
    fn a_parked_streams_layers_stay_small() {
        let layers = size_of::<super::Layers>();
        // 184 with the compressed protocol's state inline, 160 with the TLS state's
        // undecrypted bytes in a boxed slice (a 176-byte heap chunk; 160 at 152).
        assert!(layers <= 152, "Layers are {layers} bytes");
    }
}
