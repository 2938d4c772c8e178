//! `KILL` through holdfast. A client knows two ids for a connection: holdfast's, from the
//! greeting (`mysql_thread_id()`, what the `mariadb` CLI's Ctrl-C kills), and the server's,
//! from `CONNECTION_ID()`. holdfast's ids start at [`SESSION_ID_BASE`], above any thread id
//! a server hands out, so a `KILL` of one of them is rewritten to the backend thread of that
//! session (on the killer's node: a session elsewhere is unknown there, 1094 as the server
//! would say), and a `KILL` of a server thread id passes as it is.
//!
//! While an upgrade's two processes both serve, one of holdfast's ids this process does
//! not hold is asked of the other ([`crate::upgrade::peer`]): the session may be there
//! (still running in the old process, or handed over to the new one). The `KILL` of its
//! thread runs as below, on the killer's connection.
//!
//! A `KILL QUERY` of a split session whose statement runs on a replica is run on that
//! replica instead, on a connection of the killer's account (the server checks the
//! killer's right to it).
//!
//! A `KILL` whose target is not a literal id (`KILL (SELECT ..)`, `KILL @v`, a prepared
//! `KILL ?`) runs as it is; one of holdfast's ids in it (the server answers 1094 for it)
//! is then mapped the same way and the `KILL` of that session's thread runs instead
//! (`Session::kill_by_value`). `KILL USER` runs as it is: the server ends every connection
//! of the account, holdfast's sessions' among them.
//!
//! A `KILL [CONNECTION]` that ends a holdfast session's backend connection also ends that
//! session's client connection, as the server would end a direct one: the victim is marked
//! before the `KILL` runs, and holdfast does not move it to a new backend connection when
//! it sees its own go (see `Session::killed_on_purpose`). `KILL QUERY` ends only the
//! statement, as it does on the server. A connection killed any other way (`KILL USER`,
//! an operator's `KILL` on the server, an expression) is told by what the server does: an
//! ERR 1927 on it, or the connection closed while the server kept running (back on the
//! same node, a new connection id above the lost one and an uptime at least its age);
//! the session then ends too, never logged in again (`Session::killed_by_server`).

use super::{CloseReason, End, Session};
use crate::error::code::ER_CONNECTION_KILLED;
use crate::error::{ClientError, ErrorKind};
use crate::registry::{SessionInfo, SESSION_ID_BASE};
use bytes::BytesMut;
use holdfast_sql::{
    parse_kill, parse_kill_head, parse_sql_prepared, Classification as C, SqlPrepared,
};
use holdfast_wire::caps::CLIENT_SESSION_TRACK;
use holdfast_wire::command::{COM_PROCESS_KILL, COM_QUERY, COM_STMT_EXECUTE};
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use holdfast_wire::packets::{self, ErrPacket, OkPacket, ERR_HEADER};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// What a `KILL` request becomes.
pub(super) enum KillPlan {
    /// Forwarded (rewritten), marking the session whose connection it ends, if any.
    Forward(Option<KillMark>),
    /// A `KILL` whose target is a value holdfast cannot read from the text (an expression,
    /// a prepared `KILL ?`): run by [`Session::kill_by_value`], which maps one of
    /// holdfast's ids once the value is known.
    ByValue(ByValue),
    /// A `KILL QUERY` of a split session's read running on a replica: run there by holdfast
    /// on a connection of the killer's account, the killer answered with OK.
    OnReplica(Arc<crate::registry::ReplicaRead>),
}

/// The SQL-level prepared statements (`PREPARE k FROM 'KILL ?'`) of a session that are a
/// `KILL` of a value: their heads and whether they are `KILL QUERY`, by name (in lower
/// case). An `EXECUTE` of one runs as a [`KillPlan::ByValue`].
/// (Boxed when there is one: most sessions have none, and every session holds the field.)
#[derive(Default)]
pub(super) struct SqlKills(Option<Box<KillsByName>>);

