//! holdfast's asynchronous MySQL/MariaDB client for control connections: the proxy's
//! backend connections (login on a client's behalf, monitor and HA queries, session
//! capture and restore), the lab's logins and the benchmarks' idle sessions.
//!
//! It speaks the text protocol only, logs in with `mysql_native_password` (a known
//! password or its stored hash, [`PasswordHash`]) and buffers whole answers: it is not a
//! general driver. Packets are built and parsed by `holdfast_wire`; this crate adds the
//! framed stream ([`PacketConn`] over any [`Io`]: TCP, or an in-process pipe in tests), the
//! login exchange ([`open`] or [`greet`] on a stream of one's own, [`login`], [`connect`]) and
//! statement execution ([`Client::execute`], [`Client::query`], and
//! [`Client::execute_prepared`] for exact values through the binary protocol).
//!
//! The byte-level test client of the integration suite (`holdfast_it::raw`) is
//! deliberately separate and synchronous: it must send malformed and half-written
//! packets, pick every capability bit and read packet by packet with socket timeouts,
//! which a client that always completes well-formed exchanges is built not to do. It
//! shares the packet codecs of `holdfast_wire` and [`ServerError`] with this crate.

pub mod compress;
pub mod conn;
mod prepared;
mod query;
#[cfg(test)]
mod tests;
pub mod tls;
pub mod tls_resume;

pub use conn::{BoxedIo, ConnError, Io, Packet, PacketConn};
pub use holdfast_wire::auth::PasswordHash;
pub use prepared::BinaryResult;
pub use query::{parse_text_row, Executed, OkInfo, TextResult};

use holdfast_wire::auth::NATIVE_PASSWORD;
use holdfast_wire::caps::*;
use holdfast_wire::command::COM_QUIT;
use holdfast_wire::handshake::{AuthSwitch, Greeting, KeptGreeting, LoginRequest};
use holdfast_wire::packets::{ErrPacket, ERR_HEADER, OK_HEADER};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The statement that turns on the session trackers holdfast reads on every connection.
/// Not `session_track_transaction_info`: MariaDB skips the query cache for a session with
/// it on; holdfast turns it on only for sessions that set next-transaction
/// characteristics (`holdfast_proxy::restore::TRACK_TRANSACTIONS`).
pub const ENABLE_TRACKERS: &str = "SET SESSION session_track_system_variables='*', \
session_track_schema=ON, session_track_state_change=ON";

/// Largest packet accepted during login and in [`Client::query`].
pub const CONTROL_MAX_PACKET: usize = 64 << 20;

/// `utf8mb4_general_ci`, the character set [`Client::connect_native`] asks for.
pub const UTF8MB4_GENERAL_CI: u8 = 45;

/// What [`Client::connect_native`] asks for (when the server offers it): protocol 4.1
/// with plugin authentication, transactions, multiple results and no intermediate EOFs.
pub const DEFAULT_CAPABILITIES: u32 = CLIENT_PROTOCOL_41
    | CLIENT_SECURE_CONNECTION
    | CLIENT_PLUGIN_AUTH
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_LONG_PASSWORD
    | CLIENT_TRANSACTIONS
    | CLIENT_MULTI_RESULTS
    | CLIENT_DEPRECATE_EOF;

/// Why a connection, login or statement failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("timed out after {0:?} connecting to the backend")]
    Timeout(Duration),
    #[error("backend refused: {code} ({state}) {message}")]
    Server {
        code: u16,
        state: String,
        message: String,
        /// The ERR payload as the server sent it, to relay to a client unchanged.
        payload: Vec<u8>,
    },
    #[error("backend asked for auth plugin {0}, which holdfast cannot answer for this account")]
    UnsupportedPlugin(String),
    #[error("backend connection: {0}")]
    Conn(#[from] ConnError),
    #[error("the server does not offer TLS")]
    TlsNotOffered,
    #[error("TLS handshake with the server failed: {0}")]
    Tls(std::io::Error),
    #[error("TLS settings: {0}")]
    TlsSetup(#[from] tls::TlsSetupError),
}

impl ClientError {
    /// The server could not be reached or went away before answering (as opposed to a
    /// server that answered with an error): another node may serve instead.
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Timeout(_) => true,
            ClientError::Conn(ConnError::Closed | ConnError::Io(_)) => true,
            // A server shutting down says so before it closes.
            ClientError::Server { code, .. } => matches!(code, 1053 | 1077 | 1927),
            _ => false,
        }
    }

    /// The error an ERR payload carries ([`ClientError::Server`]), or a wire error if the
    /// payload is malformed.
    pub fn from_err_payload(payload: &[u8]) -> Self {
        match ErrPacket::parse(payload) {
            Ok(e) => ClientError::Server {
                code: e.code,
                state: String::from_utf8_lossy(&e.sql_state).into_owned(),
                message: e.message_lossy(),
                payload: payload.to_vec(),
            },
            Err(e) => ClientError::Conn(ConnError::Wire(e)),
        }
    }

    /// The server's refusal, if this is one.
    pub fn server_error(&self) -> Option<ServerError> {
        match self {
            ClientError::Server {
                code,
                state,
                message,
                ..
            } => Some(ServerError {
                code: *code,
                state: state.clone(),
                message: message.clone(),
            }),
            _ => None,
        }
    }
}

