//! The statement text that recreates a session (pure: [`super::restore_session`] runs it).

use super::types::{assignment_rank, skip_reason, system_variable_literal, VariableTypes};
use super::{RestoreError, UserVariable};
use crate::state::SessionRecord;
use holdfast_sql::quote::identifier;

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
pub(super) const CONNECTION_CHARSET_VARS: [&str; 4] = [
    "character_set_client",
    "character_set_results",
    "character_set_connection",
    "collation_connection",
];

pub(super) fn system_assignment(name: &str, value: &str, types: &VariableTypes) -> Assignment {
    let lower = name.to_ascii_lowercase();
    let literal = system_variable_literal(&lower, value, types.get(&lower).map(|i| i.kind));
    Assignment {
        item: format!("@@{lower}"),
        sql: format!("@@session.{} = {literal}", identifier(&lower)),
    }
}

/// Builds the restore statements for a record (pure; [`restore_session`](super::restore_session) runs them).
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
