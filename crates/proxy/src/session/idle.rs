//! Between requests: the session reads the client's next request while watching what can
//! happen to an idle session (the topology changes, its backend goes away, its cool-down
//! ends). The watch arms only after a short silence, so a busy session pays no extra
//! syscall or lock per command for it.

use super::{CloseReason, End, Session};
use crate::conn::{ConnError, PacketConn};
use crate::error::ErrorKind;
use crate::state::Blocker;
use bytes::BytesMut;
use holdfast_cluster::topology::Topology;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::time::Sleep;

/// How long a client must be silent before its session watches for idle-time events.
pub(super) const IDLE_PROBE: Duration = Duration::from_millis(20);

enum IdleEvent {
    /// The client has been silent for [`IDLE_PROBE`]: the session is idle from now on.
    Quiet,
    /// The topology changed (false: the monitor is gone).
    Topology(bool),
    /// A planned switchover starts (or ends).
    Switching,
    /// The backend connection closed or sent something (`Some`: it failed with that error,
    /// a reset for one).
    BackendGone(Option<std::io::Error>),
    /// The earlier of the cool-down's end and the idle timeout.
    Deadline,
}

impl Session {
    /// The client's next request (the whole logical packet, headers included), dealing
    /// with idle-time events while waiting for it.
    pub(super) async fn next_request(&mut self) -> Result<BytesMut, End> {
        let max = self.shared.config().proxy.max_packet_size;
        let mut quiet = false;
        // One timer for the session's life, moved forward per request rather than a new
        // one registered and cancelled each time.
        self.idle_timer
            .as_mut()
            .reset(tokio::time::Instant::now() + IDLE_PROBE);
        let idle_timeout = self.shared.config().proxy.client_idle_timeout_secs;
        let idle_deadline =
            (idle_timeout > 0).then(|| Instant::now() + Duration::from_secs(idle_timeout));
        if let Some(end) = self.hand_over_if_asked(false).await {
            return Err(end);
        }
        loop {
            let cooldown_end = self
                .move_pending_since
                .map(|t| t + self.shared.config().proxy.cooldown());
            let read = tokio::select! {
                biased;
                r = self.client.buffer_packet(max) => r,
                Ok(()) = self.hand_over_to.changed() => {
                    if let Some(end) = self.hand_over_if_asked(true).await {
                        return Err(end);
                    }
                    continue;
                }
                event = idle_watch(
                    &mut self.backend.conn,
                    &mut self.topology,
                    &mut self.switching,
                    self.backend_dead,
                    cooldown_end.into_iter().chain(idle_deadline).min(),
                    self.idle_timer.as_mut(),
                    quiet,
                ) => {
                    match event {
                        IdleEvent::Quiet => {
                            quiet = true;
                            self.capture_if_due(false).await;
                            self.release_buffers();
                        }
                        IdleEvent::Topology(false) => {
                            return Err(End::Protocol("topology monitor stopped".into()));
                        }
                        IdleEvent::Topology(true) => self.on_topology_change().await?,
                        IdleEvent::Switching => {
                            // The session moves next, its diagnostics lost anyway: what
                            // only the old primary knows is read before it is fenced (if
                            // the switchover fails, the client could tell; rare).
                            if *self.switching.borrow() {
                                self.capture_if_due(true).await;
                            }
                        }
                        IdleEvent::BackendGone(_) if self.killed_on_purpose() => {
                            return Err(self.end_killed_while_idle().await);
                        }
                        IdleEvent::BackendGone(error) => {
                            tracing::info!(session = self.info.id, node = %self.backend_name, error = ?error, "backend connection lost while idle");
                            // Whose loss it was is told now, while a cut may still be in
                            // place: the move comes with the next request.
                            let lost = match error {
                                Some(e) => self.lost_conn_after(&ConnError::Io(e), "idle").await,
                                None => {
                                    self.shared.metrics.backend_lost("idle");
                                    self.lost_conn()
                                }
                            };
                            self.mark_backend_dead();
                            self.lost_while_idle = Some(lost);
                        }
                        IdleEvent::Deadline if idle_deadline.is_some_and(|d| Instant::now() >= d) => {
                            return Err(End::Closed {
                                reason: CloseReason::IdleTimeout,
                                message: format!(
                                    "closed: the client sent nothing for client_idle_timeout_secs = {idle_timeout}"
                                ),
                            });
                        }
                        IdleEvent::Deadline => return Err(self.cooldown_expired()),
                    }
                    continue;
                }
            };
            let wire_len = match read {
                Ok(n) => n,
                Err(ConnError::TooLarge { len, max }) => {
                    let msg = format!("Got a packet bigger than 'max_allowed_packet' bytes ({len} > {max}); holdfast closes the connection");
                    let _ = self
                        .send_error_kind(1, ErrorKind::PacketTooLarge, msg.clone())
                        .await;
                    return Err(End::Protocol(msg));
                }
                Err(e) => return Err(End::Client(e)),
            };
            self.shared
                .metrics
                .requests
                .bytes_from_client(wire_len as u64);
            return Ok(self.client.rbuf.split_to(wire_len));
        }
    }

    /// An idle session keeps no read buffers: they are most of its memory, and the next
    /// read allocates them again.
    fn release_buffers(&mut self) {
        for buf in [&mut self.client.rbuf, &mut self.backend.conn.rbuf] {
            if buf.is_empty() {
                *buf = BytesMut::new();
            }
        }
        self.scratch = Vec::new();
    }

    fn cooldown_expired(&mut self) -> End {
        let blocker = self.record.blocker().unwrap_or(Blocker::Untracked);
        End::Closed {
            reason: CloseReason::Cooldown(blocker),
            message: format!(
                "closed: its node is no longer the primary and the session did not reach a safe point within the cool-down of {} ms ({blocker})",
                self.shared.config().proxy.cooldown_ms
            ),
        }
    }
}

/// What can happen to an idle session. Until the session is `quiet`, only the
/// [`IDLE_PROBE`] of client silence that makes it so.
async fn idle_watch(
    conn: &mut PacketConn,
    topology: &mut watch::Receiver<Arc<Topology>>,
    switching: &mut watch::Receiver<bool>,
    backend_dead: bool,
    deadline: Option<Instant>,
    probe: Pin<&mut Sleep>,
    quiet: bool,
) -> IdleEvent {
    if !quiet {
        probe.await;
        return IdleEvent::Quiet;
    }
    tokio::select! {
        r = topology.changed(), if !backend_dead => IdleEvent::Topology(r.is_ok()),
        Ok(()) = switching.changed(), if !backend_dead => IdleEvent::Switching,
        error = backend_gone(conn), if !backend_dead => IdleEvent::BackendGone(error),
        _ = sleep_until_opt(deadline), if deadline.is_some() => IdleEvent::Deadline,
        else => std::future::pending().await,
    }
}

/// Resolves when the backend connection of an idle session closes or sends something on its
/// own (servers send an ERR before they close a connection on shutdown or KILL).
///
/// A read of one byte into a buffer of its own: cancel-safe (a read that completes keeps
/// its byte, in `rbuf`, where the next packet read would find it), works on any stream,
/// and needs no read buffer while the session idles (a `read_buf` into the released
/// `rbuf` would allocate one).
async fn backend_gone(conn: &mut PacketConn) -> Option<std::io::Error> {
    let mut byte = [0u8; 1];
    match conn.stream.read(&mut byte).await {
        Ok(n) => {
            conn.rbuf.extend_from_slice(&byte[..n]);
            None
        }
        Err(e) => Some(e),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
