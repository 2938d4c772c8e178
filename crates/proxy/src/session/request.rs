//! A request as a value: what it is ([`Request`], built once by [`Session::classify`]) and
//! what holdfast does with it ([`Plan`], decided once by [`Session::plan`] from the request
//! and the session's state and blockers). The forward phase (`forward.rs`) runs the plan:
//! route, send, observe the answer, and on a lost backend recover as the plan says.
//!
//! Every question of the form "may this request be wrapped, marked, sent to a replica, run
//! again, replayed?" is answered in [`Session::plan`]; the hooks that answer them (split's
//! `read_target`, markers' `wraps_autocommit` and `marks_commit`, replay's `replay_plan`,
//! kill's `plan_kill`) are its inputs, called from there only.

use super::kill::{ByValue, KillMark, KillPlan};
use super::markers::clears_conditions;
use super::migrate::Lost;
use super::replay::Pending;
use super::reply::{reply_seq, Reply};
use super::split::Target;
use super::trackers::mentions_trackers;
use super::{End, Session};
use crate::error::ClientError;
use crate::registry::ReplicaRead;
use crate::state::SessionRecord;
use bytes::{Bytes, BytesMut};
use holdfast_sql::{classify_for, first_keyword, Classification as C, Server, SqlMode};
use holdfast_wire::command::*;
use holdfast_wire::frame::{parse_header, HEADER_LEN};
use holdfast_wire::packets;
use std::sync::Arc;

/// One client request, classified once when it arrives.
pub(super) struct Request {
    /// The whole logical packet, headers included. Rewritten in place where the plan says
    /// so (`ROW_COUNT()` written in, a `KILL`'s id mapped) and, once forwarded, carrying
    /// the backend's statement id.
    pub bytes: BytesMut,
    /// The sequence id of its reply.
    pub reply_seq: u8,
    /// Its reply shape (`None`: an empty request).
    pub reply: Option<Reply>,
    /// Longer than one frame (only its first is classified; never run again).
    pub continues: bool,
    /// The session's transaction was open when it came.
    pub in_transaction: bool,
    /// ...and read-only.
    pub read_only_transaction: bool,
    /// The session's sql_mode before the statement runs (it may change it).
    pub mode: Option<SqlMode>,
    /// The servers it may run on, as far as reading executable comments goes.
    pub server: Server,
    /// A COM_QUERY's classification (of its first frame).
    pub query: Option<C>,
    /// The text and classification of the prepared statement an execute runs.
    pub executed: Option<(Bytes, C)>,
    /// The client's statement id, in a statement command.
    pub client_statement: Option<u32>,
    /// A text that reads or sets the trackers' settings (`@@session_track_...`).
    pub mentions_trackers: bool,
    /// What the session held before it.
    pub held: Held,
    /// A capture was due before it (see [`Plan::opaque_attributable`]).
    pub capture_was_due: bool,
}

impl Request {
    /// The SQL text of a COM_QUERY (of its first frame), as it is now.
    pub fn sql(&self) -> Option<&[u8]> {
        query_text(&self.bytes)
    }

    /// The classification of the statement it runs, sent as text or prepared.
    pub fn flags(&self) -> Option<C> {
        self.query.or(self.executed.as_ref().map(|(_, f)| *f))
    }

    /// The text of the statement it runs, sent as text or prepared.
    pub fn statement_sql(&self) -> Option<&[u8]> {
        self.sql()
            .or(self.executed.as_ref().map(|(sql, _)| &sql[..]))
    }

    /// The request to run again after its backend was lost: a statement command names its
    /// statement by the client's id again (the next backend has its own).
    pub fn for_retry(mut self) -> BytesMut {
        if let (Some(id), Some(&cmd)) = (self.client_statement, self.bytes.get(HEADER_LEN)) {
            if is_statement_command(cmd) {
                packets::set_statement_id(&mut self.bytes[HEADER_LEN..], id);
            }
        }
        self.bytes
    }
}

