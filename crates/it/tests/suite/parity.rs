//! Where clients can tell holdfast from the server: the same answers, compared with the
//! server itself (issue 11 item 9).

use holdfast_it::Harness;
use mysql::prelude::*;
use mysql::{Conn, OptsBuilder};
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
