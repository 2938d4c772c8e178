//! The holdfast proxy: client sessions, backend connections, authentication from the
//! servers' own verifiers, serverless pausing, and the metrics and registry the admin API
//! reads. The nodes themselves (topology monitor, membership, HA, the start-up check) are
//! `holdfast-cluster`'s; this crate starts its tasks and reacts to what it publishes.

pub mod admission;
pub mod backend;
pub mod client_trackers;
/// The TOML configuration lives in the `holdfast-config` leaf crate; re-exported so that
/// `crate::config::X` paths stay as they were.
pub use holdfast_config as config;
pub mod conn;
pub mod error;
pub mod events;
pub mod gate;
pub mod idle_wake;
pub mod kernel_relay;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod parking;
pub mod registry;
pub mod reload;
pub mod restore;
pub mod serverless;
pub mod session;
pub mod session_threads;
pub mod state;
pub mod tls;
pub mod upgrade;
pub mod verifiers;

use config::net::IpNet;
use config::{Config, ListenerMode, Routing};
use holdfast_cluster::driver::NodeDriver;
use holdfast_cluster::ha::controller::HaController;
use holdfast_cluster::ha::{HaError, SwitchoverReport};
use holdfast_cluster::membership::Membership;
use holdfast_cluster::monitor::ProbeGate;
use holdfast_cluster::planned::{Planned, RestartError, SessionDrain};
use holdfast_cluster::preflight;
use holdfast_cluster::topology::Topology;
use holdfast_cluster::{ClusterTasks, LiveConfig};
use holdfast_serverless::driver::InstanceDriver;
use metrics::Metrics;
use registry::SessionRegistry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use verifiers::VerifierCache;

/// State shared by every session, read without locks on the query path.
pub struct Shared {
    /// The configuration in force ([`Shared::config`]); a reload replaces it whole
    /// ([`reload`]).
    live: LiveConfig,
    /// Where the configuration came from, and the reload path.
    pub reloader: reload::Reloader,
    /// The log filter `[log] level` sets, when the embedder installed one
    /// ([`logging::LogLevel::install`]; `holdfast serve` does).
    pub log_level: std::sync::OnceLock<Arc<logging::LogLevel>>,
    /// Client connections open now, against `[proxy] max_connections`.
    connections: Arc<ConnectionSlots>,
    pub metrics: Metrics,
    /// The HA and serverless events, for `/status` and the dashboard.
    pub events: events::EventLog,
    pub verifiers: VerifierCache,
    /// Each server's system variable types, for restoring sessions there.
    pub variable_types: restore::TypesCache,
    /// User names and connection attributes, shared between the sessions that log in with
    /// the same ([`holdfast_wire::interned`]).
    pub user_names: holdfast_wire::interned::Interner<str>,
    pub login_texts: holdfast_wire::interned::Interner<[u8]>,
    pub topology: watch::Receiver<Arc<Topology>>,
    pub sessions: Arc<SessionRegistry>,
    pub started: Instant,
    /// Switchover / failover / rejoin, one at a time; the failure detector in managed mode.
    pub ha: Arc<HaController>,
    /// True while a planned switchover runs: sessions at a safe point hold their requests.
    pub switching: watch::Sender<bool>,
    /// How nodes are restarted (upgrade, resize); none means restart/resize are refused.
    pub node_driver: Option<Arc<dyn NodeDriver>>,
    /// Mirror of `switching` that sessions read per request without a lock.
    pub switching_now: std::sync::atomic::AtomicBool,
    /// The serverless instance's lifecycle, with `[serverless]`.
    pub serverless: Option<Arc<serverless::Lifecycle>>,
    /// What sessions ask before a request reaches a server: the lifecycle with
    /// `[serverless]`, always open without.
    pub gate: Arc<dyn gate::BackendGate>,
    /// The usage ledger, with `[serverless]`.
    pub ledger: Option<Arc<holdfast_serverless::ledger::Ledger>>,
    /// How sessions open their backend connections (login and moves): TCP unless
    /// [`Seams::backend_connector`] puts another in place.
    pub connector: Arc<dyn backend::BackendConnector>,
    /// Per-address connection and login limits, failed-login delays.
    pub admission: Arc<admission::Admission>,
    /// TLS offered to clients (`[tls]` with a certificate); set by [`Proxy::start_with`].
    pub client_tls: Option<Arc<tls::ClientTls>>,
    /// `[ha] commit_markers` is on and the marker table exists (see `holdfast_cluster::ha::markers`).
    pub commit_markers_ready: Arc<std::sync::atomic::AtomicBool>,
    /// The nodes holdfast fronts (the `[[backend]]`s, then `node add` / `node remove`),
    /// the file their list is reloaded from.
    pub membership: Arc<Membership>,
    /// What the start-up check found (`holdfast check`): none until it has run.
    pub preflight: arc_swap::ArcSwapOption<preflight::Report>,
    /// The monitor's own connections to the nodes, as of its last round (see
    /// `holdfast_cluster::monitor::MonitorLinks`); [`Proxy::start_with`] connects it.
    pub monitor_links: watch::Receiver<Arc<holdfast_cluster::monitor::MonitorLinks>>,
    /// This process's upgrades: what it hands over, its generation.
    pub upgrader: upgrade::Upgrader,
    /// What wakes idle sessions: the topology, `switching` and the upgrader's hand-over,
    /// as one watch.
    pub idle_wake: idle_wake::IdleWake,
    /// Gives what idle sessions freed back to the system.
    pub memory: memory::Trim,
    /// The thread for sockets out of the reactor: spliced pairs' ends, parked idle sockets.
    pub socket_watcher: kernel_relay::SocketWatcher,
    /// Admin API connections being served (an upgraded process answers them before it
    /// exits).
    pub admin_connections: Arc<std::sync::atomic::AtomicUsize>,
    /// This process as a member of a fleet (`[cluster]`): HA is run by the fleet's leader
    /// only.
    pub fleet: Option<Arc<holdfast_fleet::Fleet>>,
    /// The same, as planned switchovers and HA operations ask it.
    fleet_link: Option<FleetLink>,
    /// Pass-through sessions relayed in the kernel (`[proxy] kernel_relay`).
    pub kernel_relays: kernel_relay::KernelRelays,
    next_session_id: AtomicU32,
    /// Where accepted sessions run ([`Seams::session_threads`]); on the accepting runtime
    /// without.
    session_threads: Option<Arc<session_threads::SessionThreads>>,
}

