//! Byte-level MySQL/MariaDB tokenizer.

use crate::server::{Run, Server};

/// The parts of a session's `sql_mode` that change how SQL text is tokenized.
///
/// Only two modes do: `ANSI_QUOTES` (`"..."` quotes an identifier, not a string) and
/// `NO_BACKSLASH_ESCAPES` (a backslash in a string is an ordinary character). The default
/// is neither, as on a server with the default `sql_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SqlMode {
    /// `ANSI_QUOTES` (also implied by the `ANSI`, `ORACLE`, `DB2`, `MSSQL`, `MAXDB` and
    /// `POSTGRESQL` combinations).
    pub ansi_quotes: bool,
    /// `NO_BACKSLASH_ESCAPES`.
    pub no_backslash_escapes: bool,
}

impl SqlMode {
    /// Neither mode: the server's default.
    pub const DEFAULT: SqlMode = SqlMode {
        ansi_quotes: false,
        no_backslash_escapes: false,
    };
    /// `ANSI_QUOTES` alone.
    pub const ANSI_QUOTES: SqlMode = SqlMode {
        ansi_quotes: true,
        no_backslash_escapes: false,
    };
    /// `NO_BACKSLASH_ESCAPES` alone.
    pub const NO_BACKSLASH_ESCAPES: SqlMode = SqlMode {
        ansi_quotes: false,
        no_backslash_escapes: true,
    };

    /// Reads the lexer-relevant modes out of an `sql_mode` value as the server reports it
    /// (`STRICT_TRANS_TABLES,ANSI_QUOTES,...`, any case, names separated by commas).
    pub fn parse(sql_mode: &[u8]) -> SqlMode {
        let mut mode = SqlMode::DEFAULT;
        for name in sql_mode.split(|&c| c == b',') {
            let name = name.trim_ascii();
            let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
            if is("ANSI_QUOTES")
                || is("ANSI")
                || is("ORACLE")
                || is("DB2")
                || is("MSSQL")
                || is("MAXDB")
                || is("POSTGRESQL")
            {
                mode.ansi_quotes = true;
            } else if is("NO_BACKSLASH_ESCAPES") {
                mode.no_backslash_escapes = true;
            }
        }
        mode
    }

    /// The modes other than [`SqlMode::DEFAULT`] under which `sql` may tokenize
    /// differently: those with `ANSI_QUOTES` only if `sql` holds a `"`, those with
    /// `NO_BACKSLASH_ESCAPES` only if it holds a `\`. Empty for most texts.
    ///
    /// For a caller that does not know the session's mode and must not guess: a verdict
    /// that holds under [`SqlMode::DEFAULT`] and each of these holds under any mode.
    pub fn alternatives(sql: &[u8]) -> impl Iterator<Item = SqlMode> {
        let quotes = sql.contains(&b'"');
        let backslash = sql.contains(&b'\\');
        [(true, false), (false, true), (true, true)]
            .into_iter()
            .filter(move |&(a, b)| (!a || quotes) && (!b || backslash))
            .map(|(ansi_quotes, no_backslash_escapes)| SqlMode {
                ansi_quotes,
                no_backslash_escapes,
            })
    }
}

/// What kind of token a [`Token`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// A bare word: keyword or unquoted identifier (`SELECT`, `t1`, `_utf8mb4`, `1abc`).
    Word,
    /// A quoted string literal, including its quotes and any prefix: `'a'`, `"a"` (not
    /// under `ANSI_QUOTES`), `N'a'`, `X'0F'`, `B'01'`, `_utf8mb4'a'`.
    String,
    /// A quoted identifier, including its quotes: `` `my table` ``, and `"my table"` under
    /// `ANSI_QUOTES`.
    QuotedIdent,
    /// A numeric literal: `1`, `1.5`, `.5`, `1e-3`, `0x1F`, `0b101`.
    Number,
    /// A user variable, including the `@`: `@a`, `@'a b'`, `` @`a` ``.
    UserVar,
    /// A system variable, including the `@@` and any scope: `@@x`, `@@session.x`.
    SysVar,
    /// An operator or punctuation: one byte, or one of `:=`, `<=>`, `<=`, `>=`, `<>`, `!=`,
    /// `<<`, `>>`, `&&`, `||`, `->`, `->>`.
    Punct,
}

