//! Read/write splitting (`routing = "split"`): a session keeps, besides its primary
//! connection, one connection per replica it reads from, opened on first use with the
//! session's state (schema, variables) and synced again when that state changes. A read
//! that may run anywhere ([`holdfast_sql::read_route`]; prepared statements by their text)
//! goes to the replica with the fewest requests in flight, outside transactions and while
//! the session holds nothing that lives on its primary connection (temporary tables,
//! locks, cursors...). Before it runs there, the replica waits for what the read must see
//! (`[split] consistency`): the session's own last write (its `last_gtid`, reported by the
//! server's tracker) or the primary's position. A replica that cannot serve the read (none
//! qualifies, it cannot be reached, it does not catch up within `causal_wait_ms`, it is
//! lost before answering) leaves the read to the primary: the client never sees why.

use super::found_rows::FoundRows;
use super::migrate::{prepare, MoveError};
use super::reply::Reply;
use super::{End, Session};
use crate::backend::BackendConn;
use crate::config::Consistency;
use crate::restore::{self, VariableTypes};
use bytes::BytesMut;
use holdfast_client::conn::PacketConn;
use holdfast_cluster::topology::{NodeLoad, NodeName, NodeState, Topology};
use holdfast_sql::{Classification as C, ReadRoute};
use holdfast_wire::caps::{
    CLIENT_DEPRECATE_EOF, SERVER_STATUS_AUTOCOMMIT, SERVER_STATUS_IN_TRANS,
    SERVER_STATUS_IN_TRANS_READONLY,
};
use holdfast_wire::command::{
    COM_QUERY, COM_STMT_CLOSE, COM_STMT_EXECUTE, COM_STMT_PREPARE, CURSOR_TYPE_READ_ONLY,
};
use holdfast_wire::frame::{parse_header, HEADER_LEN};
use holdfast_wire::packets;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// A split session's replica side.
pub(super) struct Split {
    readers: Vec<Reader>,
    /// The node the session's last statement ran on, when it was a replica.
    last_on: Option<NodeName>,
    /// That statement's request, as the client sent it: it only read, so it can run
    /// again on the primary for a statement that reads what it left but cannot run there.
    last_read: Option<BytesMut>,
    /// The read to run again on the primary before the request about to go there (boxed:
    /// it lives for one request, and every idle split session would keep its room).
    rerun: Option<Box<BytesMut>>,
    /// Warnings (or an error) in the diagnostics area: of the last read on a replica, and
    /// of the primary's connection when the session went from it to the replicas.
    read_warned: bool,
    primary_warned: bool,
    /// The last statement sent to the primary opens no table: it kept the diagnostics
    /// area as it was.
    primary_kept: bool,
    /// The read about to run opens no table (it keeps the diagnostics area).
    tableless: bool,
    /// A `START TRANSACTION READ ONLY` transaction open on this replica: the session's
    /// statements go there until it ends.
    txn_on: Option<NodeName>,
    /// A read-only transaction had to be given up on its replica (a statement in it would
    /// have changed the session there only): this session's read-only transactions run on
    /// the primary from then on.
    read_only_on_primary: bool,
    /// The request being routed begins a read-only transaction on a replica.
    read_only_start: bool,
    /// A read-only transaction of the primary's own is open beside the one pinned to a
    /// replica: the pinned transaction's statements that are not plain reads run in it.
    shadow: bool,
    /// Such a statement is running on the primary: it is not routed again.
    probing: bool,
    /// The pinned transaction's reads on its replica, to run again on the primary should
    /// the transaction move there.
    pinned_reads: PinnedReads,
    /// The pinned transaction was given up after a statement that changed the session on
    /// the primary: the client's next statement learns so (1213).
    given_up: bool,
    /// Where the session's `FOUND_ROWS()` lives.
    pub(super) found_rows: FoundRows,
    /// The topology reads are routed by, refreshed when the monitor publishes a new one.
    topology: Arc<Topology>,
    watch: watch::Receiver<Arc<Topology>>,
    /// Spreads reads over equally loaded replicas.
    turn: usize,
}

/// The reads a read-only transaction pinned to a replica ran there, each with the
/// checksum of the answer the client got (see [`Session::move_pinned_to_primary`]).
/// Boxed, from the first: every split session keeps one, and few ever pin a transaction.
#[derive(Default)]
struct PinnedReads(Option<Box<KeptReads>>);

#[derive(Default)]
struct KeptReads {
    reads: Vec<PinnedRead>,
    bytes: usize,
    /// One was not kept (the whole grew past `replay_max_bytes`): the transaction cannot
    /// move.
    incomplete: bool,
}

struct PinnedRead {
    /// The request, an execute naming the client's id with the parameter types in effect.
    request: bytes::Bytes,
    checksum: u64,
    /// An execute's statement text: prepared again for the move if the client closed it.
    sql: Option<bytes::Bytes>,
    /// The session's schema when it ran: it runs again in that one (a `USE` since, made
    /// on both connections, changed the current one).
    schema: Option<String>,
    /// It opens no table and names no system variable but the diagnostics counts
    /// (`SELECT @@warning_count`, `SELECT NOW(6)`): its answer says nothing of the
    /// snapshot or of the node, and may differ on the primary (the diagnostics area there
    /// is another statement's). It runs again for what it leaves (`FOUND_ROWS()`), its
    /// answer not compared (seed 2054 session 51). (`@@server_id`, a global, are still
    /// compared: the client would see the node change inside its transaction.)
    reads_no_table: bool,
}

impl PinnedReads {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |k| k.reads.len())
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn incomplete(&self) -> bool {
        self.0.as_ref().is_some_and(|k| k.incomplete)
    }

    /// Forgets the reads after the first `len`.
    fn truncate(&mut self, len: usize) {
        if let Some(kept) = self.0.as_mut() {
            kept.reads.truncate(len);
        }
    }

    /// The reads kept, and none from now on.
    fn take(&mut self) -> Vec<PinnedRead> {
        self.0.take().map_or_else(Vec::new, |k| k.reads)
    }

    fn keep(&mut self, read: Option<PinnedRead>, max_bytes: usize) {
        self.0
            .get_or_insert_with(Box::default)
            .keep(read, max_bytes);
    }
}

impl KeptReads {
    fn keep(&mut self, read: Option<PinnedRead>, max_bytes: usize) {
        let size = read.as_ref().map_or(0, |r| {
            r.request.len() + r.sql.as_ref().map_or(0, |s| s.len())
        });
        match read {
            Some(read) if !self.incomplete && self.bytes + size <= max_bytes => {
                self.bytes += size;
                self.reads.push(read);
            }
            _ => {
                self.incomplete = true;
                self.reads = Vec::new();
                self.bytes = 0;
            }
        }
    }
}

/// One connection of the session to a replica.
struct Reader {
    /// Its node and server thread, published in the session's registry entry while a read
    /// runs here.
    read: Arc<crate::registry::ReplicaRead>,
    conn: BackendConn,
    load: Arc<NodeLoad>,
    /// The session's [`state_version`](crate::state::SessionRecord::state_version) it has.
    state_version: u64,
    /// Its server's (shared: [`restore::TypesCache`]).
    types: Arc<VariableTypes>,
    /// The client's statement ids prepared here: this connection's id, and whether it has
    /// seen the statement's parameter types.
    statements: super::lazy_map::LazyMap<u32, (u32, bool)>,
    /// The highest position this connection has waited for, per GTID domain (a slice of
    /// the domains' number, where a `Vec` would keep room for four).
    waited: Box<[(u32, u64)]>,
    /// Its diagnostics area holds warnings (or an error): a read without tables, which
    /// keeps it, does not run here unless the session's last statement ran here.
    warned: bool,
}

impl Drop for Reader {
    fn drop(&mut self) {
        // (Dropping the connection says COM_QUIT to the server.)
        self.load.closed(self.read.thread);
    }
}

impl Split {
    /// The session idles: the replica connections' empty read buffers go, and the kept
    /// requests are copied out of the client's read buffer (a slice of it keeps all of it).
    pub(super) fn release_buffers(&mut self) {
        for reader in &mut self.readers {
            reader.conn.conn.release_buffer();
        }
        for kept in [self.last_read.as_mut(), self.rerun.as_deref_mut()]
            .into_iter()
            .flatten()
        {
            *kept = BytesMut::from(&kept[..]);
        }
    }

    /// The replica connections' streams: an idle session parks them with its own and takes
    /// them back into the reactor when it wakes (`parking.rs`).
    pub(super) fn reader_streams(&mut self) -> impl Iterator<Item = &mut PacketConn> {
        self.readers.iter_mut().map(|r| &mut r.conn.conn)
    }

    pub(super) fn new(watch: watch::Receiver<Arc<Topology>>) -> Box<Split> {
        let topology = watch.borrow().clone();
        Box::new(Split {
            readers: Vec::new(),
            last_on: None,
            last_read: None,
            rerun: None,
            read_warned: false,
            primary_warned: false,
            primary_kept: false,
            tableless: false,
            txn_on: None,
            read_only_on_primary: false,
            read_only_start: false,
            shadow: false,
            probing: false,
            pinned_reads: PinnedReads::default(),
            given_up: false,
            found_rows: FoundRows::default(),
            topology,
            watch,
            turn: 0,
        })
    }

    /// Closes every replica connection (the session's user or state was reset).
    pub(super) fn close_all(&mut self) {
        self.readers.clear();
        self.found_rows.lost();
        self.forget_last();
        self.txn_on = None;
        self.shadow = false;
        self.given_up = false;
    }

    /// The last statement ran on the primary (or its replica is gone).
    fn forget_last(&mut self) {
        self.last_on = None;
        self.last_read = None;
        self.rerun = None;
    }

    fn refresh(&mut self) {
        if self.watch.has_changed().unwrap_or(false) {
            self.topology = self.watch.borrow_and_update().clone();
            let topology = &self.topology;
            let pinned = self.txn_on.as_deref();
            // Connections to nodes gone from the topology, or being removed, go (but the
            // one holding a read-only transaction, which the drain window lets finish).
            self.readers.retain(|r| {
                topology
                    .nodes
                    .iter()
                    .any(|n| n.name == r.read.node && (!n.draining || pinned == Some(&r.read.node)))
            });
            // A connection handed over before this process knew its node counts on the
            // node's own load from now on.
            for r in &mut self.readers {
                if let Some(n) = topology.nodes.iter().find(|n| n.name == r.read.node) {
                    if !Arc::ptr_eq(&r.load, &n.load.0) {
                        r.load.closed(r.read.thread);
                        n.load.0.opened(r.read.thread);
                        r.load = n.load.0.clone();
                    }
                }
            }
            if let Some(node) = &self.last_on {
                if !self.readers.iter().any(|r| &r.read.node == node) {
                    self.forget_last();
                }
            }
            let readers = &self.readers;
            self.found_rows
                .keep_if(|node| readers.iter().any(|r| r.read.node == node));
        }
    }

    /// The node with the fewest requests in flight, weighted (`Some(None)`: the primary,
    /// by its weight; `None`: no node takes reads).
    fn choose(&mut self, primary_weight: f64) -> Option<Option<NodeState>> {
        let nodes = &self.topology.nodes;
        let primary = self.topology.primary;
        self.turn = self.turn.wrapping_add(1);
        let mut best: Option<(f64, usize)> = None;
        for k in 0..nodes.len() {
            let i = (self.turn + k) % nodes.len();
            let n = &nodes[i];
            let score = if Some(i) == primary {
                if primary_weight <= 0.0 {
                    continue;
                }
                f64::from(n.load.0.active()) / primary_weight
            } else if n.serves_reads {
                f64::from(n.load.0.active())
            } else {
                continue;
            };
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, i));
            }
        }
        let (_, i) = best?;
        Some((Some(i) != primary).then(|| nodes[i].clone()))
    }

    /// Counts a request on the primary for as long as the guard lives (so that balancing
    /// with `primary_read_weight` sees the primary's load).
    pub(super) fn on_primary(&mut self) -> Option<Active> {
        self.refresh();
        let load = self.topology.primary_node()?.load.0.clone();
        load.active.fetch_add(1, Ordering::Relaxed);
        Some(Active(load))
    }

    /// The node of the session's connection `i` to a replica.
    pub(super) fn reader_node(&self, i: usize) -> Option<&NodeName> {
        self.readers.get(i).map(|r| &r.read.node)
    }

    /// The session's connection `i` to a replica.
    pub(super) fn reader_conn(&mut self, i: usize) -> Option<&mut BackendConn> {
        self.readers.get_mut(i).map(|r| &mut r.conn)
    }

    /// The node the session's last statement ran on (`None`: the primary).
    pub(super) fn last_node(&self) -> Option<&NodeName> {
        self.last_on.as_ref()
    }

    /// Whether a read-only transaction is pinned to a replica.
    pub(super) fn pinned(&self) -> bool {
        self.txn_on.is_some()
    }

    pub(super) fn reader(&self, node: &str) -> Option<usize> {
        self.readers.iter().position(|r| r.read.node == node)
    }

    /// Closes the session's connection to `node`.
    fn drop_reader(&mut self, node: &str) {
        self.readers.retain(|r| r.read.node != node);
        self.found_rows.keep_if(|n| n != node);
        if self.last_on.as_deref() == Some(node) {
            self.forget_last();
        }
    }
}

