//! The forward phase: one request, as a value ([`Request`]) with its [`Plan`], through
//! ordered phases: classify, plan, route, the trackers' step, send, observe, and on a
//! backend lost before the answer reached the client, recover. A lost backend is hidden
//! when that is safe (the session moves and the request runs again), or the client learns
//! what became of its request. What each phase may do is decided in the plan
//! (`request.rs`); the phases only carry it out.

use super::markers::InFlight;
use super::migrate::Lost;
use super::relay::{SchemaSwitch, WATCH_CLIENT_AFTER};
use super::reply::Reply;
use super::request::{Answer, LossPlan, Plan, Request, Route, Send, TrackerStep};
use super::route::Routed;
use super::split::ReadOutcome;
use super::{End, Session};
use crate::error::code::ER_CONNECTION_KILLED;
use bytes::BytesMut;
use holdfast_sql::{
    first_keyword, own_password_change, Classification as C, PasswordChange, SqlMode,
};
use std::sync::atomic::Ordering;

impl Session {
    /// Forwards one request and relays its response, phase by phase: classify, plan,
    /// route (a replica, or holdfast's own answer), the trackers' step, send, observe the
    /// answer, and on a backend lost before the answer reached the client, recover as the
    /// plan allows (the session moves and the request runs again, or the client learns
    /// what became of it).
    pub(super) async fn forward_request(&mut self, request: BytesMut) -> Result<(), End> {
        // Between requests the timer is the idle probe; during one, the wait after which
        // holdfast watches for the client going away.
        self.idle_timer
            .arm(tokio::time::Instant::now() + WATCH_CLIENT_AFTER);
        let mut req = self.classify(request)?;
        let mut plan = self.plan(&mut req);
        if self.route_request(&mut req, &mut plan).await? == Routed::Answered {
            return Ok(());
        }
        // Balancing by load counts the primary's requests too.
        let _on_primary = self.split.as_mut().and_then(|s| s.on_primary());
        let tracked = self.tracker_step(plan.trackers).await;
        if let Some(answer) = plan.answer.take() {
            return self.answer_request(answer, req.reply_seq).await;
        }
        self.before_send(&req, &mut plan);
        let result = match tracked {
            Ok(()) => self.send(&mut req, &mut plan).await,
            Err(e) => Err(e),
        };
        let marked = self.observe(&req, &mut plan, result.is_ok());
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
            && (req.mentions_trackers || self.record.trackers_overridden)
        {
            self.reassert_trackers().await?;
        }
        self.on_backend_lost(req, plan.loss, result, marked).await
    }

    /// The route phase of a request: a statement of a read-only transaction on a replica
    /// that is not a plain read runs as the pinned transaction allows; a split session's
    /// read runs on a replica when one serves it (`Answered`), else it comes back for the
    /// primary; the replica connections follow what the request changes.
    async fn route_request(&mut self, req: &mut Request, plan: &mut Plan) -> Result<Routed, End> {
        match std::mem::replace(&mut plan.route, Route::Primary) {
            Route::Pinned(pinned) => {
                let bytes = std::mem::take(&mut req.bytes);
                Box::pin(self.run_pinned(pinned, bytes, req.reply_seq)).await?;
                return Ok(Routed::Answered);
            }
            Route::Replica(target) => {
                let bytes = std::mem::take(&mut req.bytes);
                match Box::pin(self.read_on_replica(target, bytes)).await? {
                    ReadOutcome::Done => return Ok(Routed::Answered),
                    ReadOutcome::Primary(bytes) => req.bytes = bytes,
                }
            }
            Route::Primary => {}
        }
        if plan.follow_split {
            self.split_follow(&req.bytes).await;
        }
        Ok(Routed::Forward)
    }

    /// What the trackers need before the statement runs (see [`TrackerStep`]).
    async fn tracker_step(&mut self, step: TrackerStep) -> Result<(), End> {
        match step {
            TrackerStep::None => Ok(()),
            TrackerStep::TrackTransactions => self.track_transactions().await,
            TrackerStep::ShowClientTrackers => self.show_client_trackers().await,
        }
    }

