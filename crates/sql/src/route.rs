//! Read/write splitting: whether a statement may run on a replica.

use crate::classify::Classification as C;
use crate::keyword::upper;
use crate::lexer::{Lexer, SqlMode, TokenKind};

/// Where a statement of a split session may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRoute {
    /// Any node: the statement reads data only, and its answer does not depend on the
    /// connection it runs on (beyond the session state holdfast carries to every node).
    Replica,
    /// Any node that has the session's user variables: a read that uses them (their values
    /// must be carried there first).
    ReplicaWithUserVariables,
    /// The node the session's previous statement ran on: it reads what that statement left
    /// (`SHOW WARNINGS`, `@@warning_count`...).
    LastNode,
    /// The primary: it writes, locks, reads the connection's history or user variables, or
    /// was not recognised.
    Primary,
}

/// The hint that keeps a statement on the primary, looked for anywhere in its text
/// (normally in a comment: `/* holdfast: primary */`).
const PRIMARY_HINT: &[u8] = b"holdfast: primary";

/// Where `sql` (classified as `flags` under `mode`) may run. Reads qualify when they are
/// [`READ_ONLY`](C::READ_ONLY) with no function holdfast cannot vouch for, one statement,
/// no assignment of a user variable (one that only reads them is
/// [`ReadRoute::ReplicaWithUserVariables`]), no
/// `SQL_CALC_FOUND_ROWS` (its `FOUND_ROWS()` is read on the primary), no system variable
/// that reports the connection's history (`@@last_insert_id`, `@@warning_count`...), no
/// `SHOW` of something per-connection or per-server (`SHOW WARNINGS`, `SHOW MASTER STATUS`,
/// `SHOW PROCESSLIST`...), and no hint.
pub fn read_route(sql: &[u8], flags: C, mode: SqlMode) -> ReadRoute {
    if !flags.has(C::READ_ONLY)
        || flags.intersects(C::FUNCTION_CALL.union(C::MULTI).union(C::SET_USER_VAR))
        || has_hint(sql)
    {
        return ReadRoute::Primary;
    }
    let mut first = None;
    let mut second = None;
    let mut user_variables = false;
    for t in Lexer::with_mode(sql, mode) {
        match t.kind {
            TokenKind::UserVar => user_variables = true,
            TokenKind::SysVar if connection_history(t.text) => {
                return diagnostics(t.text);
            }
            TokenKind::Word if t.is_word("SQL_CALC_FOUND_ROWS") => return ReadRoute::Primary,
            TokenKind::Word if first.is_none() => first = Some(t),
            TokenKind::Word if second.is_none() => second = Some(t),
            _ => {}
        }
    }
    match (first, second) {
        (Some(f), s) if f.is_word("SHOW") => show_route(s.map(|s| s.text)),
        _ if user_variables => ReadRoute::ReplicaWithUserVariables,
        _ => ReadRoute::Replica,
    }
}

/// Whether `sql` is one `START TRANSACTION` whose characteristics include `READ ONLY`: a
/// transaction that may run on a replica as a whole.
pub fn read_only_transaction(sql: &[u8], flags: C, mode: SqlMode) -> bool {
    if !flags.has(C::BEGIN_TXN) || flags.intersects(C::MULTI.union(C::END_TXN)) || has_hint(sql) {
        return false;
    }
    let mut words = Lexer::with_mode(sql, mode).filter(|t| t.kind == TokenKind::Word);
    if !(words.next().is_some_and(|t| t.is_word("START"))
        && words.next().is_some_and(|t| t.is_word("TRANSACTION")))
    {
        return false;
    }
    let mut after_read = false;
    for w in words {
        if after_read && w.is_word("ONLY") {
            return true;
        }
        after_read = w.is_word("READ");
    }
    false
}

fn has_hint(sql: &[u8]) -> bool {
    sql.windows(PRIMARY_HINT.len())
        .any(|w| w.eq_ignore_ascii_case(PRIMARY_HINT))
}

/// The variable's name without `@@` and scope.
fn sysvar_name(text: &[u8]) -> &[u8] {
    let name = text.strip_prefix(b"@@").unwrap_or(text);
    match name.iter().position(|&b| b == b'.') {
        Some(i) => &name[i + 1..],
        None => name,
    }
}

/// System variables whose value is the connection's own history, not its settings.
fn connection_history(text: &[u8]) -> bool {
    matches!(
        upper(sysvar_name(text)).as_bytes(),
        b"WARNING_COUNT"
            | b"ERROR_COUNT"
            | b"LAST_INSERT_ID"
            | b"IDENTITY"
            | b"INSERT_ID"
            | b"LAST_GTID"
            | b"IN_TRANSACTION"
            | b"PSEUDO_THREAD_ID"
            | b"TIMESTAMP"
            | b"GTID_SEQ_NO"
    )
}

/// Counts of what the last statement left go where it ran; the rest of the history is the
/// primary's.
fn diagnostics(text: &[u8]) -> ReadRoute {
    match upper(sysvar_name(text)).as_bytes() {
        b"WARNING_COUNT" | b"ERROR_COUNT" => ReadRoute::LastNode,
        _ => ReadRoute::Primary,
    }
}

