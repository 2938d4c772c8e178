//! An answer stuck in the network. After a cut between holdfast and a node heals, the
//! server's answer to a request sent before it may still be waiting on TCP's next
//! retransmission, which doubles with every try dropped by the cut: a minute and more.
//! holdfast cannot hurry TCP; what it can tell is that the server is done with the
//! command (its thread idle for a while) while the answer has not arrived, after the
//! monitor had trouble reaching the node. Then the request is treated as lost with
//! its connection, and the session recovers as from any lost backend (the old thread is
//! killed, the request retried, replayed or settled by its commit marker).
//!
//! The watch starts with the others ([`super::relay::WATCH_CLIENT_AFTER`]) and costs
//! nothing more until the monitor has had trouble reaching the node since the request
//! went out (`MonitorLinks::trouble_after`): only then is the server asked, once a
//! second, on a connection of the monitor's account.

use crate::registry::SessionInfo;
use crate::Shared;
use holdfast_cluster::control::monitor_connect;
use std::time::{Duration, Instant};

/// How long a request waits before its answer can count as stuck, and between two looks
/// at the server.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long the server's thread must have been idle, done with the command, for its
/// answer to count as lost in the network rather than on its way.
const DONE_FOR_MS: u64 = 1_000;

/// The request whose answer is awaited on the session's node: its server thread, when it
/// was sent, and when its connection was opened (a request sent again after a move).
#[derive(Clone, Copy)]
pub(super) struct Awaited {
    pub thread: u32,
    pub sent: Instant,
    pub connected: Instant,
}

/// Resolves when the answer to `awaited` on `node` is stuck in the network (see the
/// module's comment); never otherwise. While a split session reads on a replica
/// (`info.replica_read`), the read's node and thread are watched instead.
pub(super) async fn answer_stuck(
    shared: &Shared,
    info: &SessionInfo,
    node: &str,
    awaited: Awaited,
) {
    let replica_read = info.replica_read.load_full();
    // Trouble counts from the request on, or from its connection's opening when that came
    // later (a request sent again after a move); a replica's connection is older than the
    // read (readers are kept).
    let (node, thread, since) = match replica_read.as_deref() {
        Some(read) => (read.node.as_str(), read.thread, awaited.sent),
        None => (node, awaited.thread, awaited.sent.max(awaited.connected)),
    };
    let mut links = shared.monitor_links.clone();
    loop {
        let troubled = links.borrow_and_update().trouble_after(node, since) == Some(true);
        if troubled && since.elapsed() >= LOOK_EVERY {
            // (Boxed: a request that never gets here does not carry a login's state.)
            if Box::pin(server_done(shared, node, thread)).await {
                tracing::warn!(node = %node, thread, "the server is done with the request, but its answer has not arrived, and the monitor had trouble reaching the node meanwhile: lost in the network");
                return;
            }
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        }
        if troubled {
            tokio::time::sleep(LOOK_EVERY.saturating_sub(since.elapsed())).await;
            continue;
        }
        if links.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Whether the server has been done with the request for [`DONE_FOR_MS`]: its thread idle
/// that long. False when that cannot be told: the thread not seen (gone, or the monitor
/// account lacks PROCESS and sees only its own threads), the node not reached.
async fn server_done(shared: &Shared, node: &str, thread: u32) -> bool {
    let Some(address) = shared.node_address(node) else {
        return false;
    };
    let cfg = shared.config_snapshot();
    let mut conn = match monitor_connect(&cfg, &address).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(node = %node, error = %e, "cannot ask the server whether a request is done");
            return false;
        }
    };
    let query = format!(
        "SELECT COMMAND, TIME_MS FROM information_schema.PROCESSLIST WHERE ID = {}",
        thread
    );
    match conn.query(&query).await {
        Ok(r) => match r.rows.first() {
            None => false,
            Some(row) => {
                let command = row.first().cloned().flatten();
                let idle_ms = row
                    .get(1)
                    .cloned()
                    .flatten()
                    .and_then(|t| t.split('.').next().and_then(|ms| ms.parse::<u64>().ok()));
                command.as_deref() == Some("Sleep") && idle_ms.is_some_and(|ms| ms >= DONE_FOR_MS)
            }
        },
        Err(e) => {
            tracing::debug!(node = %node, error = %e, "cannot ask the server whether a request is done");
            false
        }
    }
}