    /// Answers a request holdfast does not send (see [`Answer`]).
    async fn answer_request(&mut self, answer: Answer, reply_seq: u8) -> Result<(), End> {
        match answer {
            // Boxed, as the rare kill below: inline, its future would grow every
            // session's by kilobytes.
            Answer::KillOnReplica(read) => {
                Box::pin(self.answer_kill_of_replica_read(&read, reply_seq)).await
            }
            Answer::Refuse(error) => self.send_error(reply_seq, &error).await,
        }
    }

    /// Just before the request goes to the primary: what an executed prepared statement
    /// does to the session is noted as a text statement's is (a temporary table, a named
    /// lock, user variables); the transaction log starts keeping it (and the checksum of
    /// its answer); the markers note whether the transaction writes.
    fn before_send(&mut self, req: &Request, plan: &mut Plan) {
        if let Some((sql, flags)) = &req.executed {
            self.note_query(*flags, sql);
        }
        self.record.state_change_reported = false;
        // A schema change of the request's own reports the schema whatever else does.
        if req.query.is_some_and(|f| f.has(C::USE_DB))
            || req.bytes.get(holdfast_wire::frame::HEADER_LEN)
                == Some(&holdfast_wire::command::COM_INIT_DB)
        {
            self.exchange.owed_schema = None;
        }
        self.exchange.schema_switch = self.schema_switch(req);
        self.replay_start(plan.replay.as_mut(), &req.bytes);
        self.note_writes(req.flags());
    }

    /// Which of a request's statements execute a statement prepared with `PREPARE` under
    /// another schema than the current one. In a multi-statement (seed 2050 session 907)
    /// each statement answers once unless it is a `CALL` (then nothing is told apart, as
    /// before); a `USE` or `PREPARE` in the text changes what the `EXECUTE`s after it
    /// switch to: those are not told apart either.
    fn schema_switch(&self, req: &Request) -> SchemaSwitch {
        let Some(flags) = req.query.filter(|f| f.has(C::EXECUTE_SQL)) else {
            return SchemaSwitch::None;
        };
        let Some(sql) = req.sql() else {
            return SchemaSwitch::None;
        };
        let mode = req.mode.unwrap_or_default();
        let current = self.record.schema.as_deref();
        let elsewhere = |stmt: &[u8]| match holdfast_sql::parse_sql_prepared(stmt, mode) {
            Some(holdfast_sql::SqlPrepared::Execute { name }) => {
                self.statements.sql_runs_elsewhere(&name, current)
            }
            _ => false,
        };
        if !flags.has(C::MULTI) {
            return match elsewhere(sql) {
                true => SchemaSwitch::Whole,
                false => SchemaSwitch::None,
            };
        }
        if flags.has(C::CALL) {
            return SchemaSwitch::None;
        }
        let mut bits = 0u64;
        for (i, r) in holdfast_sql::Statements::for_server(sql, mode, req.server)
            .enumerate()
            .take(64)
        {
            let stmt = &sql[r];
            if elsewhere(stmt) {
                bits |= 1 << i;
            } else if holdfast_sql::classify_for(stmt, mode, req.server)
                .intersects(C::USE_DB.union(C::PREPARE_SQL))
            {
                break;
            }
        }
        match bits {
            0 => SchemaSwitch::None,
            bits => SchemaSwitch::At(bits),
        }
    }

