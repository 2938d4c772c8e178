//! Where clients can tell holdfast from the server: the same answers, compared with the
//! server itself (issue 11 item 9).

use holdfast_it::Harness;
use mysql::prelude::*;
use mysql::{ChangeUserOpts, Conn, OptsBuilder};
use std::net::SocketAddr;
use std::time::Duration;

fn connect_at(h: &Harness, addr: SocketAddr) -> Conn {
    let opts = OptsBuilder::new()
        .ip_or_hostname(Some(addr.ip().to_string()))
        .tcp_port(addr.port())
        .user(Some(h.user()))
        .pass(Some(h.password()))
        .db_name(Some(h.database()))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(60)))
        .write_timeout(Some(Duration::from_secs(60)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

const PROCEDURE_CURSOR: &str =
    "BEGIN NOT ATOMIC DECLARE c CURSOR FOR SELECT 1; OPEN c; SELECT 5 AS five; CLOSE c; END";

/// A stored program's open cursor sets SERVER_STATUS_CURSOR_EXISTS in the text-protocol
/// answers; that is no COM_STMT_FETCH cursor and the rows follow.
#[test]
fn a_stored_program_cursor_does_not_end_the_text_result() {
    let h = Harness::start();
    // The mysql crate (CLIENT_DEPRECATE_EOF off: rows end with a legacy EOF).
    for addr in [h.direct(), h.proxy] {
        let mut c = connect_at(&h, addr);
        eprintln!("{addr}: the compound statement");
        let rows: Vec<i64> = c.query(PROCEDURE_CURSOR).unwrap();
        assert_eq!(rows, vec![5], "through {addr}");
        assert_eq!(c.query_first::<i64, _>("SELECT 6").unwrap(), Some(6));
        // Twice in a row on the same connection, and a prepared statement after it.
        let rows: Vec<i64> = c.query(PROCEDURE_CURSOR).unwrap();
        assert_eq!(rows, vec![5], "through {addr}, again");
        assert_eq!(
            c.exec_first::<i64, _, _>("SELECT ?", (7,)).unwrap(),
            Some(7)
        );
    }
    // The mariadb CLI: the compound statement (one COM_QUERY under another delimiter),
    // then another query on the same connection.
    let sql = format!("delimiter //\n{PROCEDURE_CURSOR}//\nSELECT 'after' AS e//");
    let args = ["--batch", "sbtest", "-e", sql.as_str()];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_eq!(via.code, Some(0), "{via:?}");
    assert_eq!(via, direct, "holdfast (left) and the server (right) differ");
    assert_eq!(via.stdout, "five\n5\ne\nafter\n", "{via:?}");
}

/// What a connection looks like after COM_CHANGE_USERs with a wrong password.
#[derive(Debug, PartialEq, Eq)]
struct AfterRefusal {
    /// The error codes of four attempts in a row (the server allows three failures).
    codes: Vec<Option<u16>>,
    /// CURRENT_USER(), DATABASE(), a user variable set before, `@@autocommit`.
    then: Option<(String, Option<String>, Option<i64>, i64)>,
}

fn refused_change_user(h: &Harness, addr: SocketAddr, user: &str) -> AfterRefusal {
    let mut c = connect_at(h, addr);
    c.query_drop("SET @before = 7, autocommit = 0").unwrap();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let err = c
            .change_user(
                ChangeUserOpts::default()
                    .with_user(Some(user.to_string()))
                    .with_pass(Some("not-the-password".into()))
                    .with_db_name(Some("mysql".into())),
            )
            .expect_err("a wrong password is refused");
        codes.push(match &err {
            mysql::Error::MySqlError(e) => Some(e.code),
            _ => None,
        });
    }
    let then = c
        .query_first::<(String, Option<String>, Option<i64>, i64), _>(
            "SELECT CURRENT_USER(), DATABASE(), @before, @@autocommit",
        )
        .map_err(|e| eprintln!("{addr}: after the refused COM_CHANGE_USER: {e}"))
        .ok()
        .flatten();
    if then.is_some() {
        c.ping().expect("ping after the refusal");
        // Still tracked: a transaction opened now is seen by holdfast (and the server).
        c.query_drop("SET @after = 1").unwrap();
    }
    AfterRefusal { codes, then }
}

/// The server answers a COM_CHANGE_USER with a wrong password with ERR 1045 (1047 from
/// the fourth failure on), keeps the connection logged in as before and resets its
/// session; holdfast used to close the connection (the client saw 2013).
#[test]
fn change_user_with_a_wrong_password_answers_as_the_server_does() {
    let h = Harness::start();
    let monitor = h.lab.status.monitor_user.clone();
    // (An unknown account is not tried: the server switches it to ed25519, which the
    // mysql crate cannot answer.)
    for user in [h.user().to_string(), monitor] {
        let direct = refused_change_user(&h, h.direct(), &user);
        let via = refused_change_user(&h, h.proxy, &user);
        eprintln!("{user}: direct {direct:?}, through holdfast {via:?}");
        assert_eq!(direct.codes[0], Some(1045), "{direct:?}");
        assert!(direct.then.is_some(), "{direct:?}");
        assert_eq!(
            via, direct,
            "COM_CHANGE_USER to {user}: holdfast (left) and the server (right) differ"
        );
    }
    // Any session still listed is the old user's.
    let st = h.status();
    assert!(st.sessions.iter().all(|s| s.user == h.user()), "{st:?}");
}

/// A login holdfast cannot serve is refused with a server error code (a client code such
/// as 2003 in an ERR packet reads as "2027 malformed packet"), naming the node, not its
/// address.
#[test]
fn a_login_with_the_only_node_down_gets_a_server_error_code() {
    let mut h = Harness::start();
    let address = h.direct();
    h.lab.stop_node("node1").unwrap();
    let out = h.mariadb(h.proxy, &["--batch", "sbtest", "-e", "SELECT 1"]);
    eprintln!("{out:?}");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("ERROR 1053 (08S01)"), "{}", out.stderr);
    assert!(out.stderr.contains("node1"), "{}", out.stderr);
    assert!(!out.stderr.contains("2027"), "{}", out.stderr);
    assert!(!out.stderr.contains("malformed"), "{}", out.stderr);
    assert!(
        !out.stderr.contains(&address.port().to_string()),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("127.0.0.1"), "{}", out.stderr);
}

