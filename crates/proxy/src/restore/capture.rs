//! Reading a session's user variables, `LAST_INSERT_ID()` and `collation_connection` from
//! the old backend connection (text protocol for the names, binary protocol for values).

use super::values::decode_user_value;
use super::{execute, CaptureError, UserVariable, CAPTURE_MAX_PACKET};
use crate::backend::{BackendConn, BackendError};
use crate::state::SessionRecord;
use holdfast_sql::quote::identifier;
use std::fmt::Write as _;

/// User variables and what the trackers do not report exactly, read from a backend
/// connection.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// [`restore_session`](super::restore_session).
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
/// (`FOUND_ROWS()`, `ROW_COUNT()`, `SHOW WARNINGS`): [`read_diagnostics`] before and
/// [`put_back_diagnostics`] after keep those where they can.
pub async fn capture_session(conn: &mut BackendConn) -> Result<Captured, CaptureError> {
    let list = "SELECT LAST_INSERT_ID(), HEX(@@character_set_client), \
                HEX(@@collation_connection), HEX(CONVERT(u.VARIABLE_NAME USING utf8mb4)) \
                FROM (SELECT 1) AS one LEFT JOIN information_schema.USER_VARIABLES AS u ON 1";
    let list = format!("{list}{}", super::NO_LIMIT);
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
    let sql = format!(
        "SELECT LAST_INSERT_ID(), HEX(@@character_set_client), HEX(@@collation_connection){}",
        super::NO_LIMIT
    );
    let result = execute(conn, sql.as_bytes()).await?;
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

pub(super) fn unhex_utf8(h: &str) -> Option<String> {
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
/// (binary protocol, [`BackendConn::execute_prepared`]) and decodes the row. A string value travels twice (once converted, unused).
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
        let r = format!("@{}", identifier(name));
        if i > 0 {
            sql.push_str(", ");
        }
        let _ = write!(
            sql,
            "{r}, CAST({r} AS BINARY), CHARSET({r}), COLLATION({r})"
        );
    }
    sql.push_str(super::NO_LIMIT);
    let result = conn
        .execute_prepared(sql.as_bytes(), CAPTURE_MAX_PACKET)
        .await?;
    let columns = result.columns;
    let row = result
        .first_row
        .ok_or_else(|| CaptureError::Malformed("no row".into()))?;
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

/// What the client can read about its last statement and a capture's statements would
/// change: `FOUND_ROWS()`, `ROW_COUNT()` and the warnings (`SHOW WARNINGS`, errors
/// included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diagnostics {
    pub found_rows: u64,
    pub row_count: i64,
    pub warnings: u64,
}

impl Diagnostics {
    /// Whether a capture can run and [`put_back_diagnostics`] recreate them afterwards:
    /// `ROW_COUNT()` is -1 after a `SELECT` and 0 after `DO`, but no statement without side
    /// effects sets it to n > 0; warnings cannot be recreated (levels, codes, SQLSTATEs)
    /// and the capture's `information_schema` read clears them.
    pub fn restorable(&self) -> bool {
        (self.row_count == -1 || self.row_count == 0)
            && self.warnings == 0
            && self.found_rows_restorable()
    }

    /// Whether [`found_rows_select`] recreates `FOUND_ROWS()`.
    pub fn found_rows_restorable(&self) -> bool {
        self.found_rows <= MAX_FOUND_ROWS
    }
}

