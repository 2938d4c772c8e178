//! Statements by which a session changes its own account's password (`SET PASSWORD`,
//! `ALTER USER ... IDENTIFIED BY`), so that a proxy that logs the session in again on
//! another server knows the new password, or knows that it cannot.

use crate::lexer::{Lexer, SqlMode, Token, TokenKind};

/// What a statement does to the password of the account named `user`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordChange {
    /// Set to this password, given in plain text (`PASSWORD('x')`, `IDENTIFIED BY 'x'`).
    Plain(Vec<u8>),
    /// Set to something that cannot be logged in with from here: a hash
    /// (`SET PASSWORD = '*...'`, `IDENTIFIED BY PASSWORD`), another plugin (`IDENTIFIED
    /// VIA ...`), or a value the statement computes.
    Other,
}

/// The change `sql` makes to the password of accounts named `user` (any host: the
/// statement may name the session's own account by name), when it is one
/// `SET PASSWORD [FOR account] = ...` or `ALTER USER ... account IDENTIFIED ...` that
/// applies to it (no `FOR`, `CURRENT_USER`, or `user`); `None` for anything else.
pub fn own_password_change(sql: &[u8], mode: SqlMode, user: &[u8]) -> Option<PasswordChange> {
    let tokens: Vec<Token> = Lexer::with_mode(sql, mode).collect();
    // One statement only (a trailing `;` allowed).
    let end = match tokens.iter().position(|t| t.is_punct(";")) {
        Some(i) if i + 1 == tokens.len() => i,
        Some(_) => return None,
        None => tokens.len(),
    };
    let t = tokens.get(..end)?;
    if t.first()?.is_word("SET") && t.get(1)?.is_word("PASSWORD") {
        let mut i = 2;
        if t.get(i)?.is_word("FOR") {
            let (own, next) = account(t, i + 1, user)?;
            if !own {
                return None;
            }
            i = next;
        }
        if !t.get(i)?.is_punct("=") {
            return None;
        }
        return Some(match t.get(i + 1..)? {
            [f, open, s, close]
                if f.is_word("PASSWORD")
                    && open.is_punct("(")
                    && s.kind == TokenKind::String
                    && close.is_punct(")") =>
            {
                match unquote(s.text, mode) {
                    Some(p) => PasswordChange::Plain(p),
                    None => PasswordChange::Other,
                }
            }
            _ => PasswordChange::Other,
        });
    }
    if t.first()?.is_word("ALTER") && t.get(1)?.is_word("USER") {
        let mut i = 2;
        if t.get(i).is_some_and(|x| x.is_word("IF")) && t.get(i + 1)?.is_word("EXISTS") {
            i += 2;
        }
        loop {
            let (own, next) = account(t, i, user)?;
            i = next;
            let change = if t.get(i).is_some_and(|x| x.is_word("IDENTIFIED")) {
                let c = match (t.get(i + 1), t.get(i + 2)) {
                    (Some(by), Some(s)) if by.is_word("BY") && s.kind == TokenKind::String => {
                        i += 3;
                        match unquote(s.text, mode) {
                            Some(p) => PasswordChange::Plain(p),
                            None => PasswordChange::Other,
                        }
                    }
                    _ => PasswordChange::Other,
                };
                Some(c)
            } else {
                None
            };
            if own {
                return change;
            }
            // The next account of the list, if any (skipping what this one's clause holds).
            i = (i..t.len()).find(|&j| t[j].is_punct(","))? + 1;
        }
    }
    None
}

/// Reads an account at `t[i]` (`CURRENT_USER[()]`, `name`, `name@host`): whether it is
/// `user`'s, and where the tokens after it start.
fn account(t: &[Token], i: usize, user: &[u8]) -> Option<(bool, usize)> {
    let name = t.get(i)?;
    if name.is_word("CURRENT_USER") {
        let next = match (t.get(i + 1), t.get(i + 2)) {
            (Some(o), Some(c)) if o.is_punct("(") && c.is_punct(")") => i + 3,
            _ => i + 1,
        };
        return Some((true, next));
    }
    let bytes = match name.kind {
        TokenKind::String => unquote(name.text, SqlMode::DEFAULT)?,
        TokenKind::Word | TokenKind::QuotedIdent => name.ident()?.to_vec(),
        _ => return None,
    };
    let mut next = i + 1;
    if t.get(next).is_some_and(|h| h.kind == TokenKind::UserVar) {
        next += 1;
    }
    Some((bytes == user, next))
}

