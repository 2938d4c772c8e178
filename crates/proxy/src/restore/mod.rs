//! Capturing a session's state from one backend connection and recreating it on another
//! (keep-alive: a session moved after a switchover, restart or failover must be
//! indistinguishable afterwards).
//!
//! # What is restored, and how
//!
//! [`restore_session`] runs only statements holdfast generates, never a client statement:
//!
//! 1. `USE \`db\`` for [`SessionRecord::schema`] (backquotes doubled). It comes first because
//!    `USE` resets `character_set_database`/`collation_database`, which the SET below then
//!    puts back if the session had them changed.
//! 2. One multi-assignment `SET` with every user variable, every replayable system variable
//!    and `last_insert_id`. MariaDB checks every assignment of a `SET` before applying any
//!    (`sql_set_variables`: all `check()`, then all `update()`), so a rejected value leaves
//!    nothing half-applied; holdfast then replays the assignments one by one to find the
//!    one the server refuses, and [`RestoreError::Rejected`] names it with the server's
//!    message.
//! 3. The next-transaction characteristics (`SET TRANSACTION …`, as the tracker reported
//!    them) last: setting the session isolation level or `tx_read_only` also resets the
//!    next transaction's characteristics.
//!
//! Typical cost: two round trips (three with pending `SET TRANSACTION`), plus one when a
//! schema or user-variable name is not ASCII (see [`RestorePlan::needs_utf8`]).
//!
//! # System variables
//!
//! Values come from the session tracker as text; [`VariableTypes`] (one
//! `information_schema.SYSTEM_VARIABLES` read per backend) says how to write each back:
//! numbers unquoted, `ON`/`OFF` booleans unquoted, enums, sets, flag sets and strings
//! quoted. A value that is not plain printable ASCII without backslashes is written as
//! `CONVERT(X'…' USING utf8mb4)`, which reads the same whatever the connection's character
//! set and whether or not `sql_mode` has `NO_BACKSLASH_ESCAPES` on the new server.
//! [`skip_reason`] lists what is never replayed and why.
//!
//! # User variables
//!
//! MariaDB 10.11 has `information_schema.USER_VARIABLES` (the `user_variables` plugin,
//! compiled in and ACTIVE in the Debian/upstream 10.11 builds: `INSTALL SONAME
//! 'user_variables'` fails there with "Can't open shared library" because it is not a
//! separate `.so`). Its columns are `VARIABLE_NAME`, `VARIABLE_VALUE varchar(2048)`,
//! `VARIABLE_TYPE` (`INT`, `INT UNSIGNED`, `DECIMAL`, `DOUBLE`, `VARCHAR`) and
//! `CHARACTER_SET_NAME`. The value column is lossy — utf8mb3 text (an emoji reads `????`,
//! binary bytes are mangled), truncated at 2048 characters, doubles printed with `%g`
//! precision — and it has no collation. So holdfast uses it only for the *names*, and
//! reads the values with a prepared `SELECT @v, CAST(@v AS BINARY), CHARSET(@v), COLLATION(@v),
//! …` executed in the binary protocol: integers arrive as 8 bytes with the UNSIGNED flag, doubles as their
//! 8 IEEE bytes, decimals as their exact digits, strings as raw bytes. NULL variables keep
//! a type in MariaDB (`SET @n=1; SET @n=NULL` stays an integer), which the column type
//! carries too. Restoring writes each value so it gets the same type back: `CAST(… AS
//! UNSIGNED)`, decimal literals with their scale, shortest round-trip double literals
//! (`1e-1`), `_latin1 X'E9' COLLATE latin1_swedish_ci` for strings, typed `CAST(NULL AS …)`.
//!
//! # LAST_INSERT_ID
//!
//! MariaDB 10.11 accepts `SET last_insert_id = n` (a session-only variable): afterwards
//! `SELECT LAST_INSERT_ID()` returns `n`, up to 18446744073709551615, and it fits in the
//! same multi-assignment `SET` — no result set to consume, unlike `SELECT
//! LAST_INSERT_ID(n)`. The value comes from [`SessionRecord::last_insert_id`]; since OK
//! packets do not report `SELECT LAST_INSERT_ID(expr)`, [`capture_session`] reads the
//! exact value too, and [`Captured::apply_to`] stores it in the record.
//!
//! # Tracker gap
//!
//! `SET NAMES x COLLATE y` on MariaDB 10.11 reports `character_set_client`,
//! `character_set_connection` and `character_set_results` but not `collation_connection`;
//! [`capture_session`] reads `@@collation_connection` and [`Captured::apply_to`] fills it in.
//!
//! # Layout
//!
//! `types` (system variable types, the skip list, system variable literals), `values`
//! (typed user variable values: literals and decoding), `capture` (reading the state from
//! the old connection), `plan` (the statement text) and `apply` (running it on the new
//! connection). Binary result rows are split by [`holdfast_wire::binary_row`]; literals
//! and identifiers are quoted by [`holdfast_sql::quote`].
//!
//! [`SessionRecord::schema`]: crate::state::SessionRecord::schema
//! [`SessionRecord::last_insert_id`]: crate::state::SessionRecord::last_insert_id

