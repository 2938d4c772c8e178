//! The fuzzer's grammar: random client sessions over the schema [`super::SETUP`] makes.
//!
//! Statements name tables without a schema (the session starts in `fuzz`; `USE` moves it),
//! so that what a statement reads or writes depends on the session's state as it would
//! for an application. Nothing here depends on time, connection ids or server ids: the
//! same session must give the same answers on every target.

use crate::differential::Step;
use crate::raw::BASE_CAPS;
use holdfast_wire::caps::{CLIENT_DEPRECATE_EOF, CLIENT_SESSION_TRACK};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::time::Duration;

/// One generated session: the client's capabilities, its steps and the pause after each.
#[derive(Debug, Clone)]
pub struct Session {
    pub caps: u32,
    pub steps: Vec<Step>,
    /// The client's silence after step `i` (holdfast acts on idle sessions: captures).
    pub pauses: Vec<Duration>,
}

/// The server's version as `/*!NNNNN` compares it (10.11.19 → 101119).
#[derive(Debug, Clone, Copy)]
pub struct Grammar {
    pub server_version: u32,
}

impl Grammar {
    pub fn session(&self, r: &mut StdRng) -> Session {
        let caps = *[
            BASE_CAPS,
            BASE_CAPS | CLIENT_DEPRECATE_EOF,
            BASE_CAPS | CLIENT_SESSION_TRACK | CLIENT_DEPRECATE_EOF,
            BASE_CAPS | CLIENT_SESSION_TRACK,
        ]
        .choose(r)
        .unwrap_or(&BASE_CAPS);
        let n = r.gen_range(4..28);
        let mut steps = Vec::with_capacity(n);
        let mut pauses = Vec::with_capacity(n);
        for _ in 0..n {
            if r.gen_bool(0.04) {
                // FOUND_ROWS() is defined right after a SELECT (after other statements the
                // server's own answer varies from run to run): asked in the next request,
                // perhaps after a pause (holdfast's captures must leave it).
                steps.push(Step::Query(
                    "SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1".into(),
                ));
                pauses.push(Duration::from_millis(*[0, 130].choose(r).unwrap_or(&0)));
                steps.push(Step::Query("SELECT FOUND_ROWS(), ROW_COUNT()".into()));
                pauses.push(Duration::ZERO);
                continue;
            }
            steps.push(self.step(r));
            pauses.push(Duration::from_millis(match r.gen_range(0..20) {
                0..=11 => 0,
                12..=16 => 30,
                _ => 130,
            }));
        }
        Session {
            caps,
            steps,
            pauses,
        }
    }

    fn step(&self, r: &mut StdRng) -> Step {
        match r.gen_range(0..100) {
            // The binary protocol: one statement, prepared, executed, closed.
            0..=9 => Step::Binary(self.statement(r)),
            // Several statements in one COM_QUERY.
            10..=21 => {
                let n = r.gen_range(2..4);
                let mut parts: Vec<String> = (0..n).map(|_| self.decorated(r)).collect();
                if r.gen_bool(0.3) {
                    parts.push(String::new());
                }
                Step::Query(parts.join(if r.gen_bool(0.8) { "; " } else { ";\n" }))
            }
            _ => Step::Query(self.decorated(r)),
        }
    }

    /// A statement with comments, hints and executable comments around or inside it.
    fn decorated(&self, r: &mut StdRng) -> String {
        let mut s = self.statement(r);
        if r.gen_bool(0.25) {
            s = format!("{} {s}", self.comment(r, true));
        }
        if r.gen_bool(0.25) {
            s = format!("{s} {}", self.comment(r, false));
        }
        if r.gen_bool(0.2) {
            s = self.executable_tail(r, s);
        }
        if r.gen_bool(0.1) {
            s = s.to_lowercase_keywords();
        }
        s
    }

    /// A version for `/*!NNNNN`: at, below or above the server's, 5 or 6 digits.
    fn version(&self, r: &mut StdRng) -> String {
        let v = self.server_version;
        match r.gen_range(0..9) {
            0 => "40101".into(),
            1 => "50700".into(),
            2 => format!("{}", v),
            3 => format!("{}", v + 1),
            4 => format!("{}", v.saturating_sub(1)),
            5 => "100000".into(),
            6 => "110000".into(),
            7 => "99999".into(),
            _ => "999999".into(),
        }
    }

