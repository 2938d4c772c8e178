//! Replacing the running process with the binary found at its own path now, with no
//! connection attempt refused at any moment (`holdfast ctl upgrade`, `POST /upgrade`,
//! SIGUSR2).
//!
//! The old process starts the new binary with its own arguments and a private unix socket
//! to call back on (in a 0700 directory, named by [`HANDOVER_ENV`]). Over it:
//! 1. new → old: [`Message::Hello`], with the hand-over format it speaks;
//! 2. old → new: [`Message::Listeners`], the listening sockets themselves (`SCM_RIGHTS`),
//!    the next generation number and what the counters stood at;
//! 3. new → old: [`Message::Ready`] once it accepts on them (both accept until then: the
//!    kernel gives each connection to one);
//! 4. the old process stops accepting and lets go of HA (a running operation finishes
//!    first), then says [`Message::HaReleased`]: the new one takes charge of it;
//! 5. old → new: [`Message::Session`], each session as it reaches a safe point (idle,
//!    outside a transaction: see `session::handover`), with its sockets: the client's, the
//!    backend's, its replica connections' (TLS sessions continue in the new process,
//!    `holdfast_client::tls_resume`). The new process goes on with it, on the same server
//!    threads. A session whose send fails stays; if the new process dies, this one serves
//!    again ([`Upgrader::serve_again`]).
//!
//! Sessions that cannot be handed over stay on the old process until they end, or until
//! the drain window (`[proxy] cooldown_ms`) closes them; then it exits. Meanwhile a `KILL`
//! of a session the other process holds is found there ([`peer`], format 4). A new process that
//! speaks no format the old one knows is refused cleanly: the old one keeps serving, and
//! the upgrade fails with why. A new process of format 1 gets no sessions.

pub mod channel;
pub mod peer;

use crate::session::handover::{CarriedSession, HandedSession};
use crate::session::passthrough::CarriedRelay;
use crate::Shared;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// The hand-over format this build speaks (2: sessions are handed over; 3: pass-through
/// sessions too; 4: each asks the other where a session is, for a `KILL`).
pub const FORMAT: u32 = 5;
/// The first format whose processes take sessions over.
const SESSIONS_FORMAT: u32 = 2;
/// The first format whose processes take pass-through sessions over.
const RELAYS_FORMAT: u32 = 3;
/// The first format whose processes answer [`Message::Where`].
pub const PEER_FORMAT: u32 = 4;
/// Pass-through sessions relayed in the kernel go over with their sockmap.
const KERNEL_RELAYS_FORMAT: u32 = 5;
/// The oldest format it accepts from the process it takes over from.
pub const OLDEST_FORMAT: u32 = 1;

/// The environment variable that tells a process to take over from another: the path of
/// the old process's hand-over socket.
pub const HANDOVER_ENV: &str = "HOLDFAST_HANDOVER";

/// How long each step of a hand-over may take (the new process starting and binding
/// everything included).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// A message of the hand-over protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// New → old, first.
    Hello {
        format: u32,
        version: String,
        pid: u32,
    },
    /// Old → new: the listening sockets, in the order of the descriptors sent with it; the
    /// nodes holdfast fronts now (`node add` / `node remove` since the start included).
    Listeners {
        format: u32,
        generation: u64,
        sockets: Vec<Socket>,
        counters: Counters,
        members: Vec<holdfast_config::BackendConfig>,
    },
    /// New → old: it accepts on the listeners.
    Ready { pid: u32 },
    /// Old → new: HA is the new process's now, from this state on (counters, the last
    /// operation, nodes a failover left out, the failover cool-off).
    HaReleased {
        ha: Box<holdfast_cluster::ha::controller::HaCarried>,
        /// With `[serverless]`: the instance's lifecycle (pauses, resumes, scaling,
        /// metering) is the new process's too, from this size and these counters on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serverless: Option<crate::serverless::LifecycleCarried>,
    },
    /// Old → new: a live session, with its client's socket, its backend's when it is
    /// kept, and its replica connections' (in that order).
    Session { session: Box<CarriedSession> },
    /// Old → new: a pass-through session, with its client's socket and its backend's.
    Relay { relay: Box<CarriedRelay> },
    /// Either way, while both serve: where the session `id` is, if the other has it;
    /// `mark`: as the victim of a `KILL` of its connection about to run.
    Where {
        question: u64,
        id: u32,
        #[serde(default)]
        mark: bool,
    },
    /// The answer to [`Message::Where`] number `question`.
    Here {
        question: u64,
        at: Option<peer::Located>,
    },
    /// Either way: the `KILL` the session `id` was marked for (`Where` with `mark`) failed;
    /// its backend connection `thread` is not to be ended.
    Unmark { id: u32, thread: u32 },
    /// Either way: the other side gives up, and why.
    Refused { reason: String },
}

