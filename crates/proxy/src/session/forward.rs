//! The forward and observe phase: a request goes to the backend and its response streams
//! back to the client. Only the packets that carry state (OK, EOF, ERR, PREPARE-OK, the
//! column count) are parsed, to keep the session record current; rows and column
//! definitions pass through in the reads they arrived in.
//!
//! What a client waits for after each command is its [`Reply`] shape, decided in one place
//! from the command byte. It decides what holdfast relays and what it owes the client when
//! the backend is lost: nothing at all for a command without a reply, one ERR after the
//! client's file for a LOCAL INFILE exchange, the command run again or an ERR otherwise.

use super::statements::Statement;
use super::{End, Session};
use crate::backend::BackendError;
use crate::conn::{ConnError, PacketConn};
use crate::error::code::{ER_CLIENT_IDLE_TIMEOUT, ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN};
use crate::error::{ClientError, ErrorKind};
use crate::state::SessionRecord;
use bytes::{Buf, Bytes, BytesMut};
use holdfast_sql::{
    classify_for, first_keyword, own_password_change, Classification as C, PasswordChange, Server,
    SqlMode,
};
use holdfast_wire::caps::*;
use holdfast_wire::command::*;
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use holdfast_wire::packets::{self, OkPacket};
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::hash::Hasher;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The shape of the reply a command gets: what the client waits for, so what holdfast
/// relays and what the client is owed if the backend is lost before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// Nothing at all: COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA (and COM_QUIT, which ends
    /// the session). The client sends its next command without reading anything, so
    /// holdfast must never answer these, not even with an error.
    None,
    /// Exactly one packet of any shape (COM_STATISTICS).
    OnePacket,
    /// OK or ERR (COM_SET_OPTION: EOF): COM_PING, COM_INIT_DB, COM_RESET_CONNECTION,
    /// COM_STMT_RESET...
    Status,
    /// OK, ERR, or result sets (COM_QUERY, COM_STMT_EXECUTE, COM_PROCESS_INFO). The server
    /// may instead ask for a LOCAL INFILE file: the client then sends it, up to an empty
    /// packet, and waits for OK or ERR at the sequence id that follows that packet.
    ResultSets,
    /// PREPARE-OK with its definitions, or ERR (COM_STMT_PREPARE).
    Prepare,
    /// Rows then EOF, or ERR (COM_STMT_FETCH).
    Fetch,
    /// Column definitions then EOF, or ERR (COM_FIELD_LIST).
    FieldList,
    /// An authentication exchange, then OK or ERR (COM_CHANGE_USER).
    Authentication,
    /// A command holdfast does not forward: it answers with ERR itself.
    Refused,
}

impl Reply {
    pub(super) fn of(cmd: u8) -> Reply {
        match cmd {
            COM_QUIT | COM_STMT_CLOSE | COM_STMT_SEND_LONG_DATA => Reply::None,
            COM_STATISTICS => Reply::OnePacket,
            COM_INIT_DB | COM_PING | COM_SET_OPTION | COM_PROCESS_KILL | COM_DEBUG
            | COM_REFRESH | COM_CREATE_DB | COM_DROP_DB | COM_RESET_CONNECTION | COM_STMT_RESET => {
                Reply::Status
            }
            COM_QUERY | COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE | COM_PROCESS_INFO => {
                Reply::ResultSets
            }
            COM_STMT_PREPARE => Reply::Prepare,
            COM_STMT_FETCH => Reply::Fetch,
            COM_FIELD_LIST => Reply::FieldList,
            COM_CHANGE_USER => Reply::Authentication,
            _ => Reply::Refused,
        }
    }

    /// The reply shape of a whole request (`None` for an empty one).
    pub(super) fn of_request(request: &[u8]) -> Option<Reply> {
        request.get(HEADER_LEN).map(|&cmd| Reply::of(cmd))
    }

    /// How the backend's answer is followed (`None`: there is no answer to relay).
    fn expect(self) -> Option<Expect> {
        match self {
            Reply::None | Reply::Authentication | Reply::Refused => None,
            Reply::OnePacket => Some(Expect::OnePacket),
            Reply::Status => Some(Expect::Status),
            Reply::ResultSets => Some(Expect::ResultSets),
            Reply::Prepare => Some(Expect::Prepare),
            Reply::Fetch => Some(Expect::Fetch),
            Reply::FieldList => Some(Expect::FieldList),
        }
    }
}

/// Statements whose effects on the session holdfast cannot read from their text: a
/// procedure, dynamic SQL, a compound statement, text whose meaning depends on the server's
/// version.
const OPAQUE: C = C::CALL
    .union(C::EXECUTE_SQL)
    .union(C::COMPOUND)
    .union(C::UNCERTAIN);

/// How long a request runs before holdfast watches its client's connection: a quick
/// response never pays for the watch.
const WATCH_CLIENT_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

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
}

/// A backend read, or why the wait for it stopped.
enum Watched {
    Read(ConnError),
    Interrupted(Interrupt),
}

/// Once `watch` has fired (a request running that long): resolves when the client goes
/// away ([`client_gone`]) or the topology says a failover moved away from `node`. The
/// topology is followed on a clone of the receiver: the session's own still sees the
/// change afterwards.
async fn watch_request(
    client: &mut PacketConn,
    topology: &tokio::sync::watch::Receiver<std::sync::Arc<crate::topology::Topology>>,
    node: &str,
    mut watch: std::pin::Pin<&mut tokio::time::Sleep>,
) -> Interrupt {
    watch.as_mut().await;
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
    }
}

