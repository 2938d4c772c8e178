//! Sessions over in-process streams, against scripted backends: no socket, no server.
//!
//! The client end of a session is one side of a `tokio::io::duplex` pipe handed to
//! `session::run` (the test logs in over the other side with `holdfast_client`); every
//! backend connection the session opens goes through a [`ScriptedConnector`], which pairs
//! it with the next [`ScriptedServer`]: a script that speaks just enough of the server
//! protocol — a greeting, a mysql_native_password login, OK to holdfast's own setup
//! statements, scripted answers (rows, OK, ERR, or hanging up) to COM_QUERY, OK to
//! COM_PING. The session checks the client's password itself, from a verifier the test
//! puts in the cache, so it can log in again when it moves.
//!
//! Every wait has a deadline.

use holdfast_client::{greet, login, Client, Login, DEFAULT_CAPABILITIES, UTF8MB4_GENERAL_CI};
use holdfast_proxy::backend::{BackendConnector, ConnectFuture, ENABLE_TRACKERS};
use holdfast_proxy::config::{AuthConfig, BackendConfig, Config, ListenerMode, ProxyConfig};
use holdfast_proxy::conn::{BoxedIo, ConnError, PacketConn};
use holdfast_proxy::session;
use holdfast_proxy::topology::Topology;
use holdfast_proxy::verifiers::Account;
use holdfast_proxy::{Seams, Shared};
use holdfast_wire::auth::{printable_scramble, verify_native, PasswordHash, NATIVE_PASSWORD};
use holdfast_wire::caps::*;
use holdfast_wire::codec::put_lenenc_bytes;
use holdfast_wire::command::{COM_PING, COM_QUERY, COM_QUIT};
use holdfast_wire::frame;
use holdfast_wire::handshake::{ClientHello, Greeting};
use holdfast_wire::packets::{err_payload, ok_payload};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// Generous: everything here is in-process.
const WAIT: Duration = Duration::from_secs(10);

const USER: &str = "app";
const PASSWORD: &str = "scripted-secret";
const NODE: &str = "node1";
/// Never resolved: the connector maps it to the scripted servers.
const NODE_ADDRESS: &str = "scripted-node1:3306";

const SELECT: &str = "SELECT id, name FROM t";

/// Waits for `fut` up to [`WAIT`], or panics naming `what`.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

// ---------------------------------------------------------------------------------------
// The scripted backend

