use crate::{
    classify, classify_for, classify_with, first_keyword, split_statements, Classification as C,
    Lexer, Server, SqlMode, Statements, TokenKind,
};

const ANSI: SqlMode = SqlMode::ANSI_QUOTES;
const NBE: SqlMode = SqlMode::NO_BACKSLASH_ESCAPES;
const BOTH: SqlMode = SqlMode {
    ansi_quotes: true,
    no_backslash_escapes: true,
};

/// Classifies `sql` and checks the flags are exactly `expected`.
#[track_caller]
fn assert_flags(sql: &str, expected: C) {
    let got = classify(sql.as_bytes());
    assert_eq!(got, expected, "{sql:?}: got {got}, expected {expected}");
}

/// Checks every flag of `expected` is set (others may be too).
#[track_caller]
fn assert_has(sql: &str, expected: C) {
    let got = classify(sql.as_bytes());
    assert!(
        got.has(expected),
        "{sql:?}: got {got}, expected at least {expected}"
    );
}

#[track_caller]
fn assert_lacks(sql: &str, unexpected: C) {
    let got = classify(sql.as_bytes());
    assert!(
        !got.intersects(unexpected),
        "{sql:?}: got {got}, should not have {unexpected}"
    );
}

fn tokens(sql: &str) -> Vec<(TokenKind, &str)> {
    tokens_in(sql, SqlMode::DEFAULT)
}

fn tokens_in(sql: &str, mode: SqlMode) -> Vec<(TokenKind, &str)> {
    Lexer::with_mode(sql.as_bytes(), mode)
        .map(|t| {
            (
                t.kind,
                std::str::from_utf8(t.text).expect("test input is UTF-8"),
            )
        })
        .collect()
}

fn statements(sql: &str) -> Vec<&str> {
    split_statements(sql.as_bytes()).map(|r| &sql[r]).collect()
}

// ---------------------------------------------------------------- lexer

#[test]
fn lexes_words_numbers_and_punctuation() {
    use TokenKind::*;
    assert_eq!(
        tokens("SELECT a1, 1.5e3 FROM t WHERE x<=>.5 AND y:=0x1F|| z->>'$.a'"),
        vec![
            (Word, "SELECT"),
            (Word, "a1"),
            (Punct, ","),
            (Number, "1.5e3"),
            (Word, "FROM"),
            (Word, "t"),
            (Word, "WHERE"),
            (Word, "x"),
            (Punct, "<=>"),
            (Number, ".5"),
            (Word, "AND"),
            (Word, "y"),
            (Punct, ":="),
            (Number, "0x1F"),
            (Punct, "||"),
            (Word, "z"),
            (Punct, "->>"),
            (String, "'$.a'"),
        ]
    );
    assert_eq!(tokens("1abc t.5 0b101 0xyz"), {
        vec![
            (Word, "1abc"),
            (Word, "t"),
            (Punct, "."),
            (Number, "5"),
            (Number, "0b101"),
            (Word, "0xyz"),
        ]
    });
}

#[test]
fn lexes_strings_and_quoted_identifiers() {
    use TokenKind::*;
    assert_eq!(
        tokens(r#"'it''s' "a\"b" 'back\\' `we``ird` _utf8mb4'x' N'y' X'0F' b'01' _latin1"z""#),
        vec![
            (String, "'it''s'"),
            (String, r#""a\"b""#),
            (String, r"'back\\'"),
            (QuotedIdent, "`we``ird`"),
            (String, "_utf8mb4'x'"),
            (String, "N'y'"),
            (String, "X'0F'"),
            (String, "b'01'"),
            (String, "_latin1\"z\""),
        ]
    );
    // A backslash does not escape inside backquotes.
    assert_eq!(tokens(r"`a\` x"), vec![(QuotedIdent, r"`a\`"), (Word, "x")]);
}

#[test]
fn lexes_variables() {
    use TokenKind::*;
    assert_eq!(
        tokens("@a @a.b_c$ @'q v' @\"d\" @`e` @@x @@session.sql_mode @@GLOBAL.y 'u'@'h' @"),
        vec![
            (UserVar, "@a"),
            (UserVar, "@a.b_c$"),
            (UserVar, "@'q v'"),
            (UserVar, "@\"d\""),
            (UserVar, "@`e`"),
            (SysVar, "@@x"),
            (SysVar, "@@session.sql_mode"),
            (SysVar, "@@GLOBAL.y"),
            (String, "'u'"),
            (UserVar, "@'h'"),
            (Punct, "@"),
        ]
    );
}

#[test]
fn lexer_skips_comments() {
    use TokenKind::*;
    let sql = "a -- c1\nb #c2\nc /* c3 */ d --e /*+ hint */ f --\tg\n--";
    assert_eq!(
        tokens(sql),
        vec![
            (Word, "a"),
            (Word, "b"),
            (Word, "c"),
            (Word, "d"),
            (Punct, "-"),
            (Punct, "-"),
            (Word, "e"),
            (Word, "f")
        ]
    );
}

#[test]
fn lexer_reads_executable_comments_as_code() {
    use TokenKind::*;
    assert_eq!(
        tokens("/*!40101 SET x */"),
        vec![(Word, "SET"), (Word, "x")]
    );
    assert_eq!(tokens("/*!SET*/ a"), vec![(Word, "SET"), (Word, "a")]);
    // MariaDB reads `/*M!` with an uppercase M only: `/*m!` is a comment.
    assert_eq!(tokens("/*m! d*/"), vec![]);
    // Not a 5 or 6 digit version: the digits are code.
    assert_eq!(tokens("/*!1 */"), vec![(Number, "1")]);
    // Comments and strings inside executable comments.
    assert_eq!(
        tokens("/*!40101 f /* g */ 'h */' */ i"),
        vec![(Word, "f"), (String, "'h */'"), (Word, "i")]
    );
    // Outside an executable comment, `*/` is just punctuation.
    assert_eq!(
        tokens("j */"),
        vec![(Word, "j"), (Punct, "*"), (Punct, "/")]
    );
}

fn tokens_on(sql: &str, server: Server) -> (Vec<(TokenKind, &str)>, bool) {
    let mut lexer = Lexer::for_server(sql.as_bytes(), SqlMode::DEFAULT, server);
    let tokens = lexer
        .by_ref()
        .map(|t| {
            (
                t.kind,
                std::str::from_utf8(t.text).expect("test input is UTF-8"),
            )
        })
        .collect();
    (tokens, lexer.is_uncertain())
}

const MARIADB_10_11: Server = Server::mariadb(101119);

/// Issue 18, item 5: the lexer runs and skips executable comments as the server does.
#[test]
fn lexer_follows_the_servers_executable_comments() {
    use TokenKind::*;
    let m = MARIADB_10_11;
    let certain = |sql: &'static str, server: Server| {
        let (tokens, uncertain) = tokens_on(sql, server);
        assert!(!uncertain, "{sql}: uncertain on {server:?}");
        tokens
    };
    // Run: no version, versions up to the server's (5 digits below 5.7, or 6 digits).
    assert_eq!(certain("/*!a*/", m), vec![(Word, "a")]);
    assert_eq!(certain("/*!50699 a */", m), vec![(Word, "a")]);
    assert_eq!(certain("/*!101119 a */", m), vec![(Word, "a")]);
    assert_eq!(
        certain("/*M!100100 b */c", m),
        vec![(Word, "b"), (Word, "c")]
    );
    assert_eq!(certain("/*M!90000 b */", m), vec![(Word, "b")]);
    assert_eq!(certain("/*M! b */", m), vec![(Word, "b")]);
    // A seventh digit is code.
    assert_eq!(certain("/*!1011001*/", m), vec![(Number, "1")]);
    // Skipped: MySQL 5.7+ versions, later versions. Quotes and `--` inside mean nothing.
    let hidden = "SELECT 1 /*!90000 ' */, GET_LOCK('j',0) -- '";
    assert_eq!(
        certain(hidden, m),
        vec![
            (Word, "SELECT"),
            (Number, "1"),
            (Punct, ","),
            (Word, "GET_LOCK"),
            (Punct, "("),
            (String, "'j'"),
            (Punct, ","),
            (Number, "0"),
            (Punct, ")"),
        ]
    );
    assert_eq!(certain("/*!90000 -- */ x", m), vec![(Word, "x")]);
    assert_eq!(certain("/*!50700 a */ b", m), vec![(Word, "b")]);
    assert_eq!(certain("/*!101120 a */ b", m), vec![(Word, "b")]);
    assert_eq!(certain("/*M!110000 a */ b", m), vec![(Word, "b")]);
    // A comment nested in an executable one that runs is read as sql_lex.cc reads it,
    // but the text is uncertain (MySQL's reading changed across versions). In one that
    // MariaDB skips it is certain on MariaDB: the skip ends where the server's does
    // (`/*!101120 /* a */ , 2 */ , 6` is `, 6`; tried on 10.11.19), and a text that ends
    // inside is refused at parse (1064) like any unterminated comment.
    let uncertain = |sql: &'static str, server: Server| {
        let (tokens, uncertain) = tokens_on(sql, server);
        assert!(uncertain, "{sql}: certain on {server:?}");
        tokens
    };
    // A skipped comment holds one level of comment; a regular comment none.
    assert_eq!(certain("/*!99999 a /* b */ c */ d", m), vec![(Word, "d")]);
    assert_eq!(
        certain("/*!101120 /* a /* b */ c */ , 3 */", m),
        vec![(Punct, ","), (Number, "3"), (Punct, "*"), (Punct, "/")]
    );
    assert!(tokens_on("/*!99999 a /* b */ c */ d", Server::UNKNOWN).1);
    assert_eq!(
        certain("/* a /* b */ c */", m),
        vec![(Word, "c"), (Punct, "*"), (Punct, "/")]
    );
    // An executable comment run inside another: the first `*/` ends both.
    assert_eq!(
        uncertain("/*!40101 a /*!40101 b */ c */", m),
        vec![
            (Word, "a"),
            (Word, "b"),
            (Word, "c"),
            (Punct, "*"),
            (Punct, "/")
        ]
    );
    // Skipped inside a run one: the outer goes on.
    assert_eq!(
        uncertain("/*!40101 a /*!90000 b */ c */ d", m),
        vec![(Word, "a"), (Word, "c"), (Word, "d")]
    );
    // `/*+ ... */` hints are comments.
    assert_eq!(
        certain("SELECT /*+ 'x */ 1", m),
        vec![(Word, "SELECT"), (Number, "1")]
    );
    // `--` followed by a control character (DEL too) is a comment.
    assert_eq!(certain("a --x b", m).len(), 5);
    assert_eq!(certain("a --\u{7f} b", m), vec![(Word, "a")]);
    // Unterminated skipped comment: the stream ends.
    let mut lexer = Lexer::for_server(b"a /*!90000 b", SqlMode::DEFAULT, m);
    assert_eq!(lexer.by_ref().count(), 1);
    assert!(lexer.is_unterminated());

    // MySQL: `/*M!` is a comment; five-digit versions up to its own run.
    let my = Server::mysql(80036);
    assert_eq!(certain("/*M!100100 a */ b", my), vec![(Word, "b")]);
    assert_eq!(certain("/*M! a /* b */ c", my), vec![(Word, "c")]);
    assert_eq!(certain("/*!80036 a */", my), vec![(Word, "a")]);
    assert_eq!(certain("/*!80037 ' */ b", my), vec![(Word, "b")]);
    assert!(tokens_on("/*!100000 a */", my).1);

    // Servers that disagree, or not known: uncertain (read as code).
    let (t, uncertain) = tokens_on(hidden, Server::UNKNOWN);
    assert!(uncertain);
    assert_eq!(t.iter().filter(|(_, w)| *w == "GET_LOCK").count(), 0);
    assert!(tokens_on("/*M!100100 a */", Server::UNKNOWN).1);
    assert!(!tokens_on("/*!40101 a */", Server::UNKNOWN).1);
    assert!(!tokens_on("/*! a */", Server::UNKNOWN).1);
    let mixed = Server::mariadb(100611).or(MARIADB_10_11);
    assert!(tokens_on("/*M!100700 a */", mixed).1);
    assert!(!tokens_on("/*M!100500 a */", mixed).1);
    // Galera runs /*!99997.
    assert!(tokens_on("/*!99997 a */", m).1);
}