/// A `KILL` statement's head and whether it is `KILL QUERY`, by statement name.
type KillsByName = HashMap<Vec<u8>, (Vec<u8>, bool)>;

impl SqlKills {
    /// As a process hands the session to the one that replaces it.
    pub(super) fn carry(&self) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        self.0
            .iter()
            .flat_map(|kills| kills.iter())
            .map(|(name, (text, flag))| (name.clone(), text.clone(), *flag))
            .collect()
    }

    pub(super) fn from_carried(carried: Vec<(Vec<u8>, Vec<u8>, bool)>) -> SqlKills {
        let mut kills = SqlKills::default();
        for (name, text, flag) in carried {
            kills.insert(name, (text, flag));
        }
        kills
    }

    fn get(&self, name: &[u8]) -> Option<&(Vec<u8>, bool)> {
        self.0.as_ref()?.get(name)
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |kills| kills.len())
    }

    fn insert(&mut self, name: Vec<u8>, head: (Vec<u8>, bool)) {
        self.0.get_or_insert_default().insert(name, head);
    }

    fn remove(&mut self, name: &[u8]) {
        if let Some(kills) = self.0.as_mut() {
            kills.remove(name);
            if kills.is_empty() {
                self.0 = None;
            }
        }
    }
}

/// At most this many are kept (the server's own limit, `max_prepared_stmt_count`, is per
/// server).
const MAX_SQL_KILLS: usize = 1024;

/// A `KILL` naming its target by value (see [`KillPlan::ByValue`]).
pub(super) struct ByValue {
    /// The statement's words before its target (`KILL HARD QUERY `...): followed by a
    /// thread id, the same `KILL` of that thread.
    head: Vec<u8>,
    /// `KILL QUERY`: the statement only, not the connection.
    query: bool,
    /// The value, when holdfast read it itself (a prepared `KILL ?`'s parameter); `None`:
    /// the server evaluates the expression.
    value: Option<u64>,
}

/// Whose session a `KILL` names.
enum Victim {
    Here(Arc<SessionInfo>),
    /// The other process's, while both serve.
    Elsewhere(crate::upgrade::peer::Located),
    Unknown,
}

/// A session marked as the victim of a `KILL` in flight: unmarked again if the `KILL`
/// fails.
pub(super) struct KillMark {
    victim: Marked,
    thread: u32,
}

enum Marked {
    Here(Arc<SessionInfo>),
    /// A session of the other process while an upgrade's two both serve: marked there.
    Elsewhere {
        id: u32,
        peer: Arc<crate::upgrade::peer::Peer>,
    },
}

