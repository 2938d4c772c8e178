//! A pass-through session relayed in the kernel: both connections plain TCP, the client's
//! socket and its backend socket spliced in a BPF sockmap ([`holdfast_sockmap`]). The
//! sockets leave the async runtime (registered there, the kernel's wake-up for every
//! redirected message would wake a worker thread for nothing): the session's task waits
//! for the process-wide hang-up watcher to say either side ended, keeps the session
//! registered and counted, and hands the pair to the process that replaces this one with
//! the map itself (the bytes keep flowing in the kernel meanwhile).

use super::{CarriedRelay, Relay, RETRY};
use crate::conn::PacketConn;
use crate::upgrade::{HandedRelay, SessionChannel};
use crate::Shared;
use holdfast_sockmap::{bytes_received, KernelRelay, OnHangup, Watched};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Two sockets relayed to each other by the kernel.
pub(crate) struct Spliced {
    kernel: Arc<KernelRelay>,
    pair: holdfast_sockmap::Spliced,
    client: TcpStream,
    backend: TcpStream,
    /// Each socket's `tcpi_bytes_received` when the pair was spliced (or taken over).
    received_before: (u64, u64),
}

/// Splices the two plain TCP connections in `kernel`; `None` (the connections left as they
/// were) when either is not plain TCP, something is buffered, or the kernel refused them.
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
    match kernel.splice(c.as_fd(), b.as_fd()) {
        Ok(pair) => Some(Spliced {
            kernel: kernel.clone(),
            pair,
            client: c,
            backend: b,
            received_before,
        }),
        Err(e) => {
            tracing::debug!(error = %e, "pass-through session relayed in user space");
            put_back(client, c);
            put_back(backend, b);
            None
        }
    }
}

/// A pair handed over by the process this one replaced: already in `kernel`'s map.
pub(super) fn resume(
    kernel: Arc<KernelRelay>,
    client: TcpStream,
    backend: TcpStream,
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
        client,
        backend,
    })
}

fn put_back(conn: &mut PacketConn, s: TcpStream) {
    let stream = s
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(s));
    match stream {
        Ok(tcp) => drop(conn.replace_stream(Box::new(tcp))),
        Err(e) => tracing::error!(error = %e, "a socket given back could not be used"),
    }
}

/// The end of either socket, as the hang-up watcher hears it.
struct Ends {
    heard: Arc<Notify>,
    _watched: (Watched, Watched),
}

impl Spliced {
    /// Waits until a side ends (the bytes each way), or the session went to the process
    /// that replaces this one (`None`).
    pub(super) async fn run(self, shared: &Shared, relay: Relay) -> io::Result<Option<(u64, u64)>> {
        shared.metrics.sessions_kernel_relayed.inc();
        let _counted = Counted(shared);
        let ends = match self.watch(shared) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(session = relay.id, error = %e, "pass-through session: its end cannot be heard; closed");
                return Ok(Some(self.finish()));
            }
        };
        // Bytes that arrived before the splice were not redirected: relayed here, once.
        // (Boxed, as the hand-over below: an idle relay's future keeps neither, and this
        // one reads through a 4 KiB buffer.)
        if Box::pin(self.forward_leftovers()).await.is_err() {
            drop(ends);
            return Ok(Some(self.finish()));
        }
        let mut sink = shared.upgrader.session_sink();
        let mut relay = Some(relay);
        let mut this = self;
        let mut ends = Some(ends);
        loop {
            let channel = sink
                .borrow_and_update()
                .clone()
                .filter(|c| !c.is_broken() && c.takes_kernel_relays());
            if let Some((channel, r)) = channel.and_then(|c| Some((c, relay.take()?))) {
                // (Out of the watcher's set before the sockets go.)
                let heard = ends.take().map(|e| e.heard);
                match Box::pin(this.hand_over(r, &channel)).await {
                    Ok(()) => {
                        shared.metrics.sessions_handed_over.inc();
                        return Ok(None);
                    }
                    Err((back, r)) => {
                        this = back;
                        relay = Some(r);
                        ends = Some(this.watch(shared)?);
                        // (An end heard meanwhile is heard again: the new registration
                        // reports a socket that has ended at once.)
                        drop(heard);
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            let Some(e) = ends.as_ref() else {
                break;
            };
            tokio::select! {
                _ = e.heard.notified() => break,
                _ = sink.changed() => {}
            }
        }
        drop(ends);
        Ok(Some(this.finish()))
    }

    /// Registers both sockets with the hang-up watcher.
    fn watch(&self, shared: &Shared) -> io::Result<Ends> {
        let watcher = shared
            .socket_watcher
            .get()
            .ok_or_else(|| io::Error::other("no hang-up watcher"))?;
        let heard = Arc::new(Notify::new());
        let on: OnHangup = {
            let heard = heard.clone();
            Arc::new(move || heard.notify_one())
        };
        let a = watcher.watch(self.client.as_fd(), on.clone())?;
        let b = watcher.watch(self.backend.as_fd(), on)?;
        Ok(Ends {
            heard,
            _watched: (a, b),
        })
    }

    /// Out of the map, both sockets closed: the bytes each way since the splice.
    fn finish(self) -> (u64, u64) {
        self.kernel.unsplice(self.pair);
        let up = bytes_received(self.client.as_fd()).unwrap_or(0);
        let down = bytes_received(self.backend.as_fd()).unwrap_or(0);
        (
            up.saturating_sub(self.received_before.0),
            down.saturating_sub(self.received_before.1),
        )
    }

    /// Relays what each socket had received before the splice (the kernel redirects only
    /// what arrives after it). `Err` when a side ended.
    async fn forward_leftovers(&self) -> io::Result<()> {
        for (from, to) in [(&self.client, &self.backend), (&self.backend, &self.client)] {
            from.set_nonblocking(true)?;
            to.set_nonblocking(true)?;
            let mut buf = [0u8; 4096];
            loop {
                match (&*from).read(&mut buf) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => write_all(to, &buf[..n]).await?,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Sends the pair, with the map, to the new process; gives it back when it did not go.
    async fn hand_over(self, relay: Relay, channel: &SessionChannel) -> Result<(), (Self, Relay)> {
        let map: Option<OwnedFd> = self.kernel.map_fd().try_clone_to_owned().ok();
        let Some(map) = map else {
            return Err((self, relay));
        };
        let Spliced {
            kernel,
            pair,
            client,
            backend,
            received_before,
        } = self;
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
                Err((
                    Spliced {
                        kernel,
                        pair,
                        client: returned.client,
                        backend: returned.backend,
                        received_before,
                    },
                    returned.carried.relay,
                ))
            }
        }
    }
}

/// Writes all of `data` to the non-blocking socket `to`, waiting a moment when it is full
/// (only bytes that arrived before the splice go this way: a request at most).
async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match (&*to).write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tokio::time::sleep(Duration::from_millis(1)).await
            }
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