    /// The send phase: the request goes to the primary as the plan says, and its answer
    /// is relayed.
    async fn send(&mut self, req: &mut Request, plan: &mut Plan) -> Result<(), End> {
        if self.split.is_some() {
            // (The primary takes any value: never refused here.)
            self.carry_found_rows(&req.bytes, None).await?;
            self.found_rows_ran(None);
        }
        match std::mem::replace(&mut plan.send, Send::Command) {
            Send::MarkedCommit => self.commit_with_marker(&req.bytes).await,
            Send::WrappedAutocommit => self.autocommit_with_marker(&req.bytes).await,
            // Boxed: rare, and its future is large (it looks the target up on the server).
            Send::KillByValue(kill) => {
                Box::pin(self.kill_by_value(&req.bytes, kill, req.reply_seq)).await
            }
            Send::Command => self.command(&mut req.bytes).await,
        }
    }

    /// The observe phase, once the answer is in (`ok`) or the exchange failed: the
    /// transaction log, what the session holds, the markers, a `KILL`'s mark, SQL-level
    /// prepared `KILL`s, the session's own password. Returns what was in flight behind a
    /// marker, for a recovery.
    fn observe(&mut self, req: &Request, plan: &mut Plan, ok: bool) -> Option<InFlight> {
        self.exchange.schema_switch = SchemaSwitch::None;
        match ok {
            true => self.replay_after(plan.replay.take()),
            false => self.exchange.checksum = None,
        }
        // A request that failed may have stopped before what it would have released (a
        // multi-statement ends at its first error: `...; UNLOCK TABLES` after a failing
        // statement does not run): what was held before is still held, as far as holdfast
        // can tell (keeping a blocker too long only costs a wrap or a move).
        if self.exchange.error.is_some() {
            req.held.keep(&mut self.record);
        }
        let marked = self.take_marked();
        if ok {
            self.markers_after(plan.data_change);
            if self.exchange.error.is_some()
                && req.bytes.get(holdfast_wire::frame::HEADER_LEN)
                    == Some(&holdfast_wire::command::COM_STMT_PREPARE)
            {
                // A prepare the server refused set `ROW_COUNT()` to -1, there as directly.
                self.row_count_reset_by_server();
            }
        }
        if plan.opaque && self.record.state_change_reported {
            self.record.opaque_change = true;
            self.record.capture_due = true;
            self.opaque_unattributable |= !plan.opaque_attributable;
        }
        // User variables set beside or after the opaque statement, before a capture has
        // looked, would pass for its change (seed 2048 session 1402: the procedure made a
        // temporary table, `SET @a` came next).
        if self.record.opaque_change && req.flags().is_some_and(|f| f.has(C::SET_USER_VAR)) {
            self.opaque_unattributable = true;
        }
        if self.exchange.error.is_some() {
            // An ERR fills the diagnostics area, whatever the statement would have kept
            // of it had it run (a refused prepare of `SHOW WARNINGS`, of `DEALLOCATE`):
            // what the next statement reads of the last one is the primary's.
            self.split_last_on_primary();
        }
        if let Some(mark) = plan.kill_mark.take() {
            self.settle_kill(mark, self.exchange.error);
        }
        let answered_ok = ok && self.exchange.error.is_none();
        if answered_ok {
            self.note_read_only_linger(req);
        }
        if req
            .query
            .is_some_and(|f| f.intersects(C::PREPARE_SQL.union(C::DEALLOCATE_SQL)))
        {
            if let Some(sql) = req.sql() {
                self.note_sql_prepared(sql, answered_ok);
                self.note_sql_prepared_schemas(sql, req.mode.unwrap_or_default(), answered_ok);
            }
        }
        // SET PASSWORD and ALTER USER are implicit commits to the classifier: nothing more
        // is read for any other statement.
        if answered_ok && req.query.is_some_and(|f| f.has(C::IMPLICIT_COMMIT)) {
            if let Some(sql) = req.sql() {
                self.note_password_change(sql, req.mode.unwrap_or_default());
            }
        }
        marked
    }