/// A scripted answer to one statement.
#[derive(Clone, Debug)]
enum Reply {
    /// A text result set (all columns VARCHAR).
    Rows {
        columns: Vec<&'static str>,
        rows: Vec<Vec<Option<&'static str>>>,
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

/// What a [`ScriptedServer`] answers: exact statement texts; anything else gets an OK.
#[derive(Clone, Debug, Default)]
struct Script {
    replies: Vec<(&'static str, Reply)>,
}

impl Script {
    fn reply(mut self, sql: &'static str, reply: Reply) -> Self {
        self.replies.push((sql, reply));
        self
    }

    fn answer(&self, sql: &str) -> Reply {
        if let Some((_, r)) = self.replies.iter().find(|(s, _)| *s == sql) {
            return r.clone();
        }
        match sql {
            // What a moving session asks before it settles on a node: writable.
            "SELECT @@global.read_only" => Reply::Rows {
                columns: vec!["@@global.read_only"],
                rows: vec![vec![Some("0")]],
            },
            _ => Reply::Ok { affected_rows: 0 },
        }
    }
}

/// What a scripted server saw and did, shared with the test.
#[derive(Default)]
struct ServerLog {
    /// Every COM_QUERY's text, in order.
    queries: Mutex<Vec<String>>,
    pings: AtomicUsize,
    /// The wire bytes of each answer to a COM_QUERY or COM_PING, as written.
    answers: Mutex<Vec<Vec<u8>>>,
    /// Tells the server to close the connection now (while the session idles).
    hang_up: Notify,
    /// How the connection ended, once it has.
    ended: watch::Sender<Option<&'static str>>,
}

impl ServerLog {
    fn queries(&self) -> Vec<String> {
        self.queries.lock().map(|q| q.clone()).unwrap_or_default()
    }

    fn last_answer(&self) -> Vec<u8> {
        self.answers
            .lock()
            .ok()
            .and_then(|a| a.last().cloned())
            .unwrap_or_default()
    }

    async fn wait_ended(&self) -> &'static str {
        let mut rx = self.ended.subscribe();
        let ended = within("the scripted server's connection to end", async {
            rx.wait_for(Option::is_some).await.map(|e| *e)
        })
        .await;
        ended.ok().flatten().unwrap_or("log dropped")
    }
}

/// One backend connection's worth of server, following a [`Script`].
struct ScriptedServer {
    script: Script,
    log: Arc<ServerLog>,
}

impl ScriptedServer {
    fn new(script: Script) -> (ScriptedServer, Arc<ServerLog>) {
        let log = Arc::new(ServerLog::default());
        let server = ScriptedServer {
            script,
            log: log.clone(),
        };
        (server, log)
    }

    async fn run(self, stream: BoxedIo) {
        let how = self.serve(stream).await;
        self.log.ended.send_replace(Some(how));
    }

    async fn serve(&self, stream: BoxedIo) -> &'static str {
        let mut conn = PacketConn::new(stream);
        let scramble = printable_scramble(rand::random());
        let greeting = Greeting {
            server_version: b"11.4.2-MariaDB-scripted".to_vec(),
            connection_id: 42,
            scramble: scramble.to_vec(),
            capabilities: PROXY_CAPABILITIES | BACKEND_REQUIRED,
            charset: UTF8MB4_GENERAL_CI,
            status: SERVER_STATUS_AUTOCOMMIT,
            auth_plugin: NATIVE_PASSWORD.as_bytes().to_vec(),
        };
        if conn.write_packet(&greeting.encode(), 0).await.is_err() {
            return "closed before the login";
        }
        let Ok(hello) = conn.read_packet(1 << 20).await else {
            return "closed before the login";
        };
        let Ok(ClientHello::Login(req)) = ClientHello::parse(&hello.payload) else {
            return "not a login";
        };
        let verifier = PasswordHash::from_password(PASSWORD.as_bytes()).verifier();
        let seq = hello.seq.wrapping_add(1);
        if req.user != USER.as_bytes()
            || verify_native(&req.auth_response, &scramble, &verifier).is_none()
        {
            let refusal = err_payload(1045, "28000", "Access denied (scripted)");
            let _ = conn.write_packet(&refusal, seq).await;
            return "login refused";
        }
        let deprecate_eof = req.capabilities & CLIENT_DEPRECATE_EOF != 0;
        let ok = ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0);
        if conn.write_packet(&ok, seq).await.is_err() {
            return "closed after the login";
        }
        loop {
            let packet = tokio::select! {
                p = conn.read_packet(1 << 24) => p,
                _ = self.log.hang_up.notified() => return "hung up while idle",
            };
            let packet = match packet {
                Ok(p) => p,
                Err(ConnError::Closed) => return "closed by holdfast",
                Err(_) => return "read error",
            };
            let answer = match packet.payload.first().copied() {
                Some(COM_QUIT) => return "COM_QUIT",
                Some(COM_PING) => {
                    self.log.pings.fetch_add(1, Ordering::SeqCst);
                    frame::packet(&ok, 1)
                }
                Some(COM_QUERY) => {
                    let sql = String::from_utf8_lossy(&packet.payload[1..]).into_owned();
                    let reply = self.script.answer(&sql);
                    if let Ok(mut q) = self.log.queries.lock() {
                        q.push(sql);
                    }
                    match reply {
                        Reply::HangUp => return "hung up mid-statement",
                        reply => encode(&reply, deprecate_eof),
                    }
                }
                _ => frame::packet(&err_payload(1047, "08S01", "Unknown command"), 1),
            };
            if let Ok(mut a) = self.log.answers.lock() {
                a.push(answer.clone());
            }
            // One write, so the client may see the answer in any number of reads.
            if conn.write_raw(&answer).await.is_err() {
                return "closed by holdfast";
            }
        }
    }
}

