//! Statement classification: a few flags per SQL text, from a single pass over its tokens.

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

use crate::keyword::{is_pure_function, is_syntax_before_paren, upper};
use crate::lexer::{SqlMode, Token, TokenKind};
use crate::server::Server;
use crate::split::StmtCursor;

/// Flags describing one SQL text (which may contain several statements separated by
/// `;` when multi-statements are on). Flags of all statements are combined, except that
/// [`READ_ONLY`](Self::READ_ONLY) is only set when every statement is read-only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Classification {
    /// The raw flag bits; see the associated constants.
    pub bits: u32,
}

macro_rules! flags {
    ($($(#[$doc:meta])* $name:ident = $bit:expr;)*) => {
        impl Classification {
            $($(#[$doc])* pub const $name: Classification = Classification { bits: 1 << $bit };)*

            /// Every named flag, with its name, in bit order.
            pub const FLAGS: &'static [(&'static str, Classification)] =
                &[$((stringify!($name), Classification::$name)),*];
        }
    };
}

flags! {
    /// Every statement only reads: `SELECT` (also parenthesized, or after `WITH`),
    /// `VALUES`, `TABLE`, `SHOW`, `DESCRIBE`/`DESC`/`EXPLAIN` (not `EXPLAIN ANALYZE` of a
    /// write), `HELP`; without `INTO`, locking reads, user-variable assignment, or calls
    /// of built-ins with side effects (`GET_LOCK`, `RELEASE_LOCK`, `SLEEP`,
    /// `LAST_INSERT_ID(expr)`, `NEXTVAL`, `s.nextval`, `NEXT VALUE FOR`, replication
    /// waits...). What a stored function does is not known: a read that calls one is
    /// `READ_ONLY` too, and [`FUNCTION_CALL`](Self::FUNCTION_CALL) says so.
    READ_ONLY = 0;
    /// Some statement is not [`READ_ONLY`](Self::READ_ONLY), including `DO`, `SET` and
    /// anything not recognised.
    WRITE = 1;
    /// Sets a session system variable: `SET x=`, `SET SESSION|LOCAL x=`,
    /// `SET @@x=`, `SET @@session.x=`, `SET NAMES`, `SET CHARACTER SET`,
    /// `SET SESSION TRANSACTION`, `SET ROLE`, `SET RESOURCE GROUP`. Not `SET GLOBAL`.
    SET_SESSION_VAR = 2;
    /// Assigns a user variable: `SET @a=`, `SELECT ... INTO @a`, `@a := expr` anywhere,
    /// `GET DIAGNOSTICS @a = ...`.
    SET_USER_VAR = 3;
    /// `USE db`.
    USE_DB = 4;
    /// Starts a transaction: `BEGIN [WORK]`, `START TRANSACTION`, `COMMIT/ROLLBACK AND
    /// CHAIN` (which also carry [`END_TXN`](Self::END_TXN)). Not `BEGIN NOT ATOMIC`.
    BEGIN_TXN = 5;
    /// Ends a transaction: `COMMIT`, `ROLLBACK`, but not `ROLLBACK TO SAVEPOINT`.
    END_TXN = 6;
    /// A statement that implicitly commits the current transaction: DDL (`CREATE`,
    /// `ALTER`, `DROP`, `RENAME`, `TRUNCATE`, except temporary tables), account
    /// management, `LOCK`/`UNLOCK TABLES`, `FLUSH`, `RESET`, table maintenance,
    /// replication control, `SET PASSWORD`, `LOAD INDEX`...
    IMPLICIT_COMMIT = 7;
    /// `SET TRANSACTION ...` without scope: characteristics of the next transaction only.
    SET_TRANSACTION = 8;
    /// Sets the session's `autocommit` (always with [`SET_SESSION_VAR`](Self::SET_SESSION_VAR)).
    AUTOCOMMIT = 9;
    /// `PREPARE stmt FROM ...`.
    PREPARE_SQL = 10;
    /// `EXECUTE stmt`, also MariaDB's `EXECUTE IMMEDIATE` (which runs arbitrary SQL).
    EXECUTE_SQL = 11;
    /// `DEALLOCATE PREPARE` / `DROP PREPARE`.
    DEALLOCATE_SQL = 12;
    /// `CREATE [OR REPLACE] TEMPORARY TABLE`.
    CREATE_TEMP_TABLE = 13;
    /// `DROP TEMPORARY TABLE`.
    DROP_TEMP_TABLE = 14;
    /// The session takes locks it holds until released: `LOCK TABLES`,
    /// `LOCK INSTANCE FOR BACKUP`, `FLUSH TABLES ... WITH READ LOCK` / `FOR EXPORT`,
    /// MariaDB's `BACKUP LOCK` / `BACKUP STAGE`.
    LOCK_TABLES = 15;
    /// `UNLOCK TABLES`, `UNLOCK INSTANCE`, `BACKUP UNLOCK`, `BACKUP STAGE END`.
    UNLOCK_TABLES = 16;
    /// Calls `GET_LOCK(...)`.
    GET_LOCK = 17;
    /// Calls `RELEASE_LOCK(...)` or `RELEASE_ALL_LOCKS()`.
    RELEASE_LOCK = 18;
    /// `XA START|BEGIN|END|PREPARE|COMMIT|ROLLBACK|RECOVER`.
    XA = 19;
    /// `LOAD DATA LOCAL INFILE` / `LOAD XML LOCAL INFILE`: the server will ask the client
    /// for a file.
    LOAD_DATA_LOCAL = 20;
    /// `CALL proc(...)`: may return several result sets and has unknown side effects.
    CALL = 21;
    /// `HANDLER ...`: opens or reads a session-bound table handler.
    HANDLER = 22;
    /// A locking read: `FOR UPDATE`, `FOR SHARE`, `LOCK IN SHARE MODE`.
    SELECT_FOR_UPDATE = 23;
    /// `LAST_INSERT_ID(expr)` with an argument, which sets the session's value.
    LAST_INSERT_ID_CALL = 24;
    /// The text holds more than one non-empty statement.
    MULTI = 25;
    /// `KILL [CONNECTION|QUERY] ...`.
    KILL = 26;
    /// `SHUTDOWN` or `RESTART`.
    SHUTDOWN = 27;
    /// `SAVEPOINT x`, `RELEASE SAVEPOINT x`, `ROLLBACK [WORK] TO [SAVEPOINT] x`.
    SAVEPOINT = 28;
    /// A compound statement executed directly (MariaDB `BEGIN NOT ATOMIC ... END`,
    /// top-level `IF`/`CASE`/`WHILE`/`LOOP`/`REPEAT`, labelled blocks): arbitrary effects.
    COMPOUND = 29;
    /// A query or `SET` statement calls a function that is not on the short list of
    /// built-ins known to be pure (see `keyword::PURE`): a stored function or UDF (quoted,
    /// schema-qualified or not), a built-in with effects or one that reads the
    /// connection's history (`LAST_INSERT_ID()`, `FOUND_ROWS()`, `CONNECTION_ID()`...), a
    /// pure built-in written with a space before its `(` (which makes it a stored function
    /// call for some names); or it touches a sequence (`NEXTVAL(s)`, `LASTVAL(s)`,
    /// `SETVAL(...)`, `s.nextval`, `s.currval`, `NEXT`/`PREVIOUS VALUE FOR s`). Such a
    /// statement cannot be shown safe to run twice. Not looked for in other statements.
    FUNCTION_CALL = 30;
    /// The text holds an executable comment (`/*!NNNNN ... */`, `/*M! ... */`) that the
    /// servers it may run on do not all run or skip alike, or whose handling holdfast does
    /// not know for sure (see [`Server`]): what the server runs is not known. Always with
    /// [`WRITE`](Self::WRITE), part of [`CHANGES_SESSION`](Self::CHANGES_SESSION) and
    /// [`MAY_COMMIT`](Self::MAY_COMMIT): such a text goes to the primary, and is never
    /// retried, replayed or wrapped. The other flags are those of the comment read as code.
    UNCERTAIN = 31;
}

impl Classification {
    /// No flag set.
    pub const EMPTY: Classification = Classification { bits: 0 };

    /// Anything that may leave state in the session beyond the statement (or the
    /// transaction): session and user variables, current database, SQL prepared
    /// statements, temporary tables, table and named locks, transaction
    /// characteristics, `autocommit`, XA, handlers, `LAST_INSERT_ID(expr)`, and
    /// statements with unknown effects (`CALL`, `EXECUTE`, compound statements, uncertain
    /// texts).
    /// Transaction boundaries and savepoints are not included.
    pub const CHANGES_SESSION: Classification = Classification {
        bits: Self::SET_SESSION_VAR.bits
            | Self::SET_USER_VAR.bits
            | Self::USE_DB.bits
            | Self::SET_TRANSACTION.bits
            | Self::AUTOCOMMIT.bits
            | Self::PREPARE_SQL.bits
            | Self::EXECUTE_SQL.bits
            | Self::DEALLOCATE_SQL.bits
            | Self::CREATE_TEMP_TABLE.bits
            | Self::DROP_TEMP_TABLE.bits
            | Self::LOCK_TABLES.bits
            | Self::UNLOCK_TABLES.bits
            | Self::GET_LOCK.bits
            | Self::RELEASE_LOCK.bits
            | Self::XA.bits
            | Self::CALL.bits
            | Self::HANDLER.bits
            | Self::LAST_INSERT_ID_CALL.bits
            | Self::COMPOUND.bits
            | Self::UNCERTAIN.bits,
    };

    /// Statements that may commit an open transaction: `COMMIT` (and `ROLLBACK`: both are
    /// [`END_TXN`](Self::END_TXN), tell them apart by the first keyword), the implicit
    /// commits (DDL, `LOCK TABLES`..., `BEGIN`/`START TRANSACTION`, `SET autocommit`, even
    /// to 0), and code holdfast does not see (`CALL`, `EXECUTE`, compound statements,
    /// uncertain texts).
    /// Lost in flight inside a transaction, such a statement leaves its outcome unknown.
    pub const MAY_COMMIT: Classification = Classification {
        bits: Self::END_TXN.bits
            | Self::BEGIN_TXN.bits
            | Self::IMPLICIT_COMMIT.bits
            | Self::AUTOCOMMIT.bits
            | Self::CALL.bits
            | Self::EXECUTE_SQL.bits
            | Self::COMPOUND.bits
            | Self::UNCERTAIN.bits,
    };

    /// Builds a classification from raw bits.
    pub const fn from_bits(bits: u32) -> Self {
        Classification { bits }
    }

    /// True if every flag of `other` is set in `self` (and `other` is not empty).
    pub const fn has(self, other: Classification) -> bool {
        other.bits != 0 && self.bits & other.bits == other.bits
    }

    /// True if any flag of `other` is set in `self`.
    pub const fn intersects(self, other: Classification) -> bool {
        self.bits & other.bits != 0
    }

    /// True if no flag is set.
    pub const fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// Both sets of flags.
    pub const fn union(self, other: Classification) -> Self {
        Classification {
            bits: self.bits | other.bits,
        }
    }

    /// `self` without the flags of `other`.
    pub const fn difference(self, other: Classification) -> Self {
        Classification {
            bits: self.bits & !other.bits,
        }
    }

    /// Shorthand for `self.has(Classification::READ_ONLY)`.
    pub const fn is_read_only(self) -> bool {
        self.has(Self::READ_ONLY)
    }

    /// Shorthand for `self.intersects(Classification::CHANGES_SESSION)`.
    pub const fn changes_session(self) -> bool {
        self.intersects(Self::CHANGES_SESSION)
    }

    /// Names of the flags set, in bit order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::FLAGS
            .iter()
            .filter(move |(_, f)| self.has(*f))
            .map(|(name, _)| *name)
    }
}

impl BitOr for Classification {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl BitOrAssign for Classification {
    fn bitor_assign(&mut self, rhs: Self) {
        self.bits |= rhs.bits;
    }
}

impl BitAnd for Classification {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        Classification {
            bits: self.bits & rhs.bits,
        }
    }
}

/// Flag names joined by `|` (`READ_ONLY|MULTI`), or `EMPTY`.
impl fmt::Display for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = self.names();
        match names.next() {
            None => f.write_str("EMPTY"),
            Some(first) => {
                f.write_str(first)?;
                names.try_for_each(|n| write!(f, "|{n}"))
            }
        }
    }
}

