//! Sessions that outlive their backend: a switchover, a restart of the node, a killed primary.
//! The client keeps its connection and its session state.

use holdfast_it::{metric, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::time::Duration;

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

type StateRow = (String, String, i64, String, String, String, String, u64);

const STATE: &str = "SELECT @@sql_mode, @@time_zone, @i, CAST(@s AS CHAR CHARACTER SET utf8mb4), \
     CHARSET(@s), CAST(@d AS CHAR), DATABASE(), LAST_INSERT_ID()";

fn set_state(c: &mut Conn) -> (StateRow, mysql::Statement) {
    c.query_drop("CREATE TABLE IF NOT EXISTS sbtest.ka (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.ka (v) VALUES (1), (2), (3)")
        .unwrap();
    c.query_drop("SET sql_mode='ANSI_QUOTES,NO_ZERO_DATE', time_zone='+05:30'")
        .unwrap();
    c.query_drop("SET @i = 42, @s = _latin1 X'E9', @d = CAST(1.10 AS DECIMAL(5,2))")
        .unwrap();
    c.query_drop("USE mysql").unwrap();
    let stmt = c.prep("SELECT ? + 1").unwrap();
    let one: Option<i64> = c.exec_first(&stmt, (1,)).unwrap();
    assert_eq!(one, Some(2));
    let state: Option<StateRow> = c.query_first(STATE).unwrap();
    (state.expect("state row"), stmt)
}

fn port(c: &mut Conn) -> u16 {
    c.query_first::<u16, _>("SELECT @@port")
        .unwrap()
        .expect("port")
}

fn assert_same_session(c: &mut Conn, before: &StateRow, stmt: &mysql::Statement) {
    let after: StateRow = c.query_first(STATE).unwrap().expect("state row");
    assert_eq!(&after, before, "session state differs after the move");
    let two: Option<i64> = c.exec_first(stmt, (41,)).unwrap();
    assert_eq!(
        two,
        Some(42),
        "the prepared statement keeps working under its id"
    );
}

#[test]
fn session_state_survives_a_switchover() {
    let h = Harness::start_with(Options::default().replicas(2));
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    assert_eq!(before.2, 42);
    assert_eq!(before.4, "latin1");
    let old_port = port(&mut c);
    let node2 = h.switch_over_to("node2");
    let new_port = port(&mut c);
    assert_ne!(new_port, old_port);
    assert_eq!(new_port, node2, "the session follows the primary");
    assert_same_session(&mut c, &before, &stmt);
    let moved = metric(&h.metrics(), "holdfast_sessions_moved_total").unwrap_or(0.0);
    assert!(moved >= 1.0, "sessions_moved {moved}");
    let counters = h.status().counters;
    assert!(counters.sessions_moved >= 1, "{counters:?}");
    assert!(counters.mean_move_ms > 0.0, "{counters:?}");
    // The data written before the switchover is there, and writes work on the new primary.
    c.query_drop("INSERT INTO sbtest.ka (v) VALUES (4)")
        .unwrap();
    let n: Option<u64> = c.query_first("SELECT COUNT(*) FROM sbtest.ka").unwrap();
    assert_eq!(n, Some(4));
}

#[test]
fn session_survives_a_restart_of_its_node() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    h.wait_captured();
    h.lab.stop_node("node1").unwrap();
    h.lab.start_node("node1").unwrap();
    // The next statement is held until the node is back, then runs in the restored session.
    assert_same_session(&mut c, &before, &stmt);
    let moved = metric(&h.metrics(), "holdfast_sessions_moved_total").unwrap_or(0.0);
    assert!(moved >= 1.0, "sessions_moved {moved}");
}

/// A node restarted again and again: the session's connection to the restarted server is
/// younger than a second when it goes with the next restart, and the new connection's
/// thread id can be above the lost one's. A server's uptime (whole seconds) cannot tell
/// such a restart from a KILL; the monitor's own connection, opened again after the
/// restart, does: the session recovers, it is not ended as killed (a CI run of
/// `reload::transaction_replay_changed_by_a_reload_applies_from_the_next_transaction`
/// saw it ended).
#[test]
fn a_young_connection_lost_with_a_quick_restart_is_not_taken_for_a_kill() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.qr (id INT PRIMARY KEY)")
        .unwrap();
    for round in 0..3 {
        h.lab.kill_node("node1").unwrap();
        h.lab.start_node("node1").unwrap();
        // Connections to the fresh server push its thread ids past the session's last.
        for _ in 0..8 * (round + 1) {
            h.root_sql("DO 1");
        }
        c.query_drop(format!("INSERT INTO sbtest.qr VALUES ({round})"))
            .unwrap_or_else(|e| panic!("round {round}: the session goes on: {e}"));
    }
    let ids: Vec<i32> = c.query("SELECT id FROM sbtest.qr ORDER BY id").unwrap();
    assert_eq!(ids, [0, 1, 2]);
    let killed = metric(
        &h.metrics(),
        "holdfast_sessions_closed_by_holdfast_total{reason=\"killed\"}",
    );
    assert_eq!(killed, None, "no session was taken for killed");
}

