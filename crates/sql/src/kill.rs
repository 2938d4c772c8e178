//! `KILL [HARD | SOFT] [CONNECTION | QUERY [ID]] <number>`: which thread (or query) a
//! lone KILL statement names, so that a proxy can map its own connection ids to the
//! server's.

use std::ops::Range;

use crate::lexer::{SqlMode, TokenKind};
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
    let mut cursor = StmtCursor::new(sql, mode);
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
    Some(KillHead {
        query,
        thread,
        user: tok.is_word("USER"),
        target: tok.offset,
    })
}

/// The `KILL` of `sql` when the text is exactly one such statement with a plain decimal
/// number (`KILL CONNECTION_ID()`, a variable, or several statements give `None`).
pub fn parse_kill(sql: &[u8], mode: SqlMode) -> Option<Kill> {
    let mut cursor = StmtCursor::new(sql, mode);
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
}
