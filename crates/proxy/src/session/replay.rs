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
/// answered: left out of the checksum. So are the session's `NO_BACKSLASH_ESCAPES` and
/// `ANSI_QUOTES`: a read of a pinned read-only transaction runs again after a `SET
/// sql_mode` made since (seed 2046 session 540, seed 2048 sessions 262 and 547); what the
/// mode changes of an answer is in its rows. And `autocommit`, for the same reason: `SET
/// autocommit = 0` inside a read-only transaction leaves it open (seed 2048 session 1296).
const PLAN_FLAGS: u16 = SERVER_STATUS_AUTOCOMMIT
    | SERVER_STATUS_NO_GOOD_INDEX_USED
    | SERVER_STATUS_NO_INDEX_USED
    | SERVER_QUERY_WAS_SLOW
    | SERVER_SESSION_STATE_CHANGED
    | SERVER_STATUS_NO_BACKSLASH_ESCAPES
    | SERVER_STATUS_ANSI_QUOTES;

/// Retries of a replay whose own backend was lost too.
const REPLAY_ATTEMPTS: u32 = 3;

/// Why a transaction grown past `replay_max_bytes` is not replayable.
pub(super) const TOO_LARGE: &str = "larger than replay_max_bytes";

/// The open transaction as far as a replay needs it.
#[derive(Debug)]
pub(super) struct TxnLog {
    /// The kept requests one after the other: one heap block for all of them, not one (with
    /// its headers) per request.
    requests: Vec<u8>,
    entries: Vec<Entry>,
    /// Why the transaction cannot be replayed, once that is known (nothing more is kept).
    blocked: Option<&'static str>,
    /// `LAST_INSERT_ID()` when the transaction began: the value its first statements saw.
    pub(super) start_last_insert_id: u64,
}

/// One kept request: where it ends in `TxnLog::requests` (it starts where the one before
/// ends), and the checksum of the answer the client got.
#[derive(Debug, Clone, Copy)]
struct Entry {
    end: usize,
    checksum: u64,
}

/// Room for this many entries, then this many request bytes, when a log first grows.
const FIRST_ENTRIES: usize = 16;
const FIRST_REQUEST_BYTES: usize = 1024;

/// What the heap really takes for a block of `size` bytes: glibc's malloc on a 64-bit host
/// adds an 8-byte chunk header and rounds the chunk to 16 bytes (32 at least); a block past
/// its mmap threshold (128 KiB) takes whole pages.
fn heap_block(size: usize) -> usize {
    const MMAP_THRESHOLD: usize = 128 * 1024;
    const PAGE: usize = 4096;
    match size {
        0 => 0,
        n if n + 8 >= MMAP_THRESHOLD => (n + 16).next_multiple_of(PAGE),
        n => (n + 8).next_multiple_of(16).max(32),
    }
}

impl TxnLog {
    /// The log of a transaction that is not replayable, for `why`.
    pub(super) fn not_replayable(why: &'static str) -> Self {
        let mut log = Self::new(0);
        log.give_up(why);
        log
    }

    fn new(start_last_insert_id: u64) -> Self {
        TxnLog {
            requests: Vec::new(),
            entries: Vec::new(),
            blocked: None,
            start_last_insert_id,
        }
    }

    pub(super) fn replayable(&self) -> bool {
        self.blocked.is_none()
    }