impl Session {
    /// Maps a `KILL` request (a `KILL` statement or COM_PROCESS_KILL) before it is
    /// forwarded: holdfast's ids are rewritten to backend thread ids, and the session whose
    /// connection it ends is marked. An id holdfast cannot map is refused with the server's
    /// 1094.
    pub(super) fn plan_kill(
        &mut self,
        request: &mut BytesMut,
        query: Option<C>,
    ) -> Result<KillPlan, ClientError> {
        let Some(header) = parse_header(request) else {
            return Ok(KillPlan::Forward(None));
        };
        let (id, ends_connection, span) = match request.get(HEADER_LEN) {
            Some(&COM_PROCESS_KILL) => match request.get(HEADER_LEN + 1..HEADER_LEN + 5) {
                Some(b) => (
                    u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    true,
                    None,
                ),
                None => return Ok(KillPlan::Forward(None)),
            },
            Some(&COM_QUERY) if query.is_some_and(|f| f.has(C::KILL)) && !header.continues() => {
                let sql = &request[HEADER_LEN + 1..];
                let mode = self.record.sql_mode.unwrap_or_default();
                match parse_kill(sql, mode) {
                    Some(k) if k.thread => (k.id, !k.query, Some(k.id_span)),
                    // `KILL QUERY ID n` names a query, not a connection.
                    Some(_) => return Ok(KillPlan::Forward(None)),
                    None => match parse_kill_head(sql, mode) {
                        // `KILL (SELECT n)`, `KILL @v`, `KILL CONNECTION_ID()`: the server
                        // evaluates it; one of holdfast's ids is mapped after.
                        Some(h) if h.thread && !h.user => {
                            return Ok(KillPlan::ByValue(ByValue {
                                head: sql.get(..h.target).unwrap_or_default().to_vec(),
                                query: h.query,
                                value: None,
                            }))
                        }
                        // `KILL USER v` (the server ends every connection of the account,
                        // holdfast's sessions' among them: they end as they see theirs
                        // go), `KILL QUERY ID`, several statements...: as they are.
                        _ => return Ok(KillPlan::Forward(None)),
                    },
                }
            }
            Some(&COM_QUERY)
                if query.is_some_and(|f| f.has(C::EXECUTE_SQL)) && !header.continues() =>
            {
                let sql = &request[HEADER_LEN + 1..];
                let mode = self.record.sql_mode.unwrap_or_default();
                let kill = match parse_sql_prepared(sql, mode) {
                    Some(SqlPrepared::Execute { name }) => self.sql_kills.get(&name),
                    _ => None,
                };
                return Ok(match kill {
                    Some((head, query)) => KillPlan::ByValue(ByValue {
                        head: head.clone(),
                        query: *query,
                        value: None,
                    }),
                    None => KillPlan::Forward(None),
                });
            }
            Some(&COM_STMT_EXECUTE) if !header.continues() => {
                return Ok(self
                    .prepared_kill(request)
                    .map_or(KillPlan::Forward(None), KillPlan::ByValue))
            }
            _ => return Ok(KillPlan::Forward(None)),
        };
        let own_node = self.backend_name.as_str();
        let victim = if id >= u64::from(SESSION_ID_BASE) {
            let unknown =
                || ClientError::new(ErrorKind::UnknownThread, format!("Unknown thread id: {id}"));
            let here = u32::try_from(id)
                .ok()
                .and_then(|id| self.shared.sessions.get(id));
            let logging_in =
                u32::try_from(id).is_ok_and(|id| self.shared.sessions.is_logging_in(id));
            if here.is_none() && (logging_in || self.shared.upgrader.peer().is_some()) {
                // Perhaps the other process's, or one whose login is finishing: asked
                // when the `KILL` runs.
                let head = match span {
                    Some(span) => request
                        .get(HEADER_LEN + 1..HEADER_LEN + 1 + span.start)
                        .unwrap_or_default()
                        .to_vec(),
                    None => b"KILL CONNECTION ".to_vec(),
                };
                return Ok(KillPlan::ByValue(ByValue {
                    head,
                    query: !ends_connection,
                    value: Some(id),
                }));
            }
            let victim = here.filter(|v| v.is_on(own_node)).ok_or_else(unknown)?;
            if !ends_connection {
                if let Some(read) = victim.replica_read.load_full() {
                    return Ok(KillPlan::OnReplica(read));
                }
            }
            let thread = victim.backend_thread.load(Ordering::Acquire);
            if thread == 0 {
                return Err(unknown());
            }
            rewrite_id(request, thread, span);
            Some(victim)
        } else {
            u32::try_from(id)
                .ok()
                .and_then(|t| self.shared.sessions.by_backend_thread(own_node, t))
        };
        Ok(KillPlan::Forward(
            victim
                .filter(|_| ends_connection)
                .map(|victim| self.mark(victim)),
        ))
    }

