//! What a statement does to the connection's `FOUND_ROWS()`.
//!
//! MariaDB sets `FOUND_ROWS()` when it runs a query expression as a statement's top
//! level: a `SELECT` (also `SELECT ... INTO`), the `SELECT` of `INSERT ... SELECT` or
//! `CREATE TABLE ... SELECT`; to the rows it found, even when it then fails (a duplicate
//! key halfway through an `INSERT ... SELECT` leaves the rows read so far). Queries nested
//! in other statements set it or not as the optimiser runs them (`SET @x = (SELECT
//! COUNT(*) FROM t)` sets it, `SET @x = (SELECT 7)` and `UPDATE ... WHERE k IN (SELECT
//! ...)` do not), and so do `SHOW` statements (`SHOW TABLES` does, `SHOW CREATE TABLE`
//! does not) and `EXPLAIN` (no), `DESCRIBE` (yes). Writes without a query, settings and
//! transaction statements never do. (Seen on MariaDB 10.11.)

use crate::lexer::{Lexer, SqlMode, Token, TokenKind};
use crate::server::Server;

/// What running a statement does to `FOUND_ROWS()` on the connection it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundRowsEffect {
    /// It never changes it: a write without a query inside, a setting, `USE`, `COMMIT`,
    /// DDL without a query, `SHOW WARNINGS` (but `SHOW COUNT(*) WARNINGS` sets it to 1)...
    Keeps,
    /// It sets it whenever it runs: a query at the top level (`SELECT`, `WITH ...
    /// SELECT`, `(SELECT ...) UNION ...`, `INSERT|REPLACE ... SELECT`, `CREATE TABLE ...
    /// SELECT`). It keeps it when it fails before it runs (a syntax error, an unknown
    /// table).
    Sets,
    /// It may: what it does depends on how the server runs it (a query nested in another
    /// statement, `SHOW`, `EXPLAIN`, `CALL`, a prepared statement's `EXECUTE`, several
    /// statements, anything not recognised).
    Uncertain,
}