/// One token of SQL text, borrowing from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    /// The token's kind.
    pub kind: TokenKind,
    /// The token's raw bytes, exactly as they appear in the input.
    pub text: &'a [u8],
    /// Byte offset of the token's first byte in the input.
    pub offset: usize,
}

impl<'a> Token<'a> {
    /// Byte offset just past the token's last byte.
    pub const fn end(&self) -> usize {
        self.offset + self.text.len()
    }

    /// True for a [`TokenKind::Word`] equal to `keyword`, ignoring ASCII case.
    pub fn is_word(&self, keyword: &str) -> bool {
        self.kind == TokenKind::Word && self.text.eq_ignore_ascii_case(keyword.as_bytes())
    }

    /// True for a [`TokenKind::Punct`] whose text is exactly `punct`.
    pub fn is_punct(&self, punct: &str) -> bool {
        self.kind == TokenKind::Punct && self.text == punct.as_bytes()
    }

    /// The identifier a word or quoted identifier names: the word itself, or the bytes
    /// between the quotes (doubled quotes are left as they are).
    pub fn ident(&self) -> Option<&'a [u8]> {
        match self.kind {
            TokenKind::Word => Some(self.text),
            TokenKind::QuotedIdent => {
                let (&quote, inner) = self.text.split_first()?;
                Some(inner.strip_suffix(&[quote]).unwrap_or(inner))
            }
            _ => None,
        }
    }
}

/// Tokenizer over SQL text, yielding [`Token`]s and skipping whitespace and comments.
///
/// Executable comments (`/*! ... */`, `/*!50100 ... */`, `/*M! ... */`,
/// `/*M!100100 ... */`) are read as the [`Server`] the text runs on reads them: the
/// content of one it runs is code, one it skips is a comment (quotes and `--` inside it
/// mean nothing). A comment the possible servers do not all treat alike (by default,
/// [`Server::UNKNOWN`]: any server, so any version from 5.5.1 on) is tokenized as code
/// and makes the text uncertain ([`Lexer::is_uncertain`]): what runs is not known.
/// Optimizer hints (`/*+ ... */`) are comments.
///
/// Quoting follows a [`SqlMode`]: by default (as [`Lexer::new`]) backslash escapes in
/// strings are honoured and `"` quotes strings; [`Lexer::with_mode`] follows a session's
/// `ANSI_QUOTES` and `NO_BACKSLASH_ESCAPES`.
///
/// An unterminated string, identifier or comment ends the token stream; see
/// [`Lexer::is_unterminated`]. The lexer never panics and always makes progress.
#[derive(Debug, Clone)]
pub struct Lexer<'a> {
    src: &'a [u8],
    mode: SqlMode,
    server: Server,
    pos: usize,
    in_exec_comment: bool,
    unterminated: bool,
    uncertain: bool,
}

impl<'a> Lexer<'a> {
    /// Starts tokenizing `src` from its beginning, under the default `sql_mode`.
    pub const fn new(src: &'a [u8]) -> Self {
        Self::with_mode(src, SqlMode::DEFAULT)
    }

    /// Starts tokenizing `src` from its beginning, quoting as `mode` says, for any server
    /// ([`Server::UNKNOWN`]).
    pub const fn with_mode(src: &'a [u8], mode: SqlMode) -> Self {
        Self::for_server(src, mode, Server::UNKNOWN)
    }

    /// Starts tokenizing `src` from its beginning, quoting as `mode` says and running the
    /// executable comments `server` runs.
    pub const fn for_server(src: &'a [u8], mode: SqlMode, server: Server) -> Self {
        Lexer {
            src,
            mode,
            server,
            pos: 0,
            in_exec_comment: false,
            unterminated: false,
            uncertain: false,
        }
    }

    /// The `sql_mode` the lexer follows.
    pub const fn mode(&self) -> SqlMode {
        self.mode
    }

    /// The servers whose reading of executable comments the lexer follows.
    pub const fn server(&self) -> Server {
        self.server
    }

    /// True once the lexer met an executable comment that the possible servers do not all
    /// run (or skip) alike: the tokens so far may not be what the server runs.
    pub const fn is_uncertain(&self) -> bool {
        self.uncertain
    }

