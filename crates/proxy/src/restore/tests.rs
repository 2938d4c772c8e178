//! Unit tests of the restore module (statement building and value decoding).

use super::capture::unhex_utf8;
use super::values::decode_user_value;
use super::*;
use crate::state::SessionRecord;
use holdfast_wire::binary_row::{ColumnType, TYPE_DOUBLE, TYPE_LONGLONG, TYPE_TINY, UNSIGNED_FLAG};

fn types() -> VariableTypes {
    VariableTypes::from_rows([
        ("sql_mode", "SET", "NO", "SESSION"),
        ("time_zone", "VARCHAR", "NO", "SESSION"),
        ("autocommit", "BOOLEAN", "NO", "SESSION"),
        ("max_statement_time", "DOUBLE", "NO", "SESSION"),
        ("max_join_size", "BIGINT UNSIGNED", "NO", "SESSION"),
        ("div_precision_increment", "INT UNSIGNED", "NO", "SESSION"),
        ("character_set_client", "ENUM", "NO", "SESSION"),
        ("collation_connection", "ENUM", "NO", "SESSION"),
        ("character_set_connection", "ENUM", "NO", "SESSION"),
        ("character_set_results", "ENUM", "NO", "SESSION"),
        ("tx_isolation", "ENUM", "NO", "SESSION"),
        ("warning_count", "BIGINT UNSIGNED", "YES", "SESSION ONLY"),
        ("external_user", "VARCHAR", "YES", "SESSION ONLY"),
        ("read_only", "BOOLEAN", "NO", "GLOBAL"),
        (
            "in_predicate_conversion_threshold",
            "INT UNSIGNED",
            "NO",
            "SESSION",
        ),
        ("LOCK_WAIT_TIMEOUT", "BIGINT UNSIGNED", "NO", "SESSION"),
    ])
}

#[test]
fn literals_by_type() {
    let t = types();
    let lit = |n: &str, v: &str| system_variable_literal(n, v, t.get(n).map(|i| i.kind));
    assert_eq!(
        lit("max_join_size", "18446744073709551615"),
        "18446744073709551615"
    );
    assert_eq!(lit("lock_wait_timeout", "5"), "5");
    assert_eq!(lit("max_statement_time", "2.500000"), "2.500000");
    assert_eq!(lit("autocommit", "OFF"), "OFF");
    assert_eq!(lit("autocommit", "on"), "ON");
    assert_eq!(
        lit("sql_mode", "STRICT_TRANS_TABLES,ANSI_QUOTES"),
        "'STRICT_TRANS_TABLES,ANSI_QUOTES'"
    );
    assert_eq!(lit("sql_mode", ""), "''");
    assert_eq!(lit("time_zone", "+05:30"), "'+05:30'");
    assert_eq!(lit("tx_isolation", "SERIALIZABLE"), "'SERIALIZABLE'");
    assert_eq!(lit("character_set_results", ""), "NULL");
    assert_eq!(lit("character_set_results", "NULL"), "NULL");
    assert_eq!(lit("character_set_client", "latin1"), "'latin1'");
    // A number where a number is expected but the value is not one: quoted, and the
    // server refuses it by name.
    assert_eq!(lit("max_join_size", "lots"), "'lots'");
    // Unknown variables: numbers stay numbers.
    assert_eq!(lit("no_such_var", "12"), "12");
    assert_eq!(lit("no_such_var", "x"), "'x'");
}

#[test]
fn skip_list() {
    let t = types();
    for name in [
        "session_track_system_variables",
        "session_track_schema",
        "session_track_state_change",
        "session_track_transaction_info",
        "last_insert_id",
        "insert_id",
        "identity",
        "rand_seed1",
        "gtid_seq_no",
        "pseudo_thread_id",
        "warning_count",
        "external_user",
        "read_only",
    ] {
        assert!(skip_reason(name, &t).is_some(), "{name} must be skipped");
    }
    for name in [
        "sql_mode",
        "timestamp",
        "autocommit",
        "time_zone",
        "gtid_domain_id",
    ] {
        assert_eq!(skip_reason(name, &t), None, "{name} must be replayed");
    }
}

