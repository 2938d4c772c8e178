//! What wakes an idle session: the topology changed, a planned switchover began or ended, or
//! a new process takes sessions over. Each has its own watch. A task watches the three and,
//! on any change, counts a ring and wakes every session through the waker its
//! [`SessionInfo`](crate::registry::SessionInfo) keeps; an idle session waits for the count
//! to pass the one it saw, then asks each watch (without waiting) what changed.
//!
//! Every idle session holds what it waits on (issue 22: memory per idle session): a watch's
//! `changed()` future is 120 bytes and the session's receiver 16 more, where the wait on
//! the count is a reference and the count seen (its waker is in the session's info).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::watch;

use holdfast_cluster::topology::Topology;

use crate::registry::{SessionInfo, SessionRegistry};
use crate::upgrade::SessionChannel;

/// The broadcasts an idle session watches.
pub struct Sources {
    pub topology: watch::Receiver<Arc<Topology>>,
    pub switching: watch::Receiver<bool>,
    pub hand_over: watch::Receiver<Option<Arc<SessionChannel>>>,
}

/// The ring count of the changes of [`Sources`] (or their closing), fed by a small task
/// started with the first session (inside the runtime, where sessions run), and again if
/// that task is gone (its runtime ended, as a test's does).
#[derive(Default)]
pub struct IdleWake {
    rings: Arc<AtomicU64>,
    /// Closed when the feeding task is gone. (Locked once per session start, never per
    /// request.)
    fed: Mutex<Option<watch::Receiver<()>>>,
}

impl IdleWake {
    /// Makes sure a task feeds the rings: `feed` gives it the sources to watch and the
    /// sessions to wake when none does (otherwise it is not called).
    pub fn start(&self, feed: impl FnOnce() -> (Sources, Arc<SessionRegistry>)) {
        let mut fed = self.fed.lock().unwrap_or_else(|e| e.into_inner());
        if fed
            .as_ref()
            .is_some_and(|alive| alive.has_changed().is_ok())
        {
            return;
        }
        let (alive, watched) = watch::channel(());
        let (sources, sessions) = feed();
        tokio::spawn(forward(sources, sessions, self.rings.clone(), alive));
        *fed = Some(watched);
    }

    /// The rings so far: what an idle session has seen before it asks the sources.
    pub fn rings(&self) -> u64 {
        self.rings.load(Ordering::SeqCst)
    }