    /// True when the text ended inside an executable comment the lexer read as code (no
    /// `*/` closed it). MariaDB refuses such a text at parse (1064, `MY_LEX_EOL` with a
    /// comment open), whatever comments are nested in it.
    pub const fn ends_in_exec_comment(&self) -> bool {
        self.in_exec_comment
    }

    /// Byte offset of the next byte the lexer will look at.
    pub const fn position(&self) -> usize {
        self.pos
    }

    /// True once the lexer stopped at an unterminated string, quoted identifier or
    /// comment (the rest of the input was not tokenized).
    pub const fn is_unterminated(&self) -> bool {
        self.unterminated
    }

    fn peek_at(&self, i: usize) -> Option<u8> {
        self.src.get(i).copied()
    }

    /// Stops the token stream for good.
    fn stop_unterminated(&mut self) -> Option<Token<'a>> {
        self.pos = self.src.len();
        self.unterminated = true;
        None
    }

    fn token(&mut self, kind: TokenKind, start: usize, end: usize) -> Option<Token<'a>> {
        self.pos = end;
        Some(Token {
            kind,
            text: &self.src[start..end],
            offset: start,
        })
    }

    /// Skips whitespace and comments. Returns false if an unterminated comment was hit.
    fn skip_trivia(&mut self) -> bool {
        let src = self.src;
        while let Some(&c) = src.get(self.pos) {
            match c {
                b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                b'#' => self.pos = line_end(src, self.pos),
                // `--` starts a comment when a space or a control character (or the end)
                // follows.
                b'-' if src.get(self.pos + 1) == Some(&b'-')
                    && src
                        .get(self.pos + 2)
                        .is_none_or(|&c| c <= b' ' || c == 0x7f) =>
                {
                    self.pos = line_end(src, self.pos)
                }
                b'/' if src.get(self.pos + 1) == Some(&b'*') => {
                    if !self.skip_comment() {
                        return false;
                    }
                }
                b'*' if self.in_exec_comment && src.get(self.pos + 1) == Some(&b'/') => {
                    self.in_exec_comment = false;
                    self.pos += 2;
                }
                _ => break,
            }
        }
        true
    }

    /// Skips the comment starting at `self.pos` (`/*`), or enters the executable comment
    /// starting there, as the server does (`sql_lex.cc`, `MY_LEX_LONG_COMMENT`). Returns
    /// false if the comment is not terminated.
    fn skip_comment(&mut self) -> bool {
        let src = self.src;
        let body = self.pos + 2;
        if self.in_exec_comment {
            // A comment inside an executable one: MySQL's reading changed across versions,
            // and MariaDB refuses some with 1064 (before running the statements of a
            // multi-statement ahead of it) and accepts others.
            self.uncertain = true;
        }
        // `/*!` and `/*M!` (MariaDB reads an uppercase M only).
        let executable = match (src.get(body), src.get(body + 1)) {
            (Some(b'!'), _) => Some((false, body + 1)),
            (Some(b'M'), Some(b'!')) => Some((true, body + 2)),
            _ => None,
        };
        let Some((mariadb_only, after)) = executable else {
            return self.skip_to_comment_end(find_comment_end(src, body));
        };
        let digits = skip_digits(src, after) - after;
        // A version is 5 digits, or 6 when a sixth follows; fewer are code.
        let version_len = match digits {
            0..=4 => 0,
            5 => 5,
            _ => 6,
        };
        let value = src
            .get(after..after + version_len)
            .unwrap_or_default()
            .iter()
            .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'));
        match self.server.runs(mariadb_only, digits, value) {
            Run::Code => {}
            Run::Uncertain => self.uncertain = true,
            Run::Skip => {
                let end = skip_versioned_comment(src, after);
                // A comment nested in a skipped one: MariaDB (10.11, tried) skips it as
                // `skip_versioned_comment` does, and a text that ends inside it is
                // refused at parse (1064) like any unterminated comment, the statements
                // of a multi-statement before it run. MySQL's reading may differ.
                let body_end = end.unwrap_or(src.len());
                if !self.server.mariadb_only()
                    && src
                        .get(after..body_end)
                        .is_some_and(|b| b.windows(2).any(|w| w == b"/*"))
                {
                    self.uncertain = true;
                }
                return self.skip_to_comment_end(end);
            }
            Run::Comment => return self.skip_to_comment_end(find_comment_end(src, body)),
        }
        // Inside one, another executable comment the server runs is entered again: the
        // first `*/` ends both (a second is then `*` and `/`).
        self.in_exec_comment = true;
        self.pos = after + version_len;
        true
    }

    fn skip_to_comment_end(&mut self, end: Option<usize>) -> bool {
        match end {
            Some(end) => {
                self.pos = end;
                true
            }
            None => false,
        }
    }

    /// Lexes a quoted run starting at `start` (which holds the quote byte) and returns the
    /// offset just past the closing quote, or `None` if it is unterminated.
    fn quoted_end(&self, start: usize, backslash: bool) -> Option<usize> {
        let src = self.src;
        let quote = *src.get(start)?;
        let mut i = start + 1;
        loop {
            let c = *src.get(i)?;
            if c == b'\\' && backslash {
                i += 2;
            } else if c == quote {
                if src.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return Some(i + 1);
                }
            } else {
                i += 1;
            }
        }
    }

    fn lex_quoted(&mut self, kind: TokenKind, start: usize, quote_at: usize) -> Option<Token<'a>> {
        // Backslashes escape in strings only: not in `...` (nor "..." identifiers).
        let backslash = !self.mode.no_backslash_escapes
            && match self.src.get(quote_at) {
                Some(b'`') => false,
                Some(b'"') => !self.mode.ansi_quotes,
                _ => true,
            };
        match self.quoted_end(quote_at, backslash) {
            Some(end) => self.token(kind, start, end),
            None => self.stop_unterminated(),
        }
    }

    fn lex_number(&mut self, start: usize) -> Option<Token<'a>> {
        let src = self.src;
        let mut i = start;
        let radix_prefix: Option<fn(&u8) -> bool> = match (src.get(i), src.get(i + 1)) {
            (Some(b'0'), Some(b'x' | b'X')) => Some(u8::is_ascii_hexdigit),
            (Some(b'0'), Some(b'b' | b'B')) => Some(is_bin_digit),
            _ => None,
        };
        let mut fractional = false;
        match radix_prefix {
            Some(digit) if src.get(i + 2).is_some_and(digit) => {
                i += 2;
                while src.get(i).is_some_and(digit) {
                    i += 1;
                }
            }
            _ => {
                i = skip_digits(src, i);
                if src.get(i) == Some(&b'.') {
                    fractional = true;
                    i = skip_digits(src, i + 1);
                }
                if matches!(src.get(i), Some(b'e' | b'E')) {
                    let mut j = i + 1;
                    if matches!(src.get(j), Some(b'+' | b'-')) {
                        j += 1;
                    }
                    if src.get(j).is_some_and(u8::is_ascii_digit) {
                        fractional = true;
                        i = skip_digits(src, j);
                    }
                }
            }
        }
        // MySQL identifiers may begin with digits (`1abc`, `0xyz`).
        if !fractional && src.get(i).is_some_and(|&c| is_ident_byte(c)) {
            return self.token(TokenKind::Word, start, skip_ident(src, i));
        }
        self.token(TokenKind::Number, start, i)
    }

    fn lex_variable(&mut self, start: usize) -> Option<Token<'a>> {
        let src = self.src;
        if src.get(start + 1) == Some(&b'@') {
            let mut i = start + 2;
            while src.get(i).is_some_and(|&c| is_ident_byte(c) || c == b'.') {
                i += 1;
            }
            // `@@session.`x`` style: a backquoted name after the scope.
            if src.get(i) == Some(&b'`') {
                return self.lex_quoted(TokenKind::SysVar, start, i);
            }
            return self.token(TokenKind::SysVar, start, i);
        }
        match src.get(start + 1) {
            Some(b'\'' | b'"' | b'`') => self.lex_quoted(TokenKind::UserVar, start, start + 1),
            Some(&c) if is_var_byte(c) => {
                let mut i = start + 1;
                while src.get(i).is_some_and(|&c| is_var_byte(c)) {
                    i += 1;
                }
                self.token(TokenKind::UserVar, start, i)
            }
            _ => self.token(TokenKind::Punct, start, start + 1),
        }
    }

    fn lex_word(&mut self, start: usize) -> Option<Token<'a>> {
        let src = self.src;
        let end = skip_ident(src, start);
        let word = &src[start..end];
        let quote = src.get(end).copied();
        let introducer = match quote {
            Some(b'\'') => {
                matches!(word, [b'n' | b'N' | b'x' | b'X' | b'b' | b'B'])
                    || word.first() == Some(&b'_')
            }
            Some(b'"') => !self.mode.ansi_quotes && word.first() == Some(&b'_'),
            _ => false,
        };
        if introducer {
            return self.lex_quoted(TokenKind::String, start, end);
        }
        self.token(TokenKind::Word, start, end)
    }

    fn lex_punct(&mut self, start: usize) -> Option<Token<'a>> {
        let src = self.src;
        let rest = &src[start..];
        let len = match rest {
            [b'<', b'=', b'>', ..] | [b'-', b'>', b'>', ..] => 3,
            [b':' | b'<' | b'>' | b'!', b'=', ..]
            | [b'<', b'>' | b'<', ..]
            | [b'>', b'>', ..]
            | [b'&', b'&', ..]
            | [b'|', b'|', ..]
            | [b'-', b'>', ..] => 2,
            _ => 1,
        };
        self.token(TokenKind::Punct, start, start + len)
    }
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        if !self.skip_trivia() {
            return self.stop_unterminated();
        }
        let start = self.pos;
        let c = self.peek_at(start)?;
        match c {
            b'"' if self.mode.ansi_quotes => self.lex_quoted(TokenKind::QuotedIdent, start, start),
            b'\'' | b'"' => self.lex_quoted(TokenKind::String, start, start),
            b'`' => self.lex_quoted(TokenKind::QuotedIdent, start, start),
            b'@' => self.lex_variable(start),
            b'0'..=b'9' => self.lex_number(start),
            // `.5` is a number, but `t.5` is a qualified name.
            b'.' if self.peek_at(start + 1).is_some_and(|c| c.is_ascii_digit())
                && !start
                    .checked_sub(1)
                    .and_then(|p| self.peek_at(p))
                    .is_some_and(|p| is_ident_byte(p) || p == b'`') =>
            {
                self.lex_number(start)
            }
            c if is_ident_byte(c) => self.lex_word(start),
            _ => self.lex_punct(start),
        }
    }
}

