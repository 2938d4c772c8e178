//! Pass-through sessions: after holdfast has authenticated the client and logged in to the
//! backend, bytes are relayed both ways without parsing (the cheapest path). Such a session
//! cannot move: it ends with its backend connection, and it keeps a serverless instance
//! from pausing (the registry lists it as a pause blocker).
//!
//! An upgrade hands it to the new process (`holdfast ctl upgrade`): once the new process
//! takes sessions, the relay stops reading, writes out what it holds, and when neither side
//! has anything in flight (and each TLS stream is between records) it sends both sockets,
//! with their TLS state and the bytes read from them and not relayed yet ([`CarriedRelay`]).
//! The new process relays on. Nothing is said on either connection.
//!
//! With both connections plain TCP and the kernel relay loaded ([`crate::kernel_relay`]),
//! the bytes do not pass through user space at all ([`kernel`]). A relay in user space
//! parks its sockets out of the reactor while it idles ([`idle`]).

mod idle;
mod kernel;

use super::handover::stream_of;
use super::LoggedIn;
use crate::conn::{BoxedIo, PacketConn};
use crate::registry::SessionInfo;
use crate::state::Blocker;
use crate::upgrade::{HandedRelay, SessionChannel};
use crate::Shared;
use holdfast_client::compress::CompressedState;
use holdfast_client::conn::TakenSocket;
use holdfast_client::tls_resume::TlsState;
use holdfast_cluster::topology::NodeName;
use serde::{Deserialize, Serialize};
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// How often a relay asked to go to the new process tries again when a TLS stream was in
/// the middle of a record.
const RETRY: Duration = Duration::from_millis(50);

/// The pass-through session's future (boxed by the caller): a plain function, so that
/// what the login left (the backend's greeting, the client's capabilities) is not kept
/// in it while the session relays. The session is registered (and its login over) when
/// it returns.
pub(super) fn run(
    shared: Arc<Shared>,
    client: PacketConn,
    logged_in: LoggedIn,
    peer: SocketAddr,
    id: u32,
    logging_in: crate::registry::LoggingIn<'_>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let thread = logged_in.backend.greeting.connection_id;
    let backend = logged_in.backend.into_conn();
    let relay = Relay {
        id,
        peer,
        user: shared.user_names.get(&logged_in.user),
        backend_name: logged_in.backend_name,
        thread,
    };
    relay.run(shared, Streams::User(client, backend), Some(logging_in))
}

/// What a pass-through session is, as registered and as handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Relay {
    pub id: u32,
    pub peer: SocketAddr,
    user: Arc<str>,
    backend_name: NodeName,
    thread: u32,
}

/// A pass-through session as one process hands it to the next (JSON on the hand-over
/// channel, the client's and the backend's sockets beside it).
#[derive(Serialize, Deserialize)]
pub struct CarriedRelay {
    pub relay: Relay,
    client_tls: Option<TlsState>,
    backend_tls: Option<TlsState>,
    /// Read from each side and not relayed yet (the plaintext of a TLS stream).
    client_unread: Vec<u8>,
    backend_unread: Vec<u8>,
    /// Under the compressed protocol, each stream's compression state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_compressed: Option<CompressedState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backend_compressed: Option<CompressedState>,
    /// The pair is relayed in the kernel: its sockmap comes with the sockets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_kernel: bool,
}

impl CarriedRelay {
    /// A relay whose sockets are spliced in the kernel (plain TCP, nothing buffered).
    fn in_kernel(relay: Relay) -> CarriedRelay {
        CarriedRelay {
            relay,
            client_tls: None,
            backend_tls: None,
            client_unread: Vec::new(),
            backend_unread: Vec::new(),
            client_compressed: None,
            backend_compressed: None,
            in_kernel: true,
        }
    }
}

/// Where a relay's bytes go through.
enum Streams {
    /// User space: read here, written there.
    User(PacketConn, PacketConn),
    /// The kernel (a pair handed over by the previous process, already spliced).
    Kernel(kernel::Spliced),
}

