//! `KILL` through holdfast. A client knows two ids for a connection: holdfast's, from the
//! greeting (`mysql_thread_id()`, what the `mariadb` CLI's Ctrl-C kills), and the server's,
//! from `CONNECTION_ID()`. holdfast's ids start at [`SESSION_ID_BASE`], above any thread id
//! a server hands out, so a `KILL` of one of them is rewritten to the backend thread of that
//! session (on the killer's node: a session elsewhere is unknown there, 1094 as the server
//! would say), and a `KILL` of a server thread id passes as it is.
//!
//! A `KILL QUERY` of a split session whose statement runs on a replica is run on that
//! replica instead, on a connection of the killer's account (the server checks the
//! killer's right to it).
//!
//! A `KILL [CONNECTION]` that ends a holdfast session's backend connection also ends that
//! session's client connection, as the server would end a direct one: the victim is marked
//! before the `KILL` runs, and holdfast does not move it to a new backend connection when
//! it sees its own go (see `Session::killed_on_purpose`). `KILL QUERY` ends only the
//! statement, as it does on the server. A `KILL` run directly on the server, not through
//! holdfast, cannot be told from a connection lost another way: the session goes on
//! (its statement is not run again).

use super::{CloseReason, End, Session};
use crate::error::code::ER_CONNECTION_KILLED;
use crate::error::{ClientError, ErrorKind};
use crate::registry::{SessionInfo, SESSION_ID_BASE};
use bytes::BytesMut;
use holdfast_sql::{parse_kill, Classification as C};
use holdfast_wire::command::{COM_PROCESS_KILL, COM_QUERY};
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// What a `KILL` request becomes.
pub(super) enum KillPlan {
    /// Forwarded (rewritten), marking the session whose connection it ends, if any.
    Forward(Option<KillMark>),
    /// A `KILL QUERY` of a split session's read running on a replica: run there by holdfast
    /// on a connection of the killer's account, the killer answered with OK.
    OnReplica(Arc<crate::registry::ReplicaRead>),
}

/// A session marked as the victim of a `KILL` in flight: unmarked again if the `KILL`
/// fails.
pub(super) struct KillMark {
    victim: Arc<SessionInfo>,
    thread: u32,
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
                match parse_kill(sql, self.record.sql_mode.unwrap_or_default()) {
                    Some(k) if k.thread => (k.id, !k.query, Some(k.id_span)),
                    // `KILL QUERY ID n` names a query, not a connection.
                    Some(_) => return Ok(KillPlan::Forward(None)),
                    // `KILL CONNECTION_ID()`, a variable...: only this session's own
                    // connection can be named so that holdfast could tell; if it is, the
                    // answer is the server's 1927 and the session ends with it.
                    None => return Ok(KillPlan::Forward(Some(self.mark(self.info.clone())))),
                }
            }
            _ => return Ok(KillPlan::Forward(None)),
        };
        let own_node = self.backend_name.as_str();
        let victim = if id >= u64::from(SESSION_ID_BASE) {
            let unknown =
                || ClientError::new(ErrorKind::UnknownThread, format!("Unknown thread id: {id}"));
            let victim = u32::try_from(id)
                .ok()
                .and_then(|id| self.shared.sessions.get(id))
                .filter(|v| v.is_on(own_node))
                .ok_or_else(unknown)?;
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
        let _ = conn
            .conn
            .try_write_now(&[1, 0, 0, 0, holdfast_wire::command::COM_QUIT]);
        killed.map_err(|e| failed(&e))?;
        tracing::info!(session = self.info.id, node = %read.node, thread = read.thread, "KILL QUERY of a read on a replica");
        Ok(())
    }

    fn mark(&self, victim: Arc<SessionInfo>) -> KillMark {
        let thread = victim.backend_thread.load(Ordering::Acquire);
        victim.kill_requested.store(thread, Ordering::Release);
        KillMark { victim, thread }
    }

    /// After the `KILL` ran, the mark stands only where a connection was ended: another
    /// session's after a `KILL` that succeeded, the killer's own when the server answered
    /// 1927 (how it answers a `KILL` of the killer's connection). A failed `KILL` (no
    /// privilege, ...), or one that named someone else by a value holdfast could not read
    /// (`KILL @id`: the killer was marked in case it named itself), leaves it unmarked.
    pub(super) fn settle_kill(&self, mark: KillMark, error: Option<u16>) {
        let ended = match error {
            Some(code) => code == ER_CONNECTION_KILLED,
            None => !Arc::ptr_eq(&mark.victim, &self.info),
        };
        if !ended {
            let _ = mark.victim.kill_requested.compare_exchange(
                mark.thread,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
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
    /// what the server sent before it closed (MariaDB sends ERR 1927 to a killed idle
    /// connection, read with the client's next command), then the connection closes.
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