/// What holdfast does with a request, decided once by [`Session::plan`].
pub(super) struct Plan {
    /// Where it runs.
    pub route: Route,
    /// A split session's replica connections follow it (a close, a reset, a change of
    /// user).
    pub follow_split: bool,
    /// What the session's trackers need before it runs.
    pub trackers: TrackerStep,
    /// holdfast answers it itself instead of sending it (a `KILL` it runs elsewhere or
    /// refuses).
    pub answer: Option<Answer>,
    /// How it is sent to the primary.
    pub send: Send,
    /// The session a `KILL` in it ends, marked before it runs (settled after).
    pub kill_mark: Option<KillMark>,
    /// Whether and as what it joins the transaction log for a replay.
    pub replay: Option<Pending>,
    /// A single data change: an answer without conditions leaves the diagnostics area
    /// empty (see [`clears_conditions`]).
    pub data_change: bool,
    /// Code holdfast does not see into: a state change it reports is explained later (by
    /// the user variables a capture reads) or makes the session's state unknown.
    pub opaque: bool,
    /// The last capture was up to date when it ran: a change of user variables the next
    /// capture finds is this request's. (Else a change may be an earlier statement's, and
    /// explains nothing.)
    pub opaque_attributable: bool,
    /// What a loss of its backend before it answered allows.
    pub loss: LossPlan,
}

/// Where a request runs.
pub(super) enum Route {
    /// On the session's primary connection.
    Primary,
    /// On a replica, if one serves it (a split session's read); else on the primary.
    Replica(Target),
    /// A statement of a read-only transaction pinned to a replica that is not a plain
    /// read there: run as [`Session::pinned_plan`] says (on both connections, on the
    /// primary, or the transaction given up).
    Pinned(super::split::Pinned),
}

/// What the trackers need before a statement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TrackerStep {
    None,
    /// The transaction tracker goes on before the session's first `SET TRANSACTION`.
    TrackTransactions,
    /// The statement reads the trackers' settings: the client's are shown, not holdfast's.
    ShowClientTrackers,
}

/// A `KILL` holdfast answers itself.
pub(super) enum Answer {
    /// A `KILL QUERY` of a split session's read on a replica: run there.
    KillOnReplica(Arc<ReplicaRead>),
    /// A `KILL` of an id holdfast cannot map: the server's own error.
    Refuse(ClientError),
}

/// How a request goes to the primary.
pub(super) enum Send {
    /// As it is.
    Command,
    /// A `COMMIT` behind the session's commit marker.
    MarkedCommit,
    /// An autocommit write wrapped in a transaction with a marker.
    WrappedAutocommit,
    /// A `KILL` of a value holdfast maps once it is known.
    KillByValue(ByValue),
}

/// What a request lost with its backend before it answered allows: what is cheap to know
/// up front; a text's full verdict ([`LossVerdict`]) is read only when it is lost.
#[derive(Debug, Clone, Copy)]
pub(super) struct LossPlan {
    /// Outside a transaction, one frame, and safe to run again as far as its command or
    /// classification says.
    pub retry_safe: bool,
    /// A statement command (not text) inside a transaction that may have committed it.
    pub commits: bool,
    /// The open transaction can be replayed.
    pub replayable: bool,
}

impl LossPlan {
    /// Whether the lost request runs again (after a replay, inside a transaction), and what
    /// the recovery is told of it.
    pub fn verdict(&self, req: &Request) -> (bool, Lost) {
        let (retry, commit) = match (req.query, req.sql()) {
            (Some(flags), Some(sql)) => {
                let verdict = LossVerdict::of(sql, flags, req.mode, req.server);
                (self.retry_safe && verdict.retry_safe, verdict.may_commit)
            }
            _ => (self.retry_safe, self.commits),
        };
        // Inside a transaction: run again after the transaction is replayed, if it can be
        // (not when the statement may have committed it).
        let replay = req.in_transaction && !commit && self.replayable;
        let lost = Lost {
            in_transaction: req.in_transaction,
            commit,
            replay,
        };
        (retry || replay, lost)
    }
}