    fn comment(&self, r: &mut StdRng, leading: bool) -> String {
        let v = self.version(r);
        let options: Vec<String> = vec![
            "/* plain */".into(),
            "/* ; ' \" ` */".into(),
            "/**/".into(),
            format!("/*!{v} */"),
            format!("/*M!{v} */"),
            format!("/*!{v} /* nested? */"),
            if leading {
                "-- dash ' ;\n".into()
            } else {
                "-- dash ' ;".into()
            },
            if leading {
                "# hash \" ;\n".into()
            } else {
                "# hash \" ;".into()
            },
            "/*+ MAX_EXECUTION_TIME(1000) */".into(),
        ];
        options.choose(r).cloned().unwrap_or_default()
    }

    /// Appends (or inserts) an executable comment whose content matters only on servers
    /// at or above its version; some hide quotes or `--` from a lexer that reads them as
    /// code (issue 18 item 5).
    fn executable_tail(&self, r: &mut StdRng, s: String) -> String {
        let v = self.version(r);
        let m = if r.gen_bool(0.3) { "M" } else { "" };
        let lock = lock_name(r);
        if !s.trim_start().to_ascii_uppercase().starts_with("SELECT") {
            return format!("{s} /*{m}!{v} */");
        }
        match r.gen_range(0..6) {
            0 => format!("{s} /*{m}!{v} , GET_LOCK('{lock}', 0) */"),
            1 => format!("SELECT 1 /*{m}!{v} ' */, GET_LOCK('{lock}', 0) -- '"),
            2 => format!("SELECT 2 /*{m}!{v} -- */ , GET_LOCK('{lock}', 0)"),
            3 => format!("{s} /*{m}!{v} FOR UPDATE */"),
            4 => s.replacen("SELECT", &format!("SELECT /*{m}!{v} SQL_NO_CACHE */"), 1),
            _ => format!("SELECT 3 /*{m}!{v} , NEXTVAL(s) */"),
        }
    }

    /// A string literal with what a lexer could get wrong inside.
    fn string(&self, r: &mut StdRng) -> String {
        let options = [
            "'a'",
            "'x;y'",
            "'it''s'",
            "'q\\'s'",
            "\"dq;\"",
            "'-- no'",
            "'/* no */'",
            "'#'",
            "_utf8mb4'u'",
            "X'41'",
            "'é'",
            "''",
            "'a\\\\'",
        ];
        options.choose(r).map(|s| s.to_string()).unwrap_or_default()
    }