/// A request in flight on a node, counted in its [`NodeLoad`] until dropped.
pub(super) struct Active(Arc<NodeLoad>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a request of a split session goes.
#[derive(Debug)]
pub(super) enum Target {
    /// A replica chosen by load (with the wait its consistency needs).
    Balanced,
    /// The replica the last statement ran on (it reads what that statement left).
    Last(NodeName),
    /// The replica holding the session's read-only transaction.
    Pinned(NodeName),
}

/// What became of a read offered to a replica.
pub(super) enum ReadOutcome {
    /// It ran there; the client has its answer.
    Done,
    /// It goes to the primary after all.
    Primary(BytesMut),
}

/// The schemas that hold the server's own state rather than the application's data.
fn is_system_schema(schema: &str) -> bool {
    ["information_schema", "performance_schema", "sys", "mysql"]
        .iter()
        .any(|s| schema.eq_ignore_ascii_case(s))
}

/// A GTID `domain-server-seq` as (domain, seq).
fn parse_gtid(gtid: &str) -> Option<(u32, u64)> {
    let mut parts = gtid.trim().split('-');
    let domain = parts.next()?.parse().ok()?;
    let _server: u32 = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((domain, seq))
}

/// What becomes of a statement of a read-only transaction pinned to a replica that is not
/// left to the replica as it is (see [`Session::pinned_plan`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Pinned {
    /// The statement may end the transaction or changes the session in a way the
    /// replica's connection cannot follow: the transaction moves to the primary, or is
    /// given up (1213) when it cannot.
    Leave,
    /// A setting (session or user variables, the current database): run on the replica,
    /// which answers, then on the primary, so that both connections have it.
    Mirror,
    /// Not a plain read: runs on the primary, inside a read-only transaction of its own,
    /// and the client gets the server's answer (1792 for a write). With its flags, and
    /// how it begins when it is a multi-statement.
    Primary(C, Opening),
    /// The transaction was given up after the last statement: this one gets 1213.
    GivenUp,
    /// The client's ROLLBACK of a transaction given up: it runs on the primary as it is.
    Rolled,
    /// A statement that commits the transaction before it runs (DDL, `LOCK TABLES`,
    /// `BEGIN`...): the pinned transaction is committed (it only read), then the statement
    /// runs on the primary as any other.
    Commit,
}

/// The 1213 of a read-only transaction on a replica given up after a statement that changed
/// the session on the primary.
fn given_up_error() -> crate::error::ClientError {
    crate::error::ClientError::new(
        crate::error::ErrorKind::TransactionRolledBack,
        "Deadlock found when trying to get lock; try restarting transaction (holdfast: this \
         read-only transaction ran on a replica and the last statement changed the session on \
         the primary only; it was rolled back, and this session's read-only transactions run \
         on the primary from now on)",
    )
}

/// Whether one statement only makes settings ([`SETTINGS`]) from values of its own: no
/// function, no query (whose value would come from the snapshot of the node that runs it).
fn plain_setting(flags: C, sql: &[u8], mode: holdfast_sql::SqlMode) -> bool {
    flags.intersects(SETTINGS)
        && flags
            .difference(
                SETTINGS
                    .union(C::AUTOCOMMIT)
                    .union(C::READ_ONLY)
                    .union(C::WRITE),
            )
            .is_empty()
        && !has_subquery(sql, mode)
}

/// Whether `sql` is `SET [SESSION] autocommit = 0|OFF` and nothing else (turning it on
/// inside a transaction commits it).
fn turns_autocommit_off(sql: &[u8], mode: holdfast_sql::SqlMode) -> bool {
    let tokens: Vec<_> = holdfast_sql::Lexer::with_mode(sql, mode)
        .filter(|t| !t.is_punct(";"))
        .collect();
    let rest = match tokens.as_slice() {
        [set, rest @ ..] if set.is_word("SET") => rest,
        _ => return false,
    };
    let rest = match rest {
        [scope, rest @ ..] if scope.is_word("SESSION") || scope.is_word("LOCAL") => rest,
        _ => rest,
    };
    let name = |t: &holdfast_sql::Token<'_>| {
        let text = t.text.strip_prefix(b"@@").unwrap_or(t.text);
        let text = text
            .strip_prefix(b"session.")
            .or_else(|| text.strip_prefix(b"SESSION."))
            .or_else(|| text.strip_prefix(b"local."))
            .unwrap_or(text);
        text.eq_ignore_ascii_case(b"autocommit")
    };
    match rest {
        [var, eq, value] => {
            name(var)
                && (eq.is_punct("=") || eq.is_punct(":="))
                && (value.text == b"0" || value.is_word("OFF"))
        }
        _ => false,
    }
}

/// The COM_STMT_CLOSE payload for a connection's statement `id`.
pub(super) fn close_statement(id: u32) -> [u8; 5] {
    let [a, b, c, d] = id.to_le_bytes();
    [COM_STMT_CLOSE, a, b, c, d]
}

/// The text of a COM_QUERY (its first frame).
fn query_sql(request: &[u8]) -> Option<&[u8]> {
    let header = parse_header(request)?;
    if request.get(HEADER_LEN) != Some(&COM_QUERY) {
        return None;
    }
    let end = HEADER_LEN + header.len.min(request.len() - HEADER_LEN);
    request.get(HEADER_LEN + 1..end)
}

/// Whether a statement may open no table, so that it leaves the diagnostics area
/// (warnings, errors) as the statement before it left it: `USE`, plain `SET`s, transaction
/// control, a `SELECT` or `DO` without tables (`SELECT @@in_transaction`), a `CALL`, SQL
/// `PREPARE`, `EXECUTE`, `DEALLOCATE`. Saying so of a statement that does open one only
/// costs a read run again.
fn keeps_diagnostics_area(
    flags: C,
    sql: &[u8],
    mode: holdfast_sql::SqlMode,
    server: holdfast_sql::Server,
) -> bool {
    let quiet = SETTINGS
        .union(C::AUTOCOMMIT)
        .union(C::SET_TRANSACTION)
        .union(C::BEGIN_TXN)
        .union(C::END_TXN)
        .union(C::SAVEPOINT)
        .union(C::XA);
    let settings = flags.intersects(quiet)
        && flags
            .difference(quiet.union(C::READ_ONLY).union(C::WRITE))
            .is_empty()
        && !has_subquery(sql, mode);
    // A procedure, or dynamic SQL, keeps it when its own statements do (`DO GET_LOCK(...)`
    // inside); `PREPARE` and `DEALLOCATE PREPARE` in SQL keep it.
    let code = C::CALL
        .union(C::EXECUTE_SQL)
        .union(C::PREPARE_SQL)
        .union(C::DEALLOCATE_SQL);
    // A multi-statement keeps it when each of its statements does (seed 2052 session 11);
    // a piece without a statement (a comment after the last `;`) is answered with an
    // error of its own.
    if flags.has(C::MULTI) {
        return holdfast_sql::Statements::for_server(sql, mode, server).all(|r| {
            let stmt = &sql[r];
            let f = holdfast_sql::classify_for(stmt, mode, server);
            holdfast_sql::first_keyword(stmt).is_some()
                && !f.has(C::MULTI)
                && keeps_diagnostics_area(f, stmt, mode, server)
        });
    }
    // `UNLOCK TABLES` too (`LOCK TABLES` opens its tables: it clears it); tried. And the
    // statements that read the area: `SHOW [COUNT(*)] WARNINGS|ERRORS` (tried).
    settings
        || only_unlocks(flags)
        || shows_diagnostics(sql, mode, server)
        || flags.intersects(code)
        || opens_no_table(sql, mode, server)
}

/// The words of `sql`, read as `server` runs its executable comments.
fn words_of(
    sql: &[u8],
    mode: holdfast_sql::SqlMode,
    server: holdfast_sql::Server,
) -> impl Iterator<Item = holdfast_sql::Token<'_>> {
    holdfast_sql::Lexer::for_server(sql, mode, server)
        .filter(|t| t.kind == holdfast_sql::TokenKind::Word)
}

/// Whether `sql` is `SHOW [COUNT(*)] WARNINGS|ERRORS [LIMIT ...]`.
fn shows_diagnostics(
    sql: &[u8],
    mode: holdfast_sql::SqlMode,
    server: holdfast_sql::Server,
) -> bool {
    let mut words = words_of(sql, mode, server);
    words.next().is_some_and(|w| w.is_word("SHOW"))
        && words
            .next()
            .is_some_and(|w| w.is_word("WARNINGS") || w.is_word("ERRORS") || w.is_word("COUNT"))
}

/// Whether a statement is `UNLOCK TABLES` alone (a `LOCK TABLES` statement counts as both).
fn only_unlocks(flags: C) -> bool {
    flags.has(C::UNLOCK_TABLES) && !flags.has(C::LOCK_TABLES)
}

/// Whether `sql` is a `SELECT` or `DO` without tables (`SELECT DATABASE()`, `SELECT
/// @@x`): MariaDB leaves the diagnostics area as the statement before it left it. Read as
/// `server` runs its executable comments (MariaDB skips `/*!50700 , NEXTVAL(s) */`: seed
/// 2045 session 513).
pub(super) fn opens_no_table(
    sql: &[u8],
    mode: holdfast_sql::SqlMode,
    server: holdfast_sql::Server,
) -> bool {
    let mut words = words_of(sql, mode, server);
    words
        .next()
        .is_some_and(|w| w.is_word("SELECT") || w.is_word("DO"))
        && !words.any(|w| {
            [
                "FROM", "INTO", "TABLE", "CALL", "NEXTVAL", "LASTVAL", "SETVAL", "VALUE",
            ]
            .iter()
            .any(|k| w.is_word(k))
        })
}

/// Whether `sql` has a query inside (`SET @b = (SELECT ...)`): its value comes from the
/// snapshot of the node that runs it.
fn has_subquery(sql: &[u8], mode: holdfast_sql::SqlMode) -> bool {
    holdfast_sql::Lexer::with_mode(sql, mode)
        .any(|t| t.is_word("SELECT") || t.is_word("TABLE") || t.is_word("VALUES"))
}

/// What runs again on the primary in place of a read a `KILL QUERY` or `max_statement_time`
/// stopped on a replica, when the next statement needs the primary's diagnostics area to
/// be the read's (see `Split::rerun`): not the read (a server stops it once, and it may
/// run for minutes), but a `SIGNAL` of the same error, which leaves the area as the read
/// left the replica's (MariaDB 10.11's English messages).
fn interrupted_read_stand_in(code: u16) -> Option<BytesMut> {
    let message = match code {
        1317 => "Query execution was interrupted",
        1969 => "Query execution was interrupted (max_statement_time exceeded)",
        _ => return None,
    };
    let sql =
        format!("SIGNAL SQLSTATE '70100' SET MYSQL_ERRNO = {code}, MESSAGE_TEXT = '{message}'");
    let mut packet = Vec::with_capacity(sql.len() + HEADER_LEN + 1);
    holdfast_wire::frame::frame_into(&mut packet, 0, |out| {
        out.push(COM_QUERY);
        out.extend_from_slice(sql.as_bytes());
    });
    Some(BytesMut::from(&packet[..]))
}