/// Classifies a SQL text lexed under the default `sql_mode`; see [`Classification`] for
/// the flags. A text with no statement at all (only whitespace and comments) gets no flag.
pub fn classify(sql: &[u8]) -> Classification {
    classify_with(sql, SqlMode::DEFAULT)
}

/// Classifies a SQL text lexed under `mode` (a session's `ANSI_QUOTES` and
/// `NO_BACKSLASH_ESCAPES`), for any server ([`Server::UNKNOWN`]); otherwise as [`classify`].
pub fn classify_with(sql: &[u8], mode: SqlMode) -> Classification {
    classify_for(sql, mode, Server::UNKNOWN)
}

/// Classifies a SQL text lexed under `mode`, reading executable comments as `server` does
/// (a comment it may run or skip makes the text [`UNCERTAIN`](Classification::UNCERTAIN));
/// otherwise as [`classify`].
pub fn classify_for(sql: &[u8], mode: SqlMode, server: Server) -> Classification {
    classify_impl(sql, mode, server, false)
}

/// [`classify_for`], with `FOUND_ROWS()` and `ROW_COUNT()` taken for pure built-ins: they
/// read what the connection's previous statement left, which the split's routing handles
/// apart (see [`read_route`](crate::read_route)).
pub(crate) fn classify_history_pure(sql: &[u8], mode: SqlMode, server: Server) -> Classification {
    classify_impl(sql, mode, server, true)
}

