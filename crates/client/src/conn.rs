//! A framed connection: a byte stream with its read buffer, reading and writing whole
//! logical packets (continuations joined).
//!
//! The stream is a [`BoxedIo`]: a TCP socket in production (options such as `TCP_NODELAY`
//! are set on it before it is boxed), one end of a `tokio::io::duplex` pipe in tests, and
//! later a TLS stream that replaces the TCP one mid-handshake ([`PacketConn::take_stream`],
//! [`PacketConn::replace_stream`]). One virtual call per read or write is noise next to the
//! syscall behind it; vectored writes pass through the box (`Box<dyn AsyncWrite>` forwards
//! `poll_write_vectored` and `is_write_vectored`).

use bytes::{Bytes, BytesMut};
use holdfast_wire::frame::{self, Scan};
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::compress::{Compressed, CompressedState};

/// A connection's socket taken out for another process ([`PacketConn::take_socket`]).
pub struct TakenSocket {
    pub socket: std::net::TcpStream,
    pub tls: Option<crate::tls_resume::TlsState>,
    pub compressed: Option<CompressedState>,
    /// Bytes read and not consumed (of the plain packet stream).
    pub unread: BytesMut,
}

/// The stream a socket taken by [`PacketConn::take_socket`] continues as in the process it
/// went to: the socket itself, the TLS session on it, and the compressed protocol over
/// either.
pub fn stream_of(
    socket: std::net::TcpStream,
    tls: Option<crate::tls_resume::TlsState>,
    compressed: Option<CompressedState>,
) -> io::Result<BoxedIo> {
    socket.set_nonblocking(true)?;
    let tcp = tokio::net::TcpStream::from_std(socket)?;
    let stream: BoxedIo = match tls {
        Some(state) => Box::new(crate::tls_resume::ResumedTls::new(tcp, state)?),
        None => Box::new(tcp),
    };
    Ok(match compressed {
        Some(state) => Box::new(Compressed::resume(stream, state)),
        None => stream,
    })
}

/// A bidirectional byte stream a [`PacketConn`] can own: a `TcpStream`, a TLS stream, one
/// end of `tokio::io::duplex`...
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {
    /// The stream itself, to tell what it is (a plain `TcpStream` can be handed to another
    /// process; a TLS stream cannot).
    fn as_any(&self) -> &dyn std::any::Any;
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Io for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// The stream of a [`PacketConn`].
pub type BoxedIo = Box<dyn Io>;

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection closed by peer")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("packet of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("{0}")]
    Wire(#[from] holdfast_wire::WireError),
}

/// What a connection whose buffer was released reads into while it waits.
const IDLE_READ_BUFFER: usize = 256;

pub struct PacketConn {
    pub stream: BoxedIo,
    pub rbuf: BytesMut,
}

/// One logical packet: its payload (continuations joined) and the last sequence id used.
pub struct Packet {
    pub payload: Bytes,
    pub seq: u8,
}

impl PacketConn {
    pub fn new(stream: BoxedIo) -> Self {
        PacketConn {
            stream,
            rbuf: BytesMut::with_capacity(4096),
        }
    }

    /// Puts `stream` in place of the current one (e.g. a TLS stream wrapping what
    /// [`PacketConn::take_stream`] returned) and returns the one it replaces. The read
    /// buffer is kept.
    pub fn replace_stream(&mut self, stream: BoxedIo) -> BoxedIo {
        std::mem::replace(&mut self.stream, stream)
    }

    /// Takes the stream out, e.g. to run a TLS handshake over it, leaving a detached
    /// placeholder on which every read and write fails (`NotConnected`) until
    /// [`PacketConn::replace_stream`] puts a stream back. Also returns the bytes already
    /// read but not yet consumed: they came after the last packet read and belong to
    /// whatever follows on the stream (a client sends its TLS ClientHello right behind
    /// the SSLRequest), so the caller must feed them to it first.
    pub fn take_stream(&mut self) -> (BoxedIo, BytesMut) {
        // (Taken whole, not `split`: splitting a buffer that owns its memory allocates a
        // shared header for the two halves, 40 bytes that a parked idle connection kept.)
        let buffered = std::mem::take(&mut self.rbuf);
        (self.replace_stream(Box::new(Detached)), buffered)
    }

    /// Whether the stream is a plain TCP socket (one that [`PacketConn::take_tcp`] gives).
    pub fn is_tcp(&self) -> bool {
        // (`as_ref`: the box itself is an `Io` too.)
        self.stream.as_ref().as_any().is::<tokio::net::TcpStream>()
    }

    /// Takes a plain TCP socket out (for another process: nothing is said on it), with the
    /// bytes read from it but not consumed; the connection is left detached. `None` (and
    /// the connection as it was) for any other stream.
    pub fn take_tcp(&mut self) -> Option<(std::net::TcpStream, BytesMut)> {
        if !self.is_tcp() {
            return None;
        }
        let (stream, buffered) = self.take_stream();
        let tcp = stream.into_any().downcast::<tokio::net::TcpStream>().ok()?;
        match tcp.into_std() {
            Ok(std) => Some((std, buffered)),
            Err(_) => None,
        }
    }