/// Errors of the statement itself: MariaDB gives them before it reads a row (it cannot be
/// parsed, names what does not exist or is ambiguous, lacks a privilege, gives a function
/// the wrong arguments), or for a value it read (a subquery's second row, a value out of
/// range). The same text fails the same way on any node with the same schema, grants and
/// data. Not: an interruption (`KILL QUERY` 1317, `max_statement_time` 1969), a lock wait,
/// the server's resources: running the read again would not fail alike, and would run it
/// in full (what a `KILL QUERY` stopped, too).
fn fails_alike_everywhere(code: u16) -> bool {
    matches!(
        code,
        1044 // ER_DBACCESS_DENIED_ERROR
            | 1046 // ER_NO_DB_ERROR
            | 1049 // ER_BAD_DB_ERROR
            | 1052 // ER_NON_UNIQ_ERROR
            | 1054 // ER_BAD_FIELD_ERROR
            | 1055 // ER_WRONG_FIELD_WITH_GROUP
            | 1056 // ER_WRONG_GROUP_FIELD
            | 1064 // ER_PARSE_ERROR
            | 1066 // ER_NONUNIQ_TABLE
            | 1109 // ER_UNKNOWN_TABLE
            | 1111 // ER_INVALID_GROUP_FUNC_USE
            | 1142 // ER_TABLEACCESS_DENIED_ERROR
            | 1143 // ER_COLUMNACCESS_DENIED_ERROR
            | 1146 // ER_NO_SUCH_TABLE
            | 1149 // ER_SYNTAX_ERROR
            | 1176 // ER_KEY_DOES_NOT_EXISTS
            | 1210 // ER_WRONG_ARGUMENTS
            | 1221 // ER_WRONG_USAGE
            | 1222 // ER_WRONG_NUMBER_OF_COLUMNS_IN_SELECT
            | 1235 // ER_NOT_SUPPORTED_YET
            | 1241 // ER_OPERAND_COLUMNS
            | 1247 // ER_ILLEGAL_REFERENCE
            | 1248 // ER_DERIVED_MUST_HAVE_ALIAS
            | 1250 // ER_TABLENAME_NOT_ALLOWED_HERE
            | 1267 // ER_CANT_AGGREGATE_2COLLATIONS
            | 1270 // ER_CANT_AGGREGATE_3COLLATIONS
            | 1271 // ER_CANT_AGGREGATE_NCOLLATIONS
            | 1305 // ER_SP_DOES_NOT_EXIST
            | 1318 // ER_SP_WRONG_NO_OF_ARGS
            | 1582 // ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT
            | 1583 // ER_WRONG_PARAMETERS_TO_NATIVE_FCT
            | 1584 // ER_WRONG_PARAMETERS_TO_STORED_FCT
            | 1630 // ER_FUNC_INEXISTENT_NAME_COLLISION
            | 4078 // ER_ILLEGAL_PARAMETER_DATA_TYPES2_FOR_OPERATION
            | 4079 // ER_ILLEGAL_PARAMETER_DATA_TYPE_FOR_OPERATION
            // Of the values read.
            | 1172 // ER_TOO_MANY_ROWS
            | 1242 // ER_SUBQUERY_NO_1_ROW
            | 1264 // ER_WARN_DATA_OUT_OF_RANGE
            | 1292 // ER_TRUNCATED_WRONG_VALUE
            | 1365 // ER_DIVISION_BY_ZERO
            | 1366 // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD
            | 1406 // ER_DATA_TOO_LONG
            | 1690 // ER_DATA_OUT_OF_RANGE
    )
}

/// How a multi-statement begins, inside a read-only transaction, as far as holdfast can
/// read it for sure (the statements after may be texts it cannot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opening {
    /// Plain settings (or nothing), then (statement `at`) one the server refuses inside
    /// the read-only transaction: the whole stops there, the settings made.
    Refused(usize),
    /// Plain settings, then (statement `at`) the end of the transaction (`COMMIT`,
    /// `ROLLBACK`, or the start of the next): nothing reads in the transaction before it
    /// ends.
    EndsAt(usize),
    Unknown,
}

/// `no_temporary_tables`: the session has none (nor code that may have made one), so
/// the server refuses its writes in a read-only transaction (see
/// [`refused_in_a_read_only_transaction`]). Should that be wrong, the text still runs on
/// the primary for real, and what it changed is looked at after it
/// ([`Session::pinned_on_primary`]).
fn multi_opening(
    sql: &[u8],
    mode: holdfast_sql::SqlMode,
    server: holdfast_sql::Server,
    no_temporary_tables: bool,
) -> Opening {
    for (at, r) in holdfast_sql::Statements::for_server(sql, mode, server).enumerate() {
        let stmt = &sql[r];
        // The server stops at a statement it cannot parse: nothing of it runs.
        if holdfast_sql::refused_at_parse(stmt, mode, server) {
            return Opening::Refused(at);
        }
        let flags = holdfast_sql::classify_for(stmt, mode, server);
        // (The statements before one holdfast cannot read for sure were split for sure.)
        if flags.has(C::UNCERTAIN) {
            return Opening::Unknown;
        }
        if refused_in_a_read_only_transaction(flags, stmt, mode, no_temporary_tables) {
            return Opening::Refused(at);
        }
        // (`BEGIN`, `START TRANSACTION` commit the transaction before they open the next:
        // seed 2048 session 262.)
        if flags.intersects(C::END_TXN.union(C::BEGIN_TXN)) {
            return Opening::EndsAt(at);
        }
        // (No table is locked in a pinned transaction: `LOCK TABLES` commits it. An
        // `UNLOCK TABLES` then does nothing.)
        if !plain_setting(flags, stmt, mode) && !only_unlocks(flags) {
            return Opening::Unknown;
        }
    }
    Opening::Unknown
}

/// Whether the server refuses `stmt` inside a read-only transaction, with no effect
/// (tried on MariaDB 10.11): every `XA` statement but `XA RECOVER` (1400 `XAER_OUTSIDE`,
/// 1399 `XAER_RMFAIL`: inside any transaction that is not XA), `CREATE` and `DROP
/// TEMPORARY TABLE` (1792), and, in a session without temporary tables, `INSERT`,
/// `REPLACE`, `UPDATE` and `DELETE` (1792: a temporary table takes writes).
fn refused_in_a_read_only_transaction(
    flags: C,
    stmt: &[u8],
    mode: holdfast_sql::SqlMode,
    no_temporary_tables: bool,
) -> bool {
    let mut words = holdfast_sql::Lexer::with_mode(stmt, mode)
        .filter(|t| t.kind == holdfast_sql::TokenKind::Word);
    let first = words.next();
    if flags.has(C::XA) {
        return first.is_some_and(|w| w.is_word("XA"))
            && !words.next().is_some_and(|w| w.is_word("RECOVER"));
    }
    if flags.intersects(C::CREATE_TEMP_TABLE.union(C::DROP_TEMP_TABLE)) {
        return true;
    }
    no_temporary_tables
        && first.is_some_and(|w| {
            ["INSERT", "REPLACE", "UPDATE", "DELETE"]
                .iter()
                .any(|k| w.is_word(k))
        })
}

/// Statements a read-only transaction pinned to a replica is given up for (1213): code
/// holdfast does not see into (what it does to the session and the transaction is not
/// known), a client's file.
const LEAVES_PINNED: C = C::UNCERTAIN.union(C::COMPOUND).union(C::LOAD_DATA_LOCAL);

/// Settings a statement may make: in a pinned transaction they are made on both
/// connections ([`Pinned::Mirror`]).
const SETTINGS: C = C::SET_SESSION_VAR.union(C::SET_USER_VAR).union(C::USE_DB);