impl std::iter::FusedIterator for Lexer<'_> {}

/// Bytes that may appear in an unquoted identifier (any non-ASCII byte counts, so UTF-8
/// names stay whole).
pub(crate) const fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// Bytes of an unquoted user variable name: identifier bytes plus `.`.
const fn is_var_byte(c: u8) -> bool {
    is_ident_byte(c) || c == b'.'
}

fn skip_ident(src: &[u8], mut i: usize) -> usize {
    while src.get(i).is_some_and(|&c| is_ident_byte(c)) {
        i += 1;
    }
    i
}

fn is_bin_digit(c: &u8) -> bool {
    matches!(c, b'0' | b'1')
}

fn skip_digits(src: &[u8], mut i: usize) -> usize {
    while src.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// Offset of the `\n` ending the line that contains `from`, or the end of input.
fn line_end(src: &[u8], from: usize) -> usize {
    src.get(from..)
        .and_then(|rest| rest.iter().position(|&c| c == b'\n'))
        .map_or(src.len(), |p| from + p)
}

/// Offset just past the `*/` closing a comment whose body starts at `from`.
fn find_comment_end(src: &[u8], from: usize) -> Option<usize> {
    let rest = src.get(from..)?;
    rest.windows(2)
        .position(|w| w == b"*/")
        .map(|p| from + p + 2)
}

/// Offset just past the `*/` closing a versioned comment the server skips, whose body
/// starts at `from`: one level of `/* ... */` may be nested inside (the server's
/// `consume_comment(1)`).
fn skip_versioned_comment(src: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(&c) = src.get(i) {
        i += 1;
        match (c, src.get(i)) {
            (b'/', Some(b'*')) => i = find_comment_end(src, i + 1)?,
            (b'*', Some(b'/')) => return Some(i + 1),
            _ => {}
        }
    }
    None
}
