//! Read/write splitting: whether a statement may run on a replica.

use crate::classify::Classification as C;
use crate::keyword::upper;
use crate::lexer::{Lexer, SqlMode, Token, TokenKind};
use crate::server::Server;

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

/// Where `sql` (classified as `flags` under `mode`, for `server`: see
/// [`classify_for`](crate::classify_for)) may run. Reads qualify when they are
/// [`READ_ONLY`](C::READ_ONLY) with no function holdfast cannot vouch for, one statement,
/// no assignment of a user variable (one that only reads them is
/// [`ReadRoute::ReplicaWithUserVariables`]), nothing [`UNCERTAIN`](C::UNCERTAIN), no
/// `SQL_CALC_FOUND_ROWS` (its `FOUND_ROWS()` is read on the primary), no system variable
/// that reports the connection's history (`@@last_insert_id`, `@@warning_count`...) or
/// describes the node that answers (`@@read_only`, `@@gtid_current_pos`, `@@hostname`...;
/// `@@server_id` excepted: it tells where a read ran), no `SHOW` of something
/// per-connection or per-server (`SHOW WARNINGS`, `SHOW [FULL] PROCESSLIST`, `SHOW STATUS`,
/// `SHOW VARIABLES`, `SHOW MASTER STATUS`...), no table of the server's own state
/// (`information_schema` beyond the data dictionary, `performance_schema`, `sys`, `mysql`),
/// and no hint. `SET STATEMENT ... FOR stmt` is judged by `stmt`.
pub fn read_route(sql: &[u8], flags: C, mode: SqlMode, server: Server) -> ReadRoute {
    // `FOUND_ROWS()` and `ROW_COUNT()` read what the previous statement left: a read that
    // calls no other function runs where that statement ran.
    let history = reads_last_statement(sql, mode, server);
    let flags = if history && flags.has(C::FUNCTION_CALL) {
        crate::classify::classify_history_pure(sql, mode, server)
    } else {
        flags
    };
    let route = read_route_of(sql, flags, mode, server);
    match route {
        ReadRoute::Replica if history => ReadRoute::LastNode,
        // The replica that ran the last statement may not have the user variables' values.
        ReadRoute::ReplicaWithUserVariables if history => ReadRoute::Primary,
        route => route,
    }
}

