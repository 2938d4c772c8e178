//! The route phase: before a request goes to the backend, decide whether it can go now,
//! and where. Its inputs are the backend gate (a paused serverless instance is woken; a
//! pool's keep-alive ping is answered without waking it), the topology (the session's node
//! is no longer the primary), and a planned switchover (the request is parked until it is
//! done). A session that must move does so here, before its request runs.

use super::reply::{reply_seq, Reply};
use super::{CloseReason, End, Session};
use crate::error::{ClientError, ErrorKind};
use crate::state::Blocker;
use crate::Shared;
use holdfast_cluster::topology::NodeState;
use holdfast_sql::first_keyword;
use holdfast_wire::command::{COM_PING, COM_QUERY, COM_QUIT, COM_STMT_CLOSE};
use holdfast_wire::frame::HEADER_LEN;
use holdfast_wire::packets::ok_payload;
use std::sync::atomic::Ordering;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Routed {
    /// The request goes to the session's (possibly new) backend.
    Forward,
    /// holdfast answered it itself.
    Answered,
}

/// Opens the backend gate for `trigger` (a login, a statement, a moving session), waking a
/// paused instance and waiting up to its resume deadline. The one place wakes happen.
pub(super) async fn open_gate(shared: &Shared, trigger: &'static str) -> Result<(), ClientError> {
    shared.metrics.wake(trigger);
    shared.gate.open(trigger).await.map_err(|e| {
        tracing::warn!(trigger, error = %e, "the instance did not resume in time");
        ClientError::new(
            ErrorKind::InstanceUnavailable,
            match trigger {
                "login" => format!("holdfast: {}; try again later", e.client_message()),
                _ => format!(
                    "holdfast: {}; the statement was not run",
                    e.client_message()
                ),
            },
        )
    })
}

