//! `KILL` through holdfast behaves as it does on the server. A client knows a connection by
//! the id in its greeting (`mysql_thread_id()`, what `mysql_kill()` and the CLI's Ctrl-C
//! use) and by `CONNECTION_ID()`; both reach the right connection, a `KILL` ends the
//! client's connection as the server ends a direct one, and `KILL QUERY` only the
//! statement. Each case runs directly against the server and through holdfast, and the
//! outcomes are compared.

use holdfast_it::raw::{server_err, RawConn, BASE_CAPS};
use holdfast_it::{metric, wait_for, Harness};
use std::net::SocketAddr;
use std::time::Duration;

/// What a connection's next command got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    Answered(Option<String>),
    ServerErr(u16),
    Closed,
}

fn next(c: &mut RawConn, sql: &str) -> Next {
    match c.query_value(sql) {
        Ok(v) => Next::Answered(v),
        Err(e) => server_err(&e).map_or(Next::Closed, |e| Next::ServerErr(e.code)),
    }
}

fn connect(h: &Harness, addr: SocketAddr) -> RawConn {
    RawConn::connect(addr, h.user(), h.password(), Some(h.database()), BASE_CAPS).expect("login")
}

/// How the killer names its victim.
#[derive(Debug, Clone, Copy)]
enum Name {
    /// `KILL <greeting id>`.
    GreetingId,
    /// COM_PROCESS_KILL with the greeting's id (`mysql_kill()`).
    ProcessKill,
    /// `KILL <CONNECTION_ID() of the victim>`.
    ConnectionId,
}

/// The victim's next two commands after another connection killed it, named as `name`.
fn killed_by_another(h: &Harness, addr: SocketAddr, name: Name) -> (Next, Next) {
    let mut victim = connect(h, addr);
    let mut killer = connect(h, addr);
    let greeting_id = victim.greeting.connection_id;
    match name {
        Name::GreetingId => {
            killer.query(&format!("KILL {greeting_id}")).expect("KILL");
        }
        Name::ProcessKill => {
            let mut payload = vec![0x0c];
            payload.extend_from_slice(&greeting_id.to_le_bytes());
            killer.command(&payload).unwrap();
            let reply = killer.read_packet().unwrap();
            assert_eq!(
                reply.payload.first(),
                Some(&0),
                "COM_PROCESS_KILL answered OK"
            );
        }
        Name::ConnectionId => {
            let thread = victim
                .query_value("SELECT CONNECTION_ID()")
                .unwrap()
                .expect("an id");
            killer.query(&format!("KILL {thread}")).expect("KILL");
        }
    }
    let first = next(&mut victim, "SELECT 1");
    let second = next(&mut victim, "SELECT 1");
    (first, second)
}

#[test]
fn a_kill_from_another_connection_ends_the_client_connection_as_the_server_does() {
    let h = Harness::start();
    for name in [Name::GreetingId, Name::ProcessKill, Name::ConnectionId] {
        let direct = killed_by_another(&h, h.direct(), name);
        let through = killed_by_another(&h, h.proxy, name);
        assert_eq!(through, direct, "{name:?}: through holdfast vs directly");
        assert_eq!(direct.1, Next::Closed, "{name:?}: the connection is gone");
    }
    h.wait_sessions(0, Duration::from_secs(10));
    let killed = metric(
        &h.metrics(),
        r#"holdfast_sessions_closed_by_holdfast_total{reason="killed"}"#,
    );
    assert_eq!(killed, Some(3.0));
}

#[test]
fn kill_connection_id_of_itself_gets_the_servers_answer_and_ends() {
    let h = Harness::start();
    let run = |addr| {
        let mut c = connect(&h, addr);
        let first = next(&mut c, "KILL CONNECTION_ID()");
        (first, next(&mut c, "SELECT 1"))
    };
    let direct = run(h.direct());
    assert_eq!(direct, (Next::ServerErr(1927), Next::Closed));
    assert_eq!(run(h.proxy), direct);
}

/// A statement stopped by a `KILL QUERY` (`r`, its outcome): MariaDB answers 1317 (MySQL's
/// SLEEP would return 1), and the connection goes on, on the same backend connection
/// (`thread`: its `CONNECTION_ID()` before).
fn stopped_and_goes_on(
    victim: &mut RawConn,
    r: Result<Option<String>, String>,
    thread: Option<String>,
) {
    let e = r.expect_err("interrupted");
    assert!(e.contains("ERROR 1317 (70100)"), "{e}");
    assert_eq!(
        victim.query_value("SELECT CONNECTION_ID()").unwrap(),
        thread
    );
}