/// A VARCHAR column definition (ColumnDefinition41).
fn column(name: &str) -> Vec<u8> {
    let mut p = Vec::new();
    for s in ["def", "", "", "", name, ""] {
        put_lenenc_bytes(&mut p, s.as_bytes());
    }
    p.push(0x0c);
    p.extend_from_slice(&[45, 0, 10, 0, 0, 0, 253, 0, 0, 0, 0, 0]);
    p
}

/// A reply's wire bytes, sequence ids from 1.
fn encode(reply: &Reply, deprecate_eof: bool) -> Vec<u8> {
    let mut packets = Vec::new();
    let status = SERVER_STATUS_AUTOCOMMIT.to_le_bytes();
    let eof = vec![0xfe, 0, 0, status[0], status[1]];
    match reply {
        Reply::Rows { columns, rows } => {
            packets.push(vec![columns.len() as u8]);
            packets.extend(columns.iter().map(|c| column(c)));
            if !deprecate_eof {
                packets.push(eof.clone());
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
            packets.push(match deprecate_eof {
                // The OK that ends a result set under CLIENT_DEPRECATE_EOF.
                true => vec![0xfe, 0, 0, status[0], status[1], 0, 0],
                false => eof,
            });
        }
        Reply::Ok { affected_rows } => {
            packets.push(ok_payload(*affected_rows, 0, SERVER_STATUS_AUTOCOMMIT, 0))
        }
        Reply::Err {
            code,
            state,
            message,
        } => packets.push(err_payload(*code, state, message)),
        Reply::HangUp => {}
    }
    let mut out = Vec::new();
    let mut seq = 1;
    for p in &packets {
        seq = frame::put_packet(&mut out, p, seq);
    }
    out
}

/// Hands each backend connection to the next scripted server; refuses once none is left
/// or for an address it does not know.
struct ScriptedConnector {
    servers: Mutex<VecDeque<ScriptedServer>>,
    connects: AtomicUsize,
}

impl ScriptedConnector {
    fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

impl BackendConnector for ScriptedConnector {
    fn connect<'a>(&'a self, address: &'a str) -> ConnectFuture<'a> {
        Box::pin(async move {
            self.connects.fetch_add(1, Ordering::SeqCst);
            let refused =
                |why: &str| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, why);
            if address != NODE_ADDRESS {
                return Err(refused("not a scripted address"));
            }
            let next = self.servers.lock().ok().and_then(|mut s| s.pop_front());
            let server = next.ok_or_else(|| refused("no scripted server left"))?;
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(server.run(Box::new(theirs)));
            Ok(Box::new(ours) as BoxedIo)
        })
    }
}

// ---------------------------------------------------------------------------------------
// The rig: a session on a duplex pipe, its client logged in

struct Rig {
    shared: Arc<Shared>,
    connector: Arc<ScriptedConnector>,
    /// The session's task: ends when the session does.
    session: JoinHandle<()>,
    client: Client,
    _topology: watch::Sender<Arc<Topology>>,
}

/// Starts a session on one end of a pipe, with `servers` behind the node's address in
/// turn, and logs in over the other end.
async fn rig(servers: Vec<ScriptedServer>) -> Rig {
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
        }],
        ha: Default::default(),
        driver: Default::default(),
        listeners: Vec::new(),
        serverless: None,
    });
    config.validate().expect("test configuration");
    // No monitor runs: before its first round the first node is where sessions go.
    let (tx, rx) = watch::channel(Arc::new(Topology::from_config(&config)));
    let connector = Arc::new(ScriptedConnector {
        servers: Mutex::new(servers.into()),
        connects: AtomicUsize::new(0),
    });
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
        };
        let caps = DEFAULT_CAPABILITIES & (greeting.capabilities | CLIENT_LONG_PASSWORD);
        login(conn, greeting, &as_app, caps).await
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
    async fn raw_answer(&mut self, payload: &[u8], server: &ServerLog) -> Vec<u8> {
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
    async fn ping(&mut self) {
        let conn = &mut self.client.conn;
        conn.write_packet(&[COM_PING], 0).await.expect("ping sent");
        let answer = within("the ping's answer", conn.read_packet(1 << 20))
            .await
            .expect("an answer to the ping");
        assert_eq!(answer.payload.first(), Some(&0x00), "{:?}", answer.payload);
        assert_eq!(answer.seq, 1);
    }
}

