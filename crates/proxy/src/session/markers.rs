//! Commit markers (`[ha] commit_markers`): the outcome of a COMMIT whose answer was lost
//! with its backend. Inside a transaction that wrote, the COMMIT goes out behind an upsert
//! of the session's row in `holdfast.commit_marker` (its key, the commit's sequence
//! number), in one write: no extra round trip. The row commits with the transaction and
//! replicates with it. When the answer is lost, the session moves and reads its row on the
//! node that took over: the sequence number there says the transaction committed (the
//! client gets the COMMIT's OK) or did not (it is replayed and committed again, or the
//! client learns it was rolled back: 1213, now a fact rather than a guess).
//!
//! What the client reads next about its last statement must not change (issue 18): the
//! warnings and errors of the diagnostics area (`SHOW WARNINGS`, `@@warning_count`, `GET
//! DIAGNOSTICS`) and `ROW_COUNT()`. MariaDB clears the diagnostics area for a statement
//! that opens tables (the marker's procedure does) and keeps it through `COMMIT`,
//! `ROLLBACK` and statements without tables; both set `ROW_COUNT()` to 0 (a failed
//! statement leaves -1). So:
//! - an autocommit write is wrapped as `BEGIN`, the marker, the statement (one write),
//!   then `COMMIT` if the statement succeeded or `ROLLBACK` if it failed (a second
//!   round trip): the statement's own conditions are the last ones. Its `ROW_COUNT()`
//!   (the `COMMIT` or `ROLLBACK` set it to 0) is written into the next statement that
//!   reads it ([`Session::restore_row_count`]);
//! - a transaction's `COMMIT` goes without a marker while the diagnostics area may hold
//!   an earlier statement's conditions (the marker would clear them): such a `COMMIT`'s
//!   outcome is unknown if its answer is lost, as without markers.

