//! Statements in flight when their backend connection goes: holdfast runs one again on the
//! new backend only when that is provably safe, and otherwise says what became of it.
//!
//! The statements are held in flight by a lock another connection (straight to the server)
//! holds, and the backend connection is killed like an operator would, with `KILL
//! CONNECTION` as root, or lost with its node (a restart). Every wait has a deadline. A
//! connection killed while its server kept running ends the client's session as the
//! server ends a direct one: the client loses its connection, nothing is run again.

use holdfast_it::{wait_for, Harness};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

/// A connection straight to the primary as the application user (to hold locks).
fn direct(h: &Harness) -> Conn {
    let opts = OptsBuilder::new()
        .ip_or_hostname(Some(h.direct().ip().to_string()))
        .tcp_port(h.direct().port())
        .user(Some(h.user()))
        .pass(Some(h.password()))
        .db_name(Some(h.database()))
        .prefer_socket(false);
    Conn::new(opts).expect("connect to the primary")
}

/// The code and SQLSTATE of a server error, as the client library read them.
fn mysql_error(e: &mysql::Error) -> Option<(u16, &str)> {
    match e {
        mysql::Error::MySqlError(e) => Some((e.code, e.state.as_str())),
        _ => None,
    }
}

/// Whether the client lost its connection (what a direct client whose connection was
/// killed gets) rather than an answer or a server error.
fn connection_lost(e: &mysql::Error) -> bool {
    mysql_error(e).is_none()
}

/// What a statement run on another thread came back with.
type Answer = (Conn, Result<Vec<mysql::Row>, mysql::Error>);

/// Runs `sql` through `c` on a thread of its own: the statement stays in flight while the
/// test kills its connection.
fn in_flight(mut c: Conn, sql: &'static str) -> mpsc::Receiver<Answer> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = c.query::<mysql::Row, _>(sql);
        let _ = tx.send((c, r));
    });
    rx
}

/// Like [`in_flight`] for the execution of a prepared statement.
fn executing(mut c: Conn, stmt: mysql::Statement) -> mpsc::Receiver<Answer> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = c.exec::<mysql::Row, _, _>(&stmt, ());
        let _ = tx.send((c, r));
    });
    rx
}

/// The ids of the application's server threads in `state` (e.g. waiting for a lock),
/// holdfast's backend connections among them.
fn threads_in(h: &Harness, state: &str) -> Vec<String> {
    h.root_sql(&format!(
        "SELECT ID FROM information_schema.PROCESSLIST \
         WHERE USER = '{}' AND COMMAND IN ('Query', 'Execute') AND STATE = '{state}'",
        h.user()
    ))
    .into_iter()
    .filter_map(|row| row.into_iter().next())
    .collect()
}

/// A sign the statement was run again after `killed` was: another application thread in
/// `state`.
fn waiting_again(h: &Harness, state: &str, killed: &str) -> Option<String> {
    let others: Vec<_> = threads_in(h, state)
        .into_iter()
        .filter(|id| id != killed)
        .collect();
    (!others.is_empty()).then(|| format!("{others:?} in state {state:?}"))
}

/// Waits until exactly one application thread is in `state` and returns its id.
fn the_thread_in(h: &Harness, state: &str) -> String {
    wait_for(
        &format!("a backend connection in state {state:?}"),
        WAIT,
        || match threads_in(h, state).as_slice() {
            [id] => Some(id.clone()),
            _ => None,
        },
    )
}

/// Waits until the server has been up for two seconds. holdfast tells a connection cut
/// while its server kept running from one lost to a restart by the server's `Uptime`, in
/// whole seconds, against the connection's age: a server in its first second cannot show
/// it has been up longer than a connection opened right after it started.
fn server_up_for_a_while(h: &Harness) {
    wait_for("the server to be up for 2 s", WAIT, || {
        let up = h.root_sql("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'");
        let up: u64 = up.first()?.first()?.parse().ok()?;
        (up >= 2).then_some(())
    });
}

fn count(h: &Harness, table: &str) -> u64 {
    h.root_sql(&format!("SELECT COUNT(*) FROM sbtest.{table}"))
        .first()
        .and_then(|row| row.first())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("COUNT(*) of {table}"))
}

/// Waits for the answer of a statement in flight. `rerun` is asked meanwhile and names what
/// shows the statement was run again (a second row, a second waiting thread): the test fails
/// at once instead of waiting for the re-run to finish.
fn answer(rx: &mpsc::Receiver<Answer>, mut rerun: impl FnMut() -> Option<String>) -> Answer {
    let deadline = Instant::now() + WAIT;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(a) => return a,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the client thread died"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some(what) = rerun() {
            panic!("the statement was run again: {what}");
        }
        assert!(Instant::now() < deadline, "no answer within {WAIT:?}");
    }
}

