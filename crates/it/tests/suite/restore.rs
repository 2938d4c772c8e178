//! Session state capture and restore (`holdfast_proxy::restore`) against real MariaDB: a
//! session's state is built on one backend connection, captured, restored on a brand-new
//! connection, and both are compared by asking the server.

use holdfast_it::Harness;
use holdfast_proxy::backend::{self, BackendConn, LoginParams};
use holdfast_proxy::restore::{
    self, capture_session, restore_session, RestoreError, UserValue, VariableTypes,
};
use holdfast_proxy::state::SessionRecord;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::*;
use std::time::Duration;

/// utf8mb4_general_ci, what most clients send in the handshake.
const UTF8MB4: u8 = 45;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn connect(h: &Harness) -> BackendConn {
    let secret = PasswordHash::from_password(h.password().as_bytes());
    let params = LoginParams {
        user: h.user().as_bytes(),
        secret: Some(&secret),
        database: Some(h.database().as_bytes()),
        charset: UTF8MB4,
        client_capabilities: CLIENT_PROTOCOL_41
            | CLIENT_CONNECT_WITH_DB
            | CLIENT_DEPRECATE_EOF
            | CLIENT_MULTI_RESULTS
            | CLIENT_PS_MULTI_RESULTS,
        // As a MariaDB Connector would: column definitions carry extended type info,
        // which the captures' binary results must skip.
        mariadb_caps: holdfast_wire::caps::PROXY_MARIADB_CAPABILITIES,
        attributes: &[],
        exact_capabilities: false,
        proxy_header: None,
        tls: None,
    };
    let direct = h.direct().to_string();
    let timeout = Duration::from_secs(10);
    let mut c = backend::connect(&backend::TcpConnector::default(), &direct, &params, timeout)
        .await
        .expect("backend login");
    assert!(c.enable_trackers().await.expect("trackers"));
    c
}

