//! Sessions over in-process streams, against scripted backends: no socket, no server.
//! Shared by the tests that drive a real session this way (`session_duplex.rs`,
//! `session_desync.rs`).
//!
//! The client end of a session is one side of a `tokio::io::duplex` pipe handed to
//! `session::run` (the test logs in over the other side with `holdfast_client`); every
//! backend connection the session opens goes through a [`ScriptedConnector`], which pairs
//! it with the next [`ScriptedServer`]: a script that speaks just enough of the server
//! protocol — a greeting, a mysql_native_password login, OK to holdfast's own setup
//! statements, scripted answers (rows, OK, ERR, or hanging up) to COM_QUERY, and built-in
//! answers to the rest: `SELECT <n>` returns one row holding `n`, `INSERT INTO t VALUES (<n>)`
//! affects `n` rows, BEGIN/COMMIT/ROLLBACK move the status flags, COM_PING and COM_INIT_DB
//! get OK, prepared statements are kept per connection (an execute returns its parameter, or
//! the number its text selects), and `LOAD DATA LOCAL INFILE` asks for the file and answers
//! with its size as the affected rows. A [`Fate`] hook decides, per packet received, whether
//! the server dies instead (on receiving it, after answering, or halfway through the
//! answer). The session checks the client's password itself, from a verifier the test puts
//! in the cache, so it can log in again when it moves.
//!
//! Every wait has a deadline.

#![allow(dead_code)]

use holdfast_client::{greet, login, Client, Login, DEFAULT_CAPABILITIES, UTF8MB4_GENERAL_CI};
use holdfast_cluster::topology::Topology;
use holdfast_proxy::backend::{BackendConnector, ConnectFuture};
use holdfast_proxy::config::{AuthConfig, BackendConfig, Config, ListenerMode, ProxyConfig};
use holdfast_proxy::conn::{BoxedIo, ConnError, PacketConn};
use holdfast_proxy::session;
use holdfast_proxy::verifiers::Account;
use holdfast_proxy::{Seams, Shared};
use holdfast_wire::auth::{printable_scramble, verify_native, PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::codec::{put_lenenc_bytes, Reader};
use holdfast_wire::command::*;
use holdfast_wire::frame;
use holdfast_wire::handshake::{ClientHello, Greeting};
use holdfast_wire::packets::{err_payload, ok_payload};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Generous: everything here is in-process.
pub const WAIT: Duration = Duration::from_secs(10);

pub const USER: &str = "app";
pub const PASSWORD: &str = "scripted-secret";
pub const NODE: &str = "node1";
/// Never resolved: the connector maps it to the scripted servers.
pub const NODE_ADDRESS: &str = "scripted-node1:3306";

/// MYSQL_TYPE_LONGLONG, the parameter type the tests bind.
pub const TYPE_LONGLONG: u8 = 0x08;

/// Waits for `fut` up to [`WAIT`], or panics naming `what`.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A COM_QUERY request payload.
pub fn query(sql: &str) -> Vec<u8> {
    let mut p = vec![COM_QUERY];
    p.extend_from_slice(sql.as_bytes());
    p
}

/// A request payload for statement command `cmd` on statement `id`, followed by `rest`.
pub fn statement_request(cmd: u8, id: u32, rest: &[u8]) -> Vec<u8> {
    let mut p = vec![cmd];
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(rest);
    p
}

/// COM_STMT_SEND_LONG_DATA for parameter 0 of statement `id`.
pub fn long_data(id: u32, data: &[u8]) -> Vec<u8> {
    statement_request(COM_STMT_SEND_LONG_DATA, id, &[&[0, 0][..], data].concat())
}

/// A COM_STMT_EXECUTE of a statement with one LONGLONG parameter sent as long data (so
/// with no value here).
pub fn execute_long(id: u32, with_types: bool) -> Vec<u8> {
    let mut rest = vec![0u8];
    rest.extend_from_slice(&1u32.to_le_bytes());
    rest.push(0);
    rest.push(u8::from(with_types));
    if with_types {
        rest.extend_from_slice(&[TYPE_LONGLONG, 0]);
    }
    statement_request(COM_STMT_EXECUTE, id, &rest)
}

/// A COM_STMT_EXECUTE of a statement with one LONGLONG parameter (`with_types`: the
/// parameter types are sent, as on a statement's first execute; afterwards a client may
/// leave them to the server's memory).
pub fn execute_one(id: u32, value: i64, with_types: bool) -> Vec<u8> {
    let mut rest = vec![0u8]; // no cursor
    rest.extend_from_slice(&1u32.to_le_bytes());
    rest.push(0); // null bitmap
    rest.push(u8::from(with_types));
    if with_types {
        rest.extend_from_slice(&[TYPE_LONGLONG, 0]);
    }
    rest.extend_from_slice(&value.to_le_bytes());
    statement_request(COM_STMT_EXECUTE, id, &rest)
}

// ---------------------------------------------------------------------------------------
// The scripted backend

/// A scripted answer to one statement.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A text result set (all columns VARCHAR).
    Rows {
        columns: Vec<String>,
        rows: Vec<Vec<Option<String>>>,
    },
    Ok {
        affected_rows: u64,
    },
    Err {
        code: u16,
        state: &'static str,
        message: &'static str,
    },
    /// Closes the connection without answering: the server died mid-statement.
    HangUp,
}

