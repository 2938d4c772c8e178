//! A pass-through session relayed in the kernel: both connections plain TCP, the client's
//! socket and its backend socket spliced in a BPF sockmap ([`holdfast_sockmap`]). The
//! session's task only waits for either side to end (or for bytes the kernel left to it:
//! those that arrived before the splice), keeps the session registered and counted, and
//! hands the pair to the process that replaces this one with the map itself (the bytes
//! keep flowing in the kernel meanwhile).

use super::{CarriedRelay, Relay, RETRY};
use crate::conn::PacketConn;
use crate::upgrade::{HandedRelay, SessionChannel};
use crate::Shared;
use holdfast_sockmap::{bytes_received, KernelRelay};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Two sockets relayed to each other by the kernel.
pub(crate) struct Spliced {
    kernel: Arc<KernelRelay>,
    pair: holdfast_sockmap::Spliced,
    client: TcpStream,
    backend: TcpStream,
    /// Each socket's `tcpi_bytes_received` when the pair was spliced.
    received_before: (u64, u64),
}

/// Splices the two plain TCP connections in `kernel`; `None` (the connections left as they
/// were) when either is not plain TCP or the kernel refused them.
pub(super) fn splice(
    kernel: &Arc<KernelRelay>,
    client: &mut PacketConn,
    backend: &mut PacketConn,
) -> Option<Spliced> {
    if !client.is_tcp() || !backend.is_tcp() || !client.rbuf.is_empty() || !backend.rbuf.is_empty()
    {
        return None;
    }
    let (c, _) = client.take_tcp()?;
    let Some((b, _)) = backend.take_tcp() else {
        put_back(client, c);
        return None;
    };
    let received_before = (
        bytes_received(c.as_fd()).unwrap_or(0),
        bytes_received(b.as_fd()).unwrap_or(0),
    );
    let pair = match kernel.splice(c.as_fd(), b.as_fd()) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(error = %e, "pass-through session relayed in user space");
            put_back(client, c);
            put_back(backend, b);
            return None;
        }
    };
    match (tokio_stream(c), tokio_stream(b)) {
        (Ok(client), Ok(backend)) => Some(Spliced {
            kernel: kernel.clone(),
            pair,
            client,
            backend,
            received_before,
        }),
        _ => {
            // (Sockets the runtime cannot take: the session ends.)
            kernel.unsplice(pair);
            None
        }
    }
}

/// A pair handed over by the process this one replaced: already in `kernel`'s map.
pub(super) fn resume(
    kernel: Arc<KernelRelay>,
    client: std::net::TcpStream,
    backend: std::net::TcpStream,
) -> io::Result<Spliced> {
    let pair = kernel
        .pair_of(client.as_fd(), backend.as_fd())
        .map_err(io::Error::other)?;
    Ok(Spliced {
        kernel,
        pair,
        received_before: (
            bytes_received(client.as_fd()).unwrap_or(0),
            bytes_received(backend.as_fd()).unwrap_or(0),
        ),
        client: tokio_stream(client)?,
        backend: tokio_stream(backend)?,
    })
}

fn tokio_stream(s: std::net::TcpStream) -> io::Result<TcpStream> {
    s.set_nonblocking(true)?;
    TcpStream::from_std(s)
}

fn put_back(conn: &mut PacketConn, s: std::net::TcpStream) {
    match tokio_stream(s) {
        Ok(tcp) => drop(conn.replace_stream(Box::new(tcp))),
        Err(e) => tracing::error!(error = %e, "a socket given back could not be used"),
    }
}

