//! Open sessions, for the admin API. Sessions register at login and deregister at close; the
//! per-query updates are atomics on the session's own [`SessionInfo`].

use crate::state::Blocker;
use holdfast_cluster::topology::NodeName;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The first of holdfast's connection ids; the server's thread ids stay below it (they
/// count connections since the server started).
pub const SESSION_ID_BASE: u32 = 1 << 30;

/// A read a split session runs on a replica right now (what a `KILL QUERY` of the session
/// stops there).
#[derive(Debug)]
pub struct ReplicaRead {
    pub node: NodeName,
    pub address: NodeName,
    pub thread: u32,
}

pub struct SessionInfo {
    pub id: u32,
    pub client: SocketAddr,
    pub started: Instant,
    /// Changes only on COM_CHANGE_USER.
    pub user: Mutex<Arc<str>>,
    /// Changes when the session moves.
    pub backend: Mutex<NodeName>,
    /// The server's thread id of the backend connection (`CONNECTION_ID()` there).
    pub backend_thread: AtomicU32,
    /// The backend thread a client's `KILL` (through holdfast) ends: when that connection
    /// goes, the session ends with it, as a direct connection would (0: none).
    pub kill_requested: AtomicU32,
    pub moves: AtomicU64,
    pub can_reauthenticate: AtomicBool,
    pub commands: AtomicU64,
    /// COM_PINGs (with `[serverless]`): keep-alive pings are not activity.
    pub pings: AtomicU64,
    pub status: AtomicU16,
    /// `Blocker as u8`; 0 when the session could move.
    pub blocker: AtomicU8,
    /// Handling a request right now.
    pub busy: AtomicBool,
    /// Holding its next request while a planned switchover runs.
    pub parked: AtomicBool,
    /// State only a capture reads changed and has not been captured yet (the session
    /// captures once idle; a switchover waits for it).
    pub capture_due: AtomicBool,
    /// The read it runs on a replica now, if any (split sessions; set and cleared around
    /// each such read without a lock).
    pub replica_read: arc_swap::ArcSwapOption<ReplicaRead>,
    /// A capture is due but waits for a moment the client cannot tell (see the session's
    /// `capture_if_due`): a switchover waits for it (the session captures when it starts),
    /// a pause does not.
    pub capture_deferred: AtomicBool,
    /// Bytes the replay log of the open transaction holds (0: none kept).
    pub replay_held: AtomicU64,
    /// Why the open transaction is not replayable, if it is not.
    /// (Compared on each request, stored only when it changes: no lock on the way.)
    pub replay_blocked: arc_swap::ArcSwapOption<&'static str>,
    /// The session's last moves in this process (at most [`JOURNEY_KEPT`]).
    pub journey: Mutex<Vec<Move>>,
    /// The statement of a request that has run for a while (set by the session once the
    /// request passes its client watch, cleared when it is answered): quick requests
    /// never store it.
    pub statement: arc_swap::ArcSwapOption<RunningStatement>,
    /// The session's task while it idles, for [`SessionRegistry::wake_idle`] (see
    /// `idle_wake.rs`).
    pub idle_waker: atomic_waker::AtomicWaker,
}

/// A statement a session has been running for a while, as `/status` shows it.
#[derive(Debug)]
pub struct RunningStatement {
    /// Its text, cut at a few hundred bytes (a prepared statement's text for an execute).
    pub text: String,
    /// When its request came.
    pub since: Instant,
}

/// Moves a session remembers.
pub const JOURNEY_KEPT: usize = 8;

/// One move of a session to a new backend connection: when, from which node to which,
/// why, and how long it took (log in, restore the state, prepare the statements again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Move {
    pub unix_ms: u64,
    pub from: String,
    pub to: String,
    pub why: String,
    pub ms: f64,
}

/// A parked idle session's sockets wake its task through its record (`parking.rs`): the
/// watcher holds the record's `Arc`, not a callback of its own.
impl holdfast_sockmap::Hangup for SessionInfo {
    fn hangup(&self) {
        self.idle_waker.wake();
    }
}

impl SessionInfo {
    pub fn new(id: u32, client: SocketAddr) -> Self {
        Self::started_at(id, client, Instant::now())
    }