    /// Completes once the count passes `seen`, waking `info`'s session when it does. Its
    /// waker is registered before the count is read, and a ring counts before it wakes:
    /// no ring is missed.
    pub fn rung_since<'a>(
        &'a self,
        info: &'a SessionInfo,
        seen: u64,
    ) -> impl Future<Output = ()> + 'a {
        std::future::poll_fn(move |cx| self.poll_rung_since(info, seen, cx))
    }

    /// [`IdleWake::rung_since`] as a poll, for a wait that keeps no future of its own.
    pub fn poll_rung_since(&self, info: &SessionInfo, seen: u64, cx: &mut Context<'_>) -> Poll<()> {
        info.idle_waker.register(cx.waker());
        if self.rings() == seen {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

impl crate::Shared {
    /// Makes sure the rings of [`IdleWake`] are fed (once per session start).
    pub(crate) fn feed_idle_wake(&self) {
        self.idle_wake.start(|| {
            (
                Sources {
                    topology: self.topology.clone(),
                    switching: self.switching.subscribe(),
                    hand_over: self.upgrader.session_sink(),
                },
                self.sessions.clone(),
            )
        })
    }
}

/// Rings on each change of a source and wakes the sessions; a source that closes rings once
/// and is watched no more (a session then finds it closed). Ends when all have closed.
async fn forward(
    mut sources: Sources,
    sessions: Arc<SessionRegistry>,
    rings: Arc<AtomicU64>,
    _alive: watch::Sender<()>,
) {
    let (mut topology, mut switching, mut hand_over) = (true, true, true);
    while topology || switching || hand_over {
        tokio::select! {
            r = sources.topology.changed(), if topology => topology = r.is_ok(),
            r = sources.switching.changed(), if switching => switching = r.is_ok(),
            r = sources.hand_over.changed(), if hand_over => hand_over = r.is_ok(),
        }
        rings.fetch_add(1, Ordering::SeqCst);
        sessions.wake_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Senders = (
        watch::Sender<Arc<Topology>>,
        watch::Sender<bool>,
        watch::Sender<Option<Arc<SessionChannel>>>,
    );

    fn channels() -> Senders {
        (
            watch::Sender::new(Arc::new(Topology::default())),
            watch::Sender::new(false),
            watch::Sender::new(None),
        )
    }

    /// What a test's [`IdleWake::start`] is fed: receivers of the senders, and `sessions`.
    fn feed<'a>(
        topology: &'a watch::Sender<Arc<Topology>>,
        switching: &'a watch::Sender<bool>,
        hand_over: &'a watch::Sender<Option<Arc<SessionChannel>>>,
        sessions: &'a Arc<SessionRegistry>,
    ) -> impl Fn() -> (Sources, Arc<SessionRegistry>) + 'a {
        move || {
            (
                Sources {
                    topology: topology.subscribe(),
                    switching: switching.subscribe(),
                    hand_over: hand_over.subscribe(),
                },
                sessions.clone(),
            )
        }
    }

    /// A session registered in `sessions`, as an idle one waits.
    fn session(sessions: &SessionRegistry, id: u32) -> Arc<SessionInfo> {
        let info = Arc::new(SessionInfo::new(id, "127.0.0.1:1".parse().expect("addr")));
        sessions.insert(info.clone());
        info
    }

    /// Whether a session that saw `seen` is woken by a ring within a deadline; the count
    /// it sees then.
    async fn rung(wake: &IdleWake, info: &SessionInfo, seen: u64) -> Option<u64> {
        tokio::time::timeout(Duration::from_secs(5), wake.rung_since(info, seen))
            .await
            .ok()
            .map(|()| wake.rings())
    }

    #[tokio::test]
    async fn each_source_wakes_a_waiting_session_and_a_closed_one_wakes_it_once() {
        let (topology, switching, hand_over) = channels();
        let wake = IdleWake::default();
        let sessions = Arc::new(SessionRegistry::default());
        let feed = feed(&topology, &switching, &hand_over, &sessions);
        wake.start(feed);
        let info = session(&sessions, 1);
        let mut seen = wake.rings();
        // Nothing rang yet: a wait does not complete.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), wake.rung_since(&info, seen))
                .await
                .is_err(),
            "nothing to see yet"
        );
        switching.send_replace(true);
        seen = rung(&wake, &info, seen).await.expect("a switchover wakes");
        topology.send_replace(Arc::new(Topology::default()));
        seen = rung(&wake, &info, seen)
            .await
            .expect("a topology change wakes");
        hand_over.send_replace(None);
        seen = rung(&wake, &info, seen).await.expect("a hand-over wakes");
        // Started again, the task that feeds is not doubled.
        wake.start(|| unreachable!("the rings are fed already"));
        drop(topology);
        seen = rung(&wake, &info, seen)
            .await
            .expect("a source that closes wakes");
        switching.send_replace(false);
        seen = rung(&wake, &info, seen)
            .await
            .expect("the others still wake");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), wake.rung_since(&info, seen))
                .await
                .is_err(),
            "one ring per change"
        );
    }

    /// The ring wakes the session's task itself (through the waker its info keeps), not
    /// only a wait polled again by chance.
    #[tokio::test]
    async fn a_ring_wakes_a_task_that_waits() {
        let (topology, switching, hand_over) = channels();
        let wake = Arc::new(IdleWake::default());
        let sessions = Arc::new(SessionRegistry::default());
        wake.start(feed(&topology, &switching, &hand_over, &sessions));
        let info = session(&sessions, 7);
        let seen = wake.rings();
        let waiting = tokio::spawn({
            let (wake, info) = (wake.clone(), info.clone());
            async move { wake.rung_since(&info, seen).await }
        });
        // The task waits (its waker registered) before the change.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !info.idle_waker_registered() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task never waited"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        switching.send_replace(true);
        assert!(
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .is_ok_and(|r| r.is_ok()),
            "the waiting task was woken"
        );
    }

    /// The task that feeds the rings ran in a runtime that ended: the next session starts
    /// another.
    #[test]
    fn a_session_after_the_feeding_task_is_gone_starts_another() {
        let (topology, switching, hand_over) = channels();
        let sessions = Arc::new(SessionRegistry::default());
        let feed = feed(&topology, &switching, &hand_over, &sessions);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let wake = IdleWake::default();
        let first = runtime();
        first.block_on(async { wake.start(&feed) });
        drop(first);
        let info = session(&sessions, 1);
        runtime().block_on(async {
            let seen = wake.rings();
            switching.send_replace(true);
            assert!(
                tokio::time::timeout(Duration::from_millis(100), wake.rung_since(&info, seen))
                    .await
                    .is_err(),
                "its task went with its runtime"
            );
            wake.start(&feed);
            switching.send_replace(false);
            assert!(
                rung(&wake, &info, seen).await.is_some(),
                "a new task feeds the rings"
            );
        });
    }
}
