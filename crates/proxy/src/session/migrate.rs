//! The move phase: the session goes to another backend connection when its node stops being
//! the primary, when its backend connection is lost, or after a planned switchover. The
//! client's connection stays open; its state (schema, variables, user variables,
//! LAST_INSERT_ID, prepared statements under the ids the client holds) is recreated on the
//! new node, and the request that was waiting runs there. A request lost in flight with its
//! backend is re-run there when that is safe, and answered with an error that says what
//! happened otherwise.

use super::{CloseReason, End, Session};
use crate::backend::{self, BackendConn, BackendError, LoginParams};
use crate::conn::ConnError;
use crate::error::{ClientError, ErrorKind};
use crate::restore::{self, RestoreError};
use holdfast_cluster::topology::NodeState;
use holdfast_wire::caps::{CLIENT_DEPRECATE_EOF, SERVER_STATUS_IN_TRANS};
use holdfast_wire::command::*;
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a session waits for the server to let go of a connection the network cut
/// that holdfast killed (a long statement may take a while to end).
const CUT_CONNECTION_GONE_WITHIN: Duration = Duration::from_secs(10);

/// A session busy without pause still captures its state this often while it is due.
const CAPTURE_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// Pause between attempts to open a backend on a node that is not ready yet.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The server's uptime in seconds.
const UPTIME: &str =
    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME' \
     LIMIT 18446744073709551615";

/// Why a node could not take the session yet (worth another try within the hold window).
/// Shown to the client when the hold window expires, so it names nodes, never addresses;
/// the backend's own error text goes to the log.
pub(super) enum NotReady {
    NoWritableNode,
    Unreachable(String),
    ReadOnly(String),
    InstanceDown,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NoWritableNode => f.write_str("no writable node known"),
            NotReady::Unreachable(n) => write!(f, "{n} could not be reached"),
            NotReady::ReadOnly(n) => write!(f, "{n} is read-only"),
            NotReady::InstanceDown => f.write_str("the instance did not resume"),
        }
    }
}

/// The backend connection a session lost: where, how old, its server thread.
#[derive(Debug, Clone)]
pub(super) struct LostConn {
    pub node: String,
    /// When it was opened.
    pub since: Instant,
    pub thread: u32,
    /// The loss was the network's: a timeout, or a reset while the node took no new
    /// connection from holdfast either (a cut). A reset while it does is the server's own
    /// (what a write after it closed a killed connection gets): that may be a KILL.
    pub by_network: bool,
}

/// Whether `error` is one the network gives (a reset, a timeout, no route) rather than an
/// orderly close.
pub(super) fn network_error(error: &ConnError) -> bool {
    use std::io::ErrorKind::*;
    matches!(error, ConnError::Io(e) if matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | TimedOut | HostUnreachable | NetworkUnreachable
    ))
}

/// Whether `error` is a timeout: bytes sent and never acknowledged, or an answer that did
/// not arrive (see [`Session::lost_conn_after`]).
fn timed_out(error: &ConnError) -> bool {
    matches!(error, ConnError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut)
}

/// What a request lost with its backend was.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lost {
    pub in_transaction: bool,
    /// It may have committed its transaction: its outcome is not known.
    pub commit: bool,
    /// Its transaction is replayed before it runs again.
    pub replay: bool,
}

/// Why one attempt to move failed.
pub(super) enum MoveError {
    Retry(NotReady),
    /// The session cannot be moved at all.
    Fatal {
        reason: CloseReason,
        message: String,
    },
}