/// What a listening socket handed over is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Socket {
    pub role: Role,
    /// Its address as configured (`[proxy] listen`, a `[[listener]]`'s, `[admin] listen`).
    pub listen: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `[proxy] listen`.
    Proxy,
    /// A `[[listener]]`.
    Listener,
    /// `[admin] listen`.
    Admin,
}

/// Counters carried to the new process, so that rates do not jump back to zero.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counters {
    pub connections_accepted: u64,
    /// The old process's session id counter: the new one numbers its sessions past it,
    /// so that the ids of sessions handed over stay unique.
    #[serde(default)]
    pub next_session_id: u32,
}

/// Why an upgrade did not happen (the old process keeps serving).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("an upgrade is already running")]
    AlreadyRunning,
    #[error("this process has already handed over to process {0}")]
    HandedOver(u32),
    #[error("cannot tell this process's executable: {0}")]
    NoExecutable(std::io::Error),
    #[error("preparing the hand-over socket in {dir}: {source}")]
    Socket {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("the new process exited ({0}) before it took over; its log says why")]
    Exited(String),
    #[error("the new process did not {0} within {1:?}")]
    Timeout(&'static str, Duration),
    #[error(
        "the new process speaks hand-over format {0}; this one knows {OLDEST_FORMAT} to {FORMAT}"
    )]
    Format(u32),
    #[error("the new process refused: {0}")]
    Refused(String),
    #[error("the hand-over channel: {0}")]
    Channel(String),
}

/// What an upgrade did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpgradeReport {
    /// The new process.
    pub pid: u32,
    pub version: String,
    pub generation: u64,
    /// Sessions open on the old process when the new one took over: each goes over at its
    /// next safe point, or ends there (or is closed when the drain window passes).
    pub sessions_left: usize,
}

/// A process's side of upgrades: the executable and arguments to start, the listening
/// sockets to hand over, the generation.
pub struct Upgrader {
    exe: Option<PathBuf>,
    args: Vec<OsString>,
    generation: AtomicU64,
    running: AtomicBool,
    /// Listening sockets (duplicates of the ones accepting), registered at start.
    sockets: Mutex<Vec<(Socket, OwnedFd)>>,
    /// The new process's pid once it accepts: this one stops accepting.
    handed_over: watch::Sender<Option<u32>>,
    /// Where sessions give themselves up once the new process takes them.
    session_sink: watch::Sender<Option<Arc<SessionChannel>>>,
    /// The other process while both serve (this one's predecessor or successor).
    peer: arc_swap::ArcSwapOption<peer::Peer>,
}

impl Default for Upgrader {
    fn default() -> Self {
        Upgrader {
            exe: std::env::current_exe().ok(),
            args: std::env::args_os().skip(1).collect(),
            generation: AtomicU64::new(1),
            running: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            handed_over: watch::Sender::new(None),
            session_sink: watch::Sender::new(None),
            peer: arc_swap::ArcSwapOption::empty(),
        }
    }
}

impl Upgrader {
    /// This process's generation: 1 for a process started by hand, one more than the
    /// process it took over from.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub(crate) fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// Keeps a duplicate of a listening socket to hand over.
    pub fn register(&self, role: Role, listen: &str, socket: &impl AsFd) -> std::io::Result<()> {
        let fd = socket.as_fd().try_clone_to_owned()?;
        if let Ok(mut sockets) = self.sockets.lock() {
            sockets.push((
                Socket {
                    role,
                    listen: listen.to_owned(),
                },
                fd,
            ));
        }
        Ok(())
    }

    /// The registered sockets, with descriptors of their own to send.
    fn sockets_to_send(&self) -> Result<(Vec<Socket>, Vec<OwnedFd>), UpgradeError> {
        let sockets = self
            .sockets
            .lock()
            .map_err(|_| UpgradeError::Channel("the socket list is poisoned".into()))?;
        let mut list = Vec::new();
        let mut fds = Vec::new();
        for (socket, fd) in sockets.iter() {
            list.push(socket.clone());
            fds.push(
                fd.try_clone()
                    .map_err(|e| UpgradeError::Channel(e.to_string()))?,
            );
        }
        Ok((list, fds))
    }