/// The sequence id of the reply to a request: one after its last chunk's.
pub(super) fn reply_seq(request: &[u8]) -> u8 {
    match frame::scan_logical(request, usize::MAX) {
        frame::Scan::Complete { last_seq, .. } => last_seq.wrapping_add(1),
        _ => parse_header(request).map_or(1, |h| h.seq.wrapping_add(1)),
    }
}

impl Session {
    /// The servers a statement of the session may run on, as far as reading executable
    /// comments goes: its backend (by that server's greeting) and every node whose version
    /// the monitor knows (a split session's reads, a move after a failover).
    pub(super) fn server(&self) -> Server {
        let own = Server::from_version(&self.backend.greeting.server_version);
        match self.topology.borrow().node_servers {
            Some(nodes) => own.or(nodes),
            None => own,
        }
    }

    /// Forwards one request and relays its response. A backend lost before any of the
    /// response reached the client is hidden: the session moves and the request runs again
    /// when that is safe, or the client learns what became of it.
    pub(super) async fn forward_request(&mut self, mut request: BytesMut) -> Result<(), End> {
        let Some(header) = parse_header(&request) else {
            return Err(End::Protocol("empty request".into()));
        };
        let reply_seq = reply_seq(&request);
        let reply = Reply::of_request(&request);
        let in_transaction = self.record.in_transaction();
        // Between requests the timer is the idle probe; during one, the wait after which
        // holdfast watches for the client going away.
        self.idle_timer
            .as_mut()
            .reset(tokio::time::Instant::now() + WATCH_CLIENT_AFTER);
        // The session's sql_mode before the statement runs (it may change it).
        let mode = self.record.sql_mode;
        let held = Held::of(&self.record);
        // A COM_QUERY is classified once, here, for both the record and retry safety (from
        // its first frame: a longer one is never retried), under the session's sql_mode
        // (the default one while the session has not set its own).
        // Executable comments are read as the nodes the session may run on read them.
        let server = self.server();
        let query = query_text(&request).map(|sql| {
            let flags = classify_for(sql, mode.unwrap_or_default(), server);
            self.note_query(flags, sql);
            flags
        });
        // Only LOAD DATA|XML LOCAL makes a server ask for a client file (it cannot be
        // prepared nor run inside a stored program); text not classified (longer than one
        // frame) is given the benefit of the doubt.
        self.file_request_expected = match query {
            Some(flags) => flags.intersects(C::LOAD_DATA_LOCAL.union(C::UNCERTAIN)),
            None => request.get(HEADER_LEN) == Some(&COM_QUERY),
        };
        // What is cheap to know now; the rest only if the backend is lost.
        let retry = !in_transaction
            && !header.continues()
            && match query {
                Some(flags) => retry_safe_flags(flags),
                None => self.retry_safe_command(&request),
            };
        let statement_commits = in_transaction && query.is_none() && self.commits_command(&request);
        // Statement commands carry the backend's statement id once forwarded: a retry on
        // another backend starts again from the client's.
        let client_statement = packets::statement_id(&request[HEADER_LEN..]);
        let mentions_trackers = query.is_some()
            && !self.record.untracked
            && query_text(&request).is_some_and(mentions_trackers);
        if let Some(plan) = self.pinned_plan(&request, query) {
            return Box::pin(self.run_pinned(plan, request, reply_seq)).await;
        }
        if self.split.is_some() && kill_free(query, &request) {
            if !mentions_trackers {
                if let Some(target) = self.read_target(&request, query) {
                    match Box::pin(self.read_on_replica(target, request)).await? {
                        super::split::ReadOutcome::Done => return Ok(()),
                        super::split::ReadOutcome::Primary(r) => request = r,
                    }
                }
            }
            self.split_follow(&request).await;
        }
        // Balancing by load counts the primary's requests too.
        let _on_primary = self.split.as_mut().and_then(|s| s.on_primary());
        let tracked = match query {
            Some(flags) if flags.has(C::SET_TRANSACTION) => self.track_transactions().await,
            // A statement that reads the trackers' settings (`@@session_track_...`, `SHOW
            // VARIABLES LIKE 'session_track%'`) reads the client's, not holdfast's; a SET
            // of one of them is read back after it runs. Not for several statements in one
            // (holdfast would not see their changes outside the client's trackers).
            Some(flags)
                if mentions_trackers && !flags.intersects(C::SET_SESSION_VAR.union(C::MULTI)) =>
            {
                self.show_client_trackers().await
            }
            _ => Ok(()),
        };
        let mut by_value = None;
        let kill = if query.is_some_and(|f| f.intersects(C::KILL.union(C::EXECUTE_SQL)))
            || request.get(HEADER_LEN) == Some(&COM_PROCESS_KILL)
            || request.get(HEADER_LEN) == Some(&COM_STMT_EXECUTE)
        {
            match self.plan_kill(&mut request, query) {
                Ok(super::kill::KillPlan::Forward(mark)) => mark,
                Ok(super::kill::KillPlan::ByValue(kill)) => {
                    by_value = Some(kill);
                    None
                }
                Ok(super::kill::KillPlan::OnReplica(read)) => {
                    return self.answer_kill_of_replica_read(&read, reply_seq).await;
                }
                Err(e) => return self.send_error(reply_seq, &e).await,
            }
        } else {
            None
        };
        // A statement's text and flags, whether sent as text or prepared and executed
        // (looked up only when replay or markers need them).
        // Looked up for every execute: what its text does to the session (a temporary
        // table, a named lock, user variables) is noted as a text statement's is.
        let executed = match query {
            None => self.executed_statement(&request),
            _ => None,
        };
        if let Some((sql, flags)) = &executed {
            self.note_query(*flags, sql);
        }
        let flags = query.or(executed.as_ref().map(|(_, f)| *f));
        // Code holdfast does not see into: a state change it reports is explained later
        // (by the user variables a capture reads) or makes the session's state unknown.
        let opaque = flags.is_some_and(|f| f.intersects(OPAQUE));
        self.record.state_change_reported = false;
        let kept = self.replay_before(&request, flags, in_transaction);
        self.note_writes(flags);
        let sql = query_text(&request).or(executed.as_ref().map(|(sql, _)| &sql[..]));
        let (marked, wrapped) = match (flags, sql) {
            (Some(flags), Some(sql)) => (
                self.marks_commit(sql, flags, in_transaction),
                self.wraps_autocommit(sql, flags, in_transaction, &request),
            ),
            _ => (false, false),
        };
        let result = match tracked {
            Ok(()) if marked => self.commit_with_marker(&request).await,
            Ok(()) if wrapped => self.autocommit_with_marker(&request).await,
            Ok(()) => match by_value {
                Some(kill) => self.kill_by_value(&request, kill, reply_seq).await,
                None => self.command(&mut request).await,
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => self.replay_after(kept),
            Err(_) => self.checksum = None,
        }
        // A request that failed may have stopped before what it would have released (a
        // multi-statement ends at its first error: `...; UNLOCK TABLES` after a failing
        // statement does not run): what was held before is still held, as far as holdfast
        // can tell (keeping a blocker too long only costs a wrap or a move).
        if self.last_error.is_some() {
            held.keep(&mut self.record);
        }
        let marked = self.take_marked();
        if result.is_ok() {
            self.markers_after();
        }
        if opaque && self.record.state_change_reported {
            self.record.opaque_change = true;
            self.record.capture_due = true;
        }
        if let Some(mark) = kill {
            self.settle_kill(mark, self.last_error);
        }
        if query.is_some_and(|f| f.intersects(C::PREPARE_SQL.union(C::DEALLOCATE_SQL))) {
            if let Some(sql) = query_text(&request) {
                let ok = result.is_ok() && self.last_error.is_none();
                self.note_sql_prepared(sql, ok);
            }
        }
        // SET PASSWORD and ALTER USER are implicit commits to the classifier: nothing more
        // is read for any other statement.
        if result.is_ok()
            && self.last_error.is_none()
            && query.is_some_and(|f| f.has(C::IMPLICIT_COMMIT))
        {
            if let Some(sql) = query_text(&request) {
                self.note_password_change(sql, mode.unwrap_or_default());
            }
        }
        // Killed: this command found its connection gone, or got the server's 1927 (the
        // killer's own connection). A session marked by someone's `KILL` after its command
        // was answered but before it got here goes on: it ends when it sees its connection
        // go (while idle, or with its next command).
        if self.killed_on_purpose()
            && (result.is_err() || self.last_error == Some(ER_CONNECTION_KILLED))
        {
            return Err(self.killed(result));
        }
        // After a statement that set or read the trackers' settings: holdfast's back (the
        // client's new ones are read first: narrowing session_track_system_variables is
        // not reported, the variable is no longer in the list when the report is made).
        if result.is_ok()
            && !self.record.untracked
            && (mentions_trackers || self.record.trackers_overridden)
        {
            self.reassert_trackers().await?;
        }
        match result {
            // The client waits for nothing: it must get nothing, not even an error.
            Err(End::BackendLost {
                started: false,
                error,
            }) if reply == Some(Reply::None) => {
                self.lost_without_reply(&request, error);
                Ok(())
            }
            // The client's file was read to its end, none of it run: one ERR answers it.
            Err(End::BackendLostDuringFile { error, reply_seq }) => {
                let lost = super::migrate::Lost {
                    in_transaction,
                    commit: false,
                    replay: false,
                };
                Box::pin(self.recover_lost_request(error, None, reply_seq, lost)).await
            }
            // A marked COMMIT or autocommit write: its marker tells what became of it.
            Err(End::BackendLost {
                started: false,
                error,
            }) if let Some(m) = marked => {
                held.restore(&mut self.record);
                Box::pin(self.recover_lost_marked(error, request, reply_seq, m)).await
            }
            Err(End::BackendLost {
                started: false,
                error,
            }) => {
                held.restore(&mut self.record);
                let (retry, commit) = match (query, query_text(&request)) {
                    (Some(flags), Some(sql)) => {
                        let verdict = LossVerdict::of(sql, flags, mode, server);
                        (retry && verdict.retry_safe, verdict.may_commit)
                    }
                    _ => (retry, statement_commits),
                };
                // Inside a transaction: run again after the transaction is replayed, if it
                // can be (not when the statement may have committed it).
                let replay = in_transaction && !commit && self.can_replay();
                let retry = (retry || replay).then(|| {
                    if let (Some(id), Some(&cmd)) = (client_statement, request.get(HEADER_LEN)) {
                        if is_statement_command(cmd) {
                            packets::set_statement_id(&mut request[HEADER_LEN..], id);
                        }
                    }
                    request
                });
                let lost = super::migrate::Lost {
                    in_transaction,
                    commit,
                    replay,
                };
                Box::pin(self.recover_lost_request(error, retry, reply_seq, lost)).await
            }
            other => other,
        }
    }

    /// The text and flags of the prepared statement a COM_STMT_EXECUTE or bulk execute
    /// runs (a bulk execute counts as a write whatever its text).
    fn executed_statement(&self, request: &[u8]) -> Option<(Bytes, C)> {
        let cmd = *request.get(HEADER_LEN)?;
        if cmd != COM_STMT_EXECUTE && cmd != COM_STMT_BULK_EXECUTE {
            return None;
        }
        let id = self
            .statements
            .resolve(packets::statement_id(&request[HEADER_LEN..])?);
        let stmt = self.statements.get(id)?;
        let flags = match cmd {
            COM_STMT_BULK_EXECUTE => stmt.flags.union(C::WRITE).difference(C::READ_ONLY),
            _ => stmt.flags,
        };
        Some((stmt.sql.clone(), flags))
    }

    /// Whether a command other than COM_QUERY, lost with its backend outside a transaction,
    /// may run again on another node.
    fn retry_safe_command(&self, request: &[u8]) -> bool {
        let Some(&cmd) = request.get(HEADER_LEN) else {
            return false;
        };
        match cmd {
            COM_PING | COM_INIT_DB | COM_STMT_PREPARE | COM_STMT_RESET | COM_STATISTICS
            | COM_FIELD_LIST => true,
            COM_STMT_EXECUTE => packets::statement_id(&request[HEADER_LEN..])
                .and_then(|id| self.statements.get(id))
                .is_some_and(|s| s.retry_safe),
            _ => false,
        }
    }

    /// Whether a command other than COM_QUERY, lost with its backend inside a transaction,
    /// may have committed it: the execute of a prepared statement that may commit.
    fn commits_command(&self, request: &[u8]) -> bool {
        request.get(HEADER_LEN) == Some(&COM_STMT_EXECUTE)
            && packets::statement_id(&request[HEADER_LEN..])
                .and_then(|id| self.statements.get(id))
                .is_some_and(|s| s.may_commit)
    }

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
        self.response_started = false;
        self.last_error = None;
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

    /// Turns the transaction tracker on before the session's first `SET TRANSACTION`
    /// (see [`crate::restore::TRACK_TRANSACTIONS`]). A `SET` without tables: it leaves the warnings
    /// and `FOUND_ROWS()` as they were and `ROW_COUNT()` at 0, as the client's `SET
    /// TRANSACTION` right after it does anyway.
    async fn track_transactions(&mut self) -> Result<(), End> {
        if self.tracks_transactions || self.record.untracked || self.backend_dead {
            return Ok(());
        }
        match crate::restore::execute(
            &mut self.backend,
            crate::restore::TRACK_TRANSACTIONS.as_bytes(),
        )
        .await
        {
            Ok(_) => self.tracks_transactions = true,
            Err(BackendError::Conn(error)) => {
                return Err(End::BackendLost {
                    started: false,
                    error,
                })
            }
            Err(e) => {
                tracing::info!(session = self.info.id, error = %e, "cannot track next-transaction characteristics");
            }
        }
        Ok(())
    }

    /// Gives the backend session the client's own tracker settings for one statement
    /// ([`Session::reassert_trackers`] puts holdfast's back after it), keeping
    /// `FOUND_ROWS()` and `ROW_COUNT()`.
    async fn show_client_trackers(&mut self) -> Result<(), End> {
        if self.backend_dead {
            return Ok(());
        }
        let lost = |e: crate::restore::CaptureError| match e {
            crate::restore::CaptureError::Backend(BackendError::Conn(e)) => End::Backend(e),
            e => End::Protocol(format!("giving the session the client's trackers: {e}")),
        };
        let before = crate::restore::read_diagnostics(&mut self.backend)
            .await
            .map_err(lost)?;
        let set = self.record.client_trackers.set_statement();
        crate::restore::execute(&mut self.backend, set.as_bytes())
            .await
            .map_err(|e| lost(e.into()))?;
        crate::restore::put_back_diagnostics(&mut self.backend, before)
            .await
            .map_err(lost)
    }

    /// Reads the client's new `session_track_*` settings after it set one of them, and
    /// puts holdfast's trackers back (the client is shown what its own settings produce,
    /// see [`crate::client_trackers`]). A `SELECT` without tables and `SET`s keep the
    /// warnings; `FOUND_ROWS()` and `ROW_COUNT()` are read before and put back after.
    async fn reassert_trackers(&mut self) -> Result<(), End> {
        self.record.trackers_overridden = false;
        if self.backend_dead {
            return Ok(());
        }
        let lost = |e: crate::restore::CaptureError| match e {
            crate::restore::CaptureError::Backend(BackendError::Conn(e)) => End::Backend(e),
            e => End::Protocol(format!("restoring holdfast's session trackers: {e}")),
        };
        let before = crate::restore::read_diagnostics(&mut self.backend)
            .await
            .map_err(lost)?;
        let names = [
            "session_track_system_variables",
            "session_track_schema",
            "session_track_state_change",
            "session_track_transaction_info",
        ];
        let select = format!(
            "SELECT @@session.{}{}",
            names.join(", @@session."),
            crate::restore::NO_LIMIT
        );
        let values = crate::restore::execute(&mut self.backend, select.as_bytes())
            .await
            .map_err(|e| lost(e.into()))?;
        // A value that differs from holdfast's own is the client's; one that does not was
        // either not set by it or reported when it was (under holdfast's `*`).
        let transaction_info: &[u8] = match self.tracks_transactions {
            true => b"CHARACTERISTICS",
            false => b"OFF",
        };
        let holdfasts: [&[u8]; 4] = [b"*", b"1", b"1", transaction_info];
        if let Some(row) = values.rows.first() {
            for ((name, value), own) in names.iter().zip(row).zip(holdfasts) {
                let value = value.as_deref().unwrap_or_default();
                if !value.eq_ignore_ascii_case(own) {
                    self.record.client_trackers.set(name.as_bytes(), value);
                }
            }
        }
        let mut statements = vec![holdfast_client::ENABLE_TRACKERS];
        if self.tracks_transactions {
            statements.push(crate::restore::TRACK_TRANSACTIONS);
        }
        for sql in statements {
            crate::restore::execute(&mut self.backend, sql.as_bytes())
                .await
                .map_err(|e| lost(e.into()))?;
        }
        crate::restore::put_back_diagnostics(&mut self.backend, before)
            .await
            .map_err(lost)
    }

    pub(super) fn note_query(&mut self, flags: C, sql: &[u8]) {
        let r = &mut self.record;
        if flags.intersects(
            C::LAST_INSERT_ID_CALL
                .union(C::SET_USER_VAR)
                .union(C::SET_SESSION_VAR)
                .union(C::CALL)
                .union(C::EXECUTE_SQL)
                .union(C::COMPOUND)
                .union(C::UNCERTAIN),
        ) {
            r.capture_due = true;
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

    /// After a statement that succeeded: if it changed the session's own password, the
    /// secret holdfast logs in again with follows (or, for a password holdfast cannot
    /// know, the session is marked as unable to log in again: a move then closes it with
    /// that reason rather than failing a login).
    fn note_password_change(&mut self, sql: &[u8], mode: SqlMode) {
        let maybe = first_keyword(sql)
            .is_some_and(|k| k.eq_ignore_ascii_case(b"SET") || k.eq_ignore_ascii_case(b"ALTER"));
        if !maybe {
            return;
        }
        let Some(change) = own_password_change(sql, mode, self.user.as_bytes()) else {
            return;
        };
        let can = match change {
            PasswordChange::Plain(p) => {
                let p = zeroize::Zeroizing::new(p);
                // An empty password has no secret (as at login).
                self.secret =
                    (!p.is_empty()).then(|| holdfast_wire::auth::PasswordHash::from_password(&p));
                true
            }
            PasswordChange::Other => {
                self.secret = None;
                false
            }
        };
        tracing::info!(
            session = self.info.id,
            can_log_in_again = can,
            "the session changed its own password"
        );
        if self.can_reauthenticate && !can {
            self.shared.metrics.sessions_passthrough_auth.inc();
        } else if !self.can_reauthenticate && can {
            self.shared.metrics.sessions_passthrough_auth.dec();
        }
        self.can_reauthenticate = can;
        self.info.can_reauthenticate.store(can, Ordering::Relaxed);
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
        if self.replaying {
            // A replayed answer was compared, not sent: the client has it already.
            self.backend.conn.rbuf.advance(n);
            return Ok(());
        }
        let client = |e: std::io::Error| End::Client(e.into());
        if n > 0 {
            let chunk = self.backend.conn.rbuf.split_to(n);
            self.response_started = true;
            self.shared.metrics.requests.bytes_to_client(n as u64);
            self.client.stream.write_all(&chunk).await.map_err(client)?;
        }
        self.client.stream.flush().await.map_err(client)
    }

    /// Reads more from the backend. A loss is returned to the caller, which decides whether
    /// the command can be re-run elsewhere or must fail. `file_answer`: the client has sent
    /// a LOCAL INFILE file and waits for its answer at this sequence id.
    async fn fill_backend(&mut self, file_answer: Option<u8>) -> Result<(), End> {
        let filled = tokio::select! {
            biased;
            r = self.backend.conn.fill() => r.map(|_| ()).map_err(Watched::Read),
            gone = watch_request(
                &mut self.client,
                &self.topology,
                &self.backend_name,
                self.idle_timer.as_mut(),
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
                    started: self.response_started,
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
            Interrupt::Deposed => {
                tracing::warn!(session = self.info.id, node = %self.backend_name, "the node was failed over away from with a request in flight; its answer is not taken");
                Ok(ConnError::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the node was failed over away from",
                )))
            }
        }
    }

    /// Reads one packet of an answer holdfast reads itself (a commit marker's exchange),
    /// watched as [`Session::fill_backend`] watches: a client that goes away, a node that
    /// was failed over away from (its answer is not taken). A backend error is
    /// [`End::BackendLost`] before the client got anything.
    pub(super) async fn read_backend_packet(&mut self) -> Result<crate::conn::Packet, End> {
        let max = self.shared.config.proxy.max_packet_size;
        let read = tokio::select! {
            biased;
            r = self.backend.conn.read_packet(max) => r.map_err(Watched::Read),
            gone = watch_request(
                &mut self.client,
                &self.topology,
                &self.backend_name,
                self.idle_timer.as_mut(),
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
                if let Some(h) = self.checksum.as_deref_mut() {
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
                            if let Some(sum) = self.checksum.as_deref_mut() {
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
            let event = m
                .on_packet(payload)
                .map_err(|e| End::Protocol(format!("backend sent a malformed response: {e}")))?;
            if let Some(sum) = self.checksum.as_deref_mut() {
                super::replay::checksum_event(sum, &event, payload);
            }
            // A packet the client must see changed is framed into `scratch` (reused).
            let mut replaced = false;
            let mut is_infile = false;
            match event {
                Event::Ok(ok) => {
                    // First: the OK of a client's SET session_track_... already counts.
                    observe_ok(&mut self.record, &ok);
                    let client_tracks = self.capabilities & CLIENT_SESSION_TRACK != 0;
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
                        let flag_only = ok.session_state.is_empty() && !trackers.state_change();
                        if kept.len() != ok.session_state.len() || flag_only {
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
                    if eof.status & SERVER_SESSION_STATE_CHANGED != 0
                        && !self.record.client_trackers.state_change()
                    {
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
                    self.record.last_warnings = eof.warnings;
                    self.record.last_affected_rows = 0;
                }
                Event::Err(e) => {
                    self.last_error = Some(e.code);
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
                        && !self.response_started
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
                    let verdict = LossVerdict::of_sql(&sql, self.record.sql_mode, server);
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
            if replaced && self.replaying {
                self.backend.conn.rbuf.advance(ready + wire_len);
                ready = 0;
            } else if replaced {
                // What came before it and the changed packet, in one write.
                let before = self.backend.conn.rbuf.split_to(ready);
                ready = 0;
                self.backend.conn.rbuf.advance(wire_len);
                self.response_started = true;
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
            if is_infile && self.replaying {
                // Never kept for a replay (LOAD DATA LOCAL is not replayable): the client's
                // file is not there to send again.
                return Err(End::Protocol(
                    "a replayed statement asked for a client file".into(),
                ));
            }
            if is_infile && (!self.file_request_expected || self.info.replica_read.load().is_some())
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
        self.response_started = true;
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
        let max = self.shared.config.proxy.max_packet_size;
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
                self.forward(request).await?;
                let status = self.relay_inner(reply, None, wants_cursor).await?;
                if let Some(stmt) = self.statements.get_mut(client_id) {
                    stmt.cursor_open = wants_cursor && status & SERVER_STATUS_CURSOR_EXISTS != 0;
                }
                self.recount_statement_state();
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
                self.recount_statement_state();
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
                conn.read_packet(self.shared.config.proxy.max_packet_size)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(error) = answered {
            tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost while dropping long data");
            self.mark_backend_dead();
        }
    }

    fn recount_statement_state(&mut self) {
        self.record.open_cursors = self.statements.open_cursors();
        self.record.pending_long_data = self.statements.pending_long_data();
        self.record.prepared_statements = self.statements.len();
    }
}

/// Not a KILL (those are mapped to backend threads on the primary connection).
fn kill_free(query: Option<C>, request: &[u8]) -> bool {
    !query.is_some_and(|f| f.has(C::KILL)) && request.get(HEADER_LEN) != Some(&COM_PROCESS_KILL)
}

/// Whether a statement's text has `session_track` in it (any case): a look at the bytes
/// around each `_` only.
fn mentions_trackers(sql: &[u8]) -> bool {
    const WORD: &[u8] = b"session_track";
    const UNDERSCORE_AT: usize = 7;
    sql.iter().enumerate().any(|(i, &b)| {
        b == b'_'
            && i >= UNDERSCORE_AT
            && sql
                .get(i - UNDERSCORE_AT..i - UNDERSCORE_AT + WORD.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(WORD))
    })
}

/// Records what an OK packet says.
pub(super) fn observe_ok(record: &mut SessionRecord, ok: &OkPacket<'_>) {
    record.status = ok.status;
    record.last_warnings = ok.warnings;
    record.last_affected_rows = ok.affected_rows;
    if ok.last_insert_id != 0 {
        record.last_insert_id = ok.last_insert_id;
    }
    if !ok.session_state.is_empty() {
        record.apply_session_state(ok.session_state);
    }
}

/// Remembers the parameter types a COM_STMT_EXECUTE sends, and puts them back into an execute
/// that relies on the server remembering them when the statement was re-prepared on a new
/// backend that never saw them. Returns the rewritten request when one is needed.
pub(super) fn bind_types(stmt: &mut Statement, request: &[u8]) -> Option<BytesMut> {
    let header = parse_header(request)?;
    if header.continues() || stmt.params == 0 {
        return None;
    }
    let payload = request.get(HEADER_LEN..HEADER_LEN + header.len)?;
    let n = usize::from(stmt.params);
    let flag_pos = 10 + n.div_ceil(8);
    match *payload.get(flag_pos)? {
        1 => {
            let types = payload.get(flag_pos + 1..flag_pos + 1 + 2 * n)?;
            match &mut stmt.types {
                Some(known) if known.as_slice() == types => {}
                Some(known) => {
                    known.clear();
                    known.extend_from_slice(types);
                }
                None => stmt.types = Some(types.to_vec()),
            }
            stmt.types_pending = false;
            None
        }
        _ if stmt.types_pending => {
            let patched = with_types(stmt, request)?;
            stmt.types_pending = false;
            Some(patched)
        }
        _ => None,
    }
}

/// A COM_STMT_EXECUTE that relies on the server remembering its parameter types, with the
/// statement's last known types written in (`None`: it carries its own, or none are known).
pub(super) fn with_types(stmt: &Statement, request: &[u8]) -> Option<BytesMut> {
    let header = parse_header(request)?;
    if header.continues() || stmt.params == 0 {
        return None;
    }
    let payload = request.get(HEADER_LEN..HEADER_LEN + header.len)?;
    let flag_pos = 10 + usize::from(stmt.params).div_ceil(8);
    if *payload.get(flag_pos)? == 1 {
        return None;
    }
    let types = stmt.types.as_ref()?;
    let mut patched = Vec::with_capacity(payload.len() + types.len());
    patched.extend_from_slice(&payload[..flag_pos]);
    patched.push(1);
    patched.extend_from_slice(types);
    patched.extend_from_slice(&payload[flag_pos + 1..]);
    Some(BytesMut::from(&frame::packet(&patched, header.seq)[..]))
}

/// What the record says the session holds that dies with its backend connection. The
/// classifier notes what a statement takes before it runs; if the connection is lost before
/// it answered, the client was never told it got those locks, temporary tables or XA
/// transaction, and they died with the connection: only what was held before counts (what
/// the statement released stays released).
#[derive(Clone, Copy)]
struct Held {
    temporary_tables: bool,
    table_locks: bool,
    named_locks: bool,
    xa: bool,
}

impl Held {
    fn of(r: &SessionRecord) -> Held {
        Held {
            temporary_tables: r.temporary_tables,
            table_locks: r.table_locks,
            named_locks: r.named_locks,
            xa: r.xa,
        }
    }

    /// After a request that failed: what it would have released may not have been.
    fn keep(self, r: &mut SessionRecord) {
        r.temporary_tables |= self.temporary_tables;
        r.table_locks |= self.table_locks;
        r.named_locks |= self.named_locks;
        r.xa |= self.xa;
    }

    /// After a request lost before it answered.
    fn restore(self, r: &mut SessionRecord) {
        r.temporary_tables &= self.temporary_tables;
        r.table_locks &= self.table_locks;
        r.named_locks &= self.named_locks;
        r.xa &= self.xa;
    }
}

/// The SQL text of a COM_QUERY request (of its first frame).
fn query_text(request: &[u8]) -> Option<&[u8]> {
    let header = parse_header(request)?;
    if request.get(HEADER_LEN) != Some(&COM_QUERY) {
        return None;
    }
    let end = HEADER_LEN + header.len.min(request.len() - HEADER_LEN);
    request.get(HEADER_LEN + 1..end)
}

/// What a statement lost in flight with its backend allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LossVerdict {
    /// Outside a transaction, it may simply run again on another node.
    pub retry_safe: bool,
    /// Inside a transaction, it may have committed it: the client learns the outcome is
    /// unknown, not that the transaction was rolled back.
    pub may_commit: bool,
}

impl LossVerdict {
    /// The verdict for `sql`, classified as `flags` under the session's `mode` (or under the
    /// default mode if the session's is not known) for `server`. Then every mode that could
    /// lex `sql` differently is asked too (rarely any: only for texts with `"` or `\`): all
    /// must find it safe to run again, any one finding that it may commit is enough.
    pub(super) fn of(sql: &[u8], flags: C, mode: Option<SqlMode>, server: Server) -> LossVerdict {
        let mut verdict = LossVerdict {
            retry_safe: retry_safe_flags(flags),
            may_commit: may_commit(sql, flags),
        };
        if mode.is_none() {
            for other in SqlMode::alternatives(sql) {
                let flags = classify_for(sql, other, server);
                verdict.retry_safe &= retry_safe_flags(flags);
                verdict.may_commit |= may_commit(sql, flags);
            }
        }
        verdict
    }

    /// [`LossVerdict::of`] for a text not classified yet (a statement being prepared).
    pub(super) fn of_sql(sql: &[u8], mode: Option<SqlMode>, server: Server) -> LossVerdict {
        Self::of(
            sql,
            classify_for(sql, mode.unwrap_or_default(), server),
            mode,
            server,
        )
    }
}

/// Whether a statement lost in flight outside a transaction may simply run again: a plain
/// read (no locking clause, `INTO`, variable assignment, or call of anything but the pure
/// built-ins the classifier knows, see `Classification::FUNCTION_CALL`), or a statement
/// that only starts a transaction or only sets session variables (to values computed
/// without such calls). One statement, never several.
fn retry_safe_flags(flags: C) -> bool {
    let only = |allowed: C| flags.difference(allowed | C::WRITE).is_empty();
    flags == C::READ_ONLY
        || (flags.has(C::BEGIN_TXN) && only(C::BEGIN_TXN))
        || (flags.has(C::SET_SESSION_VAR) && only(C::SET_SESSION_VAR | C::AUTOCOMMIT))
}

/// Whether a statement lost in flight inside a transaction may have committed it: COMMIT,
/// a statement that commits implicitly (DDL, `LOCK TABLES`, `BEGIN`, `SET autocommit`...),
/// or code holdfast does not see (`CALL`, `EXECUTE`); not a plain ROLLBACK.
fn may_commit(sql: &[u8], flags: C) -> bool {
    let rollback = || {
        !flags.has(C::MULTI)
            && first_keyword(sql).is_some_and(|k| k.eq_ignore_ascii_case(b"ROLLBACK"))
    };
    flags.intersects(C::MAY_COMMIT) && !rollback()
}

fn is_statement_command(cmd: u8) -> bool {
    matches!(
        cmd,
        COM_STMT_EXECUTE
            | COM_STMT_BULK_EXECUTE
            | COM_STMT_FETCH
            | COM_STMT_RESET
            | COM_STMT_CLOSE
            | COM_STMT_SEND_LONG_DATA
    )
}

#[cfg(test)]
mod tests {
    use super::LossVerdict;
    use holdfast_sql::{Server, SqlMode};

    const MARIADB: Server = Server::mariadb(101119);

    const ANSI: SqlMode = SqlMode::ANSI_QUOTES;
    const NBE: SqlMode = SqlMode::NO_BACKSLASH_ESCAPES;

    /// Run again after a loss outside a transaction, in a session whose mode is `mode`.
    fn retried_in(sql: &str, mode: Option<SqlMode>) -> bool {
        LossVerdict::of_sql(sql.as_bytes(), mode, MARIADB).retry_safe
    }

    fn retried(sql: &str) -> bool {
        retried_in(sql, None)
    }

    fn may_commit_in(sql: &str, mode: Option<SqlMode>) -> bool {
        LossVerdict::of_sql(sql.as_bytes(), mode, MARIADB).may_commit
    }

    /// Issue 18, item 5: a text whose executable comments the nodes may read differently
    /// is neither retried nor taken for a rollback.
    #[test]
    fn uncertain_texts_are_neither_retried_nor_taken_for_rollbacks() {
        // 10.6 skips what 10.11 runs.
        let mixed = Server::mariadb(100611).or(MARIADB);
        let sql = b"SELECT 1 /*M!100700 , GET_LOCK('a', 0) */";
        assert!(!LossVerdict::of_sql(sql, None, MARIADB).retry_safe);
        let verdict = LossVerdict::of_sql(sql, None, mixed);
        assert!(!verdict.retry_safe && verdict.may_commit);
        // Skipped by every node: a plain read (for a server not known, uncertain).
        let sql = b"SELECT 1 /*M!110000 , GET_LOCK('a', 0) */";
        assert!(LossVerdict::of_sql(sql, None, MARIADB).retry_safe);
        assert!(LossVerdict::of_sql(sql, None, mixed).retry_safe);
        assert!(!LossVerdict::of_sql(sql, None, Server::UNKNOWN).retry_safe);
        // A ROLLBACK only some nodes run first.
        let sql = b"/*M!100700 ROLLBACK; */ COMMIT";
        assert!(LossVerdict::of_sql(sql, None, mixed).may_commit);
    }

    #[test]
    fn only_provably_harmless_statements_are_retried() {
        for sql in [
            "SELECT 1",
            "SELECT c FROM t WHERE id = 5",
            "SELECT COUNT(*), MAX(a), CONCAT(b, 'x') FROM t WHERE d > NOW() - INTERVAL 1 DAY",
            "BEGIN",
            "START TRANSACTION",
            "SET autocommit=0",
            "SET NAMES utf8mb4",
            "SET sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')",
            "SHOW TABLES",
            "SELECT \"a\" FROM t",
        ] {
            assert!(retried(sql), "{sql} should be retried");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a=1",
            "COMMIT",
            "SET @a = 1",
            "SELECT 1; SELECT 2",
            "SELECT GET_LOCK('x', 1)",
            "SELECT * FROM t FOR UPDATE",
            "SELECT a INTO @a FROM t",
            "SELECT @a := 1",
            "CALL p()",
            "CREATE TABLE t (a INT)",
            "LOCK TABLES t READ",
        ] {
            assert!(!retried(sql), "{sql} must not be retried");
        }
    }

    #[test]
    fn calls_and_sequences_are_not_retried() {
        let retried = [
            "SELECT f()",
            "SELECT db.f(1)",
            "SELECT `f`(1)",
            "SELECT `GET_LOCK`('x', 1)",
            "SELECT COUNT (*) FROM t",
            "SELECT s.nextval",
            "SELECT NEXT VALUE FOR s",
            "SELECT LASTVAL(s)",
            "SELECT SETVAL(s, 5)",
            "SELECT LAST_INSERT_ID()",
            "SELECT FOUND_ROWS()",
            "SELECT SLEEP(5)",
            "SET @@session.sql_mode = (SELECT writing_fn())",
            "SET @@x = NEXTVAL(s)",
            "SET sql_mode = s.nextval",
            "START TRANSACTION; SELECT f()",
        ]
        .into_iter()
        .filter(|sql| retried(sql))
        .collect::<Vec<_>>();
        assert!(retried.is_empty(), "must not be retried: {retried:?}");
    }

    #[test]
    fn the_session_sql_mode_decides_how_a_statement_is_read() {
        // The default mode hides the call in a string; NO_BACKSLASH_ESCAPES runs it.
        let sql = r"SELECT 'a\', GET_LOCK('x', 1), '";
        assert!(retried_in(sql, Some(SqlMode::DEFAULT)));
        assert!(!retried_in(sql, Some(NBE)));
        // Mode not known (the server's default): only what is safe in every mode.
        assert!(!retried_in(sql, None));
        let sql = r#"SELECT "SLEEP"(5)"#;
        assert!(!retried_in(sql, Some(ANSI)));
        assert!(!retried_in(sql, None));
        let sql = r#"SELECT "a" FROM "t""#;
        assert!(retried_in(sql, Some(ANSI)));
        assert!(retried_in(sql, None));
        // A COMMIT only one mode sees.
        let sql = r"SELECT 'a\'; COMMIT; SELECT '";
        assert!(!may_commit_in(sql, Some(SqlMode::DEFAULT)));
        assert!(may_commit_in(sql, Some(NBE)));
        assert!(may_commit_in(sql, None));
    }

    #[test]
    fn statements_that_may_commit_are_told_apart_from_rollbacks() {
        for sql in [
            "COMMIT",
            "commit work and chain",
            "BEGIN",
            "START TRANSACTION",
            "SET autocommit = 1",
            "CREATE TABLE t (a INT)",
            "ALTER TABLE t ADD b INT",
            "LOCK TABLES t WRITE",
            "CALL p()",
            "EXECUTE s",
            "INSERT INTO t VALUES (1); COMMIT",
        ] {
            assert!(may_commit_in(sql, None), "{sql} may commit");
        }
        for sql in [
            "ROLLBACK",
            "ROLLBACK AND CHAIN",
            "ROLLBACK TO SAVEPOINT s",
            "INSERT INTO t VALUES (1)",
            "SELECT f()",
            "SAVEPOINT s",
            "SET @a = 1",
        ] {
            assert!(!may_commit_in(sql, None), "{sql} does not commit");
        }
    }
}

#[cfg(test)]
mod tracker_mention_tests {
    #[test]
    fn finds_session_track_in_any_case() {
        assert!(super::mentions_trackers(b"SELECT @@Session_Track_Schema"));
        assert!(super::mentions_trackers(
            b"SHOW VARIABLES LIKE 'session_track%'"
        ));
        assert!(super::mentions_trackers(b"session_track"));
        assert!(!super::mentions_trackers(b"SELECT session_trac, _x FROM t"));
        assert!(!super::mentions_trackers(b"_"));
    }
}
