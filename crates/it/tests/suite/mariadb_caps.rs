//! MariaDB's own protocol extensions, as MariaDB Connectors use them: extended type info in
//! column definitions (a JSON column says `format=json`, a geometry its type name), bulk
//! (array-bound) execution, and statement id -1 ("the statement prepared last"). Each
//! case runs directly against the server and through holdfast, compared byte for byte or
//! row for row, and again through holdfast after the session moved.

use holdfast_it::raw::{RawConn, Response, BASE_CAPS};
use holdfast_it::{wait_for, Harness, Options};
use holdfast_wire::caps::*;
use std::net::SocketAddr;
use std::time::Duration;

const WANTED: u32 = MARIADB_CLIENT_EXTENDED_TYPE_INFO | MARIADB_CLIENT_STMT_BULK_OPERATIONS;

fn connect(h: &Harness, addr: SocketAddr) -> RawConn {
    let mut c = RawConn::greet(addr).expect("greeting");
    c.mariadb_caps = WANTED;
    c.login(h.user(), h.password(), Some(h.database()), BASE_CAPS)
        .expect("login");
    c
}

/// The column definitions of `sql`'s result, raw, and its rows.
fn column_definitions(c: &mut RawConn, sql: &str) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut p = vec![0x03];
    p.extend_from_slice(sql.as_bytes());
    c.command(&p).unwrap();
    let count = c.read_packet().unwrap().payload;
    assert!(
        count.len() == 1 && count[0] < 0xfb,
        "a column count: {count:02x?}"
    );
    let defs: Vec<_> = (0..count[0])
        .map(|_| c.read_packet().unwrap().payload)
        .collect();
    if !c.deprecate_eof() {
        c.read_packet().unwrap();
    }
    let mut rows = Vec::new();
    loop {
        let p = c.read_packet().unwrap().payload;
        if p.first() == Some(&0xfe) && p.len() < 0xffffff {
            break;
        }
        rows.push(p);
    }
    (defs, rows)
}

#[test]
fn extended_type_info_reaches_the_client_as_the_server_sends_it() {
    let h = Harness::start_with(Options::default().replicas(1));
    h.root_sql(
        "CREATE TABLE sbtest.js (j JSON, p POINT); \
         INSERT INTO sbtest.js VALUES ('{\"a\": 1}', POINT(1, 2))",
    );
    let sql = "SELECT j, p FROM js";
    let mut direct = connect(&h, h.direct());
    let mut through = connect(&h, h.proxy);
    assert_eq!(direct.mariadb_caps, WANTED, "the server offers both");
    assert_eq!(through.mariadb_caps, WANTED, "holdfast offers both");
    let expected = column_definitions(&mut direct, sql);
    assert!(
        expected.0[0].windows(4).any(|w| w == b"json"),
        "the server sent format=json: {:02x?}",
        expected.0[0]
    );
    assert_eq!(column_definitions(&mut through, sql), expected);
    // Prepared: the binary result of the same columns.
    let run = |c: &mut RawConn| {
        let s = c.prepare(sql).unwrap();
        c.execute_no_params(s.id, 0).unwrap()
    };
    let rows = |r: Vec<Response>| -> Vec<Vec<u8>> {
        r.into_iter()
            .flat_map(|r| match r {
                Response::Rows { rows, .. } => rows,
                Response::Ok { .. } => Vec::new(),
            })
            .collect()
    };
    let binary = rows(run(&mut direct));
    assert_eq!(rows(run(&mut through)), binary);
    // After a move, the new backend connection has the client's capabilities too.
    h.switch_over_to("node2");
    assert_eq!(column_definitions(&mut through, sql), expected);
    assert_eq!(rows(run(&mut through)), binary);
}

/// COM_STMT_BULK_EXECUTE of `INSERT INTO bulk VALUES (?, ?)` with `rows` rows (INT and
/// string, types sent); returns the OK's affected rows.
fn bulk_insert(c: &mut RawConn, id: u32, first: i32, rows: i32) -> u64 {
    let mut p = vec![0xfa];
    p.extend_from_slice(&id.to_le_bytes());
    p.extend_from_slice(&128u16.to_le_bytes()); // STMT_BULK_FLAG_SEND_TYPES_TO_SERVER
    p.extend_from_slice(&[3, 0, 253, 0]); // LONG, VAR_STRING
    for n in first..first + rows {
        p.push(0); // no indicator
        p.extend_from_slice(&n.to_le_bytes());
        p.push(0);
        let s = format!("row {n}");
        p.push(s.len() as u8);
        p.extend_from_slice(s.as_bytes());
    }
    c.command(&p).unwrap();
    let ok = c.read_packet().unwrap().payload;
    assert_eq!(ok.first(), Some(&0), "an OK: {ok:02x?}");
    u64::from(ok[1])
}

#[test]
fn bulk_execution_inserts_every_row_as_on_the_server() {
    let h = Harness::start_with(Options::default().replicas(1));
    h.root_sql("CREATE TABLE sbtest.bulk (a INT PRIMARY KEY, b VARCHAR(20))");
    let insert = "INSERT INTO bulk VALUES (?, ?)";
    let mut direct = connect(&h, h.direct());
    let s = direct.prepare(insert).unwrap();
    assert_eq!(bulk_insert(&mut direct, s.id, 1, 3), 3);
    let mut through = connect(&h, h.proxy);
    let s = through.prepare(insert).unwrap();
    assert_eq!(bulk_insert(&mut through, s.id, 11, 3), 3);
    // The client's statement id still works once the session moved (prepared again on the
    // new primary under the same id).
    h.switch_over_to("node2");
    assert_eq!(bulk_insert(&mut through, s.id, 21, 2), 2);
    let want: Vec<(String, String)> = [1, 2, 3, 11, 12, 13, 21, 22]
        .iter()
        .map(|n| (n.to_string(), format!("row {n}")))
        .collect();
    // Read where root_sql reads once replication has caught up.
    wait_for("every row, once each", Duration::from_secs(10), || {
        let got: Vec<(String, String)> = h
            .root_sql("SELECT a, b FROM sbtest.bulk ORDER BY a")
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect();
        (got == want).then_some(())
    });
}

/// Statement id -1 names the statement prepared last on the connection (MariaDB
/// Connectors send a prepare and its execute together with it); after a failed prepare
/// it names none.
#[test]
fn statement_id_minus_one_executes_the_statement_prepared_last() {
    let h = Harness::start();
    let run = |addr| {
        let mut c = connect(&h, addr);
        c.prepare("SELECT 40 + 1").unwrap();
        c.prepare("SELECT 41 + 1").unwrap();
        let last = match c.execute_no_params(u32::MAX, 0).unwrap().pop() {
            Some(Response::Rows { rows, .. }) => rows,
            other => panic!("rows expected: {other:?}"),
        };
        c.prepare("SELEC 1").expect_err("a syntax error");
        let after_failure = c
            .execute_no_params(u32::MAX, 0)
            .map(|_| ())
            .map_err(|e| holdfast_it::raw::server_err(&e).map(|e| e.code));
        (last, after_failure)
    };
    let direct = run(h.direct());
    assert!(direct.1.is_err(), "no statement after a failed prepare");
    assert_eq!(run(h.proxy), direct);
}