/// `SHOW` statements: what describes schema objects and settings may be read anywhere;
/// what describes this connection or this server may not.
fn show_route(what: Option<&[u8]>) -> ReadRoute {
    let Some(what) = what else {
        return ReadRoute::Primary;
    };
    match upper(what).as_bytes() {
        b"WARNINGS" | b"ERRORS" | b"COUNT" => ReadRoute::LastNode,
        b"TABLES" | b"FULL" | b"DATABASES" | b"SCHEMAS" | b"COLUMNS" | b"FIELDS" | b"INDEX"
        | b"INDEXES" | b"KEYS" | b"CREATE" | b"TABLE" | b"COLLATION" | b"CHARACTER"
        | b"CHARSET" | b"TRIGGERS" | b"EVENTS" | b"FUNCTION" | b"PROCEDURE" | b"VARIABLES"
        | b"ENGINES" | b"PLUGINS" | b"PRIVILEGES" | b"GRANTS" => ReadRoute::Replica,
        _ => ReadRoute::Primary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify;

    fn route(sql: &str) -> ReadRoute {
        read_route(sql.as_bytes(), classify(sql.as_bytes()), SqlMode::DEFAULT)
    }

    #[test]
    fn plain_reads_go_to_replicas() {
        for sql in [
            "SELECT c FROM sbtest1 WHERE id = 5",
            "select sum(k) from t where id between 1 and 100",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "SELECT NOW(), @@server_id, @@session.sql_mode",
            "SHOW TABLES",
            "SHOW FULL COLUMNS FROM t",
            "SHOW CREATE TABLE t",
            "SHOW VARIABLES LIKE 'x%'",
            "/* app: report */ SELECT 1",
            "SELECT SUM(seq) FROM seq_1_to_5000000000",
        ] {
            assert_eq!(route(sql), ReadRoute::Replica, "{sql}");
        }
    }

    #[test]
    fn what_must_see_the_primary_goes_there() {
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT * FROM t FOR UPDATE",
            "SELECT * FROM t LOCK IN SHARE MODE",
            "SELECT @x := 1",
            "SELECT a INTO @a FROM t",
            "SELECT GET_LOCK('a', 1)",
            "SELECT LAST_INSERT_ID()",
            "SELECT FOUND_ROWS()",
            "SELECT ROW_COUNT()",
            "SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1",
            "SELECT @@last_insert_id",
            "SELECT @@session.last_gtid",
            "SELECT my_function(1)",
            "SELECT 1; SELECT 2",
            "CALL p()",
            "SHOW MASTER STATUS",
            "SHOW SLAVE STATUS",
            "SHOW PROCESSLIST",
            "SHOW STATUS",
            "SHOW",
            "SET @a = 1",
            "BEGIN",
            "DO 1",
            "/* holdfast: primary */ SELECT 1",
            "SELECT /* HOLDFAST: PRIMARY */ c FROM t",
        ] {
            assert_eq!(route(sql), ReadRoute::Primary, "{sql}");
        }
    }

    #[test]
    fn reads_of_user_variables_need_them_carried() {
        for sql in [
            "SELECT @x",
            "SELECT c FROM t WHERE id = @id",
            "SELECT @`a b` + 1",
        ] {
            assert_eq!(route(sql), ReadRoute::ReplicaWithUserVariables, "{sql}");
        }
        assert_eq!(route("SELECT @x := 1"), ReadRoute::Primary);
        assert_eq!(route("SELECT @@x"), ReadRoute::Replica);
    }

    #[test]
    fn diagnostics_go_where_the_last_statement_ran() {
        for sql in [
            "SHOW WARNINGS",
            "SHOW ERRORS LIMIT 1",
            "SHOW COUNT(*) WARNINGS",
            "SELECT @@warning_count",
            "SELECT @@session.error_count",
        ] {
            assert_eq!(route(sql), ReadRoute::LastNode, "{sql}");
        }
    }

    #[test]
    fn read_only_transactions_are_told_from_the_others() {
        let ro = |sql: &str| {
            read_only_transaction(sql.as_bytes(), classify(sql.as_bytes()), SqlMode::DEFAULT)
        };
        assert!(ro("START TRANSACTION READ ONLY"));
        assert!(ro("start transaction with consistent snapshot, read only"));
        assert!(!ro("START TRANSACTION READ WRITE"));
        assert!(!ro("START TRANSACTION"));
        assert!(!ro("BEGIN"));
        assert!(!ro("START TRANSACTION READ ONLY; SELECT 1"));
        assert!(!ro("/* holdfast: primary */ START TRANSACTION READ ONLY"));
    }

    #[test]
    fn the_session_sql_mode_decides_what_is_a_variable() {
        let sql = b"SELECT \"@x\" FROM t";
        let flags = crate::classify_with(sql, SqlMode::DEFAULT);
        assert_eq!(read_route(sql, flags, SqlMode::DEFAULT), ReadRoute::Replica);
    }
}