/// What `sql` does to `FOUND_ROWS()` (see [`FoundRowsEffect`]), lexed under `mode` as
/// `server` reads executable comments. `SET STATEMENT ... FOR stmt` is judged by `stmt`.
pub fn found_rows_effect(sql: &[u8], mode: SqlMode, server: Server) -> FoundRowsEffect {
    use FoundRowsEffect::{Keeps, Sets, Uncertain};
    let mut head: Option<Token<'_>> = None;
    let mut second: Option<Token<'_>> = None;
    let mut depth = 0u32;
    let mut set_statement = false;
    let mut statement_ended = false;
    // A `SELECT` at the statement's top level (not in parentheses), one anywhere.
    let mut top_select = false;
    let mut any_select = false;
    // Before `SET` in `UPDATE`: more than one table (`UPDATE t, u SET`, `... JOIN ...`).
    let mut before_set = true;
    let mut several_tables = false;
    let mut returning = false;
    let mut paren_first = false;
    for t in Lexer::for_server(sql, mode, server) {
        if statement_ended {
            // A second statement: what the text does is what its last one does.
            return Uncertain;
        }
        match t.kind {
            TokenKind::Punct if t.is_punct("(") => {
                // `(SELECT ...) UNION (SELECT ...)`: a query.
                paren_first |= head.is_none() && depth == 0;
                depth = depth.saturating_add(1);
            }
            TokenKind::Punct if t.is_punct(")") => depth = depth.saturating_sub(1),
            TokenKind::Punct if t.is_punct(";") && depth == 0 => statement_ended = true,
            TokenKind::Punct if t.is_punct(",") && depth == 0 && before_set => {
                several_tables = true;
            }
            TokenKind::Word => {
                if set_statement {
                    // `SET STATEMENT var = value, ... FOR stmt`: `stmt` counts.
                    if depth == 0 && t.is_word("FOR") {
                        set_statement = false;
                        head = None;
                        second = None;
                        before_set = true;
                        several_tables = false;
                    } else if t.is_word("SELECT") {
                        any_select = true;
                    }
                    continue;
                }
                match (head, second) {
                    (None, _) => head = Some(t),
                    (Some(h), None) => {
                        second = Some(t);
                        if h.is_word("SET") && t.is_word("STATEMENT") {
                            set_statement = true;
                            continue;
                        }
                    }
                    _ => {}
                }
                if t.is_word("SELECT") {
                    any_select = true;
                    top_select |= depth == 0;
                } else if t.is_word("SET") && depth == 0 {
                    before_set = false;
                } else if t.is_word("JOIN") || t.is_word("STRAIGHT_JOIN") || t.is_word("USING") {
                    several_tables = true;
                } else if t.is_word("RETURNING") {
                    returning = true;
                }
            }
            _ => {}
        }
    }
    if paren_first {
        return Sets;
    }
    let Some(head) = head else {
        return Keeps;
    };
    let is = |w: &str| head.is_word(w);
    let second_is = |w: &str| second.is_some_and(|s| s.is_word(w));
    if is("SELECT") || is("WITH") {
        return Sets;
    }
    if is("INSERT") || is("REPLACE") {
        return match (top_select, any_select || returning) {
            (true, _) if !returning => Sets,
            (false, false) => Keeps,
            _ => Uncertain,
        };
    }
    if is("CREATE") {
        // `CREATE [OR REPLACE] [TEMPORARY] TABLE ... SELECT` runs its query; a view's,
        // a procedure's, a trigger's is only stored.
        let table = Lexer::for_server(sql, mode, server)
            .filter(|t| t.kind == TokenKind::Word)
            .skip(1)
            .find(|t| !(t.is_word("OR") || t.is_word("REPLACE") || t.is_word("TEMPORARY")))
            .is_some_and(|t| t.is_word("TABLE"));
        return match (any_select, table && top_select) {
            (false, _) => Keeps,
            (true, true) => Sets,
            (true, false) => Uncertain,
        };
    }
    if is("DELETE") {
        // `DELETE t FROM ...`, `DELETE FROM t USING ...`: a join, like a query's.
        let from_first = Lexer::for_server(sql, mode, server)
            .filter(|t| t.kind == TokenKind::Word)
            .skip(1)
            .find(|t| !(t.is_word("LOW_PRIORITY") || t.is_word("QUICK") || t.is_word("IGNORE")))
            .is_some_and(|t| t.is_word("FROM"));
        let single = from_first && !several_tables_after_from(sql, mode, server);
        return if single && !any_select && !returning {
            Keeps
        } else {
            Uncertain
        };
    }
    if is("UPDATE") {
        return if several_tables || any_select {
            Uncertain
        } else {
            Keeps
        };
    }
    if is("SHOW") {
        // `SHOW WARNINGS` and `SHOW ERRORS` leave it as the last statement did;
        // `SHOW COUNT(*) WARNINGS` answers one row and sets it to 1, like `SELECT
        // @@warning_count` (seen on MariaDB 10.11).
        return if second_is("WARNINGS") || second_is("ERRORS") {
            Keeps
        } else if second_is("COUNT") {
            Sets
        } else {
            Uncertain
        };
    }
    if is("BEGIN") && second_is("NOT") {
        // `BEGIN NOT ATOMIC ... END`: a compound statement.
        return Uncertain;
    }
    const KEEP: [&str; 25] = [
        "SET",
        "DO",
        "USE",
        "BEGIN",
        "START",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
        "XA",
        "LOCK",
        "UNLOCK",
        "DROP",
        "ALTER",
        "RENAME",
        "TRUNCATE",
        "PREPARE",
        "DEALLOCATE",
        "GRANT",
        "REVOKE",
        "KILL",
        "FLUSH",
        "STOP",
        "RESET",
        "PURGE",
    ];
    if KEEP.iter().any(|w| is(w)) && !any_select {
        Keeps
    } else {
        Uncertain
    }
}

