//! One client session: a task that owns the client socket and its backend connection,
//! forwards commands, streams responses back, and keeps the session record current.

use crate::backend::{BackendConn, BackendError};
use crate::config::ListenerMode;
use crate::conn::{ConnError, PacketConn};
use crate::errors::*;
use crate::login::{self, Identity, LoggedIn};
use crate::registry::SessionInfo;
use crate::restore::Captured;
use crate::state::SessionRecord;
use crate::topology::Topology;
use crate::verifiers::Verifier;
use crate::Shared;
use bytes::{Buf, Bytes, BytesMut};
use holdfast_sql::{classify, Classification as C};
use holdfast_wire::auth::{verify_native, PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::command::*;
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use holdfast_wire::handshake::{AuthSwitch, ChangeUser};
use holdfast_wire::packets::{self, OkPacket, ERR_HEADER, OK_HEADER};
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

mod passthrough;
mod relocate;
use relocate::{idle_watch, IdleEvent};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum End {
    #[error("client quit")]
    Quit,
    /// The backend connection failed; `started`: part of the response already reached the
    /// client, so the command cannot be hidden or retried.
    #[error("backend connection lost: {error}")]
    BackendLost { started: bool, error: ConnError },
    /// holdfast closed the session on purpose (counted under `reason`).
    #[error("{message}")]
    Closed {
        reason: &'static str,
        message: String,
    },
    #[error("client connection: {0}")]
    Client(ConnError),
    #[error("backend connection: {0}")]
    Backend(ConnError),
    #[error("{0}")]
    Protocol(String),
}

/// A prepared statement under the id holdfast gave the client. The text, shape and last
/// bound parameter types are kept so the statement can be prepared again on another backend.
struct Statement {
    backend_id: u32,
    sql: Bytes,
    params: u16,
    #[allow(dead_code)]
    columns: u16,
    cursor_open: bool,
    long_data: bool,
    /// An execute lost with its backend outside a transaction may run again elsewhere (the
    /// statement only reads, only begins a transaction, or only sets session variables).
    retry_safe: bool,
    /// The parameter type block of the last execute that sent types.
    types: Option<Vec<u8>>,
    /// Re-prepared on a new backend that has not seen the types yet.
    types_pending: bool,
}

struct Session {
    shared: Arc<Shared>,
    info: Arc<SessionInfo>,
    client: PacketConn,
    backend: BackendConn,
    capabilities: u32,
    user: String,
    secret: Option<PasswordHash>,
    scramble: [u8; 20],
    record: SessionRecord,
    statements: HashMap<u32, Statement>,
    next_statement_id: u32,
    /// Client bytes of the current response already sent (a lost backend after this point
    /// cannot be hidden).
    response_started: bool,
    identity: Identity,
    can_reauthenticate: bool,
    backend_name: String,
    /// The backend connection is gone; the session moves before its next command.
    backend_dead: bool,
    /// The serverless epoch the backend connection was opened in (see `Lifecycle::epoch`).
    backend_epoch: u64,
    /// The backend died inside a transaction: the next statement gets 1213 (rolled back).
    transaction_lost: bool,
    /// The last capture of what the trackers do not report (user variables...).
    captured: Captured,
    topology: watch::Receiver<Arc<Topology>>,
    switching: watch::Receiver<bool>,
    /// The session's node stopped being the primary at this time; it moves at its next
    /// safe point or is closed after the cool-down.
    move_pending_since: Option<Instant>,
}

/// Answers a connection over the limit with ERR 1040 and closes it.
pub async fn refuse_too_many(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    shared.metrics.reject("too_many_connections");
    shared.metrics.count_error(ER_CON_COUNT_ERROR);
    tracing::warn!(client = %peer, limit = shared.config.proxy.max_connections, "too many connections");
    let mut conn = PacketConn::new(stream);
    let _ = conn
        .write_packet(&err(ER_CON_COUNT_ERROR, "Too many connections"), 0)
        .await;
}

pub async fn run(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr, mode: ListenerMode) {
    let id = shared.next_session_id();
    let mut client = PacketConn::new(stream);
    let mut deadline = shared.config.proxy.handshake_timeout();
    if let Some(lc) = &shared.serverless {
        // A login may wait for the instance to resume.
        deadline += lc.config.resume_deadline();
    }
    let epoch = shared.serverless.as_ref().map_or(0, |l| l.epoch());
    let logged_in = match tokio::time::timeout(
        deadline,
        login::login(&shared, &mut client, peer, id, mode),
    )
    .await
    {
        Ok(Ok(l)) => l,
        Ok(Err(e @ login::LoginError::HandshakeTimeout(_))) => {
            shared.metrics.reject("handshake_timeout");
            tracing::info!(session = id, client = %peer, error = %e, "closing");
            return;
        }
        Ok(Err(e)) => {
            shared.metrics.reject("login_failed");
            tracing::info!(session = id, client = %peer, error = %e, "login ended");
            return;
        }
        Err(_) => {
            shared.metrics.reject("handshake_timeout");
            tracing::info!(session = id, client = %peer, timeout_ms = deadline.as_millis() as u64, "handshake not finished in time; closing");
            return;
        }
    };
    if mode == ListenerMode::Passthrough {
        passthrough::run(shared, client, logged_in, peer, id).await;
        return;
    }
    let LoggedIn {
        mut backend,
        backend_name,
        user,
        capabilities,
        secret,
        can_reauthenticate,
        scramble,
        identity,
    } = logged_in;
    let mut record = SessionRecord {
        schema: identity.database.clone().filter(|d| !d.is_empty()),
        ..SessionRecord::default()
    };
    match backend.enable_trackers().await {
        Ok(true) => {}
        Ok(false) => record.untracked = true,
        Err(e) => {
            tracing::warn!(session = id, error = %e, "backend lost right after login");
            return;
        }
    }
    let info = Arc::new(SessionInfo::new(id, peer));
    info.set_user(&user);
    info.set_backend(&backend_name);
    info.can_reauthenticate
        .store(can_reauthenticate, Ordering::Relaxed);
    info.set_blocker(record.blocker());
    shared.sessions.insert(info.clone());
    shared.metrics.sessions_active.inc();
    if !can_reauthenticate {
        shared.metrics.sessions_passthrough_auth.inc();
    }
    tracing::debug!(session = id, client = %peer, user = %user, "session started");

    let mut session = Session {
        shared: shared.clone(),
        info,
        client,
        backend,
        capabilities,
        user,
        secret,
        scramble,
        record,
        statements: HashMap::new(),
        next_statement_id: 1,
        response_started: false,
        identity,
        can_reauthenticate,
        backend_name,
        backend_dead: false,
        backend_epoch: epoch,
        transaction_lost: false,
        captured: Captured::default(),
        topology: shared.topology.clone(),
        switching: shared.switching.subscribe(),
        move_pending_since: None,
    };
    // Changes before this point are already reflected in where the session logged in.
    session.topology.borrow_and_update();
    let end = session.serve().await;
    match &end {
        End::Quit | End::Client(ConnError::Closed) => {
            tracing::debug!(session = id, "session ended")
        }
        End::Closed { reason, message } => {
            shared.metrics.session_closed(reason);
            tracing::warn!(session = id, client = %peer, reason, "{message}")
        }
        e => tracing::info!(session = id, client = %peer, reason = %e, "session closed"),
    }
    shared.sessions.remove(id);
    shared.metrics.sessions_active.dec();
    if !can_reauthenticate {
        shared.metrics.sessions_passthrough_auth.dec();
    }
}

impl Session {
    fn deprecate_eof(&self) -> bool {
        self.capabilities & CLIENT_DEPRECATE_EOF != 0
    }

    async fn send_error(&mut self, seq: u8, code: u16, message: &str) -> Result<(), End> {
        self.shared.metrics.count_error(code);
        self.client
            .write_packet(&err(code, message), seq)
            .await
            .map_err(End::Client)
    }

    async fn serve(&mut self) -> End {
        loop {
            let max = self.shared.config.proxy.max_packet_size;
            let cooldown_end = self
                .move_pending_since
                .map(|t| t + self.shared.config.proxy.cooldown());
            // The client's next request is polled first; the idle watch (topology changes,
            // a backend that goes away, the cool-down) arms only after a short silence, so
            // a busy session pays no extra syscall or lock per command for it.
            let read = tokio::select! {
                biased;
                r = self.client.buffer_packet(max) => r,
                event = idle_watch(
                    &mut self.backend.conn,
                    &mut self.topology,
                    self.backend_dead,
                    cooldown_end,
                ) => {
                    match event {
                        IdleEvent::Topology(false) => {
                            return End::Protocol("topology monitor stopped".into());
                        }
                        IdleEvent::Topology(true) => {
                            if let Err(end) = self.on_topology_change().await {
                                return end;
                            }
                        }
                        IdleEvent::BackendGone => self.on_backend_lost_idle(),
                        IdleEvent::Cooldown => return self.cooldown_expired(),
                    }
                    continue;
                }
            };
            let wire_len = match read {
                Ok(n) => n,
                Err(ConnError::TooLarge { len, max }) => {
                    let msg = format!("Got a packet bigger than 'max_allowed_packet' bytes ({len} > {max}); holdfast closes the connection");
                    let _ = self.send_error(1, ER_NET_PACKET_TOO_LARGE, &msg).await;
                    return End::Protocol(msg);
                }
                Err(e) => return End::Client(e),
            };
            let request = self.client.rbuf.split_to(wire_len);
            self.shared
                .metrics
                .bytes_from_clients
                .inc_by(wire_len as u64);
            let started = Instant::now();
            self.info.busy.store(true, Ordering::SeqCst);
            if let Err(end) = self.run_request(request).await {
                return end;
            }
            self.shared.metrics.query_latency.observe(started.elapsed());
            self.info.commands.fetch_add(1, Ordering::Relaxed);
            self.info
                .status
                .store(self.record.status, Ordering::Relaxed);
            if let Err(end) = self.after_command().await {
                return end;
            }
            self.info.set_blocker(self.record.blocker());
            self.info.busy.store(false, Ordering::SeqCst);
        }
    }

    /// Handles one client request (`request` holds the whole logical packet, headers included).
    async fn command(&mut self, mut request: BytesMut) -> Result<(), End> {
        let Some(header) = parse_header(&request) else {
            return Err(End::Protocol("empty request".into()));
        };
        let reply_seq = header.seq.wrapping_add(1);
        let Some(&cmd) = request.get(HEADER_LEN) else {
            self.send_error(
                reply_seq,
                ER_MALFORMED_PACKET,
                "Malformed communication packet: empty command",
            )
            .await?;
            return Ok(());
        };
        self.shared.metrics.count_command(cmd);
        self.response_started = false;
        match cmd {
            COM_QUIT => Err(End::Quit),
            COM_QUERY => {
                let flags = classify(
                    &request
                        [HEADER_LEN + 1..header.len.min(request.len() - HEADER_LEN) + HEADER_LEN],
                );
                self.note_query(
                    flags,
                    &request
                        [HEADER_LEN + 1..header.len.min(request.len() - HEADER_LEN) + HEADER_LEN],
                );
                self.forward(&request).await?;
                self.relay(Expect::ResultSets).await
            }
            COM_STMT_PREPARE => {
                self.forward(&request).await?;
                let sql = Bytes::copy_from_slice(&frame::logical_payload(&request)[1..]);
                self.relay_prepare(sql).await
            }
            COM_STMT_EXECUTE
            | COM_STMT_FETCH
            | COM_STMT_RESET
            | COM_STMT_CLOSE
            | COM_STMT_SEND_LONG_DATA => self.statement_command(cmd, &mut request, reply_seq).await,
            COM_CHANGE_USER => self.change_user(&request).await,
            COM_RESET_CONNECTION => {
                self.forward(&request).await?;
                self.relay(Expect::Status).await?;
                self.statements.clear();
                self.record.reset();
                self.restore_trackers().await
            }
            COM_INIT_DB | COM_PING | COM_SET_OPTION | COM_PROCESS_KILL | COM_DEBUG
            | COM_REFRESH | COM_CREATE_DB | COM_DROP_DB => {
                self.forward(&request).await?;
                self.relay(Expect::Status).await
            }
            COM_FIELD_LIST => {
                self.forward(&request).await?;
                self.relay(Expect::FieldList).await
            }
            COM_STATISTICS => {
                self.forward(&request).await?;
                self.relay(Expect::OnePacket).await
            }
            COM_PROCESS_INFO => {
                self.forward(&request).await?;
                self.relay(Expect::ResultSets).await
            }
            other => {
                tracing::info!(
                    command = other,
                    name = name(other),
                    "unsupported command refused"
                );
                self.send_error(
                    reply_seq,
                    ER_UNKNOWN_COM_ERROR,
                    &format!(
                        "Unknown command 0x{other:02x} ({}): holdfast does not forward it",
                        name(other)
                    ),
                )
                .await
            }
        }
    }

    fn note_query(&mut self, flags: C, sql: &[u8]) {
        let r = &mut self.record;
        if flags.intersects(
            C::LAST_INSERT_ID_CALL
                .union(C::SET_USER_VAR)
                .union(C::CALL)
                .union(C::EXECUTE_SQL)
                .union(C::COMPOUND),
        ) {
            r.user_variables_touched = true;
        }
        if flags.has(C::CREATE_TEMP_TABLE) {
            r.temporary_tables = true;
        }
        if flags.has(C::LOCK_TABLES) {
            r.table_locks = true;
        }
        if flags.has(C::UNLOCK_TABLES) {
            r.table_locks = false;
        }
        if flags.has(C::GET_LOCK) {
            r.named_locks = true;
        }
        if flags.has(C::XA) {
            // XA START/BEGIN opens one; XA COMMIT/ROLLBACK ends it (END/PREPARE keep it).
            let mut words =
                holdfast_sql::Lexer::new(sql).filter(|t| t.kind == holdfast_sql::TokenKind::Word);
            let _xa = words.next();
            match words.next() {
                Some(t) if t.is_word("START") || t.is_word("BEGIN") => r.xa = true,
                Some(t) if t.is_word("COMMIT") || t.is_word("ROLLBACK") => r.xa = false,
                _ => {}
            }
        }
    }

    async fn forward(&mut self, request: &[u8]) -> Result<(), End> {
        self.backend
            .conn
            .write_raw(request)
            .await
            .map_err(|error| End::BackendLost {
                started: false,
                error,
            })
    }

    /// Writes the first `n` buffered backend bytes to the client.
    async fn flush(&mut self, n: usize) -> Result<(), End> {
        if n == 0 {
            return Ok(());
        }
        let chunk = self.backend.conn.rbuf.split_to(n);
        self.response_started = true;
        self.shared.metrics.bytes_to_clients.inc_by(n as u64);
        self.client
            .stream
            .write_all(&chunk)
            .await
            .map_err(|e| End::Client(e.into()))
    }

    /// Reads more from the backend. A loss is returned to the caller, which decides whether
    /// the command can be re-run elsewhere or must fail.
    async fn fill_backend(&mut self) -> Result<(), End> {
        match self.backend.conn.fill().await {
            Ok(_) => Ok(()),
            Err(error) => Err(End::BackendLost {
                started: self.response_started,
                error,
            }),
        }
    }

    /// Streams one command's response to the client, inspecting only the packets that carry
    /// state. Rows and column definitions pass through in the reads they arrived in.
    async fn relay(&mut self, expect: Expect) -> Result<(), End> {
        self.relay_inner(expect, None).await.map(|_| ())
    }

    async fn relay_prepare(&mut self, sql: Bytes) -> Result<(), End> {
        self.relay_inner(Expect::Prepare, Some(sql))
            .await
            .map(|_| ())
    }

    async fn relay_inner(
        &mut self,
        expect: Expect,
        prepare_sql: Option<Bytes>,
    ) -> Result<u16, End> {
        let mut m = ResponseMachine::new(expect, self.deprecate_eof());
        let mut ready = 0usize;
        let mut passing = 0usize;
        let mut pending: Option<usize> = None;
        let mut prepare_sql = prepare_sql;
        loop {
            if passing > 0 {
                let n = (self.backend.conn.rbuf.len() - ready).min(passing);
                ready += n;
                passing -= n;
                if passing > 0 {
                    self.flush(ready).await?;
                    ready = 0;
                    self.fill_backend().await?;
                    continue;
                }
            }
            if m.is_done() && pending.is_none() {
                break;
            }
            let rest = &self.backend.conn.rbuf[ready..];
            let wire_len = match pending {
                Some(n) => n,
                None => {
                    let Some(h) = parse_header(rest) else {
                        self.flush(ready).await?;
                        ready = 0;
                        self.fill_backend().await?;
                        continue;
                    };
                    if h.len > 0 && rest.len() <= HEADER_LEN {
                        self.flush(ready).await?;
                        ready = 0;
                        self.fill_backend().await?;
                        continue;
                    }
                    match m.classify(h.len, rest.get(HEADER_LEN).copied()) {
                        Kind::Opaque => {
                            let have = rest.len().min(h.packet_len());
                            ready += have;
                            passing = h.packet_len() - have;
                            continue;
                        }
                        Kind::Inspect => h.packet_len(),
                    }
                }
            };
            if rest.len() < wire_len {
                pending = Some(wire_len);
                self.flush(ready).await?;
                ready = 0;
                self.fill_backend().await?;
                continue;
            }
            pending = None;
            let seq = rest[3];
            // Borrow the buffer through the field alone, so the record can be updated below.
            let payload = &self.backend.conn.rbuf[ready + HEADER_LEN..ready + wire_len];
            let event = m
                .on_packet(payload)
                .map_err(|e| End::Protocol(format!("backend sent a malformed response: {e}")))?;
            let mut replacement: Option<Vec<u8>> = None;
            let mut is_infile = false;
            match event {
                Event::Ok(ok) => {
                    replacement = observe_ok(
                        &mut self.record,
                        &ok,
                        self.capabilities & CLIENT_SESSION_TRACK != 0,
                    );
                }
                Event::Eof(eof) => self.record.status = eof.status,
                Event::Err(e) => {
                    // The server going away answers (or pre-empts) the command with one of
                    // these before it closes; nothing ran, so treat it as a lost backend.
                    if ready == 0
                        && !self.response_started
                        && matches!(
                            e.code,
                            ER_SERVER_SHUTDOWN | ER_CONNECTION_KILLED | ER_CLIENT_IDLE_TIMEOUT
                        )
                    {
                        return Err(End::BackendLost {
                            started: false,
                            error: ConnError::Closed,
                        });
                    }
                    self.shared.metrics.count_error(e.code)
                }
                Event::PrepareOk(p) => {
                    let sql = prepare_sql.take().unwrap_or_default();
                    let retry_safe = relocate::retry_safe_sql(&sql);
                    let client_id = self.next_statement_id;
                    self.next_statement_id = self.next_statement_id.wrapping_add(1).max(1);
                    self.statements.insert(
                        client_id,
                        Statement {
                            backend_id: p.statement_id,
                            sql,
                            params: p.num_params,
                            columns: p.num_columns,
                            cursor_open: false,
                            long_data: false,
                            retry_safe,
                            types: None,
                            types_pending: false,
                        },
                    );
                    self.record.prepared_statements = self.statements.len();
                    let mut patched = payload.to_vec();
                    packets::set_statement_id(&mut patched, client_id);
                    replacement = Some(patched);
                }
                Event::LocalInfile => is_infile = true,
                Event::None => {}
            }
            match replacement {
                Some(new_payload) => {
                    self.flush(ready).await?;
                    ready = 0;
                    self.backend.conn.rbuf.advance(wire_len);
                    let framed = frame::packet(&new_payload, seq);
                    self.response_started = true;
                    self.shared
                        .metrics
                        .bytes_to_clients
                        .inc_by(framed.len() as u64);
                    self.client.write_raw(&framed).await.map_err(End::Client)?;
                }
                None => ready += wire_len,
            }
            if is_infile {
                self.flush(ready).await?;
                ready = 0;
                self.relay_infile().await?;
            }
        }
        self.flush(ready).await?;
        Ok(m.last_status())
    }

    /// LOCAL INFILE: the client's file data goes to the backend up to the empty packet.
    async fn relay_infile(&mut self) -> Result<(), End> {
        let max = self.shared.config.proxy.max_packet_size;
        loop {
            let wire_len = self.client.buffer_packet(max).await.map_err(End::Client)?;
            let chunk = self.client.rbuf.split_to(wire_len);
            self.shared
                .metrics
                .bytes_from_clients
                .inc_by(wire_len as u64);
            self.forward(&chunk).await?;
            if parse_header(&chunk).is_some_and(|h| h.len == 0) {
                return Ok(());
            }
        }
    }

    async fn statement_command(
        &mut self,
        cmd: u8,
        request: &mut BytesMut,
        reply_seq: u8,
    ) -> Result<(), End> {
        let Some(client_id) = packets::statement_id(&request[HEADER_LEN..]) else {
            if cmd == COM_STMT_CLOSE || cmd == COM_STMT_SEND_LONG_DATA {
                return Ok(());
            }
            return self
                .send_error(
                    reply_seq,
                    ER_MALFORMED_PACKET,
                    "Malformed communication packet: no statement id",
                )
                .await;
        };
        let Some(stmt) = self.statements.get_mut(&client_id) else {
            // The server sends nothing back for these two, whatever the id.
            if cmd == COM_STMT_CLOSE || cmd == COM_STMT_SEND_LONG_DATA {
                return Ok(());
            }
            let msg = format!(
                "Unknown prepared statement handler ({client_id}) given to {}",
                name(cmd)
            );
            return self
                .send_error(reply_seq, ER_UNKNOWN_STMT_HANDLER, &msg)
                .await;
        };
        packets::set_statement_id(&mut request[HEADER_LEN..], stmt.backend_id);
        match cmd {
            COM_STMT_CLOSE => {
                self.statements.remove(&client_id);
                self.record.prepared_statements = self.statements.len();
                self.forward(request).await
            }
            COM_STMT_SEND_LONG_DATA => {
                stmt.long_data = true;
                self.record.pending_long_data = true;
                self.forward(request).await
            }
            COM_STMT_RESET => {
                stmt.long_data = false;
                stmt.cursor_open = false;
                self.forward(request).await?;
                self.relay(Expect::Status).await?;
                self.recount_statement_state();
                Ok(())
            }
            COM_STMT_EXECUTE => {
                stmt.long_data = false;
                if let Some(patched) = bind_types(stmt, request) {
                    *request = patched;
                }
                let wants_cursor = request
                    .get(HEADER_LEN + 5)
                    .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0);
                self.forward(request).await?;
                let status = self.relay_inner(Expect::ResultSets, None).await?;
                if let Some(stmt) = self.statements.get_mut(&client_id) {
                    stmt.cursor_open = wants_cursor && status & SERVER_STATUS_CURSOR_EXISTS != 0;
                }
                self.recount_statement_state();
                Ok(())
            }
            _ => {
                // COM_STMT_FETCH
                self.forward(request).await?;
                let status = self.relay_inner(Expect::Fetch, None).await?;
                if status & SERVER_STATUS_LAST_ROW_SENT != 0 {
                    if let Some(stmt) = self.statements.get_mut(&client_id) {
                        stmt.cursor_open = false;
                    }
                }
                self.recount_statement_state();
                Ok(())
            }
        }
    }

    fn recount_statement_state(&mut self) {
        self.record.open_cursors = self.statements.values().filter(|s| s.cursor_open).count();
        self.record.pending_long_data = self.statements.values().any(|s| s.long_data);
        self.record.prepared_statements = self.statements.len();
    }

    /// Re-enables the trackers after the server reset the session's variables.
    async fn restore_trackers(&mut self) -> Result<(), End> {
        match self.backend.enable_trackers().await {
            Ok(ok) => {
                self.record.untracked = !ok;
                Ok(())
            }
            Err(BackendError::Conn(e)) => Err(End::Backend(e)),
            Err(e) => Err(End::Protocol(e.to_string())),
        }
    }

    /// Asks the client for its mysql_native_password answer to `scramble` (AuthSwitchRequest);
    /// returns the answer and the next sequence id.
    async fn ask_native_answer(
        &mut self,
        scramble: Vec<u8>,
        seq: u8,
    ) -> Result<(Vec<u8>, u8), End> {
        let switch = AuthSwitch {
            plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            data: scramble,
        };
        self.client
            .write_packet(&switch.encode(), seq)
            .await
            .map_err(End::Client)?;
        let answer = self
            .client
            .read_packet(1 << 20)
            .await
            .map_err(End::Client)?;
        Ok((answer.payload.to_vec(), answer.seq.wrapping_add(1)))
    }

    /// COM_CHANGE_USER, checked against the verifiers like a login, then replayed on the
    /// backend with an answer to the backend's own scramble.
    async fn change_user(&mut self, request: &[u8]) -> Result<(), End> {
        let payload = frame::logical_payload(request);
        let mut seq = parse_header(request).map_or(0, |h| h.seq).wrapping_add(1);
        let cu = match ChangeUser::parse(&payload, self.capabilities) {
            Ok(c) => c,
            Err(e) => {
                self.send_error(
                    seq,
                    ER_MALFORMED_PACKET,
                    &format!("Malformed COM_CHANGE_USER: {e}"),
                )
                .await?;
                return Err(End::Protocol("malformed COM_CHANGE_USER".into()));
            }
        };
        let user = String::from_utf8_lossy(&cu.user).into_owned();
        let peer = self.info.client.ip();
        let verifier = self
            .shared
            .verifiers
            .lookup(&user, peer)
            .map(|a| a.verifier());
        let (auth, plugin, secret) = match verifier.clone() {
            Some(v @ (Verifier::Native(_) | Verifier::Empty)) => {
                let mut response = cu.auth_response.clone();
                if !(cu.auth_plugin.is_empty() || cu.auth_plugin == NATIVE_PASSWORD.as_bytes()) {
                    let scramble = self.scramble.to_vec();
                    (response, seq) = self.ask_native_answer(scramble, seq).await?;
                }
                let secret = match v {
                    Verifier::Native(stored) => verify_native(&response, &self.scramble, &stored),
                    _ => None,
                };
                let ok = matches!(v, Verifier::Native(_)) == secret.is_some()
                    && (secret.is_some() || response.is_empty());
                if !ok {
                    self.shared.metrics.logins_failed.inc();
                    let using = if response.is_empty() { "NO" } else { "YES" };
                    self.send_error(
                        seq,
                        ER_ACCESS_DENIED_ERROR,
                        &format!(
                            "Access denied for user '{user}'@'{peer}' (using password: {using})"
                        ),
                    )
                    .await?;
                    return Err(End::Protocol("COM_CHANGE_USER refused".into()));
                }
                let answer = match &secret {
                    Some(s) => s
                        .scramble_response(&self.backend.greeting.scramble)
                        .to_vec(),
                    None => Vec::new(),
                };
                (answer, NATIVE_PASSWORD.as_bytes().to_vec(), secret)
            }
            _ => {
                if let Some(Verifier::Relay { .. }) = verifier {
                    // ed25519, caching_sha2_password...: the server switches to the account's
                    // plugin itself and every step below is relayed verbatim.
                    (Vec::new(), NATIVE_PASSWORD.as_bytes().to_vec(), None)
                } else {
                    // Unknown account: the client answers the backend's own scramble.
                    let scramble = self.backend.greeting.scramble.clone();
                    let answer;
                    (answer, seq) = self.ask_native_answer(scramble, seq).await?;
                    (answer, NATIVE_PASSWORD.as_bytes().to_vec(), None)
                }
            }
        };
        let forwarded = ChangeUser {
            auth_response: auth,
            auth_plugin: plugin,
            ..cu
        };
        self.backend
            .conn
            .write_packet(&forwarded.encode(self.backend.capabilities), 0)
            .await
            .map_err(End::Backend)?;
        loop {
            let p = self
                .backend
                .conn
                .read_packet(1 << 20)
                .await
                .map_err(End::Backend)?;
            match p.payload.first() {
                Some(&OK_HEADER) => break,
                Some(&ERR_HEADER) => {
                    self.client
                        .write_packet(&p.payload, seq)
                        .await
                        .map_err(End::Client)?;
                    return Err(End::Protocol(
                        "COM_CHANGE_USER refused by the backend".into(),
                    ));
                }
                Some(0xfe) if secret.is_some() => {
                    let switch =
                        AuthSwitch::parse(&p.payload).map_err(|e| End::Protocol(e.to_string()))?;
                    let answer = secret
                        .as_ref()
                        .map(|s| s.scramble_response(&switch.data).to_vec())
                        .unwrap_or_default();
                    self.backend
                        .conn
                        .write_packet(&answer, p.seq.wrapping_add(1))
                        .await
                        .map_err(End::Backend)?;
                }
                _ => {
                    self.client
                        .write_packet(&p.payload, seq)
                        .await
                        .map_err(End::Client)?;
                    let answer = self
                        .client
                        .read_packet(1 << 20)
                        .await
                        .map_err(End::Client)?;
                    seq = answer.seq.wrapping_add(1);
                    self.backend
                        .conn
                        .write_packet(&answer.payload, p.seq.wrapping_add(1))
                        .await
                        .map_err(End::Backend)?;
                }
            }
        }
        self.statements.clear();
        self.record.reset();
        let database = String::from_utf8_lossy(&forwarded.database).into_owned();
        self.record.schema = Some(database.clone()).filter(|d| !d.is_empty());
        self.identity.user = forwarded.user.clone();
        self.identity.database = self.record.schema.clone();
        if let Some(cs) = forwarded.charset {
            self.identity.charset = cs as u8;
        }
        self.captured = Captured::default();
        let can = secret.is_some() || matches!(verifier, Some(Verifier::Empty));
        self.can_reauthenticate = can;
        self.secret = secret;
        self.info.set_user(&user);
        self.user = user;
        self.info.can_reauthenticate.store(can, Ordering::Relaxed);
        self.restore_trackers().await?;
        self.client
            .write_packet(&packets::ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0), seq)
            .await
            .map_err(End::Client)
    }
}

