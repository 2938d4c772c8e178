//! The holdfast proxy: client sessions, backend connections, node monitoring, authentication
//! from the servers' own verifiers, and the metrics and registry the admin API reads.

pub mod backend;
pub mod config;
pub mod conn;
pub mod errors;
pub mod ha;
pub mod login;
pub mod metrics;
pub mod registry;
pub mod restore;
pub mod session;
pub mod state;
pub mod topology;
pub mod verifiers;

use config::Config;
use metrics::Metrics;
use registry::SessionRegistry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use topology::Topology;
use verifiers::VerifierCache;

/// State shared by every session, read without locks on the query path.
pub struct Shared {
    pub config: Arc<Config>,
    pub metrics: Metrics,
    pub verifiers: VerifierCache,
    pub topology: watch::Receiver<Arc<Topology>>,
    pub sessions: SessionRegistry,
    pub started: Instant,
    next_session_id: AtomicU32,
}

impl Shared {
    pub fn new(config: Arc<Config>, topology: watch::Receiver<Arc<Topology>>) -> Self {
        Shared {
            config,
            metrics: Metrics::new(),
            verifiers: VerifierCache::default(),
            topology,
            sessions: SessionRegistry::default(),
            started: Instant::now(),
            next_session_id: AtomicU32::new(1),
        }
    }

    pub fn next_session_id(&self) -> u32 {
        self.next_session_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// Everything `holdfast serve` runs: the monitor, the verifier refresher and the listener.
pub struct Proxy {
    pub shared: Arc<Shared>,
    listener: TcpListener,
}

impl Proxy {
    /// Binds the client listener and starts the background tasks.
    pub async fn start(config: Config) -> std::io::Result<Proxy> {
        let config = Arc::new(config);
        let listener = TcpListener::bind(&config.proxy.listen).await?;
        let (tx, rx) = watch::channel(Arc::new(Topology::from_config(&config)));
        let shared = Arc::new(Shared::new(config.clone(), rx));
        tokio::spawn(topology::run_monitor(config.clone(), tx));
        tokio::spawn(refresh_verifiers(shared.clone()));
        Ok(Proxy { shared, listener })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts clients until the task is dropped.
    pub async fn run(self) {
        let limit = Arc::new(Semaphore::new(self.shared.config.proxy.max_connections));
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            self.shared.metrics.connections_accepted.inc();
            let shared = self.shared.clone();
            match limit.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(async move {
                        session::run(shared, stream, peer).await;
                        drop(permit);
                    });
                }
                Err(_) => {
                    tokio::spawn(session::refuse_too_many(shared, stream, peer));
                }
            }
        }
    }
}

async fn refresh_verifiers(shared: Arc<Shared>) {
    let every = Duration::from_secs(shared.config.auth.verifier_refresh_secs.max(1));
    let mut warned = false;
    loop {
        let addr = shared
            .topology
            .borrow()
            .primary_node()
            .map(|n| n.address.clone());
        if let Some(addr) = addr {
            match shared
                .verifiers
                .refresh(&shared.config, &addr, Duration::ZERO)
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