/// Whether a statement that failed with error `code` failed before it ran, and so left
/// `FOUND_ROWS()` as it was: a syntax error, a name that does not resolve, a privilege
/// missing, a read-only transaction or server, a table not locked. Any other error may
/// have come while it ran (a duplicate key, a subquery of several rows, a lock wait, a
/// timeout, a `KILL`), after the server had counted rows.
pub fn fails_before_it_runs(code: u16) -> bool {
    matches!(
        code,
        1044 | 1045 // access denied to a database, an account
            | 1046 | 1049 // no database selected, unknown database
            | 1051 | 1052 | 1054 // unknown table, ambiguous column, unknown column
            | 1055 | 1056 | 1060 | 1064 | 1066 // grouping, names, syntax
            | 1093 | 1096 | 1099 | 1100 | 1109 | 1111 // target in FROM, locks, unknown table
            | 1136 | 1142 | 1143 | 1146 | 1149 // value count, privileges, no such table
            | 1192 | 1210 | 1221 | 1222 | 1223 | 1227 // locks held, wrong usage, columns
            | 1235 | 1241 | 1243 | 1247 | 1248 // not supported, operand, handlers, aliases
            | 1290 | 1305 | 1318 | 1347 | 1370 // read-only server, routines, privileges
            | 1582 | 1583 | 1584 | 1630 // function arguments and names
            | 1792 // a read-only transaction
            | 4091 // unknown sequence
    )
}