    /// Resolves once this process has handed its listeners over (with the new pid).
    pub fn handed_over(&self) -> watch::Receiver<Option<u32>> {
        self.handed_over.subscribe()
    }

    /// Set once the new process takes sessions: where a session at a safe point gives
    /// itself up.
    pub fn session_sink(&self) -> watch::Receiver<Option<Arc<SessionChannel>>> {
        self.session_sink.subscribe()
    }

    /// The other process while both serve after an upgrade: asked where a session of
    /// holdfast's id is when this one has none of it (a `KILL`).
    pub fn peer(&self) -> Option<Arc<peer::Peer>> {
        self.peer.load_full()
    }

    /// The process this one handed over to exited while this one still runs: the
    /// sessions it took went with it; this one accepts again, runs HA again, keeps the
    /// sessions it still holds, and can be upgraded again.
    fn serve_again(&self, shared: &Shared, status: std::io::Result<std::process::ExitStatus>) {
        let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
        tracing::error!(%status, handed_over = shared.metrics.sessions_handed_over.get(), "upgrade: the new process exited; this one serves again (the sessions it took are lost with it)");
        self.session_sink.send_replace(None);
        self.peer.store(None);
        self.handed_over.send_replace(None);
        // It left the fleet as it handed over: back in, campaigning again.
        if let Some(fleet) = &shared.fleet {
            fleet.rejoin();
        }
        // (In a fleet, only while this member still leads it.)
        if shared
            .fleet
            .as_ref()
            .is_none_or(|f| f.leadership().borrow().leader)
        {
            shared.ha.take_charge();
            if let Some(lc) = &shared.serverless {
                lc.take_charge();
            }
        }
    }

    /// Starts the binary at this process's executable path and hands it the listeners
    /// (see the module documentation). On success this process no longer accepts; its
    /// sessions go over as each reaches a safe point, and those that cannot stay until
    /// they end or the drain window passes.
    pub async fn upgrade(&self, shared: &Arc<Shared>) -> Result<UpgradeReport, UpgradeError> {
        if let Some(pid) = *self.handed_over.borrow() {
            return Err(UpgradeError::HandedOver(pid));
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return Err(UpgradeError::AlreadyRunning);
        }
        let result = self.run(shared).await;
        self.running.store(false, Ordering::Release);
        if let Err(e) = &result {
            tracing::error!(error = %e, "upgrade failed; this process keeps serving");
        }
        result
    }

