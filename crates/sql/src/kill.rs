//! `KILL [HARD | SOFT] [CONNECTION | QUERY [ID]] <number>`: which thread (or query) a
//! lone KILL statement names, so that a proxy can map its own connection ids to the
//! server's.

use std::ops::Range;

use crate::lexer::{SqlMode, TokenKind};
use crate::server::Server;
use crate::split::StmtCursor;

/// What a `KILL` statement asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// `KILL QUERY`: only the running statement, not the connection.
    pub query: bool,
    /// The number is a thread id (not a `KILL QUERY ID` query id).
    pub thread: bool,
    /// The number.
    pub id: u64,
    /// Where the number is in the text.
    pub id_span: Range<usize>,
}

/// The words of a `KILL` statement before what it names: `KILL [HARD | SOFT]
/// [CONNECTION | QUERY [ID]]`, then `USER <account>` or an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillHead {
    /// `KILL QUERY`: only the running statement, not the connection.
    pub query: bool,
    /// What follows names a thread (not a `KILL QUERY ID` query id).
    pub thread: bool,
    /// `KILL ... USER <account>`: every connection of an account.
    pub user: bool,
    /// Where the target (the expression, or `USER`) starts in the text: the text before
    /// it followed by a thread id is the same `KILL` of that thread.
    pub target: usize,
}

/// The head of `sql` when it is a `KILL` statement (whatever its target).
pub fn parse_kill_head(sql: &[u8], mode: SqlMode) -> Option<KillHead> {
    let mut cursor = StmtCursor::new(sql, mode, Server::UNKNOWN);
    let (query, thread, tok) = kill_words(&mut cursor)?;
    // An executable comment some server skips may hide the head's words.
    if cursor.is_uncertain() {
        return None;
    }
    Some(KillHead {
        query,
        thread,
        user: tok.is_word("USER"),
        target: tok.offset,
    })
}

/// Reads `KILL [HARD|SOFT] [CONNECTION | QUERY [ID]]`: whether it names a query, whether
/// what follows is a thread, and the target's first token.
fn kill_words<'a>(cursor: &mut StmtCursor<'a>) -> Option<(bool, bool, crate::lexer::Token<'a>)> {
    let mut tok = cursor.next_token()?;
    if !tok.is_word("KILL") {
        return None;
    }
    tok = cursor.next_token()?;
    if tok.is_word("HARD") || tok.is_word("SOFT") {
        tok = cursor.next_token()?;
    }
    let (mut query, mut thread) = (false, true);
    if tok.is_word("CONNECTION") {
        tok = cursor.next_token()?;
    } else if tok.is_word("QUERY") {
        query = true;
        tok = cursor.next_token()?;
        if tok.is_word("ID") {
            thread = false;
            tok = cursor.next_token()?;
        }
    }
    Some((query, thread, tok))
}

/// A statement about an SQL-level prepared statement (`PREPARE name FROM ..`, `EXECUTE
/// name ..`, `DEALLOCATE | DROP PREPARE name`), the name in lower case (names are not
/// case-sensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlPrepared {
    /// `PREPARE name FROM 'text'`.
    Prepare {
        /// The statement's name, in lower case.
        name: Vec<u8>,
        /// The text when it is a plain string literal (no prefix, no backslash); `None`
        /// for `FROM @variable` and the rest.
        text: Option<Vec<u8>>,
    },
    /// `EXECUTE name [USING ...]`.
    Execute {
        /// The statement's name, in lower case.
        name: Vec<u8>,
    },
    /// `DEALLOCATE PREPARE name`, `DROP PREPARE name`.
    Deallocate {
        /// The statement's name, in lower case.
        name: Vec<u8>,
    },
}

/// `sql` when it is exactly one statement about an SQL-level prepared statement.
pub fn parse_sql_prepared(sql: &[u8], mode: SqlMode) -> Option<SqlPrepared> {
    let mut cursor = StmtCursor::new(sql, mode, Server::UNKNOWN);
    let first = cursor.next_token()?;
    let name_of = |t: Option<crate::lexer::Token<'_>>| -> Option<Vec<u8>> {
        Some(t?.ident()?.to_ascii_lowercase())
    };
    let out = if first.is_word("PREPARE") {
        let name = name_of(cursor.next_token())?;
        if !cursor.next_token()?.is_word("FROM") {
            return None;
        }
        let source = cursor.next_token()?;
        let text = (source.kind == TokenKind::String)
            .then(|| plain_string(source.text))
            .flatten();
        SqlPrepared::Prepare { name, text }
    } else if first.is_word("EXECUTE") {
        let name = name_of(cursor.next_token())?;
        match cursor.next_token() {
            None => {}
            Some(t) if t.is_word("USING") => while cursor.next_token().is_some() {},
            Some(_) => return None,
        }
        SqlPrepared::Execute { name }
    } else if first.is_word("DEALLOCATE") || first.is_word("DROP") {
        if !cursor.next_token()?.is_word("PREPARE") {
            return None;
        }
        SqlPrepared::Deallocate {
            name: name_of(cursor.next_token())?,
        }
    } else {
        return None;
    };
    if cursor.next_token().is_some() {
        return None;
    }
    while cursor.advance() {
        if cursor.next_token().is_some() {
            return None;
        }
    }
    Some(out)
}