/// The fleet as HA asks it: an operation asks etcd first whether this member still
/// leads; a planned switchover holds the other members' sessions too.
struct FleetLink(Arc<holdfast_fleet::Fleet>);

impl holdfast_cluster::ha::controller::ChargeCheck for FleetLink {
    fn still_in_charge(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(self.0.confirm_leading())
    }
}

impl holdfast_cluster::planned::FleetBarrier for FleetLink {
    fn begin(&self) -> holdfast_cluster::planned::BoxFuture<'_, Option<i64>> {
        Box::pin(async move {
            let epoch = self.0.leadership().borrow().epoch;
            self.0.begin_switching().await.then_some(epoch)
        })
    }

    fn all_parked(&self, epoch: i64) -> holdfast_cluster::planned::BoxFuture<'_, bool> {
        Box::pin(self.0.all_parked(epoch))
    }

    fn end(&self, new_primary: Option<String>) -> holdfast_cluster::planned::BoxFuture<'_, ()> {
        Box::pin(async move {
            self.0.end_switching(new_primary).await;
        })
    }
}

/// A member's share of the leader's switchover: its sessions hold their requests at safe
/// points once the leader says one starts, it says so when they all do (or its drain
/// window passed), and it lets them go once the leader says it is over and this member's
/// monitor sees the new primary (or the leader is gone).
async fn hold_for_the_fleet(shared: Arc<Shared>, fleet: Arc<holdfast_fleet::Fleet>) {
    let mut switching = fleet.switching();
    let mut held: Option<i64> = None;
    let release = |shared: &Shared| {
        shared.switching_now.store(false, Ordering::SeqCst);
        shared.switching.send_replace(false);
    };
    loop {
        let now = switching.borrow_and_update().clone();
        match now {
            Some(s) if s.by != fleet.member() && !s.done && held != Some(s.epoch) => {
                tracing::info!(leader = %s.by, "fleet: the leader switches over; sessions hold at safe points");
                shared.switching_now.store(true, Ordering::SeqCst);
                shared.switching.send_replace(true);
                held = Some(s.epoch);
                let drain = Duration::from_millis(shared.config().proxy.switchover_drain_ms);
                let start = std::time::Instant::now();
                while !shared.sessions.quiescent() && start.elapsed() < drain {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tracing::info!(
                    ms = start.elapsed().as_millis() as u64,
                    parked = shared.sessions.quiescent(),
                    "fleet: this member's sessions are held for the switchover"
                );
                fleet.say_parked(s.epoch, true).await;
            }
            Some(s) if s.done && held == Some(s.epoch) => {
                if let Some(primary) = &s.new_primary {
                    holdfast_cluster::planned::wait_for_primary(&shared.topology, primary).await;
                }
                release(&shared);
                fleet.say_parked(s.epoch, false).await;
                held = None;
                tracing::info!(primary = ?s.new_primary, "fleet: the switchover is over; sessions go on");
            }
            None if held.is_some() => {
                tracing::warn!("fleet: the leader's switchover went without an end (the leader is gone); sessions go on");
                release(&shared);
                held = None;
            }
            _ => {}
        }
        if switching.changed().await.is_err() {
            return;
        }
    }
}

/// Runs HA while this process leads its fleet: in charge when elected, letting go (an
/// operation under way finishes first) when it no longer leads.
async fn follow_the_fleet(
    shared: Arc<Shared>,
    mut leadership: watch::Receiver<holdfast_fleet::Leadership>,
) {
    let mut leading = false;
    loop {
        let now = *leadership.borrow_and_update();
        if now.leader && !leading {
            tracing::info!(
                epoch = now.epoch,
                "fleet: this member leads; in charge of HA"
            );
            shared.ha.take_charge();
            if let Some(lc) = &shared.serverless {
                lc.take_charge();
            }
        } else if !now.leader && leading {
            tracing::warn!("fleet: this member no longer leads; HA is left to the leader");
            shared.ha.release().await;
            if let Some(lc) = &shared.serverless {
                lc.release().await;
            }
        }
        leading = now.leader;
        if leadership.changed().await.is_err() {
            return;
        }
    }
}

/// Puts each HA operation this member runs while it leads into the fleet's decision log
/// (who, under which epoch, what came of it), where every member's `ctl status` shows it.
async fn record_the_fleets_decisions(shared: Arc<Shared>, fleet: Arc<holdfast_fleet::Fleet>) {
    let mut ha = shared.ha.subscribe();
    let mut recorded = ha.borrow().last.as_ref().map(|l| l.finished_unix_ms);
    while ha.changed().await.is_ok() {
        let (last, primary) = {
            let state = ha.borrow_and_update();
            (state.last.clone(), state.watching.clone())
        };
        let Some(last) = last else {
            continue;
        };
        if recorded == Some(last.finished_unix_ms) {
            continue;
        }
        recorded = Some(last.finished_unix_ms);
        let standing = *fleet.leadership().borrow();
        let decision = holdfast_fleet::Decision {
            at_unix_ms: last.finished_unix_ms,
            by: fleet.member().to_string(),
            epoch: standing.epoch,
            what: format!(
                "{}{}: {}",
                last.operation,
                if last.automatic { " (automatic)" } else { "" },
                last.summary
            ),
            ok: last.ok,
        };
        if last.ok {
            if let Some(node) = primary {
                // The other members probe their nodes at once and see it.
                fleet.say_primary(&node).await;
            }
        }
        if !fleet.record_decision(&decision).await {
            tracing::warn!(what = %decision.what, "fleet: could not record a decision in etcd");
        }
    }
}

/// Keeps this member's session count in its fleet registration (`ctl status` on any
/// member lists every member's).
async fn tell_the_fleet_the_sessions(shared: Arc<Shared>, fleet: Arc<holdfast_fleet::Fleet>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        fleet.set_sessions(shared.open_connections() as u64);
    }
}