impl Session {
    /// The classify phase: the request as a value. Its text is classified once, here, for
    /// the record, the plan and retry safety (from its first frame: a longer one is never
    /// retried), under the session's sql_mode (the default one while the session has not
    /// set its own), with executable comments read as the nodes the session may run on
    /// read them. `ROW_COUNT()` is written in first (the text classified is the one sent),
    /// and what the text takes (locks, temporary tables...) is noted in the record.
    pub(super) fn classify(&mut self, mut bytes: BytesMut) -> Result<Request, End> {
        let Some(header) = parse_header(&bytes) else {
            return Err(End::Protocol("empty request".into()));
        };
        let reply_seq = reply_seq(&bytes);
        let reply = Reply::of_request(&bytes);
        tracing::trace!(session = self.info.id, command = bytes.get(HEADER_LEN).copied().unwrap_or_default(), text = %String::from_utf8_lossy(query_text(&bytes).unwrap_or_default()), "request");
        let in_transaction = self.record.in_transaction();
        // (Before this request's own effects are noted.)
        let capture_was_due = self.record.capture_due;
        self.note_found_rows();
        self.classify_found_rows(&bytes);
        self.keep_row_count_across_trackers(&bytes);
        self.keep_row_count_for_found_rows(&bytes);
        self.restore_row_count(&mut bytes);
        let mode = self.record.sql_mode;
        let held = Held::of(&self.record);
        let server = self.server();
        let query = query_text(&bytes).map(|sql| {
            let flags = classify_for(sql, mode.unwrap_or_default(), server);
            self.note_query(flags, sql);
            flags
        });
        // Only LOAD DATA|XML LOCAL makes a server ask for a client file (it cannot be
        // prepared nor run inside a stored program); text not classified (longer than one
        // frame) is given the benefit of the doubt.
        self.exchange.file_expected = match query {
            Some(flags) => flags.intersects(C::LOAD_DATA_LOCAL.union(C::UNCERTAIN)),
            None => bytes.get(HEADER_LEN) == Some(&COM_QUERY),
        };
        let mentions_trackers = query.is_some()
            && !self.record.untracked
            && query_text(&bytes).is_some_and(mentions_trackers);
        let executed = match query {
            None => self.executed_statement(&bytes),
            _ => None,
        };
        Ok(Request {
            client_statement: packets::statement_id(&bytes[HEADER_LEN..]),
            bytes,
            reply_seq,
            reply,
            continues: header.continues(),
            in_transaction,
            read_only_transaction: self.record.status
                & holdfast_wire::caps::SERVER_STATUS_IN_TRANS_READONLY
                != 0,
            mode,
            server,
            query,
            executed,
            mentions_trackers,
            held,
            capture_was_due,
        })
    }

    /// The plan phase: what holdfast does with `req`, from the session's state and
    /// blockers, in one place. A `KILL` is mapped here (its id rewritten, its victim
    /// marked); a split session's read target is chosen here.
    pub(super) fn plan(&mut self, req: &mut Request) -> Plan {
        let loss = LossPlan {
            retry_safe: !req.in_transaction
                && !req.continues
                && match req.query {
                    Some(flags) => retry_safe_flags(flags),
                    None => self.retry_safe_command(&req.bytes),
                },
            commits: req.in_transaction && req.query.is_none() && self.commits_command(&req.bytes),
            replayable: self.can_replay(),
        };
        let split = self.split.is_some();
        if let Some(pinned) = self.pinned_plan(&req.bytes, req.query) {
            return Plan {
                route: Route::Pinned(pinned),
                follow_split: false,
                trackers: TrackerStep::None,
                answer: None,
                send: Send::Command,
                kill_mark: None,
                replay: None,
                data_change: false,
                opaque: false,
                opaque_attributable: true,
                loss,
            };
        }
        // KILLs are mapped to backend threads on the primary connection.
        let follow_split = split && kill_free(req.query, &req.bytes);
        let route = match follow_split && !req.mentions_trackers {
            true => self
                .read_target(&req.bytes, req.query)
                .map_or(Route::Primary, Route::Replica),
            false => Route::Primary,
        };
        let trackers = match req.query {
            // Prepared too: its characteristics are pending like a text one's.
            _ if req.flags().is_some_and(|f| f.has(C::SET_TRANSACTION)) => {
                TrackerStep::TrackTransactions
            }
            // A statement that reads the trackers' settings (`@@session_track_...`, `SHOW
            // VARIABLES LIKE 'session_track%'`) reads the client's, not holdfast's; a SET
            // of one of them is read back after it runs. Not for several statements in one
            // (holdfast would not see their changes outside the client's trackers).
            Some(flags)
                if req.mentions_trackers
                    && !flags.intersects(C::SET_SESSION_VAR.union(C::MULTI)) =>
            {
                TrackerStep::ShowClientTrackers
            }
            _ => TrackerStep::None,
        };
        let command = req.bytes.get(HEADER_LEN).copied();
        let may_kill = req
            .query
            .is_some_and(|f| f.intersects(C::KILL.union(C::EXECUTE_SQL)))
            || matches!(command, Some(COM_PROCESS_KILL | COM_STMT_EXECUTE));
        let kill = match may_kill {
            true => self.plan_kill(&mut req.bytes, req.query),
            false => Ok(KillPlan::Forward(None)),
        };
        let (answer, by_value, kill_mark) = match kill {
            Ok(KillPlan::Forward(mark)) => (None, None, mark),
            Ok(KillPlan::ByValue(kill)) => (None, Some(kill), None),
            Ok(KillPlan::OnReplica(read)) => (Some(Answer::KillOnReplica(read)), None, None),
            Err(e) => (Some(Answer::Refuse(e)), None, None),
        };
        let flags = req.flags();
        let (data_change, marked, wrapped) = match (flags, req.statement_sql()) {
            (Some(flags), Some(sql)) => (
                clears_conditions(sql, flags),
                self.marks_commit(sql, flags, req.in_transaction, self.txn_writes_after(flags)),
                self.wraps_autocommit(sql, flags, req.in_transaction, &req.bytes),
            ),
            _ => (false, false, false),
        };
        let send = match by_value {
            _ if marked => Send::MarkedCommit,
            _ if wrapped => Send::WrappedAutocommit,
            Some(kill) => Send::KillByValue(kill),
            None => Send::Command,
        };
        Plan {
            route,
            follow_split,
            trackers,
            answer,
            send,
            kill_mark,
            replay: self.replay_plan(&req.bytes, flags, req.in_transaction),
            data_change,
            opaque: flags.is_some_and(|f| f.intersects(OPAQUE)),
            opaque_attributable: !req.capture_was_due,
            loss,
        }
    }

