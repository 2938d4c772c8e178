//! Send and relay: a command goes to the backend and its response streams back to the
//! client. Only the packets that carry state (OK, EOF, ERR, PREPARE-OK, the column count)
//! are parsed, to keep the session record current; rows and column definitions pass
//! through in the reads they arrived in. A LOCAL INFILE file the statement asked for goes
//! from the client to the backend; one it did not ask for is refused.

use super::owed_schema::OwedSchema;
use super::reply::{reply_seq, Reply};
use super::statements::{bind_types, Statement};
use super::{End, Session};
use crate::conn::{ConnError, PacketConn};
use crate::error::code::{ER_CLIENT_IDLE_TIMEOUT, ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN};
use crate::error::{ClientError, ErrorKind};
use bytes::{Buf, Bytes, BytesMut};
use holdfast_sql::classify_for;
use holdfast_wire::caps::*;
use holdfast_wire::command::*;
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use holdfast_wire::packets::{self, OkPacket};
use holdfast_wire::response::{Event, Kind, ResponseMachine};
use std::hash::Hasher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One command's exchange with the backend: what holdfast knows of the answer while it is
/// relayed, and how it is relayed. Set up by whatever sends the command ([`Exchange::begin`]),
/// read by the relay and, once the answer is in, by the request's observers.
#[derive(Default)]
pub(super) struct Exchange {
    /// Client bytes of the current response already sent (a lost backend after this point
    /// cannot be hidden).
    pub started: bool,
    /// The code of the ERR that ended the current command's response, if one did.
    pub error: Option<u16>,
    /// The checksum of the answer being relayed, while it is kept for a replay.
    pub checksum: Option<Box<super::replay::Checksum>>,
    /// A replay runs: answers are compared, not sent to the client.
    pub replaying: bool,
    /// The request being forwarded may make the server ask for a client file: a text
    /// `LOAD DATA|XML LOCAL` (or text holdfast could not classify). Any other file request
    /// is refused ([`Session::refuse_file_request`]).
    pub file_expected: bool,
    /// Which of the request's statements execute a statement prepared with `PREPARE`
    /// under another current schema: the server switches to that one and back while it
    /// runs, and its schema tracker reports a change (see [`OwedSchema`]).
    pub schema_switch: SchemaSwitch,
    /// The schema record such a switch left on the server for a later OK (boxed: rare,
    /// and every session would keep its room).
    pub owed_schema: Option<Box<OwedSchema>>,
    /// Results the last answer ended with an OK or EOF: after an ERR, the statements of a
    /// multi-statement that ran before it (when none is a CALL).
    pub results: u32,
    /// What `ROW_COUNT()` reads after the last answer relayed: an OK's affected rows, -1
    /// after a result set or an ERR.
    pub row_count_left: Option<i64>,
}

/// The statements of a request that switch schemas as they run (see
/// [`Exchange::schema_switch`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum SchemaSwitch {
    #[default]
    None,
    /// The request is one such `EXECUTE`: every answer packet is its.
    Whole,
    /// These statements of a multi-statement (bit i: the i-th, the first 64), none a
    /// `CALL`: each answers with one result.
    At(u64),
}

impl SchemaSwitch {
    /// Whether the answer packet that comes after `results` results ended is a switching
    /// statement's.
    pub fn at(self, results: u32) -> bool {
        match self {
            SchemaSwitch::None => false,
            SchemaSwitch::Whole => true,
            SchemaSwitch::At(bits) => results < 64 && bits & (1 << results) != 0,
        }
    }
}

impl Exchange {
    /// An `EXECUTE` that switched schemas ended without an OK to carry the record: the
    /// server keeps it for a later one (an earlier debt of the same schema stands).
    fn owe_schema(&mut self, current: Option<&str>) {
        let schema = current.unwrap_or_default().as_bytes();
        self.owed_schema
            .get_or_insert_with(|| Box::new(OwedSchema::new(schema)));
    }

    /// A command is about to go out: nothing of its answer is known yet.
    pub(super) fn begin(&mut self) {
        self.started = false;
        self.error = None;
    }
}

/// How long a request runs before holdfast watches its client's connection: a quick
/// response never pays for the watch.
pub(super) const WATCH_CLIENT_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// What a client may send ahead (pipelined commands) while its request runs, kept in its
/// read buffer while holdfast watches for it going away.
const PIPELINED_MAX: usize = 1 << 20;