/// The value of a plain string literal token (`'x'`, `"x"`, with doubled quotes and, unless
/// NO_BACKSLASH_ESCAPES, backslash escapes); `None` for prefixed literals (`_utf8'x'`,
/// `X'..'`), whose bytes this does not decode.
fn unquote(text: &[u8], mode: SqlMode) -> Option<Vec<u8>> {
    let (&q, rest) = text.split_first()?;
    if q != b'\'' && q != b'"' {
        return None;
    }
    let inner = rest.strip_suffix(&[q])?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' if !mode.no_backslash_escapes => {
                let e = bytes.next()?;
                out.push(match e {
                    b'n' => b'\n',
                    b't' => b'\t',
                    b'r' => b'\r',
                    b'0' => 0,
                    b'b' => 8,
                    b'Z' => 26,
                    other => other,
                });
            }
            _ if b == q => {
                // A doubled quote stands for one.
                bytes.next();
                out.push(q);
            }
            _ => out.push(b),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use PasswordChange::*;

    fn change(sql: &str) -> Option<PasswordChange> {
        own_password_change(sql.as_bytes(), SqlMode::DEFAULT, b"app")
    }

    #[test]
    fn own_changes_in_plain_text() {
        let plain = |p: &str| Some(Plain(p.as_bytes().to_vec()));
        assert_eq!(change("SET PASSWORD = PASSWORD('n3w')"), plain("n3w"));
        assert_eq!(change("set password=password(\"a'b\");"), plain("a'b"));
        assert_eq!(change("SET PASSWORD FOR app = PASSWORD('x')"), plain("x"));
        assert_eq!(
            change("SET PASSWORD FOR 'app'@'%' = PASSWORD('x')"),
            plain("x")
        );
        assert_eq!(
            change("SET PASSWORD FOR CURRENT_USER() = PASSWORD('x')"),
            plain("x")
        );
        assert_eq!(
            change("ALTER USER CURRENT_USER() IDENTIFIED BY 'it''s'"),
            plain("it's")
        );
        assert_eq!(
            change("ALTER USER app@localhost IDENTIFIED BY 'a\\\\b'"),
            plain("a\\b")
        );
        assert_eq!(
            change("ALTER USER IF EXISTS 'x'@'%' IDENTIFIED BY 'p1', 'app'@'%' IDENTIFIED BY 'p2'"),
            plain("p2")
        );
        assert_eq!(
            own_password_change(
                b"ALTER USER app IDENTIFIED BY 'a\\b'",
                SqlMode::NO_BACKSLASH_ESCAPES,
                b"app"
            ),
            plain("a\\b")
        );
    }

    #[test]
    fn own_changes_holdfast_cannot_follow() {
        assert_eq!(
            change("SET PASSWORD = '*E8D46CE25265E545D225A8A6F1BAF642FEBEE5CB'"),
            Some(Other)
        );
        assert_eq!(
            change("ALTER USER app IDENTIFIED BY PASSWORD '*E8D4'"),
            Some(Other)
        );
        assert_eq!(
            change("ALTER USER app IDENTIFIED VIA ed25519 USING PASSWORD('x')"),
            Some(Other)
        );
        assert_eq!(
            change("SET PASSWORD = PASSWORD(CONCAT('a', 'b'))"),
            Some(Other)
        );
        assert_eq!(change("SET PASSWORD = PASSWORD(_utf8mb4'x')"), Some(Other));
    }

    #[test]
    fn other_accounts_and_statements_are_not_changes() {
        assert_eq!(change("SET PASSWORD FOR other = PASSWORD('x')"), None);
        assert_eq!(change("ALTER USER other IDENTIFIED BY 'x'"), None);
        assert_eq!(change("ALTER USER app ACCOUNT LOCK"), None);
        assert_eq!(change("SET @password = 'x'"), None);
        assert_eq!(change("SELECT PASSWORD('x')"), None);
        assert_eq!(change("SET PASSWORD = PASSWORD('x'); SELECT 1"), None);
        assert_eq!(change("SET PASSWORD FOR"), None);
        assert_eq!(change(""), None);
    }
}