    pub fn statement(&self, r: &mut StdRng) -> String {
        let n = r.gen_range(1..12);
        let m = r.gen_range(1..12);
        let s = self.string(r);
        let s2 = self.string(r);
        let lock = lock_name(r);
        let pick = |r: &mut StdRng, options: Vec<String>| -> String {
            options.choose(r).cloned().unwrap_or_default()
        };
        match r.gen_range(0..100) {
            // Reads.
            0..=24 => pick(
                r,
                vec![
                    "SELECT id, k, v FROM t ORDER BY id".into(),
                    format!("SELECT v FROM t WHERE k = {n}"),
                    "SELECT COUNT(*), SUM(k) FROM t".into(),
                    format!("SELECT {s} AS s, {s2} AS s2"),
                    format!("SELECT id FROM t WHERE v = {s}"),
                    format!("SELECT id FROM t ORDER BY id LIMIT {n}"),
                    "SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1".into(),
                    "SELECT ROW_COUNT()".into(),
                    "SELECT LAST_INSERT_ID()".into(),
                    "SELECT @a, @b, @s".into(),
                    "SELECT DATABASE()".into(),
                    "SELECT @@autocommit, @@in_transaction, @@sql_mode, @@time_zone".into(),
                    "SELECT @@tx_read_only, @@tx_isolation".into(),
                    "SELECT * FROM tt ORDER BY a".into(),
                    format!("SELECT k FROM t WHERE id = {n} FOR UPDATE"),
                    format!("SELECT k FROM t WHERE id = {n} LOCK IN SHARE MODE"),
                    "SELECT IS_FREE_LOCK('fz_a'), IS_USED_LOCK('fz_b') IS NOT NULL".into(),
                    "SHOW WARNINGS".into(),
                    "SHOW ERRORS".into(),
                    "SELECT @@warning_count, @@error_count".into(),
                    "SHOW COUNT(*) WARNINGS".into(),
                    "SELECT k, v FROM fuzz_b.t ORDER BY k".into(),
                    "(SELECT k FROM t WHERE k < 3) UNION (SELECT n FROM u) ORDER BY 1".into(),
                    "SELECT `t`.`v` AS `a;b` FROM `t` WHERE `k` = 2".into(),
                    "SHOW TABLES".into(),
                    "DESCRIBE t".into(),
                    "SELECT * FROM s".into(),
                    "CHECKSUM TABLE t".into(),
                    format!("SELECT k FROM t WHERE id = {n} FOR UPDATE NOWAIT"),
                    "WITH c AS (SELECT k FROM t) SELECT COUNT(*) FROM c".into(),
                ],
            ),
            // Writes, some failing on the unique key.
            25..=44 => pick(
                r,
                vec![
                    format!("INSERT INTO t (k, v) VALUES ({n}, {s})"),
                    format!("INSERT IGNORE INTO t (k, v) VALUES ({n}, {s})"),
                    format!(
                        "INSERT INTO t (k, v) VALUES ({n}, {s}) ON DUPLICATE KEY UPDATE v = {s2}"
                    ),
                    format!("REPLACE INTO t (k, v) VALUES ({n}, {s})"),
                    format!("UPDATE t SET v = {s} WHERE k = {n}"),
                    format!("UPDATE t SET k = k + 100 WHERE id = {n}"),
                    format!("DELETE FROM t WHERE k = {n}"),
                    format!("INSERT INTO u (id, n) VALUES ({n}, {m})"),
                    "INSERT INTO t (k, v) SELECT MAX(k) + 1, 'sel' FROM t".into(),
                    "INSERT INTO t (k, v) VALUES (NEXTVAL(s) + 50, 'seq')".into(),
                    format!("INSERT INTO tt VALUES ({n})"),
                    format!("UPDATE t SET v = @s WHERE k = {n}"),
                    format!("INSERT INTO t (id, k) VALUES ({n}, {m})"),
                    format!("UPDATE t SET v = {s} WHERE k = {n} LIMIT 1"),
                    format!("DELETE FROM u WHERE id > {n}"),
                    format!("INSERT INTO t (k, v) VALUES ({n}, {s}), ({m}, {s2})"),
                    format!("DO GET_LOCK('{lock}', 0)"),
                ],
            ),
            // Session state.
            45..=59 => pick(
                r,
                vec![
                    format!("SET @a = {n}"),
                    format!("SET @s = {s}"),
                    format!("SELECT @a := {n}"),
                    "SET @b = (SELECT COUNT(*) FROM t)".into(),
                    "SET sql_mode = 'ANSI_QUOTES'".into(),
                    "SET sql_mode = 'NO_BACKSLASH_ESCAPES'".into(),
                    "SET sql_mode = DEFAULT".into(),
                    "SET time_zone = '+02:00'".into(),
                    "SET NAMES latin1".into(),
                    "SET NAMES utf8mb4".into(),
                    "SET SESSION sql_select_limit = 2".into(),
                    "SET SESSION sql_select_limit = 0".into(),
                    "SET sql_select_limit = DEFAULT".into(),
                    "SET autocommit = 0".into(),
                    "SET autocommit = 1".into(),
                    "SET @@session.autocommit = 0".into(),
                    "USE fuzz".into(),
                    "USE fuzz_b".into(),
                    "SET STATEMENT max_statement_time = 10 FOR SELECT COUNT(*) FROM t".into(),
                    "SET TRANSACTION READ ONLY".into(),
                    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".into(),
                    format!("SET @a = {n}, @s = {s}"),
                    format!("SELECT 'a\\' , GET_LOCK('{lock}', 0) -- '"),
                    format!("SELECT \"b\" , GET_LOCK('{lock}', 0) -- \""),
                ],
            ),
            // Transactions.
            60..=71 => pick(
                r,
                vec![
                    "BEGIN".into(),
                    "START TRANSACTION".into(),
                    "START TRANSACTION READ ONLY".into(),
                    "START TRANSACTION READ WRITE".into(),
                    "START TRANSACTION WITH CONSISTENT SNAPSHOT".into(),
                    "COMMIT".into(),
                    "COMMIT".into(),
                    "ROLLBACK".into(),
                    "SAVEPOINT sp".into(),
                    "ROLLBACK TO SAVEPOINT sp".into(),
                    "RELEASE SAVEPOINT sp".into(),
                    "COMMIT AND CHAIN".into(),
                    "XA START 'x'".into(),
                    "XA END 'x'".into(),
                    "XA ROLLBACK 'x'".into(),
                    "XA COMMIT 'x' ONE PHASE".into(),
                ],
            ),
            // Locks.
            72..=79 => pick(
                r,
                vec![
                    format!("SELECT GET_LOCK('{lock}', 0)"),
                    format!("SELECT RELEASE_LOCK('{lock}')"),
                    "SELECT RELEASE_ALL_LOCKS()".into(),
                    "LOCK TABLES t WRITE".into(),
                    "LOCK TABLES t READ".into(),
                    "LOCK TABLES t READ, u WRITE".into(),
                    "UNLOCK TABLES".into(),
                ],
            ),
            // Temporary tables, one shadowing a real table.
            80..=84 => pick(
                r,
                vec![
                    "CREATE TEMPORARY TABLE tt (a INT PRIMARY KEY)".into(),
                    "CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT PRIMARY KEY)".into(),
                    "DROP TEMPORARY TABLE IF EXISTS tt".into(),
                    "CREATE TEMPORARY TABLE t (id INT, k INT, v VARCHAR(20))".into(),
                    "DROP TEMPORARY TABLE t".into(),
                    "CREATE TEMPORARY TABLE tt AS SELECT k AS a FROM t".into(),
                ],
            ),
            // Prepared statements in SQL.
            85..=90 => pick(
                r,
                vec![
                    "PREPARE ps FROM 'SELECT v FROM t WHERE k = ?'".into(),
                    "PREPARE ps FROM 'INSERT INTO t (k, v) VALUES (?, ''ps'')'".into(),
                    "PREPARE ps FROM 'SELECT GET_LOCK(?, 0)'".into(),
                    "PREPARE ps FROM 'SELECT NEXTVAL(s) + ?'".into(),
                    "EXECUTE ps USING @a".into(),
                    format!("EXECUTE ps USING {n}"),
                    "EXECUTE ps USING 'fz_a'".into(),
                    "DEALLOCATE PREPARE ps".into(),
                    "EXECUTE IMMEDIATE 'SELECT COUNT(*) FROM t'".into(),
                    format!("EXECUTE IMMEDIATE 'INSERT INTO u VALUES (?, 1)' USING {n}"),
                    format!("EXECUTE IMMEDIATE 'SELECT GET_LOCK(''{lock}'', 0)'"),
                    "EXECUTE IMMEDIATE 'CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT)'".into(),
                ],
            ),
            // CALL, sequences.
            91..=95 => pick(
                r,
                vec![
                    format!("CALL p_ins({n})"),
                    "CALL p_sel()".into(),
                    "CALL p_lock()".into(),
                    "CALL p_var()".into(),
                    "CALL p_tmp()".into(),
                    "CALL p_nope()".into(),
                    "SELECT NEXTVAL(s)".into(),
                    "SELECT NEXT VALUE FOR s".into(),
                    "SELECT LASTVAL(s)".into(),
                    "SELECT PREVIOUS VALUE FOR s".into(),
                    format!("SELECT SETVAL(s, {})", n * 10),
                    format!("DO SETVAL(s, {})", m * 10),
                ],
            ),
            // DDL and errors.
            _ => pick(
                r,
                vec![
                    "CREATE TABLE IF NOT EXISTS w (a INT)".into(),
                    "DROP TABLE IF EXISTS w".into(),
                    "TRUNCATE TABLE u".into(),
                    "SELEC 1".into(),
                    "SELECT * FROM nosuch".into(),
                    "SELECT nosuchcol FROM t".into(),
                    "SELECT 1 FROM".into(),
                    "DO 1".into(),
                ],
            ),
        }
    }
}

fn lock_name(r: &mut StdRng) -> &'static str {
    ["fz_a", "fz_b", "fz_c"]
        .choose(r)
        .copied()
        .unwrap_or("fz_a")
}

trait LowerKeywords {
    fn to_lowercase_keywords(&self) -> String;
}

impl LowerKeywords for String {
    /// The leading keyword in lower case (`select ...`): clients write either.
    fn to_lowercase_keywords(&self) -> String {
        let end = self
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(self.len());
        format!("{}{}", self[..end].to_lowercase(), &self[end..])
    }
}