impl Session {
    /// What becomes of `request` inside a read-only transaction pinned to a replica:
    /// `None` when it runs on the replica (plain reads, the transaction's own statements:
    /// COMMIT, ROLLBACK, savepoints), or when no transaction is pinned.
    ///
    /// The rule: a change of the session never happens on the replica's connection only,
    /// and the client gets the server's answer.
    /// - A setting (`SET` of session or user variables from plain values, `USE`,
    ///   `autocommit` off; a multi-statement of such settings and plain reads) runs on the
    ///   replica, which answers, and then on the primary ([`Pinned::Mirror`]).
    /// - A statement the server commits the transaction for before it runs it (DDL, `LOCK
    ///   TABLES`, `BEGIN`, `autocommit` on) commits the pinned one (it only read) and runs
    ///   on the primary ([`Pinned::Commit`]).
    /// - What else is not a plain read runs on the primary, inside a read-only transaction
    ///   of the primary's own opened beside the pinned one ([`Pinned::Primary`]): writes
    ///   get the server's 1792 there, `RELEASE_LOCK`, `CALL`, `EXECUTE`... the server's
    ///   answers; named locks and SQL prepared statements live on the primary as always.
    ///   Should it change the session there after all (a procedure that sets a variable,
    ///   a temporary table), the replica's connection cannot follow: the transaction
    ///   moves to the primary, or when it cannot, it is given up, and the next statement
    ///   gets 1213 ([`Pinned::GivenUp`]).
    /// - Code holdfast cannot see into (compound statements, texts it cannot read for
    ///   sure), a multi-statement that mixes settings with other statements or ends the
    ///   transaction, a setting from a query, a client's file: the transaction moves to
    ///   the primary when its reads answer the same there, and the statement runs there;
    ///   else 1213 at once, as issue 18 item 4 designed ([`Pinned::Leave`]).
    pub(super) fn pinned_plan(&self, request: &[u8], query: Option<C>) -> Option<Pinned> {
        let split = self.split.as_ref()?;
        if split.given_up {
            return match request.get(HEADER_LEN).copied() {
                // A ROLLBACK finds nothing to roll back, as after the server's own 1213.
                Some(COM_QUERY)
                    if query.is_some_and(|f| f.has(C::END_TXN))
                        && query_sql(request)
                            .and_then(holdfast_sql::first_keyword)
                            .is_some_and(|k| k.eq_ignore_ascii_case(b"ROLLBACK")) =>
                {
                    Some(Pinned::Rolled)
                }
                Some(COM_QUERY | COM_STMT_EXECUTE) => Some(Pinned::GivenUp),
                _ => None,
            };
        }
        let node = split.txn_on.as_deref()?;
        if split.probing {
            return None;
        }
        let mode = self.record.sql_mode.unwrap_or_default();
        let server = self.server();
        let (flags, sql, params, route) = match request.get(HEADER_LEN).copied() {
            Some(COM_QUERY) => {
                // A text too long to classify: as before, the transaction is given up.
                let Some(flags) = query else {
                    return Some(Pinned::Leave);
                };
                let sql = query_sql(request)?;
                let route = holdfast_sql::read_route(sql, flags, mode, server);
                (flags, sql, 0, route)
            }
            Some(COM_STMT_EXECUTE) => {
                let id = packets::statement_id(&request[HEADER_LEN..])
                    .map(|id| self.statements.resolve(id));
                // Unknown to holdfast: it answers 1243 itself, as the server does.
                let Some(s) = id.and_then(|id| self.statements.get(id)) else {
                    return Some(Pinned::Primary(C::EMPTY, Opening::Unknown));
                };
                let cursor = request
                    .get(HEADER_LEN + 5)
                    .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0);
                let route = match cursor || s.long_data {
                    true => ReadRoute::Primary,
                    false => s.read_route,
                };
                (s.flags, &s.sql[..], s.params, route)
            }
            // The current database changes: the replica's connection cannot follow here.
            Some(holdfast_wire::command::COM_INIT_DB) => return Some(Pinned::Leave),
            // The server refuses to prepare a write inside a read-only transaction (1792):
            // what is not a plain read is prepared in the primary's, beside the pinned one.
            Some(COM_STMT_PREPARE) => {
                let sql = request.get(HEADER_LEN + 1..)?;
                let flags = holdfast_sql::classify_for(sql, mode, server);
                return match holdfast_sql::read_route(sql, flags, mode, server) {
                    ReadRoute::Replica | ReadRoute::ReplicaWithUserVariables => None,
                    _ => Some(Pinned::Primary(C::EMPTY, Opening::Unknown)),
                };
            }
            _ => return None,
        };
        let mut opening = Opening::Unknown;
        if flags.has(C::MULTI) {
            // Whatever follows (even a text holdfast cannot read for sure), a text that
            // fails at its first statement, or ends the transaction before it reads, runs
            // on the primary beside the pinned transaction: the server's answer, and the
            // transaction ends there if it ends (seed 2041 session 177, seed 2042 session
            // 1138).
            // A transaction is pinned only without temporary tables, and none can be
            // made in it (1792) but by code holdfast does not see into. (The record's
            // flag may say so after a refused `CREATE TEMPORARY TABLE`: it is noted
            // before it runs.)
            let no_temporary_tables = !self.record.opaque_change;
            opening = multi_opening(sql, mode, server, no_temporary_tables);
            if opening != Opening::Unknown {
                return Some(Pinned::Primary(flags, opening));
            }
        }
        if flags.intersects(LEAVES_PINNED) {
            return Some(Pinned::Leave);
        }
        let transaction = C::BEGIN_TXN.union(C::END_TXN).union(C::SAVEPOINT);
        if flags.has(C::MULTI) {
            if flags.intersects(transaction.union(C::IMPLICIT_COMMIT).union(C::AUTOCOMMIT)) {
                return Some(Pinned::Leave);
            }
            if !flags.intersects(SETTINGS) {
                return Some(Pinned::Primary(flags, opening));
            }
            // Plain reads and settings only: run on both connections, as one setting.
            let last_here = split.last_on.as_deref() == Some(node);
            let both = holdfast_sql::Statements::for_server(sql, mode, server).all(|r| {
                let stmt = &sql[r];
                let f = holdfast_sql::classify_for(stmt, mode, server);
                plain_setting(f, stmt, mode)
                    || match holdfast_sql::read_route(stmt, f, mode, server) {
                        ReadRoute::Replica | ReadRoute::ReplicaWithUserVariables => true,
                        ReadRoute::LastNode => last_here,
                        ReadRoute::Primary => false,
                    }
            });
            if both {
                return Some(Pinned::Mirror);
            }
            // Settings among statements the replica cannot run: the whole runs on the
            // primary, then its settings alone on the replica.
            let apart = holdfast_sql::Statements::for_server(sql, mode, server).all(|r| {
                let stmt = &sql[r];
                let f = holdfast_sql::classify_for(stmt, mode, server);
                !f.intersects(SETTINGS) || plain_setting(f, stmt, mode)
            });
            return Some(match apart {
                true => Pinned::Primary(flags, opening),
                false => Pinned::Leave,
            });
        }
        if flags.has(C::AUTOCOMMIT) {
            // Turning autocommit off, or on while it is on, commits nothing: a setting like
            // the others. Turning it on commits the transaction first.
            let on = self.record.status & SERVER_STATUS_AUTOCOMMIT != 0;
            return Some(match turns_autocommit_off(sql, mode) || on {
                true if plain_setting(flags, sql, mode) => Pinned::Mirror,
                true => Pinned::Leave,
                false => Pinned::Commit,
            });
        }
        if only_unlocks(flags) && !self.record.table_locks {
            // Without table locks, UNLOCK TABLES commits nothing.
            return Some(Pinned::Primary(flags, opening));
        }
        if flags.has(C::IMPLICIT_COMMIT)
            || flags.has(C::BEGIN_TXN)
                && !flags.has(C::END_TXN)
                && !holdfast_sql::read_only_transaction(sql, flags, mode, server)
        {
            // The server commits the read-only transaction before it runs the statement
            // (BEGIN then opens one that may write). (A statement it cannot parse commits
            // nothing there; here the transaction is committed all the same.)
            return Some(Pinned::Commit);
        }
        if flags.intersects(transaction) {
            return None;
        }
        if flags.has(C::SET_TRANSACTION) && !flags.intersects(SETTINGS) {
            // Refused inside a transaction (1568): the replica answers as the primary would.
            return None;
        }
        if flags.intersects(SETTINGS) {
            return Some(match params == 0 && plain_setting(flags, sql, mode) {
                true => Pinned::Mirror,
                false => Pinned::Leave,
            });
        }
        match route {
            // A read without tables keeps the diagnostics area as the last statement left
            // it: after one on the primary that left warnings or an error, it runs there.
            ReadRoute::Replica | ReadRoute::ReplicaWithUserVariables
                if split.last_on.is_none()
                    && self.record.last_warnings > 0
                    && opens_no_table(sql, mode, server) =>
            {
                Some(Pinned::Primary(flags, opening))
            }
            ReadRoute::Replica | ReadRoute::ReplicaWithUserVariables => None,
            // What the last statement left is read where it ran.
            ReadRoute::LastNode if split.last_on.as_deref() == Some(node) => None,
            _ => Some(Pinned::Primary(flags, opening)),
        }
    }

    /// Runs a statement of a pinned read-only transaction as [`Session::pinned_plan`] says.
    pub(super) async fn run_pinned(
        &mut self,
        plan: Pinned,
        request: BytesMut,
        reply_seq: u8,
    ) -> Result<(), End> {
        match plan {
            Pinned::Leave => match self.move_pinned_to_primary().await? {
                true => Box::pin(self.forward_request(request)).await,
                false => self.leave_pinned_transaction(reply_seq).await,
            },
            Pinned::Mirror => self.mirror_pinned(request).await,
            Pinned::Primary(flags, opening) => {
                self.pinned_on_primary(request, flags, opening).await
            }
            Pinned::Commit => {
                self.commit_pinned_on_primary().await;
                Box::pin(self.forward_request(request)).await
            }
            Pinned::GivenUp | Pinned::Rolled => {
                if let Some(split) = self.split.as_mut() {
                    split.given_up = false;
                }
                if matches!(plan, Pinned::Rolled) {
                    return Box::pin(self.forward_request(request)).await;
                }
                self.send_error(reply_seq, &given_up_error()).await
            }
        }
    }

    /// A setting inside the pinned transaction: the replica runs it and answers (its
    /// warnings, its status), then the primary runs it too, its answer dropped. Should the
    /// primary refuse what the replica took, the two connections differ: the transaction
    /// is given up (the client's next statement gets 1213).
    async fn mirror_pinned(&mut self, request: BytesMut) -> Result<(), End> {
        let Some(node) = self.split.as_ref().and_then(|s| s.txn_on.clone()) else {
            return Box::pin(self.forward_request(request)).await;
        };
        if request.get(HEADER_LEN) == Some(&COM_STMT_EXECUTE) {
            // Noted as a text statement is before it runs (user variables to capture).
            let id =
                packets::statement_id(&request[HEADER_LEN..]).map(|id| self.statements.resolve(id));
            if let Some((flags, sql)) = id
                .and_then(|id| self.statements.get(id))
                .map(|s| (s.flags, s.sql.clone()))
            {
                self.note_query(flags, &sql);
            }
        }
        let again = request.clone();
        let kept = self.split.as_ref().map_or(0, |s| s.pinned_reads.len());
        // Where the last statement's diagnostics are now: a setting that raises nothing
        // leaves each connection's area as it was (seed 2048 session 320).
        let last_before = self
            .split
            .as_ref()
            .map(|s| (s.last_on.clone(), s.last_read.clone(), s.read_warned));
        match self.read_on_replica(Target::Pinned(node), request).await? {
            ReadOutcome::Done => {}
            ReadOutcome::Primary(request) => {
                return Box::pin(self.forward_request(request)).await;
            }
        }
        // A setting runs on the primary too: it is not one of the reads to run again.
        if let Some(split) = self.split.as_mut() {
            split.pinned_reads.truncate(kept);
        }
        // A multi-statement stops at its first error: the settings before it were made.
        let multi = query_sql(&again).is_some_and(|sql| holdfast_sql::classify(sql).has(C::MULTI));
        let pinned = self.split.as_ref().is_some_and(|s| s.txn_on.is_some());
        let replica_error = self.exchange.error;
        if !pinned || (replica_error.is_some() && !multi) {
            return Ok(());
        }
        let replica_answered = self.record.last_warnings;
        let result = self.run_discarded(again).await;
        let primary_error = std::mem::replace(&mut self.exchange.error, replica_error);
        self.record.last_warnings = replica_answered;
        match result {
            Ok(()) if primary_error == replica_error => {
                // Both connections ran the setting last and answered alike: it is not a
                // read to run on the primary again before a statement that runs there.
                // One that raised nothing kept each connection's area: the last
                // statement's diagnostics are where they were before it.
                let kept_areas = replica_error.is_none() && replica_answered == 0;
                if let Some(split) = self.split.as_mut() {
                    match (kept_areas, last_before) {
                        (true, Some((last_on, last_read, read_warned))) => {
                            split.last_on = last_on;
                            split.last_read = last_read;
                            split.read_warned = read_warned;
                        }
                        _ => {
                            split.primary_warned = split.read_warned;
                            split.forget_last();
                        }
                    }
                }
                Ok(())
            }
            Ok(()) => {
                tracing::info!(session = self.info.id, replica = replica_error, primary = primary_error, "a setting of a read-only transaction on a replica ended otherwise on the primary; the transaction is given up");
                self.give_up_pinned().await;
                Ok(())
            }
            Err(End::BackendLost { error, .. }) => {
                tracing::info!(session = self.info.id, %error, "primary lost while it took a setting of a read-only transaction on a replica");
                self.mark_backend_dead();
                self.give_up_pinned().await;
                Ok(())
            }
            Err(end) => Err(end),
        }
    }

    /// A statement of the pinned transaction that is not a plain read runs on the primary,
    /// inside a read-only transaction of the primary's own (opened once, ended with the
    /// pinned one): the client gets what the server answers there. Writes fail there as
    /// they would (1792); what succeeds changes nothing the replica must see, or else the
    /// pinned transaction is given up after it (its next statement gets 1213).
    async fn pinned_on_primary(
        &mut self,
        request: BytesMut,
        flags: C,
        opening: Opening,
    ) -> Result<(), End> {
        let reply_seq = super::reply::reply_seq(&request);
        // A multi-statement's settings (the plan let only plain ones through), made on the
        // replica's connection too once the whole ran.
        // (With the place of each among the statements.)
        let settings: Vec<(usize, Vec<u8>)> = match query_sql(&request) {
            Some(sql) if flags.has(C::MULTI) && flags.intersects(SETTINGS) => {
                let mode = self.record.sql_mode.unwrap_or_default();
                let server = self.server();
                holdfast_sql::Statements::for_server(sql, mode, server)
                    .enumerate()
                    .filter(|(_, r)| {
                        let stmt = &sql[r.clone()];
                        plain_setting(holdfast_sql::classify_for(stmt, mode, server), stmt, mode)
                    })
                    .map(|(at, r)| (at, sql[r].to_vec()))
                    .collect()
            }
            _ => Vec::new(),
        };
        let ends_at = match opening {
            Opening::EndsAt(at) => Some(at),
            _ => None,
        };
        if !self
            .open_shadow("a statement that is not a plain read")
            .await
        {
            return self.leave_pinned_transaction(reply_seq).await;
        }
        let version = self.record.state_version;
        let opaque = self.record.opaque_change;
        let unattributable = self.opaque_unattributable;
        if let Some(split) = self.split.as_mut() {
            split.probing = true;
        }
        // (Routed as any statement on the primary: the last statement is its from now on,
        // unless it leaves the diagnostics area as it was, a prepare.)
        let result = Box::pin(self.forward_request(request)).await;
        if let Some(split) = self.split.as_mut() {
            split.probing = false;
        }
        // A multi-statement stops at its first error: the settings before it were made
        // (each statement before the ERR answered once; a CALL may answer more than once).
        let ran = match self.exchange.error {
            None => usize::MAX,
            Some(_) if flags.has(C::CALL) => 0,
            Some(_) => self.exchange.results as usize,
        };
        // (`COMMIT AND CHAIN` leaves a read-only transaction open: a new one.)
        let ended = ends_at.is_some_and(|at| at < ran);
        if matches!(opening, Opening::Refused(at) if at == ran) {
            // It stopped at the statement the server refuses, as foreseen: what follows
            // it (code holdfast cannot read for sure, say) did not run, and the state
            // change the server reported is the settings' before it (made on the
            // replica's connection below, captured as always).
            self.record.opaque_change = opaque;
            self.opaque_unattributable = unattributable;
        }
        let status = self.record.status;
        let left = status & SERVER_STATUS_IN_TRANS == 0
            || status & SERVER_STATUS_IN_TRANS_READONLY == 0
            || ended
            || self.backend_dead;
        let made: Vec<Vec<u8>> = settings
            .iter()
            .filter(|(at, _)| *at < ran)
            .map(|(_, sql)| sql.clone())
            .collect();
        let unknown = self.exchange.error.is_some() && flags.has(C::CALL) && !settings.is_empty();
        let synced = made.is_empty() && !unknown
            || (!left && !unknown && self.settings_on_replica(&made).await);
        let changed = (self.record.state_version != version && settings.is_empty())
            || !synced
            || (!opaque && self.record.opaque_change)
            || (self.exchange.error.is_none()
                && flags.intersects(
                    C::CREATE_TEMP_TABLE
                        .union(C::DROP_TEMP_TABLE)
                        .union(C::HANDLER),
                ));
        if left {
            // The primary's transaction ended (or its connection did): so does the pinned
            // one, as it would have on the server. What the primary's connection holds now
            // (a transaction the text began after, say) is the session's.
            if let Some(split) = self.split.as_mut() {
                split.shadow = false;
            }
            self.end_on_replica(b"COMMIT").await;
        } else if changed && result.is_ok() && !self.move_pinned_to_primary().await? {
            tracing::info!(session = self.info.id, "a statement of a read-only transaction on a replica changed the session on the primary; the transaction is given up");
            self.give_up_pinned().await;
        }
        result
    }

    /// Moves the read-only transaction pinned to a replica to the primary, before a
    /// statement the replica's connection cannot follow: inside a read-only transaction
    /// there (the one opened beside the pinned one, or a new one), the pinned transaction's
    /// reads run again, their answers dropped. When each answer is the one the client got,
    /// the transaction could have run on the primary from its start: the replica's is
    /// rolled back (it only read), and the session's transaction is the primary's from now
    /// on (`true`). Otherwise (an answer differs: the replica was behind, the read was of
    /// the clock; a read cannot run again; the primary is lost) nothing moves (`false`),
    /// and the caller gives the transaction up (1213) as before.
    async fn move_pinned_to_primary(&mut self) -> Result<bool, End> {
        let Some(split) = self.split.as_mut() else {
            return Ok(false);
        };
        if split.txn_on.is_none() || split.pinned_reads.incomplete() || self.backend_dead {
            return Ok(false);
        }
        let reads = split.pinned_reads.take();
        if !self.open_shadow("moving the transaction there").await {
            return Ok(false);
        }
        let count = reads.len();
        let mut in_schema = self.record.schema.clone();
        let rerun = self.rerun_pinned_reads(reads, &mut in_schema).await;
        // Back in the session's schema, if a read ran in another.
        if in_schema != self.record.schema {
            let back = self.record.schema.clone().unwrap_or_default();
            if let Err(e) = restore::use_schema(&mut self.backend, &back).await {
                tracing::info!(session = self.info.id, error = %e, "the primary did not go back to the session's schema after a read-only transaction's reads ran again");
                self.mark_backend_dead();
                return Ok(false);
            }
        }
        if !rerun? {
            return Ok(false);
        }
        // The replica's transaction only read: rolled back; the primary's is the session's,
        // and so are its last read's diagnostics and `FOUND_ROWS()`.
        if let Some(split) = self.split.as_mut() {
            split.forget_last();
            if let Some(node) = split.txn_on.clone() {
                split.found_rows.moved_to_primary(&node);
            }
        }
        self.hand_pinned_to_primary(b"ROLLBACK").await;
        // Its reads before the move are not in the transaction log: a failover now
        // answers 1213 rather than replay part of it.
        self.txn_log = Some(Box::new(super::replay::TxnLog::not_replayable(
            "a read-only transaction moved from a replica",
        )));
        tracing::debug!(
            session = self.info.id,
            reads = count,
            "read-only transaction moved from a replica to the primary"
        );
        self.shared
            .metrics
            .read_fallback("replica_transaction_moved");
        Ok(true)
    }

    /// Runs a pinned transaction's reads again on the primary, each in the schema it ran
    /// in (`in_schema`: the primary connection's current one, kept up to date); `true` if
    /// each answers as it did on the replica.
    async fn rerun_pinned_reads(
        &mut self,
        reads: Vec<PinnedRead>,
        in_schema: &mut Option<String>,
    ) -> Result<bool, End> {
        let status = self.record.status;
        let warnings = self.record.last_warnings;
        let count = reads.len();
        let deprecate_eof = self.capabilities & CLIENT_DEPRECATE_EOF != 0;
        for (at, read) in reads.into_iter().enumerate() {
            if read.schema != *in_schema {
                // (A session without a schema cannot go back to none.)
                let (Some(db), Some(_)) = (read.schema.as_deref(), self.record.schema.as_deref())
                else {
                    return Ok(false);
                };
                if let Err(e) = restore::use_schema(&mut self.backend, db).await {
                    tracing::info!(session = self.info.id, error = %e, "a read-only transaction's read could not run again in its schema on the primary");
                    return Ok(false);
                }
                in_schema.clone_from(&read.schema);
            }
            let answered = read.checksum;
            let compared = !read.reads_no_table;
            let mut request = BytesMut::from(&read.request[..]);
            // An execute of a statement the client closed since: prepared again on the
            // primary for this run, and closed after it.
            let mut again = None;
            if !self.can_run_again(&request) {
                let Some(sql) = read.sql.as_deref() else {
                    return Ok(false);
                };
                match prepare(&mut self.backend, sql, deprecate_eof).await {
                    Ok(id) => {
                        packets::set_statement_id(&mut request[HEADER_LEN..], id);
                        again = Some(id);
                    }
                    Err(e) => {
                        tracing::info!(session = self.info.id, error = %e, "a closed statement of a read-only transaction on a replica could not be prepared on the primary");
                        return Ok(false);
                    }
                }
            }
            self.exchange.checksum = Some(Box::default());
            let replaying = std::mem::replace(&mut self.exchange.replaying, true);
            let result = match again {
                None => self.command(&mut request).await,
                Some(id) => {
                    self.exchange.begin();
                    let mut result = self.forward(&request).await;
                    if result.is_ok() {
                        result = self.relay(Reply::of(COM_STMT_EXECUTE)).await;
                    }
                    if result.is_ok() {
                        let close = close_statement(id);
                        if let Err(error) = self.backend.conn.write_packet(&close, 0).await {
                            result = Err(End::BackendLost {
                                started: false,
                                error,
                            });
                        }
                    }
                    result
                }
            };
            self.exchange.replaying = replaying;
            let checksum = self
                .exchange
                .checksum
                .take()
                .map(|h| std::hash::Hasher::finish(&*h));
            self.record.status = status;
            self.record.last_warnings = warnings;
            match result {
                Ok(()) if checksum == Some(answered) => {}
                // (One that fails there left another diagnostics area than the client's.)
                Ok(()) if !compared && self.exchange.error.is_none() => {}
                Ok(()) => {
                    tracing::info!(
                        session = self.info.id,
                        read = at + 1,
                        of = count,
                        "a read-only transaction on a replica cannot move to the primary: a read answers otherwise there"
                    );
                    return Ok(false);
                }
                Err(End::BackendLost { error, .. }) => {
                    tracing::info!(session = self.info.id, %error, "primary lost while a read-only transaction moved to it from a replica");
                    self.mark_backend_dead();
                    return Ok(false);
                }
                Err(end) => return Err(end),
            }
        }
        Ok(true)
    }

    /// Opens the read-only transaction on the primary beside the pinned one, unless it is
    /// open; `false` if the primary refused it or was lost (`why` says for what).
    async fn open_shadow(&mut self, why: &str) -> bool {
        if self.split.as_ref().is_some_and(|s| s.shadow) {
            return true;
        }
        match self.run_own(b"START TRANSACTION READ ONLY").await {
            Ok(_) => {
                if let Some(split) = self.split.as_mut() {
                    split.shadow = true;
                }
                true
            }
            Err(e) => {
                tracing::info!(session = self.info.id, error = %e, why, "opening a read-only transaction on the primary beside a replica's failed");
                if matches!(e, crate::backend::BackendError::Conn(_)) {
                    self.mark_backend_dead();
                }
                false
            }
        }
    }

    /// Before a statement the server commits the pinned transaction for: the transaction
    /// is opened on the primary (it only read: nothing to run again) and the replica's
    /// committed, so that the statement commits it where the server says what that leaves
    /// (MariaDB keeps a session read-only after `SET autocommit = 1` ends a read-only
    /// transaction, say). Without the primary's, the replica's is committed all the same.
    ///
    /// The session's last statement still counts as the replica's: the primary's
    /// diagnostics area is not its (a statement of the transaction that failed there), and
    /// the committing statement, routed as any, runs that read again first where it must.
    async fn commit_pinned_on_primary(&mut self) {
        if self.open_shadow("a statement that commits it").await {
            self.hand_pinned_to_primary(b"COMMIT").await;
        } else {
            self.end_pinned(b"COMMIT").await;
            self.record.status &= !(SERVER_STATUS_IN_TRANS | SERVER_STATUS_IN_TRANS_READONLY);
        }
        self.txn_log = None;
    }

    /// The primary's read-only transaction beside the pinned one becomes the session's:
    /// the replica's is ended with `end` (it only read).
    async fn hand_pinned_to_primary(&mut self, end: &[u8]) {
        if let Some(split) = self.split.as_mut() {
            split.shadow = false;
            split.pinned_reads = PinnedReads::default();
        }
        self.end_on_replica(end).await;
    }

    /// Makes `settings` (plain `SET`s and `USE`s the primary ran) on the connection of the
    /// pinned transaction's replica; `false` if it refused one or was lost.
    async fn settings_on_replica(&mut self, settings: &[Vec<u8>]) -> bool {
        let Some(split) = self.split.as_mut() else {
            return false;
        };
        let Some(i) = split.txn_on.clone().and_then(|node| split.reader(&node)) else {
            return false;
        };
        for sql in settings {
            if let Err(e) = restore::execute(&mut split.readers[i].conn, sql).await {
                tracing::info!(session = self.info.id, error = %e, "a setting the primary made in a read-only transaction was refused by the replica");
                return false;
            }
        }
        true
    }

    /// After a read on a replica that failed, when the statement before it ran on the
    /// primary: a statement that fails leaves `FOUND_ROWS()` as the one before it left
    /// it, which is the primary's. The read runs again there, its answer dropped (it only
    /// read); when it fails there the same way, the primary's diagnostics area holds the
    /// same error, and the session's last statement counts as the primary's (what the
    /// next statement reads of it is read there). True when so. Only for errors the server
    /// gives any node alike ([`fails_alike_everywhere`]): a read stopped by a `KILL QUERY`
    /// or a time limit would run again in full.
    async fn failed_read_follows_the_primary(&mut self, request: &BytesMut) -> bool {
        let Some(code) = self.exchange.error else {
            return false;
        };
        if !fails_alike_everywhere(code) {
            return false;
        }
        let before_on_primary = self.split.as_ref().is_some_and(|s| s.last_on.is_none());
        if !before_on_primary || self.backend_dead || !self.can_run_again(request) {
            return false;
        }
        let again = self.run_discarded(request.clone()).await;
        let same = again.is_ok() && self.exchange.error == Some(code);
        self.exchange.error = Some(code);
        if let Err(e) = again {
            // The next request finds out what became of the connection.
            tracing::debug!(session = self.info.id, error = ?e, "running a failed replica read again on the primary failed");
        }
        if same {
            self.found_rows_ran(None);
            if let Some(split) = self.split.as_mut() {
                split.forget_last();
                split.primary_warned = true;
                split.primary_kept = false;
            }
        }
        same
    }

    /// Runs `request` on the primary without passing its answer on (what it leaves there
    /// is the point: settings, diagnostics), as a replay runs a statement.
    async fn run_discarded(&mut self, mut request: BytesMut) -> Result<(), End> {
        let checksum = self.exchange.checksum.take();
        let replaying = std::mem::replace(&mut self.exchange.replaying, true);
        // The status the client saw stays the session's (in a transaction pinned to a
        // replica, the primary's answer says no transaction is open).
        let status = self.record.status;
        let result = self.command(&mut request).await;
        self.record.status = status;
        self.exchange.replaying = replaying;
        self.exchange.checksum = checksum;
        result
    }

    /// Ends the pinned transaction on its replica with `end` (it only read), and the
    /// primary's beside it.
    async fn end_pinned(&mut self, end: &[u8]) {
        self.end_on_replica(end).await;
        self.end_shadow().await;
    }

    /// Ends the pinned transaction on its replica with `end`.
    async fn end_on_replica(&mut self, end: &[u8]) {
        let Some(split) = self.split.as_mut() else {
            return;
        };
        if let Some(node) = split.txn_on.take() {
            if let Some(i) = split.reader(&node) {
                if let Err(e) = restore::execute(&mut split.readers[i].conn, end).await {
                    let why = format!("ending its read-only transaction: {e}");
                    self.lose_reader(i, why);
                }
            }
        }
    }

    /// Rolls back the read-only transaction opened on the primary beside a pinned one.
    async fn end_shadow(&mut self) {
        let Some(split) = self.split.as_mut() else {
            return;
        };
        if !std::mem::take(&mut split.shadow) || self.backend_dead {
            return;
        }
        if let Err(e) = self.run_own(b"ROLLBACK").await {
            tracing::info!(session = self.info.id, error = %e, "rolling back the primary's read-only transaction failed");
            if matches!(e, crate::backend::BackendError::Conn(_)) {
                self.mark_backend_dead();
            }
        }
    }

    /// The pinned transaction cannot go on (the replica's connection would not see what
    /// the session did): rolled back, and the client's next statement gets 1213, as after
    /// a lost transaction; the session's read-only transactions run on the primary from
    /// now on.
    async fn give_up_pinned(&mut self) {
        self.end_pinned(b"ROLLBACK").await;
        if let Some(split) = self.split.as_mut() {
            split.read_only_on_primary = true;
            split.given_up = true;
            split.forget_last();
        }
        self.record.status &= !holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
        self.txn_log = None;
        self.shared
            .metrics
            .read_fallback("session_change_in_replica_transaction");
    }

    /// Gives up the read-only transaction pinned to a replica (it read only: rolling it
    /// back changes nothing) before a statement that would change the session there; the
    /// client gets 1213 and restarts it, and the session's read-only transactions run on
    /// the primary from now on, where such statements keep every connection in step.
    async fn leave_pinned_transaction(&mut self, reply_seq: u8) -> Result<(), End> {
        self.end_pinned(b"ROLLBACK").await;
        if let Some(split) = self.split.as_mut() {
            split.read_only_on_primary = true;
            split.forget_last();
        }
        self.record.status &= !holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
        self.txn_log = None;
        tracing::info!(session = self.info.id, "a statement that changes the session in a read-only transaction on a replica: transaction rolled back (1213), read-only transactions on the primary from now on");
        self.shared
            .metrics
            .read_fallback("session_change_in_replica_transaction");
        let error = crate::error::ClientError::new(
            crate::error::ErrorKind::TransactionRolledBack,
            "Deadlock found when trying to get lock; try restarting transaction (holdfast: this \
             read-only transaction ran on a replica and the statement would change the session \
             there only; it was rolled back, and this session's read-only transactions run on \
             the primary from now on)",
        );
        self.send_error(reply_seq, &error).await
    }

    /// Whether a request kept to run again on the primary can still run there (an execute
    /// whose statement the client closed since cannot).
    fn can_run_again(&self, request: &[u8]) -> bool {
        match request.get(HEADER_LEN) {
            Some(&COM_STMT_EXECUTE) => packets::statement_id(&request[HEADER_LEN..])
                .map(|id| self.statements.resolve(id))
                .is_some_and(|id| self.statements.get(id).is_some()),
            _ => true,
        }
    }

    /// The last statement's diagnostics are the primary's (see `Split::last_on`).
    pub(super) fn split_last_on_primary(&mut self) {
        if let Some(split) = self.split.as_mut() {
            split.forget_last();
        }
    }

    /// Where a request may run, for a split session: `None` keeps it on the primary.
    pub(super) fn read_target(&mut self, request: &[u8], query: Option<C>) -> Option<Target> {
        self.split.as_ref()?;
        let server = self.server();
        let split = self.split.as_mut()?;
        let header = parse_header(request)?;
        let command = request.get(HEADER_LEN).copied();
        split.tableless = false;
        split.read_only_start = false;
        if split.last_on.is_none() {
            // The last statement ran on the primary: what its diagnostics area holds now
            // (a statement that opens no table kept the one before it).
            split.primary_warned =
                self.record.last_warnings > 0 || (split.primary_kept && split.primary_warned);
        }
        if let Some(node) = split.txn_on.as_ref().filter(|_| !split.probing) {
            return matches!(command, Some(COM_QUERY | COM_STMT_EXECUTE))
                .then(|| Target::Pinned(node.clone()));
        }
        let mode = self.record.sql_mode.unwrap_or_default();
        let read_only_start = match (command, query) {
            (Some(COM_QUERY), Some(flags)) if flags.has(C::BEGIN_TXN) => {
                holdfast_sql::read_only_transaction(&request[HEADER_LEN + 1..], flags, mode, server)
            }
            _ => false,
        };
        let route = if header.continues()
            || split.probing
            || !self.can_reauthenticate
            || self.exchange.replaying
            || self.record.schema.as_deref().is_some_and(is_system_schema)
        {
            // In `information_schema` (or another schema of the server's own), unqualified
            // names are views of the server's state (`SELECT * FROM PROCESSLIST`).
            ReadRoute::Primary
        } else if read_only_start
            && self.record.blocker().is_none()
            && !split.read_only_on_primary
            && !self.record.read_only_lingers
        {
            split.read_only_start = true;
            ReadRoute::Replica
        } else if self.record.in_transaction()
            || self.record.status & SERVER_STATUS_AUTOCOMMIT == 0
            || self.record.blocker().is_some()
            || !self.record.next_transaction.is_empty()
            // Code holdfast does not see into changed the session (a procedure made a
            // temporary table, say): until a capture tells what, it is the primary's.
            || self.record.opaque_change
            // MariaDB's read-only state after `SET autocommit = 1` ended a read-only
            // transaction: the primary's statements end it as the server's would (a
            // read of a table does; seed 2043 session 976), so all run there.
            || self.record.read_only_lingers
        {
            // Inside a transaction, or about to open one (autocommit off), or holding what
            // lives on the primary connection; or with next-transaction characteristics
            // pending (`SET TRANSACTION READ ONLY`): the next statement that opens a
            // transaction uses them up, and it must do so where the session's writes go.
            ReadRoute::Primary
        } else {
            match (command, query) {
                (Some(COM_QUERY), Some(flags)) => {
                    holdfast_sql::read_route(&request[HEADER_LEN + 1..], flags, mode, server)
                }
                (Some(COM_STMT_EXECUTE), _) => {
                    let cursor = request
                        .get(HEADER_LEN + 5)
                        .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0);
                    let id = packets::statement_id(&request[HEADER_LEN..])
                        .map(|id| self.statements.resolve(id));
                    match id.and_then(|id| self.statements.get(id)) {
                        Some(s) if !cursor && !s.long_data => s.read_route,
                        _ => ReadRoute::Primary,
                    }
                }
                _ => ReadRoute::Primary,
            }
        };
        // User variables are carried once captured (values set since live on the primary).
        let variables_known = !self.record.capture_due && !self.capture_failing;
        let target = match route {
            ReadRoute::Replica => Some(Target::Balanced),
            ReadRoute::ReplicaWithUserVariables if variables_known => Some(Target::Balanced),
            ReadRoute::ReplicaWithUserVariables => None,
            ReadRoute::LastNode => split.last_on.clone().map(Target::Last),
            ReadRoute::Primary => None,
        };
        // A read without tables keeps the diagnostics area as the last statement left it
        // (`SHOW WARNINGS` after it shows that statement's): when that area holds
        // warnings, it runs where that statement ran; otherwise on a node whose area is
        // empty too (see `read_on_replica`).
        // (So does `START TRANSACTION READ ONLY`: seed 2042 session 1138, tried.)
        split.tableless = matches!(target, Some(Target::Balanced))
            && (split.read_only_start
                || match command {
                    Some(COM_QUERY) => opens_no_table(&request[HEADER_LEN + 1..], mode, server),
                    Some(COM_STMT_EXECUTE) => packets::statement_id(&request[HEADER_LEN..])
                        .map(|id| self.statements.resolve(id))
                        .and_then(|id| self.statements.get(id))
                        .is_some_and(|s| opens_no_table(&s.sql, mode, server)),
                    _ => false,
                });
        let target = match (target, split.tableless) {
            (Some(Target::Balanced), true) => match &split.last_on {
                Some(node) if split.read_warned => Some(Target::Last(node.clone())),
                None if split.primary_warned => None,
                _ => Some(Target::Balanced),
            },
            (target, _) => target,
        };
        // The server keeps the last statement's diagnostics across COM_STMT_CLOSE (no
        // answer) and across the prepare of a statement that reads them (`SHOW WARNINGS`
        // prepared after a read on a replica shows that read's warnings): then the next
        // diagnostics read still goes where the last statement ran.
        // (So does the prepare of a statement that opens no table.)
        // A prepare's text, classified once for both questions below.
        let prepared = match command {
            Some(COM_STMT_PREPARE) => request
                .get(HEADER_LEN + 1..)
                .map(|sql| (sql, holdfast_sql::classify_for(sql, mode, server))),
            _ => None,
        };
        let keeps_diagnostics = match (command, prepared) {
            (Some(COM_STMT_CLOSE), _) => true,
            (_, Some((sql, flags))) => {
                holdfast_sql::read_route(sql, flags, mode, server) == ReadRoute::LastNode
                    || ((split.primary_warned || split.read_warned)
                        && keeps_diagnostics_area(flags, sql, mode, server))
            }
            _ => false,
        };
        // Looked at only while warnings are about (it matters for nothing else).
        let kept = (split.primary_warned || split.read_warned)
            && match (command, query) {
                (Some(COM_QUERY), Some(flags)) => {
                    keeps_diagnostics_area(flags, &request[HEADER_LEN + 1..], mode, server)
                }
                (Some(COM_STMT_EXECUTE), _) => packets::statement_id(&request[HEADER_LEN..])
                    .map(|id| self.statements.resolve(id))
                    .and_then(|id| self.statements.get(id))
                    .is_some_and(|s| keeps_diagnostics_area(s.flags, &s.sql, mode, server)),
                // The prepare of a statement that opens no table keeps it too (seed 2038
                // session 144).
                _ => prepared
                    .is_some_and(|(sql, flags)| keeps_diagnostics_area(flags, sql, mode, server)),
            };
        // (A COM_STMT_CLOSE runs nothing and has no answer: what the primary's area holds,
        // and whether the statement before kept it, stay as they were: seed 2041 session
        // 388.)
        if target.is_none() && command != Some(COM_STMT_CLOSE) {
            split.primary_kept = kept;
        }
        if target.is_none() && split.last_on.is_some() {
            // A statement that reads what the last statement left, going to the primary
            // (it cannot run where that statement ran): the read runs again there first,
            // its answer dropped (it only read, so running it twice changes nothing).
            let reads_last = match command {
                Some(COM_QUERY | COM_STMT_PREPARE) => {
                    holdfast_sql::reads_last_statement(&request[HEADER_LEN + 1..], mode, server)
                }
                Some(COM_STMT_EXECUTE) => packets::statement_id(&request[HEADER_LEN..])
                    .map(|id| self.statements.resolve(id))
                    .and_then(|id| self.statements.get(id))
                    .is_some_and(|s| holdfast_sql::reads_last_statement(&s.sql, mode, server)),
                _ => false,
            };
            // A statement that opens no table keeps the diagnostics area as the last
            // statement left it (MariaDB clears it for statements that open tables): when
            // the replica's and the primary's differ, the read runs again there too.
            let keeps_area = (split.read_warned || split.primary_warned) && kept;
            if (reads_last || keeps_area) && !keeps_diagnostics {
                split.rerun = split.last_read.take().map(Box::new);
            }
            if !keeps_diagnostics {
                split.last_on = None;
                split.last_read = None;
            }
        }
        tracing::trace!(session = self.info.id, ?target, last_on = ?split.last_on, found_rows = ?split.found_rows, primary_warned = split.primary_warned, read_warned = split.read_warned, rerun = split.rerun.is_some(), "split route");
        target
    }

    /// Statement ids closed by the client are closed on the replicas too; a reset or a
    /// change of user closes the replica connections.
    pub(super) async fn split_follow(&mut self, request: &[u8]) {
        let rerun = self.split.as_mut().and_then(|s| s.rerun.take());
        if let Some(read) = rerun.filter(|r| self.can_run_again(r)) {
            if let Some(split) = self.split.as_mut() {
                // The primary's diagnostics area is the read's from here on.
                split.primary_warned = split.read_warned;
            }
            if let Err(e) = self.run_discarded(*read).await {
                // The request itself finds out what became of the connection.
                tracing::debug!(session = self.info.id, error = ?e, "running a replica's read again on the primary failed");
            }
        }
        let Some(split) = self.split.as_mut() else {
            return;
        };
        match request.get(HEADER_LEN).copied() {
            Some(COM_STMT_CLOSE) => {
                let Some(id) = packets::statement_id(&request[HEADER_LEN..]) else {
                    return;
                };
                let id = self.statements.resolve(id);
                let mut lost = Vec::new();
                for r in &mut split.readers {
                    if let Some((reader_id, _)) = r.statements.remove(&id) {
                        let close = close_statement(reader_id);
                        if r.conn.conn.write_packet(&close, 0).await.is_err() {
                            lost.push(r.read.node.clone());
                        }
                    }
                }
                for node in lost {
                    split.drop_reader(&node);
                }
            }
            Some(
                holdfast_wire::command::COM_CHANGE_USER
                | holdfast_wire::command::COM_RESET_CONNECTION,
            ) => split.close_all(),
            _ => {}
        }
    }

    /// Runs a read on a replica, or gives it back for the primary.
    pub(super) async fn read_on_replica(
        &mut self,
        target: Target,
        mut request: BytesMut,
    ) -> Result<ReadOutcome, End> {
        let Some(split) = self.split.as_mut() else {
            return Ok(ReadOutcome::Primary(request));
        };
        split.refresh();
        let balanced = matches!(target, Target::Balanced);
        let mut index = match target {
            Target::Last(node) => match split.reader(&node) {
                Some(i) => i,
                None => return Ok(ReadOutcome::Primary(request)),
            },
            Target::Pinned(node) => match split.reader(&node) {
                Some(i) => i,
                None => {
                    self.end_shadow().await;
                    return self.read_only_transaction_lost(&request).await;
                }
            },
            Target::Balanced => {
                let weight = self.shared.config().split.primary_read_weight;
                let node = match split.choose(weight) {
                    Some(Some(node)) => node,
                    Some(None) => return Ok(ReadOutcome::Primary(request)),
                    None => {
                        self.shared.metrics.read_fallback("no_replica");
                        return Ok(ReadOutcome::Primary(request));
                    }
                };
                match split.reader(&node.name) {
                    Some(i) => i,
                    None => match self.open_reader(&node).await {
                        Some(i) => i,
                        None => {
                            self.shared.metrics.read_fallback("replica_unreachable");
                            return Ok(ReadOutcome::Primary(request));
                        }
                    },
                }
            }
        };
        if let Some(split) = self.split.as_ref().filter(|_| balanced) {
            if split.tableless && split.readers.get(index).is_some_and(|r| r.warned) {
                // Its diagnostics area holds warnings the read must not keep: the last
                // replica's (empty, or the read would have gone there) or the primary's.
                let clean_last = split
                    .last_on
                    .as_deref()
                    .and_then(|n| split.reader(n))
                    .filter(|&i| !split.readers[i].warned);
                match clean_last {
                    Some(i) => index = i,
                    None if !split.primary_warned => return Ok(ReadOutcome::Primary(request)),
                    None => {}
                }
            }
        }
        let read_only_start = self.split.as_ref().is_some_and(|s| s.read_only_start);
        if balanced && read_only_start && self.record.capture_due {
            // The transaction's reads run on the replica whatever user variables they
            // read: values set since the last capture are captured first, to be carried
            // there; when they cannot be (yet), it runs on the primary (seed 2039 session
            // 268).
            self.capture_if_due(false).await;
            if self.record.capture_due || self.capture_failing || self.record.blocker().is_some() {
                return Ok(ReadOutcome::Primary(request));
            }
        }
        if balanced {
            match self.prepare_reader(index).await {
                Ok(true) => {}
                Ok(false) => {
                    self.shared.metrics.read_fallback("causal_timeout");
                    return Ok(ReadOutcome::Primary(request));
                }
                Err(why) => {
                    self.lose_reader(index, why);
                    return Ok(ReadOutcome::Primary(request));
                }
            }
        }
        if !self.carry_found_rows(&request, Some(index)).await? {
            return Ok(ReadOutcome::Primary(request));
        }
        // An execute names the statement by the replica connection's id.
        let pinned = self.split.as_ref().is_some_and(|s| s.txn_on.is_some());
        let client_statement = match request.get(HEADER_LEN) {
            Some(&COM_STMT_EXECUTE) => match self.reader_execute(index, &mut request).await {
                Ok(id) => Some(id),
                Err(why) => {
                    self.lose_reader(index, why);
                    if pinned {
                        // The read-only transaction went with the connection: the execute
                        // must not run on the primary outside it.
                        self.end_shadow().await;
                        return self.read_only_transaction_lost(&request).await;
                    }
                    return Ok(ReadOutcome::Primary(request));
                }
            },
            _ => None,
        };
        let Some(split) = self.split.as_mut() else {
            return Ok(ReadOutcome::Primary(request));
        };
        let reader = &mut split.readers[index];
        let node = reader.read.node.clone();
        // Where a KILL QUERY finds the read: published before the read counts as running.
        self.info.replica_read.store(Some(reader.read.clone()));
        reader.load.active.fetch_add(1, Ordering::Relaxed);
        reader.load.reads.fetch_add(1, Ordering::Relaxed);
        let active = Active(reader.load.clone());
        let reader = &mut split.readers[index];
        std::mem::swap(&mut self.backend, &mut reader.conn);
        self.exchange.begin();
        self.shared.metrics.requests.command(request[HEADER_LEN]);
        // A read of the pinned transaction is kept with its answer's checksum, should the
        // transaction move to the primary.
        let outer_checksum = std::mem::replace(
            &mut self.exchange.checksum,
            pinned.then(Box::<super::replay::Checksum>::default),
        );
        let mut result = self.forward(&request).await;
        if result.is_ok() {
            result = self.relay(Reply::of(request[HEADER_LEN])).await;
        }
        let checksum = std::mem::replace(&mut self.exchange.checksum, outer_checksum)
            .map(|h| std::hash::Hasher::finish(&*h));
        drop(active);
        self.info.replica_read.store(None);
        if let Some(split) = self.split.as_mut() {
            if let Some(reader) = split.readers.get_mut(index) {
                std::mem::swap(&mut self.backend, &mut reader.conn);
            }
        }
        match result {
            Ok(()) => {
                self.shared.metrics.reads_on_replicas.inc();
                self.found_rows_ran(Some(node.clone()));
                let open = self.record.in_transaction();
                if let Some(id) = client_statement {
                    packets::set_statement_id(&mut request[HEADER_LEN..], id);
                }
                // The transaction pinned here ended (or a new one began after it): so does
                // the primary's beside it.
                let ended = pinned
                    && (!open
                        || query_sql(&request).is_some_and(|sql| {
                            holdfast_sql::classify(sql).intersects(C::BEGIN_TXN.union(C::END_TXN))
                        }));
                if ended {
                    self.end_shadow().await;
                    if open {
                        // A new transaction began with the end of the last one (`COMMIT
                        // AND CHAIN`, `BEGIN`): its reads start over (seed 2047 session
                        // 138).
                        if let Some(split) = self.split.as_mut() {
                            split.pinned_reads = PinnedReads::default();
                        }
                    }
                } else if pinned && open {
                    let sql = client_statement
                        .map(|id| self.statements.resolve(id))
                        .and_then(|id| self.statements.get(id))
                        .map(|s| s.sql.clone());
                    let text = sql.as_deref().or_else(|| query_sql(&request));
                    let mode = self.record.sql_mode.unwrap_or_default();
                    let server = self.server();
                    let reads_no_table = text.is_some_and(|t| {
                        opens_no_table(t, mode, server)
                            && !holdfast_sql::names_system_variables(t, mode, server)
                    });
                    let read = checksum.map(|checksum| PinnedRead {
                        request: self.kept_copy(request[HEADER_LEN], &request),
                        checksum,
                        sql,
                        schema: self.record.schema.clone(),
                        reads_no_table,
                    });
                    let max = self.shared.config().proxy.replay_max_bytes;
                    if let Some(split) = self.split.as_mut() {
                        split.pinned_reads.keep(read, max);
                    }
                } else if open {
                    // This read began the transaction pinned here.
                    if let Some(split) = self.split.as_mut() {
                        split.pinned_reads = PinnedReads::default();
                    }
                }
                if !pinned && !open && self.failed_read_follows_the_primary(&request).await {
                    // This connection's diagnostics area holds the error too (seed 2042
                    // session 792).
                    if let Some(reader) = self.split.as_mut().and_then(|s| s.readers.get_mut(index))
                    {
                        reader.warned = true;
                    }
                    return Ok(ReadOutcome::Done);
                }
                let warned = self.record.last_warnings > 0;
                if let Some(split) = self.split.as_mut() {
                    // A read without tables kept the area it found.
                    let kept =
                        split.tableless && split.readers.get(index).is_some_and(|r| r.warned);
                    if let Some(reader) = split.readers.get_mut(index) {
                        reader.warned = warned || kept;
                    }
                    split.txn_on = open.then(|| node.clone());
                    split.last_on = Some(node);
                    split.last_read = Some(
                        match self.exchange.error.and_then(interrupted_read_stand_in) {
                            Some(stand_in) => stand_in,
                            None => request,
                        },
                    );
                    split.read_warned = warned || kept;
                }
                Ok(ReadOutcome::Done)
            }
            Err(End::FileRequestRefused) => {
                // The client has its ERR; a replica that asks for files is not used again
                // by this session's connection.
                self.lose_reader(index, "it asked for a client file during a read".into());
                if pinned {
                    // The read-only transaction went with the connection.
                    if let Some(split) = self.split.as_mut() {
                        split.txn_on = None;
                    }
                    self.end_shadow().await;
                    self.record.status &= !holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
                }
                Ok(ReadOutcome::Done)
            }
            Err(End::BackendLost {
                started: false,
                error,
            }) if pinned => {
                self.lose_reader(index, error.to_string());
                self.end_shadow().await;
                self.read_only_transaction_lost(&request).await
            }
            Err(End::BackendLost {
                started: false,
                error,
            }) => {
                if let Some(id) = client_statement {
                    packets::set_statement_id(&mut request[HEADER_LEN..], id);
                }
                self.lose_reader(index, error.to_string());
                Ok(ReadOutcome::Primary(request))
            }
            Err(end) => Err(end),
        }
    }

    /// The replica holding the session's read-only transaction is gone, and the
    /// transaction with it: the client learns so as after a lost primary (1213).
    async fn read_only_transaction_lost(&mut self, request: &[u8]) -> Result<ReadOutcome, End> {
        if let Some(split) = self.split.as_mut() {
            split.txn_on = None;
        }
        self.record.status &= !holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
        self.shared.metrics.requests_failed_on_backend_loss.inc();
        // A transaction lost with its connection and not run again elsewhere, counted as
        // one lost on the primary is (the chaos drill's checker matches the clients'
        // 1213s with these counters).
        self.shared.metrics.replay("not_replayable");
        let seq = super::reply::reply_seq(request);
        self.send_error(seq, &crate::error::ClientError::transaction_rolled_back())
            .await?;
        Ok(ReadOutcome::Done)
    }

    fn lose_reader(&mut self, index: usize, why: String) {
        self.shared.metrics.read_fallback("replica_lost");
        if let Some(split) = self.split.as_mut() {
            if let Some(r) = split.readers.get(index) {
                tracing::info!(session = self.info.id, node = %r.read.node, error = %why, "replica connection lost; the read runs on the primary");
                let node = r.read.node.clone();
                split.drop_reader(&node);
            }
        }
    }

    /// Opens the session's connection to `node` with the session's state.
    async fn open_reader(&mut self, node: &NodeState) -> Option<usize> {
        let mut conn = match self.log_in_on(node).await {
            Ok(c) => c,
            Err(MoveError::Retry(why)) => {
                tracing::debug!(session = self.info.id, node = %node.name, reason = %why, "replica not reachable for reads");
                return None;
            }
            Err(MoveError::Fatal { message, .. }) => {
                tracing::info!(session = self.info.id, node = %node.name, %message, "replica refused the session");
                return None;
            }
        };
        let types = match self.shared.variable_types.of(&node.name, &mut conn).await {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(session = self.info.id, node = %node.name, error = %e, "replica not usable for reads");
                return None;
            }
        };
        let split = self.split.as_mut()?;
        node.load.0.opened(conn.greeting.connection_id);
        // One more slot, not four (what an idle split session holds).
        split.readers.reserve_exact(1);
        split.readers.push(Reader {
            read: Arc::new(crate::registry::ReplicaRead {
                node: node.name.clone(),
                address: node.address.clone(),
                thread: conn.greeting.connection_id,
            }),
            conn,
            load: node.load.0.clone(),
            // Synced before its first read.
            state_version: u64::MAX,
            types,
            statements: Default::default(),
            waited: Box::default(),
            warned: false,
        });
        Some(split.readers.len() - 1)
    }

    /// Brings a replica connection up to the session's state and makes it wait for what
    /// the read must see; `false`: it did not catch up in time (the read goes to the
    /// primary).
    async fn prepare_reader(&mut self, index: usize) -> Result<bool, String> {
        let version = self.record.state_version;
        let mode = self.shared.config().split.consistency;
        let wait_for = match mode {
            Consistency::None => None,
            Consistency::Session => self
                .record
                .variables
                .get("last_gtid")
                .filter(|g| !g.is_empty())
                .cloned(),
            Consistency::Global => {
                let sql = format!("SELECT @@global.gtid_binlog_pos{}", restore::NO_LIMIT);
                match self.run_own(sql.as_bytes()).await {
                    Ok(r) => r
                        .text_rows()
                        .first()
                        .and_then(|r| r.first())
                        .cloned()
                        .flatten(),
                    Err(e) => return Err(format!("reading the primary's position: {e}")),
                }
            }
        };
        let wait = self.shared.config().split.causal_wait();
        let Some(split) = self.split.as_mut() else {
            return Ok(false);
        };
        let reader = &mut split.readers[index];
        if reader.state_version != version {
            let mut record = self.record.clone();
            self.captured.apply_to(&mut record);
            restore::restore_session(
                &mut reader.conn,
                &record,
                &self.captured.user_variables,
                &reader.types,
            )
            .await
            .map_err(|e| format!("syncing the session state: {e}"))?;
            reader.state_version = version;
        }
        let Some(position) = wait_for else {
            return Ok(true);
        };
        let needed: Vec<(u32, u64)> = position.split(',').filter_map(parse_gtid).collect();
        let behind = needed
            .iter()
            .any(|&(d, s)| !reader.waited.iter().any(|&(wd, ws)| wd == d && ws >= s));
        if !behind {
            return Ok(true);
        }
        // The wait is a `SELECT`: it sets `FOUND_ROWS()` to 1. Where the session's value
        // lives on this connection, it is read in the same statement and put back after,
        // for a read that fails before it runs keeps it (seed 2042 session 1973).
        let keeps_found_rows = split.found_rows.lives_on(&reader.read.node);
        let started = Instant::now();
        let sql = format!(
            "SELECT MASTER_GTID_WAIT({}, {:.3}){}{}",
            holdfast_sql::quote::string_literal(position.trim()),
            wait.as_secs_f64(),
            if keeps_found_rows {
                ", FOUND_ROWS()"
            } else {
                ""
            },
            restore::NO_LIMIT
        );
        let answer = restore::execute(&mut reader.conn, sql.as_bytes())
            .await
            .map_err(|e| format!("waiting for {position}: {e}"))?;
        self.shared.metrics.causal_waits.observe(started.elapsed());
        if keeps_found_rows {
            let found = answer
                .text_rows()
                .first()
                .and_then(|r| r.get(1))
                .cloned()
                .flatten()
                .and_then(|v| v.parse::<u64>().ok());
            match found {
                Some(1) => {}
                Some(n) if n <= restore::MAX_FOUND_ROWS => {
                    let sql = restore::found_rows_select(n);
                    restore::execute(&mut reader.conn, sql.as_bytes())
                        .await
                        .map_err(|e| format!("putting FOUND_ROWS() back: {e}"))?;
                }
                _ => split.found_rows.lost(),
            }
        }
        let reached = answer
            .text_rows()
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .as_deref()
            == Some("0");
        if reached {
            for (d, s) in needed {
                match reader.waited.iter_mut().find(|(wd, _)| *wd == d) {
                    Some(w) => w.1 = w.1.max(s),
                    None => {
                        let mut waited = std::mem::take(&mut reader.waited).into_vec();
                        waited.push((d, s));
                        reader.waited = waited.into_boxed_slice();
                    }
                }
            }
        }
        Ok(reached)
    }

    /// Writes the replica connection's statement id into an execute, preparing the
    /// statement there first if needed (and sending its parameter types when that
    /// connection has not seen them); returns the client's id.
    async fn reader_execute(
        &mut self,
        index: usize,
        request: &mut BytesMut,
    ) -> Result<u32, String> {
        let client_id = packets::statement_id(&request[HEADER_LEN..])
            .ok_or_else(|| "no statement id".to_string())?;
        let id = self.statements.resolve(client_id);
        let deprecate_eof = self.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let Some(stmt) = self.statements.get_mut(id) else {
            return Err("unknown statement".into());
        };
        // The types this execute sends are remembered, and the primary, which does not see
        // it, gets them with its next execute.
        let _ = super::statements::bind_types(stmt, request);
        stmt.types_pending = stmt.params > 0 && stmt.types.is_some();
        let sql = stmt.sql.clone();
        let Some(split) = self.split.as_mut() else {
            return Err("not split".into());
        };
        let reader = &mut split.readers[index];
        let (reader_id, typed) = match reader.statements.get(&id) {
            Some(&known) => known,
            None => {
                let reader_id = prepare(&mut reader.conn, &sql, deprecate_eof)
                    .await
                    .map_err(|e| format!("preparing statement {id}: {e}"))?;
                reader.statements.insert(id, (reader_id, false));
                (reader_id, false)
            }
        };
        if !typed {
            if let Some(stmt) = self.statements.get(id) {
                if let Some(patched) = super::statements::with_types(stmt, request) {
                    *request = patched;
                }
            }
            if let Some(split) = self.split.as_mut() {
                if let Some(entry) = split.readers[index].statements.get_mut(&id) {
                    entry.1 = true;
                }
            }
        }
        packets::set_statement_id(&mut request[HEADER_LEN..], reader_id);
        Ok(client_id)
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_gtid, turns_autocommit_off};

    #[test]
    fn autocommit_turned_off_is_told_from_the_rest() {
        let off = |sql: &str| turns_autocommit_off(sql.as_bytes(), Default::default());
        for sql in [
            "SET autocommit = 0",
            "set @@session.autocommit=OFF",
            "SET SESSION autocommit = 0;",
            "SET @@autocommit := 0",
        ] {
            assert!(off(sql), "{sql}");
        }
        for sql in [
            "SET autocommit = 1",
            "SET autocommit = 0, sql_mode = ''",
            "SET GLOBAL autocommit = 0",
            "SET autocommit = @x",
        ] {
            assert!(!off(sql), "{sql}");
        }
    }

    #[test]
    fn gtids_are_read_as_domain_and_sequence() {
        assert_eq!(parse_gtid("0-1-42"), Some((0, 42)));
        assert_eq!(parse_gtid(" 3-100-7 "), Some((3, 7)));
        assert_eq!(parse_gtid("0-1"), None);
        assert_eq!(parse_gtid("0-1-2-3"), None);
        assert_eq!(parse_gtid(""), None);
    }

    /// Every idle split session keeps its `Split` and a `Reader` per replica it read from
    /// (issue 22: memory per idle session): what few sessions use is boxed when used.
    #[test]
    fn a_split_sessions_replica_side_stays_small() {
        let (split, reader) = (size_of::<super::Split>(), size_of::<super::Reader>());
        // 280 and 224 with the pinned transaction's reads and the replica's prepared
        // statements inline; 248 with node names as `String`s and a rerun inline.
        assert!(split <= 208, "a Split is {split} bytes");
        assert!(reader <= 184, "a Reader is {reader} bytes");
    }
}