    /// Notes a `PREPARE` or `DEALLOCATE PREPARE` the server ran (`ok`: it succeeded; a
    /// failed `PREPARE` drops the statement of that name too).
    pub(super) fn note_sql_prepared(&mut self, sql: &[u8], ok: bool) {
        let mode = self.record.sql_mode.unwrap_or_default();
        match parse_sql_prepared(sql, mode) {
            Some(SqlPrepared::Prepare { name, text }) => {
                let head = text.as_deref().filter(|_| ok).and_then(|text| {
                    parse_kill_head(text, mode)
                        .filter(|h| h.thread && !h.user)
                        .map(|h| (text.get(..h.target).unwrap_or_default().to_vec(), h.query))
                });
                match head {
                    Some(head) if self.sql_kills.len() < MAX_SQL_KILLS => {
                        self.sql_kills.insert(name, head);
                    }
                    _ => {
                        self.sql_kills.remove(&name);
                    }
                }
            }
            Some(SqlPrepared::Deallocate { name }) => {
                self.sql_kills.remove(&name);
            }
            _ => {}
        }
    }

    /// A COM_STMT_EXECUTE of a prepared `KILL [..] ?` whose parameter is one of holdfast's
    /// ids: run as the `KILL` of that id (see [`Session::kill_by_value`]). Anything else
    /// (another statement, a server thread id, a value holdfast cannot read) is forwarded.
    fn prepared_kill(&self, request: &[u8]) -> Option<ByValue> {
        let payload = request.get(HEADER_LEN..)?;
        let stmt = self
            .statements
            .get(self.statements.resolve(packets::statement_id(payload)?))?;
        if !stmt.flags.has(C::KILL) {
            return None;
        }
        let head = parse_kill_head(&stmt.sql, self.record.sql_mode.unwrap_or_default())?;
        let target = stmt.sql.get(head.target..)?;
        if !head.thread || head.user || target.trim_ascii() != b"?" || stmt.params != 1 {
            return None;
        }
        let value = single_integer_param(payload, stmt.types.as_deref())?;
        (value >= u64::from(SESSION_ID_BASE)).then(|| ByValue {
            head: stmt.sql.get(..head.target).unwrap_or_default().to_vec(),
            query: head.query,
            value: Some(value),
        })
    }