fn classify_impl(sql: &[u8], mode: SqlMode, server: Server, history_pure: bool) -> Classification {
    let mut cursor = StmtCursor::new(sql, mode, server);
    let mut result = Classification::EMPTY;
    let mut statements = 0u32;
    loop {
        let flags = Stmt::classify(&mut cursor, history_pure);
        cursor.finish();
        if cursor.count() > 0 {
            statements += 1;
            result |= flags;
        } else if statements > 0 && cursor.is_comment_only() {
            // A statement of comments only after one: the server answers it too (`INSERT
            // ...; -- done` is two statements to it), so the text is a multi-statement.
            statements += 1;
        }
        if !cursor.advance() {
            break;
        }
    }
    if statements > 1 {
        result |= Classification::MULTI;
    }
    // (So does a text that ends inside any comment, a skipped versioned one with a comment
    // nested in it included, or inside a string: `COMMIT /*!99999 /* nested? */` commits
    // nothing, seed 2048 session 302.)
    let refused_at_parse = cursor.ends_in_exec_comment() || cursor.is_unterminated();
    if statements == 1 && refused_at_parse && cursor.server().mariadb_only() {
        // An executable comment never closed: MariaDB refuses the text at parse (1064),
        // whatever is nested in the comment, and nothing of it runs: nothing uncertain
        // about it. It goes to the primary, as a write would (its error is the primary's
        // diagnostics area; in a read-only transaction on a replica it runs beside it,
        // which stays): seed 2040 session 1356, seed 2041 session 388.
        return Classification::WRITE;
    }
    if cursor.is_uncertain() {
        result |= Classification::UNCERTAIN | Classification::WRITE;
    }
    if result.has(Classification::WRITE) {
        result = result.difference(Classification::READ_ONLY);
    }
    result
}

