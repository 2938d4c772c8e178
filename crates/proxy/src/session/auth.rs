//! Authentication: the client's login (holdfast's greeting, the client's answer checked
//! against the server's verifiers or relayed to the backend, the backend login behind it)
//! and COM_CHANGE_USER, the same exchange again mid-session. One native-password check
//! ([`check_native`]) and one relay loop ([`relay_exchange`]) serve both.

use super::{End, Session};
use crate::backend::{self, BackendConn, BackendError, LoginParams};
use crate::client_trackers::login_ok;
use crate::config::ListenerMode;
use crate::conn::{ConnError, PacketConn};
use crate::error::code::ER_ACCESS_DENIED_ERROR;
use crate::error::{ClientError, ErrorKind};
use crate::restore::Captured;
use crate::serverless::InFlight;
use crate::verifiers::Verifier;
use crate::Shared;
use holdfast_cluster::topology::{NodeName, NodeState, Topology};
use holdfast_wire::auth::{printable_scramble, verify_native, PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::frame::{self, parse_header};
use holdfast_wire::handshake::{AuthSwitch, ChangeUser, ClientHello, Greeting, LoginRequest};
use holdfast_wire::packets::{ErrPacket, ERR_HEADER, OK_HEADER};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Largest packet accepted during an authentication exchange: logins are small.
const AUTH_MAX_PACKET: usize = 1 << 20;

pub struct LoggedIn {
    pub backend: BackendConn,
    pub backend_name: NodeName,
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
    /// The gate's epoch when the backend connection was opened (see [`pass_gate`]).
    pub epoch: u64,
}

/// The parts of a client's login that a new backend connection repeats. Every session
/// keeps one (issue 22): the user name and the connection attributes are shared with the
/// sessions that logged in with the same ([`holdfast_wire::interned`]), the database is a boxed
/// slice.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub user: Arc<[u8]>,
    pub charset: u8,
    pub attributes: Arc<[u8]>,
    /// The database named in the login, if any (the schema tracker reports only changes).
    pub database: Option<Box<str>>,
    /// The MariaDB extended capabilities negotiated with holdfast.
    pub mariadb_caps: u32,
}