    /// Runs a `KILL` that names its target by value. An expression is run by the server
    /// as it is (evaluated once, as directly); when it named one of holdfast's ids (the
    /// server answers 1094 for it: its ids stay below holdfast's), or a prepared `KILL ?`
    /// got one, that id is mapped as a literal one is (`plan_kill`) and the same `KILL`
    /// of the session's backend thread runs instead; the client gets that answer.
    pub(super) async fn kill_by_value(
        &mut self,
        request: &[u8],
        kill: ByValue,
        reply_seq: u8,
    ) -> Result<(), End> {
        self.shared.metrics.requests.command(COM_QUERY);
        self.exchange.begin();
        let id = match kill.value {
            Some(id) => {
                if request.get(HEADER_LEN) == Some(&COM_STMT_EXECUTE) {
                    self.execute_not_forwarded(request);
                }
                id
            }
            None => {
                let answer = self
                    .kill_exchange(request.get(HEADER_LEN..).unwrap_or_default())
                    .await?;
                match holdfast_ids_unknown_thread(&answer) {
                    Some(id) => id,
                    None => return self.relay_kill_answer(&answer, reply_seq, None).await,
                }
            }
        };
        let unknown =
            || ClientError::new(ErrorKind::UnknownThread, format!("Unknown thread id: {id}"));
        let own_node = self.backend_name.clone();
        let here = self.registered_soon(id).await;
        let victim = match here {
            Some(v) => Victim::Here(v),
            None => match self.elsewhere(id, !kill.query).await {
                Some(at) => Victim::Elsewhere(at),
                None => Victim::Unknown,
            },
        };
        let (thread, read) = match &victim {
            Victim::Here(v) if v.is_on(&own_node) => (
                v.backend_thread.load(Ordering::Acquire),
                v.replica_read.load_full(),
            ),
            Victim::Elsewhere(at) if at.node == own_node => (
                at.thread,
                at.replica_read.clone().map(|r| Arc::new(r.into())),
            ),
            _ => {
                tracing::debug!(session = self.info.id, id, node = %own_node, "KILL by value: no session of that id on this node");
                self.exchange.error = Some(ErrorKind::UnknownThread.code());
                return self.send_error(reply_seq, &unknown()).await;
            }
        };
        if kill.query {
            if let Some(read) = read {
                return self.answer_kill_of_replica_read(&read, reply_seq).await;
            }
        }
        if thread == 0 {
            tracing::debug!(
                session = self.info.id,
                id,
                "KILL by value: the session has no backend connection"
            );
            self.exchange.error = Some(ErrorKind::UnknownThread.code());
            return self.send_error(reply_seq, &unknown()).await;
        }
        // (A session of the other process was marked there as it was found.)
        let mark = match victim {
            _ if kill.query => None,
            Victim::Here(v) => Some(self.mark(v)),
            Victim::Elsewhere(_) => self.shared.upgrader.peer().map(|peer| KillMark {
                victim: Marked::Elsewhere {
                    id: id as u32,
                    peer,
                },
                thread,
            }),
            Victim::Unknown => None,
        };
        let mut sql = vec![COM_QUERY];
        sql.extend_from_slice(&kill.head);
        if !kill.head.last().is_some_and(u8::is_ascii_whitespace) {
            sql.push(b' ');
        }
        sql.extend_from_slice(thread.to_string().as_bytes());
        tracing::debug!(
            session = self.info.id,
            id,
            thread,
            "KILL by value: runs as a KILL of the session's backend thread"
        );
        let answer = match self.kill_exchange(&sql).await {
            Ok(a) => a,
            Err(e) => {
                if let Some(mark) = mark {
                    self.settle_kill(mark, Some(0));
                }
                return Err(e);
            }
        };
        self.relay_kill_answer(&answer, reply_seq, mark).await
    }