    /// A session that started earlier (in the process that handed it over).
    pub fn started_at(id: u32, client: SocketAddr, started: Instant) -> Self {
        SessionInfo {
            id,
            client,
            started,
            user: Mutex::new(Arc::from("")),
            backend: Mutex::new(NodeName::default()),
            backend_thread: AtomicU32::new(0),
            kill_requested: AtomicU32::new(0),
            moves: AtomicU64::new(0),
            can_reauthenticate: AtomicBool::new(false),
            commands: AtomicU64::new(0),
            pings: AtomicU64::new(0),
            status: AtomicU16::new(0),
            blocker: AtomicU8::new(0),
            busy: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            capture_due: AtomicBool::new(false),
            replica_read: arc_swap::ArcSwapOption::empty(),
            capture_deferred: AtomicBool::new(false),
            replay_held: AtomicU64::new(0),
            replay_blocked: arc_swap::ArcSwapOption::empty(),
            journey: Mutex::new(Vec::new()),
            statement: arc_swap::ArcSwapOption::empty(),
            idle_waker: atomic_waker::AtomicWaker::new(),
        }
    }

    /// Whether the session's task left a waker to be woken by (a test sees it wait).
    #[cfg(test)]
    pub fn idle_waker_registered(&self) -> bool {
        match self.idle_waker.take() {
            Some(waker) => {
                self.idle_waker.register(&waker);
                true
            }
            None => false,
        }
    }

    /// Remembers a move (the oldest goes past [`JOURNEY_KEPT`]).
    pub fn note_move(&self, m: Move) {
        if let Ok(mut journey) = self.journey.lock() {
            if journey.len() >= JOURNEY_KEPT {
                journey.remove(0);
            }
            journey.push(m);
        }
    }

    /// Commands that count as use of the database: all but keep-alive pings.
    pub fn activity(&self) -> u64 {
        self.commands
            .load(Ordering::Relaxed)
            .saturating_sub(self.pings.load(Ordering::Relaxed))
    }

    /// `user`: shared with the sessions of the same user ([`Shared::user_names`](crate::Shared)).
    pub fn set_user(&self, user: Arc<str>) {
        if let Ok(mut u) = self.user.lock() {
            *u = user;
        }
    }

    pub fn set_backend(&self, backend: &NodeName, thread: u32) {
        if let Ok(mut b) = self.backend.lock() {
            *b = backend.clone();
        }
        self.backend_thread.store(thread, Ordering::Release);
    }

    /// Whether `node` is this session's node.
    pub fn is_on(&self, node: &str) -> bool {
        self.backend.lock().is_ok_and(|b| *b == node)
    }

    /// Whether a client's `KILL` ended the backend connection `thread`.
    pub fn killed_on_purpose(&self, thread: u32) -> bool {
        thread != 0 && self.kill_requested.load(Ordering::Acquire) == thread
    }

    /// The replay log's account (after each request of a session with replay on).
    pub fn set_replay(&self, held: u64, blocked: Option<&'static str>) {
        self.replay_held.store(held, Ordering::Relaxed);
        if self.replay_blocked.load().as_deref().copied() != blocked {
            self.replay_blocked.store(blocked.map(Arc::new));
        }
    }

    pub fn set_blocker(&self, blocker: Option<Blocker>) {
        self.blocker
            .store(blocker.map_or(0, |b| b as u8), Ordering::Relaxed);
    }

    pub fn blocker(&self) -> Option<Blocker> {
        Blocker::from_code(self.blocker.load(Ordering::Relaxed))
    }