/// A split session's replica side as a process hands it to the one that replaces it: what
/// it knows of its last statements, and each replica connection (its socket goes beside,
/// in the same order).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedSplit {
    last_on: Option<NodeName>,
    last_read: Option<Vec<u8>>,
    read_warned: bool,
    primary_warned: bool,
    primary_kept: bool,
    read_only_on_primary: bool,
    found_rows: super::found_rows::CarriedFoundRows,
    pub readers: Vec<CarriedReader>,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedReader {
    node: String,
    address: String,
    thread: u32,
    greeting: super::handover::CarriedGreeting,
    capabilities: u32,
    mariadb_caps: u32,
    pub tls: Option<holdfast_client::tls_resume::TlsState>,
    unread: Vec<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compressed: Option<holdfast_client::compress::CompressedState>,
    state_version: u64,
    types: VariableTypes,
    statements: Vec<(u32, u32, bool)>,
    waited: Vec<(u32, u64)>,
    warned: bool,
}

impl Split {
    /// Why the replica side cannot be handed over now, if it cannot: a read-only
    /// transaction pinned to a replica (it finishes first), a statement of one running,
    /// a connection whose TLS state cannot be taken.
    pub(super) fn why_not_handed_over(&self) -> Option<&'static str> {
        if self.txn_on.is_some() || self.shadow || self.probing || self.given_up {
            return Some("a read-only transaction on a replica");
        }
        if self.rerun.is_some() || !self.pinned_reads.is_empty() {
            return Some("a replica's read to run again");
        }
        if self.readers.iter().any(|r| !r.conn.conn.can_take_socket()) {
            return Some("a replica connection's TLS state cannot be taken now");
        }
        None
    }

    /// Takes the replica side apart for the new process: what it knows and the sockets.
    /// `None` when a connection could not be taken (the session is lost then: check
    /// [`Split::why_not_handed_over`] first).
    pub(super) fn give_up(&mut self) -> Option<(CarriedSplit, Vec<std::net::TcpStream>)> {
        let mut readers = Vec::new();
        let mut sockets = Vec::new();
        for mut r in std::mem::take(&mut self.readers) {
            let Some(holdfast_client::conn::TakenSocket {
                socket,
                tls,
                compressed,
                unread,
            }) = r.conn.conn.take_socket()
            else {
                // (Checked before: not expected.) The replica side starts over.
                self.forget_last();
                self.found_rows.keep_if(|_| false);
                return None;
            };
            // Nothing may be said on the connection the new process continues.
            r.conn.quit_on_drop = false;
            let g = &r.conn.greeting;
            readers.push(CarriedReader {
                node: r.read.node.to_string(),
                address: r.read.address.to_string(),
                thread: r.read.thread,
                greeting: super::handover::CarriedGreeting::of(g),
                capabilities: r.conn.capabilities,
                mariadb_caps: r.conn.mariadb_caps,
                tls,
                unread: unread.to_vec(),
                compressed,
                state_version: r.state_version,
                types: (*r.types).clone(),
                statements: r
                    .statements
                    .iter()
                    .map(|(&client, &(id, typed))| (client, id, typed))
                    .collect(),
                waited: r.waited.to_vec(),
                warned: r.warned,
            });
            sockets.push(socket);
        }
        let carried = CarriedSplit {
            last_on: self.last_on.clone(),
            last_read: self.last_read.as_ref().map(|b| b.to_vec()),
            read_warned: self.read_warned,
            primary_warned: self.primary_warned,
            primary_kept: self.primary_kept,
            read_only_on_primary: self.read_only_on_primary,
            found_rows: self.found_rows.carry(),
            readers,
        };
        Some((carried, sockets))
    }

    /// The replica side handed over by the process this one replaces, on its sockets.
    /// Their variable types go into `types` (shared with the process's other
    /// connections to the same server).
    pub(super) fn resume(
        watch: watch::Receiver<Arc<Topology>>,
        carried: CarriedSplit,
        sockets: Vec<std::net::TcpStream>,
        types: &restore::TypesCache,
    ) -> std::io::Result<Box<Split>> {
        let mut split = Split::new(watch);
        split.last_on = carried.last_on;
        split.last_read = carried.last_read.map(|b| BytesMut::from(&b[..]));
        split.read_warned = carried.read_warned;
        split.primary_warned = carried.primary_warned;
        split.primary_kept = carried.primary_kept;
        split.read_only_on_primary = carried.read_only_on_primary;
        split.found_rows = FoundRows::from_carried(carried.found_rows);
        for (r, socket) in carried.readers.into_iter().zip(sockets) {
            let mut conn = crate::conn::PacketConn::new(super::handover::stream_of(
                socket,
                r.tls,
                r.compressed,
            )?);
            conn.rbuf.extend_from_slice(&r.unread);
            // The node's load counter as this process's topology has it (a fresh one until
            // its monitor's first round names the node).
            let load = split
                .topology
                .nodes
                .iter()
                .find(|n| n.name == r.node)
                .map_or_else(|| Arc::new(NodeLoad::default()), |n| n.load.0.clone());
            load.opened(r.thread);
            let greeting = r.greeting.into_greeting();
            let types = types.adopt(&r.node, greeting.server_version(), r.types);
            split.readers.push(Reader {
                read: Arc::new(crate::registry::ReplicaRead {
                    node: r.node.into(),
                    address: r.address.into(),
                    thread: r.thread,
                }),
                conn: BackendConn {
                    conn,
                    greeting,
                    capabilities: r.capabilities,
                    mariadb_caps: r.mariadb_caps,
                    quit_on_drop: true,
                },
                load,
                state_version: r.state_version,
                types,
                statements: r
                    .statements
                    .into_iter()
                    .map(|(client, id, typed)| (client, (id, typed)))
                    .collect(),
                waited: r.waited.into_boxed_slice(),
                warned: r.warned,
            });
        }
        Ok(split)
    }
}
