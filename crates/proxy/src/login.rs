//! The connection phase as seen by the client: holdfast's greeting, the client's login
//! checked against the server's verifiers (or relayed), and the backend login behind it.

use crate::backend::{self, BackendConn, BackendError, LoginParams};
use crate::config::ListenerMode;
use crate::conn::{ConnError, PacketConn};
use crate::errors::*;
use crate::serverless::InFlight;
use crate::verifiers::Verifier;
use crate::Shared;
use holdfast_wire::auth::{printable_scramble, verify_native, PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::handshake::{AuthSwitch, ClientHello, Greeting, LoginRequest};
use holdfast_wire::packets::{ok_payload, ERR_HEADER, OK_HEADER};
use std::net::SocketAddr;

/// Largest packet accepted before login completes: logins are small.
const LOGIN_MAX_PACKET: usize = 1 << 20;

pub struct LoggedIn {
    pub backend: BackendConn,
    pub backend_name: String,
    pub user: String,
    pub capabilities: u32,
    /// `SHA1(password)` when holdfast verified the login itself; `None` with an empty
    /// password or after a relayed login.
    pub secret: Option<PasswordHash>,
    pub can_reauthenticate: bool,
    /// The scramble holdfast sent in its greeting (COM_CHANGE_USER answers are computed over it).
    pub scramble: [u8; 20],
    /// What the client logged in with, to log in again on another node.
    pub identity: Identity,
}

/// The parts of a client's login that a new backend connection repeats.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub user: Vec<u8>,
    pub charset: u8,
    pub attributes: Vec<u8>,
    /// The database named in the login, if any (the schema tracker reports only changes).
    pub database: Option<String>,
}

