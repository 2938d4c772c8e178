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
    // MariaDB answers an interrupted statement with 1317 (MySQL's SLEEP would return 1).
    let e = r.expect_err("interrupted");
    assert!(e.contains("ERROR 1317 (70100)"), "{e}");
    assert_eq!(
        victim.query_value("SELECT CONNECTION_ID()").unwrap(),
        thread
    );
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
