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

/// The `KILL` of `sql` when the text is exactly one such statement with a plain decimal
/// number (`KILL CONNECTION_ID()`, a variable, several statements, or an executable
/// comment some server may skip give `None`).
pub fn parse_kill(sql: &[u8], mode: SqlMode) -> Option<Kill> {
    let mut cursor = StmtCursor::new(sql, mode, Server::UNKNOWN);
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
}