    /// MariaDB's read-only state that outlives a read-only transaction ended by `SET
    /// autocommit = 1` (see [`SessionRecord::read_only_lingers`](crate::state::SessionRecord::read_only_lingers)):
    /// noted after such a `SET`, forgotten after a `COMMIT` or `ROLLBACK`.
    fn note_read_only_linger(&mut self, req: &Request) {
        let Some(flags) = req.flags() else {
            return;
        };
        if flags.has(C::AUTOCOMMIT)
            && req.in_transaction
            && req.read_only_transaction
            && !self.record.in_transaction()
        {
            self.record.read_only_lingers = true;
        } else if flags.has(C::END_TXN) && !flags.has(C::BEGIN_TXN) {
            self.record.read_only_lingers = false;
        }
    }

    /// The on-backend-lost phase: a backend lost before any of the answer reached the
    /// client is recovered from as the request's [`LossPlan`] allows; any other outcome
    /// is the request's.
    async fn on_backend_lost(
        &mut self,
        req: Request,
        loss: LossPlan,
        result: Result<(), End>,
        marked: Option<InFlight>,
    ) -> Result<(), End> {
        match result {
            // The client waits for nothing: it must get nothing, not even an error.
            Err(End::BackendLost {
                started: false,
                error,
            }) if req.reply == Some(Reply::None) => {
                self.lost_without_reply(&req.bytes, error);
                Ok(())
            }
            // The client's file was read to its end, none of it run: one ERR answers it.
            Err(End::BackendLostDuringFile { error, reply_seq }) => {
                let lost = Lost {
                    in_transaction: req.in_transaction,
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
                req.held.restore(&mut self.record);
                let reply_seq = req.reply_seq;
                Box::pin(self.recover_lost_marked(error, req.bytes, reply_seq, m)).await
            }
            Err(End::BackendLost {
                started: false,
                error,
            }) => {
                req.held.restore(&mut self.record);
                let reply_seq = req.reply_seq;
                let (retry, lost) = loss.verdict(&req);
                let retry = retry.then(|| req.for_retry());
                Box::pin(self.recover_lost_request(error, retry, reply_seq, lost)).await
            }
            other => other,
        }
    }

    /// The schema each `PREPARE` of a text (one statement or several) was made under. A
    /// failed text ran its statements up to the one that failed (each answered before the
    /// ERR); with a CALL among them, which answers more than once, none is known to have.
    fn note_sql_prepared_schemas(&mut self, sql: &[u8], mode: SqlMode, ok: bool) {
        let server = self.server();
        let ran = match ok || holdfast_sql::classify_for(sql, mode, server).has(C::CALL) {
            true if ok => usize::MAX,
            true => 0,
            false => self.exchange.results as usize,
        };
        for (at, range) in holdfast_sql::Statements::for_server(sql, mode, server).enumerate() {
            match holdfast_sql::parse_sql_prepared(&sql[range], mode) {
                Some(holdfast_sql::SqlPrepared::Prepare { name, .. }) => {
                    let schema = (at < ran).then(|| self.record.schema.clone());
                    self.statements.note_sql_prepared(name, schema);
                }
                Some(holdfast_sql::SqlPrepared::Deallocate { name }) => {
                    self.statements.note_sql_prepared(name, None);
                }
                _ => {}
            }
        }
    }

    pub(super) fn note_query(&mut self, flags: C, sql: &[u8]) {
        if flags.has(C::MULTI) {
            // Statement by statement, in their order: `UNLOCK TABLES; LOCK TABLES t READ`
            // ends holding the lock, `LOCK ...; UNLOCK ...` not.
            let mode = self.record.sql_mode.unwrap_or_default();
            let server = self.server();
            let statements: Vec<_> =
                holdfast_sql::Statements::for_server(sql, mode, server).collect();
            if statements.len() > 1 {
                for range in statements {
                    let stmt = &sql[range];
                    self.note_statement(holdfast_sql::classify_for(stmt, mode, server), stmt);
                }
                return;
            }
        }
        self.note_statement(flags, sql);
    }

    /// [`Session::note_query`] for one statement.
    fn note_statement(&mut self, flags: C, sql: &[u8]) {
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
        let Some(change) = own_password_change(sql, mode, &self.identity.user) else {
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