impl Reply {
    pub fn rows(columns: &[&str], rows: &[&[Option<&str>]]) -> Reply {
        Reply::Rows {
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: rows
                .iter()
                .map(|r| r.iter().map(|v| v.map(str::to_string)).collect())
                .collect(),
        }
    }

    /// One column, one row.
    pub fn value(v: &str) -> Reply {
        Reply::rows(&[v], &[&[Some(v)]])
    }
}

/// What a server does with a packet it received (after the login).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Answer,
    /// Closes the connection on receiving it, without answering.
    HangUp,
    /// Answers, then closes the connection.
    AnswerThenHangUp,
    /// Writes the first half of its answer, then closes the connection.
    HangUpMidAnswer,
}

/// A packet a [`Fate`] hook is asked about.
pub struct Seen<'a> {
    pub payload: &'a [u8],
    /// Part of a LOCAL INFILE file (the empty packet that ends it included).
    pub file: bool,
}

type FateHook = Arc<Mutex<dyn FnMut(&Seen<'_>) -> Fate + Send>>;

/// What a [`ScriptedServer`] answers: exact statement texts, then the built-in answers.
#[derive(Clone, Default)]
pub struct Script {
    replies: Vec<(String, Reply)>,
    fate: Option<FateHook>,
    connection_id: Option<u32>,
}

/// Connection ids as one server that keeps running hands them out: increasing.
static NEXT_CONNECTION_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(42);

impl Script {
    /// The id in the greeting (a server that just restarted gives low ids again); by
    /// default the next of an increasing sequence.
    pub fn connection_id(mut self, id: u32) -> Self {
        self.connection_id = Some(id);
        self
    }

    pub fn reply(mut self, sql: &str, reply: Reply) -> Self {
        self.replies.push((sql.to_string(), reply));
        self
    }

    /// Asks `f` about every packet received after the login.
    pub fn fate(mut self, f: impl FnMut(&Seen<'_>) -> Fate + Send + 'static) -> Self {
        self.fate = Some(Arc::new(Mutex::new(f)));
        self
    }

    fn fate_of(&self, seen: &Seen<'_>) -> Fate {
        match &self.fate {
            Some(f) => f.lock().map(|mut f| f(seen)).unwrap_or(Fate::Answer),
            None => Fate::Answer,
        }
    }

    pub fn answer(&self, sql: &str) -> Reply {
        if let Some((_, r)) = self.replies.iter().find(|(s, _)| s == sql) {
            return r.clone();
        }
        if sql == "SELECT @@global.read_only" {
            // What a moving session asks before it settles on a node: writable.
            return Reply::rows(&["@@global.read_only"], &[&[Some("0")]]);
        }
        if let Some(n) = sql.strip_prefix("SELECT ").filter(|n| is_number(n)) {
            return Reply::value(n);
        }
        if let Some(n) = sql
            .strip_prefix("INSERT INTO t VALUES (")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|n| n.parse().ok())
        {
            return Reply::Ok { affected_rows: n };
        }
        Reply::Ok { affected_rows: 0 }
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// What a scripted server saw and did, shared with the test.
#[derive(Default)]
pub struct ServerLog {
    /// Every COM_QUERY's text, in order.
    pub queries: Mutex<Vec<String>>,
    /// Every command's payload (file packets not included), in order.
    pub commands: Mutex<Vec<Vec<u8>>>,
    pub pings: AtomicUsize,
    /// LOCAL INFILE bytes received.
    pub file_bytes: AtomicUsize,
    /// The wire bytes of each answer, as written (or as much as was written).
    pub answers: Mutex<Vec<Vec<u8>>>,
    /// Tells the server to close the connection now (while the session idles).
    pub hang_up: Notify,
    /// How the connection ended, once it has.
    pub ended: watch::Sender<Option<String>>,
}

impl ServerLog {
    pub fn queries(&self) -> Vec<String> {
        self.queries.lock().map(|q| q.clone()).unwrap_or_default()
    }

    pub fn commands(&self) -> Vec<Vec<u8>> {
        self.commands.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// How many commands with command byte `cmd` arrived.
    pub fn count(&self, cmd: u8) -> usize {
        self.commands()
            .iter()
            .filter(|c| c.first() == Some(&cmd))
            .count()
    }

    pub fn last_answer(&self) -> Vec<u8> {
        self.answers
            .lock()
            .ok()
            .and_then(|a| a.last().cloned())
            .unwrap_or_default()
    }

    pub fn ended_now(&self) -> Option<String> {
        self.ended.borrow().clone()
    }

    pub async fn wait_ended(&self) -> String {
        let mut rx = self.ended.subscribe();
        let ended = within("the scripted server's connection to end", async {
            rx.wait_for(Option::is_some).await.map(|e| e.clone())
        })
        .await;
        ended.ok().flatten().unwrap_or_else(|| "log dropped".into())
    }
}

/// A statement prepared on a scripted server.
struct ServerStatement {
    sql: String,
    params: u16,
    /// The parameter types of the last execute that sent them.
    types: Option<Vec<u8>>,
    /// COM_STMT_SEND_LONG_DATA received since the last execute or reset.
    long_data: Option<Vec<u8>>,
}

/// One connection's state on a scripted server.
struct ConnState {
    deprecate_eof: bool,
    in_trans: bool,
    statements: HashMap<u32, ServerStatement>,
    next_id: u32,
}

impl ConnState {
    fn status(&self) -> u16 {
        SERVER_STATUS_AUTOCOMMIT
            | if self.in_trans {
                SERVER_STATUS_IN_TRANS
            } else {
                0
            }
    }
}

/// One backend connection's worth of server, following a [`Script`].
pub struct ScriptedServer {
    script: Script,
    log: Arc<ServerLog>,
}

impl ScriptedServer {
    pub fn new(script: Script) -> (ScriptedServer, Arc<ServerLog>) {
        let log = Arc::new(ServerLog::default());
        let server = ScriptedServer {
            script,
            log: log.clone(),
        };
        (server, log)
    }

    pub async fn run(self, stream: BoxedIo) {
        let how = self.serve(stream).await;
        self.log.ended.send_replace(Some(how));
    }

    async fn serve(&self, stream: BoxedIo) -> String {
        let mut conn = PacketConn::new(stream);
        let scramble = printable_scramble(rand::random());
        let greeting = Greeting {
            server_version: b"11.4.2-MariaDB-scripted".to_vec(),
            connection_id: self.script.connection_id.unwrap_or_else(|| {
                NEXT_CONNECTION_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            }),
            scramble: scramble.to_vec(),
            capabilities: PROXY_CAPABILITIES | BACKEND_REQUIRED,
            charset: UTF8MB4_GENERAL_CI,
            status: SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
            mariadb_caps: 0,
        };
        if conn.write_packet(&greeting.encode(), 0).await.is_err() {
            return "closed before the login".into();
        }
        let Ok(hello) = conn.read_packet(1 << 20).await else {
            return "closed before the login".into();
        };
        let Ok(ClientHello::Login(req)) = ClientHello::parse(&hello.payload) else {
            return "not a login".into();
        };
        let verifier = PasswordHash::from_password(PASSWORD.as_bytes()).verifier();
        let seq = hello.seq.wrapping_add(1);
        if req.user != USER.as_bytes()
            || verify_native(&req.auth_response, &scramble, &verifier).is_none()
        {
            let refusal = err_payload(1045, "28000", "Access denied (scripted)");
            let _ = conn.write_packet(&refusal, seq).await;
            return "login refused".into();
        }
        let mut st = ConnState {
            deprecate_eof: req.capabilities & CLIENT_DEPRECATE_EOF != 0,
            in_trans: false,
            statements: HashMap::new(),
            next_id: 1,
        };
        let ok = ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0);
        if conn.write_packet(&ok, seq).await.is_err() {
            return "closed after the login".into();
        }
        loop {
            let packet = tokio::select! {
                p = conn.read_packet(1 << 24) => p,
                _ = self.log.hang_up.notified() => return "hung up while idle".into(),
            };
            let packet = match packet {
                Ok(p) => p,
                Err(ConnError::Closed) => return "closed by holdfast".into(),
                Err(_) => return "read error".into(),
            };
            let payload = &packet.payload[..];
            if let Ok(mut c) = self.log.commands.lock() {
                c.push(payload.to_vec());
            }
            let cmd = payload.first().copied().unwrap_or(0);
            let fate = self.script.fate_of(&Seen {
                payload,
                file: false,
            });
            if fate == Fate::HangUp {
                return format!("hung up on receiving {}", name(cmd));
            }
            let answer = match cmd {
                COM_QUIT => return "COM_QUIT".into(),
                COM_PING => {
                    self.log.pings.fetch_add(1, Ordering::SeqCst);
                    frame::packet(&ok_payload(0, 0, st.status(), 0), 1)
                }
                COM_INIT_DB => frame::packet(&ok_payload(0, 0, st.status(), 0), 1),
                COM_STMT_RESET => {
                    let id = holdfast_wire::packets::statement_id(payload);
                    if let Some(stmt) = id.and_then(|id| st.statements.get_mut(&id)) {
                        stmt.long_data = None;
                    }
                    frame::packet(&ok_payload(0, 0, st.status(), 0), 1)
                }
                COM_QUERY => {
                    let sql = String::from_utf8_lossy(&payload[1..]).into_owned();
                    if let Ok(mut q) = self.log.queries.lock() {
                        q.push(sql.clone());
                    }
                    if sql.starts_with("LOAD DATA LOCAL INFILE") {
                        match self.file_exchange(&mut conn, &st, fate).await {
                            Ok(()) => continue,
                            Err(how) => return how,
                        }
                    }
                    match self.script.answer(&sql) {
                        Reply::HangUp => return "hung up mid-statement".into(),
                        reply => {
                            match sql.as_str() {
                                "BEGIN" | "START TRANSACTION" => st.in_trans = true,
                                "COMMIT" | "ROLLBACK" => st.in_trans = false,
                                _ => {}
                            }
                            encode_from(&reply, st.deprecate_eof, st.status(), 1)
                        }
                    }
                }
                COM_STMT_PREPARE => st.prepare(&payload[1..]),
                COM_STMT_EXECUTE => st.execute(payload),
                COM_STMT_CLOSE => {
                    if let Some(id) = holdfast_wire::packets::statement_id(payload) {
                        st.statements.remove(&id);
                    }
                    Vec::new()
                }
                COM_STMT_SEND_LONG_DATA => {
                    let id = holdfast_wire::packets::statement_id(payload);
                    if let Some(stmt) = id.and_then(|id| st.statements.get_mut(&id)) {
                        let data = payload.get(7..).unwrap_or_default();
                        stmt.long_data
                            .get_or_insert_with(Vec::new)
                            .extend_from_slice(data);
                    }
                    Vec::new()
                }
                _ => frame::packet(&err_payload(1047, "08S01", "Unknown command"), 1),
            };
            if answer.is_empty() {
                if fate == Fate::Answer {
                    continue;
                }
                return format!("hung up after {}", name(cmd));
            }
            if let Err(how) = self.send(&mut conn, &answer, fate, cmd).await {
                return how;
            }
        }
    }

    /// Writes `answer` as `fate` says; `Err` with how the connection ended when it did.
    async fn send(
        &self,
        conn: &mut PacketConn,
        answer: &[u8],
        fate: Fate,
        cmd: u8,
    ) -> Result<(), String> {
        let part = match fate {
            Fate::HangUpMidAnswer => &answer[..answer.len() / 2],
            _ => answer,
        };
        if let Ok(mut a) = self.log.answers.lock() {
            a.push(part.to_vec());
        }
        // One write, so the client may see the answer in any number of reads.
        if conn.write_raw(part).await.is_err() {
            return Err("closed by holdfast".into());
        }
        match fate {
            Fate::HangUpMidAnswer => {
                Err(format!("hung up halfway through answering {}", name(cmd)))
            }
            Fate::AnswerThenHangUp => Err(format!("hung up after answering {}", name(cmd))),
            _ => Ok(()),
        }
    }

    /// LOAD DATA LOCAL INFILE: asks for the file, reads it up to its empty packet (asking
    /// the fate hook about each packet), and answers OK with the file's size as the
    /// affected rows.
    async fn file_exchange(
        &self,
        conn: &mut PacketConn,
        st: &ConnState,
        fate: Fate,
    ) -> Result<(), String> {
        let mut request = vec![holdfast_wire::packets::LOCAL_INFILE_HEADER];
        request.extend_from_slice(b"scripted.tsv");
        if conn.write_packet(&request, 1).await.is_err() {
            return Err("closed by holdfast".into());
        }
        let mut size = 0usize;
        loop {
            let packet = match conn.read_packet(1 << 24).await {
                Ok(p) => p,
                Err(_) => return Err("closed by holdfast mid-file".into()),
            };
            let seen = Seen {
                payload: &packet.payload,
                file: true,
            };
            if self.script.fate_of(&seen) == Fate::HangUp {
                return Err("hung up mid-file".into());
            }
            size += packet.payload.len();
            self.log
                .file_bytes
                .fetch_add(packet.payload.len(), Ordering::SeqCst);
            if packet.payload.is_empty() {
                let ok = ok_payload(size as u64, 0, st.status(), 0);
                let answer = frame::packet(&ok, packet.seq.wrapping_add(1));
                return self.send(conn, &answer, fate, COM_QUERY).await;
            }
        }
    }
}

impl ConnState {
    /// COM_STMT_PREPARE: as many parameters as `?`s, one VARCHAR column named after what
    /// follows `AS ` (or `v`).
    fn prepare(&mut self, sql: &[u8]) -> Vec<u8> {
        let sql = String::from_utf8_lossy(sql).into_owned();
        let params = sql.matches('?').count() as u16;
        let column_name = sql.rsplit_once("AS ").map_or("v", |(_, c)| c).to_string();
        let id = self.next_id;
        self.next_id += 1;
        self.statements.insert(
            id,
            ServerStatement {
                sql,
                params,
                types: None,
                long_data: None,
            },
        );
        let mut first = vec![0x00];
        first.extend_from_slice(&id.to_le_bytes());
        first.extend_from_slice(&1u16.to_le_bytes());
        first.extend_from_slice(&params.to_le_bytes());
        first.push(0);
        first.extend_from_slice(&0u16.to_le_bytes());
        let mut packets = vec![first];
        let eof = eof_payload(self.status());
        if params > 0 {
            packets.extend((0..params).map(|_| column("?")));
            if !self.deprecate_eof {
                packets.push(eof.to_vec());
            }
        }
        packets.push(column(&column_name));
        if !self.deprecate_eof {
            packets.push(eof.to_vec());
        }
        frame_all(&packets, 1)
    }

    /// COM_STMT_EXECUTE: a binary result of one row, holding the statement's LONGLONG
    /// parameter as text (or, without parameters, the number its text selects).
    fn execute(&mut self, payload: &[u8]) -> Vec<u8> {
        let refuse =
            |code: u16, message: &str| frame::packet(&err_payload(code, "HY000", message), 1);
        let Some(id) = holdfast_wire::packets::statement_id(payload) else {
            return refuse(1835, "malformed execute");
        };
        let Some(stmt) = self.statements.get_mut(&id) else {
            return refuse(1243, "Unknown prepared statement handler given to EXECUTE");
        };
        let value = if stmt.params == 1 {
            // id(4) flags(1) iterations(4), then null bitmap(1), new-params-bound(1).
            let mut r = Reader::new(&payload[1..]);
            let _ = r.skip(9, "header");
            let _ = r.u8("null bitmap");
            match r.u8("bound") {
                Ok(1) => match r.take(2, "types") {
                    Ok(t) => stmt.types = Some(t.to_vec()),
                    Err(_) => return refuse(1835, "no types"),
                },
                Ok(_) => {}
                Err(_) => return refuse(1835, "no bound flag"),
            }
            if stmt.types.as_deref() != Some(&[TYPE_LONGLONG, 0][..]) {
                return refuse(1210, "Incorrect arguments to mysqld_stmt_execute");
            }
            // A parameter sent as long data has no value here; the execute ends it.
            match (stmt.long_data.take(), r.u64("value")) {
                (Some(data), _) => String::from_utf8_lossy(&data).into_owned(),
                (None, Ok(v)) => (v as i64).to_string(),
                (None, Err(_)) => return refuse(1835, "no value"),
            }
        } else {
            stmt.sql.trim_start_matches("SELECT ").to_string()
        };
        let mut row = vec![0x00, 0x00];
        put_lenenc_bytes(&mut row, value.as_bytes());
        let status = self.status();
        let mut packets = vec![vec![1], column("v")];
        if !self.deprecate_eof {
            packets.push(eof_payload(status).to_vec());
        }
        packets.push(row);
        packets.push(terminator(self.deprecate_eof, status));
        frame_all(&packets, 1)
    }
}

/// A VARCHAR column definition (ColumnDefinition41).
pub fn column(name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for s in ["def", "", "", "", name, ""] {
        put_lenenc_bytes(&mut p, s.as_bytes());
    }
    p.push(0x0c);
    p.extend_from_slice(&[45, 0, 10, 0, 0, 0, 253, 0, 0, 0, 0, 0]);
    p
}

fn eof_payload(status: u16) -> [u8; 5] {
    let s = status.to_le_bytes();
    [0xfe, 0, 0, s[0], s[1]]
}

/// What ends a result set: EOF, or the OK that replaces it under CLIENT_DEPRECATE_EOF.
fn terminator(deprecate_eof: bool, status: u16) -> Vec<u8> {
    let s = status.to_le_bytes();
    match deprecate_eof {
        true => vec![0xfe, 0, 0, s[0], s[1], 0, 0],
        false => eof_payload(status).to_vec(),
    }
}

fn frame_all(packets: &[Vec<u8>], mut seq: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for p in packets {
        seq = frame::put_packet(&mut out, p, seq);
    }
    out
}

/// A reply's wire bytes, sequence ids from 1, with autocommit status.
pub fn encode(reply: &Reply, deprecate_eof: bool) -> Vec<u8> {
    encode_from(reply, deprecate_eof, SERVER_STATUS_AUTOCOMMIT, 1)
}

/// A reply's wire bytes, sequence ids from `seq`.
pub fn encode_from(reply: &Reply, deprecate_eof: bool, status: u16, seq: u8) -> Vec<u8> {
    let mut packets = Vec::new();
    match reply {
        Reply::Rows { columns, rows } => {
            packets.push(vec![columns.len() as u8]);
            packets.extend(columns.iter().map(|c| column(c)));
            if !deprecate_eof {
                packets.push(eof_payload(status).to_vec());
            }
            for row in rows {
                let mut p = Vec::new();
                for v in row {
                    match v {
                        Some(v) => put_lenenc_bytes(&mut p, v.as_bytes()),
                        None => p.push(0xfb),
                    }
                }
                packets.push(p);
            }
            packets.push(terminator(deprecate_eof, status));
        }
        Reply::Ok { affected_rows } => packets.push(ok_payload(*affected_rows, 0, status, 0)),
        Reply::Err {
            code,
            state,
            message,
        } => packets.push(err_payload(*code, state, message)),
        Reply::HangUp => {}
    }
    frame_all(&packets, seq)
}

type Factory = Box<dyn Fn(usize) -> ScriptedServer + Send + Sync>;

/// Hands each backend connection to the next scripted server (from the list, then from the
/// factory if there is one); refuses once none is left or for an address it does not know.
pub struct ScriptedConnector {
    servers: Mutex<VecDeque<ScriptedServer>>,
    factory: Option<Factory>,
    connects: AtomicUsize,
}

impl ScriptedConnector {
    pub fn new(servers: Vec<ScriptedServer>) -> ScriptedConnector {
        ScriptedConnector {
            servers: Mutex::new(servers.into()),
            factory: None,
            connects: AtomicUsize::new(0),
        }
    }

    /// A new server for every connection: `make(n)` for the n-th (from 0).
    pub fn endless(make: impl Fn(usize) -> ScriptedServer + Send + Sync + 'static) -> Self {
        ScriptedConnector {
            servers: Mutex::new(VecDeque::new()),
            factory: Some(Box::new(make)),
            connects: AtomicUsize::new(0),
        }
    }

    pub fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

impl BackendConnector for ScriptedConnector {
    fn connect<'a>(&'a self, address: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move {
            let n = self.connects.fetch_add(1, Ordering::SeqCst);
            let refused =
                |why: &str| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, why);
            if address != NODE_ADDRESS {
                return Err(refused("not a scripted address"));
            }
            let next = self.servers.lock().ok().and_then(|mut s| s.pop_front());
            let server = match (next, &self.factory) {
                (Some(s), _) => s,
                (None, Some(make)) => make(n),
                (None, None) => return Err(refused("no scripted server left")),
            };
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(server.run(Box::new(theirs)));
            Ok(Box::new(ours) as BoxedIo)
        })
    }
}

// ---------------------------------------------------------------------------------------
// The rig: a session on a duplex pipe, its client logged in

pub struct Rig {
    pub shared: Arc<Shared>,
    pub connector: Arc<ScriptedConnector>,
    /// The session's task: ends when the session does.
    pub session: JoinHandle<()>,
    pub client: Client,
    _topology: watch::Sender<Arc<Topology>>,
}

/// Starts a session on one end of a pipe, with `servers` behind the node's address in
/// turn, and logs in over the other end.
pub async fn rig(servers: Vec<ScriptedServer>) -> Rig {
    rig_with(ScriptedConnector::new(servers), DEFAULT_CAPABILITIES).await
}

/// [`rig`] with any connector, the client asking for `capabilities` (as far as holdfast
/// offers them).
pub async fn rig_with(connector: ScriptedConnector, capabilities: u32) -> Rig {
    let config = Arc::new(Config {
        proxy: ProxyConfig {
            hold_window_ms: 3_000,
            ..ProxyConfig::default()
        },
        admin: Default::default(),
        auth: AuthConfig::default(),
        backends: vec![BackendConfig {
            name: NODE.into(),
            address: NODE_ADDRESS.into(),
            proxy_protocol: false,
        }],
        ha: Default::default(),
        driver: Default::default(),
        listeners: Vec::new(),
        serverless: None,
        ..Config::default()
    });
    config.validate().expect("test configuration");
    // No monitor runs: before its first round the first node is where sessions go.
    let (tx, rx) = watch::channel(Arc::new(Topology::from_config(&config)));
    let connector = Arc::new(connector);
    let seams = Seams {
        backend_connector: Some(connector.clone()),
        ..Seams::default()
    };
    let shared = Arc::new(Shared::with_seams(config, rx, seams));
    let verifier = PasswordHash::from_password(PASSWORD.as_bytes()).verifier();
    let hex: String = verifier.iter().map(|b| format!("{b:02X}")).collect();
    shared.verifiers.replace(vec![Account {
        user: USER.into(),
        host: "%".into(),
        plugin: NATIVE_PASSWORD.into(),
        auth_string: format!("*{hex}"),
    }]);
    let (client_end, session_end) = tokio::io::duplex(64 * 1024);
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    let session = tokio::spawn(session::run(
        shared.clone(),
        Box::new(session_end),
        peer,
        ListenerMode::Session,
    ));
    let client = within("the client's login", async {
        let (conn, greeting) = greet(Box::new(client_end)).await?;
        let secret = PasswordHash::from_password(PASSWORD.as_bytes());
        let as_app = Login {
            user: USER.as_bytes(),
            secret: Some(&secret),
            database: None,
            charset: UTF8MB4_GENERAL_CI,
            attributes: &[],
            mariadb_caps: 0,
        };
        let caps = capabilities & (greeting.capabilities | CLIENT_LONG_PASSWORD);
        login(conn, greeting, &as_app, caps, None).await
    })
    .await
    .expect("the login through holdfast");
    Rig {
        shared,
        connector,
        session,
        client,
        _topology: tx,
    }
}

impl Rig {
    /// Sends `payload` as a new command and returns the raw bytes of its answer, as many as
    /// `server`'s last answer had (read once the first of them arrived).
    pub async fn raw_answer(&mut self, payload: &[u8], server: &ServerLog) -> Vec<u8> {
        let conn = &mut self.client.conn;
        conn.write_packet(payload, 0).await.expect("request sent");
        within("the answer", async {
            conn.fill().await.expect("an answer");
            let want = server.last_answer().len();
            while conn.rbuf.len() < want {
                conn.fill().await.expect("the rest of the answer");
            }
            conn.rbuf.split_to(want).to_vec()
        })
        .await
    }

    /// A COM_PING through the session; panics unless it is answered with OK.
    pub async fn ping(&mut self) {
        let conn = &mut self.client.conn;
        conn.write_packet(&[COM_PING], 0).await.expect("ping sent");
        let answer = within("the ping's answer", conn.read_packet(1 << 20))
            .await
            .expect("an answer to the ping");
        assert_eq!(answer.payload.first(), Some(&0x00), "{:?}", answer.payload);
        assert_eq!(answer.seq, 1);
    }

    /// What arrives for the client within `wait` (after a command without a reply, nothing
    /// must): the bytes, or `None` if none came, the connection staying open or not.
    pub async fn anything_within(&mut self, wait: Duration) -> Option<Vec<u8>> {
        let conn = &mut self.client.conn;
        if conn.rbuf.is_empty() {
            let _ = tokio::time::timeout(wait, conn.fill()).await;
        }
        (!conn.rbuf.is_empty()).then(|| conn.rbuf.to_vec())
    }
}