/// Whether the server refuses `stmt` (one statement) at parse, so that nothing of it runs:
/// for a MariaDB-only server, a text that ends inside a comment (an executable one, or a
/// skipped versioned one with a comment nested in it) or inside a string (1064, tried).
pub fn refused_at_parse(stmt: &[u8], mode: SqlMode, server: Server) -> bool {
    if !server.mariadb_only() {
        return false;
    }
    let mut cursor = StmtCursor::new(stmt, mode, server);
    while cursor.advance() {}
    cursor.ends_in_exec_comment() || cursor.is_unterminated()
}

/// The first keyword of the first non-empty statement, after any opening parentheses,
/// as it appears in the text (compare with `eq_ignore_ascii_case`). `None` if the
/// statement does not start with a word, or if an executable comment some server may run
/// and another skip comes before it (the first keyword is then not known).
pub fn first_keyword(sql: &[u8]) -> Option<&[u8]> {
    let mut cursor = StmtCursor::new(sql, SqlMode::DEFAULT, Server::UNKNOWN);
    loop {
        let mut tok = cursor.next_token();
        while tok.is_some_and(|t| t.is_punct("(")) {
            tok = cursor.next_token();
        }
        if let Some(tok) = tok {
            return (tok.kind == TokenKind::Word && !cursor.is_uncertain()).then_some(tok.text);
        }
        if !cursor.advance() {
            return None;
        }
    }
}

/// Scope of a system variable assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Default,
    Session,
    Global,
}

/// Progress through a `SET` statement's comma-separated assignments.
#[derive(Debug, Clone, Copy)]
struct SetState {
    /// The next token names the assignment target (or a scope modifier).
    at_target: bool,
    /// Still on the first assignment (where `SET PASSWORD`, `SET ROLE`... can appear).
    first: bool,
    /// The last `GLOBAL`/`SESSION` modifier, which also applies to later assignments.
    scope: Scope,
    depth: u32,
}

/// What the classifier does with the next token of a statement.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// The next token starts a statement.
    Head,
    /// Skip to the statement executed by `EXPLAIN ANALYZE` / MariaDB's `ANALYZE`.
    Inner,
    /// Nothing more to learn from the statement's structure.
    Body,
    Set(SetState),
    /// MariaDB `SET STATEMENT var=val[, ...] FOR stmt`: skip to `FOR`.
    SetStatement {
        depth: u32,
    },
    /// `GET DIAGNOSTICS`: watch for `@var =`.
    Get,
}

/// Classification state for one statement.
struct Stmt<'a> {
    flags: Classification,
    /// The statement is a query and may be read-only.
    query: bool,
    /// Something with side effects was seen.
    dirty: bool,
    /// Look for side-effect functions, `INTO`, locking reads, `:=` anywhere.
    scan: bool,
    /// A query or `SET`: report function calls ([`Classification::FUNCTION_CALL`]).
    calls: bool,
    /// Parentheses open at this point (of the scanned tokens).
    depth: u32,
    /// In the common table expressions of a `WITH`, before the query that uses them.
    ctes: bool,
    /// `FOUND_ROWS()` and `ROW_COUNT()` count as pure (see [`classify_history_pure`]).
    history_pure: bool,
    mode: Mode,
    prev: Option<Token<'a>>,
    prev2: Option<Token<'a>>,
}

impl<'a> Stmt<'a> {
    /// Consumes the current statement of `cursor` and returns its flags, with exactly one
    /// of `READ_ONLY` and `WRITE`.
    fn classify(cursor: &mut StmtCursor<'a>, history_pure: bool) -> Classification {
        let mut stmt = Stmt {
            flags: Classification::EMPTY,
            query: false,
            dirty: false,
            scan: false,
            calls: false,
            depth: 0,
            ctes: false,
            history_pure,
            mode: Mode::Head,
            prev: None,
            prev2: None,
        };
        while let Some(tok) = cursor.next_token() {
            stmt.step(tok, cursor);
            stmt.prev2 = stmt.prev;
            stmt.prev = Some(tok);
        }
        let verdict = if stmt.query && !stmt.dirty {
            Classification::READ_ONLY
        } else {
            Classification::WRITE
        };
        stmt.flags | verdict
    }

    fn set(&mut self, flags: Classification) {
        self.flags |= flags;
    }

