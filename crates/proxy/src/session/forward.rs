//! The forward phase: one request, from its classification to what its answer leaves
//! behind. A backend lost before the answer reached the client is hidden when that is
//! safe (the session moves and the request runs again), or the client learns what became
//! of its request.

use super::relay::WATCH_CLIENT_AFTER;
use super::reply::{reply_seq, Reply};
use super::trackers::mentions_trackers;
use super::{End, Session};
use crate::error::code::ER_CONNECTION_KILLED;
use crate::state::SessionRecord;
use bytes::{Bytes, BytesMut};
use holdfast_sql::{
    classify_for, first_keyword, own_password_change, Classification as C, PasswordChange, Server,
    SqlMode,
};
use holdfast_wire::command::*;
use holdfast_wire::frame::{parse_header, HEADER_LEN};
use holdfast_wire::packets;
use std::sync::atomic::Ordering;

/// Statements whose effects on the session holdfast cannot read from their text: a
/// procedure, dynamic SQL, a compound statement, text whose meaning depends on the server's
/// version.
const OPAQUE: C = C::CALL
    .union(C::EXECUTE_SQL)
    .union(C::COMPOUND)
    .union(C::UNCERTAIN);

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
        self.restore_row_count(&mut request);
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
        self.exchange.file_expected = match query {
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
        if self.split.is_some() && self.changes_pinned_session(&request, query) {
            return self.leave_pinned_transaction(reply_seq).await;
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
        let data_change = match (flags, sql) {
            (Some(flags), Some(sql)) => super::markers::clears_conditions(sql, flags),
            _ => false,
        };
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
            Err(_) => self.exchange.checksum = None,
        }
        // A request that failed may have stopped before what it would have released (a
        // multi-statement ends at its first error: `...; UNLOCK TABLES` after a failing
        // statement does not run): what was held before is still held, as far as holdfast
        // can tell (keeping a blocker too long only costs a wrap or a move).
        if self.exchange.error.is_some() {
            held.keep(&mut self.record);
        }
        let marked = self.take_marked();
        if result.is_ok() {
            self.markers_after(data_change);
        }
        if opaque && self.record.state_change_reported {
            self.record.opaque_change = true;
            self.record.capture_due = true;
        }
        if let Some(mark) = kill {
            self.settle_kill(mark, self.exchange.error);
        }
        if query.is_some_and(|f| f.intersects(C::PREPARE_SQL.union(C::DEALLOCATE_SQL))) {
            if let Some(sql) = query_text(&request) {
                let ok = result.is_ok() && self.exchange.error.is_none();
                self.note_sql_prepared(sql, ok);
            }
        }
        // SET PASSWORD and ALTER USER are implicit commits to the classifier: nothing more
        // is read for any other statement.
        if result.is_ok()
            && self.exchange.error.is_none()
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
            && (result.is_err() || self.exchange.error == Some(ER_CONNECTION_KILLED))
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
}

/// Not a KILL (those are mapped to backend threads on the primary connection).
fn kill_free(query: Option<C>, request: &[u8]) -> bool {
    !query.is_some_and(|f| f.has(C::KILL)) && request.get(HEADER_LEN) != Some(&COM_PROCESS_KILL)
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