impl Identity {
    fn of(req: &LoginRequest) -> Identity {
        Identity {
            user: req.user.clone(),
            charset: req.charset,
            attributes: req.attributes.clone(),
            database: req
                .database
                .as_ref()
                .map(|d| String::from_utf8_lossy(d).into_owned()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// An ERR packet was sent to the client; the connection ends.
    #[error("login refused: {0}")]
    Refused(String),
    /// The client sent no complete login in time; the connection is closed silently.
    #[error("no login within the handshake timeout of {0} ms")]
    HandshakeTimeout(u64),
    #[error("client: {0}")]
    Client(#[from] ConnError),
}

pub fn server_version(shared: &Shared) -> Vec<u8> {
    if !shared.config.proxy.server_version.is_empty() {
        return shared.config.proxy.server_version.as_bytes().to_vec();
    }
    let topo = shared.topology.borrow();
    let v = topo
        .primary_node()
        .map(|n| n.version.clone())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "10.11.0-MariaDB-holdfast".to_string());
    // MariaDB clients recognise MariaDB by this prefix in the greeting.
    if v.contains("MariaDB") && !v.starts_with("5.5.5-") {
        format!("5.5.5-{v}").into_bytes()
    } else {
        v.into_bytes()
    }
}

async fn refuse(
    client: &mut PacketConn,
    shared: &Shared,
    seq: u8,
    code: u16,
    message: String,
) -> LoginError {
    shared.metrics.count_error(code);
    let _ = client.write_packet(&err(code, &message), seq).await;
    LoginError::Refused(message)
}

async fn relay_backend_err(
    client: &mut PacketConn,
    shared: &Shared,
    seq: u8,
    e: BackendError,
) -> LoginError {
    match e {
        BackendError::Server {
            code,
            payload,
            message,
            ..
        } => {
            shared.metrics.count_error(code);
            let _ = client.write_packet(&payload, seq).await;
            LoginError::Refused(message)
        }
        other => {
            shared.metrics.backend_connect_failures.inc();
            refuse(
                client,
                shared,
                seq,
                CR_CONN_HOST_ERROR,
                format!("holdfast: cannot open a backend connection: {other}"),
            )
            .await
        }
    }
}

/// Runs the whole connection phase. On success the client has received its OK.
pub async fn login(
    shared: &Shared,
    client: &mut PacketConn,
    peer: SocketAddr,
    id: u32,
    mode: ListenerMode,
) -> Result<LoggedIn, LoginError> {
    let exact = mode == ListenerMode::Passthrough;
    let scramble = printable_scramble(rand::random());
    let greeting = Greeting {
        server_version: server_version(shared),
        connection_id: id,
        scramble: scramble.to_vec(),
        capabilities: PROXY_CAPABILITIES,
        charset: 45,
        status: SERVER_STATUS_AUTOCOMMIT,
        auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
    };
    client.write_packet(&greeting.encode(), 0).await?;
    let paused = shared.serverless.as_ref().is_some_and(|l| !l.is_running());
    // The client's part of the handshake has its own deadline; the whole login may take
    // longer only while a paused instance resumes.
    let hello = tokio::time::timeout(
        shared.config.proxy.handshake_timeout(),
        client.read_packet(LOGIN_MAX_PACKET),
    )
    .await;
    let hello = match hello {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            if paused {
                shared.metrics.count_closed_without_wake("no_login");
            }
            return Err(e.into());
        }
        Err(_) => {
            if paused {
                shared.metrics.count_closed_without_wake("no_login");
            }
            return Err(LoginError::HandshakeTimeout(
                shared.config.proxy.handshake_timeout_ms,
            ));
        }
    };
    let mut seq = hello.seq.wrapping_add(1);
    let parsed = ClientHello::parse(&hello.payload);
    if paused && !matches!(parsed, Ok(ClientHello::Login(_))) {
        shared.metrics.count_closed_without_wake("not_a_login");
    }
    let req = match parsed {
        Ok(ClientHello::Login(req)) => req,
        Ok(ClientHello::SslRequest { .. }) => {
            return Err(refuse(
                client,
                shared,
                seq,
                ER_HANDSHAKE_ERROR,
                "holdfast does not offer TLS on this listener; connect without TLS".into(),
            )
            .await);
        }
        Err(e) => {
            return Err(refuse(
                client,
                shared,
                seq,
                ER_HANDSHAKE_ERROR,
                format!("Bad handshake: {e}"),
            )
            .await);
        }
    };
    let capabilities = req.capabilities & PROXY_CAPABILITIES;
    let user = String::from_utf8_lossy(&req.user).into_owned();

    let mut account = shared.verifiers.lookup(&user, peer.ip());
    if account.is_none() {
        // An account holdfast has not seen: the server must be asked, so a paused instance
        // wakes first.
        let gate = pass_gate(shared, client, seq).await?;
        let addr = shared
            .topology
            .borrow()
            .primary_node()
            .map(|n| n.address.clone());
        if let Some(addr) = addr {
            let min = std::time::Duration::from_millis(shared.config.auth.verifier_miss_refresh_ms);
            if let Ok(true) = shared.verifiers.refresh(&shared.config, &addr, min).await {
                account = shared.verifiers.lookup(&user, peer.ip());
            }
        }
        drop(gate);
    }
    let verifier = account.as_ref().map(|a| a.verifier());

    match verifier {
        Some(v @ (Verifier::Native(_) | Verifier::Empty)) => {
            let native =
                req.auth_plugin.is_empty() || req.auth_plugin == NATIVE_PASSWORD.as_bytes();
            let response = if native {
                req.auth_response.clone()
            } else if capabilities & CLIENT_PLUGIN_AUTH != 0 {
                let switch = AuthSwitch {
                    plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
                    data: scramble.to_vec(),
                };
                client.write_packet(&switch.encode(), seq).await?;
                let answer = client.read_packet(LOGIN_MAX_PACKET).await?;
                seq = answer.seq.wrapping_add(1);
                answer.payload.to_vec()
            } else {
                return Err(refuse(client, shared, seq, ER_NOT_SUPPORTED_AUTH_MODE, "Client does not support authentication protocol requested by server; consider upgrading MariaDB client".into()).await);
            };
            let secret = match v {
                Verifier::Native(stored) => verify_native(&response, &scramble, &stored),
                _ => None,
            };
            let ok = match v {
                Verifier::Native(_) => secret.is_some(),
                _ => response.is_empty(),
            };
            if !ok {
                if shared.serverless.as_ref().is_some_and(|l| !l.is_running()) {
                    shared.metrics.count_closed_without_wake("wrong_password");
                }
                shared.metrics.logins_failed.inc();
                let using = if response.is_empty() { "NO" } else { "YES" };
                let msg = format!(
                    "Access denied for user '{user}'@'{}' (using password: {using})",
                    peer.ip()
                );
                tracing::info!(user = %user, client = %peer, "login refused: wrong password");
                return Err(refuse(client, shared, seq, ER_ACCESS_DENIED_ERROR, msg).await);
            }
            let _gate = pass_gate(shared, client, seq).await?;
            let node = primary(shared, client, seq).await?;
            let params = LoginParams {
                user: &req.user,
                secret: secret.as_ref(),
                database: req.database.as_deref(),
                charset: req.charset,
                client_capabilities: capabilities,
                attributes: &req.attributes,
                exact_capabilities: exact,
            };
            shared.metrics.backend_connects.inc();
            let backend = match backend::connect(
                &node.address,
                &params,
                shared.config.proxy.connect_timeout(),
            )
            .await
            {
                Ok(b) => b,
                Err(e) => return Err(relay_backend_err(client, shared, seq, e).await),
            };
            client
                .write_packet(&ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0), seq)
                .await?;
            Ok(LoggedIn {
                backend,
                backend_name: node.name,
                user,
                capabilities,
                secret,
                can_reauthenticate: true,
                scramble,
                identity: Identity::of(&req),
            })
        }
        other => {
            let plugin = match other {
                Some(Verifier::Relay { plugin }) => Some(plugin),
                _ => None,
            };
            let _gate = pass_gate(shared, client, seq).await?;
            let node = primary(shared, client, seq).await?;
            let backend = relay_login(
                shared,
                client,
                &req,
                (capabilities, exact),
                seq,
                &node.address,
                plugin,
            )
            .await?;
            Ok(LoggedIn {
                backend,
                backend_name: node.name,
                user,
                capabilities,
                secret: None,
                can_reauthenticate: false,
                scramble,
                identity: Identity::of(&req),
            })
        }
    }
}

/// Where a new login goes: the writable node.
async fn primary(
    shared: &Shared,
    client: &mut PacketConn,
    seq: u8,
) -> Result<crate::topology::NodeState, LoginError> {
    let node = shared.topology.borrow().primary_node().cloned();
    match node {
        Some(n) => Ok(n),
        None => Err(refuse(
            client,
            shared,
            seq,
            CR_CONN_HOST_ERROR,
            "holdfast: no writable database node is available".into(),
        )
        .await),
    }
}

/// The serverless gate for a login that must reach the server: wakes a paused instance
/// (waiting up to its resume deadline) and marks the login in flight, so a pause waits for
/// it until the guard drops. Without `[serverless]` there is no gate.
async fn pass_gate<'a>(
    shared: &'a Shared,
    client: &mut PacketConn,
    seq: u8,
) -> Result<Option<InFlight<'a>>, LoginError> {
    let Some(lc) = shared.serverless.as_deref() else {
        return Ok(None);
    };
    loop {
        let guard = lc.login_started();
        if lc.is_running() {
            return Ok(Some(guard));
        }
        drop(guard);
        shared.metrics.wake("login");
        if let Err(e) = lc.wake("login").await {
            return Err(refuse(
                client,
                shared,
                seq,
                ER_INSTANCE_UNAVAILABLE,
                format!("holdfast: {e}; try again later"),
            )
            .await);
        }
    }
}