#[test]
fn uncertain_texts_are_classified_as_unknown_code() {
    let uncertain = |sql: &str, server: Server| {
        let flags = classify_for(sql.as_bytes(), SqlMode::DEFAULT, server);
        assert!(flags.has(C::UNCERTAIN | C::WRITE), "{sql}: {flags}");
        assert!(!flags.is_read_only(), "{sql}: {flags}");
        assert!(flags.changes_session(), "{sql}: {flags}");
        assert!(flags.intersects(C::MAY_COMMIT), "{sql}: {flags}");
    };
    uncertain(
        "SELECT 1 /*!90000 ' */, GET_LOCK('j',0) -- '",
        Server::UNKNOWN,
    );
    uncertain("SELECT 1 /*M!100700 , 2 */", Server::UNKNOWN);
    uncertain("SELECT 1 /*!99997 , 2 */", MARIADB_10_11);
    // A comment nested in an executable one that runs: uncertain.
    uncertain(
        "SELECT 1 /*!100000 /* nested? */ , 2 */; SELECT 3",
        MARIADB_10_11,
    );
    // Skipped (a five-digit version from 5.7 on is MySQL's), never closed: refused at
    // parse, whatever runs it (tried: 1064).
    let flags = classify_for(
        b"/*!50700 /* nested? */ SELECT 2",
        SqlMode::DEFAULT,
        MARIADB_10_11,
    );
    assert!(!flags.has(C::UNCERTAIN), "{flags}");
    // Nested in a skipped one, on MariaDB: certain (seed 2041 session 177). The first
    // statement runs; the second ends inside the comment and is refused at parse (tried:
    // the row of the first is in).
    let sql = "INSERT INTO t VALUES (6) /* plain */; /*!101120 /* nested? */ INSERT INTO t VALUES (7); UPDATE t SET v = 1";
    let flags = classify_for(sql.as_bytes(), SqlMode::DEFAULT, MARIADB_10_11);
    assert!(
        !flags.has(C::UNCERTAIN) && flags.has(C::WRITE),
        "{sql}: {flags}"
    );
    uncertain(sql, Server::UNKNOWN);
    // With the server known, the same texts are certain.
    let flags = classify_for(
        b"SELECT 1 /*!90000 ' */, GET_LOCK('j',0) -- '",
        SqlMode::DEFAULT,
        MARIADB_10_11,
    );
    assert_eq!(flags, C::GET_LOCK | C::FUNCTION_CALL | C::WRITE);
    let flags = classify_for(
        b"SELECT 1 /*!90000 -- */ , GET_LOCK('jj',0)",
        SqlMode::DEFAULT,
        MARIADB_10_11,
    );
    assert_eq!(flags, C::GET_LOCK | C::FUNCTION_CALL | C::WRITE);
    let flags = classify_for(
        b"SELECT 1 /*M!100700 , 2 */",
        SqlMode::DEFAULT,
        MARIADB_10_11,
    );
    assert_eq!(flags, C::READ_ONLY);
    // The first keyword behind an uncertain comment is not known; after it, it is.
    assert_eq!(first_keyword(b"/*M!100100 ROLLBACK; */ COMMIT"), None);
    assert_eq!(
        first_keyword(b"ROLLBACK /*M!100100 ; COMMIT */"),
        Some(&b"ROLLBACK"[..])
    );
    // A KILL behind one is not rewritten.
    assert_eq!(
        crate::parse_kill(b"KILL /*!90000 QUERY */ 5", SqlMode::DEFAULT),
        None
    );
}

#[test]
fn lexer_stops_at_unterminated_input() {
    for sql in [
        "SELECT 'abc",
        "SELECT \"abc\\",
        "SELECT `abc",
        "SELECT /* abc",
        "SELECT @'a",
        "SELECT N'",
        "/*!40101 /*",
    ] {
        let mut lexer = Lexer::new(sql.as_bytes());
        assert!(
            lexer.next().is_some_and(|t| t.is_word("select")) || sql.starts_with("/*!"),
            "{sql}"
        );
        assert_eq!(lexer.by_ref().count(), 0, "{sql}");
        assert!(lexer.is_unterminated(), "{sql}");
        assert_eq!(lexer.next(), None);
    }
    let mut lexer = Lexer::new(b"SELECT 'ok' -- trailing");
    assert_eq!(lexer.by_ref().count(), 2);
    assert!(!lexer.is_unterminated());
}

#[test]
fn token_helpers() {
    let toks: Vec<_> = Lexer::new(b"  sElEcT `a``b`").collect();
    assert!(toks[0].is_word("SELECT"));
    assert_eq!((toks[0].offset, toks[0].end()), (2, 8));
    assert_eq!(toks[1].ident(), Some(&b"a``b"[..]));
    assert_eq!(toks[0].ident(), Some(&b"sElEcT"[..]));
}

// ---------------------------------------------------------------- splitting