    /// Whether [`PacketConn::take_socket`] can take the stream now: plain TCP, or TLS whose
    /// state can be taken (see [`crate::tls_resume`]), either under the compressed
    /// protocol with nothing in flight.
    pub fn can_take_socket(&self) -> bool {
        let compressed_idle = self
            .stream
            .as_ref()
            .as_any()
            .downcast_ref::<Compressed>()
            .is_none_or(Compressed::can_take);
        let stream = self.under_compression();
        compressed_idle
            && (stream.as_any().is::<tokio::net::TcpStream>()
                || crate::tls_resume::can_take(stream))
    }

    /// The stream under the compressed protocol, or the stream itself.
    fn under_compression(&self) -> &dyn Io {
        let stream: &dyn Io = self.stream.as_ref();
        match stream.as_any().downcast_ref::<Compressed>() {
            Some(c) => c.inner(),
            None => stream,
        }
    }

    /// Takes the TCP socket out for another process, with its TLS state when it carries
    /// TLS, its compression state under the compressed protocol, and what was read from it
    /// but not consumed; the connection is left detached. `None` when
    /// [`PacketConn::can_take_socket`] says no (nothing taken), or when taking the TLS
    /// state failed half-way (the connection is lost then).
    pub fn take_socket(&mut self) -> Option<TakenSocket> {
        if !self.can_take_socket() {
            return None;
        }
        let (stream, mut unread) = self.take_stream();
        // (Each type is asked before the stream is turned into it: a stream whose
        // downcast failed could not be boxed back.)
        // (`as_ref`: the box itself is an `Io` too.)
        let (stream, mut compressed) = if stream.as_ref().as_any().is::<Compressed>() {
            let c = stream.into_any().downcast::<Compressed>().ok()?;
            let (inner, state, plain) = c.into_parts();
            unread.extend_from_slice(&plain);
            (inner, Some(state))
        } else {
            (stream, None)
        };
        let (socket, tls) = if stream.as_ref().as_any().is::<tokio::net::TcpStream>() {
            let tcp = stream.into_any().downcast::<tokio::net::TcpStream>().ok()?;
            (tcp.into_std().ok()?, None)
        } else {
            let (tcp, state, plaintext) = crate::tls_resume::take_tls(stream).ok()?;
            // Under compression, what TLS decrypted is compressed bytes.
            match compressed.as_mut() {
                Some(c) => c.append_raw(&plaintext),
                None => unread.extend_from_slice(&plaintext),
            }
            (tcp.into_std().ok()?, Some(state))
        };
        Some(TakenSocket {
            socket,
            tls,
            compressed,
            unread,
        })
    }

    /// Once a login over TLS is done: the connection goes on over holdfast's own record
    /// layer ([`crate::tls_resume::ResumedTls`], as after a park or a hand-over) with the
    /// same keys and sequence numbers, and rustls' connection (its handshake's leftovers,
    /// its buffers) is freed now rather than at the session's first park. Freed later, its
    /// allocations, made between the ones the session keeps, left holes in the heap that
    /// `malloc_trim` cannot give back (issue 22: an idle TLS session cost 6.4 KiB of RSS
    /// over a 3.5 KB heap). Plain TCP, a stream already on holdfast's record layer, or one
    /// that cannot be taken apart at this moment (bytes still to write, a record half
    /// received) stays as it is. An error: the connection is lost.
    pub fn leave_rustls(&mut self) -> io::Result<()> {
        if !self.on_rustls() || !self.can_take_socket() {
            return Ok(());
        }
        let taken = self
            .take_socket()
            .ok_or_else(|| io::Error::other("the TLS connection could not be taken apart"))?;
        self.put_back_socket(taken)
    }

    /// Whether the stream is TLS run by rustls (see [`PacketConn::leave_rustls`]).
    pub fn on_rustls(&self) -> bool {
        crate::tls_resume::on_rustls(self.under_compression())
    }

    /// Puts a socket taken by [`PacketConn::take_socket`] back in place (it did not go to
    /// the other process after all): the connection continues on it as it would there.
    pub fn put_back_socket(&mut self, taken: TakenSocket) -> io::Result<()> {
        let stream = stream_of(taken.socket, taken.tls, taken.compressed)?;
        self.replace_stream(stream);
        self.rbuf.extend_from_slice(&taken.unread);
        Ok(())
    }

    /// Writes what the stream takes of `bytes` right now, without waiting (best effort,
    /// e.g. a COM_QUIT to a connection about to be dropped). Returns how many bytes went.
    pub fn try_write_now(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.stream).poll_write(&mut cx, bytes) {
            Poll::Ready(r) => {
                let _ = Pin::new(&mut self.stream).poll_flush(&mut cx);
                r
            }
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Lets the read buffer go when nothing is buffered (an idle connection's): the next
    /// read takes a small one.
    pub fn release_buffer(&mut self) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        }
    }