    fn step(&mut self, tok: Token<'a>, cursor: &StmtCursor<'a>) {
        match self.mode {
            Mode::Head => self.head(tok, cursor),
            Mode::Inner => {
                let starts_inner = tok.is_punct("(")
                    || tok.kind == TokenKind::Word
                        && matches!(
                            upper(tok.text).as_bytes(),
                            b"SELECT"
                                | b"WITH"
                                | b"VALUES"
                                | b"TABLE"
                                | b"INSERT"
                                | b"REPLACE"
                                | b"UPDATE"
                                | b"DELETE"
                        );
                if starts_inner {
                    self.head(tok, cursor);
                }
            }
            Mode::Body => {}
            Mode::Set(state) => self.mode = self.set_step(state, tok, cursor),
            Mode::SetStatement { depth } => {
                self.mode = match tok.text {
                    b"(" if tok.kind == TokenKind::Punct => Mode::SetStatement {
                        depth: depth.saturating_add(1),
                    },
                    b")" if tok.kind == TokenKind::Punct => Mode::SetStatement {
                        depth: depth.saturating_sub(1),
                    },
                    _ if depth == 0 && tok.is_word("FOR") && !self.after_dot() => Mode::Head,
                    _ => Mode::SetStatement { depth },
                };
                // The variable assignments apply to this statement only (no SET flags),
                // but their values are scanned like the statement's.
            }
            Mode::Get => {
                if tok.is_punct("=") && self.prev.is_some_and(|p| p.kind == TokenKind::UserVar) {
                    self.set(Classification::SET_USER_VAR);
                }
            }
        }
        if self.scan {
            self.scan(tok, cursor);
        }
    }

    fn after_dot(&self) -> bool {
        self.prev.is_some_and(|p| p.is_punct("."))
    }

