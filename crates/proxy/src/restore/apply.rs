//! Running a [`RestorePlan`](super::RestorePlan) on the new backend connection.

use super::capture::unhex_utf8;
use super::plan::{plan, system_assignment, CONNECTION_CHARSET_VARS};
use super::{execute, RestoreError, UserVariable, VariableTypes};
use crate::backend::{BackendConn, BackendError};
use crate::state::SessionRecord;
use holdfast_sql::quote::identifier;

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

/// `USE db` on a connection.
pub async fn use_schema(conn: &mut BackendConn, db: &str) -> Result<(), BackendError> {
    let sql = format!("USE {}", identifier(db));
    execute(conn, sql.as_bytes()).await.map(|_| ())
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
            "SELECT {}{}",
            CONNECTION_CHARSET_VARS
                .iter()
                .map(|v| format!("HEX(@@session.{v})"))
                .collect::<Vec<_>>()
                .join(", "),
            super::NO_LIMIT
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
        use_schema(conn, db)
            .await
            .map_err(|e| rejected(&format!("database {}", identifier(db)), e))?;
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