/// When the leader says it made a node the primary, this member's monitor probes the
/// nodes at once instead of at its next round.
async fn follow_the_primary_said(shared: Arc<Shared>, fleet: Arc<holdfast_fleet::Fleet>) {
    let mut said = fleet.primary_said();
    while said.changed().await.is_ok() {
        let node = said.borrow_and_update().as_ref().map(|p| p.node.clone());
        if let Some(node) = node {
            tracing::info!(%node, "fleet: the leader made a new primary; probing the nodes");
            shared.ha.topology_nudge().notify_one();
        }
    }
}

/// What an embedder or a test puts in place of the drivers the configuration names.
#[derive(Default)]
pub struct Seams {
    /// Controls the serverless instance instead of the driver `[serverless.driver]` names
    /// (e.g. `holdfast_serverless::driver::ScriptedDriver`); unused without `[serverless]`.
    pub instance_driver: Option<Box<dyn InstanceDriver>>,
    /// Restarts nodes (upgrade, resize); without one, restart and resize are refused.
    pub node_driver: Option<Arc<dyn NodeDriver>>,
    /// Opens the streams of sessions' backend connections instead of TCP (e.g. to
    /// in-process scripted servers); control connections stay on TCP.
    pub backend_connector: Option<Arc<dyn backend::BackendConnector>>,
    /// This process takes over from another (an upgrade): its listening sockets, instead
    /// of binding; HA waits until the other lets go.
    pub take_over: Option<upgrade::TakeOver>,
    /// Runs client sessions on these threads (see [`session_threads`]) instead of on the
    /// runtime that accepts them.
    pub session_threads: Option<Arc<session_threads::SessionThreads>>,
}

