//! One client session: a task that owns the client socket and its backend connection.
//!
//! A session's life, phase by phase (each phase one module):
//! 1. **accept** ([`crate::Proxy`]'s accept loop): connection limit, then [`run`];
//! 2. **handshake and authenticate** ([`auth`]): greeting, the client's login checked
//!    against the server's verifiers or relayed, the backend login behind it;
//! 3. then, for each request, read while idle events are watched ([`idle`]):
//!    * **route** ([`route`]): the backend gate (a paused serverless instance), topology
//!      changes and planned parking decide whether the session must move first;
//!    * **forward** ([`forward`]): the request as a value ([`request`]: classified once,
//!      its plan decided once), routed, sent and its response relayed ([`relay`]), the
//!      packets that carry state updating the session record, then observed;
//!    * **move** ([`migrate`]): to another node with the session's state, when routing says
//!      so or the backend was lost (the request is then re-run or answered with an error).
//!
//! Pass-through listeners stop after phase 2 and relay bytes ([`passthrough`]).

use crate::admission::Refusal;
use crate::backend::BackendConn;
use crate::config::{ListenerMode, Routing};
use crate::conn::{BoxedIo, ConnError, PacketConn};
use crate::error::{ClientError, ErrorKind};
use crate::registry::SessionInfo;
use crate::restore::Captured;
use crate::state::{Blocker, SessionRecord};
use crate::Shared;
use bytes::BytesMut;
use holdfast_cluster::topology::{NodeName, Topology};
use holdfast_config::net::IpNet;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::*;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

pub mod auth;
mod forward;
mod found_rows;
pub mod handover;
mod idle;
mod kill;
mod lazy_map;
mod markers;
mod migrate;
mod owed_schema;
pub(crate) mod passthrough;
mod relay;
mod replay;
mod reply;
mod request;
mod route;
mod running;
mod split;
mod statements;
mod stuck;
mod trackers;

pub use auth::{server_version, Identity, LoggedIn, LoginError};
use statements::Statements;

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum End {
    #[error("client quit")]
    Quit,
    /// The backend connection failed; `started`: part of the response already reached the
    /// client, so the command cannot be hidden or retried.
    #[error("backend connection lost: {error}")]
    BackendLost { started: bool, error: ConnError },
    /// The backend connection failed during a LOCAL INFILE exchange. The client's file has
    /// been read to its empty packet (none of it run) and the client waits for the answer
    /// at `reply_seq`.
    #[error("backend connection lost during a LOCAL INFILE transfer: {error}")]
    BackendLostDuringFile { error: ConnError, reply_seq: u8 },
    /// A replica asked for a client file during a read; the client has its ERR, the
    /// replica connection is to be dropped.
    #[error("a replica asked for a client file (LOCAL INFILE) during a read")]
    FileRequestRefused,
    /// holdfast closed the session on purpose (counted under the reason's label).
    #[error("{message}")]
    Closed {
        reason: CloseReason,
        message: String,
    },
    #[error("client connection: {0}")]
    Client(ConnError),
    #[error("backend connection: {0}")]
    Backend(ConnError),
    #[error("{0}")]
    Protocol(String),
    /// The session went to the process that replaces this one (see `handover.rs`).
    #[error("handed over to the new process")]
    HandedOver,
}

/// Why holdfast closed a session on purpose (`holdfast_sessions_closed_by_holdfast_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseReason {
    /// The session had to move but its login was relayed: holdfast cannot log in again.
    CannotReauthenticate,
    /// The backend died holding state that cannot be recreated elsewhere.
    StateLost(Blocker),
    /// Its node stopped being the primary and it kept this past the cool-down.
    Cooldown(Blocker),
    /// No writable node within the hold window.
    HoldWindowExpired,
    /// The client sent nothing for `client_idle_timeout_secs`.
    IdleTimeout,
    /// The new node refused the session's login.
    LoginRefused,
    /// The new node refused part of the session's state.
    StateRejected,
    /// A prepared statement could not be prepared on the new node.
    ReprepareRefused,
    /// A client's `KILL` through holdfast ended the backend connection: the client's
    /// ends too, as the server ends a direct one.
    Killed,
}

