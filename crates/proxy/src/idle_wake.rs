//! What wakes an idle session: the topology changed, a planned switchover began or ended, or
//! a new process takes sessions over. Each has its own watch; an idle session waits on one
//! that ticks whenever any of them changes, then asks each (without waiting) what did. A
//! watch's `changed()` future is about 120 bytes, and every idle session holds what it waits
//! on: one in place of three is about a tenth of an idle session (issue 22).

use std::sync::{Arc, Mutex};
use tokio::sync::watch;

use holdfast_cluster::topology::Topology;

use crate::upgrade::SessionChannel;

/// The broadcasts an idle session watches.
pub struct Sources {
    pub topology: watch::Receiver<Arc<Topology>>,
    pub switching: watch::Receiver<bool>,
    pub hand_over: watch::Receiver<Option<Arc<SessionChannel>>>,
}

/// One watch that ticks when any of [`Sources`] changes (or closes), fed by a small task
/// started with the first subscriber (inside the runtime, where sessions run), and again
/// if that task is gone (its runtime ended, as a test's does).
#[derive(Default)]
pub struct IdleWake {
    /// (Locked once per session start, never per request.)
    ticks: Mutex<Option<watch::Receiver<u64>>>,
}

impl IdleWake {
    /// A receiver that has seen the ticks so far; `sources` feed the ticks when no task
    /// does (otherwise they are not asked for: they are the same broadcasts).
    pub fn subscribe(&self, sources: impl FnOnce() -> Sources) -> watch::Receiver<u64> {
        let mut ticks = self.ticks.lock().unwrap_or_else(|e| e.into_inner());
        let fed = ticks
            .as_ref()
            .filter(|rx| rx.has_changed().is_ok())
            .cloned();
        let mut rx = match fed {
            Some(rx) => rx,
            None => {
                let (tx, rx) = watch::channel(0);
                tokio::spawn(forward(sources(), tx));
                *ticks = Some(rx.clone());
                rx
            }
        };
        rx.mark_unchanged();
        rx
    }
}

impl crate::Shared {
    /// A session's receiver of the ticks of [`IdleWake`].
    pub(crate) fn idle_ticks(&self) -> watch::Receiver<u64> {
        self.idle_wake.subscribe(|| Sources {
            topology: self.topology.clone(),
            switching: self.switching.subscribe(),
            hand_over: self.upgrader.session_sink(),
        })
    }
}

/// Ticks `tx` on each change of a source; a source that closes ticks once and is watched no
/// more (a session then finds it closed).
async fn forward(mut sources: Sources, tx: watch::Sender<u64>) {
    let (mut topology, mut switching, mut hand_over) = (true, true, true);
    while topology || switching || hand_over {
        let open = tokio::select! {
            r = sources.topology.changed(), if topology => {
                topology = r.is_ok();
                true
            }
            r = sources.switching.changed(), if switching => {
                switching = r.is_ok();
                true
            }
            r = sources.hand_over.changed(), if hand_over => {
                hand_over = r.is_ok();
                true
            }
            () = tx.closed() => false,
        };
        if !open {
            return;
        }
        tx.send_modify(|n| *n = n.wrapping_add(1));
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

    async fn ticked(rx: &mut watch::Receiver<u64>) -> bool {
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    #[tokio::test]
    async fn each_source_wakes_a_subscriber_and_a_closed_one_wakes_it_once() {
        let (topology, switching, hand_over) = channels();
        let wake = IdleWake::default();
        let sources = || Sources {
            topology: topology.subscribe(),
            switching: switching.subscribe(),
            hand_over: hand_over.subscribe(),
        };
        let mut rx = wake.subscribe(sources);
        assert!(!rx.has_changed().unwrap_or(true), "nothing to see yet");
        switching.send_replace(true);
        assert!(ticked(&mut rx).await, "a switchover wakes");
        topology.send_replace(Arc::new(Topology::default()));
        assert!(ticked(&mut rx).await, "a topology change wakes");
        hand_over.send_replace(None);
        assert!(ticked(&mut rx).await, "a hand-over wakes");
        // A later subscriber starts from now, and is woken the same way.
        let mut later = wake.subscribe(|| unreachable!("the ticks are fed already"));
        assert!(!later.has_changed().unwrap_or(true));
        drop(topology);
        assert!(ticked(&mut later).await, "a source that closes wakes");
        assert!(ticked(&mut rx).await);
        switching.send_replace(false);
        assert!(ticked(&mut rx).await, "the others still wake");
    }

    /// The task that feeds the ticks ran in a runtime that ended: the next subscriber
    /// starts another.
    #[test]
    fn a_subscriber_after_the_feeding_task_is_gone_starts_another() {
        let (topology, switching, hand_over) = channels();
        let sources = || Sources {
            topology: topology.subscribe(),
            switching: switching.subscribe(),
            hand_over: hand_over.subscribe(),
        };
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let wake = IdleWake::default();
        let first = runtime();
        let mut gone = first.block_on(async { wake.subscribe(sources) });
        drop(first);
        runtime().block_on(async {
            assert!(
                gone.changed().await.is_err(),
                "its task went with its runtime"
            );
            let mut rx = wake.subscribe(sources);
            switching.send_replace(true);
            assert!(ticked(&mut rx).await, "a new task feeds the ticks");
        });
    }
}
