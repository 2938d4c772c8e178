//! Threads that run client sessions, each a tokio current-thread runtime of its own.
//!
//! A session's client socket and the backend connections it opens are registered with the
//! reactor of the thread it runs on, so each of its wake-ups stays on that thread: no task
//! is stolen by another worker and no worker is woken to steal (issue 22, "thread per
//! core"). The acceptor hands each new connection to the thread with the fewest sessions;
//! the control tasks (monitor, HA, admin, the acceptors) stay on the main runtime.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::runtime::Handle;

pub struct SessionThreads {
    threads: Vec<SessionThread>,
}

struct SessionThread {
    handle: Handle,
    /// Sessions running on it now.
    sessions: Arc<AtomicUsize>,
}

impl SessionThread {
    /// One more session on this thread, until the count is dropped.
    fn count_in(&self) -> Counted {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        Counted(self.sessions.clone())
    }
}

/// Counts a session off its thread when it ends, however it ends.
pub struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionThreads {
    /// Starts `count` threads (named `holdfast-sessions-N`). They run until the process
    /// exits.
    pub fn start(count: usize) -> std::io::Result<SessionThreads> {
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("holdfast-sessions-{i}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    match runtime {
                        Ok(runtime) => {
                            let _ = tx.send(Ok(runtime.handle().clone()));
                            runtime.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })?;
            let handle = rx.recv().map_err(|_| {
                std::io::Error::other(format!("session thread {i} ended as it started"))
            })??;
            threads.push(SessionThread {
                handle,
                sessions: Arc::default(),
            });
        }
        Ok(SessionThreads { threads })
    }

    /// Runs the future `session` makes of `stream` on the thread with the fewest
    /// sessions, `stream` registered with that thread's reactor. A stream that cannot move
    /// there is closed (logged).
    pub fn spawn_with<Fut>(
        &self,
        stream: TcpStream,
        session: impl FnOnce(TcpStream, Counted) -> Fut,
    ) where
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Leaves this runtime's reactor (the socket stays non-blocking) for the thread's:
        // made inside the thread's runtime context, it registers with its driver.
        let made = stream.into_std().map(|stream| {
            self.spawn_made(|counted| {
                TcpStream::from_std(stream).map(|stream| session(stream, counted))
            })
        });
        if let Err(e) = made.and_then(|made| made) {
            tracing::warn!(error = %e, "a new connection could not move to its session thread");
        }
    }

    /// Runs the future `make` makes on the thread with the fewest sessions. It is made
    /// inside that thread's runtime context, so that the sockets it registers (a session
    /// handed over by an upgrade brings them as std sockets) are that thread's, and it holds
    /// the count of the thread's sessions.
    pub fn spawn<Fut>(&self, make: impl FnOnce(Counted) -> Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let _ = self.spawn_made(|counted| Ok::<_, std::convert::Infallible>(make(counted)));
    }

    /// [`SessionThreads::spawn`] of a future that may not be made (`Err`: nothing runs, the
    /// count is given back). The future is spawned as made, so that the task holds it
    /// alone: an idle session's task is a good part of what it costs (issue 22).
    fn spawn_made<Fut, E>(&self, make: impl FnOnce(Counted) -> Result<Fut, E>) -> Result<(), E>
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(thread) = self.least_loaded() else {
            return Ok(());
        };
        let counted = thread.count_in();
        let session = {
            let _inside = thread.handle.enter();
            make(counted)?
        };
        thread.handle.spawn(session);
        Ok(())
    }

    fn least_loaded(&self) -> Option<&SessionThread> {
        self.threads
            .iter()
            .min_by_key(|t| t.sessions.load(Ordering::Relaxed))
    }

    /// Sessions running on each thread now.
    pub fn sessions(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.sessions.load(Ordering::Relaxed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn sessions_run_on_the_least_loaded_thread_and_are_counted_off() {
        let threads = SessionThreads::start(2).expect("threads");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (names_tx, mut names_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut clients = Vec::new();
        for _ in 0..4 {
            let mut client = TcpStream::connect(addr).await.expect("connect");
            let (stream, _) = listener.accept().await.expect("accept");
            let names = names_tx.clone();
            threads.spawn_with(stream, move |mut stream, counted| async move {
                let _counted = counted;
                let name = std::thread::current().name().map(str::to_owned);
                let _ = names.send(name);
                // An echo (the socket works on the thread it moved to), then on until
                // the client goes.
                let mut byte = [0u8; 1];
                if stream.read_exact(&mut byte).await.is_ok() {
                    let _ = stream.write_all(&byte).await;
                    let _ = stream.read(&mut byte).await;
                }
            });
            client.write_all(b"x").await.expect("write");
            let mut back = [0u8; 1];
            client.read_exact(&mut back).await.expect("echo");
            assert_eq!(&back, b"x");
            clients.push(client);
        }
        let mut names = Vec::new();
        for _ in 0..4 {
            names.push(names_rx.recv().await.flatten().unwrap_or_default());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "holdfast-sessions-0",
                "holdfast-sessions-0",
                "holdfast-sessions-1",
                "holdfast-sessions-1"
            ]
        );
        assert_eq!(threads.sessions(), [2, 2]);
        // Each session ends with its client.
        drop(clients);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while threads.sessions() != [0, 0] {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                threads.sessions()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