    async fn run(&self, shared: &Arc<Shared>) -> Result<UpgradeReport, UpgradeError> {
        let exe = self.exe.clone().ok_or_else(|| {
            UpgradeError::NoExecutable(std::io::Error::other("no path for /proc/self/exe"))
        })?;
        // A file replaced since this process started: the link names the old one
        // "(deleted)"; the path is the new binary's.
        let exe = PathBuf::from(
            exe.to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_string(),
        );
        let dir = private_dir()?;
        let path = dir.path.join("handover.sock");
        let listener = UnixListener::bind(&path).map_err(|source| UpgradeError::Socket {
            dir: dir.path.clone(),
            source,
        })?;
        tracing::info!(exe = %exe.display(), generation = self.generation() + 1, "upgrade: starting the new process");
        let mut child = tokio::process::Command::new(&exe)
            .args(&self.args)
            .env(HANDOVER_ENV, &path)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(false)
            .spawn()
            .map_err(|source| UpgradeError::Spawn {
                exe: exe.clone(),
                source,
            })?;
        let outcome = self.hand_over(shared, &listener, &mut child).await;
        drop(listener);
        drop(dir);
        if outcome.is_err() {
            // It must not go on with half of what it needs (it may hold the listeners).
            let _ = child.start_kill();
        }
        // Reaped whenever it exits, for as long as this process lives; if it took over
        // and exits while this one is still here, this one serves again.
        let took_over = outcome.as_ref().ok().map(|r| r.pid);
        let shared = shared.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // A new process that exits cleanly was stopped, or handed over in turn to a
            // newer one (which serves now): this one does not come back then, only after
            // a crash or a kill.
            let died = !status.as_ref().is_ok_and(|s| s.success());
            if died && took_over.is_some() && *shared.upgrader.handed_over.borrow() == took_over {
                shared.upgrader.serve_again(&shared, status);
            } else if took_over.is_some() {
                tracing::info!(status = ?status, "upgrade: the process this one handed over to exited cleanly");
            }
        });
        outcome
    }

    async fn hand_over(
        &self,
        shared: &Arc<Shared>,
        listener: &UnixListener,
        child: &mut tokio::process::Child,
    ) -> Result<UpgradeReport, UpgradeError> {
        let stream = tokio::select! {
            accepted = tokio::time::timeout(STEP_TIMEOUT, listener.accept()) => match accepted {
                Ok(Ok((stream, _))) => stream,
                Ok(Err(e)) => return Err(UpgradeError::Channel(e.to_string())),
                Err(_) => return Err(UpgradeError::Timeout("call back", STEP_TIMEOUT)),
            },
            status = child.wait() => {
                return Err(UpgradeError::Exited(status.map_or_else(|e| e.to_string(), |s| s.to_string())));
            }
        };
        let (pid, version, format) = match receive(&stream, "say hello").await?.0 {
            Message::Hello {
                format,
                version,
                pid,
            } => {
                if !(OLDEST_FORMAT..=FORMAT).contains(&format) {
                    let reason = format!(
                        "this process speaks hand-over format {FORMAT} (and from {OLDEST_FORMAT}), not {format}"
                    );
                    let _ = send(&stream, &Message::Refused { reason }, &[]).await;
                    return Err(UpgradeError::Format(format));
                }
                (pid, version, format)
            }
            other => return Err(unexpected(other)),
        };
        let generation = self.generation() + 1;
        let counters = Counters {
            connections_accepted: shared.metrics.connections_accepted.get(),
            next_session_id: shared.session_id_counter(),
        };
        let (list, fds) = self.sockets_to_send()?;
        let members = shared
            .membership
            .members
            .borrow()
            .iter()
            .filter(|m| !m.draining)
            .map(|m| m.backend.clone())
            .collect();
        let listeners = Message::Listeners {
            format: FORMAT,
            generation,
            sockets: list,
            counters,
            members,
        };
        let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
        send(&stream, &listeners, &borrowed).await?;
        drop(fds);
        match receive(&stream, "start serving").await?.0 {
            Message::Ready { .. } => {}
            Message::Refused { reason } => return Err(UpgradeError::Refused(reason)),
            other => return Err(unexpected(other)),
        }
        // From here the new process serves: this one stops accepting and lets go of HA.
        self.handed_over.send_replace(Some(pid));
        shared.ha.release().await;
        if let Some(lc) = &shared.serverless {
            // (Before leaving a fleet: no pause of this process's starts once another
            // member leads.)
            lc.release().await;
        }
        if let Some(fleet) = &shared.fleet {
            // The successor (a member of the same name) is elected at once, not when
            // this process's lease runs out.
            fleet.leave().await;
        }
        let ha = Box::new(shared.ha.carried().await);
        // The serverless lifecycle goes with HA: the action under way finishes, the open
        // usage period is written, and the new process continues from there.
        let serverless = match &shared.serverless {
            Some(lc) => {
                if let Err(e) = crate::serverless::flush_usage(shared).await {
                    tracing::warn!(error = %e, "upgrade: writing the open usage period failed (the new process meters from the ledger as it is)");
                }
                Some(lc.carried())
            }
            None => None,
        };
        if let Err(e) = send(&stream, &Message::HaReleased { ha, serverless }, &[]).await {
            tracing::warn!(error = %e, "upgrade: the new process did not hear that HA is its own (it takes charge when this process exits)");
        }
        let sessions_left = shared.open_connections();
        tracing::info!(pid, %version, generation, sessions_left, "upgrade: the new process serves; this one hands its sessions over or drains them");
        let peer = peer::Peer::new(stream, format >= PEER_FORMAT);
        self.peer.store(Some(peer.clone()));
        tokio::spawn(read_from_successor(peer.clone(), shared.clone()));
        if format >= SESSIONS_FORMAT {
            self.session_sink
                .send_replace(Some(Arc::new(SessionChannel::new(peer, format))));
        }
        Ok(UpgradeReport {
            pid,
            version,
            generation,
            sessions_left,
        })
    }
}