#[test]
fn splits_statements() {
    assert_eq!(
        statements("SELECT 1; SELECT 2"),
        vec!["SELECT 1", "SELECT 2"]
    );
    assert_eq!(statements(" ;; SELECT 1 ;\n ; -- c\n;"), vec!["SELECT 1"]);
    assert_eq!(
        statements("SELECT ';' ; SELECT \";\" # ;\n; SELECT `;`"),
        vec!["SELECT ';'", "SELECT \";\" # ;", "SELECT `;`"]
    );
    assert_eq!(statements("/* a; */ SELECT 1"), vec!["/* a; */ SELECT 1"]);
    assert_eq!(statements(""), Vec::<&str>::new());
    assert_eq!(statements("/* only a comment */"), Vec::<&str>::new());
    assert_eq!(
        statements("SELECT 'unterminated; SELECT 2"),
        vec!["SELECT 'unterminated; SELECT 2"]
    );
}

#[test]
fn does_not_split_compound_statements() {
    let proc = "CREATE PROCEDURE p(IN a INT) BEGIN DECLARE x INT; IF a > 0 THEN SET x = 1; ELSE SET x = 2; END IF; \
                WHILE x < 10 DO SET x = x + 1; END WHILE; SELECT CASE WHEN x THEN 1 ELSE 2 END; \
                lbl: LOOP LEAVE lbl; END LOOP; SELECT REPEAT('a', 2); END";
    assert_eq!(
        statements(&format!("{proc}; SELECT 2")),
        vec![proc, "SELECT 2"]
    );

    let trigger = "CREATE DEFINER=`root`@`%` TRIGGER tr BEFORE INSERT ON t FOR EACH ROW BEGIN SET NEW.a = 1; END";
    assert_eq!(
        statements(&format!("{trigger};DO 1")),
        vec![trigger, "DO 1"]
    );

    let anon = "BEGIN NOT ATOMIC DECLARE i INT DEFAULT 0; REPEAT SET i = i + 1; UNTIL i > 3 END REPEAT; END";
    assert_eq!(
        statements(&format!("{anon}; SELECT 1")),
        vec![anon, "SELECT 1"]
    );

    let top_if = "IF @a > 1 THEN SELECT 1; ELSE SELECT 2; END IF";
    assert_eq!(
        statements(&format!("{top_if}; SELECT 3")),
        vec![top_if, "SELECT 3"]
    );

    // A routine whose body is a single statement, and a table named like a keyword.
    assert_eq!(
        statements("CREATE PROCEDURE p() SELECT 1; SELECT 2").len(),
        2
    );
    assert_eq!(
        statements("CREATE TABLE event (begin INT); SELECT 2").len(),
        2
    );
    assert_eq!(statements("BEGIN; SELECT 1; COMMIT").len(), 3);
}

// ---------------------------------------------------------------- classification

#[test]
fn read_only_statements() {
    for sql in [
        "SELECT 1",
        "select * from t where a = 'x'",
        "  (SELECT 1)",
        "((SELECT 1) UNION (SELECT 2))",
        "WITH cte AS (SELECT 1) SELECT * FROM cte",
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5) SELECT * FROM c",
        "SHOW TABLES",
        "show variables like 'x%'",
        "DESCRIBE t",
        "DESC t",
        "EXPLAIN SELECT 1",
        "EXPLAIN DELETE FROM t",
        "EXPLAIN FORMAT=JSON UPDATE t SET a = 1",
        "HELP 'contents'",
        "VALUES ROW(1, 2)",
        "TABLE t",
        "SELECT @a, @@session.sql_mode, @@x",
        "SELECT @a = 1",
        "SELECT INSERT('abc', 1, 1, 'x'), REPLACE('a', 'a', 'b')",
        "SELECT t.insert, t.update, t.into FROM t",
        "SELECT 1 -- SET @a = 1",
        "SELECT 1 # ; SET @a = 1",
        "/* SET @a=1 */ SELECT 1",
        "SELECT /*+ MAX_EXECUTION_TIME(1000) */ a FROM t",
        "SELECT /*!40001 SQL_NO_CACHE */ a FROM t",
        "SELECT 'BEGIN; SET @a=1'",
        "SELECT \"FOR UPDATE\", `into`",
        "SELECT 1; SELECT 2",
        "SELECT COUNT(*), MAX(a), CONCAT(b, 'x'), CAST(c AS DECIMAL(10, 2)) FROM t",
        "SELECT NOW(), RAND(), UUID()",
    ] {
        let got = classify(sql.as_bytes());
        let expected = if got.has(C::MULTI) { C::READ_ONLY | C::MULTI } else { C::READ_ONLY };
        assert_eq!(got, expected, "{sql:?}: got {got}");
    }
    assert_flags("SELECT 1; SELECT 2", C::READ_ONLY | C::MULTI);
    // Reads that call what holdfast cannot vouch for.
    for sql in [
        "SELECT LAST_INSERT_ID()",
        "SELECT IS_FREE_LOCK('x'), IS_USED_LOCK('x')",
        "SELECT PREVIOUS VALUE FOR s",
        "SELECT db.get_lock(1)",
    ] {
        assert_flags(sql, C::READ_ONLY | C::FUNCTION_CALL);
    }
}

#[test]
fn writes() {
    for sql in [
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET a = 1",
        "DELETE FROM t",
        "REPLACE INTO t VALUES (1)",
        "DO 1",
        "DO SLEEP(1)",
        "SELECT SLEEP(1)",
        "SELECT * FROM t INTO OUTFILE '/tmp/x'",
        "SELECT NEXTVAL(s)",
        "SELECT NEXT VALUE FOR s",
        "SELECT MASTER_POS_WAIT('f', 4)",
        "WITH c AS (SELECT 1) UPDATE t, c SET t.a = 1",
        "WITH c AS (SELECT 1) DELETE FROM t",
        "EXPLAIN ANALYZE SELECT SLEEP(1)",
        "ANALYZE FORMAT=JSON DELETE FROM t",
        "SIGNAL SQLSTATE '45000'",
        "CHECKSUM TABLE t",
        "42",
        "garbage words here",
    ] {
        let got = classify(sql.as_bytes());
        assert!(
            got.has(C::WRITE) && !got.has(C::READ_ONLY),
            "{sql:?}: got {got}"
        );
    }
    assert_flags("INSERT INTO t VALUES (1)", C::WRITE);
    assert_flags("SELECT 1; DELETE FROM t", C::WRITE | C::MULTI);
    assert_flags("EXPLAIN ANALYZE SELECT 1", C::READ_ONLY);
    assert_flags("DESC ANALYZE FORMAT=TREE SELECT 1", C::READ_ONLY);
    assert_flags("ANALYZE SELECT 1", C::READ_ONLY);
    assert_flags("ANALYZE TABLE t", C::WRITE | C::IMPLICIT_COMMIT);
}

#[test]
fn empty_text_has_no_flags() {
    for sql in ["", "   ", ";", " ; ;", "-- only\n", "/* x */", "# y"] {
        assert_flags(sql, C::EMPTY);
    }
}

#[test]
fn set_session_variables() {
    for sql in [
        "SET sql_mode = ''",
        "SET SESSION sql_mode = ''",
        "set local sql_mode = ''",
        "SET @@sql_mode = ''",
        "SET @@session.sql_mode = ''",
        "SET @@LOCAL.sql_mode = ''",
        "SET NAMES utf8mb4",
        "SET NAMES 'utf8mb4' COLLATE 'utf8mb4_bin'",
        "SET CHARACTER SET utf8",
        "SET CHARSET utf8",
        "SET `sql_mode` = ''",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET ROLE ALL",
        "SET RESOURCE GROUP rg",
        "SET GLOBAL a = 1, SESSION b = 2",
        "SET GLOBAL a = 1, @@b = 2",
        "/*!40101 SET NAMES utf8 */",
        "/*!40103 SET TIME_ZONE='+00:00' */",
    ] {
        assert_has(sql, C::SET_SESSION_VAR | C::WRITE);
    }
    assert_flags("SET NAMES utf8", C::SET_SESSION_VAR | C::WRITE);
    for sql in [
        "SET GLOBAL max_connections = 10",
        "SET @@global.max_connections = 10",
        "SET PERSIST max_connections = 10",
        "SET @@persist_only.x = 1",
        "SET GLOBAL a = 1, b = 2",
        "SET GLOBAL TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET PASSWORD = 'x'",
        "SET PASSWORD FOR u@h = PASSWORD('x')",
        "SET DEFAULT ROLE r TO u",
        "SET @a = 1",
        "SELECT @@sql_mode",
    ] {
        assert_lacks(sql, C::SET_SESSION_VAR);
    }
    assert_flags("SET GLOBAL max_connections = 10", C::WRITE);
    assert_flags("SET PASSWORD = 'x'", C::WRITE | C::IMPLICIT_COMMIT);
}