impl Identity {
    fn of(req: &LoginRequest, shared: &holdfast_wire::interned::Interner<[u8]>) -> Identity {
        Identity {
            user: shared.get(&req.user),
            charset: req.charset,
            attributes: shared.get(&req.attributes),
            database: req
                .database
                .as_ref()
                .map(|d| String::from_utf8_lossy(d).into()),
            mariadb_caps: req.mariadb_caps,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// holdfast refused the login with this error (already sent to the client).
    #[error("login refused: {0}")]
    Refused(ClientError),
    /// The backend refused the login; its ERR packet was relayed to the client.
    #[error("the backend refused the login: {0}")]
    BackendRefused(BackendError),
    /// The client sent no complete login in time; the connection is closed silently.
    #[error("no login within the handshake timeout of {0} ms")]
    HandshakeTimeout(u64),
    #[error("client: {0}")]
    Client(#[from] ConnError),
    /// The client asked for TLS and the handshake failed (its certificate checks, a
    /// protocol version below `[tls] min_version`...); nothing can be sent to it.
    #[error("TLS handshake with the client failed: {0}")]
    Tls(String),
}

impl LoginError {
    /// The `reason` label of `holdfast_client_connections_rejected_total`.
    pub fn label(&self) -> &'static str {
        match self {
            LoginError::Refused(e) => e.kind.label(),
            LoginError::BackendRefused(BackendError::Server { code, .. })
                if *code == crate::error::code::ER_ACCESS_DENIED_ERROR =>
            {
                ErrorKind::AccessDenied.label()
            }
            LoginError::BackendRefused(_) => "backend_refused",
            LoginError::HandshakeTimeout(_) => "handshake_timeout",
            LoginError::Tls(_) => "tls_handshake",
            LoginError::Client(ConnError::TooLarge { .. }) => ErrorKind::PacketTooLarge.label(),
            LoginError::Client(ConnError::Wire(_)) => ErrorKind::MalformedPacket.label(),
            LoginError::Client(_) => "client_gone",
        }
    }
}

/// Why an authentication exchange with a backend failed.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("client: {0}")]
    Client(ConnError),
    #[error("backend connection lost during authentication: {0}")]
    Backend(ConnError),
}

impl From<RelayError> for End {
    fn from(e: RelayError) -> End {
        match e {
            RelayError::Client(e) => End::Client(e),
            RelayError::Backend(e) => End::Backend(e),
        }
    }
}

/// The MariaDB extended capabilities offered to clients: what holdfast supports of what a
/// server of `version` (the greeting's) has. Extended type info came with MariaDB 10.5,
/// bulk execution with 10.2.
fn offered_mariadb_caps(version: &[u8]) -> u32 {
    let version = String::from_utf8_lossy(version);
    if !version.contains("MariaDB") {
        return 0;
    }
    let v = version.strip_prefix("5.5.5-").unwrap_or(&version);
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let mut caps = 0;
    if (major, minor) >= (10, 2) {
        caps |= MARIADB_CLIENT_STMT_BULK_OPERATIONS;
    }
    if (major, minor) >= (10, 5) {
        caps |= MARIADB_CLIENT_EXTENDED_TYPE_INFO;
    }
    caps & PROXY_MARIADB_CAPABILITIES
}

/// The greeting's status flags, as the primary's greeting would carry them: autocommit as
/// the server's global setting has it.
fn greeting_status(shared: &Shared) -> u16 {
    let topo = shared.topology.borrow();
    match topo.primary_node().and_then(|n| n.autocommit) {
        Some(false) => 0,
        _ => SERVER_STATUS_AUTOCOMMIT,
    }
}

pub fn server_version(shared: &Shared) -> Vec<u8> {
    if !shared.config().proxy.server_version.is_empty() {
        return shared.config().proxy.server_version.as_bytes().to_vec();
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

/// Sends `error` to a client still in its login and returns the matching [`LoginError`].
async fn refuse(
    client: &mut PacketConn,
    shared: &Shared,
    seq: u8,
    error: ClientError,
) -> LoginError {
    shared.metrics.count_error(error.kind.code());
    let _ = client.write_packet(&error.payload(), seq).await;
    LoginError::Refused(error)
}

/// A backend refused or could not be reached during a login: its own ERR goes to the
/// client unchanged; a connection failure is logged and the client told only that.
async fn backend_failed(
    client: &mut PacketConn,
    shared: &Shared,
    seq: u8,
    node: &str,
    e: BackendError,
) -> LoginError {
    match e {
        BackendError::Server {
            code, ref payload, ..
        } => {
            shared.metrics.count_error(code);
            let _ = client.write_packet(payload, seq).await;
            LoginError::BackendRefused(e)
        }
        other => {
            shared.metrics.backend_connect_failures.inc();
            tracing::warn!(node, error = %other, "login: cannot open a backend connection");
            let error = ClientError::new(
                ErrorKind::NoBackend,
                format!(
                    "holdfast: cannot open a connection to database node {node}; try again later"
                ),
            );
            refuse(client, shared, seq, error).await
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
    let scramble = printable_scramble(rand::random());
    let version = server_version(shared);
    let mariadb_caps = offered_mariadb_caps(&version);
    let mut capabilities = PROXY_CAPABILITIES;
    if shared.client_tls.is_some() {
        capabilities |= CLIENT_SSL;
    }
    if mariadb_caps != 0 {
        // MariaDB's way of saying "extended capabilities follow" (it clears CLIENT_MYSQL).
        capabilities &= !CLIENT_LONG_PASSWORD;
    }
    let greeting = Greeting {
        server_version: version,
        connection_id: id,
        scramble: scramble.to_vec(),
        capabilities,
        charset: 45,
        status: greeting_status(shared),
        auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        mariadb_caps,
    };
    client.write_packet(&greeting.encode(), 0).await?;
    // Refusals while the instance is paused count as connections turned away unwoken.
    let closed_unwoken = |reason| {
        if shared.gate.wakes_on_login() && !shared.gate.is_open() {
            shared.metrics.count_closed_without_wake(reason);
        }
    };
    let (mut req, mut seq, secure) = match read_login_request(shared, client, peer).await {
        Ok(x) => x,
        Err(e) => {
            closed_unwoken(match e {
                LoginError::Refused(_) => "not_a_login",
                _ => "no_login",
            });
            return Err(e);
        }
    };
    let capabilities = req.capabilities & PROXY_CAPABILITIES;
    req.mariadb_caps &= mariadb_caps;
    let user = String::from_utf8_lossy(&req.user).into_owned();
    // TLS required by holdfast's `[tls] require`, or by the server itself
    // (`require_secure_transport`): a plain client must not reach it through holdfast's
    // own TLS link.
    let server_requires_tls = || {
        let topo = shared.topology.borrow();
        topo.primary_node()
            .or_else(|| topo.nodes.first())
            .is_some_and(|n| n.requires_secure_transport)
    };
    if !secure && (shared.client_tls.as_ref().is_some_and(|t| t.require()) || server_requires_tls())
    {
        // The server's answer under require_secure_transport: access denied.
        closed_unwoken("clear_text");
        tracing::info!(user = %user, client = %peer, "login refused: TLS is required");
        let error = ClientError::access_denied(
            &user,
            &shared.verifiers.client_host(peer.ip()),
            !req.auth_response.is_empty(),
        );
        return Err(refuse(client, shared, seq, error).await);
    }
    let lookup = find_verifier(shared, client, seq, &user, peer).await?;
    // No such account on the server: refused like a wrong password, with the same packets
    // and delays, so that a user name cannot be told from its answer, and without a
    // backend connection.
    let no_such_account = matches!(lookup, Lookup::NotWoken)
        || matches!(lookup, Lookup::NotFound) && shared.verifiers.no_such_account(&user);
    let verifier = match lookup {
        Lookup::Found(v) => Some(v),
        _ if no_such_account => Some(Verifier::Native(rand::random())),
        _ => None,
    };
    let exact = mode == ListenerMode::Passthrough;
    let Some(v @ (Verifier::Native(_) | Verifier::Empty)) = verifier else {
        // Another plugin, or an account holdfast cannot see: the backend authenticates.
        let plugin = match verifier {
            Some(Verifier::Relay { plugin }) => Some(plugin),
            _ => None,
        };
        let (_held, epoch) = pass_gate(shared, client, seq).await?;
        let node = writable_node(shared, client, seq, login_hold_until(shared), None).await?;
        let with_password = !req.auth_response.is_empty();
        refuse_if_host_dependent(shared, client, seq, (&user, with_password), peer, &node).await?;
        let header = backend::proxy_header(&node, peer);
        let backend = relay_login(
            shared,
            client,
            &req,
            (capabilities, exact),
            seq,
            RelayTarget {
                node: &node,
                proxy_header: header.as_deref(),
                peer,
                client_secure: secure,
            },
            plugin,
        )
        .await?;
        return Ok(LoggedIn {
            backend,
            backend_name: node.name,
            user,
            capabilities,
            secret: None,
            can_reauthenticate: false,
            scramble,
            identity: Identity::of(&req, &shared.login_texts),
            epoch,
        });
    };
    let response = if req.auth_plugin.is_empty() || req.auth_plugin == NATIVE_PASSWORD.as_bytes() {
        req.auth_response.clone()
    } else if capabilities & CLIENT_PLUGIN_AUTH != 0 {
        let answer;
        (answer, seq) = ask_native_answer(client, scramble.to_vec(), seq).await?;
        answer
    } else {
        let error = ClientError::auth_method_unsupported();
        return Err(refuse(client, shared, seq, error).await);
    };
    let checked = match check_native(&v, &response, &scramble) {
        Err(()) if !no_such_account => {
            recheck_after_refresh(shared, &user, peer, (&response, &scramble)).await
        }
        checked => checked,
    };
    let Ok(secret) = checked else {
        closed_unwoken("wrong_password");
        let why = if no_such_account {
            "no such account"
        } else {
            "wrong password"
        };
        tracing::info!(user = %user, client = %peer, "login refused: {why}");
        wrong_password(shared, peer.ip(), &user).await;
        // The server counts the failure against the account (max_password_errors) and
        // answers it, e.g. 4150 once the account is blocked; holdfast answers itself when
        // the server cannot be asked.
        let verdict = match no_such_account {
            false => failed_login_at_server(shared, &req, peer, !response.is_empty()).await,
            true => None,
        };
        if let Some(payload) = verdict {
            shared
                .metrics
                .count_error(ErrPacket::parse(&payload).map_or(1045, |e| e.code));
            let _ = client.write_packet(&payload, seq).await;
            return Err(LoginError::BackendRefused(BackendError::from_err_payload(
                &payload,
            )));
        }
        let error = ClientError::access_denied(
            &user,
            &shared.verifiers.client_host(peer.ip()),
            !response.is_empty(),
        );
        return Err(refuse(client, shared, seq, error).await);
    };
    shared.admission.login_succeeded(peer.ip(), &user);
    let (_held, epoch) = pass_gate(shared, client, seq).await?;
    let hold_until = login_hold_until(shared);
    let mut unreachable: Option<String> = None;
    let (backend, node) = loop {
        let node = writable_node(shared, client, seq, hold_until, unreachable.as_deref()).await?;
        refuse_if_host_dependent(shared, client, seq, (&user, true), peer, &node).await?;
        let header = backend::proxy_header(&node, peer);
        let tls = crate::tls::backend(&shared.config().backend_tls)
            .map_err(|e| LoginError::BackendRefused(e.into()))?;
        let params = LoginParams {
            user: &req.user,
            secret: secret.as_ref(),
            database: req.database.as_deref(),
            charset: req.charset,
            client_capabilities: capabilities,
            mariadb_caps: req.mariadb_caps,
            attributes: &req.attributes,
            exact_capabilities: exact,
            proxy_header: header.as_deref(),
            tls: tls.as_ref(),
        };
        shared.metrics.backend_connects.inc();
        let timeout = shared.config().proxy.connect_timeout();
        let connector = &*shared.connector;
        match backend::connect(connector, &node.address, &params, timeout).await {
            Ok(b) => break (b, node),
            // The primary is down and the monitor has not noticed yet: wait for another.
            Err(e) if e.is_unreachable() && Instant::now() < hold_until => {
                tracing::info!(node = %node.name, error = %e, "login held: the primary does not answer");
                shared.metrics.backend_connect_failures.inc();
                unreachable = Some(node.name.to_string());
            }
            Err(e) => return Err(backend_failed(client, shared, seq, &node.name, e).await),
        }
    };
    let ok = login_ok(capabilities, req.database.as_deref());
    client.write_packet(&ok, seq).await?;
    Ok(LoggedIn {
        backend,
        backend_name: node.name,
        user,
        capabilities,
        secret,
        can_reauthenticate: true,
        scramble,
        identity: Identity::of(&req, &shared.login_texts),
        epoch,
    })
}

/// Reads the client's handshake response within the handshake timeout (the whole login
/// may take longer only while a paused instance resumes), after a TLS handshake when the
/// client asks for one. Returns it with the next sequence id and whether TLS is on.
async fn read_login_request(
    shared: &Shared,
    client: &mut PacketConn,
    peer: SocketAddr,
) -> Result<(LoginRequest, u8, bool), LoginError> {
    let timeout = shared.config().proxy.handshake_timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = || LoginError::HandshakeTimeout(shared.config().proxy.handshake_timeout_ms);
    // A PROXY protocol header from an address not in `trusted_proxies` (trusted ones are
    // read before the greeting): its sender wrote it without waiting for the greeting, so
    // it is here in place of the client's first packet. Refused as MariaDB refuses one from
    // outside `proxy_protocol_networks`; the ERR follows the greeting the sender relays.
    loop {
        match holdfast_wire::proxy_protocol::starts_header(&client.rbuf) {
            Some(false) => break,
            Some(true) => {
                let error = ClientError::new(
                    ErrorKind::ProxyHeaderNotTrusted,
                    format!(
                        "Proxy header is not accepted from {}: the address is not in holdfast's trusted_proxies",
                        peer.ip()
                    ),
                );
                return Err(refuse(client, shared, 2, error).await);
            }
            None => {
                tokio::time::timeout_at(deadline, client.fill())
                    .await
                    .map_err(|_| timed_out())??;
            }
        }
    }
    let mut secure = false;
    loop {
        let hello = tokio::time::timeout_at(deadline, client.read_packet(AUTH_MAX_PACKET))
            .await
            .map_err(|_| timed_out())??;
        let seq = hello.seq.wrapping_add(1);
        let refusal = match (ClientHello::parse(&hello.payload), &shared.client_tls) {
            (Ok(ClientHello::Login(req)), _) => return Ok((req, seq, secure)),
            (Ok(ClientHello::SslRequest { .. }), Some(tls)) if !secure => {
                let (stream, buffered) = client.take_stream();
                let upgraded = tokio::time::timeout_at(deadline, tls.accept(stream, buffered))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(|e| LoginError::Tls(e.to_string()))?;
                client.replace_stream(upgraded);
                secure = true;
                continue;
            }
            (Ok(ClientHello::SslRequest { .. }), _) if secure => ClientError::new(
                ErrorKind::BadHandshake,
                "Bad handshake: a second SSL request inside TLS",
            ),
            (Ok(ClientHello::SslRequest { .. }), _) => ClientError::new(
                ErrorKind::BadHandshake,
                "holdfast does not offer TLS on this listener; connect without TLS",
            ),
            (Err(e), _) => ClientError::new(ErrorKind::BadHandshake, format!("Bad handshake: {e}")),
        };
        return Err(refuse(client, shared, seq, refusal).await);
    }
}

/// What holdfast knows of the account `user` would log in as from `peer`.
enum Lookup {
    Found(Verifier),
    /// Not among the accounts read from the server after this login arrived.
    NotFound,
    /// Not among the accounts known from before a pause, and the instance is not woken to
    /// look again (a name guessed again within the minute, or one whose accounts are for
    /// other hosts): refused as a wrong password.
    NotWoken,
    /// The accounts could not be read: the server decides.
    Unchecked,
}

/// The verifier of the account `user` would log in as from `peer`. An account holdfast has
/// not seen makes it read the accounts again (waking a paused instance, once a minute per
/// client address), at most every `verifier_miss_refresh_ms`.
async fn find_verifier(
    shared: &Shared,
    client: &mut PacketConn,
    seq: u8,
    user: &str,
    peer: SocketAddr,
) -> Result<Lookup, LoginError> {
    if let Some(account) = shared.verifiers.lookup(user, peer.ip()) {
        return Ok(Lookup::Found(account.verifier()));
    }
    if !shared.gate.is_open() && shared.verifiers.no_account_for(user, peer.ip()) {
        // The accounts were read as the instance paused and cannot have changed since:
        // the server would refuse this name from this host (`mariadb.sys`, say). Not woken.
        return Ok(Lookup::NotWoken);
    }
    if !shared.gate.is_open()
        && shared.verifiers.is_loaded()
        && !shared.admission.may_wake_for_unknown_user(peer.ip())
    {
        // A paused instance is not woken again and again for guessed user names: the
        // accounts known from before the pause decide.
        return Ok(Lookup::NotWoken);
    }
    let (_held, _) = pass_gate(shared, client, seq).await?;
    let addr = shared
        .topology
        .borrow()
        .primary_node()
        .map(|n| n.address.clone());
    let Some(addr) = addr else {
        return Ok(Lookup::Unchecked);
    };
    let min = std::time::Duration::from_millis(shared.config().auth.verifier_miss_refresh_ms);
    if let Err(e) = shared
        .verifiers
        .refresh_waiting(&shared.config_snapshot(), &addr, min)
        .await
    {
        tracing::debug!(error = %e, "cannot re-read the accounts for a login");
        return Ok(Lookup::Unchecked);
    }
    Ok(match shared.verifiers.lookup(user, peer.ip()) {
        Some(a) => Lookup::Found(a.verifier()),
        None => Lookup::NotFound,
    })
}

/// Checks a mysql_native_password answer to `scramble` against the account's verifier.
/// Ok carries `SHA1(password)` (None for an account with an empty password); Err means the
/// password is wrong.
fn check_native(
    verifier: &Verifier,
    response: &[u8],
    scramble: &[u8],
) -> Result<Option<PasswordHash>, ()> {
    match verifier {
        Verifier::Native(stored) => verify_native(response, scramble, stored)
            .map(Some)
            .ok_or(()),
        Verifier::Empty if response.is_empty() => Ok(None),
        _ => Err(()),
    }
}

/// A password that does not match the verifier holdfast knows may match a newer one
/// (`ALTER USER ... IDENTIFIED BY` since the last read): the accounts are read again (at
/// most every `verifier_miss_refresh_ms`; never waking a paused instance) and the answer
/// checked against what the server has now.
async fn recheck_after_refresh(
    shared: &Shared,
    user: &str,
    peer: SocketAddr,
    (response, scramble): (&[u8], &[u8]),
) -> Result<Option<PasswordHash>, ()> {
    if !shared.gate.is_open() {
        return Err(());
    }
    let addr = shared
        .topology
        .borrow()
        .primary_node()
        .map(|n| n.address.clone())
        .ok_or(())?;
    let min = std::time::Duration::from_millis(shared.config().auth.verifier_miss_refresh_ms);
    if let Err(e) = shared
        .verifiers
        .refresh_waiting(&shared.config_snapshot(), &addr, min)
        .await
    {
        tracing::debug!(error = %e, "cannot re-read the accounts after a wrong password");
        return Err(());
    }
    let account = shared.verifiers.lookup(user, peer.ip()).ok_or(())?;
    check_native(&account.verifier(), response, scramble)
}

/// Logs in to the primary as the client with a wrong answer, so that the server counts
/// the failed attempt where it counts a direct one (the account's `max_password_errors`,
/// its audit log; with the PROXY protocol, for the client's address), and returns the
/// server's ERR: 1045 as holdfast would send it, or 4150 for a blocked account. `None`
/// when the server cannot be asked (no primary, a paused instance, a connection failure).
async fn failed_login_at_server(
    shared: &Shared,
    req: &LoginRequest,
    peer: SocketAddr,
    with_password: bool,
) -> Option<Vec<u8>> {
    if !shared.gate.is_open() {
        return None;
    }
    let node = shared.topology.borrow().primary_node()?.clone();
    let tls = crate::tls::backend(&shared.config().backend_tls).ok()?;
    let header = backend::proxy_header(&node, peer);
    let timeout = shared.config().proxy.connect_timeout();
    let attempt = async {
        let connector = &*shared.connector;
        let (mut conn, greeting) =
            backend::open(connector, &node.address, header.as_deref(), timeout)
                .await
                .ok()?;
        let client_caps = req.capabilities & PROXY_CAPABILITIES;
        let caps = backend::backend_capabilities(client_caps, greeting.capabilities);
        let caps = backend::with_tls(caps, tls.as_ref());
        // No answer for a client that sent none ("using password: NO"); this account has a
        // password, or holdfast would have let the client in.
        let wrong: Vec<u8> = match with_password {
            true => rand::random::<[u8; 20]>().to_vec(),
            false => Vec::new(),
        };
        let login = LoginRequest {
            capabilities: caps,
            max_packet: 1 << 30,
            charset: req.charset,
            user: req.user.clone(),
            auth_response: wrong,
            database: None,
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            attributes: req.attributes.clone(),
            mariadb_caps: 0,
        };
        backend::secure(&mut conn, &greeting, tls.as_ref(), &node.address, &login)
            .await
            .ok()?;
        let seq = holdfast_client::login_request_seq(caps);
        conn.write_packet(&login.encode(), seq).await.ok()?;
        let answer = conn.read_packet(AUTH_MAX_PACKET).await.ok()?;
        (answer.payload.first() == Some(&ERR_HEADER)).then(|| answer.payload.to_vec())
    };
    let verdict = tokio::time::timeout(timeout, attempt).await.ok().flatten();
    if verdict.is_none() {
        tracing::debug!(node = %node.name, "could not report a failed login to the server");
    }
    verdict
}

/// A wrong password: counted, and answered only after the delay that repeated failures
/// from this address or for this account have earned.
async fn wrong_password(shared: &Shared, ip: std::net::IpAddr, user: &str) {
    shared.metrics.logins_failed.inc();
    let delay = shared.admission.login_failed(ip, user);
    if !delay.is_zero() {
        shared.metrics.logins_delayed.inc();
        tokio::time::sleep(delay).await;
    }
}

/// Without the PROXY protocol the server sees holdfast's address, not the client's: a login
/// whose account depends on that difference (an account for holdfast's host only, or
/// different accounts for the two addresses) is refused as the server would refuse the
/// client directly, instead of being let in under the wrong account.
async fn refuse_if_host_dependent(
    shared: &Shared,
    client: &mut PacketConn,
    seq: u8,
    (user, with_password): (&str, bool),
    peer: SocketAddr,
    node: &NodeState,
) -> Result<(), LoginError> {
    let Some(server_sees) = host_dependence(shared, user, peer.ip(), node) else {
        return Ok(());
    };
    tracing::warn!(
        user = %user,
        client = %peer,
        node = %node.name,
        "login refused: the account depends on the client's host, and without proxy_protocol the server would see holdfast's address ({server_sees}) instead; set proxy_protocol = true for this [[backend]]"
    );
    let error = ClientError::access_denied(
        user,
        &shared.verifiers.client_host(peer.ip()),
        with_password,
    );
    Err(refuse(client, shared, seq, error).await)
}

/// Whether the account `user` gets on `node` depends on the client's address while that
/// node sees holdfast's instead (no PROXY protocol): the server, seeing the returned
/// address, would pick another account (or none) than for `client` directly. A login or
/// COM_CHANGE_USER that does is refused as the server would refuse the client.
fn host_dependence(
    shared: &Shared,
    user: &str,
    client: std::net::IpAddr,
    node: &NodeState,
) -> Option<std::net::IpAddr> {
    if node.proxy_protocol || !shared.verifiers.has_host_specific_account(user) {
        return None;
    }
    let server_sees = source_address_towards(&node.address)?;
    shared
        .verifiers
        .depends_on_host(user, client, server_sees)
        .then_some(server_sees)
}

/// The local address the kernel would use to reach `address` (a UDP "connect" sends
/// nothing): what the server sees as holdfast's address. None for a host name.
fn source_address_towards(address: &str) -> Option<std::net::IpAddr> {
    let target: SocketAddr = address.parse().ok()?;
    let any: SocketAddr = match target {
        SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// The writable node a login goes to. While there is none (a failover, a switchover's
/// promote step, a restart), or only `not` (the node a connection just failed to reach), the
/// login is held, like a request, until one appears or `hold_until` passes.
async fn writable_node(
    shared: &Shared,
    client: &mut PacketConn,
    seq: u8,
    hold_until: Instant,
    not: Option<&str>,
) -> Result<NodeState, LoginError> {
    let mut topology = shared.topology.clone();
    let wanted = |t: &Topology| {
        t.primary_node()
            .filter(|n| not != Some(n.name.as_str()))
            .cloned()
    };
    let mut held = false;
    loop {
        if wanted(&topology.borrow_and_update()).is_some() {
            break;
        }
        if !held {
            held = true;
            shared.metrics.logins_held.inc();
            tracing::info!("login held: no writable node yet");
        }
        match tokio::time::timeout_at(hold_until.into(), topology.changed()).await {
            Ok(Ok(())) => continue,
            _ => break,
        }
    }
    let (node, states) = {
        let topology = shared.topology.borrow();
        // The nodes by name and state (never their addresses) for the message.
        let states: Vec<String> = topology
            .nodes
            .iter()
            .map(|n| {
                let state = match (n.reachable, n.read_only) {
                    (false, _) => "unreachable",
                    (true, Some(true)) => "read-only",
                    (true, _) => "not writable",
                };
                match &n.login_error {
                    // A configuration problem, said as it is (it names no address).
                    Some(why) => format!("{} {state}: {why}", n.name),
                    None => format!("{} {state}", n.name),
                }
            })
            .collect();
        (wanted(&topology), states)
    };
    match node {
        Some(n) => Ok(n),
        None => {
            let error = ClientError::new(
                ErrorKind::NoBackend,
                format!(
                    "holdfast: no writable database node is available ({}); try again later",
                    states.join(", ")
                ),
            );
            Err(refuse(client, shared, seq, error).await)
        }
    }
}

/// How long a login may wait for a writable node: the hold window, but within the login's
/// own deadline, so that the client gets an answer (not a closed connection).
fn login_hold_until(shared: &Shared) -> Instant {
    let within_login = shared.config().proxy.handshake_timeout() * 3 / 4;
    Instant::now() + shared.config().proxy.hold_window().min(within_login)
}

/// The route phase of a login that must reach the server: opens the backend gate (wakes a
/// paused instance, waiting up to its resume deadline) and holds it open until the guard
/// drops, so a pause waits for the login.
///
/// Also returns the gate's epoch as of then: the run of the server the login's backend
/// connection is opened on (a pause waits for the guard, so no stop comes in between). The
/// epoch when the client connected may be older: a stop-tier pause may have run while the
/// client sent its login.
async fn pass_gate<'a>(
    shared: &'a Shared,
    client: &mut PacketConn,
    seq: u8,
) -> Result<(Option<InFlight<'a>>, u64), LoginError> {
    loop {
        let held = shared.gate.hold_open();
        if shared.gate.is_open() {
            return Ok((held, shared.gate.epoch()));
        }
        drop(held);
        if let Err(error) = super::route::open_gate(shared, "login").await {
            return Err(refuse(client, shared, seq, error).await);
        }
    }
}

/// Asks the client for its mysql_native_password answer to `scramble` (AuthSwitchRequest);
/// returns the answer and the next sequence id.
async fn ask_native_answer(
    client: &mut PacketConn,
    scramble: Vec<u8>,
    seq: u8,
) -> Result<(Vec<u8>, u8), ConnError> {
    let switch = AuthSwitch {
        plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        data: scramble,
    };
    client.write_packet(&switch.encode(), seq).await?;
    let answer = client.read_packet(AUTH_MAX_PACKET).await?;
    Ok((answer.payload.to_vec(), answer.seq.wrapping_add(1)))
}

/// The client-side name of a server auth plugin.
fn client_plugin(server_plugin: &str) -> &str {
    match server_plugin {
        "ed25519" => "client_ed25519",
        "unix_socket" | "" => NATIVE_PASSWORD,
        p => p,
    }
}

/// How an authentication exchange with a backend ended.
enum Exchange {
    /// The backend accepted; the next client sequence id.
    Accepted(u8),
    /// The backend refused with this ERR payload; the client sequence id to relay it with.
    Refused(Vec<u8>, u8),
    /// The backend asked for a password in clear over a plain link (see [`clear_password_step`]);
    /// the request was not passed on. The step's name and the client sequence id.
    ClearTextRefused(&'static str, u8),
}

/// Whether the links of a relayed authentication are encrypted.
#[derive(Debug, Clone, Copy)]
struct Links {
    client_tls: bool,
    backend_tls: bool,
}

/// The step of an authentication exchange the backend's `payload` asks the client for, if
/// the client would answer it with its password in clear (`plugin` is the plugin the
/// exchange runs under so far). `mysql_clear_password` and `dialog` (PAM) always send it so;
/// `sha256_password` and caching_sha2_password's full authentication only over TLS (on a
/// plain client link they encrypt it with the server's RSA key instead).
fn clear_password_step(payload: &[u8], plugin: &str, client_tls: bool) -> Option<&'static str> {
    match payload.first() {
        Some(0xfe) => match AuthSwitch::parse(payload).ok()?.plugin.as_slice() {
            b"mysql_clear_password" => Some("mysql_clear_password"),
            b"dialog" => Some("dialog (PAM)"),
            b"sha256_password" if client_tls => Some("sha256_password"),
            _ => None,
        },
        // AuthMoreData "perform full authentication".
        Some(0x01)
            if payload.get(1) == Some(&0x04) && client_tls && plugin == "caching_sha2_password" =>
        {
            Some("caching_sha2_password full authentication")
        }
        _ => None,
    }
}

/// The answer to a login whose password would cross a plain backend link in clear.
fn clear_password_refused(user: &str, step: &str) -> ClientError {
    ClientError::new(
        ErrorKind::AuthMethodUnsupported,
        format!(
            "holdfast: the account '{user}' authenticates with {step}, which sends the password in clear, and holdfast's link to the server is not encrypted; turn on [backend_tls] (mode = \"verify-full\") to log in with it through holdfast"
        ),
    )
}

/// Relays an authentication exchange between a backend and the client until the backend
/// answers OK or ERR: every request for more data goes to the client and its answer back.
/// With `secret`, a switch to mysql_native_password is answered by holdfast itself.
async fn relay_exchange(
    client: &mut PacketConn,
    backend: &mut PacketConn,
    mut seq: u8,
    secret: Option<&PasswordHash>,
    links: Links,
) -> Result<Exchange, RelayError> {
    // The plugin the exchange runs under: the server's switch names it.
    let mut plugin = String::new();
    loop {
        let p = backend
            .read_packet(AUTH_MAX_PACKET)
            .await
            .map_err(RelayError::Backend)?;
        if !links.backend_tls {
            if let Some(step) = clear_password_step(&p.payload, &plugin, links.client_tls) {
                return Ok(Exchange::ClearTextRefused(step, seq));
            }
        }
        if p.payload.first() == Some(&0xfe) {
            if let Ok(switch) = AuthSwitch::parse(&p.payload) {
                plugin = String::from_utf8_lossy(&switch.plugin).into_owned();
            }
        }
        let answer = match p.payload.first() {
            Some(&OK_HEADER) => return Ok(Exchange::Accepted(seq)),
            Some(&ERR_HEADER) => return Ok(Exchange::Refused(p.payload.to_vec(), seq)),
            Some(0xfe) if secret.is_some() => {
                let switch = AuthSwitch::parse(&p.payload)
                    .map_err(|e| RelayError::Backend(ConnError::Wire(e)))?;
                secret
                    .map(|s| s.scramble_response(&switch.data).to_vec())
                    .unwrap_or_default()
            }
            _ => {
                client
                    .write_packet(&p.payload, seq)
                    .await
                    .map_err(RelayError::Client)?;
                let answer = client
                    .read_packet(AUTH_MAX_PACKET)
                    .await
                    .map_err(RelayError::Client)?;
                seq = answer.seq.wrapping_add(1);
                answer.payload.to_vec()
            }
        };
        backend
            .write_packet(&answer, p.seq.wrapping_add(1))
            .await
            .map_err(RelayError::Backend)?;
    }
}

/// Where a relayed login goes, and for whom.
struct RelayTarget<'a> {
    node: &'a NodeState,
    proxy_header: Option<&'a [u8]>,
    peer: SocketAddr,
    /// Whether the client's link is TLS.
    client_secure: bool,
}

/// Relays the authentication exchange between the client and a backend: the client answers
/// the backend's scramble, and holdfast never learns anything it could reuse.
async fn relay_login(
    shared: &Shared,
    client: &mut PacketConn,
    req: &LoginRequest,
    (capabilities, exact): (u32, bool),
    mut seq: u8,
    target: RelayTarget<'_>,
    plugin: Option<String>,
) -> Result<BackendConn, LoginError> {
    let RelayTarget {
        node,
        proxy_header,
        peer,
        client_secure,
    } = target;
    if capabilities & CLIENT_PLUGIN_AUTH == 0 {
        let error = ClientError::auth_method_unsupported();
        return Err(refuse(client, shared, seq, error).await);
    }
    shared.metrics.backend_connects.inc();
    let timeout = shared.config().proxy.connect_timeout();
    let (mut conn, greeting) =
        match backend::open(&*shared.connector, &node.address, proxy_header, timeout).await {
            Ok(x) => x,
            Err(e) => return Err(backend_failed(client, shared, seq, &node.name, e).await),
        };
    let backend_caps = if exact {
        backend::exact_capabilities(capabilities, greeting.capabilities)
    } else {
        backend::backend_capabilities(capabilities, greeting.capabilities)
    };
    let tls = match crate::tls::backend(&shared.config().backend_tls) {
        Ok(tls) => tls,
        Err(e) => return Err(backend_failed(client, shared, seq, &node.name, e.into()).await),
    };
    let backend_caps = backend::with_tls(backend_caps, tls.as_ref());
    let server_default = String::from_utf8_lossy(&greeting.auth_plugin).into_owned();
    let account_plugin = plugin.unwrap_or_else(|| server_default.clone());
    let auth_response = if client_plugin(&account_plugin) == NATIVE_PASSWORD {
        // Password plugins that answer the greeting's scramble: ask the client for that
        // answer right away.
        let answer;
        (answer, seq) = ask_native_answer(client, greeting.scramble.clone(), seq).await?;
        answer
    } else {
        // Other plugins (ed25519 sends its own nonce, caching_sha2_password may ask for
        // more): offer nothing, so the server switches to the account's plugin itself and
        // the exchange below relays every step verbatim.
        Vec::new()
    };
    let login = LoginRequest {
        capabilities: backend_caps,
        max_packet: 1 << 30,
        charset: req.charset,
        user: req.user.clone(),
        auth_response,
        database: req.database.clone(),
        auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        attributes: req.attributes.clone(),
        mariadb_caps: holdfast_client::negotiated_mariadb_caps(&greeting, req.mariadb_caps),
    };
    let lost = |e: ConnError| {
        tracing::info!(node = %node.name, error = %e, "backend connection lost during a relayed login");
        LoginError::BackendRefused(BackendError::Conn(e))
    };
    let addr = &node.address;
    if let Err(e) = backend::secure(&mut conn, &greeting, tls.as_ref(), addr, &login).await {
        return Err(backend_failed(client, shared, seq, &node.name, e).await);
    }
    let login_seq = holdfast_client::login_request_seq(backend_caps);
    conn.write_packet(&login.encode(), login_seq)
        .await
        .map_err(lost)?;
    let links = Links {
        client_tls: client_secure,
        backend_tls: tls.is_some(),
    };
    match relay_exchange(client, &mut conn, seq, None, links).await {
        Ok(Exchange::Accepted(seq)) => {
            shared
                .admission
                .login_succeeded(peer.ip(), &String::from_utf8_lossy(&req.user));
            let ok = login_ok(capabilities, req.database.as_deref());
            client.write_packet(&ok, seq).await?;
            if backend_caps & CLIENT_COMPRESS != 0 {
                holdfast_client::compress::start(
                    &mut conn,
                    holdfast_client::compress::Role::Client,
                );
            }
            Ok(BackendConn {
                conn,
                greeting: greeting.into(),
                capabilities: backend_caps,
                mariadb_caps: login.mariadb_caps,
                quit_on_drop: true,
            })
        }
        Ok(Exchange::ClearTextRefused(step, seq)) => {
            // The backend connection, mid-authentication, is dropped here.
            let user = String::from_utf8_lossy(&req.user);
            tracing::warn!(user = %user, client = %peer, node = %node.name, step, "login refused: the password would cross the plain backend link in clear ([backend_tls] is off)");
            Err(refuse(client, shared, seq, clear_password_refused(&user, step)).await)
        }
        Ok(Exchange::Refused(payload, seq)) => {
            wrong_password(shared, peer.ip(), &String::from_utf8_lossy(&req.user)).await;
            let e = BackendError::from_err_payload(&payload);
            Err(backend_failed(client, shared, seq, &node.name, e).await)
        }
        Err(RelayError::Client(e)) => Err(LoginError::Client(e)),
        Err(RelayError::Backend(e)) => Err(lost(e)),
    }
}

/// Which user a refused COM_CHANGE_USER is repeated for on the backend (see
/// `Session::change_user_refused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// The client's: its account counts the failure, as the server would count it.
    SameUser,
    /// None that exists: the client's address has no account of that user (or another
    /// than the one the server would see), so no account counts it.
    NoAccount,
}

impl Session {
    /// COM_CHANGE_USER, checked like a login: the account the client's own address gets
    /// (refused where the backend, seeing holdfast's address, would pick another), its
    /// password against the verifiers, failures counted and delayed as a login's; then
    /// replayed on the backend with an answer to the backend's own scramble.
    pub(super) async fn change_user(&mut self, request: &[u8]) -> Result<(), End> {
        let payload = frame::logical_payload(request);
        let mut seq = parse_header(request).map_or(0, |h| h.seq).wrapping_add(1);
        let cu = match ChangeUser::parse(&payload, self.capabilities) {
            Ok(c) => c,
            Err(e) => {
                let error = ClientError::malformed(format!("COM_CHANGE_USER: {e}"));
                self.send_error(seq, &error).await?;
                return Err(End::Protocol("malformed COM_CHANGE_USER".into()));
            }
        };
        let user = String::from_utf8_lossy(&cu.user).into_owned();
        let peer = self.info.client.ip();
        let node = self
            .topology
            .borrow()
            .nodes
            .iter()
            .find(|n| n.name == self.backend_name)
            .cloned();
        let server_sees = node
            .as_ref()
            .and_then(|n| host_dependence(&self.shared, &user, peer, n));
        if let Some(server_sees) = server_sees {
            // The server, seeing holdfast's address, would let the client in under an
            // account that is not its own (or refuse it for another reason): refused as
            // the server refuses the client directly, and counted like a login's failure.
            tracing::warn!(
                session = self.info.id,
                user = %user,
                client = %self.info.client,
                node = %self.backend_name,
                "COM_CHANGE_USER refused: the account depends on the client's host, and without proxy_protocol the server would see holdfast's address ({server_sees}) instead; set proxy_protocol = true for this [[backend]]"
            );
            wrong_password(&self.shared, peer, &user).await;
            let error = ClientError::access_denied(
                &user,
                &self.shared.verifiers.client_host(peer),
                !cu.auth_response.is_empty(),
            );
            return self
                .change_user_refused(cu, seq, error, Probe::NoAccount)
                .await;
        }
        let verifier = self.change_user_verifier(&user, peer).await;
        let (auth, secret) = match &verifier {
            Some(v @ (Verifier::Native(_) | Verifier::Empty)) => {
                let mut response = cu.auth_response.clone();
                if !(cu.auth_plugin.is_empty() || cu.auth_plugin == NATIVE_PASSWORD.as_bytes()) {
                    (response, seq) =
                        ask_native_answer(&mut self.client, self.scramble.to_vec(), seq)
                            .await
                            .map_err(End::Client)?;
                }
                let Ok(secret) = check_native(v, &response, &self.scramble) else {
                    wrong_password(&self.shared, peer, &user).await;
                    let error = ClientError::access_denied(
                        &user,
                        &self.shared.verifiers.client_host(peer),
                        !response.is_empty(),
                    );
                    return self
                        .change_user_refused(cu, seq, error, Probe::SameUser)
                        .await;
                };
                let answer = secret
                    .as_ref()
                    .map(|s| {
                        s.scramble_response(self.backend.greeting.scramble())
                            .to_vec()
                    })
                    .unwrap_or_default();
                (answer, secret)
            }
            // ed25519, caching_sha2_password...: the server switches to the account's
            // plugin itself and every step is relayed verbatim.
            Some(Verifier::Relay { .. }) => (Vec::new(), None),
            None => {
                // Unknown account: the client answers the backend's own scramble.
                let scramble = self.backend.greeting.scramble().to_vec();
                let answer;
                (answer, seq) = ask_native_answer(&mut self.client, scramble, seq)
                    .await
                    .map_err(End::Client)?;
                (answer, None)
            }
        };
        let forwarded = ChangeUser {
            auth_response: auth,
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            ..cu
        };
        self.backend
            .conn
            .write_packet(&forwarded.encode(self.backend.capabilities), 0)
            .await
            .map_err(End::Backend)?;
        // Whether the client's own link is TLS is not kept: a clear-text step is refused
        // over a plain backend link whatever the client's link.
        let links = Links {
            client_tls: true,
            backend_tls: self.shared.config().backend_tls.enabled(),
        };
        match relay_exchange(
            &mut self.client,
            &mut self.backend.conn,
            seq,
            secret.as_ref(),
            links,
        )
        .await?
        {
            Exchange::Accepted(next) => seq = next,
            Exchange::ClearTextRefused(step, seq) => {
                // The backend connection is left mid-authentication: the session ends
                // after the client has its answer.
                tracing::warn!(session = self.info.id, user = %user, step, "change-user refused: the password would cross the plain backend link in clear ([backend_tls] is off)");
                let error = clear_password_refused(&user, step);
                self.send_error(seq, &error).await?;
                return Err(End::Closed {
                    reason: super::CloseReason::LoginRefused,
                    message: error.message,
                });
            }
            Exchange::Refused(payload, seq) => {
                // Counted and delayed like a login's failure.
                wrong_password(&self.shared, peer, &user).await;
                // The server keeps the connection, logged in as before (below).
                self.after_refused_change_user();
                self.restore_trackers().await?;
                let err = ErrPacket::parse(&payload).ok();
                let code = err.as_ref().map_or(0, |e| e.code);
                if code == ER_ACCESS_DENIED_ERROR
                    && !node.as_ref().is_some_and(|n| n.proxy_protocol)
                {
                    // Without the PROXY protocol the server named holdfast's address: the
                    // client gets its own, as the server would answer it directly.
                    let with_password = !err
                        .as_ref()
                        .is_some_and(|e| e.message_lossy().contains("using password: NO"));
                    let error = ClientError::access_denied(
                        &user,
                        &self.shared.verifiers.client_host(peer),
                        with_password,
                    );
                    return self.send_error(seq, &error).await;
                }
                self.shared.metrics.count_error(code);
                return self
                    .client
                    .write_packet(&payload, seq)
                    .await
                    .map_err(End::Client);
            }
        }
        self.shared.admission.login_succeeded(peer, &user);
        self.statements.clear();
        self.record.reset();
        let database = String::from_utf8_lossy(&forwarded.database).into_owned();
        self.record.schema = Some(database).filter(|d| !d.is_empty());
        self.identity.user = self.shared.login_texts.get(&forwarded.user);
        self.identity.database = self.record.schema.as_deref().map(Box::from);
        if let Some(cs) = forwarded.charset {
            self.identity.charset = cs as u8;
        }
        self.captured = Captured::default();
        let can = secret.is_some() || matches!(verifier, Some(Verifier::Empty));
        self.can_reauthenticate = can;
        self.secret = secret;
        self.info.set_user(self.shared.user_names.get(&user));
        self.info.can_reauthenticate.store(can, Ordering::Relaxed);
        self.restore_trackers().await?;
        // The server's OK: a tracking client gets the new schema's record.
        let ok = login_ok(self.capabilities, Some(&forwarded.database));
        self.client
            .write_packet(&ok, seq)
            .await
            .map_err(End::Client)
    }

    /// The verifier of the account `user` changes to from the client's address. An account
    /// holdfast has not seen makes it read the accounts again first (at most every
    /// `verifier_miss_refresh_ms`), as a login does: the account may be new.
    async fn change_user_verifier(&self, user: &str, peer: std::net::IpAddr) -> Option<Verifier> {
        if let Some(account) = self.shared.verifiers.lookup(user, peer) {
            return Some(account.verifier());
        }
        let addr = self
            .shared
            .topology
            .borrow()
            .primary_node()
            .map(|n| n.address.clone());
        if let (Some(addr), true) = (addr, self.shared.gate.is_open()) {
            let min = std::time::Duration::from_millis(
                self.shared.config().auth.verifier_miss_refresh_ms,
            );
            if let Err(e) = self
                .shared
                .verifiers
                .refresh_waiting(&self.shared.config_snapshot(), &addr, min)
                .await
            {
                tracing::debug!(error = %e, "cannot re-read the accounts for a COM_CHANGE_USER");
            }
        }
        self.shared
            .verifiers
            .lookup(user, peer)
            .map(|a| a.verifier())
    }

    /// A COM_CHANGE_USER holdfast refused itself (a wrong password for an account it
    /// verifies, or an account that depends on the client's host). The server answers ERR
    /// (after a second) and keeps the connection, logged in as before but with its session
    /// reset (it resets before it authenticates, and counts the failure: from the fourth
    /// on it answers ERR 1047). For the backend to be in that same state it gets the
    /// request again with an answer that cannot match (`probe`: for which user), and
    /// holdfast answers the client as the backend did, in the server's words for the
    /// client's address.
    async fn change_user_refused(
        &mut self,
        cu: ChangeUser,
        seq: u8,
        denied: ClientError,
        probe: Probe,
    ) -> Result<(), End> {
        let user = match probe {
            Probe::SameUser => cu.user.clone(),
            // A user no account is for: the server counts no failure against an account
            // the client could not have logged in as directly.
            Probe::NoAccount => {
                format!("holdfast-no-account-{:016x}", rand::random::<u64>()).into_bytes()
            }
        };
        let probe = ChangeUser {
            user,
            // No password hashes to 20 zero bytes over any scramble that is not
            // pathological; an account without a password refuses any non-empty answer.
            auth_response: vec![0; 20],
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            ..cu
        };
        self.backend
            .conn
            .write_packet(&probe.encode(self.backend.capabilities), 0)
            .await
            .map_err(End::Backend)?;
        // The server may ask again over a fresh scramble (an authentication switch): the
        // same answer that cannot match, a few times at most.
        let mut rounds = 0;
        let answer = loop {
            let answer = self
                .backend
                .conn
                .read_packet(AUTH_MAX_PACKET)
                .await
                .map_err(End::Backend)?;
            rounds += 1;
            if answer.payload.first() != Some(&0xfe) || rounds > 3 {
                break answer;
            }
            let next = answer.seq.wrapping_add(1);
            self.backend
                .conn
                .write_packet(&[0; 20], next)
                .await
                .map_err(End::Backend)?;
        };
        let err = match answer.payload.first() {
            Some(&ERR_HEADER) => ErrPacket::parse(&answer.payload).ok().map(|e| e.code),
            _ => None,
        };
        let Some(code) = err else {
            // Accepted, or an exchange started: the backend is not where the client is.
            tracing::warn!(
                first = ?answer.payload.first(),
                "COM_CHANGE_USER refused, but the backend did not refuse it; closing"
            );
            self.send_error(seq, &denied).await?;
            return Err(End::Protocol(
                "COM_CHANGE_USER refused, but the backend did not refuse it".into(),
            ));
        };
        let payload = answer.payload.to_vec();
        self.after_refused_change_user();
        self.restore_trackers().await?;
        if code == denied.kind.code() {
            self.send_error(seq, &denied).await
        } else {
            self.shared.metrics.count_error(code);
            self.client
                .write_packet(&payload, seq)
                .await
                .map_err(End::Client)
        }
    }

    /// The session after a COM_CHANGE_USER the backend refused: the same user, database and
    /// character sets, everything else reset as by COM_RESET_CONNECTION (transaction rolled
    /// back, variables, temporary tables, prepared statements and locks gone). The backend
    /// reset its session trackers too: the caller enables them again.
    fn after_refused_change_user(&mut self) {
        const KEPT: [&str; 4] = [
            "character_set_client",
            "character_set_connection",
            "character_set_results",
            "collation_connection",
        ];
        let schema = self.record.schema.take();
        let kept: Vec<(String, String)> = self
            .record
            .variables
            .iter()
            .filter(|(name, _)| KEPT.iter().any(|k| name.eq_ignore_ascii_case(k)))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        self.statements.clear();
        self.record.reset();
        self.record.schema = schema;
        self.record.variables.extend(kept);
        self.captured = Captured::default();
    }
}

#[cfg(test)]
mod tests {
    use super::clear_password_step;

    /// Every session keeps its login's identity, boxed (issue 22): 56 bytes fit a 64-byte
    /// heap chunk (it was 80, with `Vec`s and a `String`, in a 96-byte one). What it
    /// holds reads back as the login sent it.
    #[test]
    fn a_sessions_identity_stays_small() {
        let size = std::mem::size_of::<super::Identity>();
        assert!(size <= 56, "an Identity is {size} bytes");
        let login = holdfast_wire::handshake::LoginRequest {
            capabilities: 0,
            max_packet: 0,
            charset: 45,
            user: b"app".to_vec(),
            auth_response: Vec::new(),
            database: Some(b"shop".to_vec()),
            auth_plugin: Vec::new(),
            attributes: b"\x0c_client_name\x07libmysql".to_vec(),
            mariadb_caps: 0,
        };
        let identity = super::Identity::of(&login, &Default::default());
        assert_eq!(&identity.user[..], b"app");
        assert_eq!(identity.database.as_deref(), Some("shop"));
        assert_eq!(&identity.attributes[..], &login.attributes[..]);
    }

    fn switch(plugin: &str) -> Vec<u8> {
        let mut p = vec![0xfe];
        p.extend_from_slice(plugin.as_bytes());
        p.push(0);
        p.extend_from_slice(b"12345678901234567890\0");
        p
    }

    #[test]
    fn clear_password_steps_are_recognised() {
        assert!(clear_password_step(&switch("mysql_clear_password"), "", false).is_some());
        assert!(clear_password_step(&switch("dialog"), "", true).is_some());
        // Over a plain client link these encrypt the password with the server's RSA key.
        assert!(clear_password_step(&switch("sha256_password"), "", false).is_none());
        assert!(clear_password_step(&switch("sha256_password"), "", true).is_some());
        let full_auth = [0x01, 0x04];
        assert!(clear_password_step(&full_auth, "caching_sha2_password", true).is_some());
        assert!(clear_password_step(&full_auth, "caching_sha2_password", false).is_none());
        // Fast authentication succeeded: no password follows.
        assert!(clear_password_step(&[0x01, 0x03], "caching_sha2_password", true).is_none());
        for safe in [
            "client_ed25519",
            "caching_sha2_password",
            "mysql_native_password",
        ] {
            assert!(
                clear_password_step(&switch(safe), "", true).is_none(),
                "{safe}"
            );
        }
        assert!(clear_password_step(&[], "", true).is_none());
        assert!(clear_password_step(&[0xfe], "", true).is_none());
    }
}