/// [`Message::Session`] as written, without a copy of the session.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Outgoing<'a> {
    Session { session: &'a CarriedSession },
    Relay { relay: &'a CarriedRelay },
}

/// A pass-through session given up: its state and both sockets.
pub struct HandedRelay {
    pub carried: CarriedRelay,
    pub client: std::net::TcpStream,
    pub backend: std::net::TcpStream,
    /// The sockmap the pair is spliced in, when it is relayed in the kernel.
    pub kernel_map: Option<std::os::fd::OwnedFd>,
}

/// How long sending one session to the new process may take: it reads them as they come.
const SESSION_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The old process's end of the hand-over channel, once the new process takes sessions:
/// each session at a safe point sends itself, one at a time.
pub struct SessionChannel {
    peer: Arc<peer::Peer>,
    /// A send failed (the new process went, or stopped reading): sessions stay here.
    broken: AtomicBool,
    /// The new process's hand-over format.
    format: u32,
}

impl SessionChannel {
    fn new(peer: Arc<peer::Peer>, format: u32) -> Self {
        SessionChannel {
            peer,
            broken: AtomicBool::new(false),
            format,
        }
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Whether the new process takes pass-through sessions.
    pub fn takes_relays(&self) -> bool {
        self.format >= RELAYS_FORMAT
    }

    /// Whether the new process takes pass-through sessions relayed in the kernel (with
    /// their sockmap).
    pub fn takes_kernel_relays(&self) -> bool {
        self.format >= KERNEL_RELAYS_FORMAT
    }

    /// Sends a pass-through session; given back when it did not go.
    pub async fn send_relay(&self, handed: HandedRelay) -> Result<(), HandedRelay> {
        if self.is_broken() {
            return Err(handed);
        }
        let body = match serde_json::to_vec(&Outgoing::Relay {
            relay: &handed.carried,
        }) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session = handed.carried.relay.id, error = %e, "upgrade: a pass-through session could not be written down; it stays");
                return Err(handed);
            }
        };
        let mut fds = vec![handed.client.as_fd(), handed.backend.as_fd()];
        fds.extend(handed.kernel_map.as_ref().map(|m| m.as_fd()));
        let sent = self.send_body(body, &fds).await;
        match sent {
            Ok(()) => Ok(()),
            Err(why) => {
                tracing::error!(session = handed.carried.relay.id, error = %why, "upgrade: the new process does not take sessions; they stay in this process");
                Err(handed)
            }
        }
    }

    /// Sends one message with its descriptors, within [`SESSION_SEND_TIMEOUT`]; a failure
    /// marks the channel broken. The body (which may hold secrets) is zeroized.
    async fn send_body(
        &self,
        mut body: Vec<u8>,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(), String> {
        let sent = tokio::time::timeout(SESSION_SEND_TIMEOUT, self.peer.send(&body, fds)).await;
        zeroize::Zeroize::zeroize(&mut body);
        match sent {
            Ok(Ok(())) => Ok(()),
            failed => {
                self.broken.store(true, Ordering::Release);
                Err(match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("not read within {SESSION_SEND_TIMEOUT:?}"),
                })
            }
        }
    }

    /// Sends a session (what holdfast knows of it, its sockets). The session is given
    /// back when it did not go: it stays in this process.
    pub async fn send(&self, handed: HandedSession) -> Result<(), HandedSession> {
        if self.is_broken() {
            return Err(handed);
        }
        let mut body = match serde_json::to_vec(&Outgoing::Session {
            session: &handed.carried,
        }) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session = handed.carried.id, error = %e, "upgrade: a session could not be written down; it stays");
                return Err(handed);
            }
        };
        let mut fds = vec![handed.client.as_fd()];
        fds.extend(handed.backend.as_ref().map(|b| b.as_fd()));
        fds.extend(handed.readers.iter().map(|r| r.as_fd()));
        // (The body holds the session's re-authentication secret: zeroized there.)
        let sent = self.send_body(std::mem::take(&mut body), &fds).await;
        drop(fds);
        match sent {
            Ok(()) => Ok(()),
            Err(why) => {
                tracing::error!(session = handed.carried.id, error = %why, "upgrade: the new process does not take sessions; they stay in this process");
                Err(handed)
            }
        }
    }
}

/// The new process's side, from start until it serves.
pub struct TakeOver {
    stream: UnixStream,
    /// The old process's hand-over format.
    format: u32,
    pub generation: u64,
    pub counters: Counters,
    sockets: Vec<(Socket, OwnedFd)>,
    members: Vec<holdfast_config::BackendConfig>,
}