impl Shared {
    /// Shared state with the drivers the configuration names and no node driver.
    pub fn new(config: Arc<Config>, topology: watch::Receiver<Arc<Topology>>) -> Self {
        Self::with_seams(config, topology, Seams::default())
    }

    /// Shared state with the drivers `seams` puts in place (the configured ones otherwise).
    pub fn with_seams(
        config: Arc<Config>,
        topology: watch::Receiver<Arc<Topology>>,
        seams: Seams,
    ) -> Self {
        let Seams {
            instance_driver,
            node_driver,
            backend_connector,
            take_over: _,
            session_threads,
        } = seams;
        let live = holdfast_cluster::live::live(config.clone());
        let serverless = config.serverless.as_ref().and_then(|sl| {
            let address = config.backends.first()?.address.clone();
            let driver = instance_driver
                .unwrap_or_else(|| holdfast_serverless::driver::build(&sl.driver, &address));
            Some(serverless::Lifecycle::new(sl.clone(), address, driver))
        });
        let gate: Arc<dyn gate::BackendGate> = match &serverless {
            Some(lc) => lc.clone(),
            None => Arc::new(gate::Ungated),
        };
        let admission = Arc::new(admission::Admission::new(&config.proxy));
        let connector = backend_connector
            .unwrap_or_else(|| Arc::new(backend::TcpConnector::from_config(&config.proxy)));
        let ha = HaController::new(live.clone(), topology.clone());
        Shared {
            membership: Arc::new(Membership::new(live.clone(), topology.clone(), ha.clone())),
            serverless,
            gate,
            ledger: None,
            ha,
            live,
            reloader: reload::Reloader::default(),
            log_level: std::sync::OnceLock::new(),
            connections: Arc::default(),
            metrics: Metrics::new(),
            events: Default::default(),
            verifiers: VerifierCache::default(),
            variable_types: restore::TypesCache::default(),
            user_names: Default::default(),
            login_texts: Default::default(),
            topology,
            sessions: Arc::default(),
            started: Instant::now(),
            switching: watch::channel(false).0,
            switching_now: std::sync::atomic::AtomicBool::new(false),
            commit_markers_ready: Arc::default(),
            preflight: Default::default(),
            node_driver,
            connector,
            admission,
            client_tls: None,
            monitor_links: watch::channel(Default::default()).1,
            upgrader: upgrade::Upgrader::default(),
            idle_wake: Default::default(),
            memory: Default::default(),
            socket_watcher: Default::default(),
            admin_connections: Arc::default(),
            fleet: None,
            fleet_link: None,
            kernel_relays: kernel_relay::KernelRelays::start(
                config.proxy.kernel_relay,
                config.has_passthrough_listener(),
            ),
            next_session_id: AtomicU32::new(0),
            session_threads,
        }
    }

    /// The configuration in force: a lock-free read for a value or two. Not to be held
    /// across an await ([`Shared::config_snapshot`] is); a reload applies to the next read.
    pub fn config(&self) -> arc_swap::Guard<Arc<Config>> {
        self.live.load()
    }