    /// Decides what the statement starting with `tok` is.
    fn head(&mut self, tok: Token<'a>, cursor: &StmtCursor<'a>) {
        type C = Classification;
        self.mode = Mode::Body;
        self.scan = true;
        // Tokens before a nested statement (`SET STATEMENT ... FOR`) are not its context.
        self.prev = None;
        self.prev2 = None;
        if tok.is_punct("(") {
            self.query = true;
            self.calls = true;
            return;
        }
        if tok.kind != TokenKind::Word {
            return;
        }
        let next = || next_keyword(cursor);
        match upper(tok.text).as_bytes() {
            b"SELECT" | b"WITH" | b"VALUES" | b"TABLE" | b"SHOW" => {
                self.query = true;
                self.calls = true;
                self.ctes = tok.is_word("WITH");
            }
            b"HELP" => self.read_only_statement(),
            b"EXPLAIN" | b"DESCRIBE" | b"DESC" => {
                if next().as_bytes() == b"ANALYZE" {
                    self.mode = Mode::Inner;
                } else {
                    self.read_only_statement();
                }
            }
            b"ANALYZE" => match next().as_bytes() {
                b"TABLE" | b"TABLES" | b"NO_WRITE_TO_BINLOG" | b"LOCAL" => {
                    self.ignore_rest(C::IMPLICIT_COMMIT)
                }
                _ => self.mode = Mode::Inner,
            },
            b"SET" => {
                self.calls = true;
                self.mode = Mode::Set(SetState {
                    at_target: true,
                    first: true,
                    scope: Scope::Default,
                    depth: 0,
                });
            }
            b"USE" => self.ignore_rest(C::USE_DB),
            b"BEGIN" => {
                if next().as_bytes() == b"NOT" {
                    self.set(C::COMPOUND);
                } else {
                    self.ignore_rest(C::BEGIN_TXN);
                }
            }
            b"START" => match next().as_bytes() {
                b"TRANSACTION" => self.ignore_rest(C::BEGIN_TXN),
                b"SLAVE" | b"REPLICA" | b"ALL" => self.ignore_rest(C::IMPLICIT_COMMIT),
                _ => self.ignore_rest(C::EMPTY),
            },
            b"COMMIT" => {
                let (_, chain) = txn_end_options(cursor);
                self.ignore_rest(if chain {
                    C::END_TXN | C::BEGIN_TXN
                } else {
                    C::END_TXN
                });
            }
            b"ROLLBACK" => match txn_end_options(cursor) {
                (true, _) => self.ignore_rest(C::SAVEPOINT),
                (false, true) => self.ignore_rest(C::END_TXN | C::BEGIN_TXN),
                (false, false) => self.ignore_rest(C::END_TXN),
            },
            b"SAVEPOINT" => self.ignore_rest(C::SAVEPOINT),
            b"RELEASE" if next().as_bytes() == b"SAVEPOINT" => self.ignore_rest(C::SAVEPOINT),
            b"XA" => self.ignore_rest(C::XA),
            b"CREATE" => {
                let mut la = cursor
                    .lookahead()
                    .filter(|t| !t.is_word("OR") && !t.is_word("REPLACE"));
                match la
                    .next()
                    .map(|t| upper(t.text))
                    .as_ref()
                    .map(|k| k.as_bytes())
                {
                    Some(b"TEMPORARY") => self.set(C::CREATE_TEMP_TABLE),
                    // CREATE TABLE ... SELECT runs the query; other bodies (views,
                    // routines, events) are only stored.
                    Some(b"TABLE") => self.set(C::IMPLICIT_COMMIT),
                    _ => self.ignore_rest(C::IMPLICIT_COMMIT),
                }
            }
            b"DROP" => match next().as_bytes() {
                b"TEMPORARY" => self.ignore_rest(C::DROP_TEMP_TABLE),
                b"PREPARE" => self.ignore_rest(C::DEALLOCATE_SQL),
                _ => self.ignore_rest(C::IMPLICIT_COMMIT),
            },
            b"ALTER" | b"RENAME" | b"TRUNCATE" | b"GRANT" | b"REVOKE" | b"INSTALL"
            | b"UNINSTALL" | b"RESET" | b"OPTIMIZE" | b"REPAIR" | b"CHECK" | b"CACHE"
            | b"CHANGE" | b"STOP" | b"IMPORT" => self.ignore_rest(C::IMPLICIT_COMMIT),
            b"FLUSH" => {
                let locks = flush_takes_lock(cursor);
                self.ignore_rest(if locks {
                    C::IMPLICIT_COMMIT | C::LOCK_TABLES
                } else {
                    C::IMPLICIT_COMMIT
                });
            }
            b"LOAD" => match next().as_bytes() {
                b"DATA" | b"XML" => {
                    let local = cursor
                        .lookahead()
                        .take(8)
                        .take_while(|t| !t.is_word("INFILE"))
                        .any(|t| t.is_word("LOCAL"));
                    self.ignore_rest(if local { C::LOAD_DATA_LOCAL } else { C::EMPTY });
                }
                b"INDEX" => self.ignore_rest(C::IMPLICIT_COMMIT),
                _ => self.ignore_rest(C::EMPTY),
            },
            b"LOCK" => match next().as_bytes() {
                b"TABLE" | b"TABLES" | b"INSTANCE" => {
                    self.ignore_rest(C::LOCK_TABLES | C::IMPLICIT_COMMIT)
                }
                _ => self.ignore_rest(C::EMPTY),
            },
            b"UNLOCK" => match next().as_bytes() {
                b"TABLE" | b"TABLES" | b"INSTANCE" => {
                    self.ignore_rest(C::UNLOCK_TABLES | C::IMPLICIT_COMMIT)
                }
                _ => self.ignore_rest(C::EMPTY),
            },
            b"BACKUP" => {
                let mut la = cursor.lookahead();
                let first = la.next().map(|t| upper(t.text));
                let second = la.next().map(|t| upper(t.text));
                let flags = match (
                    first.as_ref().map(|k| k.as_bytes()),
                    second.as_ref().map(|k| k.as_bytes()),
                ) {
                    (Some(b"UNLOCK"), _) | (Some(b"STAGE"), Some(b"END")) => C::UNLOCK_TABLES,
                    (Some(b"LOCK" | b"STAGE"), _) => C::LOCK_TABLES,
                    _ => C::EMPTY,
                };
                self.ignore_rest(flags);
            }
            b"PREPARE" => self.ignore_rest(C::PREPARE_SQL),
            b"EXECUTE" => self.ignore_rest(C::EXECUTE_SQL),
            b"DEALLOCATE" => self.ignore_rest(C::DEALLOCATE_SQL),
            b"CALL" => self.set(C::CALL),
            b"HANDLER" => self.ignore_rest(C::HANDLER),
            b"KILL" => self.ignore_rest(C::KILL),
            b"SHUTDOWN" | b"RESTART" => self.ignore_rest(C::SHUTDOWN),
            b"GET" => self.mode = Mode::Get,
            b"IF" | b"CASE" | b"WHILE" | b"LOOP" | b"REPEAT" => self.set(C::COMPOUND),
            // `label: BEGIN ... END`
            _ if cursor.peek().is_some_and(|t| t.is_punct(":")) => self.set(C::COMPOUND),
            // INSERT, UPDATE, DELETE, REPLACE, DO and the rest: writes.
            _ => {}
        }
    }

    /// A statement that only reads and whose remaining tokens are not executed.
    fn read_only_statement(&mut self) {
        self.query = true;
        self.scan = false;
    }

    /// Sets `flags` and ignores the rest of the statement.
    fn ignore_rest(&mut self, flags: Classification) {
        self.set(flags);
        self.scan = false;
    }

