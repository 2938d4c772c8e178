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

use crate::backend::{BackendConn, BackendError};
pub use crate::backend::{Executed, OkInfo};
use crate::conn::ConnError;
use crate::state::SessionRecord;
use holdfast_wire::caps::*;
use holdfast_wire::codec::Reader;
use holdfast_wire::command::{COM_STMT_CLOSE, COM_STMT_EXECUTE, COM_STMT_PREPARE};
use holdfast_wire::packets::{PrepareOk, EOF_HEADER, ERR_HEADER};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Largest packet accepted from a backend while capturing (a user variable may hold up to
/// `max_allowed_packet` bytes).
const CAPTURE_MAX_PACKET: usize = 1 << 30;

/// The query [`VariableTypes::load`] runs.
pub const VARIABLE_TYPES_QUERY: &str = "SELECT LOWER(VARIABLE_NAME), VARIABLE_TYPE, READ_ONLY, \
VARIABLE_SCOPE FROM information_schema.SYSTEM_VARIABLES";

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// System variable types
// ---------------------------------------------------------------------------------------

/// How a system variable's value is written in SQL (`VARIABLE_TYPE` in
/// `information_schema.SYSTEM_VARIABLES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarKind {
    /// `INT`, `INT UNSIGNED`, `BIGINT`, `BIGINT UNSIGNED`.
    Integer,
    /// `DOUBLE` (e.g. `max_statement_time`, `timestamp`).
    Double,
    /// `BOOLEAN`: `ON`/`OFF`.
    Boolean,
    /// `ENUM` (e.g. `tx_isolation`, `character_set_*`, `collation_*`).
    Enum,
    /// `SET` (e.g. `sql_mode`).
    Set,
    /// `FLAGSET` (e.g. `optimizer_switch`).
    Flagset,
    /// `VARCHAR` and anything else: a quoted string (e.g. `time_zone`).
    Text,
}

impl VarKind {
    /// Maps a `VARIABLE_TYPE` value.
    pub fn from_type_name(t: &str) -> VarKind {
        let t = t.to_ascii_uppercase();
        match t.as_str() {
            "INT" | "INT UNSIGNED" | "BIGINT" | "BIGINT UNSIGNED" => VarKind::Integer,
            "DOUBLE" => VarKind::Double,
            "BOOLEAN" => VarKind::Boolean,
            "ENUM" => VarKind::Enum,
            "SET" => VarKind::Set,
            "FLAGSET" => VarKind::Flagset,
            _ => VarKind::Text,
        }
    }
}

/// What the server says about one system variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarInfo {
    pub kind: VarKind,
    pub read_only: bool,
    /// `VARIABLE_SCOPE` is `GLOBAL`: there is no session value to restore.
    pub global_only: bool,
}

/// System variable types of one server, by lower-case name. Load once per backend.
#[derive(Debug, Clone, Default)]
pub struct VariableTypes {
    vars: HashMap<String, VarInfo>,
}

impl VariableTypes {
    /// Reads `information_schema.SYSTEM_VARIABLES` ([`VARIABLE_TYPES_QUERY`]).
    pub async fn load(conn: &mut BackendConn) -> Result<VariableTypes, BackendError> {
        let result = conn.query(VARIABLE_TYPES_QUERY).await?;
        Ok(Self::from_rows(result.rows.iter().map(|r| {
            let col = |i: usize| r.get(i).and_then(|v| v.as_deref()).unwrap_or("");
            (col(0), col(1), col(2), col(3))
        })))
    }

    /// Builds the map from `(name, VARIABLE_TYPE, READ_ONLY, VARIABLE_SCOPE)` rows.
    pub fn from_rows<'a>(
        rows: impl IntoIterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
    ) -> Self {
        let vars = rows
            .into_iter()
            .filter(|(name, ..)| !name.is_empty())
            .map(|(name, ty, ro, scope)| {
                (
                    name.to_ascii_lowercase(),
                    VarInfo {
                        kind: VarKind::from_type_name(ty),
                        read_only: ro.eq_ignore_ascii_case("YES"),
                        global_only: scope.eq_ignore_ascii_case("GLOBAL"),
                    },
                )
            })
            .collect();
        VariableTypes { vars }
    }

    pub fn get(&self, name: &str) -> Option<&VarInfo> {
        self.vars.get(&name.to_ascii_lowercase())
    }

    pub fn len(&self) -> usize {
        self.vars.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }
}

