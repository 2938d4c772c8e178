//! Commit markers (`[ha] commit_markers`): the outcome of a COMMIT whose answer was lost
//! with its backend. Inside a transaction that wrote, the COMMIT goes out behind an upsert
//! of the session's row in `holdfast.commit_marker` (its key, the commit's sequence
//! number), in one write: no extra round trip. The row commits with the transaction and
//! replicates with it. When the answer is lost, the session moves and reads its row on the
//! node that took over: the sequence number there says the transaction committed (the
//! client gets the COMMIT's OK) or did not (it is replayed and committed again, or the
//! client learns it was rolled back: 1213, now a fact rather than a guess).

use super::{End, Session};
use crate::conn::ConnError;
use crate::error::ClientError;
use bytes::BytesMut;
use holdfast_sql::{first_keyword, Classification as C};
use holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
use holdfast_wire::command::COM_QUERY;
use holdfast_wire::frame;
use holdfast_wire::packets::ok_payload;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a session that lost a COMMIT's answer on a node that kept running waits for
/// the server to finish with the old connection (its COMMIT may still be running there)
/// before it reads the marker.
const OLD_CONNECTION_GONE_WITHIN: Duration = Duration::from_secs(10);

/// A session's commit markers.
#[derive(Debug)]
pub(super) struct Markers {
    /// The session's row (random: unique across sessions and holdfast processes).
    key: u64,
    /// The sequence number of the session's last marked COMMIT.
    seq: u64,
    /// A marked COMMIT is in flight: its sequence number.
    in_flight: Option<u64>,
    /// The open transaction changed data (a COMMIT without writes needs no marker).
    pub(super) txn_writes: bool,
    /// A marker was refused (no table, no privilege): this session sends no more.
    refused: bool,
}

impl Default for Markers {
    fn default() -> Self {
        Markers {
            key: rand::random(),
            seq: 0,
            in_flight: None,
            txn_writes: false,
            refused: false,
        }
    }
}

/// Whether a statement changes data: not a plain read, nor one that only opens or ends a
/// transaction, sets a savepoint or sets variables.
/// Several statements in one text count as a write when any is not a plain read.
pub(super) fn writes_data(flags: C) -> bool {
    const NOT_DATA: C = C::BEGIN_TXN
        .union(C::END_TXN)
        .union(C::SAVEPOINT)
        .union(C::SET_SESSION_VAR)
        .union(C::SET_USER_VAR)
        .union(C::AUTOCOMMIT)
        .union(C::SET_TRANSACTION);
    flags.has(C::WRITE) && (flags.has(C::MULTI) || !flags.intersects(NOT_DATA))
}

/// A plain `COMMIT [WORK]` (not `AND CHAIN`: the chained transaction would have to be
/// opened again too; not several statements in one).
fn plain_commit(sql: &[u8], flags: C) -> bool {
    flags.has(C::END_TXN)
        && !flags.intersects(C::BEGIN_TXN.union(C::MULTI))
        && first_keyword(sql).is_some_and(|k| k.eq_ignore_ascii_case(b"COMMIT"))
}

impl Session {
    /// Before a request runs: notes whether the transaction changed data.
    pub(super) fn note_writes(&mut self, query: Option<C>, request: &[u8]) {
        let writes = match query {
            Some(flags) => writes_data(flags),
            None => super::forward::statement_writes(&self.statements, request),
        };
        self.markers.txn_writes |= writes;
    }

    /// Whether this COMMIT goes out behind a marker.
    pub(super) fn marks_commit(&self, sql: &[u8], flags: C, in_transaction: bool) -> bool {
        in_transaction
            && self.markers.txn_writes
            && !self.markers.refused
            && self.shared.commit_markers_ready.load(Ordering::Acquire)
            && plain_commit(sql, flags)
    }

    /// After a request: a finished transaction's writes are forgotten.
    pub(super) fn markers_after(&mut self) {
        self.markers.in_flight = None;
        if !self.record.in_transaction() {
            self.markers.txn_writes = false;
        }
    }

