//! The other process, while both serve after an upgrade (the old one drains what it could
//! not hand over yet, the new one accepts). A client's `KILL` names one of holdfast's
//! session ids; the session may be in the other process (a long statement still running
//! in the old one, killed from a new connection; an idle session handed over, killed from
//! a transaction left behind). The killer's process asks the other where that session is
//! ([`Message::Where`]): its backend node and thread, and the read it runs on a replica
//! now. A `KILL` that ends a connection has the session marked there as its victim, as a
//! local one is (the victim's process then ends the session when it sees its backend
//! connection go, instead of logging in again), and unmarked again
//! ([`Message::Unmark`]) when the `KILL` fails. The killer's own backend connection runs
//! the `KILL` of that thread, and the server checks the killer's right to it as always.
//!
//! Both processes read their end of the hand-over channel in one task and write from any
//! (taking turns). An answer is sent from a task of its own, so a reader never waits on a
//! write.

use super::channel::{self, Received};
use super::Message;
use crate::registry::ReplicaRead;
use crate::Shared;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::oneshot;

/// How long a question to the other process may take before the `KILL` is answered as
/// the server would answer an id it does not know (1094).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a session of the other process is (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    /// The node of its backend connection, as the configuration names it.
    pub node: String,
    /// Its backend connection's thread id there (0: it has none now).
    pub thread: u32,
    /// A split session's read running on a replica now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_read: Option<LocatedRead>,
}

/// [`ReplicaRead`] as the other process says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocatedRead {
    pub node: String,
    pub address: String,
    pub thread: u32,
}

impl From<LocatedRead> for ReplicaRead {
    fn from(r: LocatedRead) -> Self {
        ReplicaRead {
            node: r.node.into(),
            address: r.address.into(),
            thread: r.thread,
        }
    }
}

/// This process's end of the hand-over channel once both serve.
pub struct Peer {
    stream: UnixStream,
    /// Writers take turns: a message is several writes.
    writing: tokio::sync::Mutex<()>,
    /// Questions asked and not answered yet, by number.
    asked: Mutex<HashMap<u64, oneshot::Sender<Option<Located>>>>,
    next_question: AtomicU64,
    /// The other process answers questions (it speaks format [`super::PEER_FORMAT`]).
    answers: bool,
    /// Its end closed: it exited.
    gone: AtomicBool,
}

impl Peer {
    pub(super) fn new(stream: UnixStream, answers: bool) -> Arc<Peer> {
        Arc::new(Peer {
            stream,
            writing: tokio::sync::Mutex::new(()),
            asked: Mutex::new(HashMap::new()),
            next_question: AtomicU64::new(1),
            answers,
            gone: AtomicBool::new(false),
        })
    }

    /// Sends one message (in turn with other writers).
    pub(super) async fn send(&self, body: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let _turn = self.writing.lock().await;
        channel::send(&self.stream, body, fds).await
    }

    /// Receives the next message. Only the reading task calls it.
    pub(super) async fn recv(&self) -> std::io::Result<Option<Received>> {
        channel::recv(&self.stream).await
    }

    /// Where the other process's session `id` is; `None` when it has none of that id, or
    /// does not answer within [`ASK_TIMEOUT`] (gone, or an older build). `mark`: the session
    /// is marked there as the victim of a `KILL` of its connection about to run.
    pub async fn locate(&self, id: u32, mark: bool) -> Option<Located> {
        if !self.answers || self.gone.load(Ordering::Acquire) {
            return None;
        }
        let question = self.next_question.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.asked.lock().ok()?.insert(question, tx);
        let answer = async {
            let body = serde_json::to_vec(&Message::Where { question, id, mark }).ok()?;
            self.send(&body, &[]).await.ok()?;
            rx.await.ok().flatten()
        };
        let located = tokio::time::timeout(ASK_TIMEOUT, answer)
            .await
            .ok()
            .flatten();
        if let Ok(mut asked) = self.asked.lock() {
            asked.remove(&question);
        }
        located
    }