impl Session {
    /// Notes that the backend connection is gone: the session moves before its next command,
    /// and an open transaction went with the connection.
    pub(super) fn mark_backend_dead(&mut self) {
        self.backend_dead = true;
        if self.record.status & SERVER_STATUS_IN_TRANS != 0 {
            self.transaction_lost = true;
            self.record.status &= !SERVER_STATUS_IN_TRANS;
            // Inside a transaction the characteristics tracker describes the open one
            // ("START TRANSACTION;"), which is gone; one-shot SET TRANSACTION went with it.
            self.record.next_transaction.clear();
            // A replay starts from what the transaction's first statement saw.
            if let Some(log) = self.txn_log.as_ref().filter(|l| l.replayable()) {
                self.record.last_insert_id = log.start_last_insert_id;
            }
        }
    }

    /// The backend was lost with a command that has no reply (COM_STMT_CLOSE,
    /// COM_STMT_SEND_LONG_DATA) in flight. The client waits for nothing, so it is told
    /// nothing: the session moves before its next command, which learns of an open
    /// transaction lost with the backend (1213), like after a loss while idle. A lost close
    /// has already dropped the statement (it is not prepared again); lost long data makes
    /// that move fail (the data cannot be recreated).
    pub(super) fn lost_without_reply(&mut self, request: &[u8], error: ConnError) {
        let command = request
            .get(holdfast_wire::frame::HEADER_LEN)
            .map_or("", |&c| name(c));
        tracing::info!(session = self.info.id, node = %self.backend_name, %error, command, "backend lost during a command without a reply");
        self.mark_backend_dead();
    }

    /// The backend was lost before any of the response reached the client: move, then run
    /// `retry` again there (inside a transaction, after replaying it), or tell the client
    /// what became of its request.
    pub(super) async fn recover_lost_request(
        &mut self,
        error: ConnError,
        retry: Option<bytes::BytesMut>,
        reply_seq: u8,
        lost: Lost,
    ) -> Result<(), End> {
        let Lost {
            in_transaction,
            commit,
            replay,
        } = lost;
        tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost during a command");
        let lost_conn = self.lost_conn_after(&error, "request").await;
        self.mark_backend_dead();
        self.transaction_lost = false;
        self.relocate("backend_lost").await?;
        // A connection the server cut while it kept running was killed (someone's KILL,
        // `KILL USER`...): the session ends as the server ended it (the client learns it
        // from the closed connection, as it would directly), nothing is run again.
        if self.cut_while_server_ran(&lost_conn).await {
            return Err(self.killed_by_server(&lost_conn));
        }
        let retry = match retry {
            Some(again) if replay => match self.replay_transaction().await? {
                true => Some(again),
                false => {
                    self.execute_refused(&again).await;
                    None
                }
            },
            retry => retry,
        };
        if let Some(again) = retry {
            self.shared.metrics.requests_retried.inc();
            // Through `forward_request`: a backend lost again is recovered from again.
            return self.forward_request(again).await;
        }
        if in_transaction && commit && !self.markers.txn_writes {
            // A transaction that wrote nothing: committed or rolled back, the database is
            // the same, and so is what the client may rely on. Its COMMIT's answer is OK.
            self.record.status &= !SERVER_STATUS_IN_TRANS;
            self.txn_log = None;
            self.shared.metrics.commit_outcome("nothing_written");
            let ok = holdfast_wire::packets::ok_payload(0, 0, self.record.status, 0);
            return self
                .client
                .write_packet(&ok, reply_seq)
                .await
                .map_err(End::Client);
        }
        self.shared.metrics.requests_failed_on_backend_loss.inc();
        // `commit`: the statement may have committed the transaction (COMMIT, an implicit
        // commit, a prepared COMMIT...), so it is not known to be rolled back.
        let error = if in_transaction && commit {
            self.shared.metrics.commit_outcome("unknown");
            ClientError::commit_outcome_unknown()
        } else if in_transaction {
            if !replay {
                self.shared.metrics.replay(self.not_replayable_outcome());
            }
            ClientError::transaction_rolled_back()
        } else {
            ClientError::statement_interrupted()
        };
        self.send_error(reply_seq, &error).await
    }