impl TakeOver {
    /// Calls the old process back at `path` and receives its listening sockets.
    pub async fn connect(path: &Path) -> Result<TakeOver, UpgradeError> {
        let stream = tokio::time::timeout(STEP_TIMEOUT, UnixStream::connect(path))
            .await
            .map_err(|_| UpgradeError::Timeout("answer", STEP_TIMEOUT))?
            .map_err(|e| UpgradeError::Channel(format!("{}: {e}", path.display())))?;
        let hello = Message::Hello {
            format: FORMAT,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
        };
        send(&stream, &hello, &[]).await?;
        let (message, fds) = receive(&stream, "hand its listeners over").await?;
        match message {
            Message::Listeners {
                format,
                generation,
                sockets,
                counters,
                members,
            } => {
                if sockets.len() != fds.len() {
                    return Err(UpgradeError::Channel(format!(
                        "{} sockets named, {} received",
                        sockets.len(),
                        fds.len()
                    )));
                }
                Ok(TakeOver {
                    stream,
                    format,
                    generation,
                    counters,
                    sockets: sockets.into_iter().zip(fds).collect(),
                    members,
                })
            }
            Message::Refused { reason } => Err(UpgradeError::Refused(reason)),
            other => Err(unexpected(other)),
        }
    }

    /// The listening socket handed over for `role` at `listen`, as a std listener (non
    /// blocking, for tokio).
    pub fn take(&mut self, role: Role, listen: &str) -> Option<std::net::TcpListener> {
        let at = self
            .sockets
            .iter()
            .position(|(s, _)| s.role == role && s.listen == listen)?;
        let (_, fd) = self.sockets.swap_remove(at);
        let listener = std::net::TcpListener::from(fd);
        listener.set_nonblocking(true).ok()?;
        Some(listener)
    }

    /// Tells the old process this one serves, then waits (in the background) for it to
    /// let go of HA, and takes charge of HA then, or when the old process is gone.
    pub async fn ready(mut self, shared: Arc<Shared>) -> Result<(), UpgradeError> {
        // Sockets the configuration no longer names are closed here.
        for (socket, _) in self.sockets.drain(..) {
            tracing::info!(role = ?socket.role, listen = %socket.listen, "upgrade: a listener the configuration no longer names is closed");
        }
        // The nodes as the old process fronts them (added or removed since its start).
        let members = std::mem::take(&mut self.members);
        if !members.is_empty() {
            let applied = shared.membership.apply_backends(&members).await;
            if !(applied.added.is_empty()
                && applied.removing.is_empty()
                && applied.refused.is_empty())
            {
                tracing::info!(added = ?applied.added, removing = ?applied.removing, refused = ?applied.refused, "upgrade: nodes as the previous process had them");
            }
        }
        let ready = Message::Ready {
            pid: std::process::id(),
        };
        send(&self.stream, &ready, &[]).await?;
        tokio::spawn(async move {
            match receive(&self.stream, "let go of HA").await {
                Ok((Message::HaReleased { ha, serverless }, _)) => {
                    shared.ha.adopt(*ha).await;
                    if let (Some(lc), Some(carried)) = (&shared.serverless, &serverless) {
                        lc.adopt(carried);
                    }
                }
                Ok((other, _)) => {
                    tracing::warn!(message = ?other, "upgrade: unexpected message; taking charge of HA")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "upgrade: the old process went before it let go of HA; taking charge of it")
                }
            }
            // (The peer first: while it is there, the instance is not paused under the
            // old process's sessions.)
            let peer = peer::Peer::new(self.stream, self.format >= PEER_FORMAT);
            shared.upgrader.peer.store(Some(peer.clone()));
            if shared.fleet.is_none() {
                shared.ha.take_charge();
                if let Some(lc) = &shared.serverless {
                    lc.take_charge();
                }
                tracing::info!("upgrade: in charge of HA");
            } else {
                // In a fleet, HA (and a serverless lifecycle) is the elected leader's (the
                // old process left the fleet as it let go: this one, campaigning under the
                // same name, may be it).
                tracing::info!("upgrade: HA is the fleet leader's");
            }
            receive_sessions(&peer, &shared).await;
            peer.went();
            // (A newer process may have taken this one's place as the other one's peer.)
            let _ = shared.upgrader.peer.compare_and_swap(&Some(peer), None);
        });
        Ok(())
    }
}