    /// The address of the node named `node`, as the topology has it now.
    pub fn node_address(&self, node: &str) -> Option<String> {
        self.topology
            .borrow()
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.address.to_string())
    }

    /// The configuration in force, to keep for a while (across awaits, a whole operation).
    pub fn config_snapshot(&self) -> Arc<Config> {
        self.live.load_full()
    }

    /// The configuration the cluster's tasks read too (a reload stores into it).
    pub fn live_config(&self) -> &LiveConfig {
        &self.live
    }

    /// What a planned operation works with: the cluster runs it, sessions are asked
    /// through the registry whether they are at a safe point.
    fn planned<'a>(&'a self, config: &'a Config) -> Planned<'a> {
        Planned {
            config,
            ha: &self.ha,
            topology: &self.topology,
            switching: &self.switching,
            switching_now: &self.switching_now,
            sessions: &*self.sessions,
            node_driver: self.node_driver.as_ref(),
            fleet: self
                .fleet_link
                .as_ref()
                .map(|l| l as &dyn holdfast_cluster::planned::FleetBarrier),
        }
    }

    /// A planned restart of `node` (upgrade or resize) that clients do not notice (see
    /// [`Planned::restart_node`]). Returns the steps taken.
    pub async fn restart_node(
        &self,
        node: &str,
        spec: &holdfast_cluster::driver::RestartSpec,
    ) -> Result<Vec<String>, RestartError> {
        let config = self.config_snapshot();
        self.planned(&config).restart_node(node, spec).await
    }

    /// A planned switchover clients do not notice (see [`Planned::switchover`]).
    pub async fn switchover(&self, target: Option<String>) -> Result<SwitchoverReport, HaError> {
        let config = self.config_snapshot();
        self.planned(&config).switchover(target).await
    }

    /// holdfast's connection ids (the greeting's, what `mysql_thread_id()` returns) start
    /// at [`registry::SESSION_ID_BASE`], far above the server's own thread ids, so that a
    /// `KILL` can tell which of the two it names.
    /// Client connections open now: sessions, and connections still logging in.
    pub fn open_connections(&self) -> usize {
        self.connections.open.load(Ordering::Acquire)
    }

    pub fn next_session_id(&self) -> u32 {
        let n = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        registry::SESSION_ID_BASE + n % registry::SESSION_ID_BASE
    }

    /// The session id counter, for the process that replaces this one.
    pub(crate) fn session_id_counter(&self) -> u32 {
        self.next_session_id.load(Ordering::Relaxed)
    }
}

/// Sessions the old process hands over after it sent its counter: a million ids of room
/// (it accepts for milliseconds more).
const HANDED_OVER_ID_ROOM: u32 = 1 << 20;

/// Goes on with a session the process this one replaces handed over (see
/// [`upgrade`]): it counts as an open connection, whatever the limit (it was admitted).
pub(crate) fn resume_session(
    shared: Arc<Shared>,
    carried: session::handover::CarriedSession,
    client: std::net::TcpStream,
    backend: Option<std::net::TcpStream>,
    readers: Vec<std::net::TcpStream>,
) {
    let slot = shared.connections.take(usize::MAX);
    let ticket = shared.admission.admit_handed_over(carried.peer.ip());
    let threads = shared.session_threads.clone();
    spawn_session(threads, move |counted| {
        session::run_resumed(
            shared,
            carried,
            client,
            backend,
            readers,
            (slot, ticket, counted),
        )
    });
}

/// Runs the session `make` makes on the session threads (made inside the runtime of the
/// thread it runs on), or on this runtime without them. What `make` is given is held until
/// the session ends.
fn spawn_session<Fut>(
    threads: Option<Arc<session_threads::SessionThreads>>,
    make: impl FnOnce(Option<session_threads::Counted>) -> Fut,
) where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match threads {
        Some(threads) => threads.spawn(|counted| make(Some(counted))),
        None => drop(tokio::spawn(make(None))),
    }
}

/// Goes on with a pass-through session the process this one replaces handed over.
pub(crate) fn resume_relay(
    shared: Arc<Shared>,
    carried: session::passthrough::CarriedRelay,
    client: std::net::TcpStream,
    backend: std::net::TcpStream,
    kernel_map: Option<std::os::fd::OwnedFd>,
) {
    let slot = shared.connections.take(usize::MAX);
    let ticket = shared.admission.admit_handed_over(carried.relay.peer.ip());
    let threads = shared.session_threads.clone();
    spawn_session(threads, move |counted| {
        // Set up here, so that the task holds the relay (boxed) and not what it was made of.
        let relay = session::passthrough::resume(shared, carried, client, backend, kernel_map);
        async move {
            if let Some(relay) = relay {
                relay.await;
            }
            drop((ticket, slot, counted));
        }
    });
}

/// A planned switchover waits for sessions through the registry.
impl SessionDrain for SessionRegistry {
    fn quiescent(&self) -> bool {
        SessionRegistry::quiescent(self)
    }
}

/// The monitor leaves a paused serverless instance alone.
impl ProbeGate for serverless::Lifecycle {
    fn may_probe(&self) -> bool {
        self.is_running()
    }
}