    /// Why the transaction is not replayable, if it is not.
    pub(super) fn blocked(&self) -> Option<&'static str> {
        self.blocked
    }

    /// The bytes the log holds on the heap: itself (it is boxed) and its two vectors at their
    /// capacities, each block as the allocator takes it. This is what `replay_max_bytes`
    /// bounds.
    pub(super) fn held(&self) -> usize {
        Self::held_with(self.entries.capacity(), self.requests.capacity())
    }

    fn held_with(entries: usize, request_bytes: usize) -> usize {
        heap_block(std::mem::size_of::<TxnLog>())
            + heap_block(entries.saturating_mul(std::mem::size_of::<Entry>()))
            + heap_block(request_bytes)
    }

    /// The capacities (entries, request bytes) the log takes to keep one more request of
    /// `len` bytes within `max` held bytes; `None` when it cannot. The vectors double as
    /// they grow (a push stays cheap), but never past `max`: near it a vector grows only
    /// to what still fits.
    fn room_for(&self, len: usize, max: usize) -> Option<(usize, usize)> {
        let need_entries = self.entries.len() + 1;
        let need_bytes = self.requests.len().checked_add(len)?;
        let mut entries = self.entries.capacity().max(need_entries);
        let mut bytes = self.requests.capacity().max(need_bytes);
        if Self::held_with(entries, bytes) > max {
            return None;
        }
        if need_entries > self.entries.capacity() {
            let want = (self.entries.capacity() * 2).max(FIRST_ENTRIES);
            entries = largest_fitting(need_entries, want, |c| Self::held_with(c, bytes) <= max);
        }
        if need_bytes > self.requests.capacity() {
            let want = (self.requests.capacity() * 2).max(FIRST_REQUEST_BYTES);
            bytes = largest_fitting(need_bytes, want, |c| Self::held_with(entries, c) <= max);
        }
        Some((entries, bytes))
    }

    /// Keeps `request` with its answer's `checksum`, if the log then still holds at most
    /// `max` bytes; else the transaction is not replayable any more.
    fn keep(&mut self, request: &[u8], checksum: u64, max: usize) {
        let Some((entries, bytes)) = self.room_for(request.len(), max) else {
            self.give_up(TOO_LARGE);
            return;
        };
        // `reserve_exact`: the capacities chosen above, not the vector's own doubling.
        self.entries
            .reserve_exact(entries.saturating_sub(self.entries.len()));
        self.requests
            .reserve_exact(bytes.saturating_sub(self.requests.len()));
        self.requests.extend_from_slice(request);
        self.entries.push(Entry {
            end: self.requests.len(),
            checksum,
        });
    }

    fn give_up(&mut self, why: &'static str) {
        self.blocked = Some(why);
        self.entries = Vec::new();
        self.requests = Vec::new();
    }

    /// The kept requests, in order, with their checksums.
    fn kept(&self) -> impl Iterator<Item = (&[u8], u64)> {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let request = self.requests.get(start..e.end).unwrap_or_default();
            start = e.end;
            (request, e.checksum)
        })
    }

    /// The client closed prepared statement `id` (its id as the client knows it): a kept
    /// execute of it could not run again (an ERR to the client in the middle of the replay,
    /// or, with the id reused, another statement), so the transaction is not replayable.
    pub(super) fn statement_closed(&mut self, id: u32) {
        let executes_it = self.kept().any(|(request, _)| {
            matches!(
                request.get(HEADER_LEN),
                Some(&(COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE))
            ) && request
                .get(HEADER_LEN..)
                .and_then(holdfast_wire::packets::statement_id)
                == Some(id)
        });
        if executes_it {
            self.give_up("a prepared statement it executed was closed");
        }
    }
}