/// Appended to holdfast's own `SELECT`s on a session's connection: a statement without a
/// LIMIT returns at most the client's `sql_select_limit` rows (none at 0), which cut
/// captures short (user variables listed, `FOUND_ROWS()` recreated) and emptied reads of
/// one row.
pub const NO_LIMIT: &str = " LIMIT 18446744073709551615";

mod apply;
mod capture;
mod plan;
#[cfg(test)]
mod tests;
mod types;
pub(crate) use types::skip_reason_by_name;
mod values;

pub use crate::backend::{Executed, OkInfo};
pub use apply::{restore_session, use_schema};
pub use capture::{
    capture_session, capture_session_named, capture_user_variables, found_rows_select,
    put_back_diagnostics, read_diagnostics, Captured, Diagnostics, MAX_FOUND_ROWS,
};
pub use holdfast_sql::quote::{identifier as quote_identifier, string_literal};
pub use plan::{plan, Assignment, RestorePlan};
pub use types::{
    skip_reason, system_variable_literal, TypesCache, VarInfo, VarKind, VariableTypes,
    VARIABLE_TYPES_QUERY,
};
pub use values::{UserValue, UserVariable, ValueError};

use crate::backend::{BackendConn, BackendError};
use crate::conn::ConnError;

/// Turns on the tracker of next-transaction characteristics (`SET TRANSACTION ...`, which
/// a move must recreate). Only for sessions that set them: MariaDB does not use its query
/// cache for a session with `session_track_transaction_info` on (MariaDB 10.11; the other
/// trackers do not matter to it). A `SET TRANSACTION` inside a stored program or a
/// prepared statement is not seen, so not recreated after a move unless the session set
/// one in a plain statement before.
pub const TRACK_TRANSACTIONS: &str = "SET SESSION session_track_transaction_info='CHARACTERISTICS'";

/// Largest packet accepted from a backend while capturing (a user variable may hold up to
/// `max_allowed_packet` bytes).
const CAPTURE_MAX_PACKET: usize = 1 << 30;

/// Why a session's state could not be recreated on a new backend connection.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The new server refused part of the state. `item` names it: `@@sql_mode` for a system
    /// variable, `@name` for a user variable, `database \`db\``, `last_insert_id` or
    /// `next transaction characteristics`.
    #[error(
        "cannot restore {item} on the new backend: the server answered {code} ({state}) {message}"
    )]
    Rejected {
        item: String,
        code: u16,
        state: String,
        message: String,
    },
    /// The state has something holdfast cannot write as a statement.
    #[error("cannot restore {item}: {reason}")]
    Unsupported { item: String, reason: String },
    /// The connection failed (not a refusal).
    #[error("backend connection failed while restoring the session: {0}")]
    Backend(BackendError),
}

impl RestoreError {
    /// The variable (or other item) the error is about, when there is one.
    pub fn item(&self) -> Option<&str> {
        match self {
            RestoreError::Rejected { item, .. } | RestoreError::Unsupported { item, .. } => {
                Some(item)
            }
            RestoreError::Backend(_) => None,
        }
    }
}

/// Why user variables could not be captured.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The server has no `information_schema.USER_VARIABLES` (MariaDB's `user_variables`
    /// plugin missing, or a MySQL server): names must come from elsewhere
    /// ([`capture_session_named`]).
    #[error("the server cannot list user variables (information_schema.USER_VARIABLES): {0}")]
    NoVariableList(String),
    /// A user variable's name cannot be written in the connection's character set.
    #[error("user variable @{name} cannot be named in character set {charset}")]
    UnencodableName { name: String, charset: String },
    /// The server's answer did not have the expected shape.
    #[error("unexpected answer while capturing user variables: {0}")]
    Malformed(String),
    #[error("{0}")]
    Backend(#[from] BackendError),
}

impl From<ConnError> for CaptureError {
    fn from(e: ConnError) -> Self {
        CaptureError::Backend(BackendError::Conn(e))
    }
}

/// Runs one statement (COM_QUERY) and buffers its answer. For holdfast's own statements.
pub async fn execute(conn: &mut BackendConn, sql: &[u8]) -> Result<Executed, BackendError> {
    tracing::trace!(thread = conn.greeting.connection_id, sql = %String::from_utf8_lossy(sql), "holdfast's own statement");
    conn.execute(sql, CAPTURE_MAX_PACKET).await
}
