//! The Rust `mysql` crate (sync driver) through holdfast: text and binary protocol,
//! statement ids, connection resets, large packets and large results.

use holdfast_it::raw::{server_err, RawConn, BASE_CAPS};
use holdfast_it::{Harness, Options};
use mysql::prelude::*;
use mysql::{ChangeUserOpts, Conn, Opts, OptsBuilder, Row, Value};
use std::time::Duration;

fn connect_to(url: &str) -> Conn {
    // prefer_socket(false): by default the crate reconnects through the server's unix
    // socket when the host is loopback, which would bypass holdfast entirely.
    let opts = OptsBuilder::from_opts(Opts::from_url(url).expect("url"))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(120)))
        .write_timeout(Some(Duration::from_secs(120)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts).unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

fn connect(h: &Harness) -> Conn {
    let c = connect_to(&h.url());
    // Really through holdfast: its session registry sees us.
    holdfast_it::wait_for(
        "the mysql crate's session in holdfast's registry",
        Duration::from_secs(10),
        || (!h.shared.sessions.is_empty()).then_some(()),
    );
    c
}

fn mysql_code(e: &mysql::Error) -> Option<u16> {
    match e {
        mysql::Error::MySqlError(m) => Some(m.code),
        _ => None,
    }
}

#[test]
fn text_queries_and_multiple_result_sets() {
    let h = Harness::start();
    let mut c = connect(&h);
    assert_eq!(c.query_first::<i64, _>("SELECT 1 + 1").unwrap(), Some(2));
    c.query_drop("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    // Single-row statements: their OK packets carry no info text (see the ignored
    // `ok_packet_info_text_reaches_the_client` for the ones that do).
    for v in ["a", "b", "c"] {
        c.exec_drop("INSERT INTO t (v) VALUES (?)", (v,)).unwrap();
        assert_eq!(c.affected_rows(), 1);
    }
    assert_eq!(c.last_insert_id(), 3);
    c.query_drop("DELETE FROM t WHERE id = 3").unwrap();
    assert_eq!(c.affected_rows(), 1);
    c.query_drop("INSERT INTO t (v) VALUES ('c')").unwrap();
    assert_eq!(c.last_insert_id(), 4);
    let rows: Vec<(i32, String)> = c.query("SELECT id, v FROM t ORDER BY id").unwrap();
    assert_eq!(
        rows,
        vec![(1, "a".into()), (2, "b".into()), (4, "c".into())]
    );

    // Several result sets in one COM_QUERY.
    let mut sets = Vec::new();
    let mut result = c
        .query_iter("SELECT 1; SELECT 'x', 'y'; DO 0; SELECT v FROM t ORDER BY id")
        .unwrap();
    while let Some(set) = result.iter() {
        let rows: Vec<Row> = set.map(|r| r.unwrap()).collect();
        sets.push(
            rows.into_iter()
                .flat_map(|r| r.unwrap())
                .collect::<Vec<Value>>(),
        );
    }
    drop(result);
    assert_eq!(
        sets,
        vec![
            vec![Value::Bytes(b"1".to_vec())],
            vec![Value::Bytes(b"x".to_vec()), Value::Bytes(b"y".to_vec())],
            vec![],
            vec![
                Value::Bytes(b"a".to_vec()),
                Value::Bytes(b"b".to_vec()),
                Value::Bytes(b"c".to_vec())
            ],
        ]
    );
    // An error, then the session goes on.
    let e = c.query_drop("SELECT * FROM no_such_table").unwrap_err();
    assert_eq!(mysql_code(&e), Some(1146), "{e}");
    assert_eq!(
        c.query_first::<String, _>("SELECT DATABASE()")
            .unwrap()
            .as_deref(),
        Some("sbtest")
    );
}

#[test]

fn ok_packet_info_text_reaches_the_client() {
    let h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    c.query_drop("INSERT INTO t (v) VALUES ('a'), ('b'), ('c')")
        .unwrap();
    assert_eq!(c.affected_rows(), 3);
    assert_eq!(c.info_str(), "Records: 3  Duplicates: 0  Warnings: 0");
    c.query_drop("UPDATE t SET v = 'z' WHERE id > 1").unwrap();
    assert_eq!(c.affected_rows(), 2);
    assert_eq!(c.info_str(), "Rows matched: 2  Changed: 2  Warnings: 0");
}

#[test]
fn prepared_statements_round_trip_every_common_type() {
    let h = Harness::start();
    let mut c = connect(&h);
    c.query_drop(
        "CREATE TABLE types (id INT PRIMARY KEY, ti TINYINT, si SMALLINT, i INT, bi BIGINT, \
         ubi BIGINT UNSIGNED, dec_ DECIMAL(30,6), dbl DOUBLE, flt FLOAT, vc VARCHAR(100), \
         bl LONGBLOB, d DATE, dt DATETIME(6), tm TIME(6), n INT NULL) DEFAULT CHARSET=utf8mb4",
    )
    .unwrap();
    let text = "héllo wörld 😀🎉 漢字 ñ";
    let blob: Vec<u8> = (0..=255u8).cycle().take(256 * 4).collect();
    let params: Vec<Value> = vec![
        Value::Int(1),
        Value::Int(-128),
        Value::Int(-32768),
        Value::Int(i64::from(i32::MIN)),
        Value::Int(i64::MIN),
        Value::UInt(u64::MAX),
        Value::Bytes(b"-123456789012345678901234.123456".to_vec()),
        Value::Double(std::f64::consts::PI),
        Value::Float(1.5),
        Value::Bytes(text.as_bytes().to_vec()),
        Value::Bytes(blob.clone()),
        Value::Date(2024, 2, 29, 0, 0, 0, 0),
        Value::Date(1999, 12, 31, 23, 59, 58, 123456),
        Value::Time(true, 1, 2, 3, 4, 5),
        Value::NULL,
    ];
    c.exec_drop(
        "INSERT INTO types VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        params.clone(),
    )
    .unwrap();
    assert_eq!(c.affected_rows(), 1);

    let row: Row = c
        .exec_first("SELECT * FROM types WHERE id = ?", (1,))
        .unwrap()
        .expect("row");
    let got: Vec<Value> = row.unwrap();
    assert_eq!(got[0], Value::Int(1));
    assert_eq!(got[1], Value::Int(-128));
    assert_eq!(got[2], Value::Int(-32768));
    assert_eq!(got[3], Value::Int(i64::from(i32::MIN)));
    assert_eq!(got[4], Value::Int(i64::MIN));
    assert_eq!(got[5], Value::UInt(u64::MAX));
    assert_eq!(
        got[6],
        Value::Bytes(b"-123456789012345678901234.123456".to_vec())
    );
    assert_eq!(got[7], Value::Double(std::f64::consts::PI));
    assert_eq!(got[8], Value::Float(1.5));
    assert_eq!(got[9], Value::Bytes(text.as_bytes().to_vec()));
    assert_eq!(got[10], Value::Bytes(blob.clone()));
    assert_eq!(got[11], Value::Date(2024, 2, 29, 0, 0, 0, 0));
    assert_eq!(got[12], Value::Date(1999, 12, 31, 23, 59, 58, 123456));
    assert_eq!(got[13], Value::Time(true, 1, 2, 3, 4, 5));
    assert_eq!(got[14], Value::NULL);

    // The same values through the text protocol.
    let (vc, len, hex, d, n): (String, u64, String, String, Option<i32>) = c
        .query_first("SELECT vc, LENGTH(bl), MD5(bl), CONCAT(d, ' ', dt, ' ', tm), n FROM types")
        .unwrap()
        .unwrap();
    assert_eq!(vc, text);
    assert_eq!(len, 1024);
    let expected_md5: String = c.exec_first("SELECT MD5(?)", (blob,)).unwrap().unwrap();
    assert_eq!(hex, expected_md5);
    assert_eq!(d, "2024-02-29 1999-12-31 23:59:58.123456 -26:03:04.000005");
    assert_eq!(n, None);

    // NULL and non-NULL parameters in one execute, several rows, re-executed statement.
    let stmt = c.prep("SELECT ?, ? IS NULL, CHAR_LENGTH(?)").unwrap();
    for v in ["", "x", text] {
        let r: (Option<String>, i32, i64) = c
            .exec_first(&stmt, (Value::NULL, Value::NULL, v))
            .unwrap()
            .unwrap();
        assert_eq!(r, (None, 1, v.chars().count() as i64));
    }
}

#[test]
fn closing_one_statement_leaves_the_others_and_its_id_is_unknown() {
    let h = Harness::start();
    let mut c = connect(&h);
    let a = c.prep("SELECT ? + 1").unwrap();
    let b = c.prep("SELECT ? + 2").unwrap();
    let d = c.prep("SELECT ? + 3").unwrap();
    assert_ne!(a.id(), b.id());
    assert_ne!(b.id(), d.id());
    c.close(b.clone()).unwrap();
    assert_eq!(c.exec_first::<i64, _, _>(&a, (10,)).unwrap(), Some(11));
    assert_eq!(c.exec_first::<i64, _, _>(&d, (10,)).unwrap(), Some(13));
    let e = c.exec_first::<i64, _, _>(&b, (10,)).unwrap_err();
    assert_eq!(mysql_code(&e), Some(1243), "{e}");
    // The session survives the error and the others still work.
    assert_eq!(c.exec_first::<i64, _, _>(&a, (1,)).unwrap(), Some(2));
    assert_eq!(c.exec_first::<i64, _, _>(&d, (1,)).unwrap(), Some(4));
    c.ping().unwrap();
}

#[test]
fn change_user_and_reset_connection_reset_the_session() {
    let h = Harness::start();
    let mut c = connect(&h);
    let setup =
        "SET @x = 5; SET SESSION sql_mode = 'ANSI_QUOTES'; CREATE TEMPORARY TABLE tt (x INT)";
    let probe = "SELECT @x IS NULL, @@session.sql_mode = @@global.sql_mode, 0";
    let has_tt = |c: &mut Conn| match c.query_drop("SELECT * FROM tt") {
        Ok(()) => true,
        Err(e) if mysql_code(&e) == Some(1146) => false,
        Err(e) => panic!("{e}"),
    };

    c.query_drop(setup).unwrap();
    assert_eq!(
        c.query_first::<(i32, i32, i64), _>(probe).unwrap(),
        Some((0, 0, 0))
    );
    assert!(has_tt(&mut c));
    c.change_user(ChangeUserOpts::DEFAULT).unwrap();
    assert_eq!(
        c.query_first::<(i32, i32, i64), _>(probe).unwrap(),
        Some((1, 1, 0)),
        "after COM_CHANGE_USER"
    );
    assert!(!has_tt(&mut c), "temporary table survived COM_CHANGE_USER");
    assert_eq!(
        c.query_first::<String, _>("SELECT DATABASE()")
            .unwrap()
            .as_deref(),
        Some("sbtest")
    );

    c.query_drop(setup).unwrap();
    c.reset().unwrap(); // COM_RESET_CONNECTION on MariaDB ≥ 10.2.7
    assert_eq!(
        c.query_first::<(i32, i32, i64), _>(probe).unwrap(),
        Some((1, 1, 0)),
        "after COM_RESET_CONNECTION"
    );
    assert!(
        !has_tt(&mut c),
        "temporary table survived COM_RESET_CONNECTION"
    );

    // Another account, another default database.
    c.change_user(
        ChangeUserOpts::default()
            .with_user(Some(h.lab.status.monitor_user.clone()))
            .with_pass(Some(h.lab.status.monitor_password.clone()))
            .with_db_name(Some("mysql".into())),
    )
    .unwrap();
    let (user, db): (String, String) = c
        .query_first("SELECT CURRENT_USER(), DATABASE()")
        .unwrap()
        .unwrap();
    assert!(user.starts_with("holdfast_monitor@"), "{user}");
    assert_eq!(db, "mysql");
    let prepared = c.prep("SELECT ?").unwrap();
    assert_eq!(c.exec_first::<i64, _, _>(&prepared, (7,)).unwrap(), Some(7));
    c.ping().unwrap();
    let metrics = h.metrics();
    assert!(
        metrics.contains("holdfast_commands_total{command=\"COM_CHANGE_USER\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("holdfast_commands_total{command=\"COM_RESET_CONNECTION\"} 1"),
        "{metrics}"
    );
}

#[test]
fn status_shows_the_user_after_change_user() {
    let h = Harness::start();
    // Another account that may use the session's database (the change keeps it).
    h.root_sql(
        "CREATE USER other@'%' IDENTIFIED BY 'other_pass'; \
         GRANT SELECT ON sbtest.* TO other@'%'",
    );
    let mut c = connect(&h);
    c.change_user(
        ChangeUserOpts::default()
            .with_user(Some("other".into()))
            .with_pass(Some("other_pass".into())),
    )
    .unwrap();
    c.ping().unwrap();
    let st = h.status();
    assert_eq!(st.sessions.len(), 1);
    assert_eq!(st.sessions[0].user, "other");
}

#[test]
fn ping() {
    let h = Harness::start();
    let mut c = connect(&h);
    for _ in 0..3 {
        c.ping().unwrap();
    }
    let metrics = h.metrics();
    assert!(
        metrics.contains("holdfast_commands_total{command=\"COM_PING\"} 3"),
        "{metrics}"
    );
}

#[test]
fn twenty_mib_blob_both_directions() {
    let h = Harness::start_with(Options::default().server_args(&["--max-allowed-packet=256M"]));
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB)")
        .unwrap();
    let blob: Vec<u8> = (0..20 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    // Binary protocol: one COM_STMT_EXECUTE of 20 MiB (two packets on the wire).
    c.exec_drop("INSERT INTO big VALUES (1, ?)", (blob.clone(),))
        .unwrap();
    let back: Vec<u8> = c
        .exec_first("SELECT b FROM big WHERE id = ?", (1,))
        .unwrap()
        .unwrap();
    assert!(
        back == blob,
        "binary round trip differs (len {} vs {})",
        back.len(),
        blob.len()
    );
    // Text protocol: a 20 MiB row in the result.
    let back: Vec<u8> = c
        .query_first("SELECT b FROM big WHERE id = 1")
        .unwrap()
        .unwrap();
    assert!(
        back == blob,
        "text result differs (len {} vs {})",
        back.len(),
        blob.len()
    );
    // A 20 MiB COM_QUERY (hex literal, ~40 MiB of SQL).
    let mut sql = String::from("INSERT INTO big VALUES (2, x'");
    for b in &blob {
        sql.push_str(&format!("{b:02x}"));
    }
    sql.push_str("')");
    c.query_drop(&sql).unwrap();
    let same: i32 = c
        .query_first("SELECT (SELECT b FROM big WHERE id = 1) = (SELECT b FROM big WHERE id = 2)")
        .unwrap()
        .unwrap();
    assert_eq!(same, 1);
    c.ping().unwrap();
}

#[test]
fn two_hundred_thousand_rows_stream_through() {
    let h = Harness::start();
    let mut c = connect(&h);
    let mut count = 0u64;
    let mut sum = 0u64;
    let result = c
        .query_iter("SELECT seq, REPEAT('r', 50) FROM seq_1_to_200000")
        .unwrap();
    for row in result {
        let (n, pad): (u64, String) = mysql::from_row(row.unwrap());
        assert_eq!(pad.len(), 50);
        count += 1;
        sum += n;
    }
    assert_eq!(count, 200_000);
    assert_eq!(sum, 200_000 * 200_001 / 2);
    // Binary protocol too.
    let stmt = c
        .prep("SELECT seq FROM seq_1_to_200000 WHERE seq > ?")
        .unwrap();
    let n = c.exec_iter(&stmt, (0,)).unwrap().count();
    assert_eq!(n, 200_000);
    c.ping().unwrap();
}

#[test]
fn server_side_cursor_with_fetch() {
    let h = Harness::start();
    // Both with and without CLIENT_DEPRECATE_EOF.
    for caps in [
        BASE_CAPS,
        BASE_CAPS | holdfast_wire::caps::CLIENT_DEPRECATE_EOF,
    ] {
        let mut c =
            RawConn::connect(h.proxy, h.user(), h.password(), Some(h.database()), caps).unwrap();
        let stmt = c.prepare("SELECT seq FROM seq_1_to_1000").unwrap();
        assert_eq!(stmt.columns, 1);
        let res = c
            .execute_no_params(stmt.id, holdfast_wire::command::CURSOR_TYPE_READ_ONLY)
            .unwrap();
        let holdfast_it::raw::Response::Rows { rows, status, .. } = &res[0] else {
            panic!("expected a result set header, got {res:?}");
        };
        assert!(
            rows.is_empty(),
            "a cursor sends no rows before COM_STMT_FETCH"
        );
        assert!(
            status & holdfast_wire::caps::SERVER_STATUS_CURSOR_EXISTS != 0,
            "status {status:#x}"
        );
        let mut seen = 0u64;
        loop {
            let (rows, status) = c.fetch(stmt.id, 300).unwrap();
            for r in &rows {
                // Binary row: 0x00, NULL bitmap (1 byte for one column), then a BIGINT UNSIGNED.
                let v = u64::from_le_bytes(r[2..10].try_into().unwrap());
                seen += 1;
                assert_eq!(v, seen);
            }
            if status & holdfast_wire::caps::SERVER_STATUS_LAST_ROW_SENT != 0 {
                break;
            }
            assert_eq!(rows.len(), 300);
        }
        assert_eq!(seen, 1000);
        // The statement can be executed again normally.
        let res = c.execute_no_params(stmt.id, 0).unwrap();
        let holdfast_it::raw::Response::Rows { rows, .. } = &res[0] else {
            panic!("{res:?}")
        };
        assert_eq!(rows.len(), 1000);
        // Fetching from an unknown statement is refused with 1243.
        let e = c.fetch(stmt.id + 100, 1).unwrap_err();
        assert_eq!(server_err(&e).map(|s| s.code), Some(1243), "{e:#}");
        c.ping().unwrap();
    }
}