    /// Waits for the next byte without a read buffer (an idle connection's was released)
    /// and buffers it; 0 at end of stream. Cancel-safe: a byte read is kept.
    pub async fn read_one(&mut self) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_one(cx)).await
    }

    /// [`PacketConn::read_one`] as a poll, for a wait that keeps no state of its own.
    pub fn poll_read_one(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        if let Err(e) = ready!(Pin::new(&mut self.stream).poll_read(cx, &mut buf)) {
            return Poll::Ready(Err(e));
        }
        let n = buf.filled().len();
        if n > 0 {
            if self.rbuf.capacity() == 0 {
                // A small buffer, as `fill` takes after a release.
                self.rbuf.reserve(IDLE_READ_BUFFER);
            }
            self.rbuf.extend_from_slice(&byte[..n]);
        }
        Poll::Ready(Ok(n))
    }

    /// Reads more bytes into the buffer; `Closed` at end of stream.
    pub async fn fill(&mut self) -> Result<usize, ConnError> {
        let (capacity, free) = (self.rbuf.capacity(), self.rbuf.capacity() - self.rbuf.len());
        if capacity == 0 {
            // A buffer released while idle. An idle connection waits here, so a small one:
            // it takes the next request's first bytes (a short query whole), and a longer
            // request grows it on the next read.
            self.rbuf.reserve(IDLE_READ_BUFFER);
        } else if free == 0 || (capacity > IDLE_READ_BUFFER && free < 1024) {
            // (A small buffer with room left, as `read_one` leaves it, is read into first.)
            self.rbuf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            return Err(ConnError::Closed);
        }
        Ok(n)
    }

    /// Waits until a whole logical packet is buffered and returns its wire length
    /// (headers included) without consuming it.
    pub async fn buffer_packet(&mut self, max: usize) -> Result<usize, ConnError> {
        loop {
            match frame::scan_logical(&self.rbuf, max) {
                Scan::Complete { wire_len, .. } => return Ok(wire_len),
                Scan::TooLarge { payload_len } => {
                    return Err(ConnError::TooLarge {
                        len: payload_len,
                        max,
                    })
                }
                Scan::Incomplete => {
                    self.fill().await?;
                }
            }
        }
    }

    /// Reads one logical packet.
    pub async fn read_packet(&mut self, max: usize) -> Result<Packet, ConnError> {
        let wire_len = self.buffer_packet(max).await?;
        let wire = self.rbuf.split_to(wire_len);
        let last_seq = last_seq(&wire);
        let payload = match frame::logical_payload(&wire) {
            std::borrow::Cow::Borrowed(_) => {
                let mut wire = wire;
                let _ = wire.split_to(frame::HEADER_LEN);
                wire.freeze()
            }
            std::borrow::Cow::Owned(v) => Bytes::from(v),
        };
        Ok(Packet {
            payload,
            seq: last_seq,
        })
    }

    pub async fn write_packet(&mut self, payload: &[u8], seq: u8) -> Result<(), ConnError> {
        let out = frame::packet(payload, seq);
        self.write_raw(&out).await
    }

    /// Writes `bytes` and flushes: a TLS stream may keep what it encrypted until flushed
    /// (a socket is a no-op flush).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }

    /// [`PacketConn::write_raw`] to a peer that is not expected to say anything meanwhile
    /// (a server taking a LOCAL INFILE file). While the write waits, because the peer
    /// stopped reading, the stream is watched: a peer that closes, or sends anything (kept
    /// in the read buffer), fails the write at once. A server killed mid-file closes its
    /// socket with its receive window shut; without the watch the write would wait for the
    /// kernel to give up on that socket (a minute or more).
    pub async fn write_raw_watching(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        let mut written = 0;
        std::future::poll_fn(|cx| loop {
            // The flush is watched too: a TLS stream takes the bytes into its buffer and
            // waits for the socket in its flush.
            if written < bytes.len() {
                match Pin::new(&mut self.stream).poll_write(cx, &bytes[written..]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()))
                    }
                    Poll::Ready(Ok(n)) => {
                        written += n;
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {}
                }
            } else if let Poll::Ready(r) = Pin::new(&mut self.stream).poll_flush(cx) {
                return Poll::Ready(r.map_err(ConnError::from));
            }
            // Blocked: a peer that closes, or speaks, ends the wait.
            let mut byte = [0u8; 1];
            let mut buf = ReadBuf::new(&mut byte);
            return match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
                Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                    Poll::Ready(Err(ConnError::Closed))
                }
                Poll::Ready(Ok(())) => {
                    self.rbuf.extend_from_slice(buf.filled());
                    Poll::Ready(Err(io::Error::other(
                        "the peer spoke while it was being written to",
                    )
                    .into()))
                }
            };
        })
        .await
    }
}

/// The placeholder [`PacketConn::take_stream`] leaves behind.
struct Detached;

fn detached() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection's stream was taken out",
    )
}

impl AsyncRead for Detached {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(detached()))
    }
}

impl AsyncWrite for Detached {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(detached()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(detached()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(detached()))
    }
}

fn last_seq(wire: &[u8]) -> u8 {
    let mut pos = 0;
    let mut seq = 0;
    while let Some(h) = frame::parse_header(&wire[pos..]) {
        seq = h.seq;
        pos += h.packet_len();
        if !h.continues() || pos >= wire.len() {
            break;
        }
    }
    seq
}