/// The `mariadb` CLI's Ctrl-C: `KILL QUERY <mysql_thread_id()>` from a second connection.
/// The statement stops with the server's 1317, the connection stays, on the same backend
/// connection (holdfast did not take the 1317 for a lost backend).
#[test]
fn kill_query_by_the_greetings_id_stops_only_the_statement() {
    let h = Harness::start();
    let mut victim = connect(&h, h.proxy);
    let greeting_id = victim.greeting.connection_id;
    let thread = victim.query_value("SELECT CONNECTION_ID()").unwrap();
    let sleeping = std::thread::spawn(move || {
        let r = victim.query_value("SELECT SLEEP(60)");
        (victim, r.map_err(|e| format!("{e:#}")))
    });
    wait_for("the SLEEP to run", Duration::from_secs(10), || {
        let rows = h.root_sql(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO = 'SELECT SLEEP(60)'",
        );
        (!rows.is_empty()).then_some(())
    });
    let mut killer = connect(&h, h.proxy);
    killer
        .query(&format!("KILL QUERY {greeting_id}"))
        .expect("KILL QUERY of holdfast's id");
    let (mut victim, r) = sleeping.join().unwrap();
    stopped_and_goes_on(&mut victim, r, thread);
    assert_eq!(
        next(&mut victim, "SELECT 2"),
        Next::Answered(Some("2".into()))
    );
}

/// An id in holdfast's range that names no session gets the server's answer to an unknown
/// thread, with the server's words.
#[test]
fn kill_of_an_unknown_id_gets_the_servers_1094() {
    let h = Harness::start();
    let run = |addr| {
        let mut c = connect(&h, addr);
        let e = c.query("KILL 1073741999").expect_err("unknown thread");
        let e = server_err(&e).expect("a server ERR").clone();
        (e.code, e.message)
    };
    let direct = run(h.direct());
    assert_eq!(direct.0, 1094);
    assert_eq!(run(h.proxy), direct);
}

/// An operator ends a session (`POST /sessions/kill`, what `holdfast ctl kill` and the
/// dashboard send): its client sees what a client sees when a `KILL` on the server ends
/// its connection, and what it held there (a named lock, a temporary table, an open
/// transaction's write) goes with it. Compared with a root `KILL` of a direct connection.
#[test]
fn an_operators_kill_ends_a_session_as_a_kill_on_the_server_does() {
    let h = Harness::start();
    let db = h.database().to_string();
    h.root_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {db}.op_kill (id INT PRIMARY KEY)"
    ));
    let run = |through: bool| -> (Next, Next) {
        let mut victim = connect(&h, if through { h.proxy } else { h.direct() });
        victim.query("SET @v = 1").expect("a user variable");
        victim
            .query("CREATE TEMPORARY TABLE op_tmp (a INT)")
            .expect("a temporary table");
        assert_eq!(
            victim.query_value("SELECT GET_LOCK('op_kill', 0)").unwrap(),
            Some("1".into())
        );
        victim.query("BEGIN").expect("BEGIN");
        victim
            .query("INSERT INTO op_kill VALUES (1)")
            .expect("a write in the transaction");
        let id = victim.greeting.connection_id;
        if through {
            let (code, body) = h.admin_post(&format!("/sessions/kill?id={id}"), None);
            assert_eq!(code, 200, "{body}");
        } else {
            h.root_sql(&format!("KILL {id}"));
        }
        let outcome = (next(&mut victim, "SELECT 1"), next(&mut victim, "SELECT 1"));
        wait_for("the named lock freed", Duration::from_secs(10), || {
            let free = h.root_sql("SELECT IS_FREE_LOCK('op_kill')");
            (free == vec![vec!["1".to_string()]]).then_some(())
        });
        let rows = h.root_sql(&format!("SELECT COUNT(*) FROM {db}.op_kill"));
        assert_eq!(
            rows,
            vec![vec!["0".to_string()]],
            "the transaction rolled back"
        );
        outcome
    };
    let direct = run(false);
    assert_eq!(direct.1, Next::Closed, "the connection is gone");
    assert_eq!(run(true), direct, "through holdfast vs directly");
    h.wait_sessions(0, Duration::from_secs(10));
    let killed = metric(
        &h.metrics(),
        r#"holdfast_sessions_closed_by_holdfast_total{reason="killed"}"#,
    );
    assert_eq!(killed, Some(1.0), "closed as killed, not moved elsewhere");
    // Ids that name no session are refused with why.
    let (code, body) = h.admin_post("/sessions/kill?id=7", None);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no session 7 is open"), "{body}");
    let (code, body) = h.admin_post("/sessions/kill", None);
    assert_eq!(code, 400, "{body}");
}