impl std::fmt::Debug for CarriedRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CarriedRelay")
            .field("relay", &self.relay)
            .finish_non_exhaustive()
    }
}

/// What a relay's first future ends with.
enum Relayed {
    /// The bytes each way, or `None`: the session went to the process that replaces this
    /// one.
    Ended(io::Result<Option<(u64, u64)>>),
    /// Both connections turned out plain TCP: the kernel relays them from here.
    ToKernel(kernel::Spliced, Relay),
}

impl Relay {
    /// The session's future: listed, counted and blocking a pause until it ends. What it
    /// holds while it relays is one boxed future, sized for the way it relays (an idle
    /// session's memory: the future of a relay in user space and that of one in the
    /// kernel are not both kept).
    fn run(
        self,
        shared: Arc<Shared>,
        streams: Streams,
        logging_in: Option<crate::registry::LoggingIn<'_>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let listed = Listed::new(shared.clone(), &self);
        drop(logging_in);
        let first: Pin<Box<dyn std::future::Future<Output = Relayed> + Send>> = match streams {
            Streams::User(client, backend) => Box::pin(self.relay(shared, client, backend)),
            Streams::Kernel(spliced) => {
                Box::pin(async move { Relayed::Ended(spliced.run(&shared, self).await) })
            }
        };
        async move {
            let result = match first.await {
                Relayed::Ended(result) => result,
                Relayed::ToKernel(spliced, relay) => {
                    Box::pin(spliced.run(&listed.shared, relay)).await
                }
            };
            listed.ended(result);
        }
    }

    /// Writes out what either side sent ahead, then relays in user space until a side
    /// ends, or the session goes to the process that replaces this one; hands the pair to
    /// the kernel when it can relay them.
    async fn relay(
        self,
        shared: Arc<Shared>,
        mut client: PacketConn,
        mut backend: PacketConn,
    ) -> Relayed {
        let (client, backend) = (&mut client, &mut backend);
        match deliver_and_splice(&shared, client, backend).await {
            Ok(Some(spliced)) => return Relayed::ToKernel(spliced, self),
            Ok(None) => {}
            Err(e) => return Relayed::Ended(Err(e)),
        }
        let mut sink = shared.upgrader.session_sink();
        let mut pump = Pump::default();
        let mut idle = idle::IdlePark::default();
        let ended = loop {
            let channel = sink
                .borrow_and_update()
                .clone()
                .filter(|c| !c.is_broken() && c.takes_relays());
            let stop = channel.is_some();
            let stopped = tokio::select! {
                r = poll_fn(|cx| idle.poll_pump(cx, &shared, &mut pump, client, backend, stop)) => r,
                _ = sink.changed(), if !stop => continue,
            };
            let (Ok(Stopped::Idle), Some(channel)) = (&stopped, channel) else {
                break stopped;
            };
            // Its sockets go as they are in the reactor.
            idle.unpark(client, backend);
            // (Boxed, as the wait below: rare, and an idle relay's future keeps neither.)
            if Box::pin(hand_over(&self, &channel, client, backend)).await {
                shared.metrics.sessions_handed_over.inc();
                return Relayed::Ended(Ok(None));
            }
            // Relaying goes on meanwhile; asked again a moment later.
            if let Some(stopped) = Box::pin(relay_a_moment(&mut pump, client, backend)).await {
                break stopped;
            }
        };
        let _ = backend.stream.shutdown().await;
        let _ = client.stream.shutdown().await;
        Relayed::Ended(ended.map(|_| Some((pump.up.bytes, pump.down.bytes))))
    }
}

/// Relays for [`RETRY`]: `Some` when a side ended (or failed) meanwhile.
async fn relay_a_moment(
    pump: &mut Pump,
    client: &mut PacketConn,
    backend: &mut PacketConn,
) -> Option<io::Result<Stopped>> {
    tokio::select! {
        r = poll_fn(|cx| pump.poll(cx, &mut client.stream, &mut backend.stream, false)) => Some(r),
        _ = tokio::time::sleep(RETRY) => None,
    }
}

