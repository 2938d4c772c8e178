//! Connections to database nodes: opening one and logging in on a client's behalf, and a
//! small text-protocol query helper used by the monitor and for session setup. The
//! protocol work is `holdfast_client`'s; this module adds the proxy's capability policy.

use holdfast_client::Login;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::*;
use holdfast_wire::packets::OkPacket;
use std::time::Duration;

pub use holdfast_client::{
    open, parse_text_row, Client as BackendConn, ClientError as BackendError, Executed, OkInfo,
    TextResult, ENABLE_TRACKERS,
};

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
    pub attributes: &'a [u8],
    /// Pass-through connections: the backend gets exactly the client's semantics, without
    /// the session tracking holdfast would otherwise add, because holdfast will not read
    /// the responses.
    pub exact_capabilities: bool,
}

/// Capabilities for a backend connection serving a client that negotiated `client_caps`.
pub fn backend_capabilities(client_caps: u32, server_caps: u32) -> u32 {
    ((client_caps & PROXY_CAPABILITIES) | BACKEND_REQUIRED) & (server_caps | CLIENT_SESSION_TRACK)
}

/// Capabilities for a pass-through backend connection: the client's own, plus only what
/// holdfast's login exchange needs.
pub fn exact_capabilities(client_caps: u32, server_caps: u32) -> u32 {
    ((client_caps & PROXY_CAPABILITIES) | (BACKEND_REQUIRED & !CLIENT_SESSION_TRACK)) & server_caps
}

/// Opens a connection and logs in with a known secret (mysql_native_password).
pub async fn connect(
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
    };
    let capabilities = |server_caps| {
        if params.exact_capabilities {
            exact_capabilities(params.client_capabilities, server_caps)
        } else {
            backend_capabilities(params.client_capabilities, server_caps)
        }
    };
    holdfast_client::connect(addr, &login, capabilities, timeout).await
}

/// Parses an OK payload from a backend (which always has session tracking negotiated).
pub fn parse_ok(payload: &[u8]) -> Option<OkPacket<'_>> {
    OkPacket::parse(payload, true).ok()
}