#[test]
fn set_user_variables() {
    for sql in [
        "SET @a = 1",
        "set @`a b` := 2",
        "SET @'x' = 1",
        "SET sql_mode = '', @a = (SELECT 1, 2)",
        "SELECT 1 INTO @a",
        "SELECT a, b FROM t LIMIT 1 INTO @x, @y",
        "SELECT @a := 1",
        "SELECT @a:=@a+1 FROM t",
        "UPDATE t SET a = @n := @n + 1",
        "DO @a := 1",
        "GET DIAGNOSTICS @n = NUMBER",
        "GET CURRENT DIAGNOSTICS CONDITION 1 @e = MYSQL_ERRNO, @m = MESSAGE_TEXT",
        "/*!40101 SET @a = 1 */",
    ] {
        assert_has(sql, C::SET_USER_VAR | C::WRITE);
    }
    assert_flags("SET @a = 1", C::SET_USER_VAR | C::WRITE);
    assert_flags("SELECT 1 INTO @a", C::SET_USER_VAR | C::WRITE);
    assert_lacks("SET sql_mode = ''", C::SET_USER_VAR);
    assert_lacks("SELECT @a = 1, @a", C::SET_USER_VAR);
    assert_flags(
        "SET @a = 1, sql_mode = ''",
        C::SET_USER_VAR | C::SET_SESSION_VAR | C::WRITE,
    );
}

#[test]
fn autocommit() {
    for sql in [
        "SET autocommit = 0",
        "set AUTOCOMMIT=1",
        "SET @@autocommit = OFF",
        "SET SESSION autocommit = 1",
        "SET @@session.autocommit=0",
        "SET sql_mode='', autocommit=0",
    ] {
        assert_has(sql, C::AUTOCOMMIT | C::SET_SESSION_VAR);
    }
    assert_flags(
        "SET autocommit = 0",
        C::AUTOCOMMIT | C::SET_SESSION_VAR | C::WRITE,
    );
    assert_lacks(
        "SET GLOBAL autocommit = 0",
        C::AUTOCOMMIT | C::SET_SESSION_VAR,
    );
    assert_lacks("SET @@global.autocommit = 0", C::AUTOCOMMIT);
    assert_lacks("SET @autocommit = 0", C::AUTOCOMMIT);
    assert_lacks("SELECT @@autocommit", C::AUTOCOMMIT);
}

#[test]
fn set_transaction() {
    assert_flags(
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
        C::SET_TRANSACTION | C::WRITE,
    );
    assert_flags(
        "SET TRANSACTION READ ONLY, ISOLATION LEVEL SERIALIZABLE",
        C::SET_TRANSACTION | C::WRITE,
    );
    assert_flags(
        "SET SESSION TRANSACTION READ WRITE",
        C::SET_SESSION_VAR | C::WRITE,
    );
    assert_flags("SET GLOBAL TRANSACTION READ WRITE", C::WRITE);
}

#[test]
fn set_statement_classifies_the_inner_statement() {
    assert_flags(
        "SET STATEMENT max_statement_time=1 FOR SELECT 1",
        C::READ_ONLY,
    );
    assert_flags("SET STATEMENT a=1, b=(1) FOR UPDATE t SET x = 1", C::WRITE);
    assert_flags(
        "SET STATEMENT sql_mode='' FOR SELECT @a := 1",
        C::WRITE | C::SET_USER_VAR,
    );
}

#[test]
fn use_db() {
    assert_flags("USE db", C::USE_DB | C::WRITE);
    assert_flags("use `my db`", C::USE_DB | C::WRITE);
}

#[test]
fn transactions() {
    for sql in [
        "BEGIN",
        "begin work",
        "START TRANSACTION",
        "START TRANSACTION READ ONLY",
        "start transaction with consistent snapshot",
    ] {
        assert_flags(sql, C::BEGIN_TXN | C::WRITE);
    }
    for sql in [
        "COMMIT",
        "commit work",
        "ROLLBACK",
        "ROLLBACK WORK",
        "COMMIT AND NO CHAIN",
        "ROLLBACK RELEASE",
    ] {
        assert_flags(sql, C::END_TXN | C::WRITE);
    }
    assert_flags("COMMIT AND CHAIN", C::END_TXN | C::BEGIN_TXN | C::WRITE);
    assert_flags(
        "ROLLBACK WORK AND CHAIN",
        C::END_TXN | C::BEGIN_TXN | C::WRITE,
    );
    assert_flags(
        "BEGIN; INSERT INTO t VALUES (1); COMMIT",
        C::BEGIN_TXN | C::END_TXN | C::WRITE | C::MULTI,
    );
    assert_lacks("BEGIN NOT ATOMIC SELECT 1; END", C::BEGIN_TXN);
    assert_flags("BEGIN NOT ATOMIC SELECT 1; END", C::COMPOUND | C::WRITE);
}

#[test]
fn savepoints() {
    for sql in [
        "SAVEPOINT s",
        "RELEASE SAVEPOINT s",
        "ROLLBACK TO s",
        "ROLLBACK TO SAVEPOINT s",
        "rollback work to savepoint s",
    ] {
        assert_flags(sql, C::SAVEPOINT | C::WRITE);
    }
}

#[test]
fn implicit_commit() {
    for sql in [
        "CREATE TABLE t (a INT)",
        "CREATE OR REPLACE TABLE t (a INT)",
        "CREATE TABLE t AS SELECT 1",
        "CREATE INDEX i ON t (a)",
        "CREATE VIEW v AS SELECT 1 INTO @a",
        "CREATE USER u",
        "ALTER TABLE t ADD COLUMN b INT",
        "DROP TABLE t",
        "DROP DATABASE d",
        "RENAME TABLE a TO b",
        "TRUNCATE TABLE t",
        "GRANT SELECT ON *.* TO u",
        "REVOKE ALL ON *.* FROM u",
        "FLUSH PRIVILEGES",
        "RESET MASTER",
        "OPTIMIZE TABLE t",
        "REPAIR TABLE t",
        "CHECK TABLE t",
        "LOAD INDEX INTO CACHE t",
        "CHANGE MASTER TO MASTER_HOST='h'",
        "STOP SLAVE",
        "START REPLICA",
        "INSTALL PLUGIN p SONAME 'p.so'",
    ] {
        assert_flags(sql, C::IMPLICIT_COMMIT | C::WRITE);
    }
    assert_flags(
        "CREATE TABLE t AS SELECT GET_LOCK('x', 1)",
        C::IMPLICIT_COMMIT | C::GET_LOCK | C::WRITE,
    );
    assert_lacks("CREATE TEMPORARY TABLE t (a INT)", C::IMPLICIT_COMMIT);
}

#[test]
fn temporary_tables() {
    assert_flags(
        "CREATE TEMPORARY TABLE t (a INT)",
        C::CREATE_TEMP_TABLE | C::WRITE,
    );
    assert_flags(
        "create or replace temporary table t select 1",
        C::CREATE_TEMP_TABLE | C::WRITE,
    );
    assert_flags(
        "CREATE TEMPORARY TABLE IF NOT EXISTS t LIKE u",
        C::CREATE_TEMP_TABLE | C::WRITE,
    );
    assert_flags("DROP TEMPORARY TABLE t", C::DROP_TEMP_TABLE | C::WRITE);
    assert_flags(
        "DROP TEMPORARY TABLE IF EXISTS t",
        C::DROP_TEMP_TABLE | C::WRITE,
    );
}

#[test]
fn prepared_statements() {
    assert_flags(
        "PREPARE s FROM 'SELECT GET_LOCK(1, 2); SET @a = 1'",
        C::PREPARE_SQL | C::WRITE,
    );
    assert_flags("PREPARE s FROM @sql", C::PREPARE_SQL | C::WRITE);
    assert_flags("EXECUTE s USING @a, @b", C::EXECUTE_SQL | C::WRITE);
    assert_flags("EXECUTE IMMEDIATE 'SELECT 1'", C::EXECUTE_SQL | C::WRITE);
    assert_flags("DEALLOCATE PREPARE s", C::DEALLOCATE_SQL | C::WRITE);
    assert_flags("DROP PREPARE s", C::DEALLOCATE_SQL | C::WRITE);
}