impl CloseReason {
    fn label(self) -> &'static str {
        match self {
            CloseReason::CannotReauthenticate => "cannot_reauthenticate",
            CloseReason::StateLost(b) => b.lost_label(),
            CloseReason::Cooldown(b) => b.cooldown_label(),
            CloseReason::HoldWindowExpired => "hold_window_expired",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::LoginRefused => "login_refused",
            CloseReason::StateRejected => "state_rejected",
            CloseReason::ReprepareRefused => "reprepare_refused",
            CloseReason::Killed => "killed",
        }
    }
}

struct Session {
    shared: Arc<Shared>,
    info: Arc<SessionInfo>,
    client: PacketConn,
    backend: BackendConn,
    capabilities: u32,
    secret: Option<PasswordHash>,
    scramble: [u8; 20],
    record: SessionRecord,
    statements: Statements,
    /// SQL-level prepared statements that are a `KILL` (see `kill.rs`).
    sql_kills: kill::SqlKills,
    /// Reused for the packets holdfast rewrites on their way to the client.
    scratch: Vec<u8>,
    /// The idle probe, the client watch or the idle deadline (see [`idle::Timer`]).
    idle_timer: idle::Timer,
    /// Counts the session against its client address's limits (see `admission.rs`);
    /// `None` for a session handed over by an upgrade (its task holds it).
    ticket: Option<crate::admission::Ticket>,
    /// While the session idles: when the client's silence ends it (a field, not the idle
    /// phase's argument: what an idle session's task holds).
    idle_deadline: idle::IdleDeadline,
    /// The request running now, shown in `/status` once it runs for a while.
    running: running::Running,
    /// Boxed, as other rarely read parts: every idle session holds a `Session`.
    identity: Box<Identity>,
    can_reauthenticate: bool,
    backend_name: NodeName,
    /// The backend connection is gone; the session moves before its next command.
    backend_dead: bool,
    /// The gate's epoch the backend connection was opened in (see `BackendGate::epoch`).
    backend_epoch: u64,
    /// When the backend connection was opened: a server up for longer than this did not
    /// restart under it (see `Session::cut_while_server_ran`).
    backend_since: Instant,
    /// The backend died inside a transaction: the next statement gets 1213 (rolled back),
    /// unless the transaction is replayed.
    transaction_lost: bool,
    /// The backend connection lost while the session idled, as told then.
    lost_while_idle: Option<Box<migrate::LostConn>>,
    /// The command being exchanged with the backend and its answer (see `relay.rs`).
    exchange: relay::Exchange,
    /// The open transaction's statements, for a replay (see `replay.rs`).
    txn_log: Option<Box<replay::TxnLog>>,
    /// Commit markers (see `markers.rs`).
    markers: markers::Markers,
    /// The last capture of what the trackers do not report (user variables...).
    captured: Captured,
    /// Since when a capture is due (see `Session::capture_if_due`).
    capture_due_since: Option<Instant>,
    /// The last capture attempt failed (e.g. no `information_schema.USER_VARIABLES`).
    capture_failing: bool,
    /// Code holdfast does not see into changed the session while a capture was due: what
    /// the next capture finds of user variables cannot explain it.
    opaque_unattributable: bool,
    /// `session_track_transaction_info` is on in the backend session ([`restore::TRACK_TRANSACTIONS`](crate::restore::TRACK_TRANSACTIONS)).
    tracks_transactions: bool,
    topology: watch::Receiver<Arc<Topology>>,
    switching: watch::Receiver<bool>,
    /// The session's node stopped being the primary at this time; it moves at its next
    /// safe point or is closed after the cool-down.
    move_pending_since: Option<Instant>,
    /// Read/write splitting: the session's replica connections (split listeners only).
    split: Option<Box<split::Split>>,
    /// Set when the process that replaces this one takes sessions (see `handover.rs`);
    /// `hand_over_channel` is its last value seen (read without the watch's lock).
    hand_over_channel: Option<Arc<crate::upgrade::SessionChannel>>,
    hand_over_to: watch::Receiver<Option<Arc<crate::upgrade::SessionChannel>>>,
}

