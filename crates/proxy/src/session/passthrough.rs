//! Pass-through sessions: after holdfast has authenticated the client and logged in to the
//! backend, bytes are relayed both ways without parsing (the cheapest path). Such a session
//! cannot move: it ends with its backend connection, and it keeps a serverless instance
//! from pausing (the registry lists it as a pause blocker).

use super::LoggedIn;
use crate::conn::PacketConn;
use crate::registry::SessionInfo;
use crate::state::Blocker;
use crate::Shared;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

pub(super) async fn run(
    shared: Arc<Shared>,
    mut client: PacketConn,
    logged_in: LoggedIn,
    peer: SocketAddr,
    id: u32,
) {
    let thread = logged_in.backend.greeting.connection_id;
    let mut backend = logged_in.backend.into_conn();
    let info = Arc::new(SessionInfo::new(id, peer));
    info.set_user(&logged_in.user);
    info.set_backend(&logged_in.backend_name, thread);
    info.set_blocker(Some(Blocker::PassThrough));
    shared.sessions.insert(info.clone());
    shared.metrics.sessions_active.inc();
    let result = async {
        // Whatever either side sent ahead is already buffered: deliver it first.
        if !client.rbuf.is_empty() {
            backend.stream.write_all(&client.rbuf).await?;
            backend.stream.flush().await?;
            client.rbuf.clear();
        }
        if !backend.rbuf.is_empty() {
            client.stream.write_all(&backend.rbuf).await?;
            client.stream.flush().await?;
            backend.rbuf.clear();
        }
        tokio::io::copy_bidirectional(&mut client.stream, &mut backend.stream).await
    }
    .await;
    match result {
        Ok((up, down)) => {
            shared.metrics.requests.bytes_from_client(up);
            shared.metrics.requests.bytes_to_client(down);
            tracing::debug!(session = id, up, down, "pass-through session ended");
        }
        Err(e) => tracing::debug!(session = id, error = %e, "pass-through session ended"),
    }
    info.busy.store(false, Ordering::SeqCst);
    shared.sessions.remove(id);
    shared.metrics.sessions_active.dec();
}