#[test]
fn table_and_instance_locks() {
    for sql in [
        "LOCK TABLES t READ",
        "lock table t write, u read",
        "LOCK INSTANCE FOR BACKUP",
    ] {
        assert_flags(sql, C::LOCK_TABLES | C::IMPLICIT_COMMIT | C::WRITE);
    }
    for sql in ["UNLOCK TABLES", "unlock table", "UNLOCK INSTANCE"] {
        assert_flags(sql, C::UNLOCK_TABLES | C::IMPLICIT_COMMIT | C::WRITE);
    }
    assert_flags(
        "FLUSH TABLES WITH READ LOCK",
        C::LOCK_TABLES | C::IMPLICIT_COMMIT | C::WRITE,
    );
    assert_flags(
        "FLUSH TABLES t1, t2 FOR EXPORT",
        C::LOCK_TABLES | C::IMPLICIT_COMMIT | C::WRITE,
    );
    assert_flags("FLUSH TABLES", C::IMPLICIT_COMMIT | C::WRITE);
    assert_flags("BACKUP LOCK t", C::LOCK_TABLES | C::WRITE);
    assert_flags("BACKUP UNLOCK", C::UNLOCK_TABLES | C::WRITE);
    assert_flags("BACKUP STAGE START", C::LOCK_TABLES | C::WRITE);
    assert_flags("BACKUP STAGE END", C::UNLOCK_TABLES | C::WRITE);
}

#[test]
fn named_locks() {
    let call = C::FUNCTION_CALL | C::WRITE;
    assert_flags("SELECT GET_LOCK('x', 10)", C::GET_LOCK | call);
    assert_flags("select get_lock ('x', 10) as l", C::GET_LOCK | call);
    assert_flags("DO GET_LOCK('x', 1)", C::GET_LOCK | C::WRITE);
    assert_flags("SELECT RELEASE_LOCK('x')", C::RELEASE_LOCK | call);
    assert_flags("SELECT RELEASE_ALL_LOCKS()", C::RELEASE_LOCK | call);
    assert_flags(
        "INSERT INTO t VALUES (GET_LOCK('x', 1))",
        C::GET_LOCK | C::WRITE,
    );
    assert_flags("SELECT 'GET_LOCK(1)', get_lock", C::READ_ONLY);
    assert_flags("EXPLAIN SELECT GET_LOCK('x', 1)", C::READ_ONLY);
}

#[test]
fn xa() {
    for sql in [
        "XA START 'x'",
        "XA BEGIN 'x'",
        "XA END 'x'",
        "XA PREPARE 'x'",
        "XA COMMIT 'x'",
        "xa rollback 'x'",
    ] {
        assert_flags(sql, C::XA | C::WRITE);
    }
}

#[test]
fn load_data_local() {
    for sql in [
        "LOAD DATA LOCAL INFILE 'f' INTO TABLE t",
        "LOAD DATA LOW_PRIORITY LOCAL INFILE 'f' INTO TABLE t",
        "load xml local infile 'f' into table t",
    ] {
        assert_flags(sql, C::LOAD_DATA_LOCAL | C::WRITE);
    }
    assert_flags("LOAD DATA INFILE 'f' INTO TABLE t", C::WRITE);
    assert_flags(
        "LOAD DATA INFILE 'f' INTO TABLE t CHARACTER SET local",
        C::WRITE,
    );
}

#[test]
fn call_handler_kill_shutdown() {
    assert_flags("CALL p(1, 2)", C::CALL | C::WRITE);
    assert_flags("CALL p(@a := 1)", C::CALL | C::SET_USER_VAR | C::WRITE);
    assert_flags("HANDLER t OPEN", C::HANDLER | C::WRITE);
    assert_flags("HANDLER t READ FIRST", C::HANDLER | C::WRITE);
    assert_flags("KILL 42", C::KILL | C::WRITE);
    assert_flags("KILL QUERY 42", C::KILL | C::WRITE);
    assert_flags("SHUTDOWN", C::SHUTDOWN | C::WRITE);
    assert_flags("RESTART", C::SHUTDOWN | C::WRITE);
}

#[test]
fn locking_reads() {
    for sql in [
        "SELECT * FROM t FOR UPDATE",
        "SELECT * FROM t WHERE a = 1 for update skip locked",
        "SELECT * FROM t FOR SHARE",
        "SELECT * FROM t LOCK IN SHARE MODE",
        "(SELECT * FROM t FOR UPDATE)",
    ] {
        assert_flags(sql, C::SELECT_FOR_UPDATE | C::WRITE);
    }
    assert_flags("SELECT 'FOR UPDATE' FROM t", C::READ_ONLY);
    assert_flags(
        "INSERT INTO t SELECT * FROM u FOR UPDATE",
        C::SELECT_FOR_UPDATE | C::WRITE,
    );
}

#[test]
fn last_insert_id() {
    // Without an argument it only reads, but what it reads is the connection's.
    assert_flags("SELECT LAST_INSERT_ID()", C::READ_ONLY | C::FUNCTION_CALL);
    assert_flags(
        "SELECT LAST_INSERT_ID(5)",
        C::LAST_INSERT_ID_CALL | C::FUNCTION_CALL | C::WRITE,
    );
    assert_flags(
        "UPDATE t SET id = LAST_INSERT_ID(id + 1)",
        C::LAST_INSERT_ID_CALL | C::WRITE,
    );
}

#[test]
fn multi_statements() {
    assert_flags(
        "SET @a = 1; SELECT @a",
        C::SET_USER_VAR | C::WRITE | C::MULTI,
    );
    assert_flags("SELECT 1;", C::READ_ONLY);
    assert_flags(";SELECT 1;;", C::READ_ONLY);
    // A statement of comments only is one the server answers (an empty OK).
    assert_flags("SELECT 1; -- nothing\n", C::READ_ONLY | C::MULTI);
    assert_flags(
        "SELECT 1; /*!40101 SET NAMES utf8 */",
        C::SET_SESSION_VAR | C::WRITE | C::MULTI,
    );
    assert_flags("SELECT 'a;b'; SELECT `c;d`", C::READ_ONLY | C::MULTI);
    assert_flags(
        "USE d; SET autocommit=0; LOCK TABLES t WRITE",
        C::USE_DB
            | C::SET_SESSION_VAR
            | C::AUTOCOMMIT
            | C::LOCK_TABLES
            | C::IMPLICIT_COMMIT
            | C::WRITE
            | C::MULTI,
    );
    assert_flags(
        "CREATE PROCEDURE p() BEGIN SET @a = 1; SELECT GET_LOCK('x', 1); END",
        C::IMPLICIT_COMMIT | C::WRITE,
    );
}

#[test]
fn comments_and_strings_hide_keywords() {
    assert_flags("/* SET @a=1 */ SELECT 1", C::READ_ONLY);
    assert_flags("SELECT 1 /* ; SET @a=1 */", C::READ_ONLY);
    assert_flags("SELECT 'BEGIN; SET @a=1'", C::READ_ONLY);
    assert_flags("SELECT \"x\\\"; SET @a=1\"", C::READ_ONLY);
    assert_flags("SELECT 'it''s; SET @a=1'", C::READ_ONLY);
    assert_flags("-- BEGIN\nSELECT 1", C::READ_ONLY);
    assert_flags("--\tBEGIN\nSELECT 1", C::READ_ONLY);
    assert_flags("# BEGIN\nSELECT 1", C::READ_ONLY);
    assert_flags("/*+ SET_VAR(sql_mode='') */ SELECT 1", C::READ_ONLY);
    // Versioned comments are code.
    assert_flags("/*!40101 SET NAMES utf8 */", C::SET_SESSION_VAR | C::WRITE);
    assert_flags("/*!50100 BEGIN */", C::BEGIN_TXN | C::WRITE);
    assert_flags(
        "/*M!100100 SET @a = 1 */",
        C::SET_USER_VAR | C::WRITE | C::UNCERTAIN,
    );
    assert_flags(
        "SELECT 1 /*!50000 FOR UPDATE */",
        C::SELECT_FOR_UPDATE | C::WRITE,
    );
}

#[test]
fn escapes_and_operators_do_not_confuse_the_lexer() {
    assert_flags(r"SELECT 'a\'; SET @a=1'", C::READ_ONLY);
    assert_flags("SELECT 1--1", C::READ_ONLY);
    assert_flags(
        "SELECT 1 FROM t WHERE x = 'a' -- ; DROP TABLE t",
        C::READ_ONLY,
    );
    assert_eq!(
        statements("SELECT `a``;b`; SELECT 2"),
        vec!["SELECT `a``;b`", "SELECT 2"]
    );
    assert_eq!(statements("SELECT 'x'';'; SELECT 2").len(), 2);
}