/// Resolves when the client closes its connection while its request runs, once `watch` has
/// fired. Bytes it sends meanwhile (pipelined commands) stay in its read buffer (up to
/// [`PIPELINED_MAX`]; past that the client is not watched). Cancel-safe: a read that did
/// not complete took nothing.
async fn client_gone(client: &mut PacketConn, watch: std::pin::Pin<&mut tokio::time::Sleep>) {
    watch.await;
    while client.rbuf.len() < PIPELINED_MAX {
        match client.stream.read_buf(&mut client.rbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    std::future::pending().await
}

/// Why a request stopped waiting for its backend.
enum Interrupt {
    ClientGone,
    Deposed,
    /// Its answer is stuck in the network ([`super::stuck`]).
    AnswerStuck,
}

/// A backend read, or why the wait for it stopped.
enum Watched {
    Read(ConnError),
    Interrupted(Interrupt),
}

/// Once `watch` has fired (a request running that long): `slow` is called (the request's
/// statement is shown), then resolves when the client goes away ([`client_gone`]), the
/// topology says a failover moved away from `node`, or `stuck` says the answer is stuck in
/// the network. The topology is followed on a clone of the receiver: the session's own
/// still sees the change afterwards.
async fn watch_request(
    client: &mut PacketConn,
    topology: &tokio::sync::watch::Receiver<std::sync::Arc<holdfast_cluster::topology::Topology>>,
    node: &str,
    mut watch: std::pin::Pin<&mut tokio::time::Sleep>,
    slow: impl FnOnce(),
    stuck: impl std::future::Future<Output = ()>,
) -> Interrupt {
    watch.as_mut().await;
    slow();
    let mut topology = topology.clone();
    let deposed = async {
        loop {
            if topology.borrow_and_update().is_deposed(node) {
                return;
            }
            if topology.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = client_gone(client, watch) => Interrupt::ClientGone,
        () = deposed => Interrupt::Deposed,
        () = stuck => Interrupt::AnswerStuck,
    }
}

impl Session {
    /// Handles one client request (`request` holds the whole logical packet, headers
    /// included); statement commands get the backend's statement id written into it.
    pub(super) async fn command(&mut self, request: &mut BytesMut) -> Result<(), End> {
        let reply_seq = reply_seq(request);
        let Some(&cmd) = request.get(HEADER_LEN) else {
            return self
                .send_error(reply_seq, &ClientError::malformed("empty command"))
                .await;
        };
        self.shared.metrics.requests.command(cmd);
        self.exchange.begin();
        let mut reply = Reply::of(cmd);
        // Bulk execution is for clients that negotiated it.
        if cmd == COM_STMT_BULK_EXECUTE
            && self.identity.mariadb_caps & MARIADB_CLIENT_STMT_BULK_OPERATIONS == 0
        {
            reply = Reply::Refused;
        }
        match cmd {
            COM_QUIT => Err(End::Quit),
            _ if reply == Reply::Refused => self.refuse_command(cmd, reply_seq).await,
            COM_STMT_PREPARE => {
                // Until it succeeds, no statement is "the last prepared" (id -1).
                self.statements.last = None;
                self.forward(request).await?;
                let sql = Bytes::copy_from_slice(&frame::logical_payload(request)[1..]);
                self.relay_inner(reply, Some(sql), false).await.map(|_| ())
            }
            COM_STMT_EXECUTE
            | COM_STMT_BULK_EXECUTE
            | COM_STMT_FETCH
            | COM_STMT_RESET
            | COM_STMT_CLOSE
            | COM_STMT_SEND_LONG_DATA => {
                self.statement_command(cmd, reply, request, reply_seq).await
            }
            COM_CHANGE_USER => Box::pin(self.change_user(request)).await,
            COM_RESET_CONNECTION => {
                self.forward(request).await?;
                self.relay(reply).await?;
                self.statements.clear();
                // The server resets the session but keeps its current database.
                let schema = self.record.schema.take();
                self.record.reset();
                self.record.schema = schema;
                // The user variables (and LAST_INSERT_ID) captured before are gone too.
                self.captured = Default::default();
                self.restore_trackers().await
            }
            _ => {
                self.forward(request).await?;
                self.relay(reply).await
            }
        }
    }

    async fn refuse_command(&mut self, cmd: u8, reply_seq: u8) -> Result<(), End> {
        tracing::info!(
            command = cmd,
            name = name(cmd),
            "unsupported command refused"
        );
        let message = format!(
            "Unknown command 0x{cmd:02x} ({}): holdfast does not forward it",
            name(cmd)
        );
        self.send_error_kind(reply_seq, ErrorKind::UnknownCommand, message)
            .await
    }

    pub(super) async fn forward(&mut self, request: &[u8]) -> Result<(), End> {
        self.backend
            .conn
            .write_raw(request)
            .await
            .map_err(|error| End::BackendLost {
                started: false,
                error,
            })
    }

    /// Writes the first `n` buffered backend bytes to the client, and flushes what was
    /// written before (a TLS stream may hold encrypted bytes until flushed; a socket's
    /// flush is a no-op).
    async fn flush(&mut self, n: usize) -> Result<(), End> {
        if self.exchange.replaying {
            // A replayed answer was compared, not sent: the client has it already.
            self.backend.conn.rbuf.advance(n);
            return Ok(());
        }
        let client = |e: std::io::Error| End::Client(e.into());
        if n > 0 {
            let chunk = self.backend.conn.rbuf.split_to(n);
            self.exchange.started = true;
            self.shared.metrics.requests.bytes_to_client(n as u64);
            self.client.stream.write_all(&chunk).await.map_err(client)?;
        }
        self.client.stream.flush().await.map_err(client)
    }

    /// Reads more from the backend. A loss is returned to the caller, which decides whether
    /// the command can be re-run elsewhere or must fail. `file_answer`: the client has sent
    /// a LOCAL INFILE file and waits for its answer at this sequence id.
    async fn fill_backend(&mut self, file_answer: Option<u8>) -> Result<(), End> {
        let awaited = self.awaited();
        let filled = tokio::select! {
            biased;
            r = self.backend.conn.fill() => r.map(|_| ()).map_err(Watched::Read),
            gone = watch_request(
                &mut self.client,
                &self.topology,
                &self.backend_name,
                self.idle_timer.armed(),
                || self.running.show(&self.info, &self.statements),
                super::stuck::answer_stuck(&self.shared, &self.info, &self.backend_name, awaited),
            ) => Err(Watched::Interrupted(gone)),
        };
        let filled = match filled {
            Ok(()) => Ok(()),
            Err(Watched::Read(e)) => Err(e),
            Err(Watched::Interrupted(gone)) => Err(self.interrupted(gone)?),
        };
        match filled {
            Ok(_) => Ok(()),
            Err(error) => Err(match file_answer {
                Some(reply_seq) => End::BackendLostDuringFile { error, reply_seq },
                None => End::BackendLost {
                    started: self.exchange.started,
                    error,
                },
            }),
        }
    }

    /// What a request that stopped waiting for its backend becomes: the client gone ends
    /// the session (as when a direct client vanishes, the server sees its connection close
    /// and stops a statement that waits, such as GET_LOCK or SLEEP); a node failed over
    /// away from while it had the request (frozen, say) is a lost backend: its answer, if
    /// it ever comes, is not the cluster's, and the request's outcome is settled on the new
    /// primary.
    fn interrupted(&self, gone: Interrupt) -> Result<ConnError, End> {
        match gone {
            Interrupt::ClientGone => Err(End::Client(ConnError::Closed)),
            // A timeout, as TCP's own would be (a loss the network caused).
            Interrupt::AnswerStuck => Ok(ConnError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the answer was lost in the network (the server was done with the request)",
            ))),
            Interrupt::Deposed => {
                tracing::warn!(session = self.info.id, node = %self.backend_name, "the node was failed over away from with a request in flight; its answer is not taken");
                Ok(ConnError::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the node was failed over away from",
                )))
            }
        }
    }

    /// What [`super::stuck::answer_stuck`] watches for the answer awaited now on the
    /// session's node: its connection's server thread, when the request came, when the
    /// connection was opened.
    fn awaited(&self) -> super::stuck::Awaited {
        super::stuck::Awaited {
            thread: self.backend.greeting.connection_id,
            sent: self.running.since(),
            connected: self.backend_since,
        }
    }

    /// Reads one packet of an answer holdfast reads itself (a commit marker's exchange),
    /// watched as [`Session::fill_backend`] watches: a client that goes away, a node that
    /// was failed over away from (its answer is not taken). A backend error is
    /// [`End::BackendLost`] before the client got anything.
    pub(super) async fn read_backend_packet(&mut self) -> Result<crate::conn::Packet, End> {
        let max = self.shared.config().proxy.max_packet_size;
        let awaited = self.awaited();
        let read = tokio::select! {
            biased;
            r = self.backend.conn.read_packet(max) => r.map_err(Watched::Read),
            gone = watch_request(
                &mut self.client,
                &self.topology,
                &self.backend_name,
                self.idle_timer.armed(),
                || self.running.show(&self.info, &self.statements),
                super::stuck::answer_stuck(&self.shared, &self.info, &self.backend_name, awaited),
            ) => Err(Watched::Interrupted(gone)),
        };
        let read = match read {
            Ok(p) => Ok(p),
            Err(Watched::Read(e)) => Err(e),
            Err(Watched::Interrupted(gone)) => Err(self.interrupted(gone)?),
        };
        read.map_err(|error| End::BackendLost {
            started: false,
            error,
        })
    }

    /// Streams one command's response to the client, inspecting only the packets that carry
    /// state. Rows and column definitions pass through in the reads they arrived in.
    pub(super) async fn relay(&mut self, reply: Reply) -> Result<(), End> {
        self.relay_inner(reply, None, false).await.map(|_| ())
    }

    /// [`Session::relay`], returning the status flags of the response's last OK/EOF;
    /// `prepare_sql`: the text of a statement being prepared; `cursor`: a COM_STMT_EXECUTE
    /// that asked for a cursor (its result may stop after the metadata).
    async fn relay_inner(
        &mut self,
        reply: Reply,
        prepare_sql: Option<Bytes>,
        cursor: bool,
    ) -> Result<u16, End> {
        let Some(expect) = reply.expect() else {
            return Ok(0);
        };
        let mut m = ResponseMachine::new(expect, self.deprecate_eof()).with_cursor(cursor);
        let mut ready = 0usize;
        let mut passing = 0usize;
        let mut pending: Option<usize> = None;
        let mut prepare_sql = prepare_sql;
        // Once the client's LOCAL INFILE file went through: its answer's sequence id.
        let mut file_sent: Option<u8> = None;
        loop {
            let file_answer = file_sent.filter(|_| m.awaiting_infile());
            if passing > 0 {
                let n = (self.backend.conn.rbuf.len() - ready).min(passing);
                if let Some(h) = self.exchange.checksum.as_deref_mut() {
                    h.write(&self.backend.conn.rbuf[ready..ready + n]);
                }
                ready += n;
                passing -= n;
                if passing > 0 {
                    self.flush(ready).await?;
                    ready = 0;
                    self.fill_backend(file_answer).await?;
                    continue;
                }
            }
            if m.is_done() && pending.is_none() {
                self.exchange.results = m.results();
                break;
            }
            let rest = &self.backend.conn.rbuf[ready..];
            let wire_len = match pending {
                Some(n) => n,
                None => {
                    let Some(h) = parse_header(rest) else {
                        self.flush(ready).await?;
                        ready = 0;
                        self.fill_backend(file_answer).await?;
                        continue;
                    };
                    if h.len > 0 && rest.len() <= HEADER_LEN {
                        self.flush(ready).await?;
                        ready = 0;
                        self.fill_backend(file_answer).await?;
                        continue;
                    }
                    match m.classify(h.len, rest.get(HEADER_LEN).copied()) {
                        Kind::Opaque => {
                            let have = rest.len().min(h.packet_len());
                            if let Some(sum) = self.exchange.checksum.as_deref_mut() {
                                sum.write(&rest[..have]);
                            }
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
                self.fill_backend(file_answer).await?;
                continue;
            }
            pending = None;
            let seq = rest[3];
            // Borrow the buffer through the field alone, so the record can be updated below.
            let payload = &self.backend.conn.rbuf[ready + HEADER_LEN..ready + wire_len];
            // (The statement of a multi-statement this packet answers, when none is a CALL.)
            let switched = self.exchange.schema_switch.at(m.results());
            let event = m
                .on_packet(payload)
                .map_err(|e| End::Protocol(format!("backend sent a malformed response: {e}")))?;
            if let Some(sum) = self.exchange.checksum.as_deref_mut() {
                super::replay::checksum_event(sum, &event, payload);
            }
            // A packet the client must see changed is framed into `scratch` (reused).
            let mut replaced = false;
            let mut is_infile = false;
            match event {
                Event::Ok(ok) => {
                    // First: the OK of a client's SET session_track_... already counts.
                    self.record.observe_ok(&ok);
                    self.exchange.row_count_left = Some(match ok.header {
                        // The OK that ends a result set (CLIENT_DEPRECATE_EOF).
                        packets::EOF_HEADER => -1,
                        _ => ok.affected_rows as i64,
                    });
                    let client_tracks = self.capabilities & CLIENT_SESSION_TRACK != 0;
                    if switched {
                        // The EXECUTE's own OK reports the switch: nothing waits.
                        self.exchange.owed_schema = None;
                    }
                    if !client_tracks && ok.status & SERVER_SESSION_STATE_CHANGED != 0 {
                        // Without SESSION_TRACK the client gets the same OK minus the
                        // session state (the rest is byte-identical).
                        self.scratch.clear();
                        replaced = frame::frame_into(&mut self.scratch, seq, |out| {
                            ok.encode_into(false, out)
                        });
                    } else if ok.status & SERVER_SESSION_STATE_CHANGED != 0 {
                        // With it, the records the client's own trackers would have
                        // produced; without any, no state block and no flag.
                        let trackers = &self.record.client_trackers;
                        let mut kept = Vec::new();
                        trackers.filter(ok.session_state, &mut kept);
                        if let Some(owed) = self.exchange.owed_schema.as_mut() {
                            if !owed.settle(ok.session_state, &mut kept) {
                                self.exchange.owed_schema = None;
                            }
                        }
                        let flag_only = ok.session_state.is_empty() && !trackers.state_change();
                        if kept != ok.session_state || flag_only {
                            let ok = OkPacket {
                                session_state: &kept,
                                ..ok
                            };
                            self.scratch.clear();
                            replaced = frame::frame_into(&mut self.scratch, seq, |out| {
                                ok.encode_into(true, out)
                            });
                        }
                    }
                }
                Event::Eof(eof) => {
                    let trackers = &self.record.client_trackers;
                    let flagged = eof.status & SERVER_SESSION_STATE_CHANGED != 0;
                    // (The server sets it for clients without CLIENT_SESSION_TRACK too.)
                    let schema_switched = switched && trackers.schema();
                    if flagged && schema_switched {
                        // The client's own schema tracker sets the flag here too.
                        self.exchange.owe_schema(self.record.schema.as_deref());
                    }
                    if flagged && !trackers.state_change() && !schema_switched {
                        // The flag in an EOF, from a change inside a stored program before
                        // its result: holdfast's state-change tracker set it. Cleared unless
                        // the client tracks state changes itself. (A schema or variable
                        // change there would set it under the client's defaults too; the
                        // EOF does not tell which it was.)
                        self.scratch.clear();
                        replaced = frame::frame_into(&mut self.scratch, seq, |out| {
                            let at = out.len();
                            out.extend_from_slice(payload);
                            let status = eof.status & !SERVER_SESSION_STATE_CHANGED;
                            if let Some(s) = out.get_mut(at + 3..at + 5) {
                                s.copy_from_slice(&status.to_le_bytes());
                            }
                        });
                    }
                    self.record.status = eof.status;
                    self.exchange.row_count_left = Some(-1);
                    self.record.last_warnings = eof.warnings;
                    self.record.last_affected_rows = 0;
                }
                Event::Err(e) => {
                    if switched && self.record.client_trackers.schema() {
                        // It may have failed after the switch (or before it: see
                        // `OwedSchema::settle`).
                        self.exchange.owe_schema(self.record.schema.as_deref());
                    }
                    self.exchange.error = Some(e.code);
                    self.exchange.row_count_left = Some(-1);
                    self.record.last_warnings = 1;
                    self.record.last_affected_rows = 0;
                    // The server going away answers (or pre-empts) the command with one of
                    // these before it closes; nothing reached the client, so treat it as a
                    // lost backend.
                    // Unless someone's KILL ended the connection (through holdfast or on
                    // the server, not holdfast's own fence): that ERR is the client's, and
                    // the session ends after it, as a direct connection would.
                    let killed = e.code == ER_CONNECTION_KILLED
                        && (self.killed_on_purpose() || self.killed_by_someone_now());
                    if ready == 0
                        && !self.exchange.started
                        && matches!(
                            e.code,
                            ER_SERVER_SHUTDOWN | ER_CONNECTION_KILLED | ER_CLIENT_IDLE_TIMEOUT
                        )
                        && !killed
                    {
                        return Err(End::BackendLost {
                            started: false,
                            error: ConnError::Closed,
                        });
                    }
                    if killed {
                        self.mark_killed();
                    }
                    self.shared.metrics.count_error(e.code)
                }
                Event::PrepareOk(p) => {
                    let sql = prepare_sql.take().unwrap_or_default();
                    let server = self.server();
                    let verdict =
                        super::request::LossVerdict::of_sql(&sql, self.record.sql_mode, server);
                    let replayable =
                        super::replay::replayable_sql(&sql, self.record.sql_mode, server);
                    let mode = self.record.sql_mode.unwrap_or_default();
                    let flags = classify_for(&sql, mode, server);
                    let read_route = holdfast_sql::read_route(&sql, flags, mode, server);
                    let client_id = self.statements.insert(Statement {
                        backend_id: p.statement_id,
                        sql,
                        params: p.num_params,
                        cursor_open: false,
                        long_data: false,
                        retry_safe: verdict.retry_safe,
                        may_commit: verdict.may_commit,
                        replayable,
                        flags,
                        types: None,
                        types_pending: false,
                        read_route,
                    });
                    self.record.prepared_statements = self.statements.len();
                    // The client sees the statement under holdfast's id.
                    self.scratch.clear();
                    replaced = frame::frame_into(&mut self.scratch, seq, |out| {
                        let at = out.len();
                        out.extend_from_slice(payload);
                        packets::set_statement_id(&mut out[at..], client_id);
                    });
                }
                Event::LocalInfile => is_infile = true,
                Event::None => {}
            }
            if replaced && self.exchange.replaying {
                self.backend.conn.rbuf.advance(ready + wire_len);
                ready = 0;
            } else if replaced {
                // What came before it and the changed packet, in one write.
                let before = self.backend.conn.rbuf.split_to(ready);
                ready = 0;
                self.backend.conn.rbuf.advance(wire_len);
                self.exchange.started = true;
                let n = before.len() + self.scratch.len();
                self.shared.metrics.requests.bytes_to_client(n as u64);
                let mut out = before.chain(&self.scratch[..]);
                self.client
                    .stream
                    .write_all_buf(&mut out)
                    .await
                    .map_err(|e| End::Client(e.into()))?;
            } else {
                ready += wire_len;
            }
            if is_infile && self.exchange.replaying {
                // Never kept for a replay (LOAD DATA LOCAL is not replayable): the client's
                // file is not there to send again.
                return Err(End::Protocol(
                    "a replayed statement asked for a client file".into(),
                ));
            }
            if is_infile
                && (!self.exchange.file_expected || self.info.replica_read.load().is_some())
            {
                // Never passed on: a server asking for a file the statement did not name
                // (a real one asks only for LOAD DATA LOCAL's, and a replica never gets
                // one) would read whatever the client can read. The request is the first
                // packet of its response: what is before it in `ready` is not this one's.
                self.flush(ready - wire_len).await?;
                self.backend.conn.rbuf.advance(wire_len);
                self.refuse_file_request(seq).await?;
                return Ok(self.record.status);
            }
            if is_infile {
                self.flush(ready).await?;
                ready = 0;
                file_sent = Some(self.relay_infile().await?);
            }
        }
        self.flush(ready).await?;
        Ok(m.last_status())
    }

    /// A LOCAL INFILE request the statement did not call for (see `relay_inner`): the client
    /// gets 1148 at `seq`, where the request would have been. A replica's connection is
    /// dropped ([`End::FileRequestRefused`], for the read's caller); the primary's is sent
    /// an empty file and its answer is read and dropped, or, if that answer is not one
    /// OK/ERR, the connection is taken for lost.
    async fn refuse_file_request(&mut self, seq: u8) -> Result<(), End> {
        let replica = self.info.replica_read.load_full();
        let on_replica = replica.is_some();
        // During a replica read `backend` is the replica's but `backend_name` the primary's.
        let node = replica.map_or_else(|| self.backend_name.clone(), |r| r.node.clone());
        tracing::warn!(session = self.info.id, %node, on_replica, "the server asked for a client file (LOCAL INFILE) the statement did not call for; refused, not passed on to the client");
        let error = ClientError::new(
            ErrorKind::FileRequestRefused,
            format!(
                "holdfast: the server {node} asked for a client file (LOCAL INFILE) for a statement that is not LOAD DATA LOCAL; the request was refused and not passed on{}",
                if on_replica {
                    ", and holdfast dropped its connection to that replica"
                } else {
                    ""
                }
            ),
        );
        self.send_error(seq, &error).await?;
        self.exchange.started = true;
        if on_replica {
            return Err(End::FileRequestRefused);
        }
        let empty = [0u8, 0, 0, seq.wrapping_add(1)];
        let answered = match self.backend.conn.write_raw_watching(&empty).await {
            Ok(()) => match self.read_backend_packet().await {
                Ok(p) => match p.payload.first() {
                    Some(&packets::ERR_HEADER) => true,
                    Some(&packets::OK_HEADER) => {
                        let tracks = self.backend.capabilities & CLIENT_SESSION_TRACK != 0;
                        OkPacket::parse(&p.payload, tracks)
                            .is_ok_and(|ok| ok.status & SERVER_MORE_RESULTS_EXISTS == 0)
                    }
                    _ => false,
                },
                Err(End::Client(e)) => return Err(End::Client(e)),
                Err(_) => false,
            },
            Err(_) => false,
        };
        if !answered {
            self.mark_backend_dead();
        }
        Ok(())
    }

    /// LOCAL INFILE: the client's file goes to the backend up to its empty packet; returns
    /// the sequence id of the answer the client then waits for. A backend lost meanwhile
    /// ends the exchange properly: the rest of the file is read and dropped (never taken
    /// for commands) and [`End::BackendLostDuringFile`] says where the client's answer goes.
    async fn relay_infile(&mut self) -> Result<u8, End> {
        loop {
            let (chunk, last, reply_seq) = self.next_file_packet().await?;
            if let Err(error) = self.backend.conn.write_raw_watching(&chunk).await {
                let reply_seq = match last {
                    true => reply_seq,
                    false => self.skip_file().await?,
                };
                return Err(End::BackendLostDuringFile { error, reply_seq });
            }
            if last {
                return Ok(reply_seq);
            }
        }
    }

    /// Reads the client's file up to its empty packet without sending it anywhere; returns
    /// the sequence id of the answer that follows.
    async fn skip_file(&mut self) -> Result<u8, End> {
        loop {
            let (_, last, reply_seq) = self.next_file_packet().await?;
            if last {
                return Ok(reply_seq);
            }
        }
    }

    /// The client's next LOCAL INFILE packet (whole, headers included), whether it is the
    /// empty one that ends the file, and the sequence id of what follows it.
    async fn next_file_packet(&mut self) -> Result<(BytesMut, bool, u8), End> {
        let max = self.shared.config().proxy.max_packet_size;
        let wire_len = self.client.buffer_packet(max).await.map_err(End::Client)?;
        let chunk = self.client.rbuf.split_to(wire_len);
        self.shared
            .metrics
            .requests
            .bytes_from_client(wire_len as u64);
        let last = parse_header(&chunk).is_some_and(|h| h.len == 0);
        let next = reply_seq(&chunk);
        Ok((chunk, last, next))
    }

    async fn statement_command(
        &mut self,
        cmd: u8,
        reply: Reply,
        request: &mut BytesMut,
        reply_seq: u8,
    ) -> Result<(), End> {
        let Some(client_id) = packets::statement_id(&request[HEADER_LEN..]) else {
            if reply == Reply::None {
                return Ok(());
            }
            return self
                .send_error(reply_seq, &ClientError::malformed("no statement id"))
                .await;
        };
        // MariaDB's id -1: the statement prepared last (MariaDB Connectors send a prepare
        // and its execute together). holdfast names it explicitly: its own statements
        // may have been prepared on the backend since.
        let client_id = self.statements.resolve(client_id);
        let Some(stmt) = self.statements.get_mut(client_id) else {
            // The server sends nothing back for these two, whatever the id.
            if reply == Reply::None {
                return Ok(());
            }
            let msg = format!(
                "Unknown prepared statement handler ({client_id}) given to {}",
                name(cmd)
            );
            return self
                .send_error_kind(reply_seq, ErrorKind::UnknownStatement, msg)
                .await;
        };
        packets::set_statement_id(&mut request[HEADER_LEN..], stmt.backend_id);
        match cmd {
            COM_STMT_CLOSE => {
                // Forgotten before it is forwarded: a close lost with its backend still
                // closes it (it is not prepared again on the next one).
                if let Some(log) = self.txn_log.as_mut() {
                    log.statement_closed(client_id);
                }
                self.statements.remove(client_id);
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
                self.relay(reply).await?;
                self.recount_statement_state();
                Ok(())
            }
            COM_STMT_BULK_EXECUTE => {
                // MariaDB's array binding: one request, one OK for all its rows. Not run
                // again after a lost backend (it writes).
                stmt.long_data = false;
                self.forward(request).await?;
                self.relay(reply).await?;
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
                let stand_in = self.execute_stand_in(client_id, request).await?;
                self.forward(request).await?;
                let status = self.relay_inner(reply, None, wants_cursor).await?;
                if let Some(id) = stand_in {
                    // No reply; a failure shows with the next request.
                    let close = super::split::close_statement(id);
                    let _ = self.backend.conn.write_packet(&close, 0).await;
                }
                if let Some(stmt) = self.statements.get_mut(client_id) {
                    stmt.cursor_open = wants_cursor && status & SERVER_STATUS_CURSOR_EXISTS != 0;
                }
                self.recount_statement_state_after(wants_cursor);
                Ok(())
            }
            _ => {
                // COM_STMT_FETCH
                self.forward(request).await?;
                let status = self.relay_inner(reply, None, false).await?;
                if status & SERVER_STATUS_LAST_ROW_SENT != 0 {
                    if let Some(stmt) = self.statements.get_mut(client_id) {
                        stmt.cursor_open = false;
                    }
                }
                self.recount_statement_state_after(false);
                Ok(())
            }
        }
    }

    /// Forgets the statement a COM_STMT_CLOSE names, without telling any backend.
    pub(super) fn forget_statement(&mut self, request: &[u8]) {
        if let Some(id) = request.get(HEADER_LEN..).and_then(packets::statement_id) {
            if let Some(log) = self.txn_log.as_mut() {
                log.statement_closed(self.statements.resolve(id));
            }
            self.statements.remove(id);
            self.record.prepared_statements = self.statements.len();
        }
    }

    /// A COM_STMT_EXECUTE that holdfast refuses before it reaches the backend (its
    /// transaction was lost) still does what the server's own execute does, failed or not:
    /// the parameter types it sends are remembered (the client's next execute may leave
    /// them out), and its statement's long data ends: the backend drops what it holds
    /// (COM_STMT_RESET), so the client's next try does not send it twice.
    pub(super) async fn execute_refused(&mut self, request: &[u8]) {
        if request.get(HEADER_LEN) != Some(&COM_STMT_EXECUTE) {
            return;
        }
        let id = request.get(HEADER_LEN..).and_then(packets::statement_id);
        let Some(stmt) = id.and_then(|id| self.statements.get_mut(id)) else {
            return;
        };
        let _ = bind_types(stmt, request);
        // The backend has not seen them: the next execute carries them.
        stmt.types_pending = stmt.params > 0 && stmt.types.is_some();
        if !stmt.long_data {
            return;
        }
        stmt.long_data = false;
        let mut reset = vec![COM_STMT_RESET];
        reset.extend_from_slice(&stmt.backend_id.to_le_bytes());
        self.recount_statement_state();
        let conn = &mut self.backend.conn;
        let answered = match conn.write_packet(&reset, 0).await {
            Ok(()) => {
                conn.read_packet(self.shared.config().proxy.max_packet_size)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(error) = answered {
            tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost while dropping long data");
            self.mark_backend_dead();
        }
    }

    /// [`Session::recount_statement_state`] after an execute or a fetch, which changes only
    /// its own statement's flags: nothing to count when no cursor was open, no long data
    /// pending and none could open (`could_open_cursor`). The count walks every prepared
    /// statement (sysbench's sessions hold about 180), the most expensive thing holdfast
    /// did per execute (2.2% of its CPU in a read_write profile).
    fn recount_statement_state_after(&mut self, could_open_cursor: bool) {
        if could_open_cursor || self.record.open_cursors > 0 || self.record.pending_long_data {
            self.recount_statement_state();
        }
    }

    fn recount_statement_state(&mut self) {
        self.record.open_cursors = self.statements.open_cursors();
        self.record.pending_long_data = self.statements.pending_long_data();
        self.record.prepared_statements = self.statements.len();
    }
}