/// Why a tracked system variable is not replayed, or `None` when it is.
///
/// * `session_track_*`: holdfast's own trackers ([`crate::backend::ENABLE_TRACKERS`]), set
///   on every backend connection; replaying a client's change would blind holdfast.
/// * `last_insert_id`, `identity`: restored from [`SessionRecord::last_insert_id`] instead.
/// * `insert_id`, `rand_seed1`, `rand_seed2`, `gtid_seq_no`: one-shot values the next
///   statement consumes (and the server clears); a stale value would change that
///   statement's effect.
/// * `pseudo_thread_id`: names the old server's thread; meaningless elsewhere.
/// * `warning_count`, `error_count`, `in_transaction`, `last_gtid`, `external_user`,
///   `proxy_user` and anything `READ_ONLY` per [`VariableTypes`]: not settable.
/// * `GLOBAL`-scope variables: no session value.
///
/// `timestamp` is replayed: the tracker reports it only when the client set it, and a fixed
/// timestamp is part of the session's behaviour (caveat: after `SET timestamp=DEFAULT` the
/// tracker's value is the then-current time, which would be frozen on replay).
/// `gtid_domain_id`, `server_id`, `sql_log_bin`, `skip_replication`, `pseudo_slave_mode`
/// are replayed: the client could set them with its privileges, the same account can again.
pub fn skip_reason(name: &str, types: &VariableTypes) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("session_track_") {
        return Some("set by holdfast on every backend connection");
    }
    match lower.as_str() {
        "last_insert_id" | "identity" => return Some("restored from the record's last insert id"),
        "insert_id" | "rand_seed1" | "rand_seed2" | "gtid_seq_no" => {
            return Some("one-shot value consumed by the next statement")
        }
        "pseudo_thread_id" => return Some("names a thread of the old server"),
        "warning_count" | "error_count" | "in_transaction" | "last_gtid" | "external_user"
        | "proxy_user" => return Some("read-only"),
        _ => {}
    }
    match types.get(&lower) {
        Some(i) if i.read_only => Some("read-only"),
        Some(i) if i.global_only => Some("global only"),
        _ => None,
    }
}

