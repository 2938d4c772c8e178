//! TLS: holdfast's certificate towards clients (reloaded when its files change) and the
//! TLS settings of connections to the nodes.

use crate::config::{TlsConfig, TlsVersion};
use arc_swap::ArcSwap;
use holdfast_client::conn::BoxedIo;
use holdfast_client::tls::{self as client_tls, Prefixed, TlsSetupError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The TLS side of holdfast's client listeners.
pub struct ClientTls {
    cert: PathBuf,
    key: PathBuf,
    min_version: TlsVersion,
    pub require: bool,
    current: ArcSwap<Loaded>,
}

struct Loaded {
    acceptor: tokio_rustls::TlsAcceptor,
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
        let loaded = load(cert, key, cfg.min_version)?;
        Ok(Some(Arc::new(ClientTls {
            cert: cert.clone(),
            key: key.clone(),
            min_version: cfg.min_version,
            require: cfg.require_tls,
            current: ArcSwap::from_pointee(loaded),
        })))
    }

    /// Runs the server side of the TLS handshake over a client's stream; `buffered` are
    /// the bytes read behind the client's SSLRequest (the start of its ClientHello).
    pub async fn accept(
        &self,
        stream: BoxedIo,
        buffered: bytes::BytesMut,
    ) -> std::io::Result<BoxedIo> {
        let acceptor = self.current.load().acceptor.clone();
        let tls = acceptor.accept(Prefixed::new(buffered, stream)).await?;
        Ok(Box::new(tls))
    }

    /// Loads the certificate and key again if either file changed since they were read.
    /// A pair that does not load leaves the current one in place (and is an error).
    pub fn reload_if_changed(&self) -> Result<bool, TlsSetupError> {
        let now = (stamp(&self.cert), stamp(&self.key));
        if now == self.current.load().stamp {
            return Ok(false);
        }
        self.current
            .store(Arc::new(load(&self.cert, &self.key, self.min_version)?));
        Ok(true)
    }

    /// Checks the files every `every` for as long as the process runs.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut failing = false;
        loop {
            tokio::time::sleep(every).await;
            match self.reload_if_changed() {
                Ok(true) => {
                    failing = false;
                    tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
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

fn load(cert: &Path, key: &Path, min_version: TlsVersion) -> Result<Loaded, TlsSetupError> {
    // Stamped before reading: a file replaced while it is read is read again next time.
    let stamp = (stamp(cert), stamp(key));
    let chain = client_tls::load_certificates(cert)?;
    let key = client_tls::load_private_key(key)?;
    let versions: &[&rustls::SupportedProtocolVersion] = match min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let config = rustls::ServerConfig::builder_with_provider(client_tls::provider())
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(Loaded {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        stamp,
    })
}

/// The TLS settings for connections to the nodes. Built in the cluster crate, whose
/// control connections need them too; re-exported so that sessions' `crate::tls::backend`
/// paths stay as they were.
pub use holdfast_cluster::control::backend_tls as backend;