    /// What is known of the backend connection just lost, taken before the move.
    pub(super) fn lost_conn(&self) -> LostConn {
        LostConn {
            node: self.backend_name.to_string(),
            since: self.backend_since,
            thread: self.backend.greeting.connection_id,
            by_network: false,
        }
    }

    /// [`Session::lost_conn`] for a connection lost with `error`: a network error counts as
    /// the network's only while the node takes no new connection from holdfast at once.
    /// Counted as lost `when` (`idle`, `request`) once that is told.
    pub(super) async fn lost_conn_after(&self, error: &ConnError, when: &'static str) -> LostConn {
        let lost = self.lost_conn();
        // A timeout is the network's whatever the node does now: a KILL closes the
        // connection (an EOF, or a reset on the next write), it never leaves bytes
        // unacknowledged (TCP_USER_TIMEOUT) or an answer stuck (`stuck.rs`). By the time
        // the node is asked, the server may have closed its side on the reset holdfast's
        // end sent it once the cut healed.
        let by_network = timed_out(error)
            || (network_error(error) && !self.node_takes_connections(&lost.node).await);
        self.shared.metrics.backend_lost(when);
        LostConn { by_network, ..lost }
    }

    /// Whether `node` takes a TCP connection from holdfast (its backend source address)
    /// within a moment.
    async fn node_takes_connections(&self, node: &str) -> bool {
        let Some(address) = self.shared.node_address(node) else {
            return true;
        };
        let attempt = self.shared.connector.connect(&address);
        matches!(
            tokio::time::timeout(Duration::from_millis(300), attempt).await,
            Ok(Ok(_))
        )
    }

    /// After a move for a lost request: whether the session is back on the node it lost
    /// and that server kept running meanwhile. Then no restart or crash took the
    /// connection: it was cut while the server kept running, by someone's KILL (MariaDB
    /// closes a killed connection without an ERR) or the network. False when that cannot
    /// be told.
    pub(super) async fn cut_while_server_ran(&mut self, lost: &LostConn) -> bool {
        let ran = self.server_ran_throughout(lost).await == Some(true);
        if !ran {
            return false;
        }
        if self.fence_cut_connection(lost).await {
            return false;
        }
        if lost.by_network {
            // Gone, and the loss was the network's (the node took no connection from
            // holdfast then): the server closed its side once the cut healed, no KILL.
            tracing::info!(session = self.info.id, node = %lost.node, thread = lost.thread, "the network cut the backend connection; the server has closed its side too; recovering");
            return false;
        }
        if self.monitor_lost_node_since(lost) {
            // Seen only after a cut healed (the connection was not used during it: idle
            // on the server's side, a split session busy on a replica), the loss looks
            // like a KILL's; but the monitor lost the node meanwhile.
            tracing::info!(session = self.info.id, node = %lost.node, thread = lost.thread, "the backend connection was lost while the monitor lost the node too (a network cut); the server has closed its side; recovering");
            return false;
        }
        tracing::info!(session = self.info.id, node = %lost.node, age_ms = lost.since.elapsed().as_millis() as u64, "the lost connection was cut while its server kept running (KILL?); not running the request again");
        true
    }

    /// Whether the monitor lost the lost connection's node after that one was opened (its
    /// own connection gone, a probe failed; a slow probe is not enough): the network failed
    /// between holdfast and the node while the connection was open (a restart is ruled
    /// out before). A KILL in the same span is then taken for the network's doing too:
    /// the session recovers rather than ends, which is the safer mistake.
    fn monitor_lost_node_since(&self, lost: &LostConn) -> bool {
        let links = self.shared.monitor_links.borrow();
        links.lost_after(&lost.node, lost.since) == Some(true)
    }