    /// Where the other process (while an upgrade's two both serve) has the session `id`;
    /// `mark`: it is marked there as the victim of a `KILL` about to end its connection.
    /// Session `id` of this process: at once, or, while its login is finishing (its
    /// client may know its id a moment before it is registered), once it is (up to 5 s).
    async fn registered_soon(&self, id: u64) -> Option<Arc<SessionInfo>> {
        let id = u32::try_from(id).ok()?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some(v) = self.shared.sessions.get(id) {
                return Some(v);
            }
            if !self.shared.sessions.is_logging_in(id) || tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    async fn elsewhere(&self, id: u64, mark: bool) -> Option<crate::upgrade::peer::Located> {
        let peer = self.shared.upgrader.peer()?;
        let located = peer.locate(u32::try_from(id).ok()?, mark).await;
        tracing::debug!(
            session = self.info.id,
            id,
            ?located,
            "KILL: asked the other process"
        );
        located
    }

    /// A prepared `KILL ?` run as a text `KILL` instead: the backend never saw this
    /// execute, so parameter types it carried are sent with the next one.
    fn execute_not_forwarded(&mut self, request: &[u8]) {
        let Some(payload) = request.get(HEADER_LEN..) else {
            return;
        };
        let (Some(&1), Some(types), Some(id)) = (
            payload.get(11),
            payload.get(12..14),
            packets::statement_id(payload),
        ) else {
            return;
        };
        let id = self.statements.resolve(id);
        if let Some(stmt) = self.statements.get_mut(id) {
            stmt.types = Some(types.to_vec());
            stmt.types_pending = true;
        }
    }

    /// Sends one command to the backend and reads its one-packet answer (a `KILL`'s: OK
    /// or ERR).
    async fn kill_exchange(&mut self, payload: &[u8]) -> Result<Vec<u8>, End> {
        let lost = |error| End::BackendLost {
            started: false,
            error,
        };
        let conn = &mut self.backend.conn;
        conn.write_packet(payload, 0).await.map_err(lost)?;
        let max = self.shared.config().proxy.max_packet_size;
        let answer = conn.read_packet(max).await.map_err(lost)?;
        Ok(answer.payload.to_vec())
    }

    /// Relays a `KILL`'s answer to the client and settles its mark. An ERR 1927 says the
    /// killer's own connection was killed: the session ends after it.
    async fn relay_kill_answer(
        &mut self,
        answer: &[u8],
        reply_seq: u8,
        mark: Option<KillMark>,
    ) -> Result<(), End> {
        match answer.first() {
            Some(&ERR_HEADER) => {
                let code = ErrPacket::parse(answer).map_or(0, |e| e.code);
                tracing::debug!(session = self.info.id, code, "KILL answered with an error");
                self.exchange.error = Some(code);
                self.shared.metrics.count_error(code);
                if code == ER_CONNECTION_KILLED && mark.is_none() {
                    self.mark_killed();
                }
            }
            _ => {
                let track = self.backend.capabilities & CLIENT_SESSION_TRACK != 0;
                if let Ok(ok) = OkPacket::parse(answer, track) {
                    self.record.status = ok.status;
                    self.record.last_warnings = ok.warnings;
                    self.record.last_affected_rows = ok.affected_rows;
                }
            }
        }
        if let Some(mark) = mark {
            self.settle_kill(mark, self.exchange.error);
        }
        self.client
            .write_packet(answer, reply_seq)
            .await
            .map_err(End::Client)
    }

    /// Stops a session's read on a replica ([`Session::kill_replica_read`]) and answers the
    /// killer: OK, or why it could not.
    pub(super) async fn answer_kill_of_replica_read(
        &mut self,
        read: &crate::registry::ReplicaRead,
        reply_seq: u8,
    ) -> Result<(), End> {
        match self.kill_replica_read(read).await {
            Ok(()) => {
                let ok = packets::ok_payload(0, 0, self.record.status, 0);
                self.client
                    .write_packet(&ok, reply_seq)
                    .await
                    .map_err(End::Client)
            }
            Err(e) => {
                self.exchange.error = Some(e.kind.code());
                self.send_error(reply_seq, &e).await
            }
        }
    }

    /// Runs a `KILL QUERY` of a session's read on a replica there, on a connection of the
    /// killer's own account (so the server checks the killer's right to it, as it would
    /// for a direct `KILL`).
    pub(super) async fn kill_replica_read(
        &self,
        read: &crate::registry::ReplicaRead,
    ) -> Result<(), ClientError> {
        let failed = |e: &dyn std::fmt::Display| {
            ClientError::new(
                ErrorKind::UnknownThread,
                format!(
                    "holdfast could not stop the statement running on {}: {e}",
                    read.node
                ),
            )
        };
        let node = self
            .shared
            .topology
            .borrow()
            .nodes
            .iter()
            .find(|n| n.name == read.node)
            .cloned()
            .ok_or_else(|| failed(&"the node is gone"))?;
        let mut conn = match self.log_in_on(&node).await {
            Ok(c) => c,
            Err(super::migrate::MoveError::Retry(why)) => return Err(failed(&why)),
            Err(super::migrate::MoveError::Fatal { message, .. }) => return Err(failed(&message)),
        };
        let killed = conn.query(&format!("KILL QUERY {}", read.thread)).await;
        drop(conn);
        killed.map_err(|e| failed(&e))?;
        tracing::info!(session = self.info.id, node = %read.node, thread = read.thread, "KILL QUERY of a read on a replica");
        Ok(())
    }

    fn mark(&self, victim: Arc<SessionInfo>) -> KillMark {
        let thread = victim.backend_thread.load(Ordering::Acquire);
        victim.kill_requested.store(thread, Ordering::Release);
        KillMark {
            victim: Marked::Here(victim),
            thread,
        }
    }

    /// After the `KILL` ran, the mark stands only where a connection was ended: another
    /// session's after a `KILL` that succeeded, the killer's own when the server answered
    /// 1927 (how it answers a `KILL` of the killer's connection). A failed `KILL` (no
    /// privilege, ...), or one that named someone else by a value holdfast could not read
    /// (`KILL @id`: the killer was marked in case it named itself), leaves it unmarked.
    pub(super) fn settle_kill(&self, mark: KillMark, error: Option<u16>) {
        let ended = match error {
            Some(code) => code == ER_CONNECTION_KILLED,
            None => !matches!(&mark.victim, Marked::Here(v) if Arc::ptr_eq(v, &self.info)),
        };
        if !ended {
            match mark.victim {
                Marked::Here(victim) => {
                    let _ = victim.kill_requested.compare_exchange(
                        mark.thread,
                        0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                Marked::Elsewhere { id, peer } => peer.unmark(id, mark.thread),
            }
        }
    }

    /// How a session whose backend connection a client's `KILL` ended closes, after the
    /// command that was running (`result`).
    pub(super) fn killed(&self, result: Result<(), End>) -> End {
        match result {
            Ok(())
            | Err(End::BackendLost { .. })
            | Err(End::BackendLostDuringFile { .. })
            | Err(End::Backend(_)) => End::Closed {
                reason: CloseReason::Killed,
                message: format!(
                    "closed: a client's KILL ended its backend connection (thread {} on {})",
                    self.backend.greeting.connection_id, self.backend_name
                ),
            },
            Err(other) => other,
        }
    }

    /// An idle session whose backend connection a client's `KILL` ended: the client gets
    /// what the server sent before it closed, if anything (MariaDB 10.11 sends nothing to a
    /// killed idle connection: it closes it), then the connection closes.
    pub(super) async fn end_killed_while_idle(&mut self) -> End {
        let conn = &mut self.backend.conn;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while matches!(conn.stream.read_buf(&mut conn.rbuf).await, Ok(n) if n > 0) {}
        })
        .await;
        let whole = whole_packets(&conn.rbuf);
        if whole > 0 {
            let bytes = conn.rbuf.split_to(whole);
            let _ = self.client.write_raw(&bytes).await;
        }
        self.killed(Ok(()))
    }

    /// Whether the session's backend connection was ended by a client's `KILL` through
    /// holdfast: the session ends too, instead of moving.
    pub(super) fn killed_on_purpose(&self) -> bool {
        self.info
            .killed_on_purpose(self.backend.greeting.connection_id)
    }

    /// Whether an ERR 1927 on the session's connection now is someone's `KILL` (run on
    /// the server, a `KILL USER`, ...) rather than holdfast's own fence: no switchover
    /// runs, the session's node is still the primary, and it is not reading on a replica
    /// (whose connections a node removal ends).
    pub(super) fn killed_by_someone_now(&self) -> bool {
        !self.shared.switching_now.load(Ordering::SeqCst)
            && self.info.replica_read.load().is_none()
            && self.primary().is_some_and(|p| p.name == self.backend_name)
    }

    /// Marks the session's backend connection as killed: the session ends after the
    /// current command, as a direct connection would (see [`Session::killed`]).
    pub(super) fn mark_killed(&self) {
        self.info
            .kill_requested
            .store(self.backend.greeting.connection_id, Ordering::Release);
    }

    /// How a session ends whose backend connection the server cut while it kept running
    /// (someone's `KILL`, `KILL USER`, an expression holdfast could not read, ...; MariaDB
    /// closes a killed connection without an ERR): as the server ended it, the client's
    /// connection closed, not logged in again on a fresh one.
    pub(super) fn killed_by_server(&self, lost: &super::migrate::LostConn) -> End {
        End::Closed {
            reason: CloseReason::Killed,
            message: format!(
                "closed: its backend connection (thread {} on {}) was cut while the server kept running (a KILL); ended as the server ended it",
                lost.thread, lost.node
            ),
        }
    }
}

/// The id of an ERR 1094 ("Unknown thread id: N") when it is one of holdfast's (the
/// server's own thread ids stay below [`SESSION_ID_BASE`]): the last number in the message.
fn holdfast_ids_unknown_thread(answer: &[u8]) -> Option<u64> {
    let e = ErrPacket::parse(answer).ok()?;
    if e.code != ErrorKind::UnknownThread.code() {
        return None;
    }
    let message = e.message_lossy();
    let id: u64 = message
        .rsplit(|c: char| !c.is_ascii_digit())
        .find(|part| !part.is_empty())?
        .parse()
        .ok()?;
    (id >= u64::from(SESSION_ID_BASE)).then_some(id)
}

/// The value of the single parameter of a COM_STMT_EXECUTE (`payload`, the command byte
/// first) when it is a non-negative integer (or a string or decimal of digits only); the
/// parameter types are in the packet or, when it sends none, `cached` (the last ones sent).
fn single_integer_param(payload: &[u8], cached: Option<&[u8]>) -> Option<u64> {
    // command, statement id, flags, iteration count, null bitmap, "types follow".
    let null_bitmap = *payload.get(10)?;
    if null_bitmap & 1 != 0 {
        return None;
    }
    let (types, value) = match *payload.get(11)? {
        1 => (payload.get(12..14)?, payload.get(14..)?),
        _ => (cached?.get(..2)?, payload.get(12..)?),
    };
    let unsigned = types[1] & 0x80 != 0;
    let int = |n: usize| -> Option<u64> {
        let b = value.get(..n)?;
        let mut raw = [0u8; 8];
        raw[..n].copy_from_slice(b);
        let v = u64::from_le_bytes(raw);
        let negative = !unsigned && b[n - 1] & 0x80 != 0;
        (!negative).then_some(v)
    };
    match types[0] {
        0x01 => int(1),
        0x02 | 0x0d => int(2),
        0x03 | 0x09 => int(4),
        0x08 => int(8),
        // Strings and decimals: a length-encoded text.
        0x0f | 0xf6 | 0xfd | 0xfe => {
            let mut r = holdfast_wire::codec::Reader::new(value);
            let text = r.lenenc_bytes("parameter").ok()?;
            let text = std::str::from_utf8(text).ok()?.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            text.parse().ok()
        }
        _ => None,
    }
}

/// Writes `thread` in place of the id a `KILL` request names: four bytes for
/// COM_PROCESS_KILL, a new packet for a statement (`span`: where the number is in its
/// text; its length changes).
fn rewrite_id(request: &mut BytesMut, thread: u32, span: Option<Range<usize>>) {
    let Some(span) = span else {
        if let Some(b) = request.get_mut(HEADER_LEN + 1..HEADER_LEN + 5) {
            b.copy_from_slice(&thread.to_le_bytes());
        }
        return;
    };
    let seq = request.get(3).copied().unwrap_or(0);
    let Some(sql) = request.get(HEADER_LEN + 1..) else {
        return;
    };
    let (Some(before), Some(after)) = (sql.get(..span.start), sql.get(span.end..)) else {
        return;
    };
    let mut out = Vec::with_capacity(request.len() + 10);
    frame::frame_into(&mut out, seq, |p| {
        p.push(COM_QUERY);
        p.extend_from_slice(before);
        p.extend_from_slice(thread.to_string().as_bytes());
        p.extend_from_slice(after);
    });
    *request = BytesMut::from(&out[..]);
}

/// The length of the whole packets at the start of `buf`.
fn whole_packets(buf: &[u8]) -> usize {
    let mut at = 0;
    while let Some(h) = buf.get(at..).and_then(parse_header) {
        if at + h.packet_len() > buf.len() {
            break;
        }
        at += h.packet_len();
    }
    at
}