impl Session {
    pub(super) async fn route(&mut self, request: &[u8]) -> Result<Routed, End> {
        let reply_seq = reply_seq(request);
        let command = request.get(HEADER_LEN).copied();
        let reply = Reply::of_request(request);
        if command == Some(COM_PING) {
            // Pools' keep-alive pings are not use: they never keep an instance awake.
            self.info.pings.fetch_add(1, Ordering::Relaxed);
        }
        if !self.shared.gate.is_open() {
            // A keep-alive ping and a client leaving are answered here: neither is worth
            // waking the instance for.
            match command {
                Some(COM_PING) => {
                    let ok = ok_payload(0, 0, self.record.status, 0);
                    self.client
                        .write_packet(&ok, reply_seq)
                        .await
                        .map_err(End::Client)?;
                    return Ok(Routed::Answered);
                }
                Some(COM_QUIT) => return Err(End::Quit),
                _ => {}
            }
            self.shared.metrics.requests_held.inc();
            if let Err(error) = open_gate(&self.shared, "statement").await {
                if reply == Some(Reply::None) {
                    // No reply may carry the error.
                    return self.unanswerable(request);
                }
                self.send_error(reply_seq, &error).await?;
                return Ok(Routed::Answered);
            }
        }
        if self.shared.gate.epoch() != self.backend_epoch && !self.backend_dead {
            // The server stopped while this session was idle: its connection is gone even
            // if the socket has not said so yet.
            tracing::debug!(
                session = self.info.id,
                "backend connection predates a server stop"
            );
            self.mark_backend_dead();
        }
        if self.topology.has_changed().unwrap_or(false) && !self.backend_dead {
            self.topology.borrow_and_update();
            self.on_topology_change().await?;
        }
        if self.shared.switching_now.load(Ordering::SeqCst) && self.record.blocker().is_none() {
            self.park().await?;
        }
        // The connection lost while idle (or without a reply): a server that kept running
        // had it cut (someone's KILL, `KILL USER`...), and then the session ends as the
        // server ended it, instead of being logged in again.
        let lost_while_idle = self.lost_while_idle.take();
        let lost_from = self.backend_dead.then(|| {
            lost_while_idle
                .map(|l| *l)
                .unwrap_or_else(|| self.lost_conn())
        });
        if self.backend_dead {
            self.shared.metrics.requests_held.inc();
            // (Its journey says why: a connection cut by a switchover's fence or lost with
            // a failed primary is a change of primary to the operator.)
            let why = match self.primary() {
                Some(p) if p.name != self.backend_name => "primary_changed",
                _ => "backend_lost",
            };
            self.relocate(why).await?;
        } else if self.move_pending_since.is_some() && self.record.blocker().is_none() {
            self.shared.metrics.requests_held.inc();
            self.relocate("primary_changed").await?;
        }
        if let Some(lost) = lost_from {
            if self.cut_while_server_ran(&lost).await {
                return Err(self.killed_by_server(&lost));
            }
        }
        // The error that says the transaction is gone answers the next command that has a
        // reply; one without goes ahead.
        if self.transaction_lost && reply != Some(Reply::None) {
            self.transaction_lost = false;
            if is_rollback(request) {
                self.txn_log = None;
                return Ok(Routed::Forward);
            }
            // Replayed: the transaction is open again where it was, the request joins it.
            let replayable = self.can_replay();
            let replayed = replayable && Box::pin(self.replay_transaction()).await?;
            if !replayed {
                if !replayable {
                    self.shared.metrics.replay(self.not_replayable_outcome());
                }
                self.txn_log = None;
                self.execute_refused(request).await;
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::transaction_rolled_back())
                    .await?;
                return Ok(Routed::Answered);
            }
        }
        Ok(Routed::Forward)
    }

    /// The primary sessions should be on, if one is known.
    pub(super) fn primary(&self) -> Option<NodeState> {
        self.topology
            .borrow()
            .primary_node()
            .filter(|n| n.reachable || n.read_only.is_none())
            .cloned()
    }

    /// The topology changed: move now if the session is at a safe point, or once it is
    /// (within the cool-down).
    pub(super) async fn on_topology_change(&mut self) -> Result<(), End> {
        if !self.backend_dead && self.topology.borrow().is_deposed(&self.backend_name) {
            // Failed over away from: whatever this connection does from now on happens
            // on a node that is no longer the cluster (a frozen primary that wakes up
            // would commit there). It is abandoned; the next request moves the session
            // (its open transaction replayed on the new primary, or 1213).
            tracing::warn!(session = self.info.id, node = %self.backend_name, "the session's node was failed over away from; its connection is abandoned");
            self.mark_backend_dead();
            return Ok(());
        }
        let Some(primary) = self.primary() else {
            return Ok(());
        };
        if primary.name == self.backend_name {
            self.move_pending_since = None;
            return Ok(());
        }
        match self.record.blocker() {
            None => self.relocate("primary_changed").await,
            Some(blocker) => {
                if self.move_pending_since.is_none() {
                    tracing::info!(session = self.info.id, blocked_by = %blocker, "session must move but is not at a safe point; waiting for one");
                }
                self.move_pending_since.get_or_insert_with(Instant::now);
                Ok(())
            }
        }
    }

    /// A command without a reply that cannot reach a backend (the instance did not
    /// resume): a close is done here (the statement is forgotten; the backend connection
    /// it lived on is gone with the pause); long data cannot be kept, and no reply can say
    /// so, so the session is closed.
    fn unanswerable(&mut self, request: &[u8]) -> Result<Routed, End> {
        if request.get(HEADER_LEN) == Some(&COM_STMT_CLOSE) {
            self.forget_statement(request);
            return Ok(Routed::Answered);
        }
        let message = "closed: the instance did not resume to take COM_STMT_SEND_LONG_DATA, which has no reply to carry an error".to_string();
        Err(End::Closed {
            reason: CloseReason::StateLost(Blocker::PendingLongData),
            message,
        })
    }

    /// Holds the request while a planned switchover runs, then moves if the primary changed.
    async fn park(&mut self) -> Result<(), End> {
        self.shared.metrics.requests_held.inc();
        // The switchover fences the old primary next: read what only it knows first.
        self.capture_if_due(true).await;
        self.info.parked.store(true, Ordering::Release);
        self.info.busy.store(false, Ordering::Release);
        let hold = self.shared.config().proxy.hold_window();
        let timed_out = tokio::time::timeout(hold, self.switching.wait_for(|s| !*s))
            .await
            .is_err();
        self.info.busy.store(true, Ordering::SeqCst);
        self.info.parked.store(false, Ordering::Release);
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
}

fn is_rollback(request: &[u8]) -> bool {
    (request.get(HEADER_LEN) == Some(&COM_QUERY))
        .then(|| first_keyword(&request[HEADER_LEN + 1..]))
        .flatten()
        .is_some_and(|k| k.eq_ignore_ascii_case(b"ROLLBACK"))
}
