//! Sessions over in-process streams, against scripted backends: no socket, no server (see
//! `common/mod.rs` for the rig and the scripted servers).
//!
//! Every wait has a deadline.

mod common;

use common::*;
use holdfast_proxy::backend::ENABLE_TRACKERS;
use holdfast_proxy::conn::ConnError;
use holdfast_wire::command::{COM_QUERY, COM_QUIT};
use std::sync::atomic::Ordering;
use std::time::Duration;

const SELECT: &str = "SELECT id, name FROM t";

fn rows_of_t() -> Reply {
    Reply::rows(
        &["id", "name"],
        &[
            &[Some("1"), Some("alpha")],
            &[Some("2"), None],
            &[Some("3"), Some("")],
        ],
    )
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

/// The SELECT's backend connection is killed (ERR 1927) before it answered: someone
/// stopped it on purpose (no switchover runs). The client gets the server's 1927 and the
/// session ends, as a direct connection would: not logged in again, nothing run again.
#[tokio::test]
async fn select_whose_connection_was_killed_ends_the_session() {
    let (first, first_log) = ScriptedServer::new(Script::default().reply(SELECT, killed()));
    let (second, second_log) = ScriptedServer::new(Script::default().reply(SELECT, rows_of_t()));
    let mut rig = rig(vec![first, second]).await;
    let e = within("the SELECT", rig.client.query(SELECT)).await;
    let e = e.expect_err("the server's error").server_error();
    let e = e.expect("an ERR packet");
    assert_eq!((e.code, e.state.as_str()), (1927, "70100"), "{}", e.message);
    assert_eq!(first_log.queries().last().map(String::as_str), Some(SELECT));
    let r = within("the next SELECT", rig.client.query(SELECT)).await;
    let e = r.expect_err("the session ended");
    assert!(e.server_error().is_none(), "closed, not an ERR: {e}");
    assert!(!second_log.queries().iter().any(|q| q == SELECT));
    let m = &rig.shared.metrics;
    assert_eq!(m.requests_retried.get(), 0);
    assert_eq!(m.sessions_moved.get(), 0);
    assert_eq!(rig.connector.connects(), 1);
}

/// What a session asks the node it lands on again after losing a request in flight.
/// As holdfast asks it (with a LIMIT: the client's sql_select_limit must not empty it).
const UPTIME: &str =
    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME' \
     LIMIT 18446744073709551615";

fn uptime(seconds: &'static str) -> Reply {
    Reply::rows(&["VARIABLE_VALUE"], &[&[Some(seconds)]])
}

/// The connection closes under the SELECT without a word (what MariaDB does on KILL
/// CONNECTION) and the session lands on the same server, up for a day: nothing restarted,
/// someone cut the connection. The session ends as the server ended it (the client's
/// connection closes); the SELECT is not run again.
#[tokio::test]
async fn select_cut_while_its_server_kept_running_ends_the_session() {
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, Reply::HangUp));
    let second = Script::default()
        .reply(UPTIME, uptime("86400"))
        .reply(SELECT, rows_of_t());
    let (second, second_log) = ScriptedServer::new(second);
    let mut rig = rig(vec![first, second]).await;
    let e = within("the SELECT", rig.client.query(SELECT)).await;
    let e = e.expect_err("an error, not a re-run");
    assert!(e.server_error().is_none(), "closed, not an ERR: {e}");
    assert!(second_log.queries().iter().any(|q| q == UPTIME));
    assert!(!second_log.queries().iter().any(|q| q == SELECT));
    assert_eq!(rig.shared.metrics.requests_retried.get(), 0);
}

/// The same loss, but the server the session lands on has only just started: it restarted
/// (or crashed) under the SELECT, which runs again.
#[tokio::test]
async fn select_lost_to_a_restart_is_run_again() {
    let (first, _first_log) = ScriptedServer::new(Script::default().reply(SELECT, Reply::HangUp));
    let second = Script::default()
        .connection_id(3)
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
        ["closed by holdfast", "COM_QUIT"].contains(&ended.as_str()),
        "backend connection: {ended}"
    );
}