/// The largest capacity from `least` up to `want` that `fits` (`least` itself when none
/// larger does; `fits` grows false with the capacity).
fn largest_fitting(least: usize, want: usize, fits: impl Fn(usize) -> bool) -> usize {
    if want <= least || fits(want) {
        return want.max(least);
    }
    let (mut lo, mut hi) = (least, want);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
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
    /// Whether a request joins the transaction log, and as what (for the request's plan).
    /// `None` when replay is off, or the request neither is in a transaction nor may start
    /// one, or it changes nothing a replay needs (a ping, a prepare...).
    pub(super) fn replay_plan(
        &self,
        request: &[u8],
        query: Option<C>,
        in_transaction: bool,
    ) -> Option<Pending> {
        let proxy = &self.shared.config().proxy;
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
        if !fresh && self.txn_log.as_ref().is_none_or(|l| !l.replayable()) {
            // Not logged from its start (a reload turned `transaction_replay` on since):
            // a log of its later statements only would replay part of it. The next one is.
            return None;
        }
        let mut pending = Pending {
            copy: None,
            blocked: None,
            fresh,
            last_insert_id: self.record.last_insert_id,
        };
        // What the log would hold with this request too (checked again when it is kept).
        let fits = match self.txn_log.as_ref().filter(|_| !fresh) {
            Some(log) => log.room_for(request.len(), proxy.replay_max_bytes),
            None => TxnLog::new(0).room_for(request.len(), proxy.replay_max_bytes),
        }
        .is_some();
        pending.blocked = if fresh && !self.record.next_transaction.is_empty() {
            Some("one-shot transaction characteristics")
        } else if !fits {
            Some(TOO_LARGE)
        } else {
            self.replay_blocker(cmd, request, query)
        };
        Some(pending)
    }

    /// Just before a request the log keeps goes out: its copy is taken and the checksum of
    /// its answer started.
    pub(super) fn replay_start(&mut self, pending: Option<&mut Pending>, request: &[u8]) {
        let Some(pending) = pending.filter(|p| p.blocked.is_none()) else {
            return;
        };
        let Some(&cmd) = request.get(HEADER_LEN) else {
            return;
        };
        pending.copy = Some(self.kept_copy(cmd, request));
        self.exchange.checksum = Some(Box::default());
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
    pub(super) fn kept_copy(&self, cmd: u8, request: &[u8]) -> Bytes {
        if cmd == COM_STMT_EXECUTE {
            let stmt = holdfast_wire::packets::statement_id(&request[HEADER_LEN..])
                .map(|id| self.statements.resolve(id))
                .and_then(|id| self.statements.get(id).map(|s| (id, s)));
            if let Some((id, stmt)) = stmt {
                let mut copy = super::statements::with_types(stmt, request)
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
        if !self.shared.config().proxy.transaction_replay {
            // Turned off by a reload in the middle of a transaction: its log would miss
            // what follows, so it goes (a loss rolls the transaction back, as without).
            if self.txn_log.take().is_some() {
                self.publish_replay_account();
            }
            return;
        }
        self.keep_request(pending);
        self.publish_replay_account();
    }

    fn keep_request(&mut self, pending: Option<Pending>) {
        let checksum = self.exchange.checksum.take().map(|h| h.finish());
        if !self.record.in_transaction() {
            self.txn_log = None;
            return;
        }
        let Some(pending) = pending else {
            return;
        };
        if pending.fresh || self.txn_log.is_none() {
            self.txn_log = Some(Box::new(TxnLog::new(pending.last_insert_id)));
        }
        let Some(log) = self.txn_log.as_mut() else {
            return;
        };
        match (pending.blocked, pending.copy, checksum) {
            (None, Some(request), Some(checksum)) => log.keep(
                &request,
                checksum,
                self.shared.config().proxy.replay_max_bytes,
            ),
            (blocked, _, _) => log.give_up(blocked.unwrap_or("no checksum")),
        }
        if let Some(why) = log.blocked() {
            tracing::debug!(session = self.info.id, why, "transaction not replayable");
        }
    }

    /// The replay log's account, for `/status`: bytes held, and why the open transaction
    /// is not replayable.
    pub(super) fn publish_replay_account(&self) {
        let log = self.txn_log.as_deref();
        self.info.set_replay(
            log.map_or(0, |l| l.held() as u64),
            log.and_then(|l| l.blocked()),
        );
    }

    /// The `transaction_replays` outcome of a lost transaction that is not replayed.
    pub(super) fn not_replayable_outcome(&self) -> &'static str {
        match self.txn_log.as_ref().and_then(|l| l.blocked()) {
            Some(TOO_LARGE) => "too_large",
            _ => "not_replayable",
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
            for (at, (kept, answered)) in log.kept().enumerate() {
                let mut request = BytesMut::from(kept);
                self.exchange.checksum = Some(Box::default());
                self.exchange.replaying = true;
                let result = self.command(&mut request).await;
                self.exchange.replaying = false;
                let checksum = self.exchange.checksum.take().map(|h| h.finish());
                match result {
                    Ok(()) if checksum == Some(answered) => {}
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
        if let Err(e) = self.run_own(b"ROLLBACK").await {
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

    /// `INSERT INTO t VALUES (n)` as a COM_QUERY packet.
    fn tiny_insert(n: usize) -> Vec<u8> {
        let sql = format!("INSERT INTO t VALUES ({n})");
        let mut p = vec![0; HEADER_LEN];
        p.push(COM_QUERY);
        p.extend_from_slice(sql.as_bytes());
        p
    }

    #[test]
    fn the_log_holds_no_more_than_its_limit_counting_what_the_heap_holds() {
        let max = 4096;
        let mut log = TxnLog::new(0);
        let mut sent = 0;
        let mut kept = 0;
        while log.replayable() {
            let request = tiny_insert(kept);
            log.keep(&request, kept as u64, max);
            if log.replayable() {
                kept += 1;
                sent += request.len();
                // The account is the blocks at their capacities, never past the limit.
                assert_eq!(
                    log.held(),
                    TxnLog::held_with(log.entries.capacity(), log.requests.capacity())
                );
                assert!(log.held() <= max, "{} > {max}", log.held());
            }
        }
        assert_eq!(log.blocked(), Some(TOO_LARGE));
        assert_eq!(log.held(), heap_block(std::mem::size_of::<TxnLog>()));
        // Each tiny statement costs its bytes plus an entry: the log gives up well before
        // the statements alone would reach the limit (the old account let 4096 / 29 = 141
        // through).
        assert!(sent < max * 3 / 4, "{sent} bytes of statements kept");
        assert!(kept > 0);
        // What was kept reads back in order.
        let mut fresh = TxnLog::new(0);
        for n in 0..3 {
            fresh.keep(&tiny_insert(n), n as u64, max);
        }
        let back: Vec<(Vec<u8>, u64)> = fresh.kept().map(|(r, c)| (r.to_vec(), c)).collect();
        assert_eq!(
            back,
            (0..3)
                .map(|n| (tiny_insert(n), n as u64))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn growth_near_the_limit_takes_only_what_fits() {
        let max = 64 * 1024;
        let mut log = TxnLog::new(0);
        let request = vec![7u8; 1000];
        let mut kept = 0;
        while log.replayable() {
            log.keep(&request, 0, max);
            kept += usize::from(log.replayable());
            assert!(log.held() <= max);
        }
        // Doubling alone would have stopped at 32 KiB of requests; capped growth fills the
        // limit (less the entries and the blocks' overhead).
        assert!(kept * 1000 > max * 9 / 10, "{kept} requests kept");
        // A request larger than the limit is never kept.
        let mut log = TxnLog::new(0);
        log.keep(&vec![0u8; max], 0, max);
        assert_eq!(log.blocked(), Some(TOO_LARGE));
        assert_eq!(largest_fitting(5, 3, |_| false), 5);
        assert_eq!(largest_fitting(5, 100, |c| c <= 40), 40);
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
