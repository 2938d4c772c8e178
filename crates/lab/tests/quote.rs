//! `holdfast_sql::quote` against a real server: values written by the quoter read back
//! byte for byte under every combination of `NO_BACKSLASH_ESCAPES` and `ANSI_QUOTES`.

use holdfast_lab::{node_sql, TestLab, DATABASE};
use holdfast_sql::quote;

fn hex(b: &[u8]) -> String {
    quote::hex(b)
}

#[test]
fn quoted_values_round_trip_under_every_sql_mode() {
    let lab = TestLab::start(0).expect("lab starts");
    let node = lab.primary();
    // Backslash before a quote and at the end, both quotes, NUL, non-ASCII, a newline.
    let value = "a\\'b\"c\0d é 😀\n\\";
    // Plain literals cannot hold a backslash or control bytes; everything else goes.
    let plain = "p'q\"r é ''";
    let db = quote::identifier(DATABASE);
    for (i, mode) in [
        "",
        "NO_BACKSLASH_ESCAPES",
        "ANSI_QUOTES",
        "ANSI_QUOTES,NO_BACKSLASH_ESCAPES",
    ]
    .iter()
    .enumerate()
    {
        let table = quote::identifier(&format!("q`\"\\ {i}"));
        let column = quote::identifier("v\"`");
        let sql = format!(
            "SET SESSION sql_mode={mode}; SET NAMES utf8mb4; \
             CREATE TABLE {db}.{table} ({column} TEXT CHARACTER SET utf8mb4, b BLOB); \
             INSERT INTO {db}.{table} VALUES ({s}, {b}); \
             SELECT HEX({column}), HEX(b), HEX({p}), @@sql_mode FROM {db}.{table}",
            mode = quote::string_literal(mode),
            s = quote::string_literal(value),
            b = quote::bytes_literal(value.as_bytes()),
            p = quote::plain_string_literal(plain).expect("plain literal"),
        );
        let rows = node_sql(node, &sql).unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        let want = hex(value.as_bytes());
        assert_eq!(
            rows,
            [vec![
                want.clone(),
                want,
                hex(plain.as_bytes()),
                mode.to_string()
            ]],
            "sql_mode {mode:?}"
        );
    }
}