/// An operator's `kill --query` stops the statement a session runs (shown in `/status`
/// once it runs for a while): its client gets the server's 1317 and goes on, on the same
/// backend connection, with its state.
#[test]
fn an_operators_kill_query_stops_only_the_statement() {
    let h = Harness::start();
    let mut victim = connect(&h, h.proxy);
    let id = victim.greeting.connection_id;
    victim.query("SET @kept = 'yes'").expect("a user variable");
    let thread = victim.query_value("SELECT CONNECTION_ID()").unwrap();
    let sleeping = std::thread::spawn(move || {
        let r = victim.query_value("SELECT  SLEEP(60) /* op */");
        (victim, r.map_err(|e| format!("{e:#}")))
    });
    let session = |h: &Harness| {
        h.status_json()["sessions"]
            .as_array()
            .and_then(|v| v.iter().find(|s| s["id"] == id).cloned())
            .expect("the session in /status")
    };
    // Past half a second, /status shows what it runs (whitespace as one space).
    let shown = wait_for("the statement in /status", Duration::from_secs(10), || {
        let s = session(&h);
        s["statement"].is_string().then_some(s)
    });
    assert_eq!(shown["statement"], "SELECT SLEEP(60) /* op */", "{shown}");
    assert_eq!(shown["state"], "running", "{shown}");
    assert!(
        shown["statement_ms"].as_u64().is_some_and(|ms| ms >= 500),
        "{shown}"
    );
    let (code, body) = h.admin_post(&format!("/sessions/kill?id={id}&query=true"), None);
    assert_eq!(code, 200, "{body}");
    let (mut victim, r) = sleeping.join().unwrap();
    stopped_and_goes_on(&mut victim, r, thread);
    assert_eq!(
        next(&mut victim, "SELECT @kept"),
        Next::Answered(Some("yes".into()))
    );
    let after = session(&h);
    assert_eq!(after["state"], "idle", "{after}");
    assert!(after.get("statement").is_none(), "{after}");
}

