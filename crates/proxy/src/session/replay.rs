//! Transaction replay: the statements of the session's open transaction are kept, each with
//! a checksum of the answer the client got. When the backend is lost mid-transaction, the
//! session moves and runs them again on the new primary; if every answer compares equal,
//! the client carries on as if nothing happened, else the transaction is rolled back and the
//! client gets 1213 as before.
//!
//! Only what can be run again from the statements alone is kept: a transaction that
//! touches state outside itself (temporary tables, locks, XA, user or session variables,
//! `USE`, code holdfast does not see, a client's file, a cursor, long data) is not
//! replayable, nor one larger than `replay_max_bytes`. The checksum covers what the client
//! could compare: column definitions and rows byte for byte, and of each OK, EOF and ERR the
//! affected rows, insert id, warnings, status (less the flags that describe the server's
//! plan or timing) and text.

use super::{End, Session};
use crate::backend::BackendError;
use bytes::{Bytes, BytesMut};
use holdfast_sql::{Classification as C, Lexer, Server, SqlMode, TokenKind};
use holdfast_wire::caps::*;
use holdfast_wire::command::*;
use holdfast_wire::frame::HEADER_LEN;
use holdfast_wire::response::Event;
use std::hash::Hasher;
use std::time::Instant;

/// The running checksum of one answer.
pub(super) type Checksum = twox_hash::XxHash3_64;

/// Statements whose effects reach past the transaction, or that holdfast cannot see into:
/// a transaction that ran one is not replayed.
const NOT_REPLAYABLE: C = C::CHANGES_SESSION
    .union(C::IMPLICIT_COMMIT)
    .union(C::LOAD_DATA_LOCAL)
    .union(C::KILL)
    .union(C::SHUTDOWN);

/// Status flags that describe how the server ran a statement rather than what it
/// answered: left out of the checksum.
const PLAN_FLAGS: u16 = SERVER_STATUS_NO_GOOD_INDEX_USED
    | SERVER_STATUS_NO_INDEX_USED
    | SERVER_QUERY_WAS_SLOW
    | SERVER_SESSION_STATE_CHANGED;

/// Retries of a replay whose own backend was lost too.
const REPLAY_ATTEMPTS: u32 = 3;

/// The open transaction as far as a replay needs it.
#[derive(Debug)]
pub(super) struct TxnLog {
    entries: Vec<Entry>,
    bytes: usize,
    /// Why the transaction cannot be replayed, once that is known (nothing more is kept).
    blocked: Option<&'static str>,
    /// `LAST_INSERT_ID()` when the transaction began: the value its first statements saw.
    pub(super) start_last_insert_id: u64,
}

#[derive(Debug)]
struct Entry {
    /// The request as the client sent it (statement ids are the client's).
    request: Bytes,
    checksum: u64,
}

impl TxnLog {
    pub(super) fn replayable(&self) -> bool {
        self.blocked.is_none()
    }

    /// The client closed prepared statement `id` (its id as the client knows it): a kept
    /// execute of it could not run again (an ERR to the client in the middle of the replay,
    /// or, with the id reused, another statement), so the transaction is not replayable.
    pub(super) fn statement_closed(&mut self, id: u32) {
        let executes_it = self.entries.iter().any(|e| {
            matches!(
                e.request.get(HEADER_LEN),
                Some(&(COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE))
            ) && e
                .request
                .get(HEADER_LEN..)
                .and_then(holdfast_wire::packets::statement_id)
                == Some(id)
        });
        if executes_it {
            self.blocked = Some("a prepared statement it executed was closed");
            self.entries = Vec::new();
        }
    }
}

/// What a request contributes to the transaction log, decided before it runs.
pub(super) struct Pending {
    /// The request as it is kept (`None`: not kept, the transaction is not replayable).
    copy: Option<Bytes>,
    blocked: Option<&'static str>,
    /// The request starts a new transaction (`BEGIN`, `START TRANSACTION`, or the first
    /// statement after autocommit was turned off).
    fresh: bool,
    last_insert_id: u64,
}