const WAITING_FOR_TABLE: &str = "Waiting for table metadata lock";
const WAITING_FOR_NAMED_LOCK: &str = "User lock";

/// A MyISAM table (its rows stay when the statement that wrote them fails) and a function
/// that writes a row into it and then takes the named lock `gate`. The returned connection
/// holds that lock: the function waits for it, its row written, until its connection is
/// killed. (Not a table lock: a function's tables are locked before it starts. And the
/// table cannot be read meanwhile: the statement keeps it locked until it ends.)
fn create_writing_function(h: &Harness) -> Conn {
    h.root_sql(
        "SET GLOBAL log_bin_trust_function_creators = 1; \
         CREATE TABLE sbtest.fn_rows (id INT AUTO_INCREMENT PRIMARY KEY) ENGINE=MyISAM",
    );
    let mut locker = direct(h);
    locker
        .query_drop(
            "CREATE FUNCTION sbtest.add_row() RETURNS INT MODIFIES SQL DATA BEGIN \
             INSERT INTO sbtest.fn_rows VALUES (NULL); \
             RETURN GET_LOCK('gate', 60); END",
        )
        .expect("CREATE FUNCTION");
    let held: Option<i32> = locker.query_first("SELECT GET_LOCK('gate', 1)").unwrap();
    assert_eq!(held, Some(1), "the test holds the lock");
    locker
}

/// `SELECT f()` where f writes: the backend connection is killed while f waits after its
/// insert. The row is there once, the client loses its connection (as a direct client
/// would), not getting the answer of a second run.
#[test]
fn a_select_of_a_writing_function_killed_in_flight_is_not_run_again() {
    let h = Harness::start();
    let mut locker = create_writing_function(&h);
    let rx = in_flight(connect(&h), "SELECT add_row()");
    let id = the_thread_in(&h, WAITING_FOR_NAMED_LOCK);
    h.root_sql(&format!("KILL CONNECTION {id}"));
    let (_, r) = answer(&rx, || waiting_again(&h, WAITING_FOR_NAMED_LOCK, &id));
    let err = r.expect_err("an error, not a second run's answer");
    assert!(connection_lost(&err), "{err}");
    locker.query_drop("DO RELEASE_LOCK('gate')").unwrap();
    assert_eq!(count(&h, "fn_rows"), 1, "the row was written exactly once");
    assert_eq!(h.shared.metrics.requests_retried.get(), 0);
    h.wait_sessions(0, WAIT);
}