/// Reads `FOUND_ROWS()`, `ROW_COUNT()` and `@@warning_count` as the client's last
/// statement left them. A `SELECT` without tables keeps the warnings (MariaDB clears them
/// only for statements that open tables), but sets `FOUND_ROWS()` to 1 and `ROW_COUNT()`
/// to -1: [`put_back_diagnostics`] must follow.
pub async fn read_diagnostics(conn: &mut BackendConn) -> Result<Diagnostics, CaptureError> {
    let sql = format!(
        "SELECT FOUND_ROWS(), ROW_COUNT(), @@warning_count{}",
        super::NO_LIMIT
    );
    let result = execute(conn, sql.as_bytes()).await?;
    let cell = |i: usize| {
        result
            .rows
            .first()
            .and_then(|r| r.get(i))
            .and_then(|v| v.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let found_rows = cell(0).and_then(|v| v.parse().ok());
    let row_count = cell(1).and_then(|v| v.parse().ok());
    let warnings = cell(2).and_then(|v| v.parse().ok());
    match (found_rows, row_count, warnings) {
        (Some(found_rows), Some(row_count), Some(warnings)) => Ok(Diagnostics {
            found_rows,
            row_count,
            warnings,
        }),
        _ => Err(CaptureError::Malformed(
            "FOUND_ROWS(), ROW_COUNT(), @@warning_count".into(),
        )),
    }
}

/// Sets `FOUND_ROWS()` and `ROW_COUNT()` back to `d` after holdfast's own statements: a
/// `SELECT` that returns or finds `found_rows` rows (which leaves `ROW_COUNT()` at -1),
/// then `DO 0` when it was 0 (`DO` keeps `FOUND_ROWS()`). Up to [`UNION_ROWS`] rows the
/// `SELECT` opens no table, so it keeps warnings too.
pub async fn put_back_diagnostics(
    conn: &mut BackendConn,
    d: Diagnostics,
) -> Result<(), CaptureError> {
    execute(conn, found_rows_select(d.found_rows).as_bytes()).await?;
    if d.row_count == 0 {
        execute(conn, b"DO 0").await?;
    }
    Ok(())
}

/// The largest `FOUND_ROWS()` [`put_back_diagnostics`] recreates (its join reads up to ten
/// times as many rows).
pub const MAX_FOUND_ROWS: u64 = 10_000_000;

/// Up to this many rows, `FOUND_ROWS()` is recreated by a `UNION ALL` without tables.
const UNION_ROWS: u64 = 1000;

/// A `SELECT` after which `FOUND_ROWS()` is `n`. Small counts: `n` one-row `SELECT`s in a
/// `UNION ALL` (no table). Larger: the numbers below the next power of ten from a cross
/// join of digit tables, filtered to those below `n` (no recursion: a recursive CTE stops
/// at the session's `max_recursive_iterations`, 1001 by default).
pub fn found_rows_select(n: u64) -> String {
    if n == 0 {
        return "SELECT 1 FROM DUAL WHERE 0".into();
    }
    if n <= UNION_ROWS {
        // Without a LIMIT it would return (and find) the client's sql_select_limit rows.
        return vec!["SELECT 1"; n as usize].join(" UNION ALL ") + super::NO_LIMIT;
    }
    let digits = n.saturating_sub(1).checked_ilog10().map_or(1, |d| d + 1);
    let table = "(SELECT 0 AS i UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let mut from = Vec::new();
    let mut sum = Vec::new();
    for d in 0..digits {
        from.push(format!("{table} AS d{d}"));
        sum.push(format!("d{d}.i * {}", 10u64.pow(d)));
    }
    format!(
        "SELECT SQL_CALC_FOUND_ROWS 1 FROM {} WHERE {} < {n} LIMIT 0",
        from.join(", "),
        sum.join(" + ")
    )
}

#[cfg(test)]
mod diagnostics_tests {
    use super::found_rows_select;

    #[test]
    fn found_rows_select_makes_n_rows() {
        assert_eq!(found_rows_select(0), "SELECT 1 FROM DUAL WHERE 0");
        assert_eq!(found_rows_select(1), "SELECT 1 LIMIT 18446744073709551615");
        assert_eq!(
            found_rows_select(3),
            "SELECT 1 UNION ALL SELECT 1 UNION ALL SELECT 1 LIMIT 18446744073709551615"
        );
        let s = found_rows_select(1001);
        assert_eq!(s.matches(" AS d").count(), 4, "{s}");
        assert!(s.ends_with("d3.i * 1000 < 1001 LIMIT 0"), "{s}");
        let s = found_rows_select(10_000);
        assert_eq!(s.matches(" AS d").count(), 4, "{s}");
        let s = found_rows_select(10_001);
        assert_eq!(s.matches(" AS d").count(), 5, "{s}");
    }
}
