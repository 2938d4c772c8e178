//! Moving a session to another backend connection: when its node stops being the primary,
//! when its backend connection is lost, or when a request arrives while the primary is
//! switching. The client's connection stays open; its state (schema, variables, user
//! variables, LAST_INSERT_ID, prepared statements under the ids the client holds) is
//! recreated on the new node, and the request that was waiting runs there.

use super::{End, Session};
use crate::backend::{self, BackendConn, BackendError, LoginParams};
use crate::conn::{ConnError, PacketConn};
use crate::errors::{ER_CONNECTION_KILLED, ER_INSTANCE_UNAVAILABLE};
use crate::restore::{self, RestoreError, VariableTypes};
use crate::topology::{NodeState, Topology};
use bytes::BytesMut;
use holdfast_sql::{classify, first_keyword, Classification as C};
use holdfast_wire::caps::{CLIENT_DEPRECATE_EOF, SERVER_STATUS_IN_TRANS};
use holdfast_wire::command::*;
use holdfast_wire::frame::{parse_header, HEADER_LEN};
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Code and SQL state a statement gets when its transaction died with its backend: the same
/// as a deadlock victim, whose transaction the server also rolled back, so applications
/// that retry deadlocks retry this too.
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_ERROR_DURING_COMMIT: u16 = 1180;
const ER_QUERY_INTERRUPTED: u16 = 1317;

/// Pause between attempts to open a backend on a node that is not ready yet.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why one attempt to move failed.
enum MoveError {
    /// Worth another try within the hold window (node not ready, not writable yet...).
    Retry(String),
    /// The session cannot be moved at all.
    Fatal {
        reason: &'static str,
        message: String,
    },
}

/// How long a client must be silent before its session watches for idle-time events.
const IDLE_PROBE: Duration = Duration::from_millis(20);

pub(super) enum IdleEvent {
    /// The topology changed (false: the monitor is gone).
    Topology(bool),
    BackendGone,
    Cooldown,
}

/// What can happen to an idle session: the topology changes, its backend goes away, its
/// cool-down ends. Armed only after [`IDLE_PROBE`] of client silence.
pub(super) async fn idle_watch(
    conn: &mut PacketConn,
    topology: &mut watch::Receiver<Arc<Topology>>,
    backend_dead: bool,
    cooldown_end: Option<Instant>,
) -> IdleEvent {
    tokio::time::sleep(IDLE_PROBE).await;
    tokio::select! {
        r = topology.changed(), if !backend_dead => IdleEvent::Topology(r.is_ok()),
        _ = backend_gone(conn), if !backend_dead => IdleEvent::BackendGone,
        _ = sleep_until_opt(cooldown_end), if cooldown_end.is_some() => IdleEvent::Cooldown,
        else => std::future::pending().await,
    }
}