/// The old process's reading of the channel once the new one serves: the new process's
/// questions (a `KILL`), until it closes the channel (it exits).
async fn read_from_successor(peer: Arc<peer::Peer>, shared: Arc<Shared>) {
    loop {
        let received = match peer.recv().await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade: the channel to the new process failed");
                break;
            }
        };
        match serde_json::from_slice::<Message>(&received.body) {
            Ok(message) => {
                if let Some(other) = peer.take(&shared, message) {
                    tracing::warn!(message = ?other, "upgrade: unexpected message from the new process");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "upgrade: an unreadable message from the new process")
            }
        }
    }
    peer.went();
    let _ = shared.upgrader.peer.compare_and_swap(&Some(peer), None);
}

/// Goes on with each session the old process hands over, and answers its questions,
/// until it closes the channel (it exits).
async fn receive_sessions(peer: &Arc<peer::Peer>, shared: &Arc<Shared>) {
    loop {
        let received = match peer.recv().await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "upgrade: the hand-over channel failed; sessions still on the previous process end there");
                return;
            }
        };
        let mut body = received.body;
        let message = serde_json::from_slice::<Message>(&body);
        zeroize::Zeroize::zeroize(&mut body);
        let session = match message {
            Ok(Message::Session { session }) => session,
            Ok(Message::Relay { relay }) => {
                let mut fds = received.fds.into_iter();
                let map = match relay.in_kernel {
                    true => fds.next_back(),
                    false => None,
                };
                let mut fds = fds.map(std::net::TcpStream::from);
                match (fds.next(), fds.next(), fds.next(), relay.in_kernel == map.is_some()) {
                    (Some(client), Some(backend), None, true) => {
                        crate::resume_relay(shared.clone(), *relay, client, backend, map);
                    }
                    _ => tracing::error!(
                        session = relay.relay.id,
                        "upgrade: a pass-through session came without its two sockets; its connections close"
                    ),
                }
                continue;
            }
            Ok(other) => {
                if let Some(other) = peer.take(shared, other) {
                    tracing::warn!(message = ?other, "upgrade: unexpected message after the hand-over");
                }
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "upgrade: an unreadable session; its connections close");
                continue;
            }
        };
        let expected = 1 + usize::from(session.backend_kept()) + session.readers();
        if received.fds.len() != expected {
            tracing::error!(
                session = session.id,
                expected,
                received = received.fds.len(),
                "upgrade: a session came without all its sockets; its connections close"
            );
            continue;
        }
        let mut fds = received.fds.into_iter().map(std::net::TcpStream::from);
        let Some(client) = fds.next() else {
            continue;
        };
        let backend = match session.backend_kept() {
            true => fds.next(),
            false => None,
        };
        crate::resume_session(shared.clone(), *session, client, backend, fds.collect());
    }
}

/// A 0700 directory of its own under the temporary directory, removed when dropped.
struct PrivateDir {
    path: PathBuf,
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn private_dir() -> Result<PrivateDir, UpgradeError> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let name = format!(
        "holdfast-upgrade-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    let path = base.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|source| UpgradeError::Socket {
            dir: path.clone(),
            source,
        })?;
    Ok(PrivateDir { path })
}

async fn send(
    stream: &UnixStream,
    message: &Message,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<(), UpgradeError> {
    let body = serde_json::to_vec(message).map_err(|e| UpgradeError::Channel(e.to_string()))?;
    channel::send(stream, &body, fds)
        .await
        .map_err(|e| UpgradeError::Channel(e.to_string()))
}

async fn receive(
    stream: &UnixStream,
    what: &'static str,
) -> Result<(Message, Vec<OwnedFd>), UpgradeError> {
    let received = tokio::time::timeout(STEP_TIMEOUT, channel::recv(stream))
        .await
        .map_err(|_| UpgradeError::Timeout(what, STEP_TIMEOUT))?
        .map_err(|e| UpgradeError::Channel(e.to_string()))?
        .ok_or_else(|| {
            UpgradeError::Channel(format!("closed before the other process would {what}"))
        })?;
    let message = serde_json::from_slice(&received.body)
        .map_err(|e| UpgradeError::Channel(format!("an unreadable message: {e}")))?;
    Ok((message, received.fds))
}

fn unexpected(message: Message) -> UpgradeError {
    UpgradeError::Channel(format!("unexpected message {message:?}"))
}