/// COM_RESET_CONNECTION keeps the current database on the server; holdfast's record of the
/// session must too, or the session moves to another node with the wrong database.
#[test]
fn reset_connection_keeps_the_database_also_after_a_move() {
    let h = Harness::start_with(holdfast_it::Options::default().replicas(1));
    let after_reset = |addr| {
        let mut c = connect_at(&h, addr);
        c.query_drop("USE mysql").unwrap();
        c.query_drop("SET @before_reset = 1").unwrap();
        // holdfast has captured the user variable (for a move) before the reset.
        h.wait_captured();
        c.reset().unwrap();
        let db: Option<String> = c.query_first("SELECT DATABASE()").unwrap().flatten();
        (c, db)
    };
    let (_direct, direct_db) = after_reset(h.direct());
    let (mut c, db) = after_reset(h.proxy);
    assert_eq!(db, direct_db, "right after the reset");
    h.switch_over_to("node2");
    let moved: Option<String> = c.query_first("SELECT DATABASE()").unwrap().flatten();
    assert_eq!(moved, direct_db, "after the session moved to node2");
    let var: Option<i64> = c.query_first("SELECT @before_reset").unwrap().flatten();
    assert_eq!(
        var, None,
        "the reset cleared the user variable; the move must not bring it back"
    );
    assert!(h.status().counters.sessions_moved >= 1);
}

/// The greeting's status flags say what a new session starts with, as the server's do: a
/// server started with `--autocommit=0` greets without SERVER_STATUS_AUTOCOMMIT.
#[test]
fn the_greeting_status_follows_the_servers_autocommit() {
    use holdfast_it::raw::RawConn;
    for autocommit in ["1", "0"] {
        let arg = format!("--autocommit={autocommit}");
        let h = Harness::start_with(holdfast_it::Options::default().server_args(&[&arg]));
        let direct = RawConn::greet(h.direct()).unwrap().greeting.status;
        let via = RawConn::greet(h.proxy).unwrap().greeting.status;
        assert_eq!(via, direct, "{arg}: holdfast (left), the server (right)");
        assert_eq!(direct & 2 != 0, autocommit == "1", "{arg}: {direct:#x}");
    }
}