fn rows_of_t() -> Reply {
    Reply::Rows {
        columns: vec!["id", "name"],
        rows: vec![
            vec![Some("1"), Some("alpha")],
            vec![Some("2"), None],
            vec![Some("3"), Some("")],
        ],
    }
}

fn expected_rows() -> Vec<Vec<Option<String>>> {
    vec![
        vec![Some("1".into()), Some("alpha".into())],
        vec![Some("2".into()), None],
        vec![Some("3".into()), Some(String::new())],
    ]
}

// ---------------------------------------------------------------------------------------
// The tests

/// A result set, an ERR and an OK reach the client exactly as the server sent them.
#[tokio::test]
async fn answers_reach_the_client_byte_exact() {
    let script = Script::default()
        .reply(SELECT, rows_of_t())
        .reply(
            "SELECT * FROM missing",
            Reply::Err {
                code: 1146,
                state: "42S02",
                message: "Table 'db.missing' doesn't exist",
            },
        )
        .reply("UPDATE t SET name = 'x'", Reply::Ok { affected_rows: 3 });
    let (server, log) = ScriptedServer::new(script);
    let mut rig = rig(vec![server]).await;
    for sql in [SELECT, "SELECT * FROM missing", "UPDATE t SET name = 'x'"] {
        let mut request = vec![COM_QUERY];
        request.extend_from_slice(sql.as_bytes());
        let got = rig.raw_answer(&request, &log).await;
        let sent = log.last_answer();
        assert!(!sent.is_empty(), "the server answered {sql}");
        assert_eq!(
            got, sent,
            "{sql}: the client got other bytes than the server sent"
        );
        assert!(rig.client.conn.rbuf.is_empty(), "{sql}: extra bytes");
    }
    // Holdfast's setup statement came first, then the client's, unchanged.
    assert_eq!(
        log.queries(),
        [
            ENABLE_TRACKERS,
            SELECT,
            "SELECT * FROM missing",
            "UPDATE t SET name = 'x'"
        ]
    );
    // And they decode as a client expects.
    let r = within("the query", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows").rows, expected_rows());
    let e = within("the query", rig.client.query("SELECT * FROM missing")).await;
    let e = e.expect_err("the server's error").server_error();
    assert_eq!(e.map(|e| (e.code, e.state)), Some((1146, "42S02".into())));
    assert_eq!(rig.connector.connects(), 1);
}

/// COM_PING goes to the backend and its OK comes back.
#[tokio::test]
async fn ping_is_answered() {
    let (server, log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![server]).await;
    rig.ping().await;
    rig.ping().await;
    assert_eq!(log.pings.load(Ordering::SeqCst), 2);
}

/// The backend closes its connection while the session idles: the session notices then
/// (`backend_gone`), and the client's next SELECT runs on a new backend connection, with
/// its rows and no error. The clock is paused: tokio moves it only when every task waits,
/// so once the sleep below ends the session has gone quiet and seen the close.
#[tokio::test(start_paused = true)]
async fn backend_lost_while_idle_is_replaced_before_the_next_select() {
    let (first, first_log) = ScriptedServer::new(Script::default());
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    rig.ping().await;
    first_log.hang_up.notify_one();
    assert_eq!(first_log.wait_ended().await, "hung up while idle");
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Nothing reconnects before the client speaks again.
    assert_eq!(rig.connector.connects(), 1);
    let r = within("the SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows, not an error").rows, expected_rows());
    assert_eq!(rig.connector.connects(), 2);
    assert!(!first_log.queries().iter().any(|q| q == SELECT));
    assert_eq!(
        second_log.queries().last().map(String::as_str),
        Some(SELECT)
    );
    let m = &rig.shared.metrics;
    // Held for the move before it went anywhere (the idle path), not lost in flight.
    assert_eq!(m.requests_held.get(), 1);
    assert_eq!(m.requests_retried.get(), 0);
    assert_eq!(m.sessions_moved.get(), 1);
    let view = rig.shared.sessions.snapshot();
    assert_eq!(view.iter().map(|s| s.moves).collect::<Vec<_>>(), [1]);
}

