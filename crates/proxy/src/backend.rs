//! Connections to database nodes: opening one and logging in on a client's behalf, and a
//! small text-protocol query helper used by the monitor and for session setup. The
//! protocol work is `holdfast_client`'s; this module adds the proxy's capability policy and
//! the [`BackendConnector`] seam through which sessions open their streams.

use crate::conn::{BoxedIo, PacketConn};
use holdfast_client::tls::{host_of, start_tls, TlsClient};
use holdfast_client::{Login, TlsTarget};
use holdfast_cluster::topology::NodeState;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::*;
use holdfast_wire::handshake::{Greeting, LoginRequest};
use holdfast_wire::packets::OkPacket;
use holdfast_wire::proxy_protocol;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

pub use holdfast_client::{
    parse_text_row, Client as BackendConn, ClientError as BackendError, Executed, OkInfo,
    TextResult, ENABLE_TRACKERS,
};

pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = std::io::Result<BoxedIo>> + Send + 'a>>;

/// Opens the byte stream to a node; the greeting and login on it are holdfast's. Every
/// backend connection a session opens goes through [`crate::Shared::connector`]: its login
/// (native or relayed) and each move. Control connections with the monitor account (the
/// topology monitor, verifier loads, HA, scaling) connect over TCP directly.
///
/// The default is [`TcpConnector`]; a test puts an in-process server behind an address
/// ([`crate::Seams::backend_connector`]), and a TLS connector can wrap the TCP one.
pub trait BackendConnector: Send + Sync {
    /// A stream to the node at `address` (as configured in `[[backend]]`). The caller puts
    /// the connect timeout around it.
    fn connect<'a>(&'a self, address: &'a str) -> ConnectFuture<'a>;
}

/// TCP with `TCP_NODELAY`, as `holdfast_client` connects, from `source` when set
/// (`[proxy] backend_source_address`), with `TCP_USER_TIMEOUT` when `user_timeout` is set
/// (`[proxy] backend_tcp_user_timeout_ms`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector {
    pub source: Option<std::net::IpAddr>,
    pub user_timeout: Option<Duration>,
}

impl TcpConnector {
    pub fn from_config(proxy: &crate::config::ProxyConfig) -> Self {
        TcpConnector {
            source: proxy.backend_source_address,
            user_timeout: proxy.backend_tcp_user_timeout(),
        }
    }
}

impl BackendConnector for TcpConnector {
    fn connect<'a>(&'a self, address: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move {
            let stream = holdfast_client::tcp_stream_from(address, self.source).await?;
            if let Some(timeout) = self.user_timeout {
                set_user_timeout(&stream, timeout);
            }
            Ok(Box::new(stream) as BoxedIo)
        })
    }
}

/// `TCP_USER_TIMEOUT`: bytes sent to the node and not acknowledged for `timeout` end the
/// connection (an error the session recovers from as from any lost backend). Without it a
/// request sent into a network cut is retransmitted at doubling intervals, so that a
/// connection whose cut healed may wait a minute and more for its next retransmission;
/// a statement that runs long is not affected (its request was acknowledged).
fn set_user_timeout(stream: &tokio::net::TcpStream, timeout: Duration) {
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    if let Err(e) = rustix::net::sockopt::set_tcp_user_timeout(stream, ms) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT on a backend connection");
    }
}

/// The PROXY protocol header for a session's connection to `node` on behalf of `client`,
/// when the node takes one (`[[backend]] proxy_protocol`).
pub fn proxy_header(node: &NodeState, client: SocketAddr) -> Option<Vec<u8>> {
    node.proxy_protocol.then(|| {
        // A node named by host name: the header's destination is only informative.
        let server = node
            .address
            .parse()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        proxy_protocol::v2_header(client, server)
    })
}