/// A pass-through session in the registry and the gauge of sessions, as long as it lives.
struct Listed {
    shared: Arc<Shared>,
    info: Arc<SessionInfo>,
}

impl Listed {
    fn new(shared: Arc<Shared>, relay: &Relay) -> Listed {
        let info = Arc::new(SessionInfo::new(relay.id, relay.peer));
        info.set_user(relay.user.clone());
        info.set_backend(&relay.backend_name, relay.thread);
        info.set_blocker(Some(Blocker::PassThrough));
        shared.sessions.insert(info.clone());
        shared.metrics.sessions_active.inc();
        Listed { shared, info }
    }

    /// Counts what the session relayed, once it ended.
    fn ended(self, result: io::Result<Option<(u64, u64)>>) {
        let id = self.info.id;
        match result {
            Ok(Some((up, down))) => {
                self.shared.metrics.requests.bytes_from_client(up);
                self.shared.metrics.requests.bytes_to_client(down);
                tracing::debug!(session = id, up, down, "pass-through session ended");
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(session = id, error = %e, "pass-through session ended"),
        }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.info.busy.store(false, Ordering::SeqCst);
        self.shared.sessions.remove(self.info.id);
        self.shared.metrics.sessions_active.dec();
    }
}

/// Writes out what either side sent ahead (buffered during the login), then splices the
/// pair in the kernel where it can be (both plain TCP, the kernel relay loaded, and the end
/// of a spliced pair can be heard).
async fn deliver_and_splice(
    shared: &Shared,
    client: &mut PacketConn,
    backend: &mut PacketConn,
) -> io::Result<Option<kernel::Spliced>> {
    if !client.rbuf.is_empty() {
        backend.stream.write_all(&client.rbuf).await?;
        backend.stream.flush().await?;
    }
    if !backend.rbuf.is_empty() {
        client.stream.write_all(&backend.rbuf).await?;
        client.stream.flush().await?;
    }
    // Delivered; the relay reads the streams itself: the login's read buffers (4 KiB
    // each) go.
    for conn in [&mut *client, &mut *backend] {
        conn.rbuf.clear();
        conn.release_buffer();
    }
    Ok(
        match (shared.kernel_relays.own(), shared.socket_watcher.get()) {
            (Some(k), Some(_)) => kernel::splice(k, client, backend),
            _ => None,
        },
    )
}

/// Sends the relay's sockets and state to the new process: `false` (the sockets put back
/// in place) when they did not go.
async fn hand_over(
    relay: &Relay,
    channel: &SessionChannel,
    client: &mut PacketConn,
    backend: &mut PacketConn,
) -> bool {
    if !client.can_take_socket() || !backend.can_take_socket() {
        return false;
    }
    let Some(c) = client.take_socket() else {
        return false;
    };
    let Some(b) = backend.take_socket() else {
        put_back(client, c);
        return false;
    };
    let handed = HandedRelay {
        carried: CarriedRelay {
            relay: relay.clone(),
            client_tls: c.tls,
            backend_tls: b.tls,
            client_unread: c.unread.to_vec(),
            backend_unread: b.unread.to_vec(),
            client_compressed: c.compressed,
            backend_compressed: b.compressed,
            in_kernel: false,
        },
        client: c.socket,
        backend: b.socket,
        kernel_map: None,
    };
    let id = handed.carried.relay.id;
    match channel.send_relay(handed).await {
        Ok(()) => {
            tracing::debug!(session = id, "upgrade: pass-through session handed over");
            true
        }
        Err(returned) => {
            tracing::warn!(
                session = id,
                "upgrade: the pass-through session stays in this process"
            );
            let c = returned.carried;
            let client_side = TakenSocket {
                socket: returned.client,
                tls: c.client_tls,
                compressed: c.client_compressed,
                unread: c.client_unread[..].into(),
            };
            let backend_side = TakenSocket {
                socket: returned.backend,
                tls: c.backend_tls,
                compressed: c.backend_compressed,
                unread: c.backend_unread[..].into(),
            };
            put_back(client, client_side);
            put_back(backend, backend_side);
            false
        }
    }
}

fn put_back(conn: &mut PacketConn, taken: TakenSocket) {
    if let Err(e) = conn.put_back_socket(taken) {
        tracing::error!(error = %e, "a socket given back could not be used");
    }
}

/// The pass-through session handed over by the process this one replaces, set up to relay
/// on (inside the runtime it runs on): the relay, boxed (its task then holds it, not what
/// the old process sent), or `None` if it cannot go on.
pub(crate) fn resume(
    shared: Arc<Shared>,
    carried: CarriedRelay,
    client: std::net::TcpStream,
    backend: std::net::TcpStream,
    kernel_map: Option<std::os::fd::OwnedFd>,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    if let Some(map) = kernel_map {
        let (id, peer) = (carried.relay.id, carried.relay.peer);
        let spliced = shared
            .kernel_relays
            .adopt(map)
            .map_err(io::Error::other)
            .and_then(|k| kernel::resume(k, client, backend));
        return match spliced {
            Ok(s) => {
                shared.metrics.sessions_taken_over.inc();
                tracing::info!(session = id, client = %peer, "pass-through session handed over from the previous process, relayed in the kernel");
                Some(Box::pin(carried.relay.run(
                    shared,
                    Streams::Kernel(s),
                    None,
                )))
            }
            Err(e) => {
                tracing::error!(session = id, client = %peer, error = %e, "a pass-through session handed over could not go on; its connections close");
                None
            }
        };
    }
    let CarriedRelay {
        relay,
        client_tls,
        backend_tls,
        client_unread,
        backend_unread,
        client_compressed,
        backend_compressed,
        in_kernel: _,
    } = carried;
    let (id, peer) = (relay.id, relay.peer);
    let conns = stream_of(client, client_tls, client_compressed)
        .and_then(|c| Ok((c, stream_of(backend, backend_tls, backend_compressed)?)));
    let (client, backend) = match conns {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(session = id, client = %peer, error = %e, "a pass-through session handed over could not go on; its connections close");
            return None;
        }
    };
    let mut client = PacketConn::new(client);
    client.rbuf.extend_from_slice(&client_unread);
    let mut backend = PacketConn::new(backend);
    backend.rbuf.extend_from_slice(&backend_unread);
    shared.metrics.sessions_taken_over.inc();
    tracing::info!(session = id, client = %peer, "pass-through session handed over from the previous process");
    Some(Box::pin(relay.run(
        shared,
        Streams::User(client, backend),
        None,
    )))
}