/// Resolves when the backend connection of an idle session closes or sends something on its
/// own (servers send an ERR before they close a connection on shutdown or KILL).
async fn backend_gone(conn: &mut PacketConn) {
    loop {
        if conn.stream.readable().await.is_err() {
            return;
        }
        match conn.stream.try_read_buf(&mut conn.rbuf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            _ => return,
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

impl Session {
    /// The serverless instance's current epoch (0 without one).
    pub(super) fn server_epoch(&self) -> u64 {
        self.shared.serverless.as_ref().map_or(0, |l| l.epoch())
    }

    fn primary(&self) -> Option<NodeState> {
        self.topology
            .borrow()
            .primary_node()
            .filter(|n| n.reachable || n.read_only.is_none())
            .cloned()
    }

    /// The topology changed while the session was idle.
    pub(super) async fn on_topology_change(&mut self) -> Result<(), End> {
        let Some(primary) = self.primary() else {
            return Ok(());
        };
        if primary.name == self.backend_name {
            self.move_pending_since = None;
            return Ok(());
        }
        if self.record.blocker().is_none() {
            self.relocate("primary_changed").await
        } else {
            if self.move_pending_since.is_none() {
                tracing::info!(session = self.info.id, blocked_by = ?self.record.blocker(), "session must move but is not at a safe point; waiting for one");
            }
            self.move_pending_since.get_or_insert_with(Instant::now);
            Ok(())
        }
    }

    /// The backend of an idle session went away.
    pub(super) fn on_backend_lost_idle(&mut self) {
        tracing::info!(session = self.info.id, node = %self.backend_name, "backend connection lost while idle");
        self.mark_backend_dead();
    }

    fn mark_backend_dead(&mut self) {
        self.backend_dead = true;
        if self.record.status & SERVER_STATUS_IN_TRANS != 0 {
            self.transaction_lost = true;
            self.record.status &= !SERVER_STATUS_IN_TRANS;
            // Inside a transaction the characteristics tracker describes the open one
            // ("START TRANSACTION;"), which is gone; one-shot SET TRANSACTION went with it.
            self.record.next_transaction.clear();
        }
    }

    pub(super) fn cooldown_expired(&mut self) -> End {
        let blocker = self.record.blocker().unwrap_or("unknown");
        End::Closed {
            reason: cooldown_reason(blocker),
            message: format!(
                "closed: its node is no longer the primary and the session did not reach a safe point within the cool-down of {} ms ({blocker})",
                self.shared.config.proxy.cooldown_ms
            ),
        }
    }

    /// Runs one client request, moving the session first when it must, and dealing with a
    /// backend lost while the request was in flight.
    pub(super) async fn run_request(&mut self, request: BytesMut) -> Result<(), End> {
        let reply_seq = parse_header(&request).map_or(1, |h| h.seq.wrapping_add(1));
        if let Some(lc) = &self.shared.serverless {
            let ping = request.get(HEADER_LEN) == Some(&COM_PING);
            if ping {
                // Pools' keep-alive pings are not use: they never keep the instance awake.
                self.info.pings.fetch_add(1, Ordering::Relaxed);
            }
            if !lc.is_running() {
                // A pool's keep-alive ping and a client leaving are answered here: neither
                // is worth waking the instance for.
                match request.get(HEADER_LEN) {
                    Some(&COM_PING) => {
                        let ok = holdfast_wire::packets::ok_payload(0, 0, self.record.status, 0);
                        return self
                            .client
                            .write_packet(&ok, reply_seq)
                            .await
                            .map_err(End::Client);
                    }
                    Some(&COM_QUIT) => return Err(End::Quit),
                    _ => {}
                }
                let lc = lc.clone();
                self.shared.metrics.wake("statement");
                self.shared.metrics.requests_held.inc();
                if let Err(e) = lc.wake("statement").await {
                    let message = format!("holdfast: {e}; the statement was not run");
                    return self
                        .send_error(reply_seq, ER_INSTANCE_UNAVAILABLE, &message)
                        .await;
                }
            }
            if lc.epoch() != self.backend_epoch && !self.backend_dead {
                // The server stopped while this session was idle: its connection is gone
                // even if the socket has not said so yet.
                tracing::debug!(
                    session = self.info.id,
                    "backend connection predates a server stop"
                );
                self.mark_backend_dead();
            }
        }
        if self.topology.has_changed().unwrap_or(false) && !self.backend_dead {
            self.topology.borrow_and_update();
            self.on_topology_change().await?;
        }
        if self.shared.switching_now.load(Ordering::SeqCst) && self.record.blocker().is_none() {
            self.park().await?;
        }
        if self.backend_dead {
            self.shared.metrics.requests_held.inc();
            self.relocate("backend_lost").await?;
        } else if self.move_pending_since.is_some() && self.record.blocker().is_none() {
            self.shared.metrics.requests_held.inc();
            self.relocate("primary_changed").await?;
        }
        if self.transaction_lost {
            self.transaction_lost = false;
            if !is_rollback(&request) {
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                return self
                    .send_error(reply_seq, ER_LOCK_DEADLOCK, "Deadlock found when trying to get lock; try restarting transaction (holdfast: the database node was lost and the open transaction was rolled back)")
                    .await;
            }
        }
        let in_transaction = self.record.in_transaction();
        let retry = self
            .retry_safe(&request, in_transaction)
            .then(|| request.clone());
        let commit = is_commit(&request);
        match self.command(request).await {
            Err(End::BackendLost {
                started: false,
                error,
            }) => {
                tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost during a command");
                self.mark_backend_dead();
                self.transaction_lost = false;
                self.relocate("backend_lost").await?;
                match retry {
                    Some(again) => {
                        self.shared.metrics.requests_retried.inc();
                        self.command(again).await
                    }
                    None => {
                        self.shared.metrics.requests_failed_on_backend_loss.inc();
                        let (code, message) = if in_transaction && commit {
                            (ER_ERROR_DURING_COMMIT, "Got error during COMMIT: holdfast lost the database node while the COMMIT was in flight; whether the transaction committed is unknown")
                        } else if in_transaction {
                            (ER_LOCK_DEADLOCK, "Deadlock found when trying to get lock; try restarting transaction (holdfast: the database node was lost and the open transaction was rolled back)")
                        } else {
                            (ER_QUERY_INTERRUPTED, "Query execution was interrupted: holdfast lost the database node while the statement was in flight; it may or may not have been applied")
                        };
                        self.send_error(reply_seq, code, message).await
                    }
                }
            }
            other => other,
        }
    }

    /// Whether a request lost with its backend may run again on another node: it only reads
    /// (or only starts a transaction, or sets session variables to constants) and no
    /// transaction was open.
    fn retry_safe(&self, request: &[u8], in_transaction: bool) -> bool {
        if in_transaction {
            return false;
        }
        let Some(&cmd) = request.get(HEADER_LEN) else {
            return false;
        };
        match cmd {
            COM_PING | COM_INIT_DB | COM_STMT_PREPARE | COM_STMT_RESET | COM_STATISTICS
            | COM_FIELD_LIST => true,
            COM_QUERY => retry_safe_sql(&request[HEADER_LEN + 1..]),
            COM_STMT_EXECUTE => holdfast_wire::packets::statement_id(&request[HEADER_LEN..])
                .and_then(|id| self.statements.get(&id))
                .is_some_and(|s| s.retry_safe),
            _ => false,
        }
    }

    /// Holds the request while a planned switchover runs, then moves if the primary changed.
    async fn park(&mut self) -> Result<(), End> {
        self.shared.metrics.requests_held.inc();
        self.info.parked.store(true, Ordering::SeqCst);
        self.info.busy.store(false, Ordering::SeqCst);
        let hold = self.shared.config.proxy.hold_window();
        let timed_out = tokio::time::timeout(hold, self.switching.wait_for(|s| !*s))
            .await
            .is_err();
        self.info.busy.store(true, Ordering::SeqCst);
        self.info.parked.store(false, Ordering::SeqCst);
        if timed_out {
            tracing::warn!(
                session = self.info.id,
                "switchover still running after the hold window; continuing"
            );
        }
        let moved_away = self.primary().is_some_and(|p| p.name != self.backend_name);
        if moved_away || self.backend_dead {
            self.relocate("switchover").await?;
        }
        Ok(())
    }

    /// After a command: move at a safe point if a move is pending, and capture what the
    /// trackers do not report when a statement may have changed it.
    pub(super) async fn after_command(&mut self) -> Result<(), End> {
        if self.move_pending_since.is_some() && self.record.blocker().is_none() {
            self.relocate("primary_changed").await?;
        }
        if self.record.user_variables_touched && !self.backend_dead {
            match restore::capture_session(&mut self.backend).await {
                Ok(c) => {
                    self.record.last_insert_id = c.last_insert_id;
                    self.captured = c;
                    self.record.user_variables_touched = false;
                }
                Err(e) => {
                    tracing::debug!(session = self.info.id, error = %e, "capture failed; will retry after the next statement")
                }
            }
        }
        Ok(())
    }

    /// Moves the session to the current primary, waiting for one up to the hold window.
    pub(super) async fn relocate(&mut self, why: &'static str) -> Result<(), End> {
        let started = Instant::now();
        let hold = self.shared.config.proxy.hold_window();
        let deadline = started + hold;
        if !self.can_reauthenticate {
            self.shared.metrics.move_failed("cannot_reauthenticate");
            return Err(End::Closed {
                reason: "cannot_reauthenticate",
                message: "closed: the session must move to another node, but its login was relayed (auth plugin holdfast cannot answer), so holdfast cannot log in again for it".into(),
            });
        }
        if self.backend_dead {
            if let Some(lost) = lost_state(&self.record) {
                self.shared.metrics.move_failed(lost.0);
                return Err(End::Closed {
                    reason: lost.0,
                    message: format!(
                        "closed: the backend was lost and with it {}, which cannot be recreated",
                        lost.1
                    ),
                });
            }
            self.captured.last_insert_id = self.record.last_insert_id;
        } else {
            match restore::capture_session(&mut self.backend).await {
                Ok(c) => self.captured = c,
                Err(e) => {
                    tracing::info!(session = self.info.id, error = %e, "capture on the old backend failed; using the last capture");
                    self.captured.last_insert_id = self.record.last_insert_id;
                }
            }
        }
        let mut last_error = String::from("no writable node known");
        loop {
            let epoch_before = self.server_epoch();
            if let Some(node) = self.primary() {
                match self.open_restored(&node).await {
                    Ok(new) => {
                        let mut old = std::mem::replace(&mut self.backend, new);
                        if !self.backend_dead {
                            // Best effort: tell the old server we are leaving.
                            let _ = old.conn.write_packet(&[COM_QUIT], 0).await;
                        }
                        drop(old);
                        let elapsed = started.elapsed();
                        tracing::info!(session = self.info.id, from = %self.backend_name, to = %node.name, reason = why, ms = elapsed.as_millis() as u64, "session moved");
                        self.backend_name = node.name.clone();
                        self.info.set_backend(&node.name);
                        self.info.moves.fetch_add(1, Ordering::Relaxed);
                        self.backend_dead = false;
                        self.backend_epoch = epoch_before;
                        self.move_pending_since = None;
                        self.shared.metrics.sessions_moved.inc();
                        self.shared.metrics.move_latency.observe(elapsed);
                        return Ok(());
                    }
                    Err(MoveError::Fatal { reason, message }) => {
                        self.shared.metrics.move_failed(reason);
                        // Say why (e.g. which variable the new node refused) before closing.
                        let _ = self
                            .send_error(
                                1,
                                ER_CONNECTION_KILLED,
                                &format!(
                                    "holdfast: the session could not be moved to {}: {message}",
                                    node.name
                                ),
                            )
                            .await;
                        return Err(End::Closed { reason, message });
                    }
                    Err(MoveError::Retry(e)) => {
                        tracing::debug!(session = self.info.id, node = %node.name, error = %e, "node not ready for the session yet");
                        last_error = e;
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                self.shared.metrics.move_failed("hold_window_expired");
                let message = format!(
                    "holdfast: no writable database node became available within the hold window of {} ms ({last_error}); closing the connection",
                    hold.as_millis()
                );
                let _ = self.send_error(1, ER_CONNECTION_KILLED, &message).await;
                return Err(End::Closed {
                    reason: "hold_window_expired",
                    message,
                });
            }
            if let Some(lc) = self.shared.serverless.clone() {
                if !lc.is_running() {
                    // The instance is down (paused, or restarting after a crash): this
                    // session waits for it like a new request would.
                    self.shared.metrics.wake("move");
                    if let Err(e) = lc.wake("move").await {
                        last_error = e.to_string();
                    }
                    continue;
                }
            }
            let pause = (deadline - now).min(RETRY_PAUSE);
            tokio::select! {
                _ = self.topology.changed() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Logs in on `node`, checks it is writable, restores the session state and prepares
    /// the session's statements again.
    async fn open_restored(&mut self, node: &NodeState) -> Result<BackendConn, MoveError> {
        let cfg = &self.shared.config;
        let params = LoginParams {
            user: &self.identity.user,
            secret: self.secret.as_ref(),
            database: None,
            charset: self.identity.charset,
            client_capabilities: self.capabilities,
            attributes: &self.identity.attributes,
            exact_capabilities: false,
        };
        self.shared.metrics.backend_connects.inc();
        let mut new =
            match backend::connect(&node.address, &params, cfg.proxy.connect_timeout()).await {
                Ok(b) => b,
                Err(BackendError::Server {
                    code: 1045,
                    message,
                    ..
                }) => {
                    return Err(MoveError::Fatal {
                        reason: "login_refused",
                        message: format!(
                            "closed: the new node {} refused the session's login: {message}",
                            node.name
                        ),
                    })
                }
                Err(e) => {
                    self.shared.metrics.backend_connect_failures.inc();
                    return Err(MoveError::Retry(e.to_string()));
                }
            };
        let read_only = new
            .query("SELECT @@global.read_only")
            .await
            .map_err(|e| MoveError::Retry(e.to_string()))?;
        if read_only
            .rows
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .as_deref()
            != Some("0")
        {
            return Err(MoveError::Retry(format!("{} is read-only", node.name)));
        }
        if !new
            .enable_trackers()
            .await
            .map_err(|e| MoveError::Retry(e.to_string()))?
        {
            self.record.untracked = true;
        }
        let types = VariableTypes::load(&mut new)
            .await
            .map_err(|e| MoveError::Retry(e.to_string()))?;
        let mut record = self.record.clone();
        self.captured.apply_to(&mut record);
        match restore::restore_session(&mut new, &record, &self.captured.user_variables, &types)
            .await
        {
            Ok(()) => {}
            Err(RestoreError::Backend(e)) => return Err(MoveError::Retry(e.to_string())),
            Err(e) => {
                return Err(MoveError::Fatal {
                    reason: "state_rejected",
                    message: format!("closed: {e}"),
                })
            }
        }
        let deprecate_eof = new.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let mut ids = Vec::with_capacity(self.statements.len());
        for (&client_id, stmt) in &self.statements {
            let id = prepare(&mut new, &stmt.sql, deprecate_eof)
                .await
                .map_err(|e| match e {
                    PrepareError::Conn(e) => MoveError::Retry(e.to_string()),
                    PrepareError::Refused(m) => MoveError::Fatal {
                        reason: "reprepare_refused",
                        message: format!(
                            "closed: prepared statement {client_id} cannot be prepared on {}: {m}",
                            node.name
                        ),
                    },
                })?;
            ids.push((client_id, id));
        }
        for (client_id, id) in ids {
            if let Some(stmt) = self.statements.get_mut(&client_id) {
                stmt.backend_id = id;
                stmt.types_pending = stmt.params > 0 && stmt.types.is_some();
            }
        }
        Ok(new)
    }
}

enum PrepareError {
    Conn(ConnError),
    Refused(String),
}

/// Prepares `sql` on a backend, returning the backend's statement id.
async fn prepare(
    conn: &mut BackendConn,
    sql: &[u8],
    deprecate_eof: bool,
) -> Result<u32, PrepareError> {
    let mut packet = Vec::with_capacity(sql.len() + 1);
    packet.push(COM_STMT_PREPARE);
    packet.extend_from_slice(sql);
    conn.conn
        .write_packet(&packet, 0)
        .await
        .map_err(PrepareError::Conn)?;
    let mut m = ResponseMachine::new(Expect::Prepare, deprecate_eof);
    let mut id = None;
    let mut refused = None;
    while !m.is_done() {
        let p = conn
            .conn
            .read_packet(64 << 20)
            .await
            .map_err(PrepareError::Conn)?;
        let len = p.payload.len().min(holdfast_wire::frame::MAX_PAYLOAD - 1);
        if m.classify(len, p.payload.first().copied()) == Kind::Inspect {
            match m.on_packet(&p.payload) {
                Ok(Event::PrepareOk(ok)) => id = Some(ok.statement_id),
                Ok(Event::Err(e)) => refused = Some(format!("{} {}", e.code, e.message_lossy())),
                Ok(_) => {}
                Err(e) => return Err(PrepareError::Conn(ConnError::Wire(e))),
            }
        }
    }
    match (id, refused) {
        (Some(id), None) => Ok(id),
        (_, Some(m)) => Err(PrepareError::Refused(m)),
        (None, None) => Err(PrepareError::Refused(
            "no statement id in the answer".into(),
        )),
    }
}

/// State that dies with a backend and cannot be recreated, with its metric reason.
fn lost_state(record: &crate::state::SessionRecord) -> Option<(&'static str, &'static str)> {
    if record.temporary_tables {
        Some(("temporary_tables_lost", "its temporary tables"))
    } else if record.table_locks {
        Some(("table_locks_lost", "its LOCK TABLES locks"))
    } else if record.named_locks {
        Some(("named_locks_lost", "its GET_LOCK locks"))
    } else if record.xa {
        Some(("xa_lost", "its XA transaction"))
    } else if record.open_cursors > 0 {
        Some(("cursor_lost", "an open cursor"))
    } else if record.pending_long_data {
        Some(("long_data_lost", "pending COM_STMT_SEND_LONG_DATA data"))
    } else {
        None
    }
}

fn cooldown_reason(blocker: &str) -> &'static str {
    match blocker {
        "open transaction" => "cooldown_open_transaction",
        "temporary table" => "cooldown_temporary_table",
        "LOCK TABLES" => "cooldown_lock_tables",
        "GET_LOCK" => "cooldown_get_lock",
        "XA transaction" => "cooldown_xa",
        "open cursor" => "cooldown_open_cursor",
        "pending long data" => "cooldown_long_data",
        _ => "cooldown_other",
    }
}

/// Whether a statement lost in flight (outside a transaction) may simply run again: it only
/// reads, only starts a transaction, or only sets session variables.
pub(super) fn retry_safe_sql(sql: &[u8]) -> bool {
    let flags = classify(sql);
    if flags.has(C::MULTI) {
        return false;
    }
    let only = |allowed: u32| flags.bits & !(allowed | C::WRITE.bits) == 0;
    flags.is_read_only()
        || (flags.has(C::BEGIN_TXN) && only(C::BEGIN_TXN.bits))
        || (flags.has(C::SET_SESSION_VAR) && only(C::SET_SESSION_VAR.bits | C::AUTOCOMMIT.bits))
}

fn query_text(request: &[u8]) -> Option<&[u8]> {
    (request.get(HEADER_LEN) == Some(&COM_QUERY)).then(|| &request[HEADER_LEN + 1..])
}

fn is_rollback(request: &[u8]) -> bool {
    query_text(request)
        .and_then(first_keyword)
        .is_some_and(|k| k.eq_ignore_ascii_case(b"ROLLBACK"))
}

fn is_commit(request: &[u8]) -> bool {
    query_text(request)
        .and_then(first_keyword)
        .is_some_and(|k| k.eq_ignore_ascii_case(b"COMMIT"))
}

#[cfg(test)]
mod tests {
    use super::retry_safe_sql;

    #[test]
    fn only_provably_harmless_statements_are_retried() {
        for sql in [
            "SELECT 1",
            "BEGIN",
            "START TRANSACTION",
            "SET autocommit=0",
            "SET NAMES utf8mb4",
            "SHOW TABLES",
        ] {
            assert!(retry_safe_sql(sql.as_bytes()), "{sql} should be retried");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a=1",
            "COMMIT",
            "SET @a = 1",
            "SELECT 1; SELECT 2",
            "SELECT GET_LOCK('x', 1)",
            "CALL p()",
        ] {
            assert!(!retry_safe_sql(sql.as_bytes()), "{sql} must not be retried");
        }
    }
}