/// Ctrl-C in the `mariadb` CLI while a statement runs: the CLI opens a second connection and
/// kills the statement by the id in its greeting. Directly and through holdfast alike, the
/// statement stops at once and the CLI reports the server's 1317.
#[test]
fn ctrl_c_in_the_mariadb_cli_stops_the_statement() {
    let h = Harness::start();
    let run = |addr: SocketAddr| {
        let mut child =
            Harness::mariadb_command(addr, h.user(), h.password(), &["-e", "SELECT SLEEP(60)"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("mariadb CLI");
        wait_for("the SLEEP to run", Duration::from_secs(10), || {
            let rows = h.root_sql(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO = 'SELECT SLEEP(60)'",
            );
            (!rows.is_empty()).then_some(())
        });
        let sent = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill -INT");
        assert!(sent.success());
        wait_for("the CLI to end", Duration::from_secs(20), || {
            child.try_wait().ok().flatten()
        });
        let out = child.wait_with_output().expect("CLI output");
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    };
    let direct = run(h.direct());
    assert!(direct.contains("1317"), "{direct}");
    assert_eq!(run(h.proxy), direct);
}

/// A client that vanishes while its statement waits (GET_LOCK on a lock another connection
/// holds): the server stops the statement, directly and through holdfast alike.
#[test]
fn a_client_vanishing_during_get_lock_stops_its_statement() {
    let h = Harness::start();
    let mut holder = connect(&h, h.direct());
    assert_eq!(
        holder.query_value("SELECT GET_LOCK('gate', 1)").unwrap(),
        Some("1".into())
    );
    let waiting = || {
        h.root_sql(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO = \"SELECT GET_LOCK('gate', 60)\"",
        )
        .len()
    };
    for addr in [h.direct(), h.proxy] {
        let mut c = connect(&h, addr);
        c.command(b"\x03SELECT GET_LOCK('gate', 60)").unwrap();
        wait_for("the GET_LOCK to wait", Duration::from_secs(10), || {
            (waiting() == 1).then_some(())
        });
        drop(c);
        wait_for(
            &format!("the GET_LOCK of a vanished client of {addr} to stop"),
            Duration::from_secs(10),
            || (waiting() == 0).then_some(()),
        );
    }
    h.wait_sessions(0, Duration::from_secs(10));
}

/// A `KILL` whose target holdfast cannot read (`KILL @v`) may name the killer itself, so the
/// killer is marked while it runs; when it ended another connection, that mark goes: the
/// killer still moves with a switchover instead of being closed as killed.
#[test]
fn a_killer_naming_its_victim_by_variable_still_moves() {
    let h = Harness::start_with(holdfast_it::Options::default().replicas(1));
    let mut victim = connect(&h, h.proxy);
    let thread = victim
        .query_value("SELECT CONNECTION_ID()")
        .unwrap()
        .expect("an id");
    let mut killer = connect(&h, h.proxy);
    killer.query(&format!("SET @v = {thread}")).unwrap();
    killer.query("KILL @v").expect("KILL @v");
    drop(victim);
    h.switch_over_to("node2");
    assert_eq!(
        next(&mut killer, "SELECT @v"),
        Next::Answered(Some(thread)),
        "the killer moved with its state"
    );
}

/// The affected-row count of the OK a statement got, or the server's error code.
fn outcome(r: anyhow::Result<Vec<holdfast_it::raw::Response>>) -> Result<u64, u16> {
    match r {
        Ok(responses) => match responses.first() {
            Some(holdfast_it::raw::Response::Ok { payload, .. }) => {
                Ok(holdfast_wire::packets::OkPacket::parse(payload, false)
                    .map_or(u64::MAX, |ok| ok.affected_rows))
            }
            other => panic!("expected an OK, got {other:?}"),
        },
        Err(e) => Err(server_err(&e).map_or(0, |e| e.code)),
    }
}

/// `KILL USER v` from another connection while one of v's connections idles and another
/// runs a statement: the server's answer (how many it killed), and what each victim's
/// next command gets afterwards.
fn kill_user(h: &Harness, addr: SocketAddr) -> (Result<u64, u16>, Next, Next, Next) {
    let mut idle = RawConn::connect(addr, "v", "v_pw", None, BASE_CAPS).expect("login as v");
    let busy = RawConn::connect(addr, "v", "v_pw", None, BASE_CAPS).expect("login as v");
    let sleeping = std::thread::spawn(move || {
        let mut busy = busy;
        let r = next(&mut busy, "SELECT SLEEP(30)");
        (busy, r)
    });
    wait_for("the SLEEP to run", Duration::from_secs(10), || {
        let rows = h.root_sql(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO = 'SELECT SLEEP(30)'",
        );
        (!rows.is_empty()).then_some(())
    });
    let mut killer = connect(h, addr);
    let answer = outcome(killer.query("KILL USER v"));
    let (mut busy, during) = sleeping.join().expect("the sleeping thread");
    let idle_next = next(&mut idle, "SELECT 1");
    let busy_next = next(&mut busy, "SELECT 1");
    (answer, during, idle_next, busy_next)
}

/// `KILL USER` ends every connection of the user, through holdfast as directly: the
/// server's count in the answer, the running statement's connection lost, the idle one
/// gone at its next command (not logged in again on a fresh backend connection).
#[test]
fn kill_user_ends_every_session_of_the_user_as_directly() {
    let h = Harness::start();
    h.root_sql("CREATE USER 'v'@'%' IDENTIFIED BY 'v_pw'; GRANT SELECT ON *.* TO 'v'@'%'");
    let direct = kill_user(&h, h.direct());
    assert_eq!(
        direct,
        (Ok(2), Next::Closed, Next::Closed, Next::Closed),
        "directly"
    );
    let through = kill_user(&h, h.proxy);
    assert_eq!(through, direct, "through holdfast vs directly");
    // v's sessions are closed (and the killer's, dropped).
    h.wait_sessions(0, Duration::from_secs(10));
}

/// How a killer names its victim other than by a literal id.
#[derive(Debug, Clone, Copy)]
enum Expr {
    /// `KILL (SELECT <greeting id>)`.
    Subquery,
    /// `KILL <greeting id> + 0`.
    Arithmetic,
    /// `KILL CONNECTION (SELECT <CONNECTION_ID() of the victim>)`.
    ServerThread,
    /// COM_STMT_PREPARE `KILL ?`, executed with the greeting's id.
    Prepared,
    /// `PREPARE k FROM 'KILL ?'`, `EXECUTE k USING @t` with the greeting's id in `@t`.
    SqlPrepared,
    /// `KILL USER CURRENT_USER` run by the victim's account on another connection.
    UserCurrentUser,
}

/// COM_STMT_EXECUTE of statement `id` with one unsigned BIGINT parameter, its type sent
/// (`bind`) or left to what the server remembers from the last execute.
fn execute_with(
    c: &mut RawConn,
    id: u32,
    value: u64,
    bind: bool,
) -> anyhow::Result<Vec<holdfast_it::raw::Response>> {
    let mut p = vec![0x17];
    p.extend_from_slice(&id.to_le_bytes());
    p.push(0);
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(0); // null bitmap
    if bind {
        p.push(1); // types follow
        p.extend_from_slice(&[0x08, 0x80]); // LONGLONG, unsigned
    } else {
        p.push(0);
    }
    p.extend_from_slice(&value.to_le_bytes());
    c.command(&p)?;
    c.read_results()
}

/// The killer's answer and the victim's next two commands.
fn killed_by_expression(
    h: &Harness,
    addr: SocketAddr,
    how: Expr,
) -> (Result<u64, u16>, Next, Next) {
    let mut victim = connect(h, addr);
    let mut killer = connect(h, addr);
    let greeting_id = victim.greeting.connection_id;
    let answer = match how {
        Expr::Subquery => outcome(killer.query(&format!("KILL (SELECT {greeting_id})"))),
        Expr::Arithmetic => outcome(killer.query(&format!("KILL {greeting_id} + 0"))),
        Expr::ServerThread => {
            let thread = victim
                .query_value("SELECT CONNECTION_ID()")
                .unwrap()
                .expect("an id");
            outcome(killer.query(&format!("KILL CONNECTION (SELECT {thread})")))
        }
        Expr::Prepared => {
            let stmt = killer.prepare("KILL ?").expect("PREPARE KILL ?");
            let answer = outcome(execute_with(
                &mut killer,
                stmt.id,
                u64::from(greeting_id),
                true,
            ));
            // Executed again without its type (the server remembers it): a thread that
            // does not exist.
            let again = outcome(execute_with(&mut killer, stmt.id, 999_999, false));
            assert_eq!(again, Err(1094), "{how:?}: executed again");
            answer
        }
        Expr::SqlPrepared => {
            killer.query("PREPARE k FROM 'KILL ?'").expect("PREPARE k");
            killer
                .query(&format!("SET @t = {greeting_id}"))
                .expect("SET");
            outcome(killer.query("EXECUTE k USING @t"))
        }
        Expr::UserCurrentUser => {
            // The killer is of the same account: it ends itself too (after its answer).
            let answer = outcome(killer.query("KILL USER CURRENT_USER"));
            assert_eq!(
                next(&mut killer, "SELECT 1"),
                Next::Closed,
                "{how:?}: the killer"
            );
            // Its count depends on the other connections of the account: not compared.
            answer.map(|_| 0)
        }
    };
    // What holdfast knew of the victim when the answer came (for a failure's message).
    let known = h.shared.sessions.get(greeting_id).map(|v| {
        (
            v.backend.lock().map(|b| b.clone()).unwrap_or_default(),
            v.backend_thread.load(std::sync::atomic::Ordering::Acquire),
            v.moves.load(std::sync::atomic::Ordering::Relaxed),
        )
    });
    let threads = h.root_sql("SELECT ID, USER, COMMAND FROM information_schema.PROCESSLIST");
    eprintln!("{how:?} via {addr}: answer {answer:?}; victim {greeting_id} (node, thread, moves) {known:?}; server threads {threads:?}");
    let first = next(&mut victim, "SELECT 1");
    let second = next(&mut victim, "SELECT 1");
    (answer, first, second)
}

/// A `KILL` whose target is an expression, a prepared `KILL ?`, or `KILL USER` of the
/// killer's own account ends the connection it names, through holdfast as directly (with
/// holdfast's ids mapped as for a literal id).
#[test]
fn kill_by_expression_or_prepared_ends_the_session_as_directly() {
    let h = Harness::start();
    for how in [
        Expr::Subquery,
        Expr::Arithmetic,
        Expr::ServerThread,
        Expr::Prepared,
        Expr::SqlPrepared,
        Expr::UserCurrentUser,
    ] {
        let direct = killed_by_expression(&h, h.direct(), how);
        assert_eq!(
            direct.2,
            Next::Closed,
            "{how:?}: the victim is gone directly"
        );
        let through = killed_by_expression(&h, h.proxy, how);
        assert_eq!(through, direct, "{how:?}: through holdfast vs directly");
    }
}
