//! Statement boundaries: `;` outside quotes and comments, except inside compound
//! statements (`BEGIN ... END` bodies of stored programs, MariaDB's `BEGIN NOT ATOMIC`,
//! top-level `IF`/`CASE`/`WHILE`/`LOOP`/`REPEAT`), which the server parses as a single
//! statement.

use std::ops::Range;

use crate::keyword::upper;
use crate::lexer::{Lexer, SqlMode, Token, TokenKind};
use crate::server::Server;

/// Whether the current statement can contain nested `;`-terminated statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compound {
    /// No block structure.
    No,
    /// `CREATE`/`ALTER` whose object type (routine or not) is not known yet.
    Pending,
    /// Inside a stored-program definition or a compound statement: track block depth.
    Active,
}

/// How many tokens into a `CREATE`/`ALTER` the object type may appear
/// (`CREATE OR REPLACE DEFINER = 'u'@'h' AGGREGATE FUNCTION`).
const ROUTINE_KEYWORD_WINDOW: usize = 12;

/// Pulls the tokens of one statement at a time out of a [`Lexer`].
#[derive(Debug, Clone)]
pub(crate) struct StmtCursor<'a> {
    src: &'a [u8],
    lexer: Lexer<'a>,
    /// Offset where the current statement's text starts (just after the previous `;`).
    start: usize,
    /// Offset of the `;` ending the current statement, or the input length.
    end: usize,
    /// Tokens of the current statement handed out so far.
    count: usize,
    prev: Option<Token<'a>>,
    compound: Compound,
    depth: u32,
    ended: bool,
    at_eof: bool,
}

impl<'a> StmtCursor<'a> {
    pub(crate) fn new(src: &'a [u8], mode: SqlMode, server: Server) -> Self {
        StmtCursor {
            src,
            lexer: Lexer::for_server(src, mode, server),
            start: 0,
            end: src.len(),
            count: 0,
            prev: None,
            compound: Compound::No,
            depth: 0,
            ended: false,
            at_eof: false,
        }
    }

    /// Whether the lexer met an executable comment whose fate is not known (see
    /// [`Lexer::is_uncertain`]).
    pub(crate) const fn is_uncertain(&self) -> bool {
        self.lexer.is_uncertain()
    }

    /// See [`Lexer::ends_in_exec_comment`] (meaningful once the text is consumed).
    pub(crate) const fn ends_in_exec_comment(&self) -> bool {
        self.lexer.ends_in_exec_comment()
    }

    /// See [`Lexer::is_unterminated`] (meaningful once the text is consumed).
    pub(crate) const fn is_unterminated(&self) -> bool {
        self.lexer.is_unterminated()
    }

    /// The servers the text is lexed for.
    pub(crate) const fn server(&self) -> Server {
        self.lexer.server()
    }

    /// Number of tokens of the current statement consumed so far.
    pub(crate) const fn count(&self) -> usize {
        self.count
    }