/// An ERR packet's contents, as a standalone error (for `anyhow` chains: downcast to it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ERROR {code} ({state}): {message}")]
pub struct ServerError {
    /// Error number, e.g. 1045.
    pub code: u16,
    /// SQLSTATE, e.g. `28000` (empty if the server sent none).
    pub state: String,
    /// Human-readable message (invalid UTF-8 replaced).
    pub message: String,
}

impl ServerError {
    /// Parses an ERR payload.
    pub fn parse(payload: &[u8]) -> Result<ServerError, holdfast_wire::WireError> {
        let e = ErrPacket::parse(payload)?;
        Ok(ServerError {
            code: e.code,
            state: String::from_utf8_lossy(&e.sql_state).into_owned(),
            message: e.message_lossy(),
        })
    }
}

/// Who logs in, and with what.
#[derive(Debug, Clone, Copy)]
pub struct Login<'a> {
    pub user: &'a [u8],
    /// `None`: the account has an empty password.
    pub secret: Option<&'a PasswordHash>,
    pub database: Option<&'a [u8]>,
    pub charset: u8,
    /// Raw connection attributes block (sent when `CLIENT_CONNECT_ATTRS` is negotiated).
    pub attributes: &'a [u8],
    /// MariaDB extended capabilities wanted (`caps::MARIADB_CLIENT_*`), asked for where
    /// the server offers them.
    pub mariadb_caps: u32,
}

/// A logged-in connection.
pub struct Client {
    pub conn: PacketConn,
    pub greeting: KeptGreeting,
    /// The capabilities sent in the login request.
    pub capabilities: u32,
    /// The MariaDB extended capabilities sent in the login request.
    pub mariadb_caps: u32,
    /// Dropping the client says COM_QUIT first (true from login on). Off for a connection
    /// that must close without it: a request still running there, which the server stops
    /// when it sees the connection close (a waiting statement would take a queued
    /// COM_QUIT for a live client).
    pub quit_on_drop: bool,
}

impl Client {
    /// The connection itself, for a caller that takes the conversation over byte for byte
    /// (and so says goodbye itself, relays its client's COM_QUIT, or must close without
    /// one: a request still running there).
    pub fn into_conn(mut self) -> PacketConn {
        let (placeholder, _) = tokio::io::duplex(1);
        std::mem::replace(&mut self.conn, PacketConn::new(Box::new(placeholder)))
    }
}

impl Drop for Client {
    /// Says goodbye (COM_QUIT) without waiting, best effort: a server counts a connection
    /// closed without it as aborted (`Aborted_clients`) and logs an "Aborted connection"
    /// warning for each one.
    fn drop(&mut self) {
        if self.quit_on_drop {
            let _ = self.conn.try_write_now(&[1, 0, 0, 0, COM_QUIT]);
        }
    }
}

/// Opens a TCP connection to `addr` with `TCP_NODELAY`, boxed for a [`PacketConn`]. No
/// timeout of its own: [`open`] puts one around it.
pub async fn tcp_connect(addr: &str) -> std::io::Result<BoxedIo> {
    tcp_connect_from(addr, None).await
}