/// The client-side name of a server auth plugin.
fn client_plugin(server_plugin: &str) -> &str {
    match server_plugin {
        "ed25519" => "client_ed25519",
        "unix_socket" | "" => NATIVE_PASSWORD,
        p => p,
    }
}

/// Relays the authentication exchange between the client and a backend: the client answers
/// the backend's scramble, and holdfast never learns anything it could reuse.
async fn relay_login(
    shared: &Shared,
    client: &mut PacketConn,
    req: &LoginRequest,
    (capabilities, exact): (u32, bool),
    mut seq: u8,
    addr: &str,
    plugin: Option<String>,
) -> Result<BackendConn, LoginError> {
    if capabilities & CLIENT_PLUGIN_AUTH == 0 {
        return Err(refuse(client, shared, seq, ER_NOT_SUPPORTED_AUTH_MODE, "Client does not support authentication protocol requested by server; consider upgrading MariaDB client".into()).await);
    }
    shared.metrics.backend_connects.inc();
    let (mut conn, greeting) =
        match backend::open(addr, shared.config.proxy.connect_timeout()).await {
            Ok(x) => x,
            Err(e) => return Err(relay_backend_err(client, shared, seq, e).await),
        };
    let backend_caps = if exact {
        backend::exact_capabilities(capabilities, greeting.capabilities)
    } else {
        backend::backend_capabilities(capabilities, greeting.capabilities)
    };
    let server_default = String::from_utf8_lossy(&greeting.auth_plugin).into_owned();
    let account_plugin = plugin.unwrap_or_else(|| server_default.clone());
    let (auth_plugin, auth_response) = if client_plugin(&account_plugin) == NATIVE_PASSWORD {
        // Password plugins that answer the greeting's scramble: ask the client for that
        // answer right away.
        let switch = AuthSwitch {
            plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            data: greeting.scramble.clone(),
        };
        client.write_packet(&switch.encode(), seq).await?;
        let answer = client.read_packet(LOGIN_MAX_PACKET).await?;
        seq = answer.seq.wrapping_add(1);
        (NATIVE_PASSWORD.as_bytes().to_vec(), answer.payload.to_vec())
    } else {
        // Other plugins (ed25519 sends its own nonce, caching_sha2_password may ask for
        // more): offer nothing, so the server switches to the account's plugin itself and
        // the exchange below relays every step verbatim.
        (NATIVE_PASSWORD.as_bytes().to_vec(), Vec::new())
    };
    let login = LoginRequest {
        capabilities: backend_caps,
        max_packet: 1 << 30,
        charset: req.charset,
        user: req.user.clone(),
        auth_response,
        database: req.database.clone(),
        auth_plugin,
        attributes: req.attributes.clone(),
    };
    let backend_fail =
        |e: ConnError| LoginError::Refused(format!("backend connection lost during login: {e}"));
    conn.write_packet(&login.encode(), 1)
        .await
        .map_err(backend_fail)?;
    loop {
        let p = conn
            .read_packet(LOGIN_MAX_PACKET)
            .await
            .map_err(backend_fail)?;
        match p.payload.first() {
            Some(&OK_HEADER) => {
                client
                    .write_packet(&ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0), seq)
                    .await?;
                return Ok(BackendConn {
                    conn,
                    greeting,
                    capabilities: backend_caps,
                });
            }
            Some(&ERR_HEADER) => {
                shared.metrics.logins_failed.inc();
                return Err(relay_backend_err(
                    client,
                    shared,
                    seq,
                    BackendError::from_err_payload(&p.payload),
                )
                .await);
            }
            _ => {
                // More auth data or another switch: pass it on, and the client's answer back.
                client.write_packet(&p.payload, seq).await?;
                let answer = client.read_packet(LOGIN_MAX_PACKET).await?;
                seq = answer.seq.wrapping_add(1);
                conn.write_packet(&answer.payload, p.seq.wrapping_add(1))
                    .await
                    .map_err(backend_fail)?;
            }
        }
    }
}
