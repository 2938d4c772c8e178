//! A byte-level SQL lexer and statement classifier for the MySQL/MariaDB dialects.
//!
//! The proxy runs this on every `COM_QUERY`, so it is built to be cheap and robust rather
//! than complete: there is no parser, no regex and no allocation, just a single pass over
//! the tokens with a few keywords of look-ahead. Any input is accepted — arbitrary bytes,
//! invalid UTF-8, unterminated strings or comments — and nothing panics.
//!
//! - [`classify`] sums up a query text as [`Classification`] flags: does it only read,
//!   does it change session state, start or end a transaction, take locks, call functions
//!   holdfast cannot vouch for... [`classify_with`] lexes it under a session's
//!   [`SqlMode`] (`ANSI_QUOTES`, `NO_BACKSLASH_ESCAPES`), [`classify_for`] also as the
//!   [`Server`] it runs on reads executable comments.
//! - [`split_statements`] finds the statements of a multi-statement text.
//! - [`Lexer`] is the underlying tokenizer, for callers that need more.
//! - [`quote`] writes strings and identifiers into SQL text, correctly under every
//!   `sql_mode`.
//!
//! ```
//! use holdfast_sql::{classify, Classification};
//!
//! assert!(classify(b"SELECT * FROM t").is_read_only());
//! let c = classify(b"/*!40101 SET NAMES utf8mb4 */; SELECT 1");
//! assert!(c.has(Classification::SET_SESSION_VAR | Classification::MULTI));
//! assert!(!c.is_read_only());
//! ```
//!
//! Classification is a heuristic: it errs towards reporting effects (unknown statements
//! are writes; an executable comment that the possible servers do not all run or skip
//! alike makes the text [`UNCERTAIN`](Classification::UNCERTAIN)), but it cannot see inside
//! stored procedures, stored functions or prepared statement text.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod classify;
mod found_rows;
mod keyword;
mod kill;
mod lexer;
pub mod password;
pub mod quote;
mod route;
mod server;
mod split;

#[cfg(test)]
mod tests;

pub use classify::{
    classify, classify_for, classify_with, first_keyword, refused_at_parse, Classification,
};
pub use found_rows::{fails_before_it_runs, found_rows_effect, FoundRowsEffect};
pub use kill::{parse_kill, parse_kill_head, parse_sql_prepared, Kill, KillHead, SqlPrepared};
pub use lexer::{Lexer, SqlMode, Token, TokenKind};
pub use password::{own_password_change, PasswordChange};
pub use route::{
    names_system_variables, read_only_transaction, read_route, reads_last_statement, ReadRoute,
};
pub use server::Server;
pub use split::Statements;

/// Iterates over the statements in a multi-statement text, yielding their byte ranges in
/// `sql` without the `;` and trimmed of surrounding whitespace; statements holding no
/// token (empty, or only comments) are skipped.
///
/// `;` separates statements only outside strings, quoted identifiers and comments, and
/// outside the body of compound statements (`CREATE PROCEDURE ... BEGIN ...; ...; END`),
/// which the server treats as one statement. The text is lexed under the default
/// `sql_mode` ([`Statements::with_mode`] for another).
pub fn split_statements(sql: &[u8]) -> Statements<'_> {
    Statements::new(sql)
}
