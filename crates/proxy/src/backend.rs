//! Connections to database nodes: opening one and logging in on a client's behalf, and a
//! small text-protocol query helper used by the monitor and for session setup.

use crate::conn::{ConnError, PacketConn};
use holdfast_wire::auth::{PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::codec::Reader;
use holdfast_wire::command::COM_QUERY;
use holdfast_wire::handshake::{AuthSwitch, Greeting, LoginRequest};
use holdfast_wire::packets::{ErrPacket, OkPacket, ERR_HEADER, OK_HEADER};
use holdfast_wire::response::{Event, Expect, Kind, ResponseMachine};
use std::time::Duration;
use tokio::net::TcpStream;

/// The statement that turns on every session tracker holdfast reads.
pub const ENABLE_TRACKERS: &str = "SET SESSION session_track_system_variables='*', \
session_track_schema=ON, session_track_state_change=ON, \
session_track_transaction_info='CHARACTERISTICS'";

/// Largest packet holdfast accepts from a backend during login or in monitor queries.
const CONTROL_MAX_PACKET: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
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
}

impl BackendError {
    pub fn from_err_payload(payload: &[u8]) -> Self {
        match ErrPacket::parse(payload) {
            Ok(e) => BackendError::Server {
                code: e.code,
                state: String::from_utf8_lossy(&e.sql_state).into_owned(),
                message: e.message_lossy(),
                payload: payload.to_vec(),
            },
            Err(e) => BackendError::Conn(ConnError::Wire(e)),
        }
    }
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
    pub attributes: &'a [u8],
    /// Pass-through connections: the backend gets exactly the client's semantics, without
    /// the session tracking holdfast would otherwise add, because holdfast will not read
    /// the responses.
    pub exact_capabilities: bool,
}

pub struct BackendConn {
    pub conn: PacketConn,
    pub greeting: Greeting,
    pub capabilities: u32,
}

/// Opens a TCP connection and reads the server's greeting.
pub async fn open(addr: &str, timeout: Duration) -> Result<(PacketConn, Greeting), BackendError> {
    let fut = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| BackendError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let mut conn = PacketConn::new(stream);
        let greet = conn.read_packet(CONTROL_MAX_PACKET).await?;
        if greet.payload.first() == Some(&ERR_HEADER) {
            return Err(BackendError::from_err_payload(&greet.payload));
        }
        let greeting = Greeting::parse(&greet.payload).map_err(ConnError::Wire)?;
        Ok((conn, greeting))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BackendError::Timeout(timeout))?
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
    let fut = async {
        let (mut conn, greeting) = open(addr, timeout).await?;
        let capabilities = if params.exact_capabilities {
            exact_capabilities(params.client_capabilities, greeting.capabilities)
        } else {
            backend_capabilities(params.client_capabilities, greeting.capabilities)
        };
        let auth_response = match params.secret {
            Some(s) => s.scramble_response(&greeting.scramble).to_vec(),
            None => Vec::new(),
        };
        let login = LoginRequest {
            capabilities,
            max_packet: 1 << 30,
            charset: params.charset,
            user: params.user.to_vec(),
            auth_response,
            database: params.database.map(<[u8]>::to_vec),
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            attributes: params.attributes.to_vec(),
        };
        conn.write_packet(&login.encode(), 1).await?;
        loop {
            let p = conn.read_packet(CONTROL_MAX_PACKET).await?;
            match p.payload.first() {
                Some(&OK_HEADER) => break,
                Some(&ERR_HEADER) => return Err(BackendError::from_err_payload(&p.payload)),
                Some(0xfe) => {
                    let switch = AuthSwitch::parse(&p.payload).map_err(ConnError::Wire)?;
                    if switch.plugin != NATIVE_PASSWORD.as_bytes() {
                        return Err(BackendError::UnsupportedPlugin(
                            String::from_utf8_lossy(&switch.plugin).into_owned(),
                        ));
                    }
                    let answer = match params.secret {
                        Some(s) => s.scramble_response(&switch.data).to_vec(),
                        None => Vec::new(),
                    };
                    conn.write_packet(&answer, p.seq.wrapping_add(1)).await?;
                }
                _ => {
                    return Err(BackendError::UnsupportedPlugin(
                        "(extra auth data requested)".into(),
                    ))
                }
            }
        }
        Ok(BackendConn {
            conn,
            greeting,
            capabilities,
        })
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| BackendError::Timeout(timeout))?
}

/// A text result: rows of nullable columns, plus the final OK's status.
#[derive(Debug, Default, Clone)]
pub struct TextResult {
    pub rows: Vec<Vec<Option<String>>>,
    pub status: u16,
    pub affected_rows: u64,
}

impl BackendConn {
    /// Runs a statement and collects its (last) text result. For control queries only: the
    /// whole result is buffered.
    pub async fn query(&mut self, sql: &str) -> Result<TextResult, BackendError> {
        let mut cmd = Vec::with_capacity(sql.len() + 1);
        cmd.push(COM_QUERY);
        cmd.extend_from_slice(sql.as_bytes());
        self.conn.write_packet(&cmd, 0).await?;
        let mut m = ResponseMachine::new(
            Expect::ResultSets,
            self.capabilities & CLIENT_DEPRECATE_EOF != 0,
        );
        let mut result = TextResult::default();
        let mut definitions_left: u64 = 0;
        let mut error = None;
        while !m.is_done() {
            let p = self.conn.read_packet(CONTROL_MAX_PACKET).await?;
            let len = p.payload.len().min(holdfast_wire::frame::MAX_PAYLOAD - 1);
            match m.classify(len, p.payload.first().copied()) {
                Kind::Opaque if definitions_left > 0 => definitions_left -= 1,
                Kind::Opaque => result.rows.push(parse_text_row(&p.payload)),
                Kind::Inspect => match m.on_packet(&p.payload).map_err(ConnError::Wire)? {
                    Event::Err(_) => error = Some(BackendError::from_err_payload(&p.payload)),
                    Event::Ok(ok) => {
                        result.status = ok.status;
                        result.affected_rows = ok.affected_rows;
                    }
                    Event::Eof(eof) => result.status = eof.status,
                    Event::None => {
                        // A column count: a new result set starts.
                        result.rows.clear();
                        definitions_left =
                            Reader::new(&p.payload).lenenc_int("columns").unwrap_or(0);
                    }
                    Event::LocalInfile => {
                        // Control queries never ask for a file; answer "no file".
                        self.conn.write_packet(&[], p.seq.wrapping_add(1)).await?;
                    }
                    Event::PrepareOk(_) => {}
                },
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    /// Turns on the session trackers holdfast relies on; false when the server has none.
    pub async fn enable_trackers(&mut self) -> Result<bool, BackendError> {
        match self.query(ENABLE_TRACKERS).await {
            Ok(_) => Ok(true),
            Err(BackendError::Server { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Decodes a text-protocol row (lenenc strings, 0xfb for NULL).
pub fn parse_text_row(payload: &[u8]) -> Vec<Option<String>> {
    let mut r = Reader::new(payload);
    let mut row = Vec::new();
    while !r.is_empty() {
        if payload.get(r.position()) == Some(&0xfb) {
            let _ = r.u8("null");
            row.push(None);
            continue;
        }
        match r.lenenc_bytes("column") {
            Ok(v) => row.push(Some(String::from_utf8_lossy(v).into_owned())),
            Err(_) => break,
        }
    }
    row
}

/// Parses an OK payload from a backend (which always has session tracking negotiated).
pub fn parse_ok(payload: &[u8]) -> Option<OkPacket<'_>> {
    OkPacket::parse(payload, true).ok()
}