    /// Next token of the current statement, or `None` once it has ended.
    pub(crate) fn next_token(&mut self) -> Option<Token<'a>> {
        if self.ended {
            return None;
        }
        let Some(tok) = self.lexer.next() else {
            self.ended = true;
            self.at_eof = true;
            self.end = self.src.len();
            return None;
        };
        if self.depth == 0 && tok.is_punct(";") {
            self.ended = true;
            self.end = tok.offset;
            return None;
        }
        self.track_blocks(tok);
        self.count += 1;
        self.prev = Some(tok);
        Some(tok)
    }

    /// The token [`next_token`](Self::next_token) would return, without consuming it.
    pub(crate) fn peek(&self) -> Option<Token<'a>> {
        if self.ended {
            return None;
        }
        let tok = self.lexer.clone().next()?;
        (self.depth > 0 || !tok.is_punct(";")).then_some(tok)
    }

    /// The upcoming tokens up to the next `;` (whatever the block depth), without
    /// consuming anything. For short look-aheads when classifying a statement's head.
    pub(crate) fn lookahead(&self) -> impl Iterator<Item = Token<'a>> + 'a {
        let lexer = if self.ended {
            Lexer::for_server(&[], self.lexer.mode(), self.lexer.server())
        } else {
            self.lexer.clone()
        };
        lexer.take_while(|t| !t.is_punct(";"))
    }

    /// Consumes the rest of the current statement.
    pub(crate) fn finish(&mut self) {
        while self.next_token().is_some() {}
    }

    /// Moves past the rest of the current statement to the next one. Returns false when
    /// there is none (end of input).
    pub(crate) fn advance(&mut self) -> bool {
        while self.next_token().is_some() {}
        if self.at_eof {
            return false;
        }
        self.start = self.end + 1;
        self.end = self.src.len();
        self.count = 0;
        self.prev = None;
        self.compound = Compound::No;
        self.depth = 0;
        self.ended = false;
        true
    }

    /// Whether the current statement (which must have ended) holds no token but more
    /// than whitespace: comments only (`SELECT 1; -- done`), or one never closed. MariaDB
    /// answers such a statement of its own (an empty OK; 1064 for a comment never
    /// closed; tried on 10.11).
    pub(crate) fn is_comment_only(&self) -> bool {
        self.count == 0
            && self
                .src
                .get(self.start..self.end)
                .is_some_and(|text| text.iter().any(|c| !c.is_ascii_whitespace()))
    }

    /// Byte range of the current statement (which must have ended), trimmed of
    /// surrounding whitespace; `None` if it holds no token.
    pub(crate) fn range(&self) -> Option<Range<usize>> {
        if self.count == 0 {
            return None;
        }
        let text = self.src.get(self.start..self.end)?;
        let lead = text.iter().take_while(|c| c.is_ascii_whitespace()).count();
        let trail = text[lead..]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        Some(self.start + lead..self.end - trail)
    }

    /// Follows the block structure of compound statements so that `;` inside them does
    /// not end the statement. This is a heuristic over keywords, not a parser.
    fn track_blocks(&mut self, tok: Token<'a>) {
        let idx = self.count;
        let prev = self.prev;
        let irrelevant = idx > 0 && self.compound == Compound::No;
        if irrelevant || tok.kind != TokenKind::Word || prev.is_some_and(|p| p.is_punct(".")) {
            return;
        }
        let kw = upper(tok.text);
        let kw = kw.as_bytes();
        if idx == 0 {
            match kw {
                b"IF" | b"CASE" | b"WHILE" | b"LOOP" | b"REPEAT" => self.open_compound(),
                b"BEGIN" if self.peek().is_some_and(|t| t.is_word("NOT")) => self.open_compound(),
                b"CREATE" | b"ALTER" => self.compound = Compound::Pending,
                // `label: BEGIN ...`
                _ if self.peek().is_some_and(|t| t.is_punct(":")) => {
                    self.compound = Compound::Active;
                }
                _ => {}
            }
            return;
        }
        match self.compound {
            Compound::No => {}
            Compound::Pending => match kw {
                b"PROCEDURE" | b"FUNCTION" | b"TRIGGER" | b"EVENT" | b"PACKAGE" => {
                    self.compound = Compound::Active;
                }
                b"TABLE" | b"VIEW" | b"INDEX" | b"DATABASE" | b"SCHEMA" | b"USER" => {
                    self.compound = Compound::No;
                }
                _ if idx >= ROUTINE_KEYWORD_WINDOW => self.compound = Compound::No,
                _ => {}
            },
            Compound::Active => match kw {
                b"BEGIN" => self.depth = self.depth.saturating_add(1),
                // CASE expressions and CASE statements both close with END; `END CASE`
                // closes the latter.
                b"CASE" if !prev.is_some_and(|p| p.is_word("END")) => {
                    self.depth = self.depth.saturating_add(1);
                }
                b"IF" | b"WHILE" | b"LOOP" | b"REPEAT" if starts_statement(prev) => {
                    // REPEAT(str, n) is also a string function.
                    let function = kw == b"REPEAT" && self.peek().is_some_and(|t| t.is_punct("("));
                    if !function {
                        self.depth = self.depth.saturating_add(1);
                    }
                }
                b"END" => self.depth = self.depth.saturating_sub(1),
                _ => {}
            },
        }
    }

    fn open_compound(&mut self) {
        self.compound = Compound::Active;
        self.depth = 1;
    }
}

/// Whether a token following `prev` is at the start of a statement inside a compound
/// statement (so `IF` is the IF statement, not the `IF()` function).
fn starts_statement(prev: Option<Token<'_>>) -> bool {
    let Some(prev) = prev else { return true };
    match prev.kind {
        TokenKind::Punct => matches!(prev.text, b";" | b":" | b")"),
        TokenKind::Word => matches!(
            upper(prev.text).as_bytes(),
            b"BEGIN" | b"THEN" | b"ELSE" | b"DO" | b"LOOP" | b"REPEAT" | b"ROW" | b"ATOMIC"
        ),
        _ => false,
    }
}

/// Iterator over the byte ranges of the statements in a SQL text; see
/// [`split_statements`](crate::split_statements).
#[derive(Debug, Clone)]
pub struct Statements<'a> {
    cursor: StmtCursor<'a>,
    done: bool,
}

impl<'a> Statements<'a> {
    /// Starts splitting `sql`, lexed under the default `sql_mode`.
    pub fn new(sql: &'a [u8]) -> Self {
        Self::with_mode(sql, SqlMode::DEFAULT)
    }

    /// Starts splitting `sql`, lexed under `mode` for any server.
    pub fn with_mode(sql: &'a [u8], mode: SqlMode) -> Self {
        Self::for_server(sql, mode, Server::UNKNOWN)
    }

    /// Starts splitting `sql`, lexed under `mode` as `server` reads it.
    pub fn for_server(sql: &'a [u8], mode: SqlMode, server: Server) -> Self {
        Statements {
            cursor: StmtCursor::new(sql, mode, server),
            done: false,
        }
    }
}

impl Iterator for Statements<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        while !self.done {
            while self.cursor.next_token().is_some() {}
            let range = self.cursor.range();
            self.done = !self.cursor.advance();
            if range.is_some() {
                return range;
            }
        }
        None
    }
}

impl std::iter::FusedIterator for Statements<'_> {}