/// Everything `holdfast serve` runs: the monitor, the verifier refresher, the HA controller
/// and the listener.
pub struct Proxy {
    pub shared: Arc<Shared>,
    listener: TcpListener,
    /// `[[listener]]`s, each with its address as configured.
    extra: Vec<(TcpListener, String)>,
    take_over: Option<upgrade::TakeOver>,
}

/// The listening socket for `listen`: handed over (an upgrade), or bound now.
async fn listen(
    take_over: &mut Option<upgrade::TakeOver>,
    role: upgrade::Role,
    listen: &str,
    what: &str,
) -> std::io::Result<TcpListener> {
    if let Some(socket) = take_over.as_mut().and_then(|t| t.take(role, listen)) {
        return TcpListener::from_std(socket);
    }
    TcpListener::bind(listen)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {what} {listen}: {e}")))
}

impl Proxy {
    /// Binds the client listeners, opens the usage ledger (with `[serverless]`) and starts
    /// the background tasks, with the drivers the configuration names.
    pub async fn start(config: Config) -> std::io::Result<Proxy> {
        Self::start_with(config, Seams::default()).await
    }

    /// [`Proxy::start`] with drivers put in place by the caller.
    pub async fn start_with(config: Config, mut seams: Seams) -> std::io::Result<Proxy> {
        let config = Arc::new(config);
        let mut take_over = seams.take_over.take();
        let listener = listen(
            &mut take_over,
            upgrade::Role::Proxy,
            &config.proxy.listen,
            "the proxy listener",
        )
        .await?;
        let mut extra = Vec::new();
        for l in &config.listeners {
            let bound = listen(
                &mut take_over,
                upgrade::Role::Listener,
                &l.listen,
                "listener",
            )
            .await?;
            extra.push((bound, l.listen.clone()));
        }
        let tls_error = |e: holdfast_client::tls::TlsSetupError| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
        };
        let client_tls = tls::ClientTls::from_config(&config.tls).map_err(tls_error)?;
        tls::backend(&config.backend_tls).map_err(tls_error)?;
        let (tx, rx) = watch::channel(Arc::new(Topology::from_config(&config)));
        let mut shared = Shared::with_seams(config.clone(), rx, seams);
        shared.client_tls = client_tls;
        let (links_tx, links_rx) = watch::channel(Default::default());
        shared.monitor_links = links_rx;
        if let Some(sl) = &config.serverless {
            let ledger = holdfast_serverless::ledger::Ledger::open(&sl.ledger)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            shared.ledger = Some(Arc::new(ledger));
        }
        if let Some(cluster) = &config.cluster {
            // HA (and a serverless instance's lifecycle) is the fleet leader's: this
            // process runs it only while it leads.
            shared.ha.stand_by();
            if let Some(lc) = &shared.serverless {
                lc.stand_by();
            }
            let me = holdfast_fleet::MemberInfo {
                member: cluster
                    .member
                    .clone()
                    .unwrap_or_else(|| config.admin.listen.clone()),
                listen: config.proxy.listen.clone(),
                admin: config.admin.listen.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                pid: std::process::id(),
                shape: cluster_shape(&config),
                sessions: 0,
            };
            // A member configured for another cluster than the fleet's is refused here.
            match holdfast_fleet::check_fits(cluster, &me).await {
                Ok(()) => {}
                Err(e @ holdfast_fleet::FleetError::Misfit { .. }) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        e.to_string(),
                    ));
                }
                Err(e) => {
                    tracing::warn!(fleet = %cluster.name, error = %e, "fleet: etcd did not answer at start; this member joins (after the same check) once it does");
                }
            }
            let fleet = Arc::new(holdfast_fleet::Fleet::join(cluster.clone(), me));
            shared
                .ha
                .set_charge_check(Arc::new(FleetLink(fleet.clone())));
            shared.fleet_link = Some(FleetLink(fleet.clone()));
            shared.fleet = Some(fleet);
        }
        let shared = Arc::new(shared);
        shared.kernel_relays.log(config.has_passthrough_listener());
        if let Some(fleet) = &shared.fleet {
            tokio::spawn(follow_the_fleet(shared.clone(), fleet.leadership()));
            tokio::spawn(hold_for_the_fleet(shared.clone(), fleet.clone()));
            tokio::spawn(record_the_fleets_decisions(shared.clone(), fleet.clone()));
            tokio::spawn(follow_the_primary_said(shared.clone(), fleet.clone()));
            tokio::spawn(tell_the_fleet_the_sessions(shared.clone(), fleet.clone()));
        }
        shared
            .upgrader
            .register(upgrade::Role::Proxy, &config.proxy.listen, &listener)?;
        for (l, listen) in &extra {
            shared
                .upgrader
                .register(upgrade::Role::Listener, listen, l)?;
        }
        if let Some(t) = &take_over {
            // The process handed over from runs HA (and a serverless instance's
            // lifecycle) until it lets go.
            shared.ha.stand_by();
            if let Some(lc) = &shared.serverless {
                lc.stand_by();
            }
            shared.upgrader.set_generation(t.generation);
            shared.next_session_id.store(
                t.counters.next_session_id.wrapping_add(HANDED_OVER_ID_ROOM),
                Ordering::Relaxed,
            );
            shared
                .metrics
                .connections_accepted
                .inc_by(t.counters.connections_accepted);
        }
        if let Some(t) = &shared.client_tls {
            // Every `[tls] reload_check_secs` as it is now (a reload may change it).
            let live = shared.live.clone();
            tokio::spawn(t.clone().watch(move || live.load().tls.reload_check()));
        }
        ClusterTasks {
            config: shared.live.clone(),
            topology: tx,
            members: shared.membership.members.subscribe(),
            ha: shared.ha.clone(),
            probe_gate: shared.serverless.clone().map(|lc| lc as Arc<dyn ProbeGate>),
            switching: shared.switching.subscribe(),
            commit_markers_ready: shared.commit_markers_ready.clone(),
            monitor_links: links_tx,
        }
        .spawn();
        tokio::spawn(refresh_verifiers(shared.clone()));
        tokio::spawn(run_preflight(shared.clone()));
        tokio::spawn(events::follow(shared.clone()));
        tokio::spawn({
            let shared = shared.clone();
            async move { shared.memory.run().await }
        });
        if let Some(lc) = &shared.serverless {
            serverless::spawn_tasks(&shared, lc);
        }
        Ok(Proxy {
            shared,
            listener,
            extra,
            take_over,
        })
    }

    /// The admin API's listener at `listen`: the one handed over by the process this one
    /// takes over from, or a new one.
    pub async fn admin_listener(&mut self, listen: &str) -> std::io::Result<TcpListener> {
        let listener = self::listen(
            &mut self.take_over,
            upgrade::Role::Admin,
            listen,
            "the admin listener",
        )
        .await?;
        self.shared
            .upgrader
            .register(upgrade::Role::Admin, listen, &listener)?;
        Ok(listener)
    }

    /// The hand-over from the process this one takes over from, once everything is
    /// listening: [`upgrade::TakeOver::ready`] says so to it.
    pub fn take_over(&mut self) -> Option<upgrade::TakeOver> {
        self.take_over.take()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The addresses of the `[[listener]]`s, in config order.
    pub fn listener_addrs(&self) -> Vec<(SocketAddr, ListenerMode)> {
        let config = self.shared.config();
        self.extra
            .iter()
            .filter_map(|(l, listen)| {
                let (mode, _, _) = listener_settings(&config, Some(listen));
                l.local_addr().ok().map(|a| (a, mode))
            })
            .collect()
    }

    /// Accepts clients on every listener until the task is dropped, or until an upgrade
    /// has handed the listeners over (then pending: the process drains its sessions).
    pub async fn run(self) {
        for (listener, listen) in self.extra {
            tokio::spawn(accept_loop(self.shared.clone(), listener, Some(listen)));
        }
        accept_loop(self.shared, self.listener, None).await;
        std::future::pending().await
    }
}