    /// Whether the lost connection is still on its server and not being killed: then the
    /// network cut it, on holdfast's side only (a reset, a timeout), and no KILL. holdfast
    /// kills it now and waits until it is gone (its statement ends, its transaction rolls
    /// back), so that the session recovers as from any lost backend without the old
    /// connection still running: true when that is done. False when it is gone (the
    /// server ended it: a KILL) or cannot be told.
    async fn fence_cut_connection(&mut self, lost: &LostConn) -> bool {
        let thread = lost.thread;
        let query =
            format!("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = {thread}");
        let command = |r: &holdfast_client::TextResult| {
            r.rows
                .first()
                .and_then(|row| row.first())
                .cloned()
                .flatten()
        };
        match self.backend.query(&query).await.map(|r| command(&r)) {
            // A killed connection shows `Killed` until the server has let it go.
            Ok(Some(c)) if c != "Killed" => {}
            _ => return false,
        }
        let kill = format!("KILL CONNECTION {thread}");
        if let Err(e) = restore::execute(&mut self.backend, kill.as_bytes()).await {
            tracing::warn!(session = self.info.id, node = %lost.node, thread, error = %e, "the connection the network cut is still on the server and could not be killed");
            return false;
        }
        let deadline = Instant::now() + CUT_CONNECTION_GONE_WITHIN;
        loop {
            match self.backend.query(&query).await.map(|r| command(&r)) {
                Ok(None) => break,
                Ok(Some(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => return false,
            }
        }
        tracing::info!(session = self.info.id, node = %lost.node, thread, age_ms = lost.since.elapsed().as_millis() as u64, "the network cut the backend connection while its server kept running; the old connection killed, recovering");
        self.shared.metrics.cut_connections_fenced.inc();
        true
    }

    /// Whether the session is back on the node it lost and that server did not restart
    /// since (`None`: it cannot be told). A server hands out connection ids in increasing
    /// order from its start: a new id above the lost one says it kept running, unless its
    /// uptime is shorter than the lost connection's age.
    pub(super) async fn server_ran_throughout(&mut self, lost: &LostConn) -> Option<bool> {
        if self.backend_name != lost.node {
            return Some(false);
        }
        if self.backend.greeting.connection_id <= lost.thread {
            return Some(false);
        }
        match self.backend.query(UPTIME).await {
            Ok(r) => {
                let uptime = r
                    .rows
                    .first()
                    .and_then(|row| row.first())
                    .cloned()
                    .flatten();
                let uptime = uptime.and_then(|v| v.parse::<u64>().ok())?;
                let age = lost.since.elapsed().as_secs();
                // Whole seconds, rounded down: restarted for sure when shorter than the
                // connection's age (now: it began before the server stopped, if it did)
                // by a second or more; up for sure when longer by a second or more.
                if uptime < age {
                    return Some(false);
                }
                if uptime > age + 1 {
                    return Some(true);
                }
                // A server up about as long as the connection (a restart right after it
                // was made, or a fresh server): the monitor's own connection tells.
                self.monitor_saw_it_run(lost).await
            }
            Err(e) => {
                tracing::debug!(session = self.info.id, error = %e, "uptime of the new backend unknown");
                None
            }
        }
    }

    /// Whether the monitor's own connection to the lost connection's node was open before
    /// that connection and still answered a probe sent after its loss was seen: then the
    /// server did not restart in between. Waits for such a probe (the monitor is nudged)
    /// up to a few monitor intervals; `None` when there is none (the monitor could not
    /// probe the node, or is held while the instance is paused).
    async fn monitor_saw_it_run(&self, lost: &LostConn) -> Option<bool> {
        let seen = Instant::now();
        let mut links = self.shared.monitor_links.clone();
        self.shared.ha.topology_nudge().notify_one();
        let deadline =
            tokio::time::Instant::now() + 3 * holdfast_cluster::monitor::MONITOR_INTERVAL;
        loop {
            {
                let now = links.borrow_and_update();
                match now.links.get(&lost.node) {
                    Some(link) if link.answered_after >= seen => {
                        return Some(link.open_since <= lost.since)
                    }
                    // A round sent after the loss did not get through to the node.
                    None if now.round_started.is_some_and(|t| t >= seen) => return None,
                    _ => {}
                }
            }
            match tokio::time::timeout_at(deadline, links.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    tracing::debug!(session = self.info.id, node = %lost.node, "no monitor round told whether the node restarted");
                    return None;
                }
            }
        }
    }

    /// After a command: move at a safe point if a move is pending, and keep the capture of
    /// what the trackers do not report from falling behind a session that never idles.
    pub(super) async fn after_command(&mut self) -> Result<(), End> {
        if self.move_pending_since.is_some() && self.record.blocker().is_none() {
            self.relocate("primary_changed").await?;
        }
        if self.record.capture_due {
            let since = *self.capture_due_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= CAPTURE_AT_LEAST_EVERY {
                self.capture_if_due(false).await;
            }
        } else {
            self.capture_due_since = None;
            self.info.capture_deferred.store(false, Ordering::Release);
        }
        // A switchover waits for due captures, but not for one that keeps failing.
        let waiting = self.record.capture_due && !self.capture_failing;
        self.info.capture_due.store(waiting, Ordering::Release);
        Ok(())
    }

    /// Reads what the trackers do not report (user variables, `LAST_INSERT_ID()`, the
    /// connection collation) when a statement may have changed it: 1-3 round trips, so
    /// done when the session goes idle, before a planned move, or at least every
    /// [`CAPTURE_AT_LEAST_EVERY`], not after each statement.
    ///
    /// The client must not be able to tell (`SHOW WARNINGS`, `FOUND_ROWS()`,
    /// `ROW_COUNT()` read what its own last statement left). Before a move (`moving`) they
    /// are lost with the connection anyway. Otherwise the capture runs only when they can
    /// be put back: no warnings (the capture's `information_schema` read clears them, and
    /// they cannot be recreated: notes, codes, SQLSTATEs) and `ROW_COUNT()` -1 or 0
    /// (nothing sets it to n > 0 without changing data); they are read first
    /// (`@@warning_count` too: a statement without tables keeps earlier warnings while its
    /// own EOF counts none) and recreated after. Else the capture waits for a later quiet
    /// moment, a switchover's start or a move; a crash of the node meanwhile restores the
    /// previous capture. The
    /// server's status counters (`Questions`, `Com_select`...) do count holdfast's
    /// statements.
    pub(super) async fn capture_if_due(&mut self, moving: bool) {
        if !self.record.capture_due || self.backend_dead {
            return;
        }
        if !moving && (self.record.last_warnings > 0 || self.record.last_affected_rows > 0) {
            self.defer_capture();
            return;
        }
        // An XA transaction past XA END takes no statement (1399, which the client would
        // then read in SHOW WARNINGS); the session cannot move while it lasts anyway.
        if self.record.xa {
            self.defer_capture();
            return;
        }
        // Boxed, like the other rare paths, so that its state does not add to the size of
        // every session's future.
        match Box::pin(capture_keeping_diagnostics(&mut self.backend, moving)).await {
            Ok(Some(c)) => {
                self.record.last_insert_id = c.last_insert_id;
                // A change of user variables explains a procedure's state change only when
                // the capture before it was up to date (else an earlier statement's may be
                // what differs, and the procedure made a temporary table, say).
                let unattributable = std::mem::take(&mut self.opaque_unattributable);
                if std::mem::take(&mut self.record.opaque_change)
                    && (c.user_variables == self.captured.user_variables || unattributable)
                {
                    tracing::info!(
                        session = self.info.id,
                        "a procedure or dynamic SQL changed the session's state, and its user variables do not explain it: the session cannot move from now on"
                    );
                    self.record.unknown_state = true;
                    self.info.set_blocker(self.record.blocker());
                }
                self.captured = c;
                // Replica connections follow the captured values (user variables).
                self.record.state_version += 1;
                self.record.capture_due = false;
                self.capture_due_since = None;
                self.capture_failing = false;
                self.info.capture_due.store(false, Ordering::SeqCst);
                self.info.capture_deferred.store(false, Ordering::SeqCst);
            }
            Ok(None) => self.defer_capture(),
            Err(e) => {
                tracing::debug!(session = self.info.id, error = %e, "capture failed; will retry");
                self.capture_failing = true;
                self.info.capture_due.store(false, Ordering::SeqCst);
                self.info.capture_deferred.store(false, Ordering::SeqCst);
            }
        }
    }

    /// A capture the client could tell waits: a pause need not wait for it (a frozen
    /// server keeps the session; a stopped one restores the previous capture), a
    /// switchover does, and the session captures when one starts (`idle.rs`).
    fn defer_capture(&mut self) {
        self.info.capture_due.store(false, Ordering::SeqCst);
        self.info.capture_deferred.store(true, Ordering::SeqCst);
    }

    /// Moves the session to the current primary, waiting for one up to the hold window.
    pub(super) async fn relocate(&mut self, why: &'static str) -> Result<(), End> {
        // Boxed: a move is rare and its future is large (login, restore, re-prepare); kept
        // inline it would make every session's future, idle ones included, that large.
        Box::pin(self.relocate_now(why)).await
    }

    async fn relocate_now(&mut self, why: &'static str) -> Result<(), End> {
        let started = Instant::now();
        let hold = self.shared.config().proxy.hold_window();
        let deadline = started + hold;
        if !self.can_reauthenticate {
            return Err(self.closed(
                CloseReason::CannotReauthenticate,
                "closed: the session must move to another node, but its login was relayed (auth plugin holdfast cannot answer), so holdfast cannot log in again for it".into(),
            ));
        }
        if self.backend_dead {
            // A procedure or dynamic SQL changed the state and no capture has told what.
            if self.record.opaque_change {
                self.record.unknown_state = true;
            }
            if let Some(lost) = self.record.lost_with_backend() {
                return Err(self.closed(
                    CloseReason::StateLost(lost),
                    format!(
                        "closed: the backend was lost and with it {}, which cannot be recreated",
                        lost.what_is_lost()
                    ),
                ));
            }
            if self.record.capture_due {
                // The node died before the session went idle long enough to capture: the
                // user variables restored are those of the last capture.
                tracing::warn!(
                    session = self.info.id,
                    "backend lost before the session's last user variable changes were captured; restoring the last capture"
                );
            }
            self.captured.last_insert_id = self.record.last_insert_id;
        } else {
            self.capture_if_due(true).await;
            if self.record.unknown_state {
                // The capture found state holdfast cannot recreate: the session stays
                // where it is (a blocker from now on; the cool-down decides).
                self.move_pending_since.get_or_insert_with(Instant::now);
                return Ok(());
            }
            if self.record.capture_due {
                tracing::info!(
                    session = self.info.id,
                    "capture on the old backend failed; using the last capture"
                );
            }
            self.captured.last_insert_id = self.record.last_insert_id;
        }
        let mut last = NotReady::NoWritableNode;
        loop {
            let epoch_before = self.shared.gate.epoch();
            if let Some(node) = self.primary() {
                match self.open_restored(&node).await {
                    Ok(new) => {
                        self.switch_backend(new, &node, epoch_before, why, started);
                        return Ok(());
                    }
                    Err(MoveError::Fatal { reason, message }) => {
                        // Say why (e.g. which variable the new node refused) before closing.
                        let error = ClientError::new(
                            ErrorKind::SessionLost,
                            format!(
                                "holdfast: the session could not be moved to {}: {message}",
                                node.name
                            ),
                        );
                        let _ = self.send_error(1, &error).await;
                        return Err(self.closed(reason, message));
                    }
                    Err(MoveError::Retry(why_not)) => last = why_not,
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let message = format!(
                    "holdfast: no writable database node became available within the hold window of {} ms ({last}); closing the connection",
                    hold.as_millis()
                );
                let error = ClientError::new(ErrorKind::SessionLost, message.clone());
                let _ = self.send_error(1, &error).await;
                return Err(self.closed(CloseReason::HoldWindowExpired, message));
            }
            if !self.shared.gate.is_open() {
                // The instance is down (paused, or restarting after a crash): this session
                // waits for it like a new request would.
                if super::route::open_gate(&self.shared, "move").await.is_err() {
                    last = NotReady::InstanceDown;
                }
                continue;
            }
            let pause = (deadline - now).min(RETRY_PAUSE);
            tokio::select! {
                _ = self.topology.changed() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Counts a failed move and the close it causes.
    fn closed(&self, reason: CloseReason, message: String) -> End {
        self.shared.metrics.move_failed(reason.label());
        End::Closed { reason, message }
    }

    fn switch_backend(
        &mut self,
        new: BackendConn,
        node: &NodeState,
        epoch: u64,
        why: &'static str,
        started: Instant,
    ) {
        // Dropping the old connection tells its server we are leaving (COM_QUIT).
        drop(std::mem::replace(&mut self.backend, new));
        let elapsed = started.elapsed();
        tracing::info!(session = self.info.id, from = %self.backend_name, to = %node.name, reason = why, ms = elapsed.as_millis() as u64, "session moved");
        self.info.note_move(crate::registry::Move {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            from: self.backend_name.to_string(),
            to: node.name.to_string(),
            why: why.to_string(),
            ms: elapsed.as_secs_f64() * 1000.0,
        });
        self.backend_name = node.name.clone();
        self.info
            .set_backend(&node.name, self.backend.greeting.connection_id);
        self.info.moves.fetch_add(1, Ordering::Relaxed);
        self.backend_dead = false;
        self.backend_epoch = epoch;
        self.backend_since = Instant::now();
        self.move_pending_since = None;
        self.shared.metrics.sessions_moved.inc();
        self.shared.metrics.move_latency.observe(elapsed);
    }

    /// Whether the topology takes `node` for a primary an operator made read-only (a
    /// session may move there: its writes get the server's error, as they would directly).
    fn is_read_only_primary(&self, node: &str) -> bool {
        let t = self.topology.borrow();
        t.read_only_primary && t.primary_node().is_some_and(|p| p.name == node)
    }

    /// Logs in on `node`, checks it is writable, restores the session state and prepares
    /// the session's statements again.
    async fn open_restored(&mut self, node: &NodeState) -> Result<BackendConn, MoveError> {
        let unreachable = |e: &dyn fmt::Display| {
            tracing::debug!(node = %node.name, error = %e, "node not ready for the session yet");
            MoveError::Retry(NotReady::Unreachable(node.name.to_string()))
        };
        let mut new = self.log_in_on(node).await?;
        let read_only = new
            .query("SELECT @@global.read_only")
            .await
            .map_err(|e| unreachable(&e))?;
        if read_only
            .rows
            .first()
            .and_then(|r| r.first())
            .cloned()
            .flatten()
            .as_deref()
            != Some("0")
            && !self.is_read_only_primary(&node.name)
        {
            return Err(MoveError::Retry(NotReady::ReadOnly(node.name.to_string())));
        }
        if !new.enable_trackers().await.map_err(|e| unreachable(&e))? {
            self.record.untracked = true;
        }
        if self.tracks_transactions {
            restore::execute(&mut new, crate::restore::TRACK_TRANSACTIONS.as_bytes())
                .await
                .map_err(|e| unreachable(&e))?;
        }
        let types = self
            .shared
            .variable_types
            .of(&node.name, &mut new)
            .await
            .map_err(|e| unreachable(&e))?;
        let mut record = self.record.clone();
        self.captured.apply_to(&mut record);
        match restore::restore_session(&mut new, &record, &self.captured.user_variables, &types)
            .await
        {
            Ok(()) => {}
            Err(RestoreError::Backend(e)) => return Err(unreachable(&e)),
            Err(e) => {
                return Err(MoveError::Fatal {
                    reason: CloseReason::StateRejected,
                    message: format!("closed: {e}"),
                })
            }
        }
        let deprecate_eof = new.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let mut ids = Vec::with_capacity(self.statements.len());
        for (client_id, stmt) in self.statements.iter() {
            let id = prepare(&mut new, &stmt.sql, deprecate_eof)
                .await
                .map_err(|e| match e {
                    PrepareError::Conn(e) => unreachable(&e),
                    PrepareError::Refused(m) => MoveError::Fatal {
                        reason: CloseReason::ReprepareRefused,
                        message: format!(
                            "closed: prepared statement {client_id} cannot be prepared on {}: {m}",
                            node.name
                        ),
                    },
                })?;
            ids.push((client_id, id));
        }
        for (client_id, id) in ids {
            if let Some(stmt) = self.statements.get_mut(client_id) {
                stmt.backend_id = id;
                stmt.types_pending = stmt.params > 0 && stmt.types.is_some();
            }
        }
        Ok(new)
    }

    /// Logs the session's user in on `node` (a new connection, no state yet).
    pub(super) async fn log_in_on(&self, node: &NodeState) -> Result<BackendConn, MoveError> {
        let unreachable = |e: &dyn fmt::Display| {
            tracing::debug!(node = %node.name, error = %e, "node not ready for the session yet");
            MoveError::Retry(NotReady::Unreachable(node.name.to_string()))
        };
        let cfg = self.shared.config_snapshot();
        let header = backend::proxy_header(node, self.info.client);
        let tls = crate::tls::backend(&cfg.backend_tls).map_err(|e| unreachable(&e))?;
        let params = LoginParams {
            user: &self.identity.user,
            secret: self.secret.as_ref(),
            database: None,
            charset: self.identity.charset,
            client_capabilities: self.capabilities,
            mariadb_caps: self.identity.mariadb_caps,
            attributes: &self.identity.attributes,
            exact_capabilities: false,
            proxy_header: header.as_deref(),
            tls: tls.as_ref(),
        };
        self.shared.metrics.backend_connects.inc();
        let connector = &*self.shared.connector;
        let timeout = cfg.proxy.connect_timeout();
        match backend::connect(connector, &node.address, &params, timeout).await {
            Ok(b) => Ok(b),
            Err(BackendError::Server {
                code: crate::error::code::ER_ACCESS_DENIED_ERROR,
                message,
                ..
            }) => Err(MoveError::Fatal {
                reason: CloseReason::LoginRefused,
                message: format!(
                    "closed: the new node {} refused the session's login: {message}",
                    node.name
                ),
            }),
            Err(e) => {
                self.shared.metrics.backend_connect_failures.inc();
                Err(unreachable(&e))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum PrepareError {
    #[error("{0}")]
    Conn(ConnError),
    #[error("refused: {0}")]
    Refused(String),
}

/// Prepares `sql` on a backend, returning the backend's statement id.
pub(super) async fn prepare(
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

/// [`restore::capture_session`], leaving `FOUND_ROWS()` and `ROW_COUNT()` as they were
/// unless `moving`; `None` when they could not be put back (nothing captured).
async fn capture_keeping_diagnostics(
    backend: &mut BackendConn,
    moving: bool,
) -> Result<Option<restore::Captured>, restore::CaptureError> {
    if moving {
        return restore::capture_session(backend).await.map(Some);
    }
    let diagnostics = restore::read_diagnostics(backend).await?;
    if !diagnostics.restorable() {
        // Reading them changed them; this much is put back, the rest waits for a move.
        restore::put_back_diagnostics(backend, diagnostics).await?;
        return Ok(None);
    }
    let captured = restore::capture_session(backend).await?;
    restore::put_back_diagnostics(backend, diagnostics).await?;
    Ok(Some(captured))
}