/// The backend dies with the SELECT in flight, before answering: the session moves and runs
/// it again there; the client gets its rows, no error.
#[tokio::test]
async fn select_lost_in_flight_is_run_again_on_a_new_backend() {
    let (first, first_log) = ScriptedServer::new(Script::default().reply(SELECT, Reply::HangUp));
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    let r = within("the SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows, not an error").rows, expected_rows());
    assert_eq!(first_log.wait_ended().await, "hung up mid-statement");
    assert_eq!(first_log.queries().last().map(String::as_str), Some(SELECT));
    assert_eq!(
        second_log.queries().last().map(String::as_str),
        Some(SELECT)
    );
    assert_eq!(rig.connector.connects(), 2);
    assert_eq!(rig.shared.metrics.requests_retried.get(), 1);
    assert_eq!(rig.shared.metrics.sessions_moved.get(), 1);
}

/// ERR 1927 before any answer: the backend connection was killed (an operator's KILL).
fn killed() -> Reply {
    Reply::Err {
        code: 1927,
        state: "70100",
        message: "Connection was killed",
    }
}

/// The SELECT's backend connection is killed (ERR 1927) before it answered: the session
/// moves, but someone stopped that statement on purpose, so it is not run again there;
/// the client gets 1317 "interrupted", and its next statement runs on the new backend.
#[tokio::test]
async fn select_whose_connection_was_killed_is_not_run_again() {
    let (first, first_log) = ScriptedServer::new(Script::default().reply(SELECT, killed()));
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    let e = within("the SELECT", rig.client.query(SELECT)).await;
    let e = e.expect_err("an error, not a re-run").server_error();
    let e = e.expect("an ERR packet");
    assert_eq!((e.code, e.state.as_str()), (1317, "70100"), "{}", e.message);
    assert!(e.message.contains("killed"), "{}", e.message);
    assert_eq!(first_log.queries().last().map(String::as_str), Some(SELECT));
    assert!(!second_log.queries().iter().any(|q| q == SELECT));
    let m = &rig.shared.metrics;
    assert_eq!(m.requests_retried.get(), 0);
    assert_eq!(m.requests_failed_on_backend_loss.get(), 1);
    assert_eq!(m.sessions_moved.get(), 1);
    let r = within("the next SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows").rows, expected_rows());
    assert_eq!(rig.connector.connects(), 2);
}

/// What a session asks the node it lands on again after losing a request in flight.
const UPTIME: &str =
    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'";

fn uptime(seconds: &'static str) -> Reply {
    Reply::Rows {
        columns: vec!["VARIABLE_VALUE"],
        rows: vec![vec![Some(seconds)]],
    }
}

/// The connection closes under the SELECT without a word (what MariaDB does on KILL
/// CONNECTION) and the session lands on the same server, up for a day: nothing restarted,
/// someone cut the connection; the SELECT is not run again.
#[tokio::test]
async fn select_cut_while_its_server_kept_running_is_not_run_again() {
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, Reply::HangUp));
    let second = Script::default()
        .reply(UPTIME, uptime("86400"))
        .reply(SELECT, rows_of_t());
    let (second, second_log) = ScriptedServer::new(second);
    let mut rig = rig(vec![first, second]).await;
    let e = within("the SELECT", rig.client.query(SELECT)).await;
    let e = e.expect_err("an error, not a re-run").server_error();
    let e = e.expect("an ERR packet");
    assert_eq!((e.code, e.state.as_str()), (1317, "70100"), "{}", e.message);
    assert!(e.message.contains("killed"), "{}", e.message);
    assert!(second_log.queries().iter().any(|q| q == UPTIME));
    assert!(!second_log.queries().iter().any(|q| q == SELECT));
    assert_eq!(rig.shared.metrics.requests_retried.get(), 0);
    let r = within("the next SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows").rows, expected_rows());
}