    /// One token of a `SET` statement; returns the next mode.
    fn set_step(&mut self, mut state: SetState, tok: Token<'a>, cursor: &StmtCursor<'a>) -> Mode {
        type C = Classification;
        if !state.at_target {
            if tok.kind == TokenKind::Punct {
                match tok.text {
                    b"(" => state.depth = state.depth.saturating_add(1),
                    b")" => state.depth = state.depth.saturating_sub(1),
                    b"," if state.depth == 0 => state.at_target = true,
                    _ => {}
                }
            }
            return Mode::Set(state);
        }
        let next_is = |kw: &str| cursor.peek().is_some_and(|t| t.is_word(kw));
        match tok.kind {
            TokenKind::Word => match upper(tok.text).as_bytes() {
                b"GLOBAL" | b"PERSIST" | b"PERSIST_ONLY" => {
                    state.scope = Scope::Global;
                    return Mode::Set(state);
                }
                b"SESSION" | b"LOCAL" => {
                    state.scope = Scope::Session;
                    return Mode::Set(state);
                }
                b"TRANSACTION" => {
                    match state.scope {
                        Scope::Default => self.set(C::SET_TRANSACTION),
                        Scope::Session => self.set(C::SET_SESSION_VAR),
                        Scope::Global => {}
                    }
                    // The characteristics list has commas of its own.
                    return Mode::Body;
                }
                b"NAMES" | b"CHARACTER" | b"CHARSET" => self.set(C::SET_SESSION_VAR),
                b"PASSWORD" if state.first => {
                    self.set(C::IMPLICIT_COMMIT);
                    return Mode::Body;
                }
                b"ROLE" if state.first => {
                    self.set(C::SET_SESSION_VAR);
                    return Mode::Body;
                }
                b"DEFAULT" if state.first && next_is("ROLE") => return Mode::Body,
                b"RESOURCE" if state.first && next_is("GROUP") => {
                    self.set(C::SET_SESSION_VAR);
                    return Mode::Body;
                }
                b"STATEMENT"
                    if state.first
                        && !cursor
                            .peek()
                            .is_some_and(|t| t.is_punct("=") || t.is_punct(":=")) =>
                {
                    return Mode::SetStatement { depth: 0 };
                }
                _ => self.assign_system_var(state.scope, tok.text),
            },
            TokenKind::QuotedIdent => {
                if let Some(name) = tok.ident() {
                    self.assign_system_var(state.scope, name);
                }
            }
            TokenKind::SysVar => {
                let (scope, name) = sysvar_parts(tok.text);
                self.assign_system_var(scope, name);
            }
            TokenKind::UserVar => self.set(C::SET_USER_VAR),
            _ => {}
        }
        state.at_target = false;
        state.first = false;
        Mode::Set(state)
    }

    fn assign_system_var(&mut self, scope: Scope, name: &[u8]) {
        if scope == Scope::Global {
            return;
        }
        self.set(Classification::SET_SESSION_VAR);
        if name.eq_ignore_ascii_case(b"autocommit") {
            self.set(Classification::AUTOCOMMIT);
        }
    }