impl Spliced {
    /// Waits until a side ends (the bytes each way), or the session went to the process
    /// that replaces this one (`None`).
    pub(super) async fn run(
        mut self,
        shared: &Shared,
        relay: Relay,
    ) -> io::Result<Option<(u64, u64)>> {
        shared.metrics.sessions_kernel_relayed.inc();
        let _counted = Counted(shared);
        let mut sink = shared.upgrader.session_sink();
        let mut relay = Some(relay);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let channel = sink
                .borrow_and_update()
                .clone()
                .filter(|c| !c.is_broken() && c.takes_kernel_relays());
            if let Some((channel, r)) = channel.and_then(|c| Some((c, relay.take()?))) {
                match self.hand_over(r, &channel).await {
                    Ok(()) => {
                        shared.metrics.sessions_handed_over.inc();
                        return Ok(None);
                    }
                    Err((back, r)) => {
                        self = back;
                        relay = Some(r);
                        tokio::select! {
                            ended = self.wait() => if ended { break },
                            _ = tokio::time::sleep(RETRY) => {}
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                ended = self.forward_leftovers(&mut buf) => if ended { break },
                _ = sink.changed() => {}
            }
        }
        self.kernel.unsplice(self.pair);
        let up = bytes_received(self.client.as_fd()).unwrap_or(0);
        let down = bytes_received(self.backend.as_fd()).unwrap_or(0);
        // (Both sockets close as the pair is dropped.)
        Ok(Some((
            up.saturating_sub(self.received_before.0),
            down.saturating_sub(self.received_before.1),
        )))
    }

    /// Whether a side ended, polled for a moment (bytes left to user space forwarded).
    async fn wait(&mut self) -> bool {
        let mut buf = vec![0u8; 16 * 1024];
        self.forward_leftovers(&mut buf).await
    }

    /// Waits until either socket has something for user space: the end (true), or bytes
    /// the kernel did not redirect (those that arrived before the splice), written to the
    /// other side here (false).
    async fn forward_leftovers(&mut self, buf: &mut [u8]) -> bool {
        tokio::select! {
            r = self.client.readable() => r.is_err() || !forward(&self.client, &self.backend, buf).await,
            r = self.backend.readable() => r.is_err() || !forward(&self.backend, &self.client, buf).await,
        }
    }

    /// Sends the pair, with the map, to the new process; gives it back when it did not go.
    async fn hand_over(self, relay: Relay, channel: &SessionChannel) -> Result<(), (Self, Relay)> {
        let Spliced {
            kernel,
            pair,
            client,
            backend,
            received_before,
        } = self;
        let back = |client: std::net::TcpStream, backend: std::net::TcpStream| {
            Ok::<_, io::Error>(Spliced {
                kernel: kernel.clone(),
                pair,
                client: tokio_stream(client)?,
                backend: tokio_stream(backend)?,
                received_before,
            })
        };
        let (client, backend) = match (client.into_std(), backend.into_std()) {
            (Ok(c), Ok(b)) => (c, b),
            // (Not expected: a tokio stream always gives its socket back.)
            _ => return Ok(()),
        };
        let map: Option<OwnedFd> = kernel.map_fd().try_clone_to_owned().ok();
        let Some(map) = map else {
            return match back(client, backend) {
                Ok(s) => Err((s, relay)),
                Err(_) => Ok(()),
            };
        };
        let handed = HandedRelay {
            carried: CarriedRelay::in_kernel(relay),
            client,
            backend,
            kernel_map: Some(map),
        };
        let id = handed.carried.relay.id;
        match channel.send_relay(handed).await {
            Ok(()) => {
                tracing::debug!(
                    session = id,
                    "upgrade: pass-through session relayed in the kernel handed over"
                );
                Ok(())
            }
            Err(returned) => {
                tracing::warn!(
                    session = id,
                    "upgrade: the pass-through session stays in this process"
                );
                let relay = returned.carried.relay;
                match back(returned.client, returned.backend) {
                    Ok(s) => Err((s, relay)),
                    // (Its sockets could not be used again: the session ends.)
                    Err(_) => Ok(()),
                }
            }
        }
    }
}

/// Forwards what `from` has for user space to `to`; false when `from` ended (or failed).
async fn forward(from: &TcpStream, to: &TcpStream, buf: &mut [u8]) -> bool {
    loop {
        match from.try_read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                if write_all(to, &buf[..n]).await.is_err() {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Counts the session as relayed in the kernel until dropped.
struct Counted<'a>(&'a Shared);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.metrics.sessions_kernel_relayed.dec();
    }
}