    /// The marked COMMIT in flight when the backend was lost, if there was one.
    pub(super) fn take_marked_commit(&mut self) -> Option<u64> {
        self.markers.in_flight.take()
    }

    /// Sends the marker and the COMMIT in one write, drops the marker's answer and relays
    /// the COMMIT's.
    pub(super) async fn commit_with_marker(&mut self, request: &[u8]) -> Result<(), End> {
        self.shared.metrics.requests.command(COM_QUERY);
        self.response_started = false;
        self.last_error = None;
        let seq = self.markers.seq + 1;
        let upsert = format!(
            "\u{3}INSERT INTO {} (session, seq) VALUES ({}, {seq}) ON DUPLICATE KEY UPDATE seq = {seq}",
            crate::ha::markers::TABLE,
            self.markers.key
        );
        let mut out = BytesMut::with_capacity(upsert.len() + request.len() + 8);
        out.extend_from_slice(&frame::packet(upsert.as_bytes(), 0));
        out.extend_from_slice(request);
        self.markers.seq = seq;
        self.markers.in_flight = Some(seq);
        self.backend
            .conn
            .write_raw(&out)
            .await
            .map_err(|error| End::BackendLost {
                started: false,
                error,
            })?;
        let max = self.shared.config.proxy.max_packet_size;
        let answer =
            self.backend
                .conn
                .read_packet(max)
                .await
                .map_err(|error| End::BackendLost {
                    started: false,
                    error,
                })?;
        match answer.payload.first() {
            Some(0) => {}
            Some(0xff) => {
                // The COMMIT goes on without a marker: its outcome cannot be read back.
                self.markers.in_flight = None;
                self.markers.refused = true;
                let e = holdfast_wire::packets::ErrPacket::parse(&answer.payload);
                let (code, message) = e.map_or((0, String::new()), |e| {
                    (e.code, String::from_utf8_lossy(e.message).into_owned())
                });
                tracing::warn!(
                    session = self.info.id,
                    code,
                    message,
                    "commit marker refused; this session's COMMITs go on without one"
                );
            }
            _ => {
                return Err(End::Protocol(
                    "the commit marker's answer was neither OK nor ERR".into(),
                ))
            }
        }
        self.relay(super::forward::Reply::ResultSets).await
    }