#[test]
fn user_variable_literals() {
    let v = |value| UserVariable {
        name: "v".into(),
        value,
    };
    let lit = |value| v(value).literal().unwrap();
    assert_eq!(
        lit(UserValue::Signed(Some(i64::MIN))),
        "-9223372036854775808"
    );
    assert_eq!(lit(UserValue::Signed(None)), "CAST(NULL AS SIGNED)");
    assert_eq!(
        lit(UserValue::Unsigned(Some(u64::MAX))),
        "CAST(18446744073709551615 AS UNSIGNED)"
    );
    assert_eq!(lit(UserValue::Decimal(Some("1.10".into()))), "1.10");
    assert_eq!(
        lit(UserValue::Decimal(Some("-7".into()))),
        "CAST(-7 AS DECIMAL(65,0))"
    );
    assert_eq!(lit(UserValue::Double(Some(0.1))), "1e-1");
    assert_eq!(lit(UserValue::Double(Some(-2.5e300))), "-2.5e300");
    assert_eq!(lit(UserValue::Double(Some(0.0))), "0e0");
    assert_eq!(
        lit(UserValue::Text {
            bytes: Some(vec![0xe9]),
            charset: "latin1".into(),
            collation: "latin1_swedish_ci".into()
        }),
        "_latin1 X'E9' COLLATE latin1_swedish_ci"
    );
    assert_eq!(
        lit(UserValue::Text {
            bytes: Some(vec![0, 0xff]),
            charset: "binary".into(),
            collation: "binary".into()
        }),
        "_binary X'00FF'"
    );
    assert_eq!(
        lit(UserValue::Text {
            bytes: None,
            charset: "latin1".into(),
            collation: "latin1_german1_ci".into()
        }),
        "CAST(NULL AS CHAR CHARACTER SET latin1) COLLATE latin1_german1_ci"
    );
    assert!(v(UserValue::Decimal(Some("1e5".into()))).literal().is_err());
    assert!(v(UserValue::Text {
        bytes: Some(vec![]),
        charset: "x; DROP".into(),
        collation: "y".into()
    })
    .literal()
    .is_err());
    assert_eq!(v(UserValue::Signed(Some(1))).reference(), "@`v`");
}

#[test]
fn double_literals_round_trip() {
    for f in [
        0.1,
        1.0 / 3.0,
        f64::MAX,
        f64::MIN_POSITIVE,
        -0.5,
        123456789.125,
    ] {
        let s = format!("{f:e}");
        assert_eq!(s.parse::<f64>().unwrap().to_bits(), f.to_bits(), "{s}");
    }
}

#[test]
fn plan_orders_and_skips() {
    let t = types();
    let mut r = SessionRecord::default();
    for (k, v) in [
        ("collation_connection", "latin1_swedish_ci"),
        ("character_set_connection", "latin1"),
        ("character_set_client", "latin1"),
        ("autocommit", "OFF"),
        ("session_track_schema", "ON"),
        ("warning_count", "0"),
        ("sql_mode", "ANSI_QUOTES"),
    ] {
        r.variables.insert(k.into(), v.into());
    }
    r.schema = Some("my`db".into());
    r.last_insert_id = 42;
    r.next_transaction =
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET TRANSACTION READ ONLY;".into();
    let vars = [UserVariable {
        name: "a".into(),
        value: UserValue::Signed(Some(1)),
    }];
    let p = plan(&r, &vars, &t).unwrap();
    let items: Vec<&str> = p.assignments.iter().map(|a| a.item.as_str()).collect();
    assert_eq!(
        items,
        [
            "@a",
            "@@autocommit",
            "@@sql_mode",
            "@@character_set_client",
            "@@character_set_connection",
            "@@collation_connection",
            "last_insert_id"
        ]
    );
    assert_eq!(p.assignments[2].sql, "@@session.`sql_mode` = 'ANSI_QUOTES'");
    assert_eq!(p.schema.as_deref(), Some("my`db"));
    assert!(!p.needs_utf8);
    assert_eq!(
        p.transaction,
        [
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET TRANSACTION READ ONLY"
        ]
    );
    let skipped: Vec<&str> = p.skipped.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(skipped, ["session_track_schema", "warning_count"]);

    r.next_transaction = "START TRANSACTION".into();
    let e = plan(&r, &[], &t).unwrap_err();
    assert_eq!(e.item(), Some("next transaction characteristics"));
}

#[test]
fn user_value_decoding() {
    let col = |ty, flags| ColumnType { ty, flags };
    let (unsigned, double) = (col(TYPE_LONGLONG, UNSIGNED_FLAG), col(TYPE_DOUBLE, 0));
    let decode = |c: &ColumnType, raw: Option<&[u8]>| decode_user_value(c, raw, None, None, None);
    assert_eq!(
        decode(&unsigned, Some(&u64::MAX.to_le_bytes())),
        Ok(UserValue::Unsigned(Some(u64::MAX)))
    );
    assert_eq!(
        decode(&double, Some(&0.1f64.to_le_bytes())),
        Ok(UserValue::Double(Some(0.1)))
    );
    assert_eq!(
        decode(&col(TYPE_LONGLONG, 0), None),
        Ok(UserValue::Signed(None))
    );
    // Narrow signed integers are sign-extended.
    assert_eq!(
        decode(&col(TYPE_TINY, 0), Some(&[0xff])),
        Ok(UserValue::Signed(Some(-1)))
    );
    assert_eq!(
        decode(&col(TYPE_TINY, 0), Some(&[1, 2, 3])),
        Err(ValueError::IntegerWidth(3))
    );
    assert_eq!(
        decode(&double, Some(&[0; 4])),
        Err(ValueError::FloatWidth("double"))
    );
    assert_eq!(unhex_utf8("F09F9880").as_deref(), Some("😀"));
    assert_eq!(unhex_utf8("F"), None);
}
