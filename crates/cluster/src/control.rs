//! Control connections: holdfast's own links to the nodes, logged in with the monitor
//! account (or another account of the configuration), over TCP. The topology monitor, HA
//! operations, membership checks, the start-up check, verifier loads and scaling use them;
//! sessions' connections go through the proxy's `BackendConnector` instead.

use holdfast_client::tls::{TlsClient, TlsSetupError, Verify};
use holdfast_client::{Login, TlsTarget};
use holdfast_config::{BackendTlsConfig, BackendTlsMode, Config, Secret};
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::{backend_capabilities, CLIENT_DEPRECATE_EOF, CLIENT_MULTI_RESULTS};
use std::sync::Mutex;

pub use holdfast_client::{Client as BackendConn, ClientError as BackendError};

/// Logs in with the monitor account (over TCP: control connections do not go through the
/// proxy's session connector).
pub async fn monitor_connect(cfg: &Config, addr: &str) -> Result<BackendConn, BackendError> {
    connect_as(
        cfg,
        addr,
        &cfg.auth.monitor_user,
        &cfg.auth.monitor_password,
    )
    .await
}

/// Logs in to `addr` as `user` the way the monitor does (`[backend_tls]`, no schema,
/// from `[proxy] backend_source_address` when set), all within the connect timeout.
pub async fn connect_as(
    cfg: &Config,
    addr: &str,
    user: &str,
    password: &Secret,
) -> Result<BackendConn, BackendError> {
    let secret = PasswordHash::from_password(password.expose().as_bytes());
    let tls = backend_tls(&cfg.backend_tls)?;
    let login = Login {
        user: user.as_bytes(),
        secret: if password.is_empty() {
            None
        } else {
            Some(&secret)
        },
        database: None,
        charset: 45,
        attributes: &[],
        mariadb_caps: 0,
    };
    let timeout = cfg.proxy.connect_timeout();
    let fut = async {
        let stream = holdfast_client::tcp_connect_from(addr, cfg.proxy.backend_source_address)
            .await
            .map_err(|source| BackendError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let (conn, greeting) = holdfast_client::greet(stream).await?;
        // Plain semantics: no NO_SCHEMA/IGNORE_SPACE quirks a client might have asked for.
        let caps = backend_capabilities(
            CLIENT_MULTI_RESULTS | CLIENT_DEPRECATE_EOF,
            greeting.capabilities,
        );
        let tls = tls.as_ref().map(|tls| TlsTarget {
            tls,
            host: holdfast_client::tls::host_of(addr),
        });
        holdfast_client::login(conn, greeting, &login, caps, tls).await
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BackendError::Timeout(timeout))?
}

/// The `[backend_tls]` settings built last, shared by every connection that has the same.
static BUILT: Mutex<Option<(BackendTlsConfig, TlsClient)>> = Mutex::new(None);

/// The TLS settings for connections to the nodes, `None` with `[backend_tls]` disabled.
/// Built once per distinct configuration: control connections, which only see the
/// `Config`, and sessions share it.
pub fn backend_tls(cfg: &BackendTlsConfig) -> Result<Option<TlsClient>, TlsSetupError> {
    if cfg.mode == BackendTlsMode::Disabled {
        return Ok(None);
    }
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((c, tls)) = built.as_ref() {
        if c == cfg {
            return Ok(Some(tls.clone()));
        }
    }
    let tls = load_backend_tls(cfg)?;
    if let Some(tls) = &tls {
        *built = Some((cfg.clone(), tls.clone()));
    }
    Ok(tls)
}

/// `[backend_tls]` built from its files as they are now, not put in force (a reload reads
/// a renewed CA or client certificate under the same names with it, then
/// [`install_backend_tls`]).
pub fn load_backend_tls(cfg: &BackendTlsConfig) -> Result<Option<TlsClient>, TlsSetupError> {
    let verify = match cfg.mode {
        BackendTlsMode::Disabled => return Ok(None),
        BackendTlsMode::VerifyCa => Verify::Ca,
        BackendTlsMode::VerifyFull => Verify::Full,
    };
    let ca = cfg.ca.as_deref().ok_or_else(|| TlsSetupError::Invalid {
        path: "[backend_tls] ca".into(),
        detail: "not set".into(),
    })?;
    let identity = cfg.cert.as_deref().zip(cfg.key.as_deref());
    Ok(Some(TlsClient::new(ca, verify, identity)?))
}

/// Puts what [`load_backend_tls`] built in force for the connections opened from now on.
pub fn install_backend_tls(cfg: &BackendTlsConfig, tls: Option<TlsClient>) {
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *built = tls.map(|tls| (cfg.clone(), tls));
}