/// Whether `s` is a plain integer literal (`-` and decimal digits).
fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `s` is a plain decimal number (`-12.50`, `3`, `.5` is not accepted).
fn is_decimal(s: &str) -> bool {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

use holdfast_sql::quote::hex;
pub use holdfast_sql::quote::{identifier as quote_identifier, string_literal};

/// Variables whose value may be NULL; the tracker reports NULL as an empty value.
fn nullable(name: &str) -> bool {
    matches!(name, "character_set_results")
}

/// The SQL literal for a system variable's tracked value.
pub fn system_variable_literal(name: &str, value: &str, kind: Option<VarKind>) -> String {
    let lower = name.to_ascii_lowercase();
    if nullable(&lower) && (value.is_empty() || value.eq_ignore_ascii_case("NULL")) {
        return "NULL".into();
    }
    match kind {
        Some(VarKind::Integer) if is_integer(value) => value.into(),
        Some(VarKind::Double)
            if is_decimal(value) || value.parse::<f64>().is_ok_and(f64::is_finite) =>
        {
            // The server prints doubles as plain decimals ("0.000000"), which it reads back.
            if is_decimal(value) {
                value.into()
            } else {
                string_literal(value)
            }
        }
        Some(VarKind::Boolean)
            if ["ON", "OFF", "0", "1"]
                .iter()
                .any(|v| value.eq_ignore_ascii_case(v)) =>
        {
            value.to_ascii_uppercase()
        }
        // Unknown to this server: numbers as numbers, the rest quoted; a server that does
        // not know the variable refuses it by name.
        None if is_integer(value) => value.into(),
        _ => string_literal(value),
    }
}

/// Order in the SET: other variables first, then `character_set_x` before `collation_x`
/// (setting a character set resets the matching collation to its default).
fn assignment_rank(name: &str) -> u8 {
    if name.starts_with("character_set_") {
        1
    } else if name.starts_with("collation_") {
        2
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------------
// User variables
// ---------------------------------------------------------------------------------------

/// A user variable's value with its exact type. `None` values are typed NULLs.
#[derive(Debug, Clone, PartialEq)]
pub enum UserValue {
    Signed(Option<i64>),
    Unsigned(Option<u64>),
    /// The exact digits as the server prints them (scale kept: `1.10`).
    Decimal(Option<String>),
    Double(Option<f64>),
    /// A string with its character set and collation (`binary` for binary strings).
    Text {
        bytes: Option<Vec<u8>>,
        charset: String,
        collation: String,
    },
}

/// A captured user variable.
#[derive(Debug, Clone, PartialEq)]
pub struct UserVariable {
    /// The name as the server lists it (UTF-8), without `@`.
    pub name: String,
    pub value: UserValue,
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl UserVariable {
    /// `@\`name\``.
    pub fn reference(&self) -> String {
        format!("@{}", quote_identifier(&self.name))
    }

    /// The expression that gives the variable back its value and type.
    pub fn literal(&self) -> Result<String, RestoreError> {
        let unsupported = |reason: &str| RestoreError::Unsupported {
            item: format!("@{}", self.name),
            reason: reason.into(),
        };
        Ok(match &self.value {
            UserValue::Signed(Some(v)) => v.to_string(),
            UserValue::Signed(None) => "CAST(NULL AS SIGNED)".into(),
            UserValue::Unsigned(Some(v)) => format!("CAST({v} AS UNSIGNED)"),
            UserValue::Unsigned(None) => "CAST(NULL AS UNSIGNED)".into(),
            UserValue::Decimal(Some(d)) => {
                if !is_decimal(d) {
                    return Err(unsupported(&format!("decimal value {d:?} is not a number")));
                }
                if d.contains('.') {
                    d.clone()
                } else {
                    // A literal without a fraction would be an integer.
                    format!("CAST({d} AS DECIMAL(65,0))")
                }
            }
            UserValue::Decimal(None) => "CAST(NULL AS DECIMAL)".into(),
            UserValue::Double(Some(f)) => {
                if !f.is_finite() {
                    return Err(unsupported("the double is not finite"));
                }
                // Rust's `{:e}` is the shortest representation that reads back to the same
                // bits; an exponent makes MariaDB read it as a DOUBLE.
                format!("{f:e}")
            }
            UserValue::Double(None) => "CAST(NULL AS DOUBLE)".into(),
            UserValue::Text {
                bytes,
                charset,
                collation,
            } => {
                if !is_plain_name(charset) || !is_plain_name(collation) {
                    return Err(unsupported(&format!(
                        "unexpected character set {charset:?} / collation {collation:?}"
                    )));
                }
                match bytes {
                    Some(b) if charset.eq_ignore_ascii_case("binary") => {
                        format!("_binary X'{}'", hex(b))
                    }
                    Some(b) => format!("_{charset} X'{}' COLLATE {collation}", hex(b)),
                    None if charset.eq_ignore_ascii_case("binary") => "NULL".into(),
                    None => {
                        format!("CAST(NULL AS CHAR CHARACTER SET {charset}) COLLATE {collation}")
                    }
                }
            }
        })
    }
}

/// User variables and what the trackers do not report exactly, read from a backend
/// connection.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Captured {
    pub user_variables: Vec<UserVariable>,
    /// `LAST_INSERT_ID()`; OK packets miss `SELECT LAST_INSERT_ID(expr)`.
    pub last_insert_id: u64,
    /// `@@collation_connection`: MariaDB 10.11's tracker reports `character_set_client`,
    /// `_connection` and `_results` after `SET NAMES x COLLATE y` but not
    /// `collation_connection`, so the record alone would restore x's default collation.
    pub collation_connection: String,
}

impl Captured {
    /// Puts the captured values the record lacks or has inexactly into it, before
    /// [`restore_session`].
    pub fn apply_to(&self, record: &mut SessionRecord) {
        record.last_insert_id = self.last_insert_id;
        if !self.collation_connection.is_empty() {
            record.variables.insert(
                "collation_connection".into(),
                self.collation_connection.clone(),
            );
        }
    }
}

/// Reads every user variable of the connection's session (names from
/// `information_schema.USER_VARIABLES`, values and types through the binary protocol).
pub async fn capture_user_variables(
    conn: &mut BackendConn,
) -> Result<Vec<UserVariable>, CaptureError> {
    Ok(capture_session(conn).await?.user_variables)
}

/// [`capture_user_variables`] plus `LAST_INSERT_ID()`. Costs three round trips on the old
/// connection (list, prepare, execute; the close has no answer); with no user variables,
/// one. The statements leave the session as it was except for per-statement diagnostics
/// (`FOUND_ROWS()`, `ROW_COUNT()`, `SHOW WARNINGS`).
pub async fn capture_session(conn: &mut BackendConn) -> Result<Captured, CaptureError> {
    let list = "SELECT LAST_INSERT_ID(), HEX(@@character_set_client), \
                HEX(@@collation_connection), HEX(CONVERT(u.VARIABLE_NAME USING utf8mb4)) \
                FROM (SELECT 1) AS one LEFT JOIN information_schema.USER_VARIABLES AS u ON 1";
    let result = match execute(conn, list.as_bytes()).await {
        Ok(r) => r,
        Err(BackendError::Server { code, message, .. }) if code == 1109 || code == 1146 => {
            return Err(CaptureError::NoVariableList(message))
        }
        Err(e) => return Err(e.into()),
    };
    let mut last_insert_id = 0;
    let mut charset = String::new();
    let mut collation_connection = String::new();
    let mut names = Vec::new();
    for row in &result.rows {
        let text = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        last_insert_id = text(0).and_then(|v| v.parse().ok()).unwrap_or(0);
        charset = text(1).and_then(|h| unhex_utf8(&h)).unwrap_or_default();
        collation_connection = text(2).and_then(|h| unhex_utf8(&h)).unwrap_or_default();
        if let Some(name) = text(3) {
            let name = unhex_utf8(&name)
                .ok_or_else(|| CaptureError::Malformed(format!("variable name {name:?}")))?;
            names.push(name);
        }
    }
    let user_variables = read_user_variables(conn, &names, &charset).await?;
    Ok(Captured {
        user_variables,
        last_insert_id,
        collation_connection,
    })
}

/// Like [`capture_session`], for servers without `information_schema.USER_VARIABLES`:
/// reads the given names (e.g. collected by the statement classifier). A name that was
/// never set reads as a binary NULL, which is what an unset variable evaluates to.
pub async fn capture_session_named(
    conn: &mut BackendConn,
    names: &[String],
) -> Result<Captured, CaptureError> {
    let result = execute(
        conn,
        b"SELECT LAST_INSERT_ID(), HEX(@@character_set_client), HEX(@@collation_connection)",
    )
    .await?;
    let row = result.rows.first();
    let cell = |i: usize| {
        row.and_then(|r| r.get(i))
            .and_then(|v| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let last_insert_id = cell(0).and_then(|v| v.parse().ok()).unwrap_or(0);
    let charset = cell(1).and_then(|h| unhex_utf8(&h)).unwrap_or_default();
    let collation_connection = cell(2).and_then(|h| unhex_utf8(&h)).unwrap_or_default();
    let user_variables = read_user_variables(conn, names, &charset).await?;
    Ok(Captured {
        user_variables,
        last_insert_id,
        collation_connection,
    })
}

fn unhex_utf8(h: &str) -> Option<String> {
    let b = h.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = b
        .chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// Whether text in `charset` can carry any UTF-8 name byte for byte.
fn utf8_charset(charset: &str) -> bool {
    matches!(
        charset.to_ascii_lowercase().as_str(),
        "utf8" | "utf8mb3" | "utf8mb4"
    )
}

/// Columns selected per user variable: `@v` (its type, and numbers exactly),
/// `CAST(@v AS BINARY)` (a string's bytes as stored: a binary column is never converted to
/// `character_set_results`, unlike `@v` itself), `CHARSET(@v)`, `COLLATION(@v)`.
const PER_VARIABLE: usize = 4;

/// Prepares and executes `SELECT @a, CAST(@a AS BINARY), CHARSET(@a), COLLATION(@a), …`
/// and decodes the binary row. A string value travels twice (once converted, unused).
async fn read_user_variables(
    conn: &mut BackendConn,
    names: &[String],
    client_charset: &str,
) -> Result<Vec<UserVariable>, CaptureError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = String::from("SELECT ");
    for (i, name) in names.iter().enumerate() {
        if !name.is_ascii() && !utf8_charset(client_charset) {
            return Err(CaptureError::UnencodableName {
                name: name.clone(),
                charset: client_charset.into(),
            });
        }
        let r = format!("@{}", quote_identifier(name));
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(
            sql,
            "{r}, CAST({r} AS BINARY), CHARSET({r}), COLLATION({r})"
        );
    }
    let deprecate_eof = conn.capabilities & CLIENT_DEPRECATE_EOF != 0;

    // PREPARE
    let mut cmd = vec![COM_STMT_PREPARE];
    cmd.extend_from_slice(sql.as_bytes());
    conn.conn.write_packet(&cmd, 0).await?;
    let first = conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
    if first.payload.first() == Some(&ERR_HEADER) {
        return Err(BackendError::from_err_payload(&first.payload).into());
    }
    let prepared =
        PrepareOk::parse(&first.payload).map_err(|e| CaptureError::Malformed(e.to_string()))?;
    for (count, _) in [
        (prepared.num_params, "params"),
        (prepared.num_columns, "columns"),
    ] {
        if count > 0 {
            for _ in 0..count {
                conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
            }
            if !deprecate_eof {
                conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
            }
        }
    }

    // EXECUTE: id, no cursor, iteration count 1, no parameters.
    let mut cmd = vec![COM_STMT_EXECUTE];
    cmd.extend_from_slice(&prepared.statement_id.to_le_bytes());
    cmd.push(0);
    cmd.extend_from_slice(&1u32.to_le_bytes());
    conn.conn.write_packet(&cmd, 0).await?;
    let outcome = read_binary_result(conn, deprecate_eof).await;

    // CLOSE (no answer), whatever the execute gave.
    let mut cmd = vec![COM_STMT_CLOSE];
    cmd.extend_from_slice(&prepared.statement_id.to_le_bytes());
    conn.conn.write_packet(&cmd, 0).await?;

    let (columns, row) = outcome?;
    let row = row.ok_or_else(|| CaptureError::Malformed("no row".into()))?;
    if columns.len() != names.len() * PER_VARIABLE || row.len() != columns.len() {
        return Err(CaptureError::Malformed(format!(
            "{} columns for {} variables",
            columns.len(),
            names.len()
        )));
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let at = i * PER_VARIABLE;
        let col = &columns[at];
        let text = |j: usize| {
            row[at + j]
                .as_ref()
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let value = decode_user_value(
            col,
            row[at].as_deref(),
            row[at + 1].as_deref(),
            text(2),
            text(3),
        )
        .map_err(|e| CaptureError::Malformed(format!("@{name}: {e}")))?;
        out.push(UserVariable {
            name: name.clone(),
            value,
        });
    }
    Ok(out)
}

/// The parts of a column definition the capture needs.
#[derive(Debug, Clone, Copy)]
struct Column {
    ty: u8,
    flags: u16,
}

const TYPE_DECIMAL: u8 = 0;
const TYPE_TINY: u8 = 1;
const TYPE_SHORT: u8 = 2;
const TYPE_LONG: u8 = 3;
const TYPE_FLOAT: u8 = 4;
const TYPE_DOUBLE: u8 = 5;
const TYPE_NULL: u8 = 6;
const TYPE_LONGLONG: u8 = 8;
const TYPE_INT24: u8 = 9;
const TYPE_YEAR: u8 = 13;
const TYPE_NEWDECIMAL: u8 = 246;
const UNSIGNED_FLAG: u16 = 32;

fn parse_column(payload: &[u8]) -> Result<Column, holdfast_wire::WireError> {
    let mut r = Reader::new(payload);
    for what in [
        "catalog",
        "schema",
        "table",
        "org_table",
        "name",
        "org_name",
    ] {
        r.lenenc_bytes(what)?;
    }
    r.lenenc_int("fixed length")?;
    r.u16("charset")?;
    r.u32("column length")?;
    let ty = r.u8("type")?;
    let flags = r.u16("flags")?;
    Ok(Column { ty, flags })
}

/// Width of a fixed-size binary-protocol value, `None` for length-encoded ones.
fn fixed_width(ty: u8) -> Option<usize> {
    match ty {
        TYPE_TINY => Some(1),
        TYPE_SHORT | TYPE_YEAR => Some(2),
        TYPE_LONG | TYPE_INT24 | TYPE_FLOAT => Some(4),
        TYPE_LONGLONG | TYPE_DOUBLE => Some(8),
        TYPE_NULL => Some(0),
        _ => None,
    }
}

type BinaryResult = (Vec<Column>, Option<Vec<Option<Vec<u8>>>>);

/// Reads a COM_STMT_EXECUTE answer: column definitions and the first binary row.
async fn read_binary_result(
    conn: &mut BackendConn,
    deprecate_eof: bool,
) -> Result<BinaryResult, CaptureError> {
    let first = conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
    match first.payload.first() {
        Some(&ERR_HEADER) => return Err(BackendError::from_err_payload(&first.payload).into()),
        Some(0) => return Err(CaptureError::Malformed("OK instead of a result set".into())),
        _ => {}
    }
    let count = Reader::new(&first.payload)
        .lenenc_int("column count")
        .map_err(|e| CaptureError::Malformed(e.to_string()))?;
    let mut columns = Vec::new();
    for _ in 0..count {
        let p = conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
        columns.push(parse_column(&p.payload).map_err(|e| CaptureError::Malformed(e.to_string()))?);
    }
    if !deprecate_eof {
        conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
    }
    let mut row = None;
    loop {
        let p = conn.conn.read_packet(CAPTURE_MAX_PACKET).await?;
        match p.payload.first() {
            Some(&ERR_HEADER) => return Err(BackendError::from_err_payload(&p.payload).into()),
            Some(&EOF_HEADER) if p.payload.len() < 0xff_ffff => break,
            Some(0) => {
                if row.is_none() {
                    row = Some(
                        decode_binary_row(&p.payload, &columns)
                            .map_err(|e| CaptureError::Malformed(e.to_string()))?,
                    );
                }
            }
            _ => {
                return Err(CaptureError::Malformed(
                    "unexpected packet in the rows".into(),
                ))
            }
        }
    }
    Ok((columns, row))
}

fn decode_binary_row(
    payload: &[u8],
    columns: &[Column],
) -> Result<Vec<Option<Vec<u8>>>, holdfast_wire::WireError> {
    let mut r = Reader::new(payload);
    r.u8("row header")?;
    let bitmap = r.take((columns.len() + 7 + 2) / 8, "null bitmap")?;
    let mut out = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        let bit = i + 2;
        if bitmap[bit / 8] & (1 << (bit % 8)) != 0 {
            out.push(None);
            continue;
        }
        let v = match fixed_width(c.ty) {
            Some(n) => r.take(n, "fixed value")?,
            None => r.lenenc_bytes("value")?,
        };
        out.push(Some(v.to_vec()));
    }
    Ok(out)
}

fn decode_user_value(
    col: &Column,
    raw: Option<&[u8]>,
    raw_bytes: Option<&[u8]>,
    charset: Option<String>,
    collation: Option<String>,
) -> Result<UserValue, String> {
    let unsigned = col.flags & UNSIGNED_FLAG != 0;
    let le = |b: &[u8]| -> Result<[u8; 8], String> {
        let mut a = [0u8; 8];
        match b.len() {
            1 | 2 | 4 | 8 => {
                a[..b.len()].copy_from_slice(b);
                // Sign-extend narrower signed integers.
                if !unsigned && b.len() < 8 && b.last().is_some_and(|x| x & 0x80 != 0) {
                    a[b.len()..].fill(0xff);
                }
                Ok(a)
            }
            n => Err(format!("integer of {n} bytes")),
        }
    };
    Ok(match col.ty {
        TYPE_TINY | TYPE_SHORT | TYPE_LONG | TYPE_INT24 | TYPE_LONGLONG | TYPE_YEAR => {
            match (raw, unsigned) {
                (Some(b), true) => UserValue::Unsigned(Some(u64::from_le_bytes(le(b)?))),
                (Some(b), false) => UserValue::Signed(Some(i64::from_le_bytes(le(b)?))),
                (None, true) => UserValue::Unsigned(None),
                (None, false) => UserValue::Signed(None),
            }
        }
        TYPE_DOUBLE => UserValue::Double(match raw {
            Some(b) => Some(f64::from_le_bytes(
                b.try_into()
                    .map_err(|_| "double of wrong size".to_string())?,
            )),
            None => None,
        }),
        TYPE_FLOAT => UserValue::Double(match raw {
            Some(b) => Some(f64::from(f32::from_le_bytes(
                b.try_into()
                    .map_err(|_| "float of wrong size".to_string())?,
            ))),
            None => None,
        }),
        TYPE_DECIMAL | TYPE_NEWDECIMAL => {
            UserValue::Decimal(raw.map(|b| String::from_utf8_lossy(b).into_owned()))
        }
        _ => UserValue::Text {
            bytes: raw_bytes.map(<[u8]>::to_vec),
            charset: charset.unwrap_or_else(|| "binary".into()),
            collation: collation.unwrap_or_else(|| "binary".into()),
        },
    })
}

// ---------------------------------------------------------------------------------------
// Statement execution
// ---------------------------------------------------------------------------------------

/// Runs one statement (COM_QUERY) and buffers its answer. For holdfast's own statements.
pub async fn execute(conn: &mut BackendConn, sql: &[u8]) -> Result<Executed, BackendError> {
    conn.execute(sql, CAPTURE_MAX_PACKET).await
}

// ---------------------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------------------

/// One `name = expression` of the restoring SET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// What an error names: `@@sql_mode`, `@name`, `last_insert_id`.
    pub item: String,
    /// The assignment as written in the SET (`@@session.\`sql_mode\` = '…'`).
    pub sql: String,
}

/// The statements that recreate a session, in order (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestorePlan {
    /// A schema or user-variable name is not ASCII: the SET and USE run under
    /// `SET NAMES utf8mb4`, after reading the connection's own character set variables so
    /// that those the record does not mention are put back.
    pub needs_utf8: bool,
    pub schema: Option<String>,
    pub assignments: Vec<Assignment>,
    /// `SET TRANSACTION …` statements.
    pub transaction: Vec<String>,
    /// Tracked variables left out, with why.
    pub skipped: Vec<(String, &'static str)>,
}

/// The connection character set variables a `SET NAMES` changes.
const CONNECTION_CHARSET_VARS: [&str; 4] = [
    "character_set_client",
    "character_set_results",
    "character_set_connection",
    "collation_connection",
];

fn system_assignment(name: &str, value: &str, types: &VariableTypes) -> Assignment {
    let lower = name.to_ascii_lowercase();
    let literal = system_variable_literal(&lower, value, types.get(&lower).map(|i| i.kind));
    Assignment {
        item: format!("@@{lower}"),
        sql: format!("@@session.{} = {literal}", quote_identifier(&lower)),
    }
}

/// Builds the restore statements for a record (pure; [`restore_session`] runs them).
pub fn plan(
    record: &SessionRecord,
    user_vars: &[UserVariable],
    types: &VariableTypes,
) -> Result<RestorePlan, RestoreError> {
    let mut p = RestorePlan {
        schema: record.schema.clone().filter(|s| !s.is_empty()),
        ..RestorePlan::default()
    };
    p.needs_utf8 = p.schema.as_deref().is_some_and(|s| !s.is_ascii())
        || user_vars.iter().any(|v| !v.name.is_ascii());
    for v in user_vars {
        p.assignments.push(Assignment {
            item: format!("@{}", v.name),
            sql: format!("{} = {}", v.reference(), v.literal()?),
        });
    }
    let mut vars: Vec<(&String, &String)> = Vec::new();
    for (name, value) in &record.variables {
        match skip_reason(name, types) {
            Some(why) => p.skipped.push((name.clone(), why)),
            None => vars.push((name, value)),
        }
    }
    vars.sort_by_key(|(n, _)| {
        (
            assignment_rank(&n.to_ascii_lowercase()),
            n.to_ascii_lowercase(),
        )
    });
    for (name, value) in vars {
        p.assignments.push(system_assignment(name, value, types));
    }
    if record.last_insert_id != 0 {
        p.assignments.push(Assignment {
            item: "last_insert_id".into(),
            sql: format!("@@session.last_insert_id = {}", record.last_insert_id),
        });
    }
    for stmt in record.next_transaction.split(';') {
        let stmt = stmt.trim();
        if stmt.is_empty() {
            continue;
        }
        let upper = stmt.to_ascii_uppercase();
        if !upper.starts_with("SET TRANSACTION") {
            return Err(RestoreError::Unsupported {
                item: "next transaction characteristics".into(),
                reason: format!("unexpected statement {stmt:?}"),
            });
        }
        p.transaction.push(stmt.to_string());
    }
    Ok(p)
}

fn rejected(item: &str, e: BackendError) -> RestoreError {
    match e {
        BackendError::Server {
            code,
            state,
            message,
            ..
        } => RestoreError::Rejected {
            item: item.into(),
            code,
            state,
            message,
        },
        other => RestoreError::Backend(other),
    }
}

/// Recreates a session's state on a freshly logged-in backend connection (trackers on, no
/// transaction): schema, user variables, system variables, `LAST_INSERT_ID()`, and the next
/// transaction's characteristics. On a refusal the error names what was refused; the
/// connection is then in an unspecified state and should be closed.
pub async fn restore_session(
    conn: &mut BackendConn,
    record: &SessionRecord,
    user_vars: &[UserVariable],
    types: &VariableTypes,
) -> Result<(), RestoreError> {
    let mut p = plan(record, user_vars, types)?;
    for (name, why) in &p.skipped {
        tracing::debug!(variable = %name, reason = why, "not replayed");
    }
    if p.needs_utf8 {
        // Put back whatever the record does not set of the connection's character set.
        let sql = format!(
            "SELECT {}",
            CONNECTION_CHARSET_VARS
                .iter()
                .map(|v| format!("HEX(@@session.{v})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let current = execute(conn, sql.as_bytes())
            .await
            .map_err(|e| rejected("the connection character set", e))?;
        let row = current.rows.first().cloned().unwrap_or_default();
        for (i, name) in CONNECTION_CHARSET_VARS.iter().enumerate() {
            if record
                .variables
                .keys()
                .any(|k| k.eq_ignore_ascii_case(name))
            {
                continue;
            }
            let value = row
                .get(i)
                .and_then(|v| v.as_deref())
                .and_then(|h| unhex_utf8(&String::from_utf8_lossy(h)))
                .unwrap_or_default();
            p.assignments.push(system_assignment(name, &value, types));
        }
        execute(conn, b"SET NAMES utf8mb4")
            .await
            .map_err(|e| rejected("SET NAMES utf8mb4", e))?;
    }
    if let Some(db) = &p.schema {
        let sql = format!("USE {}", quote_identifier(db));
        execute(conn, sql.as_bytes())
            .await
            .map_err(|e| rejected(&format!("database {}", quote_identifier(db)), e))?;
    }
    if !p.assignments.is_empty() {
        let sql = format!(
            "SET {}",
            p.assignments
                .iter()
                .map(|a| a.sql.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Err(e) = execute(conn, sql.as_bytes()).await {
            if !matches!(e, BackendError::Server { .. }) {
                return Err(RestoreError::Backend(e));
            }
            // Find the assignment the server refuses.
            for a in &p.assignments {
                let one = format!("SET {}", a.sql);
                execute(conn, one.as_bytes())
                    .await
                    .map_err(|e| rejected(&a.item, e))?;
            }
            return Err(rejected("the session variables", e));
        }
    }
    for stmt in &p.transaction {
        execute(conn, stmt.as_bytes())
            .await
            .map_err(|e| rejected("next transaction characteristics", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types() -> VariableTypes {
        VariableTypes::from_rows([
            ("sql_mode", "SET", "NO", "SESSION"),
            ("time_zone", "VARCHAR", "NO", "SESSION"),
            ("autocommit", "BOOLEAN", "NO", "SESSION"),
            ("max_statement_time", "DOUBLE", "NO", "SESSION"),
            ("max_join_size", "BIGINT UNSIGNED", "NO", "SESSION"),
            ("div_precision_increment", "INT UNSIGNED", "NO", "SESSION"),
            ("character_set_client", "ENUM", "NO", "SESSION"),
            ("collation_connection", "ENUM", "NO", "SESSION"),
            ("character_set_connection", "ENUM", "NO", "SESSION"),
            ("character_set_results", "ENUM", "NO", "SESSION"),
            ("tx_isolation", "ENUM", "NO", "SESSION"),
            ("warning_count", "BIGINT UNSIGNED", "YES", "SESSION ONLY"),
            ("external_user", "VARCHAR", "YES", "SESSION ONLY"),
            ("read_only", "BOOLEAN", "NO", "GLOBAL"),
            (
                "in_predicate_conversion_threshold",
                "INT UNSIGNED",
                "NO",
                "SESSION",
            ),
            ("LOCK_WAIT_TIMEOUT", "BIGINT UNSIGNED", "NO", "SESSION"),
        ])
    }

    #[test]
    fn literals_by_type() {
        let t = types();
        let lit = |n: &str, v: &str| system_variable_literal(n, v, t.get(n).map(|i| i.kind));
        assert_eq!(
            lit("max_join_size", "18446744073709551615"),
            "18446744073709551615"
        );
        assert_eq!(lit("lock_wait_timeout", "5"), "5");
        assert_eq!(lit("max_statement_time", "2.500000"), "2.500000");
        assert_eq!(lit("autocommit", "OFF"), "OFF");
        assert_eq!(lit("autocommit", "on"), "ON");
        assert_eq!(
            lit("sql_mode", "STRICT_TRANS_TABLES,ANSI_QUOTES"),
            "'STRICT_TRANS_TABLES,ANSI_QUOTES'"
        );
        assert_eq!(lit("sql_mode", ""), "''");
        assert_eq!(lit("time_zone", "+05:30"), "'+05:30'");
        assert_eq!(lit("tx_isolation", "SERIALIZABLE"), "'SERIALIZABLE'");
        assert_eq!(lit("character_set_results", ""), "NULL");
        assert_eq!(lit("character_set_results", "NULL"), "NULL");
        assert_eq!(lit("character_set_client", "latin1"), "'latin1'");
        // A number where a number is expected but the value is not one: quoted, and the
        // server refuses it by name.
        assert_eq!(lit("max_join_size", "lots"), "'lots'");
        // Unknown variables: numbers stay numbers.
        assert_eq!(lit("no_such_var", "12"), "12");
        assert_eq!(lit("no_such_var", "x"), "'x'");
    }

    #[test]
    fn skip_list() {
        let t = types();
        for name in [
            "session_track_system_variables",
            "session_track_schema",
            "session_track_state_change",
            "session_track_transaction_info",
            "last_insert_id",
            "insert_id",
            "identity",
            "rand_seed1",
            "gtid_seq_no",
            "pseudo_thread_id",
            "warning_count",
            "external_user",
            "read_only",
        ] {
            assert!(skip_reason(name, &t).is_some(), "{name} must be skipped");
        }
        for name in [
            "sql_mode",
            "timestamp",
            "autocommit",
            "time_zone",
            "gtid_domain_id",
        ] {
            assert_eq!(skip_reason(name, &t), None, "{name} must be replayed");
        }
    }

    #[test]
    fn user_variable_literals() {
        let v = |value| UserVariable {
            name: "v".into(),
            value,
        };
        let lit = |value| v(value).literal().unwrap();
        assert_eq!(
            lit(UserValue::Signed(Some(i64::MIN))),
            "-9223372036854775808"
        );
        assert_eq!(lit(UserValue::Signed(None)), "CAST(NULL AS SIGNED)");
        assert_eq!(
            lit(UserValue::Unsigned(Some(u64::MAX))),
            "CAST(18446744073709551615 AS UNSIGNED)"
        );
        assert_eq!(lit(UserValue::Decimal(Some("1.10".into()))), "1.10");
        assert_eq!(
            lit(UserValue::Decimal(Some("-7".into()))),
            "CAST(-7 AS DECIMAL(65,0))"
        );
        assert_eq!(lit(UserValue::Double(Some(0.1))), "1e-1");
        assert_eq!(lit(UserValue::Double(Some(-2.5e300))), "-2.5e300");
        assert_eq!(lit(UserValue::Double(Some(0.0))), "0e0");
        assert_eq!(
            lit(UserValue::Text {
                bytes: Some(vec![0xe9]),
                charset: "latin1".into(),
                collation: "latin1_swedish_ci".into()
            }),
            "_latin1 X'E9' COLLATE latin1_swedish_ci"
        );
        assert_eq!(
            lit(UserValue::Text {
                bytes: Some(vec![0, 0xff]),
                charset: "binary".into(),
                collation: "binary".into()
            }),
            "_binary X'00FF'"
        );
        assert_eq!(
            lit(UserValue::Text {
                bytes: None,
                charset: "latin1".into(),
                collation: "latin1_german1_ci".into()
            }),
            "CAST(NULL AS CHAR CHARACTER SET latin1) COLLATE latin1_german1_ci"
        );
        assert!(v(UserValue::Decimal(Some("1e5".into()))).literal().is_err());
        assert!(v(UserValue::Text {
            bytes: Some(vec![]),
            charset: "x; DROP".into(),
            collation: "y".into()
        })
        .literal()
        .is_err());
        assert_eq!(v(UserValue::Signed(Some(1))).reference(), "@`v`");
    }

    #[test]
    fn double_literals_round_trip() {
        for f in [
            0.1,
            1.0 / 3.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            -0.5,
            123456789.125,
        ] {
            let s = format!("{f:e}");
            assert_eq!(s.parse::<f64>().unwrap().to_bits(), f.to_bits(), "{s}");
        }
    }

    #[test]
    fn plan_orders_and_skips() {
        let t = types();
        let mut r = SessionRecord::default();
        for (k, v) in [
            ("collation_connection", "latin1_swedish_ci"),
            ("character_set_connection", "latin1"),
            ("character_set_client", "latin1"),
            ("autocommit", "OFF"),
            ("session_track_schema", "ON"),
            ("warning_count", "0"),
            ("sql_mode", "ANSI_QUOTES"),
        ] {
            r.variables.insert(k.into(), v.into());
        }
        r.schema = Some("my`db".into());
        r.last_insert_id = 42;
        r.next_transaction =
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET TRANSACTION READ ONLY;".into();
        let vars = [UserVariable {
            name: "a".into(),
            value: UserValue::Signed(Some(1)),
        }];
        let p = plan(&r, &vars, &t).unwrap();
        let items: Vec<&str> = p.assignments.iter().map(|a| a.item.as_str()).collect();
        assert_eq!(
            items,
            [
                "@a",
                "@@autocommit",
                "@@sql_mode",
                "@@character_set_client",
                "@@character_set_connection",
                "@@collation_connection",
                "last_insert_id"
            ]
        );
        assert_eq!(p.assignments[2].sql, "@@session.`sql_mode` = 'ANSI_QUOTES'");
        assert_eq!(p.schema.as_deref(), Some("my`db"));
        assert!(!p.needs_utf8);
        assert_eq!(
            p.transaction,
            [
                "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                "SET TRANSACTION READ ONLY"
            ]
        );
        let skipped: Vec<&str> = p.skipped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(skipped, ["session_track_schema", "warning_count"]);

        r.next_transaction = "START TRANSACTION".into();
        let e = plan(&r, &[], &t).unwrap_err();
        assert_eq!(e.item(), Some("next transaction characteristics"));
    }

    #[test]
    fn binary_row_decoding() {
        let cols = [
            Column {
                ty: TYPE_LONGLONG,
                flags: UNSIGNED_FLAG,
            },
            Column {
                ty: TYPE_DOUBLE,
                flags: 0,
            },
            Column { ty: 253, flags: 0 },
            Column {
                ty: TYPE_LONGLONG,
                flags: 0,
            },
        ];
        let mut p = vec![0u8, 0b0010_0000];
        p.extend_from_slice(&u64::MAX.to_le_bytes());
        p.extend_from_slice(&0.1f64.to_le_bytes());
        p.extend_from_slice(&[2, b'h', b'i']);
        let row = decode_binary_row(&p, &cols).unwrap();
        assert_eq!(row[3], None);
        assert_eq!(
            decode_user_value(&cols[0], row[0].as_deref(), None, None, None).unwrap(),
            UserValue::Unsigned(Some(u64::MAX))
        );
        assert_eq!(
            decode_user_value(&cols[1], row[1].as_deref(), None, None, None).unwrap(),
            UserValue::Double(Some(0.1))
        );
        assert_eq!(
            decode_user_value(&cols[3], None, None, None, None).unwrap(),
            UserValue::Signed(None)
        );
        assert_eq!(unhex_utf8("F09F9880").as_deref(), Some("😀"));
        assert_eq!(unhex_utf8("F"), None);
    }
}