/// Client connections open now, against `[proxy] max_connections` as it is when each one
/// arrives (a reload may lower or raise it; connections over a lowered limit stay).
#[derive(Default)]
struct ConnectionSlots {
    open: AtomicUsize,
}

/// One open client connection; its slot is freed when dropped.
struct Slot(Arc<ConnectionSlots>);

/// What an accepted connection's session holds until it ends: its slot, and its session
/// thread's count (see [`session::run_routed`]).
type Accepted = (Slot, Option<session_threads::Counted>);

impl ConnectionSlots {
    fn take(self: &Arc<Self>, limit: usize) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a listener treats its connections: its mode, routing and trusted proxies as the
/// configuration in force says (`listen`: a `[[listener]]` by its configured address;
/// none: the main listener). A reload applies them to the next connection.
fn listener_settings(
    config: &Config,
    listen: Option<&str>,
) -> (ListenerMode, Routing, Arc<[IpNet]>) {
    let main = &config.proxy;
    match listen.and_then(|a| config.listeners.iter().find(|l| l.listen == a)) {
        Some(l) => (
            l.mode,
            l.routing,
            l.trusted_proxies
                .as_ref()
                .unwrap_or(&main.trusted_proxies)
                .as_slice()
                .into(),
        ),
        None => (
            ListenerMode::Session,
            main.routing,
            main.trusted_proxies.as_slice().into(),
        ),
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, listen: Option<String>) {
    let mut handed_over = shared.upgrader.handed_over();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = async { drop(handed_over.wait_for(Option::is_some).await) } => {
                // The new process accepts on this socket now; this one again only if it
                // goes (see `Upgrader::serve_again`).
                if handed_over.wait_for(Option::is_none).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (settings, limit) = {
            let config = shared.config();
            set_keepalive(&stream, config.proxy.client_keepalive_secs);
            (
                listener_settings(&config, listen.as_deref()),
                config.proxy.max_connections,
            )
        };
        shared.metrics.connections_accepted.inc();
        let shared = shared.clone();
        match shared.connections.take(limit) {
            Some(slot) => {
                let (mode, routing, trusted) = settings;
                let threads = shared.session_threads.clone();
                let session = move |stream: tokio::net::TcpStream, held: Accepted| {
                    let arrival = session::Arrival {
                        shared,
                        stream: Box::new(stream),
                        peer,
                        mode,
                        routing,
                        trusted_proxies: trusted,
                    };
                    session::run_routed(arrival, held)
                };
                // The connection's slot (and its session thread's count) go with the
                // session's future: its task holds nothing else.
                match threads {
                    Some(threads) => threads.spawn_with(stream, |stream, counted| {
                        session(stream, (slot, Some(counted)))
                    }),
                    None => drop(tokio::spawn(session(stream, (slot, None)))),
                }
            }
            None => {
                tokio::spawn(session::refuse_too_many(shared, Box::new(stream), peer));
            }
        }
    }
}

/// TCP keepalive on a client's socket, so that a vanished client's session ends.
fn set_keepalive(stream: &tokio::net::TcpStream, idle_secs: u64) {
    if idle_secs == 0 {
        return;
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(idle_secs))
        .with_interval(Duration::from_secs(idle_secs.div_ceil(4).max(1)));
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot set TCP keepalive on a client connection");
    }
}

/// The check `holdfast check` runs, once at start: every problem is logged as an error
/// (with the SQL that fixes it) and kept for `/status`. A serverless instance is checked
/// once it runs.
async fn run_preflight(shared: Arc<Shared>) {
    if let Some(lc) = &shared.serverless {
        let until = Instant::now() + Duration::from_secs(120);
        while !lc.is_running() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let nodes: Vec<_> = shared
        .membership
        .members
        .borrow()
        .iter()
        .map(|m| m.backend.clone())
        .collect();
    let report = preflight::check_and_log(&shared.config_snapshot(), &nodes).await;
    shared.preflight.store(Some(Arc::new(report)));
}

async fn refresh_verifiers(shared: Arc<Shared>) {
    let mut warned = false;
    loop {
        // As a reload leaves it.
        let every = Duration::from_secs(shared.config().auth.verifier_refresh_secs.max(1));
        // A paused instance is not woken for this: logins of unknown accounts wake it.
        let paused = !shared.gate.is_open();
        let addr = shared
            .topology
            .borrow()
            .primary_node()
            .filter(|_| !paused)
            .map(|n| n.address.clone());
        if let Some(addr) = addr {
            match shared
                .verifiers
                .refresh(&shared.config_snapshot(), &addr, Duration::ZERO)
                .await
            {
                Ok(_) => warned = false,
                Err(e) if !warned => {
                    tracing::warn!(error = %e, "cannot read password verifiers with the monitor account; logins will be relayed to the backend");
                    warned = true;
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(if shared.verifiers.is_loaded() {
            every
        } else {
            Duration::from_secs(1)
        })
        .await;
    }
}

/// The cluster as `config` describes it to a fleet: its nodes (by name and address) and
/// its HA mode. Members of one fleet must agree on it.
fn cluster_shape(config: &Config) -> String {
    let mut nodes: Vec<String> = config
        .backends
        .iter()
        .map(|b| format!("{}={}", b.name, b.address))
        .collect();
    nodes.sort();
    let mode = format!("{:?}", config.ha.mode).to_lowercase();
    format!("ha {mode}; nodes {}", nodes.join(", "))
}