    /// The backend was lost with a marked COMMIT (`seq`) in flight: move, read the marker
    /// on the new backend, and answer the client with what became of its transaction.
    pub(super) async fn recover_lost_commit(
        &mut self,
        error: ConnError,
        request: BytesMut,
        reply_seq: u8,
        seq: u64,
    ) -> Result<(), End> {
        tracing::info!(session = self.info.id, node = %self.backend_name, %error, "backend lost with a COMMIT in flight; reading its commit marker");
        let node = self.backend_name.clone();
        let age = self.backend_since.elapsed();
        let old_thread = self.backend.greeting.connection_id;
        // Restored as the transaction left it: right if it committed; a replay sets its
        // own start below.
        let log = self.txn_log.take();
        self.mark_backend_dead();
        self.transaction_lost = false;
        self.relocate("backend_lost").await?;
        // Someone's KILL stopped it (or the network cut it while its server ran): what
        // did not commit is not committed again.
        let killed = self.backend_killed || self.cut_while_server_ran(&node, age).await;
        self.backend_killed = false;
        let outcome = self.commit_outcome(&node, age, old_thread, seq).await;
        self.markers.txn_writes = false;
        match outcome {
            Some(true) => {
                tracing::info!(
                    session = self.info.id,
                    "the lost COMMIT had committed; answering it"
                );
                self.shared.metrics.commit_outcome("committed");
                self.shared.metrics.requests_retried.inc();
                self.record.status &= !SERVER_STATUS_IN_TRANS;
                let ok = ok_payload(0, 0, self.record.status, 0);
                self.client
                    .write_packet(&ok, reply_seq)
                    .await
                    .map_err(End::Client)
            }
            Some(false) => {
                self.txn_log = log;
                if !killed && self.can_replay() && self.start_replay_from_marker().await? {
                    tracing::info!(
                        session = self.info.id,
                        "the lost COMMIT had not committed; transaction replayed, committing again"
                    );
                    self.shared.metrics.commit_outcome("replayed");
                    // The COMMIT again, with a new marker, through the whole path.
                    return self.forward_request(request).await;
                }
                self.txn_log = None;
                self.shared.metrics.commit_outcome("rolled_back");
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::transaction_rolled_back())
                    .await
            }
            None => {
                self.txn_log = None;
                self.shared.metrics.commit_outcome("unknown");
                self.shared.metrics.requests_failed_on_backend_loss.inc();
                self.send_error(reply_seq, &ClientError::commit_outcome_unknown())
                    .await
            }
        }
    }

    /// Replays the transaction whose COMMIT did not commit, from the `LAST_INSERT_ID()` it
    /// started with (the move restored the one it ended with).
    async fn start_replay_from_marker(&mut self) -> Result<bool, End> {
        let start = self.txn_log.as_ref().map_or(0, |l| l.start_last_insert_id);
        if start != self.record.last_insert_id {
            let sql = format!("SELECT LAST_INSERT_ID({start})");
            if crate::restore::execute(&mut self.backend, sql.as_bytes())
                .await
                .is_err()
            {
                return Ok(false);
            }
            self.record.last_insert_id = start;
        }
        self.replay_transaction().await
    }

    /// Whether the transaction behind marker `seq` committed, read on the session's new
    /// backend (`None`: it cannot be told). On the node the COMMIT was sent to, still
    /// running, the old connection must be gone first: its COMMIT may still be running.
    async fn commit_outcome(
        &mut self,
        node: &str,
        age: Duration,
        old_thread: u32,
        seq: u64,
    ) -> Option<bool> {
        if self.backend_name == node && self.server_ran_throughout(age).await != Some(false) {
            let gone = format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {old_thread}"
            );
            let deadline = Instant::now() + OLD_CONNECTION_GONE_WITHIN;
            loop {
                let left = self.backend.query(&gone).await.ok()?;
                if first_value(&left).as_deref() == Some("0") {
                    break;
                }
                if Instant::now() >= deadline {
                    tracing::warn!(
                        session = self.info.id,
                        old_thread,
                        "the old connection is still on the server; COMMIT outcome unknown"
                    );
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let read = format!(
            "SELECT seq FROM {} WHERE session = {}",
            crate::ha::markers::TABLE,
            self.markers.key
        );
        match self.backend.query(&read).await {
            Ok(r) => {
                let found = first_value(&r).and_then(|v| v.parse::<u64>().ok());
                Some(found.is_some_and(|s| s >= seq))
            }
            Err(e) => {
                tracing::warn!(session = self.info.id, error = %e, "reading the commit marker failed; COMMIT outcome unknown");
                None
            }
        }
    }
}

fn first_value(r: &holdfast_client::TextResult) -> Option<String> {
    r.rows
        .first()
        .and_then(|row| row.first())
        .cloned()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_sql::classify;

    #[test]
    fn only_data_changes_need_a_marker() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a = 1",
            "DELETE FROM t",
            "SELECT * FROM t FOR UPDATE",
        ] {
            assert!(writes_data(classify(sql.as_bytes())), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "BEGIN",
            "COMMIT",
            "SAVEPOINT a",
            "SET @a = 1",
            "SET time_zone = '+00:00'",
        ] {
            assert!(!writes_data(classify(sql.as_bytes())), "{sql}");
        }
    }

    #[test]
    fn only_a_plain_commit_is_marked() {
        let marked = |sql: &str| plain_commit(sql.as_bytes(), classify(sql.as_bytes()));
        assert!(marked("COMMIT"));
        assert!(marked("commit work"));
        assert!(!marked("COMMIT AND CHAIN"));
        assert!(!marked("ROLLBACK"));
        assert!(!marked("INSERT INTO t VALUES (1); COMMIT"));
    }
}