/// The same loss, but the server the session lands on has only just started: it restarted
/// (or crashed) under the SELECT, which runs again.
#[tokio::test]
async fn select_lost_to_a_restart_is_run_again() {
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, Reply::HangUp));
    let second = Script::default()
        .reply(UPTIME, uptime("0"))
        .reply(SELECT, rows_of_t());
    let (second, second_log) = ScriptedServer::new(second);
    let mut rig = rig(vec![first, second]).await;
    let r = within("the SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows, not an error").rows, expected_rows());
    assert_eq!(
        second_log.queries().last().map(String::as_str),
        Some(SELECT)
    );
    assert_eq!(rig.shared.metrics.requests_retried.get(), 1);
}

/// The same kill while holdfast runs a switchover is the switchover's own fence: the
/// SELECT is run again on the new backend, as for any lost backend. (Only the flag the
/// session reads per request is raised: the request is not parked, the kill reads as the
/// fence's.)
#[tokio::test]
async fn select_killed_by_the_switchover_fence_is_run_again() {
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, killed()));
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    rig.shared
        .switching_now
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let r = within("the SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows, not an error").rows, expected_rows());
    assert_eq!(
        second_log.queries().last().map(String::as_str),
        Some(SELECT)
    );
    assert_eq!(rig.shared.metrics.requests_retried.get(), 1);
}

/// A server shutting down answers the SELECT with ERR 1053 before it closes: nothing
/// reached the client and nobody meant to stop the statement, so it runs again.
#[tokio::test]
async fn select_answered_with_a_shutdown_error_is_run_again() {
    let shutdown = Reply::Err {
        code: 1053,
        state: "08S01",
        message: "Server shutdown in progress",
    };
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, shutdown));
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    let r = within("the SELECT", rig.client.query(SELECT)).await;
    assert_eq!(r.expect("rows, not an error").rows, expected_rows());
    assert_eq!(
        second_log.queries().last().map(String::as_str),
        Some(SELECT)
    );
    assert_eq!(rig.shared.metrics.requests_retried.get(), 1);
}

/// A SELECT calling a stored function is lost in flight: the function may have written,
/// so the SELECT is not run again; the client learns it may or may not have run.
#[tokio::test]
async fn select_of_a_stored_function_lost_in_flight_is_not_run_again() {
    const CALLS: &str = "SELECT add_row(1)";
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(CALLS, Reply::HangUp));
    let (second, second_log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![first, second]).await;
    let e = within("the SELECT", rig.client.query(CALLS)).await;
    let e = e.expect_err("an error, not a re-run").server_error();
    let e = e.expect("an ERR packet");
    assert_eq!((e.code, e.state.as_str()), (1317, "70100"), "{}", e.message);
    assert!(!second_log.queries().iter().any(|q| q == CALLS));
    assert_eq!(rig.shared.metrics.requests_retried.get(), 0);
}

/// COM_QUIT ends the session: its task finishes, the client's stream closes, the registry
/// no longer lists it and its backend connection is closed.
#[tokio::test]
async fn quit_ends_the_session() {
    let (server, log) = ScriptedServer::new(Script::default());
    let mut rig = rig(vec![server]).await;
    // Answered only once the session serves requests, registered by then.
    rig.ping().await;
    let listed = rig.shared.sessions.snapshot();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].user.as_str(), listed[0].backend.as_str()),
        (USER, NODE)
    );
    assert_eq!(rig.shared.metrics.sessions_active.get(), 1);

    let conn = &mut rig.client.conn;
    conn.write_packet(&[COM_QUIT], 0)
        .await
        .expect("COM_QUIT sent");
    within("the session to end", &mut rig.session)
        .await
        .expect("the session task");
    let closed = within("the client's stream to close", conn.fill()).await;
    assert!(matches!(closed, Err(ConnError::Closed)), "{closed:?}");
    assert!(rig.shared.sessions.snapshot().is_empty());
    assert_eq!(rig.shared.metrics.sessions_active.get(), 0);
    let ended = log.wait_ended().await;
    assert!(
        ["closed by holdfast", "COM_QUIT"].contains(&ended),
        "backend connection: {ended}"
    );
}