impl Session {
    /// Before a request runs: whether it joins the transaction log, and as what. `None`
    /// when replay is off, or the request neither is in a transaction nor may start one,
    /// or it changes nothing a replay needs (a ping, a prepare...). Starts the checksum of
    /// its answer when it is kept.
    pub(super) fn replay_before(
        &mut self,
        request: &[u8],
        query: Option<C>,
        in_transaction: bool,
    ) -> Option<Pending> {
        let proxy = &self.shared.config.proxy;
        if !proxy.transaction_replay {
            return None;
        }
        let &cmd = request.get(HEADER_LEN)?;
        if matches!(
            cmd,
            COM_PING
                | COM_STMT_PREPARE
                | COM_STMT_CLOSE
                | COM_STMT_RESET
                | COM_STATISTICS
                | COM_FIELD_LIST
                | COM_QUIT
        ) {
            return None;
        }
        let begins = query.is_some_and(|f| f.has(C::BEGIN_TXN));
        let autocommit = self.record.status & SERVER_STATUS_AUTOCOMMIT != 0;
        if !in_transaction && !begins && autocommit {
            return None;
        }
        let fresh = begins || !in_transaction;
        if !fresh && self.txn_log.as_ref().is_some_and(|l| !l.replayable()) {
            return None;
        }
        let mut pending = Pending {
            copy: None,
            blocked: None,
            fresh,
            last_insert_id: self.record.last_insert_id,
        };
        let held = self
            .txn_log
            .as_ref()
            .filter(|_| !fresh)
            .map_or(0, |l| l.bytes);
        pending.blocked = if fresh && !self.record.next_transaction.is_empty() {
            Some("one-shot transaction characteristics")
        } else if held + request.len() > proxy.replay_max_bytes {
            Some("larger than replay_max_bytes")
        } else {
            self.replay_blocker(cmd, request, query)
        };
        if pending.blocked.is_none() {
            pending.copy = Some(self.kept_copy(cmd, request));
            self.checksum = Some(Box::default());
        }
        Some(pending)
    }