    /// Looks for effects that can hide anywhere in an executed statement.
    fn scan(&mut self, tok: Token<'a>, cursor: &StmtCursor<'a>) {
        type C = Classification;
        let prev = self.prev;
        match tok.kind {
            TokenKind::Punct => match tok.text {
                b"(" => {
                    if let Some(name) = prev {
                        self.before_paren(name, tok, cursor);
                    }
                    self.depth = self.depth.saturating_add(1);
                }
                b")" => self.depth = self.depth.saturating_sub(1),
                b":=" if prev.is_some_and(|p| p.kind == TokenKind::UserVar) => {
                    self.set(C::SET_USER_VAR);
                    self.dirty = true;
                }
                _ => {}
            },
            // MariaDB's `seq.nextval` and `seq.currval`.
            TokenKind::Word | TokenKind::QuotedIdent if self.after_dot() => {
                match tok.ident().map(upper).as_ref().map(|k| k.as_bytes()) {
                    Some(b"NEXTVAL") => {
                        self.dirty = true;
                        self.opaque_call();
                    }
                    Some(b"CURRVAL") => self.opaque_call(),
                    _ => {}
                }
            }
            TokenKind::Word => {
                let prev_is = |kw: &str| prev.is_some_and(|p| p.is_word(kw));
                let word = upper(tok.text);
                let word = word.as_bytes();
                if self.ctes
                    && self.depth == 0
                    && matches!(
                        word,
                        b"SELECT" | b"VALUES" | b"TABLE" | b"INSERT" | b"UPDATE" | b"DELETE"
                    )
                {
                    self.ctes = false;
                }
                match word {
                    b"INTO" if self.query => {
                        self.dirty = true;
                        if cursor.peek().is_some_and(|t| t.kind == TokenKind::UserVar) {
                            self.set(C::SET_USER_VAR);
                        }
                    }
                    b"UPDATE" if prev_is("FOR") => self.locking_read(),
                    b"SHARE" if prev_is("FOR") || prev_is("IN") => self.locking_read(),
                    // Data changes after `WITH ...`.
                    b"UPDATE" | b"DELETE" if self.query => self.dirty = true,
                    // INSERT() and REPLACE() are also string functions.
                    b"INSERT" | b"REPLACE"
                        if self.query && !cursor.peek().is_some_and(|t| t.is_punct("(")) =>
                    {
                        self.dirty = true;
                    }
                    // MariaDB `NEXT VALUE FOR seq` and `PREVIOUS VALUE FOR seq`.
                    b"VALUE" if prev_is("NEXT") => {
                        self.dirty = true;
                        self.opaque_call();
                    }
                    b"VALUE" if prev_is("PREVIOUS") => self.opaque_call(),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn locking_read(&mut self) {
        self.set(Classification::SELECT_FOR_UPDATE);
        self.dirty = true;
    }

    /// `name` is followed by `paren`, a `(`: a function call, unless it is syntax
    /// (`IN (`, `AS (`...) or the column list of a common table expression.
    fn before_paren(&mut self, name: Token<'a>, paren: Token<'a>, cursor: &StmtCursor<'a>) {
        let Some(ident) = name.ident() else {
            return;
        };
        // The token before the name.
        let before = self.prev2;
        if before.is_some_and(|p| p.is_punct(".")) {
            // `db.f(`: a stored function.
            self.opaque_call();
            return;
        }
        let word = upper(ident);
        let word = word.as_bytes();
        // A quoted name still calls the built-in of that name (`GET_LOCK`(...)).
        self.builtin_effects(word, cursor);
        if !self.calls {
            return;
        }
        if name.kind == TokenKind::QuotedIdent {
            // Never a keyword, and possibly a stored function of the current database.
            self.opaque_call();
            return;
        }
        let after = |p: &str| before.is_some_and(|b| b.is_punct(p));
        let known = is_syntax_before_paren(word)
            // Without IGNORE_SPACE, `COUNT (x)` calls a stored function `count`.
            || name.end() == paren.offset && is_pure_function(word)
            || self.history_pure
                && name.end() == paren.offset
                && matches!(word, b"FOUND_ROWS" | b"ROW_COUNT")
            // `f(x) OVER (...)`, `MATCH (a) AGAINST ('x')`.
            || matches!(word, b"OVER" | b"AGAINST") && after(")")
            // `x = ANY (SELECT ...)`.
            || matches!(word, b"ANY" | b"SOME") && before.is_some_and(|b| b.kind == TokenKind::Punct)
            // `WITH c (a, b) AS (...)`: the column names of a common table expression.
            || self.ctes && self.depth == 0;
        if !known {
            self.opaque_call();
        }
    }

    /// A call of something not known to be pure (see [`Classification::FUNCTION_CALL`]).
    fn opaque_call(&mut self) {
        if self.calls {
            self.set(Classification::FUNCTION_CALL);
        }
    }

    /// The effects of calling the built-in `word` (uppercased), if it has any.
    fn builtin_effects(&mut self, word: &[u8], cursor: &StmtCursor<'a>) {
        type C = Classification;
        match word {
            b"GET_LOCK" => self.set(C::GET_LOCK),
            b"RELEASE_LOCK" | b"RELEASE_ALL_LOCKS" => self.set(C::RELEASE_LOCK),
            b"LAST_INSERT_ID" => {
                if cursor.peek().is_some_and(|t| t.is_punct(")")) {
                    return;
                }
                self.set(C::LAST_INSERT_ID_CALL);
            }
            b"SLEEP"
            | b"NEXTVAL"
            | b"SETVAL"
            | b"MASTER_POS_WAIT"
            | b"SOURCE_POS_WAIT"
            | b"MASTER_GTID_WAIT"
            | b"WAIT_FOR_EXECUTED_GTID_SET"
            | b"WAIT_UNTIL_SQL_THREAD_AFTER_GTIDS" => {}
            _ => return,
        }
        self.dirty = true;
    }
}

/// The next token's keyword, uppercased (empty if it is not a word).
fn next_keyword(cursor: &StmtCursor<'_>) -> crate::keyword::Upper {
    match cursor.peek() {
        Some(t) if t.kind == TokenKind::Word => upper(t.text),
        _ => upper(b""),
    }
}

/// For `COMMIT`/`ROLLBACK`: (`TO` savepoint, `AND CHAIN` without `NO`).
fn txn_end_options(cursor: &StmtCursor<'_>) -> (bool, bool) {
    let mut prev_no = false;
    for tok in cursor.lookahead().take(8) {
        if tok.is_word("TO") {
            return (true, false);
        }
        if tok.is_word("CHAIN") {
            return (false, !prev_no);
        }
        prev_no = tok.is_word("NO");
    }
    (false, false)
}

/// `FLUSH TABLES ... WITH READ LOCK` or `FLUSH TABLES ... FOR EXPORT`.
fn flush_takes_lock(cursor: &StmtCursor<'_>) -> bool {
    let mut prev: Option<Token<'_>> = None;
    for tok in cursor.lookahead() {
        let after = |kw: &str| prev.is_some_and(|p| p.is_word(kw));
        if tok.is_word("READ") && after("WITH") || tok.is_word("EXPORT") && after("FOR") {
            return true;
        }
        prev = Some(tok);
    }
    false
}

/// Splits a `@@[scope.]name` token into its scope and name.
fn sysvar_parts(text: &[u8]) -> (Scope, &[u8]) {
    let name = text.strip_prefix(b"@@").unwrap_or(text);
    if let Some(dot) = name.iter().position(|&c| c == b'.') {
        let (prefix, rest) = (&name[..dot], &name[dot + 1..]);
        let scope = match upper(prefix).as_bytes() {
            b"GLOBAL" | b"PERSIST" | b"PERSIST_ONLY" => Some(Scope::Global),
            b"SESSION" | b"LOCAL" => Some(Scope::Session),
            _ => None,
        };
        if let Some(scope) = scope {
            return (
                scope,
                rest.strip_prefix(b"`")
                    .and_then(|r| r.strip_suffix(b"`"))
                    .unwrap_or(rest),
            );
        }
    }
    (Scope::Default, name)
}