#[test]
fn without_replay_a_transaction_lost_with_its_node_reports_a_deadlock_and_the_session_goes_on() {
    let mut h =
        Harness::start_with(Options::default().config(|c| c.proxy.transaction_replay = false));
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.tx (id INT PRIMARY KEY)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.tx VALUES (1)").unwrap();
    h.lab.kill_node("node1").unwrap();
    h.lab.start_node("node1").unwrap();
    let err = c
        .query_drop("INSERT INTO sbtest.tx VALUES (2)")
        .unwrap_err();
    // SQLSTATE 40001 is what drivers (JDBC's SQLTransientException...) decide retries on.
    assert_eq!(mysql_error(&err), Some((1213, "40001")), "{err}");
    c.query_drop("ROLLBACK").unwrap();
    c.query_drop("INSERT INTO sbtest.tx VALUES (3)").unwrap();
    let ids: Vec<i32> = c.query("SELECT id FROM sbtest.tx ORDER BY id").unwrap();
    assert_eq!(ids, vec![3], "the lost transaction left nothing behind");
}

/// The same from Python (mysql-connector-python, pure): text and server-side prepared
/// statements on one connection, across a switchover.
#[test]
fn python_session_state_survives_a_switchover() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    if !holdfast_it::have("python3") {
        eprintln!("SKIP: python3 is not installed");
        return;
    }
    let h = Harness::start_with(Options::default().replicas(2));
    let script = format!("{}/py/keepalive_state.py", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(h.proxy.ip().to_string())
        .arg(h.proxy.port().to_string())
        .args([h.user(), h.password(), h.database()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read READY");
    if line.starts_with("SKIP") {
        eprintln!("{line}");
        let _ = child.wait();
        return;
    }
    if line.trim() != "READY" {
        let _ = child.wait();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        panic!("script did not get ready: {line}\n{err}");
    }
    let (code, body) = h.admin_post("/switchover?to=node3", None);
    assert_eq!(code, 200, "{body}");
    wait_for("node3 primary", Duration::from_secs(20), || {
        (h.status().topology.primary.as_deref() == Some("node3")).then_some(())
    });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("signal the script");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read the rest");
    let status = child.wait().expect("wait");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success() && rest.contains("DONE"),
        "python: {rest}\n{err}"
    );
}

/// The code and SQLSTATE of a server error, as the client library read them.
fn mysql_error(e: &mysql::Error) -> Option<(u16, &str)> {
    match e {
        mysql::Error::MySqlError(e) => Some((e.code, e.state.as_str())),
        _ => None,
    }
}

/// No writable node within the hold window: the held request gets an ERR that names the
/// window, and the connection closes (not a silent disconnect).
#[test]
fn no_primary_within_the_hold_window_gives_a_clear_error() {
    let mut h = Harness::start_with(Options::default().config(|c| c.proxy.hold_window_ms = 1_500));
    let mut c = connect(&h);
    c.query_drop("SELECT 1").unwrap();
    h.lab.stop_node("node1").unwrap();
    let err = c.query_drop("SELECT 1").unwrap_err();
    assert_eq!(mysql_error(&err), Some((1927, "70100")), "{err}");
    assert!(err.to_string().contains("hold window of 1500 ms"), "{err}");
    let m = h.metrics();
    assert_eq!(
        metric(
            &m,
            "holdfast_sessions_closed_by_holdfast_total{reason=\"hold_window_expired\"}"
        ),
        Some(1.0),
        "{m}"
    );
}

/// A session that must move but stays inside its transaction past the cool-down is closed
/// and counted with its reason; a session at a safe point moves.
#[test]
fn a_session_that_never_reaches_a_safe_point_is_closed_after_the_cooldown() {
    let h = Harness::start_with(Options::default().replicas(1).config(|c| {
        c.proxy.cooldown_ms = 1_000;
        // Another tool promotes: holdfast only follows read_only.
        c.ha.mode = holdfast_cluster::ha::HaMode::External;
    }));
    let mut idle = connect(&h);
    let mut busy = connect(&h);
    busy.query_drop("CREATE TABLE sbtest.cd (id INT PRIMARY KEY)")
        .unwrap();
    busy.query_drop("BEGIN").unwrap();
    busy.query_drop("INSERT INTO sbtest.cd VALUES (1)").unwrap();
    // The external tool swaps the roles.
    h.root_sql("SET GLOBAL read_only=ON");
    let node2 = h.lab.status.node("node2").unwrap().clone();
    holdfast_lab::node_sql(
        &node2,
        "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only=OFF",
    )
    .unwrap();
    wait_for("node2 primary", Duration::from_secs(20), || {
        (h.status().topology.primary.as_deref() == Some("node2")).then_some(())
    });
    wait_for(
        "the cool-down to close the busy session",
        Duration::from_secs(20),
        || {
            metric(
                &h.metrics(),
                "holdfast_sessions_closed_by_holdfast_total{reason=\"cooldown_open_transaction\"}",
            )
            .filter(|n| *n >= 1.0)
        },
    );
    assert!(
        busy.query_drop("SELECT 1").is_err(),
        "the busy session was closed"
    );
    assert_eq!(
        port(&mut idle),
        node2.port,
        "the idle session moved to the new primary"
    );
}

/// A planned resize of the primary (restart with other server options and a server binary
/// from `[driver] binaries`): sessions move to a replica and back with their state; the new
/// option is in effect afterwards.
#[test]
fn session_state_survives_a_planned_resize_of_the_primary() {
    let h = Harness::start_with(Options::default().replicas(2));
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    let node1 = h.lab.status.node("node1").unwrap().port;
    assert_eq!(port(&mut c), node1);
    let binary = h.lab.status.mariadbd.display().to_string();
    let (code, body) = h.admin_post(
        &format!("/resize?node=node1&binary={binary}&set=innodb_buffer_pool_size=256M"),
        None,
    );
    assert_eq!(code, 200, "{body}");
    wait_for("node1 primary again", Duration::from_secs(20), || {
        (h.status().topology.primary.as_deref() == Some("node1")).then_some(())
    });
    assert_same_session(&mut c, &before, &stmt);
    assert_eq!(
        port(&mut c),
        node1,
        "the session is back on the resized primary"
    );
    let pool: Option<u64> = c.query_first("SELECT @@innodb_buffer_pool_size").unwrap();
    assert_eq!(pool, Some(256 << 20));
    let closed = metric(&h.metrics(), "holdfast_sessions_closed_by_holdfast_total");
    assert_eq!(closed, None, "no session was closed");
}

/// Unplanned failover: the primary is killed; the session (idle, between transactions)
/// continues on the promoted replica with its state, user variables included (captured when
/// they were set, since the old node cannot be asked any more).
#[test]
fn session_state_survives_a_failover() {
    let mut h = Harness::start_with(Options::default().replicas(2));
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    h.wait_captured();
    // Let the replicas apply what was written, as a quiet primary's replicas would have.
    wait_for("replicas caught up", Duration::from_secs(20), || {
        let primary_pos =
            holdfast_lab::node_sql_value(h.lab.primary(), "SELECT @@gtid_binlog_pos").ok()??;
        h.lab
            .replicas()
            .iter()
            .all(|r| {
                holdfast_lab::node_sql_value(r, "SELECT @@gtid_slave_pos")
                    .ok()
                    .flatten()
                    == Some(primary_pos.clone())
            })
            .then_some(())
    });
    let old_port = port(&mut c);
    h.lab.kill_node("node1").unwrap();
    wait_for("a new primary", Duration::from_secs(30), || {
        h.status().topology.primary.filter(|p| p != "node1")
    });
    let new_port = port(&mut c);
    assert_ne!(new_port, old_port);
    assert_same_session(&mut c, &before, &stmt);
}

/// An XA transaction pins the session until it is committed or rolled back.
#[test]
fn an_xa_transaction_blocks_moves() {
    let h = Harness::start();
    let mut c = connect(&h);
    let blocked = |h: &Harness| {
        h.status()
            .sessions
            .first()
            .and_then(|s| s.blocked_by.clone())
    };
    c.query_drop("XA START 'x1'").unwrap();
    c.query_drop("SELECT 1").unwrap();
    wait_for("XA shown as a blocker", Duration::from_secs(10), || {
        blocked(&h).filter(|b| b == "open transaction" || b == "XA transaction")
    });
    c.query_drop("XA END 'x1'").unwrap();
    c.query_drop("XA PREPARE 'x1'").unwrap();
    wait_for(
        "a prepared XA transaction still blocks",
        Duration::from_secs(10),
        || blocked(&h).filter(|b| b == "open transaction" || b == "XA transaction"),
    );
    c.query_drop("XA COMMIT 'x1'").unwrap();
    wait_for("movable again", Duration::from_secs(10), || {
        h.status()
            .sessions
            .first()
            .filter(|s| s.movable)
            .map(|_| ())
    });
}

/// State changed by the very statement before a switchover (a user variable, which only a
/// capture reads, and a session variable) is there after it: the switchover waits for the
/// session's capture, which runs while the old primary is still alive.
#[test]
fn state_set_right_before_a_switchover_survives_it() {
    let h = Harness::start_with(Options::default().replicas(1));
    let mut c = connect(&h);
    c.query_drop("SET @u = 7, SESSION time_zone = '+03:00'")
        .unwrap();
    let node2 = h.switch_over_to("node2");
    let row: Option<(i64, String, u16)> = c.query_first("SELECT @u, @@time_zone, @@port").unwrap();
    assert_eq!(row, Some((7, "+03:00".to_string(), node2)));
}

/// The blocker `/status` shows for the only session, once it shows one.
fn wait_blocker(h: &Harness, want: &str) {
    wait_for(
        &format!("{want} shown as a blocker"),
        Duration::from_secs(10),
        || {
            h.status()
                .sessions
                .first()
                .and_then(|s| s.blocked_by.clone())
                .filter(|b| b == want)
        },
    );
}

/// Issue 18, item 9: state made through the binary protocol is seen as a text statement's
/// is: a prepared `CREATE TEMPORARY TABLE` and a prepared `GET_LOCK(?, ?)` pin the
/// session (they were not seen: a switchover dropped them silently), and a prepared
/// `SET @x = ?` is captured (it survives a switchover).
#[test]
fn state_made_by_prepared_statements_is_seen() {
    let h = Harness::start_with(Options::default().replicas(1));
    let mut c = connect(&h);
    let set = c.prep("SET @px = ?").unwrap();
    c.exec_drop(&set, (41,)).unwrap();
    let node2 = h.switch_over_to("node2");
    let row: Option<(i64, u16)> = c.query_first("SELECT @px, @@port").unwrap();
    assert_eq!(
        row,
        Some((41, node2)),
        "the prepared SET's value moved with the session"
    );

    let lock = c.prep("SELECT GET_LOCK(?, ?)").unwrap();
    let got: Option<i64> = c.exec_first(&lock, ("pl", 0)).unwrap();
    assert_eq!(got, Some(1));
    wait_blocker(&h, "GET_LOCK");
    let _: Option<i64> = c.query_first("SELECT RELEASE_LOCK('pl')").unwrap();
    drop(c);

    let mut c = connect(&h);
    let tmp = c.prep("CREATE TEMPORARY TABLE pt (a INT)").unwrap();
    c.exec_drop(&tmp, ()).unwrap();
    wait_blocker(&h, "temporary table");
}

/// Issue 18, item 9: a procedure that makes a temporary table changes the session's state
/// in a way holdfast cannot read from `CALL p()`: the server's state-change report, not
/// explained by the user variables, pins the session. One that only sets a user variable
/// does not (its value is captured and moves with the session).
#[test]
fn state_made_inside_a_procedure_is_not_lost_silently() {
    let h = Harness::start_with(Options::default().replicas(1));
    h.root_sql(
        "CREATE PROCEDURE sbtest.p_var() SET @from_p = 5; \
         CREATE PROCEDURE sbtest.p_tmp() CREATE TEMPORARY TABLE sbtest.from_p (a INT)",
    );
    let mut c = connect(&h);
    c.query_drop("CALL sbtest.p_var()").unwrap();
    let node2 = h.switch_over_to("node2");
    let row: Option<(i64, u16)> = c.query_first("SELECT @from_p, @@port").unwrap();
    assert_eq!(row, Some((5, node2)));
    assert!(h.status().sessions.first().is_some_and(|s| s.movable));

    c.query_drop("CALL sbtest.p_tmp()").unwrap();
    wait_blocker(&h, "state changed by a procedure or dynamic SQL");
}