#[test]
fn case_insensitive() {
    assert_flags("sElEcT 1", C::READ_ONLY);
    assert_flags("Set NaMeS utf8", C::SET_SESSION_VAR | C::WRITE);
    assert_flags("start Transaction", C::BEGIN_TXN | C::WRITE);
    assert_flags(
        "Lock Tables t Read",
        C::LOCK_TABLES | C::IMPLICIT_COMMIT | C::WRITE,
    );
    assert_flags(
        "select Get_Lock('a', 1)",
        C::GET_LOCK | C::FUNCTION_CALL | C::WRITE,
    );
}

#[test]
fn leading_whitespace_and_parentheses() {
    assert_flags(" \t\r\n SELECT 1", C::READ_ONLY);
    assert_flags("(((SELECT 1)))", C::READ_ONLY);
    assert_flags("( SELECT 1 INTO @a )", C::SET_USER_VAR | C::WRITE);
    assert_eq!(first_keyword(b"  ((select 1))"), Some(&b"select"[..]));
    assert_eq!(
        first_keyword(b"; /* c */ /*!40101 SET x=1 */"),
        Some(&b"SET"[..])
    );
    assert_eq!(first_keyword(b"'str'"), None);
    assert_eq!(first_keyword(b"  -- nothing"), None);
}

#[test]
fn compound_statements() {
    assert_flags("IF @a THEN SELECT 1; END IF", C::COMPOUND | C::WRITE);
    assert_flags(
        "lbl: BEGIN NOT ATOMIC SELECT 1; END",
        C::COMPOUND | C::WRITE,
    );
    assert_flags(
        "BEGIN NOT ATOMIC SELECT GET_LOCK('x', 1); END",
        C::COMPOUND | C::GET_LOCK | C::WRITE,
    );
}

#[test]
fn changes_session_union() {
    for sql in [
        "SET NAMES utf8",
        "SET @a = 1",
        "USE d",
        "PREPARE s FROM 'x'",
        "DEALLOCATE PREPARE s",
        "CREATE TEMPORARY TABLE t (a INT)",
        "DROP TEMPORARY TABLE t",
        "LOCK TABLES t READ",
        "SELECT GET_LOCK('x', 1)",
        "SET TRANSACTION READ ONLY",
        "CALL p()",
        "XA START 'x'",
        "HANDLER t OPEN",
        "SELECT LAST_INSERT_ID(1)",
    ] {
        assert!(classify(sql.as_bytes()).changes_session(), "{sql}");
    }
    for sql in [
        "SELECT 1",
        "INSERT INTO t VALUES (1)",
        "BEGIN",
        "COMMIT",
        "CREATE TABLE t (a INT)",
        "SET GLOBAL x = 1",
    ] {
        assert!(!classify(sql.as_bytes()).changes_session(), "{sql}");
    }
}

#[test]
fn classification_helpers() {
    let c = C::READ_ONLY | C::MULTI;
    assert!(c.has(C::READ_ONLY) && c.has(C::MULTI) && c.has(c));
    assert!(!c.has(C::WRITE) && !c.has(C::EMPTY) && !c.has(C::READ_ONLY | C::WRITE));
    assert!(c.intersects(C::READ_ONLY | C::WRITE));
    assert_eq!(c.to_string(), "READ_ONLY|MULTI");
    assert_eq!(C::EMPTY.to_string(), "EMPTY");
    assert_eq!(c & C::MULTI, C::MULTI);
    assert_eq!(c.difference(C::MULTI), C::READ_ONLY);
    assert_eq!(C::from_bits(c.bits), c);
    // Every flag is a distinct single bit.
    let mut all = 0u32;
    for (name, flag) in C::FLAGS {
        assert_eq!(flag.bits.count_ones(), 1, "{name}");
        assert_eq!(all & flag.bits, 0, "{name}");
        all |= flag.bits;
    }
}

#[test]
fn handles_non_utf8_input() {
    assert_flags("SELECT '\u{e9}'", C::READ_ONLY);
    assert_eq!(classify(b"SELECT '\xff\xfe' FROM \xe9t\xe9"), C::READ_ONLY);
    assert_eq!(classify(b"\xff\xfeSET @a = 1"), C::WRITE);
    assert_eq!(classify(b"SET \xff = 1"), C::SET_SESSION_VAR | C::WRITE);
}

