//! System variable types (`information_schema.SYSTEM_VARIABLES`), which tracked variables
//! are replayed, and how each value is written back as a literal.

use crate::backend::{BackendConn, BackendError};
use holdfast_sql::quote::string_literal;
use std::collections::HashMap;
use std::sync::Arc;

/// The query [`VariableTypes::load`] runs.
pub const VARIABLE_TYPES_QUERY: &str = "SELECT LOWER(VARIABLE_NAME), VARIABLE_TYPE, READ_ONLY, \
VARIABLE_SCOPE FROM information_schema.SYSTEM_VARIABLES";

/// How a system variable's value is written in SQL (`VARIABLE_TYPE` in
/// `information_schema.SYSTEM_VARIABLES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VarInfo {
    pub kind: VarKind,
    pub read_only: bool,
    /// `VARIABLE_SCOPE` is `GLOBAL`: there is no session value to restore.
    pub global_only: bool,
}

/// System variable types of one server, by lower-case name. Load once per backend.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
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

/// The system variable types of each server this process has restored a session on, by
/// node (with the server version its greeting gave): one table of some 600 entries per
/// server, shared by the sessions (a split session's replica connections held one each,
/// 60 KB per idle session), and a query on `information_schema` saved for each replica
/// connection opened and each session moved. A node that comes back with another version
/// has its types loaded again. Locked only while a connection is opened, moved or handed
/// over, never per request.
#[derive(Default)]
pub struct TypesCache(std::sync::Mutex<TypesTable>);

/// Types by node, with the server version its greeting gave (one entry a node: a node
/// upgraded replaces its old version's).
type TypesTable = HashMap<String, (Vec<u8>, Arc<VariableTypes>)>;

impl TypesCache {
    /// The types of `node`'s server, which `conn` is logged in to: loaded through it the
    /// first time, and again when the server's version changed.
    pub async fn of(
        &self,
        node: &str,
        conn: &mut BackendConn,
    ) -> Result<Arc<VariableTypes>, BackendError> {
        let version = conn.greeting.server_version();
        if let Some((v, types)) = self.table().get(node) {
            if v[..] == *version {
                return Ok(types.clone());
            }
        }
        let version = version.to_vec();
        let loaded = VariableTypes::load(conn).await?;
        Ok(self.adopt(node, &version, loaded))
    }

    /// `node`'s types at `version` as this process keeps them: `types` (read elsewhere:
    /// by the process that handed a connection over) becomes the entry unless one for the
    /// same version is there already.
    pub fn adopt(&self, node: &str, version: &[u8], types: VariableTypes) -> Arc<VariableTypes> {
        let mut table = self.table();
        match table.get(node) {
            Some((v, kept)) if v == version => kept.clone(),
            _ => {
                let types = Arc::new(types);
                table.insert(node.to_string(), (version.to_vec(), types.clone()));
                types
            }
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, TypesTable> {
        // (Nothing is left half-done under the lock: a poisoned table is whole.)
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a tracked system variable is not replayed, or `None` when it is.
///
/// * `session_track_*`: holdfast's own trackers ([`crate::backend::ENABLE_TRACKERS`]), set
///   on every backend connection; replaying a client's change would blind holdfast.
/// * `last_insert_id`, `identity`: restored from
///   [`SessionRecord::last_insert_id`](crate::state::SessionRecord::last_insert_id) instead.
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
    if let Some(why) = skip_reason_by_name(&lower) {
        return Some(why);
    }
    match types.get(&lower) {
        Some(i) if i.read_only => Some("read-only"),
        Some(i) if i.global_only => Some("global only"),
        _ => None,
    }
}

/// The part of [`skip_reason`] that the (lower-case) name alone decides.
pub(crate) fn skip_reason_by_name(lower: &str) -> Option<&'static str> {
    if lower.starts_with("session_track_") {
        return Some("set by holdfast on every backend connection");
    }
    match lower {
        "last_insert_id" | "identity" => Some("restored from the record's last insert id"),
        "insert_id" | "rand_seed1" | "rand_seed2" | "gtid_seq_no" => {
            Some("one-shot value consumed by the next statement")
        }
        "pseudo_thread_id" => Some("names a thread of the old server"),
        "warning_count" | "error_count" | "in_transaction" | "last_gtid" | "external_user"
        | "proxy_user" => Some("read-only"),
        _ => None,
    }
}

/// Whether `s` is a plain integer literal (`-` and decimal digits).
pub(super) fn is_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `s` is a plain decimal number (`-12.50`, `3`, `.5` is not accepted).
pub(super) fn is_decimal(s: &str) -> bool {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

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
pub(super) fn assignment_rank(name: &str) -> u8 {
    if name.starts_with("character_set_") {
        1
    } else if name.starts_with("collation_") {
        2
    } else {
        0
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn one_entry_a_node_shared_while_its_version_holds_and_replaced_when_it_changes() {
        let cache = TypesCache::default();
        let first = cache.adopt("node2", b"10.11.19-MariaDB", VariableTypes::default());
        let again = cache.adopt("node2", b"10.11.19-MariaDB", VariableTypes::default());
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same version shares one table"
        );
        let upgraded = cache.adopt("node2", b"11.4.5-MariaDB", VariableTypes::default());
        assert!(
            !Arc::ptr_eq(&first, &upgraded),
            "another version is loaded again"
        );
        let other = cache.adopt("node3", b"10.11.19-MariaDB", VariableTypes::default());
        assert!(!Arc::ptr_eq(&upgraded, &other));
        assert_eq!(cache.table().len(), 2, "one entry a node");
    }
}