    /// What it is doing: held while a switchover runs, running a request, or idle.
    pub fn state(&self) -> &'static str {
        if self.parked.load(Ordering::Relaxed) {
            "held"
        } else if self.busy.load(Ordering::Relaxed) {
            "running"
        } else {
            "idle"
        }
    }

    /// Whether `find` (lowercase) is in its id, user, client address, node, blocker or
    /// the statement it has been running for a while.
    pub fn matches(&self, find: &str) -> bool {
        self.id.to_string().contains(find)
            || self
                .user
                .lock()
                .is_ok_and(|u| u.to_lowercase().contains(find))
            || self.client.to_string().contains(find)
            || self
                .backend
                .lock()
                .is_ok_and(|b| b.to_lowercase().contains(find))
            || self.blocker().is_some_and(|b| b.as_str().contains(find))
            || self
                .statement
                .load()
                .as_ref()
                .is_some_and(|s| s.text.to_lowercase().contains(find))
    }

    pub fn view(&self) -> SessionView {
        let blocker = self.blocker();
        let statement = self.statement.load_full();
        SessionView {
            id: self.id,
            client: self.client.to_string(),
            user: self.user.lock().map(|u| u.to_string()).unwrap_or_default(),
            backend: self
                .backend
                .lock()
                .map(|b| b.to_string())
                .unwrap_or_default(),
            moves: self.moves.load(Ordering::Relaxed),
            age_secs: self.started.elapsed().as_secs(),
            commands: self.commands.load(Ordering::Relaxed),
            can_reauthenticate: self.can_reauthenticate.load(Ordering::Relaxed),
            movable: blocker.is_none(),
            blocked_by: blocker.map(|b| b.as_str().to_string()),
            capture_due: self.capture_due.load(Ordering::Relaxed)
                || self.capture_deferred.load(Ordering::Relaxed),
            replay_held_bytes: self.replay_held.load(Ordering::Relaxed),
            replay_blocked_by: self.replay_blocked.load().as_deref().map(|b| b.to_string()),
            journey: self.journey.lock().map(|j| j.clone()).unwrap_or_default(),
            state: self.state().to_string(),
            statement_ms: statement
                .as_ref()
                .map(|s| s.since.elapsed().as_millis() as u64),
            statement: statement.map(|s| s.text.clone()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    pub id: u32,
    pub client: String,
    pub user: String,
    pub backend: String,
    pub age_secs: u64,
    pub commands: u64,
    pub moves: u64,
    pub can_reauthenticate: bool,
    pub movable: bool,
    pub blocked_by: Option<String>,
    /// State only a capture reads changed and is not captured yet (see the session's
    /// `capture_if_due`): a crash of its node now would lose it.
    #[serde(default)]
    pub capture_due: bool,
    /// Heap bytes the replay log of its open transaction holds (what `replay_max_bytes`
    /// bounds; 0 when nothing is kept).
    #[serde(default)]
    pub replay_held_bytes: u64,
    /// Why its open transaction would not be replayed, if it would not.
    #[serde(default)]
    pub replay_blocked_by: Option<String>,
    /// Its last moves in this process, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub journey: Vec<Move>,
    /// `idle`, `running` (a request) or `held` (its next request, while a switchover runs).
    #[serde(default)]
    pub state: String,
    /// The statement of a request it has been running for more than half a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    /// ...and for how long, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement_ms: Option<u64>,
}

#[derive(Default)]
pub struct SessionRegistry {
    inner: Mutex<HashMap<u32, Arc<SessionInfo>>>,
    /// Commands of sessions that have ended, so [`SessionRegistry::activity`] never goes back.
    closed_commands: AtomicU64,
    /// Ids of logins under way: the client may have its OK (and so its id) a moment before
    /// its session is registered, and another connection's `KILL` of it waits for it.
    logging_in: Mutex<std::collections::HashSet<u32>>,
}

/// A login under way (see [`SessionRegistry::begin_login`]); over when dropped.
pub struct LoggingIn<'a> {
    registry: &'a SessionRegistry,
    id: u32,
}

impl Drop for LoggingIn<'_> {
    fn drop(&mut self) {
        if let Ok(mut l) = self.registry.logging_in.lock() {
            l.remove(&self.id);
        }
    }
}