    /// Takes a question or an answer off the reading task's hands; anything else is given
    /// back.
    pub(super) fn take(self: &Arc<Self>, shared: &Shared, message: Message) -> Option<Message> {
        match message {
            Message::Where { question, id, mark } => {
                let at = locate_here(shared, id, mark);
                self.send_later(Message::Here { question, at });
                None
            }
            Message::Unmark { id, thread } => {
                if let Some(session) = shared.sessions.get(id) {
                    let _ = session.kill_requested.compare_exchange(
                        thread,
                        0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                None
            }
            Message::Here { question, at } => {
                self.answered(question, at);
                None
            }
            other => Some(other),
        }
    }

    /// The `KILL` the session `id` was marked for (its backend connection `thread`) failed:
    /// it is unmarked in the other process.
    pub fn unmark(self: &Arc<Self>, id: u32, thread: u32) {
        self.send_later(Message::Unmark { id, thread });
    }

    /// Sends from a task of its own (a reader never waits on a write).
    fn send_later(self: &Arc<Self>, message: Message) {
        let peer = self.clone();
        tokio::spawn(async move {
            let Ok(body) = serde_json::to_vec(&message) else {
                return;
            };
            if let Err(e) = tokio::time::timeout(ASK_TIMEOUT, peer.send(&body, &[])).await {
                tracing::debug!(error = %e, "upgrade: a message to the other process did not go");
            }
        });
    }

    /// The answer to question `question` came.
    fn answered(&self, question: u64, at: Option<Located>) {
        let waiting = self.asked.lock().ok().and_then(|mut a| a.remove(&question));
        if let Some(tx) = waiting {
            let _ = tx.send(at);
        }
    }

    /// The other process's end closed: questions get no answer from now on.
    pub(super) fn went(&self) {
        self.gone.store(true, Ordering::Release);
        if let Ok(mut asked) = self.asked.lock() {
            asked.clear();
        }
    }
}

/// This process's session `id`, for the other process's question (marked as the victim of
/// a `KILL` of its connection when `mark`).
fn locate_here(shared: &Shared, id: u32, mark: bool) -> Option<Located> {
    let session = shared.sessions.get(id)?;
    let thread = session.backend_thread.load(Ordering::Acquire);
    if mark && thread != 0 {
        session.kill_requested.store(thread, Ordering::Release);
    }
    let node = session.backend.lock().ok()?.to_string();
    let replica_read = session.replica_read.load_full().map(|r| LocatedRead {
        node: r.node.to_string(),
        address: r.address.to_string(),
        thread: r.thread,
    });
    Some(Located {
        node,
        thread,
        replica_read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A question is answered by the other end's reading task; one that gets no answer
    /// (an older build, which does not read them) comes back `None` in time.
    #[tokio::test]
    async fn a_question_gets_its_answer_or_none_in_time() {
        let (a, b) = UnixStream::pair().expect("pair");
        let asking = Peer::new(a, true);
        let answering = Peer::new(b, true);
        let reader = asking.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = reader.recv().await {
                // (No `Shared` here: the questions are answered by hand below.)
                match serde_json::from_slice::<Message>(&r.body).expect("a message") {
                    Message::Here { question, at } => reader.answered(question, at),
                    m => panic!("unexpected {m:?}"),
                }
            }
        });
        let other = answering.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = other.recv().await {
                match serde_json::from_slice::<Message>(&r.body).expect("a message") {
                    Message::Where { question, id, .. } => {
                        let at = (id == 7).then(|| Located {
                            node: "node1".into(),
                            thread: 42,
                            replica_read: None,
                        });
                        let body =
                            serde_json::to_vec(&Message::Here { question, at }).expect("json");
                        other.send(&body, &[]).await.expect("send");
                    }
                    m => panic!("unexpected {m:?}"),
                }
            }
        });
        let (seven, eight) = tokio::join!(asking.locate(7, false), asking.locate(8, true));
        assert_eq!(
            seven.map(|l| (l.node, l.thread)),
            Some(("node1".into(), 42))
        );
        assert_eq!(eight, None);

        // Nobody reads the questions: `None` after the timeout, nothing left waiting.
        let (c, _d) = UnixStream::pair().expect("pair");
        let unanswered = Peer::new(c, true);
        tokio::time::pause();
        assert_eq!(unanswered.locate(7, false).await, None);
        assert!(unanswered.asked.lock().expect("lock").is_empty());
        // An older build is not asked at all.
        let (e, _f) = UnixStream::pair().expect("pair");
        assert_eq!(Peer::new(e, false).locate(7, false).await, None);
    }
}