/// Why the pump stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// A side ended (or its connection closed).
    Ended,
    /// Asked to stop, and nothing is in flight either way.
    Idle,
}

/// Both directions of a relay, with their buffers kept here: polling it can be
/// abandoned at any point without losing a byte (a read that did not complete read
/// nothing; what was read is written on the next poll).
#[derive(Default)]
struct Pump {
    up: Half,
    down: Half,
}

impl Pump {
    /// The bytes relayed so far, both ways.
    fn relayed(&self) -> u64 {
        self.up.bytes + self.down.bytes
    }

    /// Whether neither direction holds bytes its peer has not taken (or not flushed).
    fn holds_nothing(&self) -> bool {
        [&self.up, &self.down]
            .iter()
            .all(|half| half.buf.is_none() && !half.flush)
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        client: &mut BoxedIo,
        backend: &mut BoxedIo,
        stop: bool,
    ) -> Poll<io::Result<Stopped>> {
        let up = self.up.poll(cx, client, backend, stop)?;
        let down = self.down.poll(cx, backend, client, stop)?;
        match (up, down) {
            (Poll::Ready(Stopped::Ended), _) | (_, Poll::Ready(Stopped::Ended)) => {
                Poll::Ready(Ok(Stopped::Ended))
            }
            (Poll::Ready(Stopped::Idle), Poll::Ready(Stopped::Idle)) => {
                Poll::Ready(Ok(Stopped::Idle))
            }
            _ => Poll::Pending,
        }
    }
}