/// Whether a `DELETE FROM` names several tables before its `WHERE` (`DELETE FROM t, u
/// USING ...`).
fn several_tables_after_from(sql: &[u8], mode: SqlMode, server: Server) -> bool {
    let mut depth = 0u32;
    for t in Lexer::for_server(sql, mode, server) {
        if t.is_punct("(") {
            depth = depth.saturating_add(1);
        } else if t.is_punct(")") {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && (t.is_word("WHERE") || t.is_word("ORDER") || t.is_word("LIMIT")) {
            return false;
        } else if depth == 0 && t.is_punct(",") {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(sql: &str) -> FoundRowsEffect {
        found_rows_effect(sql.as_bytes(), SqlMode::DEFAULT, Server::mariadb(101119))
    }

    // Each as MariaDB 10.11 did it, after `SELECT * FROM t LIMIT 4` (t holding 7 rows).
    #[test]
    fn errors_found_before_running_are_told_apart() {
        // Seen leaving `FOUND_ROWS()`: an unknown table; changing it: a duplicate key in
        // `INSERT ... SELECT` (to the rows read before it), a subquery of several rows.
        assert!(fails_before_it_runs(1146));
        assert!(fails_before_it_runs(1064));
        assert!(!fails_before_it_runs(1062));
        assert!(!fails_before_it_runs(1242));
        assert!(!fails_before_it_runs(1205));
    }

    #[test]
    fn queries_set_it() {
        for sql in [
            "SELECT 1",
            "select k from t where k > 100",
            "SELECT k INTO @a FROM t LIMIT 1",
            "SELECT k FROM t LIMIT 2 FOR UPDATE",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH c AS (SELECT 1) SELECT * FROM c",
            "INSERT INTO t (k, v) SELECT MAX(k) + 1, 'sel' FROM t",
            "INSERT INTO u WITH c AS (SELECT 50 AS k) SELECT k FROM c",
            "REPLACE INTO u SELECT k FROM t",
            "INSERT INTO t SELECT k+20,'x' FROM t ON DUPLICATE KEY UPDATE v='d'",
            "CREATE TABLE w SELECT * FROM u",
            "CREATE TEMPORARY TABLE tt AS SELECT k FROM u",
            "SET STATEMENT max_statement_time=10 FOR SELECT k FROM u",
            "SET STATEMENT max_statement_time=10 FOR INSERT INTO t SELECT k+20,'x' FROM u",
            "/*!40101 SELECT 1 */",
            "SHOW COUNT(*) WARNINGS",
            "SHOW COUNT(*) ERRORS",
        ] {
            assert_eq!(effect(sql), FoundRowsEffect::Sets, "{sql}");
        }
    }

    #[test]
    fn writes_settings_and_transactions_keep_it() {
        for sql in [
            "",
            "/* nothing */",
            "INSERT INTO t VALUES (9,'x')",
            "INSERT INTO t (k, v) VALUES (NEXTVAL(s) + 50, 'seq')",
            "INSERT INTO t VALUES (1,'select')",
            "UPDATE t SET v='z', k=k+100 WHERE k = 1",
            "DELETE FROM t WHERE k > 3",
            "DELETE FROM t ORDER BY k LIMIT 2",
            "SET @x = 1",
            "SET sql_select_limit = 2",
            "DO GET_LOCK('a', 0)",
            "TRUNCATE t",
            "CREATE TEMPORARY TABLE tt (a INT)",
            "ALTER TABLE u ADD COLUMN z INT",
            "PREPARE ps FROM 'SELECT k FROM u'",
            "DEALLOCATE PREPARE ps",
            "LOCK TABLES t READ",
            "UNLOCK TABLES",
            "XA START 'x'",
            "BEGIN",
            "START TRANSACTION READ ONLY",
            "SAVEPOINT sp",
            "COMMIT",
            "USE test",
            "SHOW WARNINGS",
            "SHOW ERRORS LIMIT 1",
            "FLUSH TABLES",
        ] {
            assert_eq!(effect(sql), FoundRowsEffect::Keeps, "{sql}");
        }
    }

    #[test]
    fn nested_queries_and_what_the_server_decides_are_uncertain() {
        for sql in [
            "SET @x = (SELECT COUNT(*) FROM t)",
            "SET @x = (SELECT 7)",
            "DO (SELECT COUNT(*) FROM t)",
            "UPDATE t SET v='z' WHERE k IN (SELECT k FROM u)",
            "UPDATE t SET v=(SELECT COUNT(*) FROM u)",
            "DELETE FROM t WHERE k IN (SELECT 1)",
            "INSERT INTO t VALUES ((SELECT COUNT(*)+50 FROM u), 'x')",
            "INSERT INTO u (SELECT 15) UNION (SELECT 16)",
            "INSERT INTO t VALUES (50, 'x') RETURNING k",
            "DELETE FROM t WHERE k = 1 RETURNING k",
            "DELETE t FROM t JOIN u ON t.k=u.k",
            "DELETE FROM t USING t, u WHERE t.k = u.k",
            "DELETE FROM t, u USING t JOIN u",
            "UPDATE t JOIN u ON t.k=u.k SET v='q'",
            "UPDATE t, u SET t.v='q' WHERE t.k=u.k",
            "CREATE VIEW vv AS SELECT k FROM u",
            "SHOW TABLES",
            "SHOW CREATE TABLE t",
            "DESCRIBE t",
            "EXPLAIN SELECT * FROM t",
            "VALUES (1),(2)",
            "CHECKSUM TABLE t",
            "CALL p()",
            "EXECUTE ps",
            "EXECUTE IMMEDIATE 'SELECT 1'",
            "BEGIN NOT ATOMIC SELECT 1; END",
            "HANDLER t READ FIRST",
            "LOAD DATA INFILE 'x' INTO TABLE u",
            "SELECT 1; INSERT INTO t VALUES (1, 'a')",
            "(SELECT 1); DELETE FROM t",
            "INSERT INTO t VALUES (1, 'a'); SELECT 1",
        ] {
            assert_eq!(effect(sql), FoundRowsEffect::Uncertain, "{sql}");
        }
    }
}