/// The node restarts while a writing function is in flight, called under ANSI_QUOTES as
/// `"add_row"()`, which the default lexing reads as a string. The session's tracked
/// sql_mode makes it a call: not run again on the restarted node, one row.
#[test]
fn a_quoted_call_under_ansi_quotes_lost_with_its_node_is_not_run_again() {
    let mut h = Harness::start();
    let locker = create_writing_function(&h);
    let mut c = connect(&h);
    c.query_drop("SET sql_mode = 'ANSI_QUOTES'").unwrap();
    let rx = in_flight(c, r#"SELECT "add_row"()"#);
    the_thread_in(&h, WAITING_FOR_NAMED_LOCK);
    // The restart ends the locker's connection and its lock: a second run would not wait.
    h.lab.stop_node("node1").unwrap();
    h.lab.start_node("node1").unwrap();
    drop(locker);
    let (mut c, r) = answer(&rx, || None);
    let err = r.expect_err("an error, not a second run's answer");
    assert_eq!(mysql_error(&err), Some((1317, "70100")), "{err}");
    assert_eq!(count(&h, "fn_rows"), 1, "the row was written exactly once");
    assert_eq!(h.shared.metrics.requests_retried.get(), 0);
    // The session goes on in its restored sql_mode.
    let mode: Option<String> = c.query_first("SELECT @@sql_mode").unwrap();
    assert_eq!(mode.as_deref(), Some("ANSI_QUOTES"));
}

/// A plain read, waiting for a table another connection locked, has its connection killed
/// by an operator. MariaDB closes it without an ERR, but the server kept running: the read
/// is not run again (it would wait again), and the client loses its connection as a direct
/// client would (the session is not logged in again).
#[test]
fn a_plain_read_whose_connection_is_killed_is_not_run_again() {
    let h = Harness::start();
    h.root_sql("CREATE TABLE sbtest.locked (a INT); INSERT INTO sbtest.locked VALUES (1)");
    let mut locker = direct(&h);
    locker
        .query_drop("LOCK TABLES sbtest.locked WRITE")
        .unwrap();
    server_up_for_a_while(&h);
    let rx = in_flight(connect(&h), "SELECT a FROM locked");
    let id = the_thread_in(&h, WAITING_FOR_TABLE);
    h.root_sql(&format!("KILL CONNECTION {id}"));
    let (_, r) = answer(&rx, || waiting_again(&h, WAITING_FOR_TABLE, &id));
    let err = r.expect_err("an error, not a second run's answer");
    assert!(connection_lost(&err), "{err}");
    assert_eq!(h.shared.metrics.requests_retried.get(), 0);
    locker.query_drop("UNLOCK TABLES").unwrap();
    h.wait_sessions(0, WAIT);
    let killed = holdfast_it::metric(
        &h.metrics(),
        r#"holdfast_sessions_closed_by_holdfast_total{reason="killed"}"#,
    );
    assert_eq!(killed, Some(1.0));
}

/// Inside a transaction, statements that commit it implicitly (`ALTER TABLE`, then `LOCK
/// TABLES`) wait for a lock after their implicit commit; their connection is killed. The
/// transaction was committed; the client loses its connection as a direct one would (no
/// "rolled back, retry", no run again).
#[test]
fn an_implicit_commit_killed_in_a_transaction_ends_the_session() {
    let h = Harness::start();
    h.root_sql("CREATE TABLE sbtest.tx (id INT PRIMARY KEY); CREATE TABLE sbtest.ddl (a INT)");
    let mut locker = direct(&h);
    locker.query_drop("LOCK TABLES sbtest.ddl READ").unwrap();
    for (id, statement) in [
        // `id`: the rows committed once the statement waits.
        (1u64, "ALTER TABLE ddl ADD COLUMN b INT"),
        (2, "LOCK TABLES ddl WRITE"),
    ] {
        let mut c = connect(&h);
        c.query_drop("BEGIN").unwrap();
        c.query_drop(format!("INSERT INTO tx VALUES ({id})"))
            .unwrap();
        let rx = in_flight(c, statement);
        let thread = the_thread_in(&h, WAITING_FOR_TABLE);
        assert_eq!(
            count(&h, "tx"),
            id,
            "{statement}: committed before it waits"
        );
        h.root_sql(&format!("KILL CONNECTION {thread}"));
        let (_, r) = answer(&rx, || None);
        let err = r.expect_err("an error");
        assert!(connection_lost(&err), "{statement}: {err}");
    }
    locker.query_drop("UNLOCK TABLES").unwrap();
    let ids: Vec<i32> = connect(&h).query("SELECT id FROM tx ORDER BY id").unwrap();
    assert_eq!(ids, vec![1, 2], "both transactions were committed");
}

/// A prepared COMMIT executed (COM_STMT_EXECUTE) waits for a backup stage that blocks
/// commits; its connection is killed. Without commit markers: the client loses its
/// connection as a direct one would; the COMMIT never happened and is not run again.
#[test]
fn a_prepared_commit_killed_in_flight_ends_the_session_without_markers() {
    prepared_commit_killed_while_commits_are_blocked(false);
}

/// The same with commit markers: the transaction is not replayed nor committed again.
#[test]
fn a_prepared_commit_killed_in_flight_ends_the_session_with_markers() {
    prepared_commit_killed_while_commits_are_blocked(true);
}

fn prepared_commit_killed_while_commits_are_blocked(markers: bool) {
    let h = Harness::start_with(
        holdfast_it::Options::default().config(move |c| c.ha.commit_markers = markers),
    );
    h.root_sql("CREATE TABLE sbtest.tx (id INT PRIMARY KEY)");
    let mut c = connect(&h);
    let commit = c.prep("COMMIT").unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO tx VALUES (1)").unwrap();
    let mut backup = direct(&h);
    for stage in ["START", "FLUSH", "BLOCK_DDL", "BLOCK_COMMIT"] {
        backup.query_drop(format!("BACKUP STAGE {stage}")).unwrap();
    }
    let rx = executing(c, commit);
    let thread = the_thread_in(&h, "Waiting for backup lock");
    h.root_sql(&format!("KILL CONNECTION {thread}"));
    let (_, r) = answer(&rx, || None);
    let err = r.expect_err("an error");
    assert!(connection_lost(&err), "{err}");
    backup.query_drop("BACKUP STAGE END").unwrap();
    // This COMMIT never happened.
    let n: Option<u64> = connect(&h).query_first("SELECT COUNT(*) FROM tx").unwrap();
    assert_eq!(n, Some(0));
}
