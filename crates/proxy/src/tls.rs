//! TLS: holdfast's certificate towards clients (reloaded when its files change, or when a
//! configuration reload names others) and the TLS settings of connections to the nodes.

use crate::config::{TlsConfig, TlsVersion};
use arc_swap::ArcSwap;
use holdfast_client::conn::BoxedIo;
use holdfast_client::tls::{self as client_tls, Prefixed, TlsSetupError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The TLS side of holdfast's client listeners.
pub struct ClientTls {
    current: ArcSwap<Loaded>,
}

/// The certificate and settings in force.
pub struct Loaded {
    cert: PathBuf,
    key: PathBuf,
    min_version: TlsVersion,
    require: bool,
    /// Each connection's acceptor is made from a copy of it with a secret log of the
    /// connection's own (see `accept`).
    config: Arc<rustls::ServerConfig>,
    /// What the files looked like when they were read.
    stamp: (FileStamp, FileStamp),
}

/// A file's modification time and length: enough to notice a replaced certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp(Option<SystemTime>, u64);

fn stamp(path: &Path) -> FileStamp {
    match std::fs::metadata(path) {
        Ok(m) => FileStamp(m.modified().ok(), m.len()),
        Err(_) => FileStamp(None, 0),
    }
}

impl ClientTls {
    /// Loads `[tls]`; `None` when it has no certificate.
    pub fn from_config(cfg: &TlsConfig) -> Result<Option<Arc<ClientTls>>, TlsSetupError> {
        let (Some(cert), Some(key)) = (&cfg.cert, &cfg.key) else {
            return Ok(None);
        };
        let loaded = load(cert, key, cfg.min_version, cfg.require_tls)?;
        Ok(Some(Arc::new(ClientTls {
            current: ArcSwap::from_pointee(loaded),
        })))
    }

    /// Whether logins that did not start TLS are refused (`[tls] require_tls`).
    pub fn require(&self) -> bool {
        self.current.load().require
    }

    /// A reloaded `[tls]`, ready to [`apply`](Self::apply): the certificate and key are read
    /// now when they (their names, their files, or `min_version`) differ from those in
    /// force, so that a pair that does not load refuses the reload before anything changed.
    pub fn prepare(&self, cfg: &TlsConfig) -> Result<Arc<Loaded>, TlsSetupError> {
        let (Some(cert), Some(key)) = (&cfg.cert, &cfg.key) else {
            return Err(TlsSetupError::Invalid {
                path: "[tls]".into(),
                detail: "no certificate: turning TLS off needs a restart".into(),
            });
        };
        let now = self.current.load();
        let unchanged = *cert == now.cert
            && *key == now.key
            && cfg.min_version == now.min_version
            && (stamp(cert), stamp(key)) == now.stamp;
        if unchanged {
            return Ok(Arc::new(Loaded {
                cert: now.cert.clone(),
                key: now.key.clone(),
                min_version: now.min_version,
                require: cfg.require_tls,
                config: now.config.clone(),
                stamp: now.stamp,
            }));
        }
        Ok(Arc::new(load(cert, key, cfg.min_version, cfg.require_tls)?))
    }

    /// Puts a [`prepare`](Self::prepare)d `[tls]` in force for new connections.
    pub fn apply(&self, prepared: Arc<Loaded>) {
        self.current.store(prepared);
    }

    /// Runs the server side of the TLS handshake over a client's stream; `buffered` are
    /// the bytes read behind the client's SSLRequest (the start of its ClientHello).
    pub async fn accept(
        &self,
        stream: BoxedIo,
        buffered: bytes::BytesMut,
    ) -> std::io::Result<BoxedIo> {
        // Tracked: the session's TLS state can be handed to another process, with its
        // traffic secrets (a key update after the hand-over is followed): logged into a
        // log of this connection's own.
        let secrets = Arc::new(holdfast_client::tls_resume::SecretLog::default());
        let mut config = (*self.current.load().config).clone();
        config.key_log = secrets.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let tracked = holdfast_client::tls_resume::Tracked::with_secrets(
            Box::new(Prefixed::new(buffered, stream)),
            secrets,
        );
        let tls = acceptor.accept(tracked).await?;
        Ok(Box::new(tls))
    }

    /// Loads the certificate and key again if either file changed since they were read.
    /// A pair that does not load leaves the current one in place (and is an error).
    pub fn reload_if_changed(&self) -> Result<bool, TlsSetupError> {
        let current = self.current.load_full();
        let now = (stamp(&current.cert), stamp(&current.key));
        if now == current.stamp {
            return Ok(false);
        }
        self.current.store(Arc::new(load(
            &current.cert,
            &current.key,
            current.min_version,
            current.require,
        )?));
        Ok(true)
    }

    /// Checks the files every `every()` (`[tls] reload_check_secs` as it is now; none: not
    /// checked) for as long as the process runs.
    pub async fn watch(self: Arc<Self>, every: impl Fn() -> Option<Duration>) {
        /// How often a watch that is off looks whether a reload turned it on.
        const OFF: Duration = Duration::from_secs(10);
        let mut failing = false;
        loop {
            let Some(wait) = every() else {
                tokio::time::sleep(OFF).await;
                continue;
            };
            tokio::time::sleep(wait).await;
            match self.reload_if_changed() {
                Ok(true) => {
                    failing = false;
                    let cert = self.current.load().cert.display().to_string();
                    tracing::info!(%cert, "TLS certificate reloaded");
                }
                Ok(false) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "TLS certificate changed but does not load; keeping the previous one");
                }
                Err(_) => {}
            }
        }
    }
}

fn load(
    cert: &Path,
    key: &Path,
    min_version: TlsVersion,
    require: bool,
) -> Result<Loaded, TlsSetupError> {
    // Stamped before reading: a file replaced while it is read is read again next time.
    let stamp = (stamp(cert), stamp(key));
    let chain = client_tls::load_certificates(cert)?;
    let private_key = client_tls::load_private_key(key)?;
    let versions: &[&rustls::SupportedProtocolVersion] = match min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let mut config = rustls::ServerConfig::builder_with_provider(client_tls::provider())
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)?;
    // An upgrade continues the session in the new process (`holdfast_client::tls_resume`).
    config.enable_secret_extraction = true;
    Ok(Loaded {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        min_version,
        require,
        config: Arc::new(config),
        stamp,
    })
}

/// The TLS settings for connections to the nodes. Built in the cluster crate, whose
/// control connections need them too; re-exported so that sessions' `crate::tls::backend`
/// paths stay as they were.
pub use holdfast_cluster::control::backend_tls as backend;