    /// Why a request makes its transaction not replayable, if it does.
    fn replay_blocker(&self, cmd: u8, request: &[u8], query: Option<C>) -> Option<&'static str> {
        match cmd {
            COM_QUERY => {
                let flags = query?;
                if flags.intersects(NOT_REPLAYABLE) {
                    return Some("a statement with effects outside the transaction");
                }
                let sql = request.get(HEADER_LEN + 1..).unwrap_or_default();
                let mode = self.record.sql_mode.unwrap_or_default();
                mentions_user_variable(sql, mode, self.server()).then_some("a user variable")
            }
            COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE => {
                let id = holdfast_wire::packets::statement_id(request.get(HEADER_LEN..)?)?;
                let id = self.statements.resolve(id);
                let Some(stmt) = self.statements.get(id) else {
                    return Some("an unknown prepared statement");
                };
                let cursor = cmd == COM_STMT_EXECUTE
                    && request
                        .get(HEADER_LEN + 5)
                        .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0);
                if cursor {
                    Some("a cursor")
                } else if !stmt.replayable {
                    Some("a prepared statement with effects outside the transaction")
                } else {
                    None
                }
            }
            _ => Some("a command that is not replayed"),
        }
    }

    /// The request as it is kept: an execute names its statement by the client's id and
    /// carries the parameter types in effect (a later execute may send others).
    fn kept_copy(&self, cmd: u8, request: &[u8]) -> Bytes {
        if cmd == COM_STMT_EXECUTE {
            let stmt = holdfast_wire::packets::statement_id(&request[HEADER_LEN..])
                .map(|id| self.statements.resolve(id))
                .and_then(|id| self.statements.get(id).map(|s| (id, s)));
            if let Some((id, stmt)) = stmt {
                let mut copy = super::forward::with_types(stmt, request)
                    .unwrap_or_else(|| BytesMut::from(request));
                holdfast_wire::packets::set_statement_id(&mut copy[HEADER_LEN..], id);
                return copy.freeze();
            }
        }
        Bytes::copy_from_slice(request)
    }

    /// After a request answered in full: the log follows the transaction (kept, started,
    /// or dropped when none is open any more).
    pub(super) fn replay_after(&mut self, pending: Option<Pending>) {
        let checksum = self.checksum.take().map(|h| h.finish());
        if !self.record.in_transaction() {
            self.txn_log = None;
            return;
        }
        let Some(pending) = pending else {
            return;
        };
        if pending.fresh || self.txn_log.is_none() {
            self.txn_log = Some(Box::new(TxnLog {
                entries: Vec::new(),
                bytes: 0,
                blocked: None,
                start_last_insert_id: pending.last_insert_id,
            }));
        }
        let Some(log) = self.txn_log.as_mut() else {
            return;
        };
        match (pending.blocked, pending.copy, checksum) {
            (None, Some(request), Some(checksum)) => {
                log.bytes += request.len();
                log.entries.push(Entry { request, checksum });
            }
            (blocked, _, _) => {
                let why = blocked.unwrap_or("no checksum");
                tracing::debug!(session = self.info.id, why, "transaction not replayable");
                log.blocked = Some(why);
                log.entries = Vec::new();
            }
        }
    }

    /// Whether the transaction lost with the backend can be replayed.
    pub(super) fn can_replay(&self) -> bool {
        self.txn_log.as_ref().is_some_and(|l| l.replayable())
    }

    /// Runs the lost transaction again on the session's new backend. `Ok(true)`: every
    /// answer compared equal, the transaction is open again where it was. `Ok(false)`: not
    /// replayable, or an answer differed (the replay is rolled back): the client gets 1213.
    pub(super) async fn replay_transaction(&mut self) -> Result<bool, End> {
        let Some(log) = self.txn_log.take().filter(|l| l.replayable()) else {
            return Ok(false);
        };
        let started = Instant::now();
        let mut attempt = 1;
        'replay: loop {
            for (at, entry) in log.entries.iter().enumerate() {
                let mut request = BytesMut::from(&entry.request[..]);
                self.checksum = Some(Box::default());
                self.replaying = true;
                let result = self.command(&mut request).await;
                self.replaying = false;
                let checksum = self.checksum.take().map(|h| h.finish());
                match result {
                    Ok(()) if checksum == Some(entry.checksum) => {}
                    Ok(()) => {
                        tracing::info!(
                            session = self.info.id,
                            statement = at + 1,
                            of = log.entries.len(),
                            "transaction replay diverged: an answer differs from the one the client got; rolling back"
                        );
                        self.shared.metrics.replay("diverged");
                        self.roll_back_replay().await;
                        return Ok(false);
                    }
                    Err(End::BackendLost {
                        started: false,
                        error,
                    }) if attempt < REPLAY_ATTEMPTS => {
                        tracing::info!(session = self.info.id, %error, attempt, "backend lost during a transaction replay; replaying again");
                        attempt += 1;
                        self.mark_backend_dead();
                        self.transaction_lost = false;
                        self.record.last_insert_id = log.start_last_insert_id;
                        self.relocate("backend_lost").await?;
                        continue 'replay;
                    }
                    Err(End::BackendLost { error, .. }) => {
                        tracing::info!(session = self.info.id, %error, "backend lost again during a transaction replay; giving up");
                        self.shared.metrics.replay("failed");
                        self.mark_backend_dead();
                        self.transaction_lost = false;
                        return Ok(false);
                    }
                    Err(e) => return Err(e),
                }
            }
            break;
        }
        tracing::info!(
            session = self.info.id,
            statements = log.entries.len(),
            ms = started.elapsed().as_millis() as u64,
            "transaction replayed"
        );
        self.shared.metrics.replay("replayed");
        self.txn_log = Some(log);
        Ok(true)
    }

    /// Ends a replay that diverged: its transaction is rolled back on the new backend.
    async fn roll_back_replay(&mut self) {
        self.txn_log = None;
        if let Err(e) = crate::restore::execute(&mut self.backend, b"ROLLBACK").await {
            tracing::info!(session = self.info.id, error = %e, "rolling back a diverged replay failed");
            if matches!(e, BackendError::Conn(_)) {
                self.mark_backend_dead();
                self.transaction_lost = false;
            }
        }
        self.record.status &= !SERVER_STATUS_IN_TRANS;
    }
}

