//! Writing values into SQL text so that the server reads them back exactly, whatever the
//! session's `sql_mode`.
//!
//! Two modes change how MariaDB reads a quoted literal: `NO_BACKSLASH_ESCAPES` (a `\` is
//! an ordinary character instead of an escape) and `ANSI_QUOTES` (`"` quotes identifiers,
//! not strings). The spellings here avoid both: strings use `'` only, with `'` doubled
//! (read the same in every mode), and anything containing a backslash, a control byte or
//! non-ASCII text is written as a hex literal, which has no escapes at all. Identifiers
//! use backquotes, which MariaDB accepts with and without `ANSI_QUOTES`.
//!
//! ```
//! use holdfast_sql::quote;
//!
//! assert_eq!(quote::string_literal("it's"), "'it''s'");
//! assert_eq!(quote::string_literal("a\\b"), "CONVERT(X'615C62' USING utf8mb4)");
//! assert_eq!(quote::bytes_literal(b"\0\xff"), "X'00FF'");
//! assert_eq!(quote::identifier("we`ird"), "`we``ird`");
//! assert!(quote::plain_string_literal("back\\slash").is_err());
//! ```

use std::fmt::Write as _;

/// Why a value cannot be written as a plain `'…'` literal that reads the same in every
/// `sql_mode`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuoteError {
    /// A backslash reads as an escape unless `NO_BACKSLASH_ESCAPES` is on, and `\\` reads
    /// as two backslashes when it is: no plain spelling works in both.
    #[error("the value contains a backslash, which no plain SQL string literal writes the same under every sql_mode")]
    Backslash,
    /// A control byte (NUL, newline, …) would travel raw inside the statement text.
    #[error("the value contains the control character {0:#04x}")]
    Control(u8),
}

/// Whether `b` may stand unescaped inside `'…'` (printable ASCII other than `\`).
fn plain_ascii(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'\\'
}

/// `'s'` with `'` doubled: only for text known to be [`plain_ascii`] (or non-ASCII UTF-8).
fn single_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    out.push_str(&s.replace('\'', "''"));
    out.push('\'');
    out
}

/// Upper-case hex digits of `bytes`, without prefix (`C3A9` for `é`).
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02X}");
    }
    out
}

/// A character-string expression for `s`, for any place that takes an expression (`SET`,
/// `SELECT`, function arguments, `VALUES`): `'…'` (quotes doubled) for printable ASCII
/// without backslashes, `CONVERT(X'…' USING utf8mb4)` otherwise. It reads the same under
/// any `sql_mode` and any connection character set (every MariaDB client character set is
/// ASCII-compatible).
pub fn string_literal(s: &str) -> String {
    if s.bytes().all(plain_ascii) {
        single_quoted(s)
    } else {
        format!("CONVERT(X'{}' USING utf8mb4)", hex(s.as_bytes()))
    }
}

/// A binary-string literal for `bytes`: `X'…'` (the empty string is `X''`).
pub fn bytes_literal(bytes: &[u8]) -> String {
    format!("X'{}'", hex(bytes))
}

/// A plain `'…'` literal for the places in MariaDB's grammar that take only a quoted
/// string, not an expression (`CHANGE MASTER TO MASTER_PASSWORD=…`, `IDENTIFIED BY …`):
/// `'` doubled, nothing else escaped. Values with a backslash or a control character are
/// refused because no plain spelling reads the same with and without
/// `NO_BACKSLASH_ESCAPES`. Non-ASCII text is kept as UTF-8, so the connection's character
/// set must be `utf8mb4` for it to read back unchanged.
pub fn plain_string_literal(s: &str) -> Result<String, QuoteError> {
    if let Some(b) = s.bytes().find(|b| !plain_ascii(*b) && b.is_ascii()) {
        return Err(if b == b'\\' {
            QuoteError::Backslash
        } else {
            QuoteError::Control(b)
        });
    }
    Ok(single_quoted(s))
}

/// A backquoted identifier (backquotes doubled). MariaDB reads backquotes as identifier
/// quotes with or without `ANSI_QUOTES`, and backslashes are not escapes inside them.
pub fn identifier(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings() {
        assert_eq!(string_literal(""), "''");
        assert_eq!(string_literal("it's \"x\""), "'it''s \"x\"'");
        assert_eq!(string_literal("a\\b"), "CONVERT(X'615C62' USING utf8mb4)");
        assert_eq!(string_literal("é"), "CONVERT(X'C3A9' USING utf8mb4)");
        assert_eq!(string_literal("a\nb"), "CONVERT(X'610A62' USING utf8mb4)");
        assert_eq!(string_literal("\0"), "CONVERT(X'00' USING utf8mb4)");
    }

    #[test]
    fn bytes_and_identifiers() {
        assert_eq!(bytes_literal(b""), "X''");
        assert_eq!(bytes_literal(&[0, 0x5c, 0xff]), "X'005CFF'");
        assert_eq!(identifier("we`ird"), "`we``ird`");
        assert_eq!(identifier("a\\b\"c"), "`a\\b\"c`");
        assert_eq!(identifier(""), "``");
    }

    #[test]
    fn plain_strings() {
        assert_eq!(plain_string_literal("p'w\"d").as_deref(), Ok("'p''w\"d'"));
        assert_eq!(plain_string_literal("é").as_deref(), Ok("'é'"));
        assert_eq!(plain_string_literal("a\\b"), Err(QuoteError::Backslash));
        assert_eq!(plain_string_literal("a\0"), Err(QuoteError::Control(0)));
        assert_eq!(plain_string_literal("\x7f"), Err(QuoteError::Control(0x7f)));
    }

    #[test]
    fn plain_ascii_literals_never_contain_a_lone_quote() {
        // Every quote inside the literal is doubled, so the literal ends where it should.
        for s in ["'", "''", "a'", "'a", "x'''y"] {
            let lit = string_literal(s);
            let inner = &lit[1..lit.len() - 1];
            assert_eq!(inner.replace("''", ""), s.replace('\'', ""), "{lit}");
        }
    }
}