/// Opens a stream through `connector`, sends `proxy_header` first when given, and reads the
/// server's greeting, within `timeout`.
pub async fn open(
    connector: &dyn BackendConnector,
    addr: &str,
    proxy_header: Option<&[u8]>,
    timeout: Duration,
) -> Result<(PacketConn, Greeting), BackendError> {
    let connect_error = |source| BackendError::Connect {
        addr: addr.to_string(),
        source,
    };
    let fut = async {
        let mut stream = connector.connect(addr).await.map_err(connect_error)?;
        if let Some(header) = proxy_header {
            stream.write_all(header).await.map_err(connect_error)?;
        }
        holdfast_client::greet(stream).await
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BackendError::Timeout(timeout))?
}

/// What a backend connection is logged in with.
pub struct LoginParams<'a> {
    pub user: &'a [u8],
    /// `None`: the account has an empty password.
    pub secret: Option<&'a PasswordHash>,
    pub database: Option<&'a [u8]>,
    pub charset: u8,
    /// The capabilities the client negotiated with holdfast; the backend gets the same
    /// semantics plus what holdfast needs ([`BACKEND_REQUIRED`]).
    pub client_capabilities: u32,
    /// The MariaDB extended capabilities the client negotiated with holdfast.
    pub mariadb_caps: u32,
    pub attributes: &'a [u8],
    /// Pass-through connections: the backend gets exactly the client's semantics, without
    /// the session tracking holdfast would otherwise add, because holdfast will not read
    /// the responses.
    pub exact_capabilities: bool,
    /// Sent before anything else (see [`proxy_header`]).
    pub proxy_header: Option<&'a [u8]>,
    /// TLS to the node (`[backend_tls]`, see [`crate::tls::backend`]).
    pub tls: Option<&'a TlsClient>,
}

/// Upgrades a greeted connection to `addr` to TLS when `tls` is set, before `login` goes
/// out (its capabilities must then include CLIENT_SSL, see [`with_tls`]).
pub async fn secure(
    conn: &mut PacketConn,
    greeting: &Greeting,
    tls: Option<&TlsClient>,
    addr: &str,
    login: &LoginRequest,
) -> Result<(), BackendError> {
    match tls {
        None => Ok(()),
        Some(tls) => start_tls(conn, greeting, tls, host_of(addr), login).await,
    }
}

/// `capabilities` with CLIENT_SSL set when TLS is on, cleared otherwise.
pub fn with_tls(capabilities: u32, tls: Option<&TlsClient>) -> u32 {
    match tls {
        Some(_) => capabilities | CLIENT_SSL,
        None => capabilities & !CLIENT_SSL,
    }
}

/// The capability policy of backend links lives next to the flags it combines.
pub use holdfast_wire::caps::{backend_capabilities, exact_capabilities};

/// Opens a connection through `connector` and logs in with a known secret
/// (mysql_native_password), all within `timeout`.
pub async fn connect(
    connector: &dyn BackendConnector,
    addr: &str,
    params: &LoginParams<'_>,
    timeout: Duration,
) -> Result<BackendConn, BackendError> {
    let login = Login {
        user: params.user,
        secret: params.secret,
        database: params.database,
        charset: params.charset,
        attributes: params.attributes,
        mariadb_caps: params.mariadb_caps & PROXY_MARIADB_CAPABILITIES,
    };
    let capabilities = |server_caps| {
        if params.exact_capabilities {
            exact_capabilities(params.client_capabilities, server_caps)
        } else {
            backend_capabilities(params.client_capabilities, server_caps)
        }
    };
    let fut = async {
        let (conn, greeting) = open(connector, addr, params.proxy_header, timeout).await?;
        let caps = capabilities(greeting.capabilities);
        let tls = params.tls.map(|tls| TlsTarget {
            tls,
            host: host_of(addr),
        });
        let mut logged_in = holdfast_client::login(conn, greeting, &login, caps, tls).await?;
        // rustls' connection goes now, not at the session's first park (see
        // `PacketConn::leave_rustls`).
        logged_in
            .conn
            .leave_rustls()
            .map_err(|source| BackendError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        Ok(logged_in)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BackendError::Timeout(timeout))?
}

/// Parses an OK payload from a backend (which always has session tracking negotiated).
pub fn parse_ok(payload: &[u8]) -> Option<OkPacket<'_>> {
    OkPacket::parse(payload, true).ok()
}