/// Adds what the client could compare of one inspected packet to `h`.
pub(super) fn checksum_event(h: &mut Checksum, event: &Event<'_>, payload: &[u8]) {
    match event {
        Event::Ok(ok) => {
            h.write_u8(0);
            h.write_u64(ok.affected_rows);
            h.write_u64(ok.last_insert_id);
            h.write_u16(ok.status & !PLAN_FLAGS);
            h.write_u16(ok.warnings);
            h.write(ok.info);
        }
        Event::Eof(eof) => {
            h.write_u8(1);
            h.write_u16(eof.status & !PLAN_FLAGS);
            h.write_u16(eof.warnings);
        }
        _ => {
            h.write_u8(2);
            h.write(payload);
        }
    }
}

/// Whether a statement's text may be part of a replayed transaction, read under the
/// session's `mode` (when it is not known, under every mode that could read it otherwise)
/// for `server`.
pub(super) fn replayable_sql(sql: &[u8], mode: Option<SqlMode>, server: Server) -> bool {
    let fine = |m: SqlMode| {
        !holdfast_sql::classify_for(sql, m, server).intersects(NOT_REPLAYABLE)
            && !mentions_user_variable(sql, m, server)
    };
    match mode {
        Some(m) => fine(m),
        None => fine(SqlMode::DEFAULT) && SqlMode::alternatives(sql).all(fine),
    }
}

/// Whether `sql` names a user variable (`@a`, not `@@a`): a quick look for `@` first.
fn mentions_user_variable(sql: &[u8], mode: SqlMode, server: Server) -> bool {
    sql.contains(&b'@')
        && Lexer::for_server(sql, mode, server).any(|t| t.kind == TokenKind::UserVar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_variables_are_told_from_system_variables_and_strings() {
        let m = SqlMode::DEFAULT;
        let s = Server::mariadb(101119);
        assert!(mentions_user_variable(b"UPDATE t SET a = @x", m, s));
        assert!(mentions_user_variable(b"SELECT @`a b`", m, s));
        assert!(!mentions_user_variable(b"SELECT @@tx_isolation", m, s));
        assert!(!mentions_user_variable(
            b"INSERT INTO t VALUES ('a@b.c')",
            m,
            s
        ));
        assert!(!mentions_user_variable(b"SELECT 1", m, s));
        // Behind a comment the server skips, a quote hides nothing.
        assert!(mentions_user_variable(
            b"UPDATE t SET a = 1 /*!90000 ' */, b = @x -- '",
            m,
            s
        ));
    }

    #[test]
    fn the_checksum_leaves_out_plan_flags_and_keeps_the_answer() {
        use holdfast_wire::packets::OkPacket;
        let ok = |status, affected| OkPacket {
            header: 0,
            affected_rows: affected,
            last_insert_id: 7,
            status,
            warnings: 0,
            info: b"",
            session_state: b"",
        };
        let sum = |ok| {
            let mut h = Checksum::default();
            checksum_event(&mut h, &Event::Ok(ok), b"");
            h.finish()
        };
        let plain = sum(ok(SERVER_STATUS_IN_TRANS, 1));
        assert_eq!(
            plain,
            sum(ok(SERVER_STATUS_IN_TRANS | SERVER_STATUS_NO_INDEX_USED, 1))
        );
        assert_ne!(plain, sum(ok(SERVER_STATUS_IN_TRANS, 2)));
        assert_ne!(plain, sum(ok(0, 1)));
    }
}