/// Answers a connection over the limit with ERR 1040 and closes it.
pub async fn refuse_too_many(shared: Arc<Shared>, stream: BoxedIo, peer: SocketAddr) {
    let limit = shared.config().proxy.max_connections;
    refuse_at_accept(
        &shared,
        stream,
        peer,
        ClientError::too_many_connections(),
        ("max_connections", limit),
    )
    .await;
}

/// Answers a connection turned away before its greeting with `error` and closes it; the
/// warning is rate-limited, since refusals come in floods.
async fn refuse_at_accept(
    shared: &Shared,
    stream: BoxedIo,
    peer: SocketAddr,
    error: ClientError,
    (setting, limit): (&'static str, usize),
) {
    shared.metrics.reject(error.kind.label());
    shared.metrics.count_error(error.kind.code());
    if let Some(suppressed) = shared.admission.refusal_log().permit() {
        tracing::warn!(client = %peer, setting, limit, suppressed, "connection refused: {}", error.message);
    }
    let mut conn = PacketConn::new(stream);
    let _ = conn.write_packet(&error.payload(), 0).await;
}

/// A client's whole session, from its greeting to its close, on `stream` (the accept loop
/// passes accepted sockets; a test or an embedder may pass any stream, e.g. one end of
/// `tokio::io::duplex`). No connection limit applies here: that is the accept loop's.
pub async fn run(shared: Arc<Shared>, stream: BoxedIo, peer: SocketAddr, mode: ListenerMode) {
    let arrival = Arrival {
        shared,
        stream,
        peer,
        mode,
        routing: Routing::Primary,
        trusted_proxies: Arc::new([]),
    };
    run_routed(arrival, ()).await
}

/// An accepted connection and how its listener treats it: its routing (`split` sends
/// reads to the replicas) and the load balancers it takes PROXY protocol headers from.
pub struct Arrival {
    pub shared: Arc<Shared>,
    pub stream: BoxedIo,
    pub peer: SocketAddr,
    pub mode: ListenerMode,
    pub routing: Routing,
    pub trusted_proxies: Arc<[IpNet]>,
}

/// [`run`] with the listener's settings; `held` (the accept loop's connection slot and
/// session thread's count) is dropped when the session ends. The future is what a
/// session's task holds (issue 22: memory per idle session), so it keeps little: the way
/// to a started session runs boxed and takes the arrival with it.
pub fn run_routed(
    arrival: Arrival,
    held: impl Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut way: OpenedFuture = Box::pin(open(arrival));
    async move {
        // A pass-through session's relay takes the place of the way there (which is
        // dropped: the relay does not keep it) and ends with `None`.
        let mut session = loop {
            match way.as_mut().await {
                Some(Opened::Session(session)) => break session,
                Some(Opened::Relay(relay)) => way = relay,
                None => return drop(held),
            }
        };
        // (The way there, done, goes: it is not kept beside the session.)
        drop(way);
        // The loop awaited here, not through a method that owns the session: one future
        // fewer around it.
        let end = session.serve().await;
        session.finish(end);
        drop(held);
    }
}

/// What an accepted connection became once its client logged in.
enum Opened {
    Session(Box<Session>),
    /// A pass-through session, registered: its relay's future, which holds the admission
    /// ticket until the relay ends, and then answers `None`.
    Relay(OpenedFuture),
}

/// The way from an accepted connection to a session, or a pass-through session's relay
/// (boxed: either would otherwise be part of every session's future).
type OpenedFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<Opened>> + Send + 'static>>;

/// From an accepted connection to a started session or a pass-through relay. `None`: the
/// connection was turned away or its login failed.
async fn open(arrival: Arrival) -> Option<Opened> {
    let Arrival {
        shared,
        stream,
        peer,
        mode,
        routing,
        trusted_proxies,
    } = arrival;
    // From a trusted load balancer the connection starts with the client's address, and
    // from then on that address is the client's.
    let (stream, peer, early) = if trusted_proxies.iter().any(|n| n.contains(peer.ip())) {
        read_proxy_header(&shared, stream, peer).await?
    } else {
        (stream, peer, BytesMut::new())
    };
    // Counted against the client address's limits until the session ends.
    let mut ticket = match shared.admission.admit(peer.ip()) {
        Ok(t) => t,
        Err(refusal) => {
            let (why, limit) = match refusal {
                Refusal::TooManyFromAddress => (
                    "max_connections_per_ip",
                    shared.config().proxy.max_connections_per_ip,
                ),
                Refusal::TooManyLoginsFromAddress => (
                    "max_pending_logins_per_ip",
                    shared.config().proxy.max_pending_logins_per_ip,
                ),
            };
            let error = ClientError::new(
                ErrorKind::TooManyConnections,
                format!("Too many connections from {}", peer.ip()),
            );
            refuse_at_accept(&shared, stream, peer, error, (why, limit)).await;
            return None;
        }
    };
    let id = shared.next_session_id();
    let mut client = PacketConn::new(stream);
    // What the load balancer sent after its header (a client that did not wait for the
    // greeting).
    client.rbuf.extend_from_slice(&early);
    // Until the session is registered, a `KILL` of its id (which the client may know as
    // soon as it has its OK) waits for it.
    let shared_for_guard = shared.clone();
    let logging_in = shared_for_guard.sessions.begin_login(id);
    // Boxed: the login's future is large.
    let mut logged_in = Box::pin(authenticate(&shared, &mut client, peer, id, mode)).await?;
    ticket.logged_in();
    shared.metrics.logins.inc();
    // The handshakes are done: rustls' connections go before the session allocates what
    // it keeps (an idle TLS session's memory, see `PacketConn::leave_rustls`). The
    // backend's left already after a native login (`backend::connect`), not a relayed one.
    let left = client
        .leave_rustls()
        .and_then(|()| logged_in.backend.conn.leave_rustls());
    if let Err(e) = left {
        tracing::warn!(session = id, client = %peer, error = %e, "closed: a TLS connection could not go on after the login");
        return None;
    }
    if logged_in.capabilities & holdfast_wire::caps::CLIENT_COMPRESS != 0 {
        // Everything after the login's OK is compressed (the backend connection was set
        // up the same way, so the server's Compression status reads as the client's).
        holdfast_client::compress::start(&mut client, holdfast_client::compress::Role::Server);
    }
    if mode == ListenerMode::Passthrough {
        let relay = passthrough::run(shared, client, logged_in, peer, id, logging_in);
        return Some(Opened::Relay(Box::pin(async move {
            relay.await;
            drop(ticket);
            None
        })));
    }
    let started = Box::pin(Session::start(shared, client, logged_in, peer, id, routing)).await;
    drop(logging_in);
    let mut session = started?;
    // Held by the session (released when it ends), not beside it in its task.
    session.ticket = Some(ticket);
    Some(Opened::Session(session))
}

/// A session the process this one replaces handed over: it goes on with the client's next
/// request.
pub(crate) fn run_resumed(
    shared: Arc<Shared>,
    carried: handover::CarriedSession,
    client: std::net::TcpStream,
    backend: Option<std::net::TcpStream>,
    readers: Vec<std::net::TcpStream>,
    held: impl Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Resumed here, not in the future: its task then holds the session, not what the
    // old process sent (an idle session's task is most of what it costs, as for
    // `run_routed`). Called inside the runtime the session runs on (its sockets are
    // registered with it).
    let (id, peer) = (carried.id, carried.peer);
    let resumed = Session::resume(shared, carried, client, backend, readers).map_err(|e| {
        tracing::error!(session = id, client = %peer, error = %e, "a session handed over could not go on; its connections close");
    });
    async move {
        let Ok(mut session) = resumed else {
            return drop(held);
        };
        let end = session.serve_resumed().await;
        session.finish(end);
        drop(held);
    }
}

/// Reads the PROXY protocol header a trusted load balancer sends first, within the
/// handshake timeout. Returns the stream, the client's address (the connection's own for a
/// `LOCAL` header, e.g. a health check) and the bytes read past the header. A missing or
/// malformed header is answered with ERR 1043 in place of the greeting, and the connection
/// closed (`None`).
async fn read_proxy_header(
    shared: &Shared,
    mut stream: BoxedIo,
    peer: SocketAddr,
) -> Option<(BoxedIo, SocketAddr, BytesMut)> {
    use holdfast_wire::proxy_protocol::{parse_header, Carried, V2_MAX_LEN};
    use tokio::io::AsyncReadExt;
    let timeout = shared.config().proxy.handshake_timeout();
    let mut buf = BytesMut::with_capacity(256);
    let read = tokio::time::timeout(timeout, async {
        loop {
            match parse_header(&buf) {
                Ok(Some(header)) => return Ok(header),
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            // `parse_header` decides within V2_MAX_LEN bytes; this bounds the buffer.
            let room = (V2_MAX_LEN + 1).saturating_sub(buf.len()).min(4096);
            let mut chunk = (&mut stream).take(room as u64);
            match chunk.read_buf(&mut buf).await {
                Ok(0) => {
                    return Err("the connection closed before its PROXY protocol header".into())
                }
                Ok(_) => {}
                Err(e) => return Err(format!("reading its PROXY protocol header: {e}")),
            }
        }
    })
    .await;
    let why = match read {
        Ok(Ok((carried, len))) => {
            let early = buf.split_off(len);
            let client = match carried {
                Carried::Client(addr) => match addr.ip() {
                    std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                        Some(v4) => SocketAddr::new(v4.into(), addr.port()),
                        None => addr,
                    },
                    _ => addr,
                },
                Carried::Local => peer,
            };
            tracing::debug!(client = %client, proxy = %peer, "client relayed by a trusted proxy");
            return Some((stream, client, early));
        }
        Ok(Err(why)) => why,
        Err(_) => format!(
            "no PROXY protocol header within the handshake timeout ({} ms)",
            shared.config().proxy.handshake_timeout_ms
        ),
    };
    let error = ClientError::new(
        ErrorKind::BadHandshake,
        format!("Bad handshake: a connection from a trusted proxy must start with a PROXY protocol header ({why})"),
    );
    shared.metrics.reject(error.kind.label());
    shared.metrics.count_error(error.kind.code());
    if let Some(suppressed) = shared.admission.refusal_log().permit() {
        tracing::warn!(proxy = %peer, suppressed, "connection from a trusted proxy refused: {why}");
    }
    let mut conn = PacketConn::new(stream);
    let _ = conn.write_packet(&error.payload(), 0).await;
    None
}

/// The handshake and authentication phase, within the handshake timeout (plus the time a
/// paused instance may take to resume). Failures are counted and logged here.
async fn authenticate(
    shared: &Shared,
    client: &mut PacketConn,
    peer: SocketAddr,
    id: u32,
    mode: ListenerMode,
) -> Option<LoggedIn> {
    let deadline = shared.config().proxy.handshake_timeout() + shared.gate.login_grace();
    let result = tokio::time::timeout(deadline, auth::login(shared, client, peer, id, mode)).await;
    let error = match result {
        Ok(Ok(l)) => return Some(l),
        Ok(Err(e)) => e,
        Err(_) => LoginError::HandshakeTimeout(deadline.as_millis() as u64),
    };
    shared.metrics.reject(error.label());
    tracing::info!(session = id, client = %peer, error = %error, "login ended");
    None
}

impl Session {
    /// Sets up a logged-in session: trackers on, registered for the admin API.
    async fn start(
        shared: Arc<Shared>,
        client: PacketConn,
        logged_in: LoggedIn,
        peer: SocketAddr,
        id: u32,
        routing: Routing,
    ) -> Option<Box<Session>> {
        let LoggedIn {
            mut backend,
            backend_name,
            user,
            capabilities,
            secret,
            can_reauthenticate,
            scramble,
            identity,
            epoch,
        } = logged_in;
        let mut record = SessionRecord {
            schema: identity
                .database
                .as_deref()
                .filter(|d| !d.is_empty())
                .map(String::from),
            ..SessionRecord::default()
        };
        // Registered before anything else is awaited: the client has its OK, and another
        // connection's `KILL` of its id must find it at once.
        let info = Arc::new(SessionInfo::new(id, peer));
        info.set_user(shared.user_names.get(&user));
        info.set_backend(&backend_name, backend.greeting.connection_id);
        info.can_reauthenticate
            .store(can_reauthenticate, Ordering::Relaxed);
        info.set_blocker(record.blocker());
        shared.sessions.insert(info.clone());
        shared.metrics.sessions_active.inc();
        // The session's status flags from the start (autocommit above all: a split session's
        // first statement is routed by it), not only from its first answer.
        match backend.enable_trackers_status().await {
            Ok(Some(status)) => record.status = status,
            Ok(None) => {
                record.untracked = true;
                record.status = backend.greeting.status;
            }
            Err(e) => {
                // Another connection's `KILL` of the new id may land here, before the
                // session runs: it ends as any killed session does, counted as killed.
                if info.killed_on_purpose(backend.greeting.connection_id) {
                    shared.metrics.session_closed(CloseReason::Killed.label());
                    tracing::info!(session = id, client = %peer, "closed: a client's KILL ended its backend connection right after login");
                } else {
                    tracing::warn!(session = id, error = %e, "backend lost right after login");
                }
                shared.sessions.remove(id);
                shared.metrics.sessions_active.dec();
                return None;
            }
        }
        info.set_blocker(record.blocker());
        if !can_reauthenticate {
            shared.metrics.sessions_passthrough_auth.inc();
        }
        tracing::debug!(session = id, client = %peer, user = %user, "session started");
        let mut topology = shared.topology.clone();
        // Changes before this point are already reflected in where the session logged in.
        topology.borrow_and_update();
        // An idle session is woken through its info (see `idle_wake.rs`).
        shared.feed_idle_wake();
        // Boxed: the task then holds a pointer, not a second copy beside the one moved
        // out of this future's answer.
        Some(Box::new(Session {
            info,
            client,
            backend,
            capabilities,
            secret,
            scramble,
            record,
            statements: Statements::default(),
            sql_kills: kill::SqlKills::default(),
            scratch: Vec::new(),
            idle_timer: Default::default(),
            idle_deadline: None,
            ticket: None,
            running: Default::default(),
            identity: Box::new(identity),
            can_reauthenticate,
            backend_name,
            backend_dead: false,
            backend_epoch: epoch,
            backend_since: Instant::now(),
            transaction_lost: false,
            lost_while_idle: None,
            exchange: relay::Exchange::default(),
            txn_log: None,
            markers: Default::default(),
            captured: Captured::default(),
            capture_due_since: None,
            capture_failing: false,
            opaque_unattributable: false,
            tracks_transactions: false,
            topology,
            switching: shared.switching.subscribe(),
            move_pending_since: None,
            split: (routing == Routing::Split).then(|| split::Split::new(shared.topology.clone())),
            hand_over_channel: None,
            hand_over_to: shared.upgrader.session_sink(),
            shared,
        }))
    }

    /// [`Session::serve`] for a session handed over by an upgrade: one whose TLS backend
    /// connection stayed with the old process logs in again and is restored first.
    async fn serve_resumed(&mut self) -> End {
        if self.backend_dead {
            if let Err(end) = Box::pin(self.relocate("upgrade")).await {
                return end;
            }
        }
        self.serve().await
    }

    /// Requests until the session ends (then [`Session::finish`]): each is read (idle
    /// events handled meanwhile), routed, forwarded with its response observed, and
    /// followed by a move when one is due. A busy session runs [`Session::serve_busy`]
    /// (boxed: its future is large); once the client is silent for a while the session
    /// idles in [`Session::idle`], whose future is small, and the busy one is freed.
    async fn serve(&mut self) -> End {
        loop {
            self.idle_deadline = match Box::pin(self.serve_busy()).await {
                Ok(deadline) => deadline,
                Err(end) => return end,
            };
            if let Err(end) = self.idle().await {
                return end;
            }
        }
    }

    /// Requests as they come, until the client is silent for [`idle::IDLE_PROBE`].
    async fn serve_busy(&mut self) -> Result<idle::IdleDeadline, End> {
        loop {
            let request = match self.next_request().await? {
                idle::Next::Request(r) => r,
                idle::Next::Quiet(idle_deadline) => return Ok(idle_deadline),
            };
            let started = Instant::now();
            self.running.begin(&request, started);
            // SeqCst: a Dekker pair with the gate and `switching_now` loads in the route
            // phase, against a pause or switchover that closes first and then checks `busy`.
            self.info.busy.store(true, Ordering::SeqCst);
            if self.route(&request).await? == route::Routed::Forward {
                self.forward_request(request).await?;
            }
            self.shared.metrics.requests.latency(started.elapsed());
            self.info.commands.fetch_add(1, Ordering::Relaxed);
            self.info
                .status
                .store(self.record.status, Ordering::Release);
            self.after_command().await?;
            self.info.set_blocker(self.record.blocker());
            self.running.end(&self.info);
            self.info.busy.store(false, Ordering::Release);
        }
    }

    /// Logs how the session ended and deregisters it.
    fn finish(mut self: Box<Self>, end: End) {
        let (id, peer) = (self.info.id, self.info.client);
        if self.info.busy.load(Ordering::Acquire) && !matches!(end, End::Quit) {
            // Ended in the middle of a request (its client vanished...): the server must
            // see the connection close, which stops the statement as it would stop a
            // vanished direct client's. A COM_QUIT behind it would read as a live client
            // to a statement that waits (GET_LOCK), so none is sent.
            self.backend.quit_on_drop = false;
        }
        match &end {
            End::Quit | End::Client(ConnError::Closed) => {
                tracing::debug!(session = id, "session ended")
            }
            End::HandedOver => tracing::debug!(session = id, "session handed over"),
            End::Closed {
                reason: reason @ (CloseReason::IdleTimeout | CloseReason::Killed),
                message,
            } => {
                self.shared.metrics.session_closed(reason.label());
                tracing::info!(session = id, client = %peer, "{message}")
            }
            End::Closed { reason, message } => {
                self.shared.metrics.session_closed(reason.label());
                tracing::warn!(session = id, client = %peer, reason = reason.label(), "{message}")
            }
            e => tracing::info!(session = id, client = %peer, reason = %e, "session closed"),
        }
        self.shared.sessions.remove(id);
        // (Its info may outlive it: the waker would keep the task's memory.)
        drop(self.info.idle_waker.take());
        self.shared.metrics.sessions_active.dec();
        if !self.can_reauthenticate {
            self.shared.metrics.sessions_passthrough_auth.dec();
        }
    }

    fn deprecate_eof(&self) -> bool {
        self.capabilities & CLIENT_DEPRECATE_EOF != 0
    }

    async fn send_error(&mut self, seq: u8, error: &ClientError) -> Result<(), End> {
        self.shared.metrics.count_error(error.kind.code());
        self.client
            .write_packet(&error.payload(), seq)
            .await
            .map_err(End::Client)
    }

    async fn send_error_kind(
        &mut self,
        seq: u8,
        kind: ErrorKind,
        message: String,
    ) -> Result<(), End> {
        self.send_error(seq, &ClientError::new(kind, message)).await
    }
}

/// Every idle session's task holds the idle phase's future, and its `Session` is boxed
/// beside it: what a busy session runs (the request loop), the login and rare, large
/// phases (a move, an operator's kill, a hand-over) run boxed, so that an idle session
/// keeps none of them (issue 22: memory per idle session). Sizes as the test profile
/// builds them (release's measured the same); a phase inlined by mistake adds kilobytes
/// (the two kill paths did, and the pass-through relay: 9.1 KiB a session).
#[cfg(test)]
mod future_sizes {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<Fut>(_: impl FnOnce(&'static mut Session) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// The size of the future `f` returns, without calling it.
    fn free_size<Fut>(_: impl FnOnce() -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    #[test]
    fn an_idle_session_holds_little() {
        let idle = future_size(|s| s.idle());
        let serve = future_size(|s| s.serve());
        let session = std::mem::size_of::<Session>();
        // 184 with a select of the four sources' futures and the idle deadline as its
        // argument (now one poll of them, `poll_woken`, and a field), 448 with a watch's
        // `changed()` and async fns for the one-byte reads (now a reference each:
        // idle_wake.rs), 592 with a watch future for each of the three broadcasts, 800
        // with nested selects and a timer of its own, 1,760 before the busy loop was boxed
        // apart.
        assert!(idle <= 80, "the idle phase's future is {idle} bytes");
        assert!(serve <= 104, "the session's loop is {serve} bytes");
        // 1,504 with the running statement's text inline, 1,128 with the user's name and
        // the wake-up watch's receiver, 1,056 with a schema owed after an EXECUTE inline
        // (the heap chunk was 1,072 bytes; 1,040 at 1,032).
        assert!(session <= 1032, "a session is {session} bytes");
        // What a busy session holds besides (boxed, and freed when it goes idle).
        let busy = future_size(|s| s.serve_busy());
        assert!(busy <= 2560, "the request loop's future is {busy} bytes");
    }

    /// A value of any type, for a call whose future's size is measured, never made.
    fn never<T>() -> T {
        unreachable!("only the type is used")
    }

    /// The whole session's task: the way to a started session, the start, a pass-through
    /// relay and the busy loop are boxed; the session itself too, so that the task does
    /// not hold a copy of it beside the one the start returned.
    #[test]
    fn a_sessions_task_stays_small() {
        let task = free_size(|| run_routed(never(), never::<crate::Accepted>()));
        // tokio keeps a task's future in a 128-byte-aligned cell with 104 bytes of its own
        // (tokio 1.54): up to 152 bytes the cell is 256 (152 here, the way to a session
        // and a pass-through relay awaited in one boxed slot; it was 384 at 272 bytes,
        // with the idle phase's select and the admission ticket beside the session, and
        // 768 at 520 bytes, with the accept loop's closure around it). 3,448 with the
        // session inline (twice: the start's answer and the one served).
        assert!(task <= 152, "a session's future is {task} bytes");
    }

    /// A session handed over by an upgrade: its task holds the session much as a new one's
    /// does (it held what the old process sent, and with the wrapper around it was 3,240
    /// bytes in release: every idle session after an upgrade).
    #[test]
    fn a_handed_over_sessions_task_stays_small() {
        type Held = (
            crate::Slot,
            crate::admission::Ticket,
            Option<crate::session_threads::Counted>,
        );
        let task =
            free_size(|| run_resumed(never(), never(), never(), never(), never(), never::<Held>()));
        // 296 here: up to 408 the cell is 512 (the ticket and the slot it keeps make it a
        // little larger than a new session's).
        assert!(
            task <= 408,
            "a handed-over session's future is {task} bytes"
        );
    }
}
