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

/// One OK packet of a statement's answer.
#[derive(Debug, Clone, Default)]
pub struct OkInfo {
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    /// The raw session state block (see `SessionRecord::apply_session_state`).
    pub session_state: Vec<u8>,
}

/// A buffered answer to one of holdfast's own statements: the last result set's column
/// names and rows with raw column bytes (no charset decoding), and every OK.
#[derive(Debug, Clone, Default)]
pub struct Executed {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<Vec<u8>>>>,
    pub oks: Vec<OkInfo>,
    /// The status flags of the final OK or EOF.
    pub status: u16,
}

impl Executed {
    /// The rows as text (invalid UTF-8 replaced).
    pub fn text_rows(&self) -> Vec<Vec<Option<String>>> {
        self.rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|c| c.as_ref().map(|b| String::from_utf8_lossy(b).into_owned()))
                    .collect()
            })
            .collect()
    }
}

impl BackendConn {
    /// Runs one statement (COM_QUERY) and buffers its whole answer. For holdfast's own
    /// statements only (control queries, session capture and restore); packets larger than
    /// `max_packet` fail the connection.
    pub async fn execute(
        &mut self,
        sql: &[u8],
        max_packet: usize,
    ) -> Result<Executed, BackendError> {
        let mut cmd = Vec::with_capacity(sql.len() + 1);
        cmd.push(COM_QUERY);
        cmd.extend_from_slice(sql);
        self.conn.write_packet(&cmd, 0).await?;
        let mut m = ResponseMachine::new(
            Expect::ResultSets,
            self.capabilities & CLIENT_DEPRECATE_EOF != 0,
        );
        let mut out = Executed::default();
        let mut definitions_left: u64 = 0;
        let mut error = None;
        while !m.is_done() {
            let p = self.conn.read_packet(max_packet).await?;
            let len = p.payload.len().min(holdfast_wire::frame::MAX_PAYLOAD - 1);
            match m.classify(len, p.payload.first().copied()) {
                Kind::Opaque if definitions_left > 0 => {
                    definitions_left -= 1;
                    out.columns.push(column_name(&p.payload));
                }
                Kind::Opaque => out.rows.push(raw_text_row(&p.payload)),
                Kind::Inspect => match m.on_packet(&p.payload).map_err(ConnError::Wire)? {
                    Event::Err(_) => error = Some(BackendError::from_err_payload(&p.payload)),
                    Event::Ok(ok) => {
                        out.status = ok.status;
                        out.oks.push(OkInfo {
                            affected_rows: ok.affected_rows,
                            last_insert_id: ok.last_insert_id,
                            status: ok.status,
                            session_state: ok.session_state.to_vec(),
                        });
                    }
                    Event::Eof(eof) => out.status = eof.status,
                    Event::None => {
                        // A column count: a new result set starts.
                        out.rows.clear();
                        out.columns.clear();
                        definitions_left =
                            Reader::new(&p.payload).lenenc_int("columns").unwrap_or(0);
                    }
                    Event::LocalInfile => {
                        // holdfast's own statements never ask for a file; answer "no file".
                        self.conn.write_packet(&[], p.seq.wrapping_add(1)).await?;
                    }
                    Event::PrepareOk(_) => {}
                },
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Runs a statement and returns its (last) result as text. For control queries.
    pub async fn query(&mut self, sql: &str) -> Result<TextResult, BackendError> {
        let r = self.execute(sql.as_bytes(), CONTROL_MAX_PACKET).await?;
        Ok(TextResult {
            rows: r.text_rows(),
            status: r.status,
            affected_rows: r.oks.last().map_or(0, |ok| ok.affected_rows),
        })
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

/// Decodes a text-protocol row (lenenc strings, 0xfb for NULL) as text.
pub fn parse_text_row(payload: &[u8]) -> Vec<Option<String>> {
    raw_text_row(payload)
        .into_iter()
        .map(|c| c.map(|b| String::from_utf8_lossy(&b).into_owned()))
        .collect()
}

/// Decodes a text-protocol row keeping each column's bytes.
fn raw_text_row(payload: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut r = Reader::new(payload);
    let mut row = Vec::new();
    while !r.is_empty() {
        if payload.get(r.position()) == Some(&0xfb) {
            let _ = r.u8("null");
            row.push(None);
            continue;
        }
        match r.lenenc_bytes("column") {
            Ok(v) => row.push(Some(v.to_vec())),
            Err(_) => break,
        }
    }
    row
}

/// The `name` of a ColumnDefinition41 (after catalog, schema, table, org_table).
fn column_name(payload: &[u8]) -> String {
    let mut r = Reader::new(payload);
    for what in ["catalog", "schema", "table", "org_table"] {
        if r.lenenc_bytes(what).is_err() {
            return String::new();
        }
    }
    r.lenenc_bytes("name")
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// Parses an OK payload from a backend (which always has session tracking negotiated).
pub fn parse_ok(payload: &[u8]) -> Option<OkPacket<'_>> {
    OkPacket::parse(payload, true).ok()
}