/// Pseudo-random inputs (xorshift, fixed seed): nothing panics and everything terminates,
/// and the split ranges are ordered, in bounds and non-empty.
#[test]
fn random_inputs_never_panic() {
    const ALPHABET: &[&[u8]] = &[
        b"'",
        b"\"",
        b"`",
        b"\\",
        b";",
        b"/*",
        b"*/",
        b"/*!",
        b"/*M!",
        b"50100",
        b"90000",
        b"101100",
        b"/*+",
        b"--",
        b"-- ",
        b"#",
        b"\n",
        b" ",
        b"@",
        b"@@",
        b"(",
        b")",
        b",",
        b".",
        b":=",
        b"=",
        b"0x",
        b"1",
        b"e",
        b"SELECT",
        b"SET",
        b"BEGIN",
        b"END",
        b"IF",
        b"CASE",
        b"NOT",
        b"ATOMIC",
        b"CREATE",
        b"PROCEDURE",
        b"FOR",
        b"UPDATE",
        b"INTO",
        b"GET_LOCK",
        b"`GET_LOCK`",
        b"\"SLEEP\"",
        b"f",
        b"COUNT",
        b"nextval",
        b"GLOBAL",
        b"STATEMENT",
        b"EXPLAIN",
        b"ANALYZE",
        b"WITH",
        b"N",
        b"_utf8",
        b"\xff",
        b"\x00",
        b"\xc3\xa9",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut buf = Vec::with_capacity(256);
    for i in 0..100_000 {
        buf.clear();
        let len = (rand() % 40) as usize;
        for _ in 0..len {
            let r = rand();
            if i % 2 == 0 {
                buf.push(r as u8);
            } else {
                buf.extend_from_slice(ALPHABET[(r % ALPHABET.len() as u64) as usize]);
            }
        }
        let c = classify(&buf);
        assert!(
            c.is_empty() || c.has(C::READ_ONLY) != c.has(C::WRITE),
            "{buf:?}: {c}"
        );
        let _ = first_keyword(&buf);
        for server in [MARIADB_10_11, Server::mysql(80036), Server::UNKNOWN] {
            let c = classify_for(&buf, SqlMode::DEFAULT, server);
            assert!(
                c.is_empty() || c.has(C::READ_ONLY) != c.has(C::WRITE),
                "{buf:?} {server:?}: {c}"
            );
            assert!(!c.has(C::UNCERTAIN) || c.has(C::WRITE), "{buf:?}: {c}");
            let _ = crate::read_route(&buf, c, SqlMode::DEFAULT, server);
        }
        let mut last_end = 0;
        let mut count = 0;
        for range in split_statements(&buf) {
            assert!(
                range.start >= last_end && range.start < range.end && range.end <= buf.len(),
                "{buf:?}"
            );
            last_end = range.end;
            count += 1;
            assert!(count <= buf.len(), "{buf:?}");
        }
        // (A statement of comments only is not one of the ranges, but makes a
        // multi-statement.)
        assert!(count <= 1 || c.has(C::MULTI), "{buf:?}");
        assert!(count >= 1 || !c.has(C::MULTI), "{buf:?}");
        for mode in [SqlMode::DEFAULT, ANSI, NBE, BOTH] {
            let c = classify_with(&buf, mode);
            assert!(
                c.is_empty() || c.has(C::READ_ONLY) != c.has(C::WRITE),
                "{buf:?} {mode:?}: {c}"
            );
            let mut tokens = 0;
            let mut last = 0;
            for tok in Lexer::with_mode(&buf, mode) {
                assert!(
                    !tok.text.is_empty() && tok.offset >= last && tok.end() <= buf.len(),
                    "{buf:?} {mode:?}"
                );
                last = tok.end();
                tokens += 1;
                assert!(tokens <= buf.len(), "{buf:?} {mode:?}");
            }
        }
    }
}

// ---------------------------------------------------------------- sql_mode

#[test]
fn sql_mode_is_read_from_the_variable() {
    assert_eq!(SqlMode::parse(b""), SqlMode::DEFAULT);
    assert_eq!(
        SqlMode::parse(b"STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO"),
        SqlMode::DEFAULT
    );
    assert_eq!(SqlMode::parse(b"ANSI_QUOTES"), ANSI);
    assert_eq!(SqlMode::parse(b"no_backslash_escapes"), NBE);
    assert_eq!(
        SqlMode::parse(b"NO_BACKSLASH_ESCAPES, ANSI_QUOTES ,STRICT_ALL_TABLES"),
        BOTH
    );
    // As the server reports the combinations, and the combination names alone.
    assert_eq!(
        SqlMode::parse(b"REAL_AS_FLOAT,PIPES_AS_CONCAT,ANSI_QUOTES,IGNORE_SPACE,ANSI"),
        ANSI
    );
    for combination in ["ANSI", "ORACLE", "DB2", "MSSQL", "MAXDB", "POSTGRESQL"] {
        assert_eq!(
            SqlMode::parse(combination.as_bytes()),
            ANSI,
            "{combination}"
        );
    }
    // Names that merely contain the words.
    assert_eq!(SqlMode::parse(b"NO_ANSI_QUOTES_X,XANSI"), SqlMode::DEFAULT);
}

#[test]
fn alternatives_are_the_modes_that_can_lex_a_text_differently() {
    let alternatives = |sql: &str| SqlMode::alternatives(sql.as_bytes()).collect::<Vec<_>>();
    assert_eq!(alternatives("SELECT 'a', `b` FROM t"), vec![]);
    assert_eq!(alternatives("SELECT \"a\""), vec![ANSI]);
    assert_eq!(alternatives(r"SELECT 'a\'b'"), vec![NBE]);
    assert_eq!(alternatives(r#"SELECT "a\"b""#), vec![ANSI, NBE, BOTH]);
}

#[test]
fn lexer_follows_ansi_quotes() {
    use TokenKind::*;
    let sql = r#"SELECT "a b", "x""y", 'c', _utf8"d", @"e" FROM "t\""#;
    assert_eq!(
        tokens_in(sql, ANSI),
        vec![
            (Word, "SELECT"),
            (QuotedIdent, r#""a b""#),
            (Punct, ","),
            (QuotedIdent, r#""x""y""#),
            (Punct, ","),
            (String, "'c'"),
            (Punct, ","),
            (Word, "_utf8"),
            (QuotedIdent, r#""d""#),
            (Punct, ","),
            (UserVar, r#"@"e""#),
            (Word, "FROM"),
            // No backslash escapes in identifiers.
            (QuotedIdent, r#""t\""#),
        ]
    );
    assert_eq!(
        tokens(r#"SELECT "a b", _utf8"d""#),
        vec![
            (Word, "SELECT"),
            (String, r#""a b""#),
            (Punct, ","),
            (String, r#"_utf8"d""#),
        ]
    );
    let quoted: Vec<_> = Lexer::with_mode(br#""x""y" `z`"#, ANSI).collect();
    assert_eq!(quoted[0].ident(), Some(&br#"x""y"#[..]));
    assert_eq!(quoted[1].ident(), Some(&b"z"[..]));
}

#[test]
fn lexer_follows_no_backslash_escapes() {
    use TokenKind::*;
    let sql = r"SELECT 'a\', 'b' FROM t";
    assert_eq!(
        tokens_in(sql, NBE),
        vec![
            (Word, "SELECT"),
            (String, r"'a\'"),
            (Punct, ","),
            (String, "'b'"),
            (Word, "FROM"),
            (Word, "t"),
        ]
    );
    // By default the backslash escapes the quote: one string up to the next quote.
    assert_eq!(tokens(sql)[1], (String, r"'a\', '"));
    assert_eq!(
        tokens_in(r#"SELECT "a\" FROM t"#, BOTH),
        vec![
            (Word, "SELECT"),
            (QuotedIdent, r#""a\""#),
            (Word, "FROM"),
            (Word, "t")
        ]
    );
    let mut lexer = Lexer::with_mode(b"'a\\'", NBE);
    assert_eq!(lexer.mode(), NBE);
    assert_eq!(lexer.by_ref().count(), 1);
    assert!(!lexer.is_unterminated());
}

#[test]
fn classification_follows_the_sql_mode() {
    // What one mode hides in a string, the other runs.
    let sql = r"SELECT 'a\', GET_LOCK('x', 1), '";
    assert_eq!(classify(sql.as_bytes()), C::READ_ONLY);
    assert_eq!(
        classify_with(sql.as_bytes(), NBE),
        C::GET_LOCK | C::FUNCTION_CALL | C::WRITE
    );
    let sql = r"SELECT 'a\'; SET @x = 1; SELECT '";
    assert_eq!(classify(sql.as_bytes()), C::READ_ONLY);
    assert_eq!(
        classify_with(sql.as_bytes(), NBE),
        C::SET_USER_VAR | C::WRITE | C::MULTI
    );
    let sql = r#"SELECT "SLEEP"(5)"#;
    assert_eq!(classify(sql.as_bytes()), C::READ_ONLY);
    assert_eq!(
        classify_with(sql.as_bytes(), ANSI),
        C::FUNCTION_CALL | C::WRITE
    );
    let sql = r#"SELECT "GET_LOCK"('x', 1)"#;
    assert_eq!(
        classify_with(sql.as_bytes(), ANSI),
        C::GET_LOCK | C::FUNCTION_CALL | C::WRITE
    );
    let sql = r#"SELECT "a;b" FROM "t""#;
    assert_eq!(classify_with(sql.as_bytes(), ANSI), C::READ_ONLY);
    assert_eq!(
        Statements::with_mode(br#"SELECT "a;b"; SELECT 'c\'; SELECT 1"#, BOTH).count(),
        3
    );
}

// ---------------------------------------------------------------- function calls

#[test]
fn calls_of_anything_but_pure_built_ins_are_reported() {
    for sql in [
        "SELECT f()",
        "SELECT f(1) FROM t",
        "SELECT db.f(1)",
        "SELECT `f`(1)",
        "SELECT `db`.`f`(1)",
        "SELECT `COUNT`(*) FROM t",
        "SELECT COUNT (*) FROM t",
        "SELECT datetime(1)",
        "SELECT ANY(1)",
        "SELECT FOUND_ROWS()",
        "SELECT ROW_COUNT()",
        "SELECT CONNECTION_ID()",
        "SELECT IS_USED_LOCK('x')",
        "SELECT SLEEP(1)",
        "SELECT BENCHMARK(10, MD5('x'))",
        "SELECT * FROM t WHERE a IN (SELECT f(b) FROM u)",
        "SELECT * FROM t WHERE a = (SELECT MAX(b) FROM u WHERE c = f())",
        "WITH c AS (SELECT f(1)) SELECT * FROM c",
        "WITH c (n) AS (SELECT 1) SELECT g(n) FROM c",
        "SELECT * FROM JSON_TABLE('[]', '$[*]' COLUMNS (a INT PATH '$')) AS j",
        "SELECT f(1) OVER ()",
        "SHOW TABLES WHERE f(1)",
        "(SELECT f(1))",
        "SET @@session.sql_mode = (SELECT writing_fn())",
        "SET sql_mode = f()",
        "SET STATEMENT max_statement_time = f() FOR SELECT 1",
        "SET STATEMENT max_statement_time = 1 FOR SELECT f()",
        "EXPLAIN ANALYZE SELECT f()",
    ] {
        assert_has(sql, C::FUNCTION_CALL);
    }
    assert_flags("SELECT f()", C::READ_ONLY | C::FUNCTION_CALL);
    assert_flags(
        "SET @@session.sql_mode = (SELECT writing_fn())",
        C::SET_SESSION_VAR | C::FUNCTION_CALL | C::WRITE,
    );
}

#[test]
fn pure_built_ins_and_syntax_are_not_calls() {
    for sql in [
        "SELECT COUNT(*), SUM(a), MIN(b), MAX(c), AVG(d) FROM t GROUP BY (e)",
        "SELECT CONCAT(a, 'x'), COALESCE(b, 0), IFNULL(c, 1), LENGTH(d), LOWER(e), UPPER(f)",
        "SELECT SUBSTRING(a, 1, 2), SUBSTRING(a FROM 1 FOR 2), ROUND(b, 2), ABS(c) FROM t",
        "SELECT CAST(a AS CHAR(10)), CAST(b AS DECIMAL(10, 2)), CONVERT(c USING utf8mb4), CONVERT(d, CHAR(3))",
        "SELECT DATE_FORMAT(NOW(), '%Y'), CURDATE(), UNIX_TIMESTAMP(), RAND(), UUID()",
        "SELECT IF (a, 1, 2), LEFT(b, 1), RIGHT (c, 1), MOD(d, 2), INSERT('abc', 1, 1, 'x'), REPLACE('a', 'a', 'b')",
        "SELECT DATABASE(), SCHEMA(), CURRENT_TIMESTAMP(6), UTC_TIMESTAMP()",
        "SELECT a FROM t WHERE b IN (1, 2) AND NOT (c = 1) OR EXISTS (SELECT 1 FROM u)",
        "SELECT a FROM t WHERE b = ANY (SELECT c FROM u) AND d > ALL (SELECT e FROM v)",
        "SELECT * FROM t JOIN u USING (id) LEFT JOIN (SELECT 1 AS id) AS d ON (d.id = t.id)",
        "SELECT * FROM t FORCE INDEX (i) WHERE a BETWEEN (1) AND (2)",
        "SELECT * FROM t PARTITION (p0)",
        "SELECT * FROM (SELECT 1) AS d",
        "SELECT a FROM t UNION (SELECT b FROM u)",
        "SELECT ROW_NUMBER() OVER (PARTITION BY a ORDER BY b), RANK() OVER w FROM t WINDOW w AS (ORDER BY a)",
        "SELECT MATCH (a) AGAINST ('x') FROM t",
        "SELECT CASE (a) WHEN (1) THEN (2) ELSE (3) END FROM t",
        "SELECT (1) + (2), - (3)",
        "SELECT t.f, 'f(1)', `f` FROM t",
        "WITH RECURSIVE c (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5) SELECT * FROM c",
        "WITH c(a) AS (SELECT 1), d (b) AS (SELECT 2) SELECT * FROM c, d",
        "VALUES (1, 2), (3, 4)",
        "VALUES ROW(1)",
        "SET NAMES utf8mb4",
        "SET sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SHOW TABLES WHERE LENGTH(Tables_in_db) > (3)",
    ] {
        assert_lacks(sql, C::FUNCTION_CALL);
    }
    // Only looked for in statements that may otherwise be run again.
    for sql in [
        "INSERT INTO t (a) VALUES (f(1))",
        "UPDATE t SET a = f(1)",
        "CREATE TABLE t (a INT)",
        "DO f(1)",
        "CALL p(f(1))",
    ] {
        assert_lacks(sql, C::FUNCTION_CALL);
    }
}

#[test]
fn pure_and_syntax_lists_are_sorted_uppercase() {
    for list in [crate::keyword::SYNTAX, crate::keyword::PURE] {
        assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        assert!(list.iter().all(|w| w
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')));
        for word in list {
            assert!(
                crate::keyword::is_syntax_before_paren(word)
                    != crate::keyword::is_pure_function(word)
            );
        }
    }
}

#[test]
fn quoted_built_ins_are_still_built_ins() {
    assert_flags(
        "SELECT `GET_LOCK`('x', 1)",
        C::GET_LOCK | C::FUNCTION_CALL | C::WRITE,
    );
    assert_flags("SELECT `sleep`(5)", C::FUNCTION_CALL | C::WRITE);
    assert_flags("DO `RELEASE_LOCK`('x')", C::RELEASE_LOCK | C::WRITE);
    // A qualified name is a stored function, whatever it is called.
    assert_flags("SELECT `db`.`sleep`(5)", C::READ_ONLY | C::FUNCTION_CALL);
}

#[test]
fn sequences() {
    let next = C::FUNCTION_CALL | C::WRITE;
    assert_flags("SELECT NEXTVAL(s)", next);
    assert_flags("SELECT nextval(db.s)", next);
    assert_flags("SELECT NEXT VALUE FOR s", next);
    assert_flags("SELECT s.nextval", next);
    assert_flags("SELECT db.s.NEXTVAL FROM t", next);
    assert_flags("SELECT s.`nextval`", next);
    assert_flags("SELECT SETVAL(s, 10)", next);
    let previous = C::READ_ONLY | C::FUNCTION_CALL;
    assert_flags("SELECT LASTVAL(s)", previous);
    assert_flags("SELECT PREVIOUS VALUE FOR s", previous);
    assert_flags("SELECT s.currval", previous);
    assert_flags(
        "SET @@x = NEXTVAL(s)",
        C::SET_SESSION_VAR | C::FUNCTION_CALL | C::WRITE,
    );
    assert_flags(
        "SET sql_mode = s.nextval",
        C::SET_SESSION_VAR | C::FUNCTION_CALL | C::WRITE,
    );
    assert_flags("INSERT INTO t VALUES (s.nextval)", C::WRITE);
    assert_flags("SELECT nextval FROM t", C::READ_ONLY);
}

#[test]
fn statements_that_may_commit() {
    for sql in [
        "COMMIT",
        "COMMIT AND CHAIN",
        "ROLLBACK",
        "BEGIN",
        "START TRANSACTION",
        "SET autocommit = 1",
        "SET @@session.autocommit = ON",
        "CREATE TABLE t (a INT)",
        "DROP TABLE t",
        "ALTER TABLE t ADD b INT",
        "TRUNCATE t",
        "RENAME TABLE a TO b",
        "LOCK TABLES t WRITE",
        "UNLOCK TABLES",
        "FLUSH TABLES",
        "GRANT SELECT ON *.* TO u",
        "ANALYZE TABLE t",
        "CALL p()",
        "EXECUTE s",
        "EXECUTE IMMEDIATE 'COMMIT'",
        "BEGIN NOT ATOMIC COMMIT; END",
        "INSERT INTO t VALUES (1); COMMIT",
    ] {
        assert!(
            classify(sql.as_bytes()).intersects(C::MAY_COMMIT),
            "{sql:?} may commit"
        );
    }
    for sql in [
        "SELECT 1",
        "INSERT INTO t VALUES (1)",
        "UPDATE t SET a = 1",
        "SET @a = 1",
        "SET sql_mode = ''",
        "SAVEPOINT s",
        "ROLLBACK TO SAVEPOINT s",
        "CREATE TEMPORARY TABLE t (a INT)",
        "DROP TEMPORARY TABLE t",
        "SELECT f()",
    ] {
        assert!(
            !classify(sql.as_bytes()).intersects(C::MAY_COMMIT),
            "{sql:?} does not commit"
        );
    }
}

#[test]
fn a_text_ending_inside_an_executable_comment_is_refused_by_mariadb_at_parse() {
    let maria = Server::mariadb(101119);
    // Whatever the comment holds, nested comments included: nothing runs (1064).
    for sql in [
        "/*!101118 /* nested? */ SELECT 1 FROM",
        "/*!101118 /* n */ DELETE FROM t",
        "/*M!100000 SET @x = 1",
        "SELECT 1 /*!101118 + 1",
        // Skipped, or an ordinary comment, never closed; a string never closed.
        "COMMIT /*!99999 /* nested? */",
        "COMMIT /* never closed",
        "COMMIT /*!110000 work",
        "SELECT 'never closed",
    ] {
        assert_eq!(
            classify_for(sql.as_bytes(), SqlMode::DEFAULT, maria),
            C::WRITE,
            "{sql}"
        );
        // For a server that may be MySQL, as before.
        assert_ne!(
            classify_for(sql.as_bytes(), SqlMode::DEFAULT, Server::UNKNOWN),
            C::WRITE,
            "{sql}"
        );
    }
    // Closed: the comment's content is what runs.
    let flags = classify_for(b"/*!101118 DELETE FROM t */", SqlMode::DEFAULT, maria);
    assert!(flags.has(C::WRITE), "{flags}");
    // Two statements: the first runs before the second is refused.
    let flags = classify_for(
        b"DELETE FROM t; /*!101118 SELECT 1",
        SqlMode::DEFAULT,
        maria,
    );
    assert!(flags.has(C::WRITE), "{flags}");
}

/// MariaDB answers a statement of comments only after a `;` (`INSERT ...; -- done`: an
/// OK, then an empty OK; one never closed: 1064), but not whitespace or `;` (tried on
/// 10.11): such a text is a multi-statement.
#[test]
fn a_statement_of_comments_after_a_semicolon_makes_a_multi_statement() {
    for sql in [
        "INSERT INTO t VALUES (1); -- done",
        "INSERT INTO t VALUES (1); /* done */",
        "INSERT INTO t VALUES (1); # done",
        "INSERT INTO t VALUES (1); /**/ ;",
        "INSERT INTO t VALUES (1); /* never closed",
        "INSERT INTO t VALUES (1); /*!101120 /* nested */ never closed",
    ] {
        let flags = classify_for(sql.as_bytes(), SqlMode::DEFAULT, MARIADB_10_11);
        assert!(flags.has(C::MULTI | C::WRITE), "{sql}: {flags}");
    }
    for sql in [
        "INSERT INTO t VALUES (1);",
        "INSERT INTO t VALUES (1);  \n\t",
        "INSERT INTO t VALUES (1);;",
        "INSERT INTO t VALUES (1); ;",
        "/* a */ INSERT INTO t VALUES (1) -- done",
        "/* only a comment */",
    ] {
        let flags = classify_for(sql.as_bytes(), SqlMode::DEFAULT, MARIADB_10_11);
        assert!(!flags.has(C::MULTI), "{sql}: {flags}");
    }
}