impl SessionRegistry {
    /// Marks session `id`'s login as under way until the guard is dropped (after the
    /// session is registered).
    pub fn begin_login(&self, id: u32) -> LoggingIn<'_> {
        if let Ok(mut l) = self.logging_in.lock() {
            l.insert(id);
        }
        LoggingIn { registry: self, id }
    }

    /// Whether session `id` is logging in (not registered yet).
    pub fn is_logging_in(&self, id: u32) -> bool {
        self.logging_in.lock().is_ok_and(|l| l.contains(&id))
    }

    pub fn insert(&self, info: Arc<SessionInfo>) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(info.id, info);
        }
    }

    pub fn get(&self, id: u32) -> Option<Arc<SessionInfo>> {
        self.inner.lock().ok()?.get(&id).cloned()
    }

    /// The session whose backend connection is thread `thread` of `node`.
    pub fn by_backend_thread(&self, node: &str, thread: u32) -> Option<Arc<SessionInfo>> {
        let m = self.inner.lock().ok()?;
        m.values()
            .find(|s| s.backend_thread.load(Ordering::Acquire) == thread && s.is_on(node))
            .cloned()
    }

    /// Wakes each session that waits while idle (see `idle_wake.rs`): a busy one has no
    /// waker there, or an old one, and is polled once for nothing.
    pub fn wake_idle(&self) {
        let Ok(m) = self.inner.lock() else {
            return;
        };
        for s in m.values() {
            s.idle_waker.wake();
        }
    }

    pub fn remove(&self, id: u32) {
        if let Ok(mut m) = self.inner.lock() {
            if let Some(info) = m.remove(&id) {
                self.closed_commands
                    .fetch_add(info.activity(), Ordering::Relaxed);
            }
        }
    }

    /// Commands run so far by all sessions (a monotonic count) and whether one is handling
    /// a request right now. Polled once a second by the serverless idle timer.
    pub fn activity(&self) -> (u64, bool) {
        let Ok(m) = self.inner.lock() else {
            return (0, true);
        };
        let mut total = self.closed_commands.load(Ordering::Relaxed);
        let mut busy = false;
        for s in m.values() {
            total += s.activity();
            busy |= s.busy.load(Ordering::SeqCst);
        }
        (total, busy)
    }

    /// Whether no session is handling a request or has state to capture from the server
    /// (it does so within moments of going idle, and a pause must let it).
    pub fn none_busy(&self) -> bool {
        let Ok(m) = self.inner.lock() else {
            return false;
        };
        m.values()
            .all(|s| !s.busy.load(Ordering::SeqCst) && !s.capture_due.load(Ordering::SeqCst))
    }

    /// Sessions that could not survive a pause: those that could not move (open
    /// transaction, temporary table, lock...), and with `stop` (the server restarts), those
    /// whose login was relayed, which holdfast cannot repeat.
    pub fn pause_blockers(&self, stop: bool) -> Vec<String> {
        let Ok(m) = self.inner.lock() else {
            return vec!["session registry unavailable".into()];
        };
        let mut out: Vec<(u32, String)> = Vec::new();
        for s in m.values() {
            let blocker = s.blocker();
            let who = || {
                let user = s.user.lock().map(|u| u.to_string()).unwrap_or_default();
                format!("session {} ({user}@{})", s.id, s.client.ip())
            };
            if let Some(b) = blocker {
                out.push((s.id, format!("{}: {b}", who())));
            } else if stop && !s.can_reauthenticate.load(Ordering::Relaxed) {
                out.push((
                    s.id,
                    format!("{}: login was relayed (its auth plugin), holdfast cannot log in again after a stop", who()),
                ));
            }
        }
        out.sort_by_key(|(id, _)| *id);
        out.into_iter().map(|(_, s)| s).collect()
    }

    pub fn snapshot(&self) -> Vec<SessionView> {
        self.select(None, usize::MAX).1
    }

    /// The sessions open, and the views of the first `max` by id that `find` (lowercase)
    /// matches ([`SessionInfo::matches`]): only those are built.
    pub fn select(&self, find: Option<&str>, max: usize) -> (usize, Vec<SessionView>) {
        let mut infos: Vec<Arc<SessionInfo>> = match self.inner.lock() {
            Ok(m) => m.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        infos.sort_unstable_by_key(|i| i.id);
        let views = infos
            .iter()
            .filter(|i| find.is_none_or(|f| i.matches(f)))
            .take(max)
            .map(|i| i.view())
            .collect();
        (infos.len(), views)
    }

    /// Whether every session is parked or idle outside a transaction with its state
    /// captured: nothing in flight on the current primary that a switchover would cut, and
    /// nothing only the old primary knows.
    pub fn quiescent(&self) -> bool {
        let Ok(m) = self.inner.lock() else {
            return false;
        };
        m.values().all(|s| {
            s.parked.load(Ordering::SeqCst)
                || (!s.busy.load(Ordering::SeqCst)
                    && !s.capture_due.load(Ordering::SeqCst)
                    && !s.capture_deferred.load(Ordering::SeqCst)
                    && s.status.load(Ordering::SeqCst)
                        & holdfast_wire::caps::SERVER_STATUS_IN_TRANS
                        == 0)
        })
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: u32) -> Arc<SessionInfo> {
        let s = Arc::new(SessionInfo::new(id, "127.0.0.1:5000".parse().unwrap()));
        s.set_user(Arc::from("app"));
        s.can_reauthenticate.store(true, Ordering::Relaxed);
        s
    }

    /// Every session keeps one (issue 22: memory per idle session): with its `Arc`'s
    /// counts it fits a 256-byte heap chunk (it was 248 bytes with the user and node names
    /// as `String`s, and took 272).
    #[test]
    fn a_sessions_record_stays_small() {
        let size = std::mem::size_of::<SessionInfo>();
        assert!(size <= 232, "a SessionInfo is {size} bytes");
        let s = session(2);
        s.set_backend(&NodeName::from("node1"), 7);
        assert!(s.is_on("node1") && s.matches("node1") && s.matches("app"));
        assert_eq!(
            (s.view().user, s.view().backend),
            ("app".into(), "node1".into())
        );
    }

    /// The replay account as `/status` shows it, after each request's `set_replay`.
    #[test]
    fn the_replay_account_shows_the_last_reason_given() {
        let s = session(1);
        let shown = |s: &SessionInfo| (s.view().replay_held_bytes, s.view().replay_blocked_by);
        s.set_replay(0, None);
        assert_eq!(shown(&s), (0, None));
        s.set_replay(120, Some("a temporary table"));
        assert_eq!(shown(&s), (120, Some("a temporary table".to_string())));
        s.set_replay(160, Some("a temporary table"));
        assert_eq!(shown(&s), (160, Some("a temporary table".to_string())));
        s.set_replay(160, Some("larger than replay_max_bytes"));
        assert_eq!(
            shown(&s),
            (160, Some("larger than replay_max_bytes".to_string()))
        );
        s.set_replay(0, None);
        assert_eq!(shown(&s), (0, None));
    }

    #[test]
    fn activity_counts_commands_but_not_pings_and_survives_closes() {
        let r = SessionRegistry::default();
        let a = session(1);
        r.insert(a.clone());
        a.commands.store(5, Ordering::Relaxed);
        a.pings.store(2, Ordering::Relaxed);
        assert_eq!(r.activity(), (3, false));
        a.busy.store(true, Ordering::SeqCst);
        assert_eq!(r.activity(), (3, true));
        assert!(!r.none_busy());
        a.busy.store(false, Ordering::SeqCst);
        r.remove(1);
        // The closed session's count stays, so a close never looks like "no activity".
        assert_eq!(r.activity(), (3, false));
        let b = session(2);
        r.insert(b.clone());
        b.commands.store(1, Ordering::Relaxed);
        assert_eq!(r.activity(), (4, false));
        assert!(r.none_busy());
    }

    #[test]
    fn pause_blockers_name_the_session_and_the_reason() {
        let r = SessionRegistry::default();
        let idle = session(1);
        let in_txn = session(2);
        in_txn.set_blocker(Some(Blocker::OpenTransaction));
        let relayed = session(3);
        relayed.can_reauthenticate.store(false, Ordering::Relaxed);
        for s in [&idle, &in_txn, &relayed] {
            r.insert((*s).clone());
        }
        let freeze = r.pause_blockers(false);
        assert_eq!(freeze, vec!["session 2 (app@127.0.0.1): open transaction"]);
        let stop = r.pause_blockers(true);
        assert_eq!(stop.len(), 2, "{stop:?}");
        assert!(stop[1].starts_with("session 3 (app@127.0.0.1): login was relayed"));
        in_txn.set_blocker(Some(Blocker::PassThrough));
        assert!(r.pause_blockers(false)[0].ends_with("pass-through connection"));
    }
}