/// Runs a client statement and keeps `record` up to date as the session loop does.
async fn tracked(c: &mut BackendConn, record: &mut SessionRecord, sql: &str) {
    let r = restore::execute(c, sql.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    for ok in r.oks {
        record.status = ok.status;
        if ok.last_insert_id != 0 {
            record.last_insert_id = ok.last_insert_id;
        }
        record.apply_session_state(&ok.session_state);
    }
}

/// The single row of `sql`, as raw bytes.
async fn row(c: &mut BackendConn, sql: &str) -> Vec<Option<Vec<u8>>> {
    let r = restore::execute(c, sql.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(r.rows.len(), 1, "{sql}");
    r.rows.into_iter().next().unwrap_or_default()
}

fn text(v: &Option<Vec<u8>>) -> Option<String> {
    v.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
}

/// Every user variable kind the restore must keep exactly.
const USER_VARS: &[(&str, &str)] = &[
    ("u_max", "18446744073709551615"),
    ("i_min", "-9223372036854775808"),
    ("i_small", "-5"),
    ("dec", "1.10"),
    ("dec_int", "CAST(7 AS DECIMAL(10,0))"),
    ("dbl", "0.1e0"),
    ("dbl_third", "1e0/3"),
    ("empty", "''"),
    ("nul", "NULL"),
    ("blob", "(SELECT CONCAT(''))"), // replaced below by all 256 bytes
    ("emoji", "_utf8mb4 X'78F09F9880' COLLATE utf8mb4_unicode_ci"),
    ("lat", "_latin1 X'E9'"),
    ("lat_german", "_latin1 X'E9' COLLATE latin1_german1_ci"),
    ("quote", "'it''s \\\\ here'"),
];

fn all_bytes_hex() -> String {
    (0..=255u8).map(|b| format!("{b:02X}")).collect()
}

#[test]
fn restore_recreates_every_kind_of_session_state() {
    let h = Harness::start();
    h.root_sql(
        "CREATE TABLE IF NOT EXISTS sbtest.restore_ai (id BIGINT AUTO_INCREMENT PRIMARY KEY, x INT) ENGINE=InnoDB",
    );
    let rt = runtime();
    rt.block_on(async {
        let mut old = connect(&h).await;
        let types = VariableTypes::load(&mut old).await.expect("variable types");
        assert!(types.len() > 300, "{} system variables", types.len());
        let mut record = SessionRecord::default();
        // As a session does before its first SET TRANSACTION.
        restore::execute(&mut old, restore::TRACK_TRANSACTIONS.as_bytes())
            .await
            .expect("transaction tracker");

        // LAST_INSERT_ID via an insert (before autocommit=0, so no transaction stays open).
        tracked(&mut old, &mut record, "INSERT INTO sbtest.restore_ai (x) VALUES (1),(2),(3)").await;
        tracked(&mut old, &mut record, "INSERT INTO sbtest.restore_ai (id, x) VALUES (1000, 1)").await;
        tracked(&mut old, &mut record, "INSERT INTO sbtest.restore_ai (x) VALUES (4),(5)").await;
        let lid = text(&row(&mut old, "SELECT LAST_INSERT_ID()").await[0]);
        assert_eq!(lid.as_deref(), Some("1001"));
        assert_eq!(record.last_insert_id, 1001);

        // User variables of every type.
        let mut assigns: Vec<String> = USER_VARS
            .iter()
            .map(|(n, v)| {
                if *n == "blob" {
                    format!("@{n} = X'{}'", all_bytes_hex())
                } else {
                    format!("@{n} = {v}")
                }
            })
            .collect();
        assigns.push("@typed_null = 1".into());
        tracked(&mut old, &mut record, &format!("SET {}", assigns.join(", "))).await;
        tracked(&mut old, &mut record, "SET @typed_null = NULL").await;

        // System variables and schema.
        for sql in [
            "SET sql_mode = 'ANSI_QUOTES,STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES'",
            "SET time_zone = '+05:30'",
            "SET NAMES latin1 COLLATE latin1_german1_ci",
            "SET autocommit = 0",
            "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET max_statement_time = 2.5",
            "SET div_precision_increment = 7",
            "SET lock_wait_timeout = 12345",
            "SET optimizer_switch = 'index_merge=off'",
            "USE mysql",
            "SET TRANSACTION READ ONLY",
        ] {
            tracked(&mut old, &mut record, sql).await;
        }
        eprintln!("record: {record:#?}");
        assert!(!record.in_transaction(), "no transaction may be open");
        assert_eq!(record.schema.as_deref(), Some("mysql"));
        assert!(
            record.next_transaction.contains("READ ONLY"),
            "next transaction: {:?}",
            record.next_transaction
        );

        let captured = capture_session(&mut old).await.expect("capture");
        eprintln!("captured: {captured:#?}");
        assert_eq!(captured.last_insert_id, 1001);
        assert_eq!(captured.user_variables.len(), USER_VARS.len() + 1);
        let get = |name: &str| {
            captured
                .user_variables
                .iter()
                .find(|v| v.name == name)
                .map(|v| v.value.clone())
                .unwrap_or_else(|| panic!("@{name} not captured"))
        };
        assert_eq!(get("u_max"), UserValue::Unsigned(Some(u64::MAX)));
        assert_eq!(get("i_min"), UserValue::Signed(Some(i64::MIN)));
        assert_eq!(get("dec"), UserValue::Decimal(Some("1.10".into())));
        assert_eq!(get("dbl"), UserValue::Double(Some(0.1)));
        assert_eq!(get("dbl_third"), UserValue::Double(Some(1.0 / 3.0)));
        assert_eq!(get("typed_null"), UserValue::Signed(None));
        assert_eq!(
            get("emoji"),
            UserValue::Text {
                bytes: Some(b"x\xF0\x9F\x98\x80".to_vec()),
                charset: "utf8mb4".into(),
                collation: "utf8mb4_unicode_ci".into(),
            },
            "captured under SET NAMES latin1, the bytes must not be converted"
        );
        match get("blob") {
            UserValue::Text { bytes, charset, .. } => {
                assert_eq!(bytes, Some((0..=255u8).collect::<Vec<u8>>()));
                assert_eq!(charset, "binary");
            }
            other => panic!("blob captured as {other:?}"),
        }

        assert_eq!(captured.collation_connection, "latin1_german1_ci");
        captured.apply_to(&mut record);
        let mut new = connect(&h).await;
        restore_session(&mut new, &record, &captured.user_variables, &types)
            .await
            .expect("restore");

        // The next transaction is read-only on both (checked first: a transaction consumes it).
        for c in [&mut old, &mut new] {
            let e = restore::execute(c, b"INSERT INTO sbtest.restore_ai (x) VALUES (9)")
                .await
                .expect_err("the next transaction is read only");
            assert!(e.to_string().contains("1792"), "{e}");
            restore::execute(c, b"ROLLBACK").await.expect("rollback");
        }

        let sys = "SELECT @@session.sql_mode, @@session.time_zone, @@session.character_set_client, \
                   @@session.character_set_connection, @@session.collation_connection, \
                   @@session.character_set_results, @@session.autocommit, @@session.tx_isolation, \
                   @@session.max_statement_time, @@session.div_precision_increment, \
                   @@session.lock_wait_timeout, @@session.optimizer_switch, @@session.tx_read_only, \
                   DATABASE(), LAST_INSERT_ID(), @@session.character_set_database, NOW() - UTC_TIMESTAMP()";
        let a = row(&mut old, sys).await;
        let b = row(&mut new, sys).await;
        let names = sys.trim_start_matches("SELECT ").split(", ").map(str::trim);
        for ((name, x), y) in names.zip(&a).zip(&b) {
            assert_eq!(text(x), text(y), "{name} differs after restore");
        }
        let t: Vec<Option<String>> = b.iter().map(text).collect();
        assert_eq!(t[0].as_deref(), Some("ANSI_QUOTES,NO_BACKSLASH_ESCAPES,STRICT_ALL_TABLES"));
        assert_eq!(t[1].as_deref(), Some("+05:30"));
        assert_eq!(t[2].as_deref(), Some("latin1"));
        assert_eq!(t[6].as_deref(), Some("0"));
        assert_eq!(t[7].as_deref(), Some("SERIALIZABLE"));
        assert_eq!(t[8].as_deref(), Some("2.500000"));
        assert_eq!(t[13].as_deref(), Some("mysql"));
        assert_eq!(t[14].as_deref(), Some("1001"));

        // User variables: value bytes, character set and collation.
        for name in USER_VARS.iter().map(|(n, _)| *n).chain(["typed_null"]) {
            let q = format!("SELECT HEX(@{name}), CHARSET(@{name}), COLLATION(@{name}), @{name} IS NULL");
            assert_eq!(row(&mut old, &q).await, row(&mut new, &q).await, "@{name} differs");
        }
        // … and their types, as a table created from them shows.
        let cols: Vec<String> = USER_VARS
            .iter()
            .map(|(n, _)| *n)
            .chain(["typed_null"])
            .map(|n| format!("@{n} AS c_{n}"))
            .collect();
        let mut shapes = Vec::new();
        for (c, table) in [(&mut old, "restore_types_old"), (&mut new, "restore_types_new")] {
            let q = format!("CREATE TABLE sbtest.{table} AS SELECT {}", cols.join(", "));
            restore::execute(c, q.as_bytes()).await.expect("create table as select");
            let r = row(c, &format!("SHOW CREATE TABLE sbtest.{table}")).await;
            shapes.push(text(&r[1]).unwrap_or_default().replace(table, "T"));
        }
        eprintln!("{}", shapes[0]);
        assert_eq!(shapes[0], shapes[1]);
        assert!(shapes[1].contains("bigint(20) unsigned"), "{}", shapes[1]);
        assert!(shapes[1].contains("latin1_german1_ci"), "{}", shapes[1]);
        assert_eq!(t[4].as_deref(), Some("latin1_german1_ci"));

        // A second capture from the restored connection sees the same variables.
        let again = capture_session(&mut new).await.expect("capture again");
        let mut x = captured.user_variables.clone();
        let mut y = again.user_variables;
        x.sort_by(|p, q| p.name.cmp(&q.name));
        y.sort_by(|p, q| p.name.cmp(&q.name));
        assert_eq!(x, y);
        assert_eq!(again.last_insert_id, 1001);
    });
}

#[test]
fn restore_handles_non_ascii_user_variable_names() {
    let h = Harness::start();
    let rt = runtime();
    rt.block_on(async {
        let mut old = connect(&h).await;
        let types = VariableTypes::load(&mut old).await.expect("variable types");
        let mut record = SessionRecord::default();
        tracked(&mut old, &mut record, "SET @`café` = 'crème', @plain = 1").await;
        tracked(&mut old, &mut record, "SET character_set_results = NULL").await;
        let captured = capture_session(&mut old).await.expect("capture");
        captured.apply_to(&mut record);
        let mut new = connect(&h).await;
        restore_session(&mut new, &record, &captured.user_variables, &types)
            .await
            .expect("restore");
        let q = "SELECT HEX(@`café`), COLLATION(@`café`), @plain, @@character_set_client, \
                 @@collation_connection, @@character_set_results IS NULL";
        let a = row(&mut old, q).await;
        assert_eq!(a, row(&mut new, q).await);
        assert_eq!(text(&a[0]).as_deref(), Some("6372C3A86D65"));
        assert_eq!(text(&a[5]).as_deref(), Some("1"));
    });
}

#[test]
fn restore_error_names_the_rejected_variable() {
    let h = Harness::start();
    let rt = runtime();
    rt.block_on(async {
        let mut c = connect(&h).await;
        let types = VariableTypes::load(&mut c).await.expect("variable types");
        for (bad, value, item) in [
            ("sql_mode", "NOT_A_MODE", "@@sql_mode"),
            ("time_zone", "Mars/Olympus_Mons", "@@time_zone"),
            ("no_such_variable", "1", "@@no_such_variable"),
            ("lock_wait_timeout", "lots", "@@lock_wait_timeout"),
        ] {
            let mut record = SessionRecord::default();
            record.variables.insert("autocommit".into(), "OFF".into());
            record.variables.insert(bad.into(), value.into());
            record.variables.insert("time_zone".into(), "+01:00".into());
            if bad == "time_zone" {
                record.variables.insert(bad.into(), value.into());
            }
            let mut fresh = connect(&h).await;
            let err = restore_session(&mut fresh, &record, &[], &types)
                .await
                .expect_err("the bad value must be refused");
            eprintln!("{err}");
            match &err {
                RestoreError::Rejected {
                    item: got, message, ..
                } => {
                    assert_eq!(got, item, "{err}");
                    assert!(!message.is_empty());
                }
                other => panic!("expected a rejection, got {other}"),
            }
            assert!(err.to_string().contains(item), "{err}");
        }

        let record = SessionRecord {
            schema: Some("no_such_db_here".into()),
            ..SessionRecord::default()
        };
        let err = restore_session(&mut c, &record, &[], &types)
            .await
            .expect_err("unknown database");
        assert_eq!(err.item(), Some("database `no_such_db_here`"), "{err}");
    });
}