/// The contents of a quoted string literal without prefix or backslash (doubled quotes
/// undone).
fn plain_string(text: &[u8]) -> Option<Vec<u8>> {
    let (&quote, rest) = text.split_first()?;
    if !matches!(quote, b'\'' | b'"') || text.contains(&b'\\') {
        return None;
    }
    let inner = rest.strip_suffix(&[quote])?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if b == quote && bytes.peek() == Some(&quote) {
            bytes.next();
        }
        out.push(b);
    }
    Some(out)
}

/// The `KILL` of `sql` when the text is exactly one such statement with a plain decimal
/// number (`KILL CONNECTION_ID()`, a variable, several statements, or an executable
/// comment some server may skip give `None`).
pub fn parse_kill(sql: &[u8], mode: SqlMode) -> Option<Kill> {
    let mut cursor = StmtCursor::new(sql, mode, Server::UNKNOWN);
    let (query, thread, tok) = kill_words(&mut cursor)?;
    if tok.kind != TokenKind::Number || !tok.text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let id = std::str::from_utf8(tok.text).ok()?.parse().ok()?;
    if cursor.next_token().is_some() {
        return None;
    }
    while cursor.advance() {
        if cursor.next_token().is_some() {
            return None;
        }
    }
    if cursor.is_uncertain() {
        return None;
    }
    Some(Kill {
        query,
        thread,
        id,
        id_span: tok.offset..tok.end(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(sql: &str) -> Option<Kill> {
        parse_kill(sql.as_bytes(), SqlMode::DEFAULT)
    }

    #[test]
    fn kill_forms() {
        let k = kill("KILL 1073741825").unwrap();
        assert_eq!((k.query, k.thread, k.id), (false, true, 1_073_741_825));
        assert_eq!(&"KILL 1073741825"[k.id_span], "1073741825");
        let k = kill("  kill /* x */ hard query 7 ;").unwrap();
        assert_eq!((k.query, k.thread, k.id), (true, true, 7));
        assert_eq!(
            kill("KILL CONNECTION 9").map(|k| (k.query, k.id)),
            Some((false, 9))
        );
        assert_eq!(kill("KILL QUERY ID 5").map(|k| k.thread), Some(false));
        for not in [
            "KILL CONNECTION_ID()",
            "KILL @id",
            "KILL 1; SELECT 1",
            "KILL 0x10",
            "KILL 1.5",
            "SELECT 1",
            "KILL USER app",
            "KILL",
            "KILL 99999999999999999999999",
        ] {
            assert_eq!(kill(not), None, "{not}");
        }
    }

    #[test]
    fn kill_heads() {
        let head = |sql: &str| parse_kill_head(sql.as_bytes(), SqlMode::DEFAULT);
        let sql = "KILL HARD QUERY (SELECT 5)";
        let h = head(sql).unwrap();
        assert_eq!((h.query, h.thread, h.user), (true, true, false));
        assert_eq!(&sql[..h.target], "KILL HARD QUERY ");
        let h = head("kill soft connection user v").unwrap();
        assert_eq!((h.query, h.user), (false, true));
        let h = head("KILL @v").unwrap();
        assert_eq!((h.query, h.user, h.target), (false, false, 5));
        assert!(!head("KILL QUERY ID 5").unwrap().thread);
        assert_eq!(head("SELECT 1"), None);
        assert_eq!(head("KILL"), None);
    }

    #[test]
    fn sql_prepared_statements() {
        let p = |sql: &str| parse_sql_prepared(sql.as_bytes(), SqlMode::DEFAULT);
        assert_eq!(
            p("PREPARE K FROM 'KILL ?'"),
            Some(SqlPrepared::Prepare {
                name: b"k".to_vec(),
                text: Some(b"KILL ?".to_vec())
            })
        );
        assert_eq!(
            p("prepare `s` from 'it''s'"),
            Some(SqlPrepared::Prepare {
                name: b"s".to_vec(),
                text: Some(b"it's".to_vec())
            })
        );
        assert_eq!(
            p("PREPARE s FROM @sql"),
            Some(SqlPrepared::Prepare {
                name: b"s".to_vec(),
                text: None
            })
        );
        assert_eq!(
            p("EXECUTE S USING @a, @b"),
            Some(SqlPrepared::Execute {
                name: b"s".to_vec()
            })
        );
        assert_eq!(
            p("DROP PREPARE s"),
            Some(SqlPrepared::Deallocate {
                name: b"s".to_vec()
            })
        );
        assert_eq!(p("EXECUTE s; SELECT 1"), None);
        assert_eq!(p("EXECUTE s 1"), None);
    }
}