/// Records what an OK packet says; returns a re-encoded payload without the session state
/// when the client did not negotiate session tracking (the rest is byte-identical).
fn observe_ok(
    record: &mut SessionRecord,
    ok: &OkPacket<'_>,
    client_tracks: bool,
) -> Option<Vec<u8>> {
    record.status = ok.status;
    if ok.last_insert_id != 0 {
        record.last_insert_id = ok.last_insert_id;
    }
    if !ok.session_state.is_empty() {
        record.apply_session_state(ok.session_state);
    }
    if client_tracks {
        return None;
    }
    (ok.status & SERVER_SESSION_STATE_CHANGED != 0).then(|| ok.encode(false))
}

/// Remembers the parameter types a COM_STMT_EXECUTE sends, and puts them back into an execute
/// that relies on the server remembering them when the statement was re-prepared on a new
/// backend that never saw them. Returns the rewritten request when one is needed.
fn bind_types(stmt: &mut Statement, request: &[u8]) -> Option<BytesMut> {
    let header = parse_header(request)?;
    if header.continues() || stmt.params == 0 {
        return None;
    }
    let payload = request.get(HEADER_LEN..HEADER_LEN + header.len)?;
    let n = usize::from(stmt.params);
    let flag_pos = 10 + n.div_ceil(8);
    match *payload.get(flag_pos)? {
        1 => {
            stmt.types = Some(payload.get(flag_pos + 1..flag_pos + 1 + 2 * n)?.to_vec());
            stmt.types_pending = false;
            None
        }
        _ if stmt.types_pending => {
            let types = stmt.types.as_ref()?;
            let mut patched = Vec::with_capacity(payload.len() + types.len());
            patched.extend_from_slice(&payload[..flag_pos]);
            patched.push(1);
            patched.extend_from_slice(types);
            patched.extend_from_slice(&payload[flag_pos + 1..]);
            stmt.types_pending = false;
            Some(BytesMut::from(&frame::packet(&patched, header.seq)[..]))
        }
        _ => None,
    }
}