/// [`tcp_connect`], leaving from `source` (any port) when given: each of `addr`'s
/// addresses of the same family is tried in turn.
pub async fn tcp_connect_from(
    addr: &str,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<BoxedIo> {
    Ok(Box::new(tcp_stream_from(addr, source).await?))
}

/// The TCP stream [`tcp_connect_from`] boxes, for a caller that sets more options on it.
pub async fn tcp_stream_from(
    addr: &str,
    source: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let stream = match source {
        None => TcpStream::connect(addr).await?,
        Some(source) => {
            let mut last = None;
            let mut connected = None;
            for target in tokio::net::lookup_host(addr).await? {
                if target.is_ipv4() != source.is_ipv4() {
                    continue;
                }
                let socket = match target {
                    std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                    std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
                };
                socket.bind(std::net::SocketAddr::new(source, 0))?;
                match socket.connect(target).await {
                    Ok(s) => {
                        connected = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match connected {
                Some(s) => s,
                None => {
                    return Err(last.unwrap_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::AddrNotAvailable,
                            format!("{addr} has no address of the family of {source}"),
                        )
                    }))
                }
            }
        }
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Reads the server's greeting on a freshly opened stream (an ERR instead of a greeting is
/// the server's refusal). No timeout of its own.
pub async fn greet(stream: BoxedIo) -> Result<(PacketConn, Greeting), ClientError> {
    let mut conn = PacketConn::new(stream);
    let greet = conn.read_packet(CONTROL_MAX_PACKET).await?;
    if greet.payload.first() == Some(&ERR_HEADER) {
        return Err(ClientError::from_err_payload(&greet.payload));
    }
    let greeting = Greeting::parse(&greet.payload).map_err(ConnError::Wire)?;
    Ok((conn, greeting))
}

/// Opens a TCP connection and reads the server's greeting, within `timeout`.
pub async fn open(addr: &str, timeout: Duration) -> Result<(PacketConn, Greeting), ClientError> {
    let fut = async {
        let stream = tcp_connect(addr)
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        greet(stream).await
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
}

/// Where a login goes inside TLS: the settings and the name the server's certificate
/// must carry.
#[derive(Clone, Copy)]
pub struct TlsTarget<'a> {
    pub tls: &'a tls::TlsClient,
    pub host: &'a str,
}

/// Logs in on an opened connection with `capabilities` (mysql_native_password, following
/// an auth switch to it), inside TLS when `tls` is given. No timeout of its own:
/// [`connect`] puts one around it.
pub async fn login(
    mut conn: PacketConn,
    greeting: Greeting,
    login: &Login<'_>,
    capabilities: u32,
    tls: Option<TlsTarget<'_>>,
) -> Result<Client, ClientError> {
    let capabilities = match tls {
        Some(_) => capabilities | CLIENT_SSL,
        None => capabilities & !CLIENT_SSL,
    };
    let scramble = |data: &[u8]| match login.secret {
        Some(s) => s.scramble_response(data).to_vec(),
        None => Vec::new(),
    };
    let request = LoginRequest {
        capabilities,
        max_packet: 1 << 30,
        charset: login.charset,
        user: login.user.to_vec(),
        auth_response: scramble(&greeting.scramble),
        database: login.database.map(<[u8]>::to_vec),
        auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        attributes: login.attributes.to_vec(),
        mariadb_caps: negotiated_mariadb_caps(&greeting, login.mariadb_caps),
    };
    if let Some(t) = tls {
        tls::start_tls(&mut conn, &greeting, t.tls, t.host, &request).await?;
    }
    conn.write_packet(&request.encode(), login_request_seq(capabilities))
        .await?;
    loop {
        let p = conn.read_packet(CONTROL_MAX_PACKET).await?;
        match p.payload.first() {
            Some(&OK_HEADER) => break,
            Some(&ERR_HEADER) => return Err(ClientError::from_err_payload(&p.payload)),
            Some(0xfe) => {
                let switch = AuthSwitch::parse(&p.payload).map_err(ConnError::Wire)?;
                if switch.plugin != NATIVE_PASSWORD.as_bytes() {
                    return Err(ClientError::UnsupportedPlugin(
                        String::from_utf8_lossy(&switch.plugin).into_owned(),
                    ));
                }
                conn.write_packet(&scramble(&switch.data), p.seq.wrapping_add(1))
                    .await?;
            }
            _ => {
                return Err(ClientError::UnsupportedPlugin(
                    "(extra auth data requested)".into(),
                ))
            }
        }
    }
    if capabilities & CLIENT_COMPRESS != 0 {
        compress::start(&mut conn, compress::Role::Client);
    }
    Ok(Client {
        conn,
        greeting: greeting.into(),
        capabilities,
        mariadb_caps: request.mariadb_caps,
        quit_on_drop: true,
    })
}

/// The MariaDB extended capabilities a login asking for `wanted` gets from the server
/// that sent `greeting` (none from a server that is not MariaDB).
pub fn negotiated_mariadb_caps(greeting: &Greeting, wanted: u32) -> u32 {
    if greeting.capabilities & CLIENT_LONG_PASSWORD == 0 {
        wanted & greeting.mariadb_caps
    } else {
        0
    }
}

/// The sequence id of the login request: 2 behind an SSLRequest, 1 otherwise.
pub fn login_request_seq(capabilities: u32) -> u8 {
    if capabilities & CLIENT_SSL != 0 {
        2
    } else {
        1
    }
}

/// Opens a connection and logs in, all within `timeout`. `capabilities` picks the login
/// request's capabilities from the server's.
pub async fn connect(
    addr: &str,
    login_as: &Login<'_>,
    capabilities: impl FnOnce(u32) -> u32,
    timeout: Duration,
) -> Result<Client, ClientError> {
    connect_over(addr, login_as, capabilities, None, timeout).await
}

/// [`connect`], inside TLS when `tls` is given (`CLIENT_SSL` is then asked for).
async fn connect_over(
    addr: &str,
    login_as: &Login<'_>,
    capabilities: impl FnOnce(u32) -> u32,
    tls: Option<&tls::TlsClient>,
    timeout: Duration,
) -> Result<Client, ClientError> {
    let fut = async {
        let (conn, greeting) = open(addr, timeout).await?;
        let mut caps = capabilities(greeting.capabilities);
        let target = tls.map(|tls| {
            caps |= CLIENT_SSL;
            TlsTarget {
                tls,
                host: tls::host_of(addr),
            }
        });
        login(conn, greeting, login_as, caps, target).await
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
}

impl Client {
    /// Logs in as `user` with a plain-text password and [`DEFAULT_CAPABILITIES`], in
    /// `utf8mb4`.
    pub async fn connect_native(
        addr: &str,
        user: &str,
        password: &str,
        database: Option<&str>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        Self::native_over(addr, user, password, database, None, &[], timeout).await
    }

    /// [`Client::connect_native`] inside TLS, the server's certificate checked as `tls`
    /// was set up to.
    pub async fn connect_native_tls(
        addr: &str,
        user: &str,
        password: &str,
        database: Option<&str>,
        tls: &tls::TlsClient,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        Self::native_over(addr, user, password, database, Some(tls), &[], timeout).await
    }

    /// [`Client::connect_native`] (inside TLS with `tls`) sending connection attributes as
    /// a driver does: `attributes` is the encoded block (length-encoded keys and values).
    pub async fn connect_native_with_attributes(
        addr: &str,
        user: &str,
        password: &str,
        tls: Option<&tls::TlsClient>,
        attributes: &[u8],
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        Self::native_over(addr, user, password, None, tls, attributes, timeout).await
    }

    async fn native_over(
        addr: &str,
        user: &str,
        password: &str,
        database: Option<&str>,
        tls: Option<&tls::TlsClient>,
        attributes: &[u8],
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let secret = PasswordHash::from_password(password.as_bytes());
        let login = Login {
            user: user.as_bytes(),
            secret: (!password.is_empty()).then_some(&secret),
            database: database.map(str::as_bytes),
            charset: UTF8MB4_GENERAL_CI,
            attributes,
            mariadb_caps: 0,
        };
        let wanted = match attributes {
            [] => DEFAULT_CAPABILITIES,
            _ => DEFAULT_CAPABILITIES | CLIENT_CONNECT_ATTRS,
        };
        let caps = move |server: u32| wanted & (server | CLIENT_LONG_PASSWORD);
        connect_over(addr, &login, caps, tls, timeout).await
    }

    /// Turns on the session trackers holdfast relies on; false when the server has none.
    pub async fn enable_trackers(&mut self) -> Result<bool, ClientError> {
        Ok(self.enable_trackers_status().await?.is_some())
    }

    /// [`Client::enable_trackers`], giving the status flags of the server's answer (the
    /// session's autocommit and transaction state), or `None` when the server has no
    /// trackers.
    pub async fn enable_trackers_status(&mut self) -> Result<Option<u16>, ClientError> {
        match self.query(ENABLE_TRACKERS).await {
            Ok(answer) => Ok(Some(answer.status)),
            Err(ClientError::Server { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends COM_QUIT and closes the connection.
    pub async fn quit(mut self) -> Result<(), ClientError> {
        self.conn.write_packet(&[COM_QUIT], 0).await?;
        let _ = self.conn.stream.shutdown().await;
        Ok(())
    }
}