/// Bytes a direction reads onto its stack when it holds no buffer: a request or a short
/// answer whole.
const STACK_READ: usize = 2048;
/// The buffer of a direction that streams (a read filled [`STACK_READ`]) or holds bytes
/// its peer has not taken yet (as `copy_bidirectional`'s).
const STREAM_BUF: usize = 8 * 1024;

/// One direction: read, write it all out, flush, read again. A direction that waits holds
/// no buffer (an idle session would keep two of 8 KiB): it reads onto the stack and writes
/// from there; a buffer is taken only for what the peer does not take at once, or while
/// the direction streams, and let go when it waits again.
#[derive(Default)]
struct Half {
    /// Bytes read and not yet written are `buf[pos..len]`.
    buf: Option<Box<[u8]>>,
    pos: usize,
    len: usize,
    flush: bool,
    bytes: u64,
}

impl Half {
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut BoxedIo,
        to: &mut BoxedIo,
        stop: bool,
    ) -> Poll<io::Result<Stopped>> {
        loop {
            if let Some(buf) = &self.buf {
                while self.pos < self.len {
                    let n = ready!(Pin::new(&mut *to).poll_write(cx, &buf[self.pos..self.len]))?;
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    self.pos += n;
                    self.bytes += n as u64;
                }
            }
            if self.flush {
                ready!(Pin::new(&mut *to).poll_flush(cx))?;
                self.flush = false;
            }
            if stop {
                return Poll::Ready(Ok(Stopped::Idle));
            }
            let n = match self.buf.as_mut() {
                Some(buf) => {
                    let mut read = ReadBuf::new(buf);
                    if Pin::new(&mut *from).poll_read(cx, &mut read)?.is_pending() {
                        // Waits, nothing held: the buffer goes.
                        self.buf = None;
                        return Poll::Pending;
                    }
                    read.filled().len()
                }
                None => match ready!(self.relay_from_stack(cx, from, to))? {
                    Some(stopped) => return Poll::Ready(Ok(stopped)),
                    None => continue,
                },
            };
            if n == 0 {
                return Poll::Ready(Ok(Stopped::Ended));
            }
            self.pos = 0;
            self.len = n;
            self.flush = true;
        }
    }

    /// Reads onto the stack and writes what was read straight on (`None`: all of it, the
    /// caller goes on); what the peer does not take goes into a buffer, and waits for it
    /// (so does what follows a full read: the direction streams).
    fn relay_from_stack(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut BoxedIo,
        to: &mut BoxedIo,
    ) -> Poll<io::Result<Option<Stopped>>> {
        let mut stack = [0u8; STACK_READ];
        let mut read = ReadBuf::new(&mut stack);
        ready!(Pin::new(&mut *from).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        if n == 0 {
            return Poll::Ready(Ok(Some(Stopped::Ended)));
        }
        let mut pos = 0;
        let mut blocked = false;
        while pos < n {
            match Pin::new(&mut *to).poll_write(cx, &stack[pos..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(w)) => {
                    pos += w;
                    self.bytes += w as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    blocked = true;
                    break;
                }
            }
        }
        self.flush = true;
        if blocked || n == STACK_READ {
            let mut buf = vec![0u8; STREAM_BUF].into_boxed_slice();
            buf[..n - pos].copy_from_slice(&stack[pos..n]);
            (self.pos, self.len) = (0, n - pos);
            self.buf = Some(buf);
        }
        if blocked {
            // The write that waits wakes the task.
            return Poll::Pending;
        }
        Poll::Ready(Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A pump between two duplex pipes of `capacity` bytes: (pump, client end, backend end,
    /// the far ends a test writes and reads).
    fn pipes(
        capacity: usize,
    ) -> (
        BoxedIo,
        BoxedIo,
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
    ) {
        let (client, client_far) = tokio::io::duplex(capacity);
        let (backend, backend_far) = tokio::io::duplex(capacity);
        (Box::new(client), Box::new(backend), client_far, backend_far)
    }

    #[tokio::test]
    async fn a_request_and_a_long_answer_arrive_whole_and_in_order() {
        let (mut client, mut backend, mut client_far, mut backend_far) = pipes(1024);
        let mut pump = Pump::default();
        let relay = async { poll_fn(|cx| pump.poll(cx, &mut client, &mut backend, false)).await };
        let script = async {
            // A request and its answer, each smaller than the stack read.
            client_far.write_all(b"SELECT 1").await.unwrap();
            let mut got = [0u8; 8];
            backend_far.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"SELECT 1");
            // An answer far larger than the pipe: written in parts, in order.
            let answer: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
            let writer = async {
                backend_far.write_all(&answer).await.unwrap();
                backend_far.shutdown().await.unwrap();
            };
            let reader = async {
                let mut got = vec![0u8; answer.len()];
                client_far.read_exact(&mut got).await.unwrap();
                got
            };
            let ((), got) = tokio::join!(writer, reader);
            assert!(got == answer, "the stream arrived whole and in order");
        };
        let (stopped, ()) = tokio::join!(relay, script);
        assert_eq!(stopped.unwrap(), Stopped::Ended);
        assert_eq!(pump.up.bytes, 8);
        assert_eq!(pump.down.bytes, 200_000);
    }

    #[tokio::test]
    async fn between_messages_neither_direction_keeps_a_buffer() {
        let (mut client, mut backend, mut client_far, mut backend_far) = pipes(64 * 1024);
        let mut pump = Pump::default();
        // Both directions relay a message larger than the stack read (they stream), then
        // wait: polled once more with nothing to read, they let their buffers go.
        let big = vec![7u8; 3 * STACK_READ];
        client_far.write_all(&big).await.unwrap();
        backend_far.write_all(&big).await.unwrap();
        let mut got = vec![0u8; big.len()];
        let relayed = async {
            tokio::join!(backend_far.read_exact(&mut got), async {
                let mut back = vec![0u8; big.len()];
                client_far.read_exact(&mut back).await.map(|_| back)
            })
        };
        tokio::select! {
            r = poll_fn(|cx| pump.poll(cx, &mut client, &mut backend, false)) => panic!("the pump stopped: {r:?}"),
            (sent, back) = relayed => {
                sent.unwrap();
                assert_eq!(back.unwrap(), big);
            }
        }
        assert_eq!(got, big);
        let waiting =
            poll_fn(|cx| Poll::Ready(pump.poll(cx, &mut client, &mut backend, false).is_pending()))
                .await;
        assert!(waiting, "nothing to relay");
        assert!(
            pump.up.buf.is_none() && pump.down.buf.is_none(),
            "a waiting pump holds no buffer"
        );
        // Asked to stop with nothing in flight: it stops at once.
        let stopped = poll_fn(|cx| pump.poll(cx, &mut client, &mut backend, true)).await;
        assert_eq!(stopped.unwrap(), Stopped::Idle);
    }
}
/// Every idle pass-through session holds its relay's futures: the session's (boxed in the
/// session's task), and the one of the way it relays, boxed in it. Sizes as the test
/// profile builds them.
#[cfg(test)]
mod future_sizes {
    use super::*;

    fn free_size<Fut>(_: impl FnOnce() -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    fn relay_size<Fut>(_: impl FnOnce(Relay) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    fn spliced_size<Fut>(_: impl FnOnce(kernel::Spliced) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    #[test]
    #[allow(unreachable_code, clippy::diverging_sub_expression)]
    fn a_relays_future_stays_small() {
        // 2,856 with the relay in user space and the one in the kernel inline (both
        // kept by every relay), and what the login left beside them.
        let session = free_size(|| {
            run(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        assert!(
            session <= 256,
            "a pass-through session's future is {session} bytes"
        );
        let in_user_space =
            relay_size(|relay| relay.relay(unreachable!(), unreachable!(), unreachable!()));
        assert!(
            in_user_space <= 896,
            "a relay in user space's future is {in_user_space} bytes"
        );
        let in_kernel = spliced_size(|spliced| spliced.run(unreachable!(), unreachable!()));
        assert!(
            in_kernel <= 1024,
            "a kernel relay's future is {in_kernel} bytes"
        );
    }
}