fn read_route_of(sql: &[u8], flags: C, mode: SqlMode, server: Server) -> ReadRoute {
    if !flags.has(C::READ_ONLY)
        || flags.intersects(
            C::FUNCTION_CALL
                .union(C::MULTI)
                .union(C::SET_USER_VAR)
                .union(C::UNCERTAIN),
        )
        || has_hint(sql)
    {
        return ReadRoute::Primary;
    }
    let lexer = Lexer::for_server(sql, mode, server);
    // The statement's first words; after `SET STATEMENT ... FOR`, the inner statement's.
    let mut head: [Option<Token<'_>>; 3] = [None; 3];
    let mut words = 0;
    let mut set_statement = false;
    let mut depth = 0u32;
    let mut user_variables = false;
    let mut prev: Option<Token<'_>> = None;
    let mut prev2: Option<Token<'_>> = None;
    for t in lexer {
        match t.kind {
            TokenKind::UserVar => user_variables = true,
            // The diagnostics counts are read where the last statement ran (by the caller,
            // from `reads_last_statement`); the rest of the history is the primary's.
            TokenKind::SysVar if connection_history(t.text) && !diagnostics(t.text) => {
                return ReadRoute::Primary;
            }
            TokenKind::SysVar if describes_the_node(t.text) => return ReadRoute::Primary,
            TokenKind::Word if t.is_word("SQL_CALC_FOUND_ROWS") => return ReadRoute::Primary,
            TokenKind::Punct if t.is_punct("(") => depth = depth.saturating_add(1),
            TokenKind::Punct if t.is_punct(")") => depth = depth.saturating_sub(1),
            _ => {}
        }
        if matches!(t.kind, TokenKind::Word | TokenKind::QuotedIdent) {
            let qualifier = prev2.filter(|_| prev.is_some_and(|p| p.is_punct(".")));
            if server_state_table(qualifier.and_then(|q| q.ident()), t.ident()) {
                return ReadRoute::Primary;
            }
        }
        if t.kind == TokenKind::Word {
            if set_statement {
                // `SET STATEMENT var = value, ... FOR stmt`: the words of `stmt` count.
                if depth == 0 && t.is_word("FOR") && !prev.is_some_and(|p| p.is_punct(".")) {
                    set_statement = false;
                    head = [None; 3];
                    words = 0;
                }
            } else if words < head.len() {
                if words == 0 && t.is_word("SET") {
                    set_statement = true;
                }
                head[words] = Some(t);
                words += 1;
            }
        }
        prev2 = prev;
        prev = Some(t);
    }
    let word = |i: usize| head[i].map(|t| t.text);
    match head[0] {
        Some(f) if f.is_word("SHOW") => show_route(word(1), word(2)),
        // `EXPLAIN FOR CONNECTION n` (MariaDB 10.9, MySQL): another thread of this server.
        Some(f)
            if (f.is_word("EXPLAIN") || f.is_word("DESCRIBE") || f.is_word("DESC"))
                && head[1].is_some_and(|t| t.is_word("FOR")) =>
        {
            ReadRoute::Primary
        }
        _ if user_variables => ReadRoute::ReplicaWithUserVariables,
        _ => ReadRoute::Replica,
    }
}

/// Whether `sql` is one `START TRANSACTION` whose characteristics include `READ ONLY`: a
/// transaction that may run on a replica as a whole.
pub fn read_only_transaction(sql: &[u8], flags: C, mode: SqlMode, server: Server) -> bool {
    if !flags.has(C::BEGIN_TXN)
        || flags.intersects(C::MULTI.union(C::END_TXN).union(C::UNCERTAIN))
        || has_hint(sql)
    {
        return false;
    }
    let mut words = Lexer::for_server(sql, mode, server).filter(|t| t.kind == TokenKind::Word);
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

/// Counts of what the last statement left (they go where it ran).
fn diagnostics(text: &[u8]) -> bool {
    matches!(
        upper(sysvar_name(text)).as_bytes(),
        b"WARNING_COUNT" | b"ERROR_COUNT"
    )
}

/// Whether `sql` names a system variable other than the diagnostics counts
/// (`@@warning_count`, `@@error_count`): a setting, or a value of the node that answers
/// (`@@server_id`, a global).
pub fn names_system_variables(sql: &[u8], mode: SqlMode, server: Server) -> bool {
    Lexer::for_server(sql, mode, server)
        .any(|t| t.kind == TokenKind::SysVar && !diagnostics(t.text))
}

/// Whether `sql` reads what the connection's previous statement left: `FOUND_ROWS()`,
/// `ROW_COUNT()`, `@@warning_count`, `@@error_count`, `SHOW WARNINGS|ERRORS|COUNT(*) ...`,
/// `GET DIAGNOSTICS`. Such a statement must run on the connection that ran the previous
/// one. Looked for anywhere in the text (in a multi-statement, a later statement reads
/// an earlier one's: saying so is only a cost).
pub fn reads_last_statement(sql: &[u8], mode: SqlMode, server: Server) -> bool {
    let mut prev: Option<Token<'_>> = None;
    let mut prev2: Option<Token<'_>> = None;
    for t in Lexer::for_server(sql, mode, server) {
        match t.kind {
            TokenKind::SysVar if diagnostics(t.text) => return true,
            TokenKind::Punct if t.is_punct("(") => {
                let call = prev.filter(|p| {
                    p.kind == TokenKind::Word && !prev2.is_some_and(|q| q.is_punct("."))
                });
                if call.is_some_and(|p| p.is_word("FOUND_ROWS") || p.is_word("ROW_COUNT")) {
                    return true;
                }
            }
            // `SHOW [COUNT(*)] WARNINGS|ERRORS`.
            TokenKind::Word
                if (t.is_word("WARNINGS") || t.is_word("ERRORS"))
                    && prev.is_some_and(|p| p.is_word("SHOW") || p.is_punct(")")) =>
            {
                return true;
            }
            TokenKind::Word
                if t.is_word("DIAGNOSTICS")
                    && prev.is_some_and(|p| {
                        p.is_word("GET") || p.is_word("CURRENT") || p.is_word("STACKED")
                    }) =>
            {
                return true;
            }
            _ => {}
        }
        prev2 = prev;
        prev = Some(t);
    }
    false
}

/// System variables whose value describes the node that answers rather than the session:
/// its role (`read_only`), where it stands in replication (`gtid_*`, `slave_*`...), where it
/// lives. Not `server_id`: reading it is how a client learns where a read ran.
fn describes_the_node(text: &[u8]) -> bool {
    let name = upper(sysvar_name(text));
    let name = name.as_bytes();
    const PREFIXES: [&[u8]; 8] = [
        b"GTID_",
        b"WSREP_",
        b"SLAVE_",
        b"REPLICA_",
        b"RELAY_LOG",
        b"RPL_",
        b"LOG_BIN",
        b"INNODB_READ_ONLY",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || matches!(
            name,
            b"READ_ONLY"
                | b"SUPER_READ_ONLY"
                | b"HOSTNAME"
                | b"PORT"
                | b"SOCKET"
                | b"PID_FILE"
                | b"DATADIR"
                | b"SERVER_UUID"
                | b"REPORT_HOST"
                | b"REPORT_PORT"
                | b"BIND_ADDRESS"
                | b"LOG_SLAVE_UPDATES"
                | b"LOG_REPLICA_UPDATES"
        )
}

/// Whether a table named `name`, in `schema` if qualified, holds the server's own state:
/// anything in `performance_schema`, `sys` or `mysql` (replication positions, logs,
/// statistics; the rest is cheap to read on the primary), and in `information_schema`
/// whatever is not the data dictionary. Unqualified, the names of `information_schema`'s
/// views of the server's state (`PROCESSLIST`, `GLOBAL_STATUS`...), as a session whose
/// current database is `information_schema` names them.
fn server_state_table(schema: Option<&[u8]>, name: Option<&[u8]>) -> bool {
    let Some(name) = name else {
        return false;
    };
    let name = upper(name);
    let name = name.as_bytes();
    match schema.map(upper).as_ref().map(|s| s.as_bytes()) {
        Some(b"PERFORMANCE_SCHEMA" | b"SYS" | b"MYSQL") => true,
        Some(b"INFORMATION_SCHEMA") => !data_dictionary(name),
        Some(_) => false,
        None => server_state_view(name),
    }
}

/// `information_schema` tables that describe schema objects and built-ins, the same on
/// every node (not `EVENTS`: a replica shows its events `SLAVESIDE_DISABLED`).
fn data_dictionary(name: &[u8]) -> bool {
    matches!(
        name,
        b"SCHEMATA"
            | b"TABLES"
            | b"COLUMNS"
            | b"VIEWS"
            | b"STATISTICS"
            | b"ROUTINES"
            | b"PARAMETERS"
            | b"TRIGGERS"
            | b"KEY_COLUMN_USAGE"
            | b"REFERENTIAL_CONSTRAINTS"
            | b"TABLE_CONSTRAINTS"
            | b"CHECK_CONSTRAINTS"
            | b"CHARACTER_SETS"
            | b"COLLATIONS"
            | b"COLLATION_CHARACTER_SET_APPLICABILITY"
            | b"ENGINES"
            | b"KEYWORDS"
            | b"SQL_FUNCTIONS"
            | b"SEQUENCES"
            | b"COLUMN_PRIVILEGES"
            | b"TABLE_PRIVILEGES"
            | b"SCHEMA_PRIVILEGES"
            | b"USER_PRIVILEGES"
            | b"APPLICABLE_ROLES"
            | b"ENABLED_ROLES"
            | b"SPATIAL_REF_SYS"
            | b"GEOMETRY_COLUMNS"
            | b"PERIODS"
            | b"KEY_PERIOD_USAGE"
    )
}

/// Unqualified names of `information_schema` views of the server's state.
fn server_state_view(name: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 4] = [b"INNODB_", b"THREAD_POOL_", b"WSREP_", b"QUERY_CACHE"];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || matches!(
            name,
            b"PROCESSLIST"
                | b"GLOBAL_STATUS"
                | b"SESSION_STATUS"
                | b"GLOBAL_VARIABLES"
                | b"SESSION_VARIABLES"
                | b"SYSTEM_VARIABLES"
                | b"USER_VARIABLES"
                | b"USER_STATISTICS"
                | b"CLIENT_STATISTICS"
                | b"INDEX_STATISTICS"
                | b"TABLE_STATISTICS"
                | b"METADATA_LOCK_INFO"
                | b"PROFILING"
                | b"OPTIMIZER_TRACE"
                | b"SLAVE_STATUS"
                | b"QUERY_RESPONSE_TIME"
                | b"KEY_CACHES"
                | b"DISKS"
        )
}

/// `SHOW` statements (by their second and third words): what describes schema objects and
/// built-ins may be read anywhere; what describes this connection or this server (its
/// threads, status, variables, plugins, replication, logs, events) may not.
fn show_route(what: Option<&[u8]>, then: Option<&[u8]>) -> ReadRoute {
    let Some(what) = what else {
        return ReadRoute::Primary;
    };
    let then = then.map(upper);
    let then = then.as_ref().map(|t| t.as_bytes());
    match upper(what).as_bytes() {
        b"WARNINGS" | b"ERRORS" | b"COUNT" => ReadRoute::LastNode,
        // `SHOW FULL TABLES|COLUMNS|FIELDS`, not `SHOW FULL PROCESSLIST`.
        b"FULL" => match then {
            Some(b"TABLES" | b"COLUMNS" | b"FIELDS") => ReadRoute::Replica,
            _ => ReadRoute::Primary,
        },
        // `SHOW TABLE STATUS`.
        b"TABLE" => match then {
            Some(b"STATUS") => ReadRoute::Replica,
            _ => ReadRoute::Primary,
        },
        // Not `SHOW CREATE EVENT` (a replica's event is `DISABLE ON SLAVE`).
        b"CREATE" => match then {
            Some(b"EVENT") => ReadRoute::Primary,
            _ => ReadRoute::Replica,
        },
        b"TABLES" | b"DATABASES" | b"SCHEMAS" | b"COLUMNS" | b"FIELDS" | b"INDEX" | b"INDEXES"
        | b"KEYS" | b"COLLATION" | b"CHARACTER" | b"CHARSET" | b"TRIGGERS" | b"FUNCTION"
        | b"PROCEDURE" | b"PACKAGE" | b"ENGINES" | b"PRIVILEGES" | b"GRANTS" => ReadRoute::Replica,
        _ => ReadRoute::Primary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify;

    fn route(sql: &str) -> ReadRoute {
        let server = Server::mariadb(101119);
        let flags = crate::classify_for(sql.as_bytes(), SqlMode::DEFAULT, server);
        read_route(sql.as_bytes(), flags, SqlMode::DEFAULT, server)
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
            "SHOW VARIABLES LIKE 'x%'",
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

    /// Issue 18, item 5: MariaDB 10.11 skips `/*!90000 ... */` (MySQL versions 5.7 and up
    /// are not run by MariaDB), so what follows the comment is code.
    #[test]
    fn skipped_executable_comments_hide_nothing() {
        for sql in [
            "SELECT @@server_id /*!90000 ' */, GET_LOCK('j',0) -- '",
            "SELECT @@server_id /*!90000 -- */ , GET_LOCK('jj',0)",
        ] {
            assert_eq!(route(sql), ReadRoute::Primary, "{sql}");
        }
    }

    /// Issue 18, item 6: what describes the server that answers is the primary's.
    #[test]
    fn server_local_reads_go_to_the_primary() {
        for sql in [
            "SHOW FULL PROCESSLIST",
            "SHOW PROCESSLIST",
            "SELECT * FROM information_schema.PROCESSLIST",
            "SELECT id FROM INFORMATION_SCHEMA.`processlist` WHERE command = 'Sleep'",
            "SHOW STATUS",
            "SHOW GLOBAL STATUS LIKE 'Slave_running'",
            "SHOW SESSION STATUS",
            "SELECT @@read_only",
            "SELECT @@global.read_only, @@server_id",
            "SELECT @@gtid_current_pos",
            "SET STATEMENT max_statement_time = 10 FOR SHOW FULL PROCESSLIST",
            "SET STATEMENT max_statement_time = 10 FOR SELECT * FROM information_schema.processlist",
            "SELECT * FROM performance_schema.threads",
            "SELECT variable_value FROM information_schema.global_status",
        ] {
            assert_eq!(route(sql), ReadRoute::Primary, "{sql}");
        }
        assert_eq!(
            route("SET STATEMENT max_statement_time = 10 FOR SHOW WARNINGS"),
            ReadRoute::LastNode
        );
        for sql in [
            "SHOW FULL TABLES",
            "SHOW FULL COLUMNS FROM t",
            "SHOW TABLE STATUS",
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'x'",
            "SET STATEMENT max_statement_time = 10 FOR SELECT c FROM t",
        ] {
            assert_eq!(route(sql), ReadRoute::Replica, "{sql}");
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
    fn system_variables_named_beyond_the_diagnostics_counts() {
        let named = |sql: &str| {
            names_system_variables(sql.as_bytes(), SqlMode::default(), Server::default())
        };
        for sql in [
            "SELECT @@server_id",
            "SELECT @@warning_count, @@GLOBAL.max_connections",
            "SELECT @@session.autocommit",
        ] {
            assert!(named(sql), "{sql}");
        }
        for sql in [
            "SELECT @@warning_count, @@session.error_count",
            "SELECT NOW(6), '@@server_id'",
            "SELECT 1 /* @@server_id */",
        ] {
            assert!(!named(sql), "{sql}");
        }
    }

    #[test]
    fn diagnostics_go_where_the_last_statement_ran() {
        for sql in [
            "SHOW WARNINGS",
            "SHOW ERRORS LIMIT 1",
            "SHOW COUNT(*) WARNINGS",
            "SELECT @@warning_count",
            "SELECT @@session.error_count",
            "SELECT FOUND_ROWS()",
            "SELECT FOUND_ROWS(), ROW_COUNT()",
            "select row_count() + 1 AS n",
        ] {
            assert_eq!(route(sql), ReadRoute::LastNode, "{sql}");
        }
        // Reads of the last statement that cannot run on a replica.
        for sql in [
            "SELECT FOUND_ROWS(), GET_LOCK('a', 0)",
            "SELECT ROW_COUNT(), my_function()",
            "SELECT @@warning_count, @@last_insert_id",
            "SELECT ROW_COUNT(), @x",
            "SELECT ROW_COUNT() INTO @x",
            "SET @x = FOUND_ROWS()",
            "GET DIAGNOSTICS @n = NUMBER",
            "SELECT ROW_COUNT(); SELECT 1",
            "SELECT @@warning_count FROM performance_schema.threads",
        ] {
            assert_eq!(route(sql), ReadRoute::Primary, "{sql}");
        }
        let reads = |sql: &str| {
            reads_last_statement(sql.as_bytes(), SqlMode::DEFAULT, Server::mariadb(101119))
        };
        for sql in [
            "SET @x = FOUND_ROWS()",
            "GET DIAGNOSTICS @n = NUMBER",
            "get current diagnostics condition 1 @m = MESSAGE_TEXT",
            "INSERT INTO t VALUES (ROW_COUNT())",
            "SHOW COUNT(*) ERRORS",
            "SELECT @@session.warning_count",
        ] {
            assert!(reads(sql), "{sql}");
        }
        for sql in [
            "SELECT found_rows FROM t",
            "SELECT db.row_count(1)",
            "SELECT 'FOUND_ROWS()'",
            "SHOW TABLES",
        ] {
            assert!(!reads(sql), "{sql}");
        }
    }

    #[test]
    fn read_only_transactions_are_told_from_the_others() {
        let ro = |sql: &str| {
            let server = Server::mariadb(101119);
            read_only_transaction(
                sql.as_bytes(),
                classify(sql.as_bytes()),
                SqlMode::DEFAULT,
                server,
            )
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
        assert_eq!(
            read_route(sql, flags, SqlMode::DEFAULT, Server::UNKNOWN),
            ReadRoute::Replica
        );
    }
}