    /// The servers a statement of the session may run on, as far as reading executable
    /// comments goes: its backend (by that server's greeting) and every node whose version
    /// the monitor knows (a split session's reads, a move after a failover).
    pub(super) fn server(&self) -> Server {
        let own = Server::from_version(self.backend.greeting.server_version());
        match self.topology.borrow().node_servers {
            Some(nodes) => own.or(nodes),
            None => own,
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
}

/// Statements whose effects on the session holdfast cannot read from their text: a
/// procedure, dynamic SQL, a compound statement, text whose meaning depends on the server's
/// version.
const OPAQUE: C = C::CALL
    .union(C::EXECUTE_SQL)
    .union(C::COMPOUND)
    .union(C::UNCERTAIN);

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
pub(super) struct Held {
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
    pub(super) fn keep(self, r: &mut SessionRecord) {
        r.temporary_tables |= self.temporary_tables;
        r.table_locks |= self.table_locks;
        r.named_locks |= self.named_locks;
        r.xa |= self.xa;
    }

    /// After a request lost before it answered.
    pub(super) fn restore(self, r: &mut SessionRecord) {
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
    use super::{Held, LossPlan, LossVerdict, Request};
    use crate::session::reply::Reply;
    use crate::state::SessionRecord;
    use bytes::BytesMut;
    use holdfast_sql::{classify_for, Server, SqlMode};

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

    /// A text request as `classify` makes it, inside a transaction or not.
    fn text_request(sql: &str, in_transaction: bool) -> Request {
        let mut payload = vec![holdfast_wire::command::COM_QUERY];
        payload.extend_from_slice(sql.as_bytes());
        let bytes = BytesMut::from(&holdfast_wire::frame::packet(&payload, 0)[..]);
        Request {
            bytes,
            reply_seq: 1,
            reply: Some(Reply::ResultSets),
            continues: false,
            in_transaction,
            read_only_transaction: false,
            mode: None,
            server: MARIADB,
            query: Some(classify_for(sql.as_bytes(), SqlMode::DEFAULT, MARIADB)),
            executed: None,
            client_statement: None,
            mentions_trackers: false,
            held: Held::of(&SessionRecord::default()),
            capture_was_due: false,
        }
    }

    #[test]
    fn the_loss_plan_decides_what_a_lost_request_becomes() {
        let plan = |retry_safe, replayable| LossPlan {
            retry_safe,
            commits: false,
            replayable,
        };
        // Outside a transaction: a read runs again, a write does not.
        let (retry, lost) = plan(true, false).verdict(&text_request("SELECT 1", false));
        assert!(retry && !lost.replay && !lost.commit);
        let (retry, _) =
            plan(false, false).verdict(&text_request("INSERT INTO t VALUES (1)", false));
        assert!(!retry);
        // Inside a replayable transaction: a write runs again after the replay; a COMMIT
        // may have committed, so its outcome is unknown and nothing runs again.
        let (retry, lost) =
            plan(false, true).verdict(&text_request("INSERT INTO t VALUES (1)", true));
        assert!(retry && lost.replay && lost.in_transaction && !lost.commit);
        let (retry, lost) = plan(false, true).verdict(&text_request("COMMIT", true));
        assert!(!retry && !lost.replay && lost.commit);
        // Not replayable: the transaction is lost with the backend.
        let (retry, lost) = plan(false, false).verdict(&text_request("UPDATE t SET a = 1", true));
        assert!(!retry && !lost.replay && !lost.commit);
    }
}