use super::migrate::LostConn;
use super::{End, Session};
use crate::conn::ConnError;
use crate::error::ClientError;
use bytes::{Bytes, BytesMut};
use holdfast_sql::{first_keyword, Classification as C, Lexer};
use holdfast_wire::caps::*;
use holdfast_wire::command::{
    COM_QUERY, COM_STMT_EXECUTE, COM_STMT_PREPARE, CURSOR_TYPE_READ_ONLY,
};
use holdfast_wire::frame;
use holdfast_wire::packets::{ok_payload, OkPacket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a session that lost a COMMIT's answer on a node that kept running waits for
/// the server to finish with the old connection (its COMMIT may still be running there)
/// before it reads the marker.
const OLD_CONNECTION_GONE_WITHIN: Duration = Duration::from_secs(10);

/// A session's commit markers.
#[derive(Debug)]
pub(super) struct Markers {
    /// The session's row (random: unique across sessions and holdfast processes).
    key: u64,
    /// The sequence number of the session's last marked COMMIT.
    seq: u64,
    /// A marked COMMIT, or a wrapped autocommit write, is in flight.
    in_flight: Option<InFlight>,
    /// The open transaction changed data (a COMMIT without writes needs no marker).
    pub(super) txn_writes: bool,
    /// A marker was refused (no table, no privilege): this session sends no more.
    refused: bool,
    /// The backend's diagnostics area may hold conditions (warnings, an error) of an
    /// earlier statement, which a marker would clear.
    conditions_kept: bool,
    /// `ROW_COUNT()` as the client's last statement left it, where the backend's differs
    /// (a wrapped write's `COMMIT` set it to 0): for the next statement.
    row_count: Option<i64>,
    /// The session prepared a statement that reads `ROW_COUNT()` (or read it where holdfast
    /// cannot write it in): its autocommit writes are no longer wrapped.
    reads_row_count: bool,
    /// For this request, a COM_STMT_EXECUTE of a statement that reads `ROW_COUNT()` where
    /// the backend's differs: the statement's text with the value written in, run in its
    /// place by a statement prepared for it ([`Session::execute_stand_in`]).
    execute_as: Option<Vec<u8>>,
}

impl Default for Markers {
    fn default() -> Self {
        Markers {
            key: rand::random(),
            seq: 0,
            in_flight: None,
            txn_writes: false,
            refused: false,
            conditions_kept: false,
            row_count: None,
            reads_row_count: false,
            execute_as: None,
        }
    }
}

/// What is in flight behind a marker.
#[derive(Debug, Clone)]
pub(super) enum InFlight {
    /// The COMMIT of the session's transaction, marker `seq`.
    Commit { seq: u64 },
    /// An autocommit write wrapped in a transaction with marker `seq`. `statement`: its
    /// answer (OK: the wrap's `COMMIT` is in flight; ERR: its `ROLLBACK`); `None`: not in
    /// yet, and no `COMMIT` was sent.
    Autocommit {
        seq: u64,
        statement: Option<Vec<u8>>,
    },
}

/// Whether a statement changes data: not a plain read, nor one that only opens or ends a
/// transaction, sets a savepoint or sets variables.
/// Several statements in one text count as a write when any is not a plain read.
pub(super) fn writes_data(flags: C) -> bool {
    const NOT_DATA: C = C::BEGIN_TXN
        .union(C::END_TXN)
        .union(C::SAVEPOINT)
        .union(C::SET_SESSION_VAR)
        .union(C::SET_USER_VAR)
        .union(C::AUTOCOMMIT)
        .union(C::SET_TRANSACTION);
    flags.has(C::WRITE) && (flags.has(C::MULTI) || !flags.intersects(NOT_DATA))
}

/// Whether a text starts with `INSERT`, `UPDATE`, `DELETE` or `REPLACE`.
fn plain_data_change(sql: &[u8]) -> bool {
    first_keyword(sql).is_some_and(|k| {
        [&b"INSERT"[..], b"UPDATE", b"DELETE", b"REPLACE"]
            .iter()
            .any(|w| k.eq_ignore_ascii_case(w))
    })
}

/// Whether a statement surely opens tables, so that it clears the diagnostics area when it
/// starts: a single data change, its text certain.
pub(super) fn clears_conditions(sql: &[u8], flags: C) -> bool {
    !flags.intersects(C::MULTI.union(C::UNCERTAIN)) && plain_data_change(sql)
}

/// A plain `COMMIT [WORK]` (not `AND CHAIN`: the chained transaction would have to be
/// opened again too; not several statements in one; not a text whose executable comments
/// may run or not).
fn plain_commit(sql: &[u8], flags: C) -> bool {
    flags.has(C::END_TXN)
        && !flags.intersects(C::BEGIN_TXN.union(C::MULTI).union(C::UNCERTAIN))
        && first_keyword(sql).is_some_and(|k| k.eq_ignore_ascii_case(b"COMMIT"))
}

impl Session {
    /// Before a statement runs: notes whether the transaction changed data.
    pub(super) fn note_writes(&mut self, flags: Option<C>) {
        // A statement that opens a transaction starts its count afresh (whatever an
        // earlier one, or a recovered autocommit write, left behind).
        if flags.is_some_and(|f| f.has(C::BEGIN_TXN)) {
            self.markers.txn_writes = false;
        }
        self.markers.txn_writes |= flags.is_some_and(writes_data);
    }

    /// Whether the transaction has written once a statement classified as `flags` ran
    /// (what [`Session::note_writes`] will note), for the plan made before it runs.
    pub(super) fn txn_writes_after(&self, flags: C) -> bool {
        (self.markers.txn_writes && !flags.has(C::BEGIN_TXN)) || writes_data(flags)
    }

    /// Whether this COMMIT goes out behind a marker (never while the session holds state
    /// a marker write would disturb or that dies with the backend anyway, nor for a
    /// read-only transaction). `txn_writes`: its transaction wrote.
    pub(super) fn marks_commit(
        &self,
        sql: &[u8],
        flags: C,
        in_transaction: bool,
        txn_writes: bool,
    ) -> bool {
        in_transaction
            && txn_writes
            // A read-only transaction wrote nothing (whatever an earlier chained one did),
            // and its marker write would fail with 1792.
            && self.record.status & SERVER_STATUS_IN_TRANS_READONLY == 0
            && !self.record.holds_server_state()
            && !self.markers.refused
            // The marker's procedure would clear what the client may read after COMMIT.
            && !self.markers.conditions_kept
            && self.shared.commit_markers_ready.load(Ordering::Acquire)
            && plain_commit(sql, flags)
    }

    /// After a request: a finished transaction's writes are forgotten; whether the
    /// diagnostics area may hold conditions now. Any answer with warnings or an error
    /// leaves some; a statement that opens tables and answers without any clears them,
    /// which holdfast knows for sure of a single `INSERT`, `UPDATE`, `DELETE`, `REPLACE`.
    /// Other statements without conditions leave the area as it was (`SELECT 1`, `SET`,
    /// `COMMIT` keep earlier warnings while their own answers count none).
    /// `data_change`: the request was one of those ([`clears_conditions`]).
    pub(super) fn markers_after(&mut self, data_change: bool) {
        self.markers.in_flight = None;
        if !self.record.in_transaction() {
            self.markers.txn_writes = false;
        }
        if self.exchange.error.is_some() || self.record.last_warnings > 0 {
            self.markers.conditions_kept = true;
        } else if data_change {
            self.markers.conditions_kept = false;
        }
    }

    /// Before a text that reads `ROW_COUNT()` and that holdfast runs its own `SET`s of
    /// trackers before (which set it to 0): one that turns holdfast's transaction tracker
    /// on (the session's first `SET TRANSACTION`), or one that reads the client's tracker
    /// settings (given for the statement, see [`super::request::TrackerStep`]). What the
    /// client's last statement left is put back as after a wrap.
    pub(super) fn keep_row_count_across_trackers(&mut self, request: &[u8]) {
        if self.record.untracked || self.markers.row_count.is_some() {
            return;
        }
        let Some(header) = frame::parse_header(request) else {
            return;
        };
        if request.get(frame::HEADER_LEN) != Some(&COM_QUERY) || header.continues() {
            return;
        }
        let Some(sql) = request.get(frame::HEADER_LEN + 1..) else {
            return;
        };
        if !mentions_row_count(sql) {
            return;
        }
        let mode = self.record.sql_mode.unwrap_or_default();
        let flags = holdfast_sql::classify_for(sql, mode, self.server());
        let first_set_transaction = !self.tracks_transactions && flags.has(C::SET_TRANSACTION);
        let shows_client_trackers = super::trackers::mentions_trackers(sql)
            && !flags.intersects(C::SET_SESSION_VAR.union(C::MULTI));
        if first_set_transaction || shows_client_trackers {
            self.markers.row_count = self.exchange.row_count_left;
        }
    }

    /// Before a split session's request for which `FOUND_ROWS()` is carried to the node
    /// its last statement ran on: the carrying changes that node's `ROW_COUNT()`, and the
    /// session's is written in (as after a wrap).
    pub(super) fn keep_row_count_for_found_rows(&mut self, request: &[u8]) {
        if self.markers.row_count.is_some() || !self.found_rows_carried_to_last(request) {
            return;
        }
        self.markers.row_count = self.exchange.row_count_left;
    }

    /// The server set `ROW_COUNT()` itself, as it would directly (a refused prepare):
    /// nothing is to be written in for the next statement.
    pub(super) fn row_count_reset_by_server(&mut self) {
        self.markers.row_count = None;
    }

    /// After holdfast's own statements put the diagnostics back (see
    /// [`crate::restore::put_back_diagnostics`]): a `ROW_COUNT()` above 0 cannot be, and
    /// is written into the next statement that reads it instead.
    pub(super) fn row_count_not_put_back(&mut self, left: i64) {
        if left > 0 {
            self.markers.row_count = Some(left);
        }
    }

    /// Before a request: `ROW_COUNT()` put back where a wrap's `COMMIT` changed it. Each
    /// `ROW_COUNT()` call in the first statement of a text reads the value the client's
    /// last statement left: it is written in as that number; a prepared statement without
    /// tables that reads it runs as its text with the number written in (see
    /// [`Session::execute_stand_in`]). Once the session prepares a statement that reads it,
    /// or reads it where holdfast cannot write it in (dynamic SQL, a compound statement,
    /// `GET DIAGNOSTICS`), its autocommit writes are not wrapped from then on.
    pub(super) fn restore_row_count(&mut self, request: &mut BytesMut) {
        self.markers.execute_as = None;
        let cmd = request.get(frame::HEADER_LEN).copied();
        // Commands that run no statement leave `ROW_COUNT()` as it was.
        let row_count = match cmd {
            Some(cmd) if holdfast_wire::command::runs_no_statement(cmd) => self.markers.row_count,
            _ => self.markers.row_count.take(),
        };
        // Nothing to put back, and no wrap to stop: no need to read the text.
        let ha = &self.shared.config().ha;
        if row_count.is_none()
            && (self.markers.reads_row_count || !ha.commit_markers || !ha.mark_autocommit_writes)
        {
            return;
        }
        let Some(header) = frame::parse_header(request) else {
            return;
        };
        if let (Some(COM_STMT_EXECUTE), Some(n), false) = (cmd, row_count, header.continues()) {
            self.markers.execute_as = self.execute_with_row_count(request, n);
            return;
        }
        let Some(sql) = request.get(frame::HEADER_LEN + 1..) else {
            return;
        };
        if header.continues() || !mentions_row_count(sql) {
            return;
        }
        if cmd == Some(COM_STMT_PREPARE) {
            self.markers.reads_row_count = true;
            return;
        }
        if cmd != Some(COM_QUERY) {
            return;
        }
        let mode = self.record.sql_mode.unwrap_or_default();
        let calls = RowCountCalls::find(sql, mode, self.server());
        if calls.elsewhere {
            self.markers.reads_row_count = true;
        }
        let (Some(n), false) = (row_count, calls.at.is_empty()) else {
            return;
        };
        let mut payload = vec![COM_QUERY];
        // A signed literal the lexer reads as one value (`-1` after a failed write).
        payload.extend_from_slice(&written_in(sql, &calls.at, &format!("({n})")));
        if payload.len() < frame::MAX_PAYLOAD {
            let seq = header.seq;
            request.clear();
            request.extend_from_slice(&frame::packet(&payload, seq));
        }
    }

    /// The text a COM_STMT_EXECUTE runs as so that its `ROW_COUNT()` calls read `n`: its
    /// statement's with each call written in as `n` (of the function's type),
    /// for a statement that opens no table (prepared again now, its text means what it
    /// meant then whatever the current schema) and holds no long data (that lives with
    /// the statement the server has). Not for a cursor, which later fetches name.
    fn execute_with_row_count(&self, request: &[u8], n: i64) -> Option<Vec<u8>> {
        let payload = request.get(frame::HEADER_LEN..)?;
        if payload
            .get(5)
            .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0)
        {
            return None;
        }
        let id = holdfast_wire::packets::statement_id(payload)?;
        let stmt = self.statements.get(self.statements.resolve(id))?;
        let mode = self.record.sql_mode.unwrap_or_default();
        if stmt.long_data
            || !mentions_row_count(&stmt.sql)
            || !super::split::opens_no_table(&stmt.sql, mode, self.server())
        {
            return None;
        }
        let calls = RowCountCalls::find(&stmt.sql, mode, self.server());
        if calls.at.is_empty() || calls.elsewhere {
            return None;
        }
        // The function's own type (BIGINT: eight bytes in a binary row), which a literal
        // or a CAST of a small number does not have.
        let value = format!("(ROW_COUNT() * 0 + ({n}))");
        Some(written_in(&stmt.sql, &calls.at, &value))
    }

    /// The stand-in statement for this request's COM_STMT_EXECUTE, prepared now (see
    /// [`Session::restore_row_count`]): its backend id, written into `request` (with the
    /// parameter types the statement last had, which the stand-in has never been sent).
    /// `None`: the execute runs as it is (the backend refused the text).
    pub(super) async fn execute_stand_in(
        &mut self,
        client_id: u32,
        request: &mut BytesMut,
    ) -> Result<Option<u32>, End> {
        let Some(sql) = self.markers.execute_as.take() else {
            return Ok(None);
        };
        let deprecate_eof = self.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let id = match super::migrate::prepare(&mut self.backend, &sql, deprecate_eof).await {
            Ok(id) => id,
            Err(super::migrate::PrepareError::Conn(error)) => {
                return Err(End::BackendLost {
                    started: false,
                    error,
                })
            }
            Err(e) => {
                tracing::debug!(session = self.info.id, error = %e, "a statement reading ROW_COUNT() runs as it is");
                return Ok(None);
            }
        };
        holdfast_wire::packets::set_statement_id(&mut request[frame::HEADER_LEN..], id);
        if let Some(patched) = self
            .statements
            .get(client_id)
            .and_then(|stmt| super::statements::with_types(stmt, request))
        {
            *request = patched;
        }
        Ok(Some(id))
    }

    /// What was in flight behind a marker when the backend was lost, if anything.
    pub(super) fn take_marked(&mut self) -> Option<InFlight> {
        self.markers.in_flight.take()
    }

    /// The COM_QUERY payload that upserts the session's marker `seq` through the definer
    /// procedure (client accounts cannot touch the table). The counts columns are left
    /// NULL: a wrapped statement's answer is in before its `COMMIT` goes out.
    fn marker_upsert(&self, seq: u64) -> String {
        format!(
            "\u{3}CALL {}({}, {seq}, NULL, NULL)",
            holdfast_cluster::ha::markers::MARK,
            self.markers.key
        )
    }

    /// Whether an autocommit statement goes out wrapped in a transaction with a marker: a
    /// single `INSERT`, `UPDATE`, `DELETE` or `REPLACE` (without `RETURNING`: its answer is
    /// one OK or ERR) outside a transaction, with autocommit on, while the session holds no
    /// server-side state (`BEGIN` would release its `LOCK TABLES`).
    pub(super) fn wraps_autocommit(
        &self,
        sql: &[u8],
        flags: C,
        in_transaction: bool,
        request: &[u8],
    ) -> bool {
        const NOT_WRAPPED: C = C::CHANGES_SESSION
            .union(C::MULTI)
            .union(C::MAY_COMMIT)
            .union(C::LOAD_DATA_LOCAL)
            .union(C::KILL)
            .union(C::SHUTDOWN);
        let execute = request.get(frame::HEADER_LEN) == Some(&COM_STMT_EXECUTE);
        !in_transaction
            && !self.record.holds_server_state()
            // Pending next-transaction characteristics (`SET TRANSACTION READ ONLY`) are
            // the statement's: the wrap's BEGIN would use them up, where the statement
            // alone leaves them pending if it fails.
            && self.record.next_transaction.is_empty()
            && !self.record.read_only_lingers
            && self.shared.config().ha.mark_autocommit_writes
            && self.record.status & SERVER_STATUS_AUTOCOMMIT != 0
            && (!execute
                || !self.record.pending_long_data
                    && request
                        .get(frame::HEADER_LEN + 5)
                        .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY == 0))
            && !self.markers.refused
            && !self.markers.reads_row_count
            && writes_data(flags)
            && !flags.intersects(NOT_WRAPPED)
            && frame::parse_header(request).is_some_and(|h| !h.continues())
            && self.shared.commit_markers_ready.load(Ordering::Acquire)
            && plain_data_change(sql)
            && !Lexer::for_server(sql, self.record.sql_mode.unwrap_or_default(), self.server())
                .any(|t| t.is_word("RETURNING"))
    }

    /// Runs an autocommit write as `BEGIN`, the marker and the statement in one write,
    /// then, once the statement's answer is in, `COMMIT` (it succeeded) or `ROLLBACK` (it
    /// failed). The client gets the statement's answer once the transaction has ended (or
    /// the COMMIT's error if that failed). The end names its completion: the session's
    /// `completion_type` is for its own COMMITs.
    pub(super) async fn autocommit_with_marker(&mut self, request: &[u8]) -> Result<(), End> {
        const COMMIT: &[u8] = b"\x03COMMIT AND NO CHAIN NO RELEASE";
        const ROLLBACK: &[u8] = b"\x03ROLLBACK AND NO CHAIN NO RELEASE";
        let cmd = request.get(frame::HEADER_LEN).copied().unwrap_or(COM_QUERY);
        self.shared.metrics.requests.command(cmd);
        self.exchange.begin();
        let reply_seq = super::reply::reply_seq(request);
        let seq = self.markers.seq + 1;
        let upsert = self.marker_upsert(seq);
        let mut out = BytesMut::with_capacity(upsert.len() + request.len() + 32);
        out.extend_from_slice(&frame::packet(b"\x03BEGIN", 0));
        out.extend_from_slice(&frame::packet(upsert.as_bytes(), 0));
        let at = out.len();
        out.extend_from_slice(request);
        if request.get(frame::HEADER_LEN) == Some(&COM_STMT_EXECUTE) {
            // As `statement_command` sends it: the backend's id, the types it must know.
            let id = holdfast_wire::packets::statement_id(&request[frame::HEADER_LEN..])
                .map(|id| self.statements.resolve(id));
            let Some(stmt) = id.and_then(|id| self.statements.get_mut(id)) else {
                return Err(End::Protocol("a wrapped execute lost its statement".into()));
            };
            stmt.long_data = false;
            let backend_id = stmt.backend_id;
            if let Some(patched) = super::statements::bind_types(stmt, request) {
                out.truncate(at);
                out.extend_from_slice(&patched);
            }
            if let Some(payload) = out.get_mut(at + frame::HEADER_LEN..) {
                holdfast_wire::packets::set_statement_id(payload, backend_id);
            }
        }
        self.markers.seq = seq;
        self.markers.in_flight = Some(InFlight::Autocommit {
            seq,
            statement: None,
        });
        let lost = |error| End::BackendLost {
            started: false,
            error,
        };
        self.backend.conn.write_raw(&out).await.map_err(lost)?;
        let begin = self.read_ok_or_err("BEGIN").await?;
        if begin.first() == Some(&0xff) {
            // The marker and the statement run by themselves, as the statement would
            // without holdfast: its answer is the client's.
            self.markers.in_flight = None;
            let _marker = self.read_ok_or_err("marker").await?;
            let statement = self.read_ok_or_err("statement").await?;
            return self.answer_wrapped(statement, None, reply_seq).await;
        }
        if self.read_ok_or_err("marker").await?.first() == Some(&0xff) {
            // The statement commits without its marker: a loss before the COMMIT's answer
            // leaves the outcome unknown.
            self.markers.in_flight = None;
            self.markers.refused = true;
            tracing::warn!(
                session = self.info.id,
                "commit marker refused; this session's writes go on without one"
            );
        }
        let statement = self.read_ok_or_err("statement").await?;
        let succeeded = statement.first() == Some(&0);
        // One statement was sent, as far as holdfast could read it: more results mean the
        // server read several (a COMMIT now would be answered out of turn). The session
        // ends rather than answer the wrong request.
        if succeeded
            && OkPacket::parse(&statement, true)
                .is_ok_and(|ok| ok.status & SERVER_MORE_RESULTS_EXISTS != 0)
        {
            return Err(End::Protocol(
                "a wrapped autocommit write was run as several statements by the server".into(),
            ));
        }
        if let Some(InFlight::Autocommit { statement: s, .. }) = &mut self.markers.in_flight {
            *s = Some(statement.to_vec());
        }
        let end = if succeeded { COMMIT } else { ROLLBACK };
        self.backend
            .conn
            .write_raw(&frame::packet(end, 0))
            .await
            .map_err(lost)?;
        let end = self.read_ok_or_err("the wrap's end").await?;
        self.answer_wrapped(statement, Some(end), reply_seq).await
    }

    /// One answer of a wrapped write: OK or ERR.
    async fn read_ok_or_err(&mut self, what: &str) -> Result<Bytes, End> {
        let p = self.read_backend_packet().await?;
        match p.payload.first() {
            Some(0) => {
                self.own_ok_seen(&p.payload);
                Ok(p.payload)
            }
            Some(0xff) => Ok(p.payload),
            _ => Err(End::Protocol(format!(
                "a wrapped autocommit write's {what} was answered with neither OK nor ERR"
            ))),
        }
    }

    /// Answers the client for a wrapped write: the statement's ERR; its OK with the
    /// status and session state after the transaction's end (`end`: the COMMIT's answer,
    /// `None` when the statement ran by itself); the COMMIT's ERR if it failed.
    async fn answer_wrapped(
        &mut self,
        statement: Bytes,
        end: Option<Bytes>,
        reply_seq: u8,
    ) -> Result<(), End> {
        // The backend's OKs are read as the backend sends them (holdfast's session-mode
        // connections always have CLIENT_SESSION_TRACK, whatever the client has);
        // `client_ok` writes the client's.
        let tracks = true;
        let malformed = |e| End::Protocol(format!("backend sent a malformed OK: {e}"));
        let end = match &end {
            Some(e) if e.first() == Some(&0) => {
                Some(Ok(OkPacket::parse(e, tracks).map_err(malformed)?))
            }
            Some(e) => Some(Err(e)),
            None => None,
        };
        // The session's status and tracked state are the ones after the transaction's
        // end: the COMMIT reports the write's GTID (`last_gtid`), which a read on a
        // replica must wait for.
        let after = |record: &mut crate::state::SessionRecord, ok: &OkPacket<'_>| {
            record.status = ok.status;
            if !ok.session_state.is_empty() {
                record.apply_session_state(ok.session_state);
            }
        };
        let answer = match (statement.first(), end) {
            (_, Some(Err(commit_failed))) => commit_failed.to_vec(),
            (Some(0xff), end) => {
                if let Some(Ok(end)) = end {
                    after(&mut self.record, &end);
                }
                // The ROLLBACK set `ROW_COUNT()` to 0; a failed statement leaves -1.
                self.markers.row_count = Some(-1);
                statement.to_vec()
            }
            (_, end) => {
                let ok = OkPacket::parse(&statement, tracks).map_err(malformed)?;
                let answer = match &end {
                    Some(Ok(commit)) => {
                        let answer = self.client_ok(&ok, commit.status, commit.session_state);
                        after(&mut self.record, commit);
                        answer
                    }
                    _ => self.client_ok(&ok, ok.status, &[]),
                };
                // The COMMIT set `ROW_COUNT()` to 0; the statement left its count.
                self.markers.row_count = Some(ok.affected_rows as i64);
                answer
            }
        };
        if answer.first() == Some(&0xff) {
            self.note_error_answer(&answer);
        }
        self.shared
            .metrics
            .requests
            .bytes_to_client(answer.len() as u64 + 4);
        self.exchange.started = true;
        self.client
            .write_packet(&answer, reply_seq)
            .await
            .map_err(End::Client)
    }

    /// An ERR holdfast gives the client for a wrapped write: counted, and the record
    /// follows it as after a relayed one.
    fn note_error_answer(&mut self, err: &[u8]) {
        let code = holdfast_wire::packets::ErrPacket::parse(err).map_or(0, |e| e.code);
        self.exchange.error = Some(code);
        self.shared.metrics.count_error(code);
        self.record.last_warnings = 1;
        self.record.last_affected_rows = 0;
    }

    /// The client's OK for a statement whose transaction holdfast committed: the
    /// statement's counts, the status after the commit (its plan flags kept), the session
    /// state the client's own trackers would report (the statement's, then the COMMIT's
    /// `commit_state`: a direct autocommit write reports both in its one OK). The record
    /// follows the statement.
    fn client_ok(&mut self, ok: &OkPacket<'_>, status_after: u16, commit_state: &[u8]) -> Vec<u8> {
        const PLAN: u16 =
            SERVER_STATUS_NO_GOOD_INDEX_USED | SERVER_STATUS_NO_INDEX_USED | SERVER_QUERY_WAS_SLOW;
        self.record.observe_ok(ok);
        let tracks = self.capabilities & CLIENT_SESSION_TRACK != 0;
        let mut kept = Vec::new();
        if tracks {
            self.record
                .client_trackers
                .filter(ok.session_state, &mut kept);
            self.record.client_trackers.filter(commit_state, &mut kept);
        }
        let mut status = (status_after & !SERVER_SESSION_STATE_CHANGED) | (ok.status & PLAN);
        if tracks
            && (!kept.is_empty()
                || (self.record.client_trackers.state_change()
                    && ok.status & SERVER_SESSION_STATE_CHANGED != 0))
        {
            status |= SERVER_SESSION_STATE_CHANGED;
        }
        let ok = OkPacket {
            status,
            session_state: &kept,
            ..*ok
        };
        let mut out = Vec::new();
        ok.encode_into(tracks, &mut out);
        out
    }

    /// Sends the marker and the COMMIT in one write, drops the marker's answer and relays
    /// the COMMIT's.
    pub(super) async fn commit_with_marker(&mut self, request: &[u8]) -> Result<(), End> {
        let cmd = request.get(frame::HEADER_LEN).copied().unwrap_or(COM_QUERY);
        self.shared.metrics.requests.command(cmd);
        self.exchange.begin();
        let seq = self.markers.seq + 1;
        let upsert = self.marker_upsert(seq);
        let mut out = BytesMut::with_capacity(upsert.len() + request.len() + 8);
        out.extend_from_slice(&frame::packet(upsert.as_bytes(), 0));
        let at = out.len();
        out.extend_from_slice(request);
        // A prepared COMMIT: the backend knows it by its own id.
        if request.get(frame::HEADER_LEN) == Some(&COM_STMT_EXECUTE) {
            let backend_id = holdfast_wire::packets::statement_id(&request[frame::HEADER_LEN..])
                .map(|id| self.statements.resolve(id))
                .and_then(|id| self.statements.get(id))
                .map(|s| s.backend_id);
            if let (Some(id), Some(payload)) = (backend_id, out.get_mut(at + frame::HEADER_LEN..)) {
                holdfast_wire::packets::set_statement_id(payload, id);
            }
        }
        self.markers.seq = seq;
        self.markers.in_flight = Some(InFlight::Commit { seq });
        self.backend
            .conn
            .write_raw(&out)
            .await
            .map_err(|error| End::BackendLost {
                started: false,
                error,
            })?;
        let answer = self.read_backend_packet().await?;
        match answer.payload.first() {
            Some(0) => self.own_ok_seen(&answer.payload),
            Some(0xff) => {
                // The COMMIT goes on without a marker: its outcome cannot be read back.
                self.markers.in_flight = None;
                self.markers.refused = true;
                let e = holdfast_wire::packets::ErrPacket::parse(&answer.payload);
                let (code, message) = e.map_or((0, String::new()), |e| {
                    (e.code, String::from_utf8_lossy(e.message).into_owned())
                });
                tracing::warn!(
                    session = self.info.id,
                    code,
                    message,
                    "commit marker refused; this session's COMMITs go on without one"
                );
            }
            _ => {
                return Err(End::Protocol(
                    "the commit marker's answer was neither OK nor ERR".into(),
                ))
            }
        }
        self.relay(super::reply::Reply::ResultSets).await
    }

    /// The backend was lost with a marked COMMIT (`seq`) in flight: move, read the marker
    /// on the new backend, and answer the client with what became of its transaction.
    pub(super) async fn recover_lost_marked(
        &mut self,
        error: ConnError,
        request: BytesMut,
        reply_seq: u8,
        marked: InFlight,
    ) -> Result<(), End> {
        match marked {
            InFlight::Commit { seq } => {
                self.recover_lost_commit(error, request, reply_seq, seq)
                    .await
            }
            InFlight::Autocommit { seq, statement } => {
                self.recover_lost_autocommit(error, request, reply_seq, seq, statement)
                    .await
            }
        }
    }

    /// A wrapped autocommit write lost in flight. Before its answer was in, no COMMIT had
    /// gone out: nothing committed, it runs again. A failed statement whose ROLLBACK was
    /// lost: the client gets its error. A statement whose COMMIT was lost: committed (its
    /// marker is there) -> its OK; not committed -> it runs again, wrapped again; the
    /// marker unreadable -> the client learns the outcome is unknown, as without markers.
    async fn recover_lost_autocommit(
        &mut self,
        error: ConnError,
        request: BytesMut,
        reply_seq: u8,
        seq: u64,
        statement: Option<Vec<u8>>,
    ) -> Result<(), End> {
        tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost with an autocommit write in flight");
        let lost = self.move_after_marked_loss(&error).await?;
        // Settled below one way or the other: no transaction of the client's is open.
        self.markers.txn_writes = false;
        self.record.status &= !SERVER_STATUS_IN_TRANS;
        let ok = match &statement {
            None => None,
            Some(err) if err.first() == Some(&0xff) => {
                tracing::info!(
                    session = self.info.id,
                    "the lost autocommit write had failed; answering its error"
                );
                self.note_error_answer(err);
                self.markers.row_count = Some(-1);
                return self
                    .client
                    .write_packet(err, reply_seq)
                    .await
                    .map_err(End::Client);
            }
            Some(ok) => Some(
                OkPacket::parse(ok, true)
                    .map_err(|e| End::Protocol(format!("backend sent a malformed OK: {e}")))?,
            ),
        };
        let committed = match &ok {
            None => Some(false),
            Some(_) => self
                .read_marker(&lost)
                .await
                .map(|m| m.is_some_and(|m| m.seq >= seq)),
        };
        match (committed, ok) {
            (Some(true), Some(ok)) => {
                tracing::info!(
                    session = self.info.id,
                    "the lost autocommit write was applied; answering it"
                );
                self.shared.metrics.commit_outcome("committed");
                self.shared.metrics.requests_retried.inc();
                // The new connection has the session's LAST_INSERT_ID() from before it.
                if ok.last_insert_id != 0 {
                    let set = format!("SET last_insert_id = {}", ok.last_insert_id);
                    if let Err(e) = self.run_own(set.as_bytes()).await {
                        tracing::warn!(session = self.info.id, error = %e, "could not set LAST_INSERT_ID() after a recovered write");
                    }
                    self.record.last_insert_id = ok.last_insert_id;
                }
                self.record.last_affected_rows = ok.affected_rows;
                // Its warnings went with the old connection.
                self.record.last_warnings = 0;
                self.markers.row_count = Some(ok.affected_rows as i64);
                let answer = ok_payload(
                    ok.affected_rows,
                    ok.last_insert_id,
                    self.record.status & !SERVER_STATUS_IN_TRANS,
                    0,
                );
                self.client
                    .write_packet(&answer, reply_seq)
                    .await
                    .map_err(End::Client)
            }
            (Some(_), _) => {
                tracing::info!(
                    session = self.info.id,
                    "the lost autocommit write was not applied; running it again"
                );
                self.shared.metrics.commit_outcome("replayed");
                self.shared.metrics.requests_retried.inc();
                self.forward_request(request).await
            }
            (None, _) => {
                self.shared.metrics.commit_outcome("unknown");
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::statement_interrupted())
                    .await
            }
        }
    }

    /// Moves after a marked request was lost; returns the lost connection. One cut while
    /// its server ran (someone's KILL, or the network) ends the session instead, as the
    /// server ended the connection: what did not commit is not committed again.
    async fn move_after_marked_loss(&mut self, error: &ConnError) -> Result<LostConn, End> {
        let lost = self.lost_conn_after(error, "request").await;
        self.mark_backend_dead();
        self.transaction_lost = false;
        self.relocate("backend_lost").await?;
        if self.cut_while_server_ran(&lost).await {
            // Killed (someone's KILL): the session ends as the server ended the connection.
            return Err(self.killed_by_server(&lost));
        }
        Ok(lost)
    }

    async fn recover_lost_commit(
        &mut self,
        error: ConnError,
        request: BytesMut,
        reply_seq: u8,
        seq: u64,
    ) -> Result<(), End> {
        tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost with a COMMIT in flight; reading its commit marker");
        // Restored as the transaction left it: right if it committed; a replay sets its
        // own start below.
        let log = self.txn_log.take();
        let lost = self.move_after_marked_loss(&error).await?;
        let outcome = self
            .read_marker(&lost)
            .await
            .map(|m| m.is_some_and(|m| m.seq >= seq));
        self.markers.txn_writes = false;
        match outcome {
            Some(true) => {
                tracing::info!(
                    session = self.info.id,
                    "the lost COMMIT had committed; answering it"
                );
                self.shared.metrics.commit_outcome("committed");
                self.shared.metrics.requests_retried.inc();
                self.record.status &= !SERVER_STATUS_IN_TRANS;
                let ok = ok_payload(0, 0, self.record.status, 0);
                self.client
                    .write_packet(&ok, reply_seq)
                    .await
                    .map_err(End::Client)
            }
            Some(false) => {
                self.txn_log = log;
                if self.can_replay() && self.start_replay_from_marker().await? {
                    tracing::info!(
                        session = self.info.id,
                        "the lost COMMIT had not committed; transaction replayed, committing again"
                    );
                    self.shared.metrics.commit_outcome("replayed");
                    // The COMMIT again, with a new marker, through the whole path.
                    return self.forward_request(request).await;
                }
                self.txn_log = None;
                self.shared.metrics.commit_outcome("rolled_back");
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::transaction_rolled_back())
                    .await
            }
            None => {
                self.txn_log = None;
                self.shared.metrics.commit_outcome("unknown");
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::commit_outcome_unknown())
                    .await
            }
        }
    }

    /// Replays the transaction whose COMMIT did not commit, from the `LAST_INSERT_ID()` it
    /// started with (the move restored the one it ended with).
    async fn start_replay_from_marker(&mut self) -> Result<bool, End> {
        let start = self.txn_log.as_ref().map_or(0, |l| l.start_last_insert_id);
        if start != self.record.last_insert_id {
            let sql = format!("SELECT LAST_INSERT_ID({start}){}", crate::restore::NO_LIMIT);
            if self.run_own(sql.as_bytes()).await.is_err() {
                return Ok(false);
            }
            self.record.last_insert_id = start;
        }
        self.replay_transaction().await
    }

    /// The session's marker as the session's new backend has it (`Some(None)`: no row;
    /// `None`: it cannot be told). On the node the lost request was sent to, still
    /// running, the old connection must be gone first: its COMMIT may still be running.
    async fn read_marker(&mut self, lost: &LostConn) -> Option<Option<Marker>> {
        let old_thread = lost.thread;
        if self.backend_name == lost.node && self.server_ran_throughout(lost).await != Some(false) {
            let gone = format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {old_thread}{}",
                crate::restore::NO_LIMIT
            );
            let deadline = Instant::now() + OLD_CONNECTION_GONE_WITHIN;
            loop {
                let left = self.backend.query(&gone).await.ok()?;
                if first_value(&left).as_deref() == Some("0") {
                    break;
                }
                if Instant::now() >= deadline {
                    tracing::warn!(
                        session = self.info.id,
                        old_thread,
                        "the old connection is still on the server; outcome unknown"
                    );
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let read = format!(
            "SELECT {}({}){}",
            holdfast_cluster::ha::markers::MARKER_OF,
            self.markers.key,
            crate::restore::NO_LIMIT
        );
        match self.backend.query(&read).await {
            // `"seq affected insert_id"`: the counts are those an earlier holdfast wrote.
            Ok(r) => Some(first_value(&r).map(|v| {
                Marker {
                    seq: v
                        .split(' ')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                }
            })),
            Err(e) => {
                tracing::warn!(session = self.info.id, error = %e, "reading the commit marker failed; outcome unknown");
                None
            }
        }
    }
}

/// `sql` with each of the byte ranges `at` (in order) replaced by `value`.
fn written_in(sql: &[u8], at: &[(usize, usize)], value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(sql.len() + at.len() * value.len());
    let mut from = 0;
    for &(start, end) in at {
        out.extend_from_slice(sql.get(from..start).unwrap_or_default());
        out.extend_from_slice(value.as_bytes());
        from = end;
    }
    out.extend_from_slice(sql.get(from..).unwrap_or_default());
    out
}

/// Whether `sql` names `ROW_COUNT` anywhere (any case): the cheap test before lexing.
fn mentions_row_count(sql: &[u8]) -> bool {
    const NAME: &[u8] = b"ROW_COUNT";
    sql.windows(NAME.len())
        .any(|w| w.eq_ignore_ascii_case(NAME))
}

/// The `ROW_COUNT()` calls of a text that read what the client's last statement left.
#[derive(Debug, Default, PartialEq, Eq)]
struct RowCountCalls {
    /// Byte ranges of `ROW_COUNT ( )` in the text's first statement.
    at: Vec<(usize, usize)>,
    /// `ROW_COUNT` is read where it cannot be written in: later statements of several
    /// (after the first has set it), dynamic SQL (`PREPARE`, `EXECUTE IMMEDIATE`), a
    /// compound statement, `GET DIAGNOSTICS ... = ROW_COUNT`, a text whose executable
    /// comments may run or not.
    elsewhere: bool,
}

impl RowCountCalls {
    fn find(sql: &[u8], mode: holdfast_sql::SqlMode, server: holdfast_sql::Server) -> Self {
        let flags = holdfast_sql::classify_for(sql, mode, server);
        let mut calls = RowCountCalls::default();
        let opaque = flags.intersects(C::COMPOUND.union(C::UNCERTAIN));
        let dynamic = flags.intersects(C::PREPARE_SQL.union(C::EXECUTE_SQL));
        let tokens: Vec<_> = Lexer::for_server(sql, mode, server).collect();
        let mut first = true;
        for (i, t) in tokens.iter().enumerate() {
            if t.is_punct(";") {
                first = false;
            } else if t.kind == holdfast_sql::TokenKind::String {
                calls.elsewhere |= dynamic && mentions_row_count(t.text);
            } else if t.is_word("ROW_COUNT") {
                // `db.row_count()` is a stored function, `x.row_count` a column.
                if i > 0 && tokens.get(i - 1).is_some_and(|p| p.is_punct(".")) {
                    continue;
                }
                // The built-in, written as the server surely reads it: no space before
                // its parenthesis.
                let open = tokens
                    .get(i + 1)
                    .filter(|o| o.is_punct("(") && o.offset == t.end());
                let close = tokens.get(i + 2).filter(|c| c.is_punct(")"));
                match (open, close) {
                    (Some(_), Some(close)) if first && !opaque => {
                        calls.at.push((t.offset, close.end()))
                    }
                    _ => calls.elsewhere = true,
                }
            }
        }
        calls
    }
}

/// A session's marker row.
#[derive(Debug, Clone, Copy)]
struct Marker {
    seq: u64,
}

fn first_value(r: &holdfast_client::TextResult) -> Option<String> {
    r.rows
        .first()
        .and_then(|row| row.first())
        .cloned()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_sql::classify;

    #[test]
    fn only_data_changes_need_a_marker() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a = 1",
            "DELETE FROM t",
            "SELECT * FROM t FOR UPDATE",
        ] {
            assert!(writes_data(classify(sql.as_bytes())), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "BEGIN",
            "COMMIT",
            "SAVEPOINT a",
            "SET @a = 1",
            "SET time_zone = '+00:00'",
        ] {
            assert!(!writes_data(classify(sql.as_bytes())), "{sql}");
        }
    }

    #[test]
    fn row_count_calls_are_written_in_only_where_they_read_the_last_statement() {
        fn find(sql: &str) -> (Vec<&str>, bool) {
            let c = RowCountCalls::find(
                sql.as_bytes(),
                holdfast_sql::SqlMode::DEFAULT,
                holdfast_sql::Server::UNKNOWN,
            );
            let at = c.at.iter().map(|&(a, b)| &sql[a..b]).collect();
            (at, c.elsewhere)
        }
        assert_eq!(find("SELECT ROW_COUNT()"), (vec!["ROW_COUNT()"], false));
        assert_eq!(
            find("select row_count( ) /* ROW_COUNT() */, 'ROW_COUNT()'"),
            (vec!["row_count( )"], false)
        );
        assert_eq!(
            find("INSERT INTO t VALUES (ROW_COUNT()), (Row_Count())"),
            (vec!["ROW_COUNT()", "Row_Count()"], false)
        );
        // A stored function and a column are not the built-in.
        assert_eq!(
            find("SELECT db.ROW_COUNT(), t.row_count FROM t"),
            (vec![], false)
        );
        for sql in [
            "SELECT ROW_COUNT ()",
            "SELECT 1; SELECT ROW_COUNT()",
            "GET DIAGNOSTICS @r = ROW_COUNT",
            "PREPARE s FROM 'SELECT ROW_COUNT()'",
            "EXECUTE IMMEDIATE 'select row_count()'",
            "BEGIN NOT ATOMIC SELECT ROW_COUNT(); END",
            "SELECT row_count FROM t",
        ] {
            assert!(find(sql).1, "{sql}");
        }
        assert_eq!(
            find("SELECT ROW_COUNT(); SELECT ROW_COUNT()"),
            (vec!["ROW_COUNT()"], true)
        );
    }

    #[test]
    fn only_a_plain_commit_is_marked() {
        let marked = |sql: &str| plain_commit(sql.as_bytes(), classify(sql.as_bytes()));
        assert!(marked("COMMIT"));
        assert!(marked("commit work"));
        assert!(!marked("COMMIT AND CHAIN"));
        assert!(!marked("ROLLBACK"));
        assert!(!marked("INSERT INTO t VALUES (1); COMMIT"));
        // Whether the comment runs depends on the server: not marked.
        assert!(!marked("COMMIT /*M!100700 WORK */"));
    }
}

/// The markers' state as a process hands a session, idle outside a transaction, to the
/// one that replaces it: the session's row and sequence go on.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedMarkers {
    key: u64,
    seq: u64,
    refused: bool,
    conditions_kept: bool,
    row_count: Option<i64>,
    reads_row_count: bool,
}

impl Markers {
    /// `None` with a marker in flight or a transaction's writes noted (not a safe point).
    pub(super) fn carry(&self) -> Option<CarriedMarkers> {
        if self.in_flight.is_some() || self.txn_writes || self.execute_as.is_some() {
            return None;
        }
        Some(CarriedMarkers {
            key: self.key,
            seq: self.seq,
            refused: self.refused,
            conditions_kept: self.conditions_kept,
            row_count: self.row_count,
            reads_row_count: self.reads_row_count,
        })
    }

    pub(super) fn from_carried(c: CarriedMarkers) -> Markers {
        Markers {
            key: c.key,
            seq: c.seq,
            refused: c.refused,
            conditions_kept: c.conditions_kept,
            row_count: c.row_count,
            reads_row_count: c.reads_row_count,
            ..Markers::default()
        }
    }
}
