//! The session's prepared statements under the ids holdfast gave the client. Ids are handed
//! out in sequence and never reused within a session (as the server does), so a stale id
//! cannot reach another statement; lookups hash the id with the identity function.

use bytes::{Bytes, BytesMut};
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A prepared statement. The text, shape and last bound parameter types are kept so the
/// statement can be prepared again on another backend.
pub(super) struct Statement {
    pub backend_id: u32,
    pub sql: Bytes,
    pub params: u16,
    pub cursor_open: bool,
    pub long_data: bool,
    /// An execute lost with its backend outside a transaction may run again elsewhere (the
    /// statement only reads, only begins a transaction, or only sets session variables, and
    /// calls nothing but pure built-ins), unless its connection was killed.
    pub retry_safe: bool,
    /// An execute lost with its backend inside a transaction may have committed it (a
    /// prepared COMMIT, DDL...): its outcome is unknown.
    pub may_commit: bool,
    /// The statement may be part of a transaction replay (see `replay.rs`).
    pub replayable: bool,
    /// The statement's classification (under the session's sql_mode when prepared).
    pub flags: holdfast_sql::Classification,
    /// Where an execute of it may run in a split session.
    pub read_route: holdfast_sql::ReadRoute,
    /// The parameter type block of the last execute that sent types.
    pub types: Option<Vec<u8>>,
    /// Re-prepared on a new backend that has not seen the types yet.
    pub types_pending: bool,
}

/// Statement ids are small sequential integers: they are their own hash.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

pub(super) struct Statements {
    by_id: HashMap<u32, Statement, BuildHasherDefault<IdHasher>>,
    next_id: u32,
    /// The client's id of the statement prepared last, if that prepare succeeded (what
    /// MariaDB's statement id -1 names).
    pub last: Option<u32>,
    /// The current schema when each statement prepared with `PREPARE name` (lower-case
    /// names) was: an `EXECUTE` of it runs in that schema (see `owed_schema`).
    sql_schemas: super::lazy_map::LazyMap<Vec<u8>, Option<String>>,
}

/// SQL-level prepared statements whose schema is kept; past this many, an `EXECUTE` of
/// another is taken to run in the current schema.
const SQL_SCHEMAS_MAX: usize = 1024;

impl Default for Statements {
    fn default() -> Self {
        Statements {
            by_id: HashMap::default(),
            next_id: 1,
            last: None,
            sql_schemas: Default::default(),
        }
    }
}

impl Statements {
    /// Stores a newly prepared statement; returns the id the client gets.
    pub fn insert(&mut self, stmt: Statement) -> u32 {
        let id = self.next_id;
        // Never 0, nor u32::MAX (MariaDB's "the statement prepared last").
        self.next_id = match self.next_id.wrapping_add(1) {
            0 | u32::MAX => 1,
            n => n,
        };
        self.by_id.insert(id, stmt);
        self.last = Some(id);
        id
    }

    /// The statement a client's id names: MariaDB's id -1 is the one prepared last.
    pub fn resolve(&self, id: u32) -> u32 {
        match id {
            u32::MAX => self.last.unwrap_or(u32::MAX),
            id => id,
        }
    }

    pub fn get(&self, id: u32) -> Option<&Statement> {
        self.by_id.get(&id)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut Statement> {
        self.by_id.get_mut(&id)
    }

    pub fn remove(&mut self, id: u32) {
        self.by_id.remove(&id);
    }

    /// COM_RESET_CONNECTION and COM_CHANGE_USER drop every statement; ids keep counting.
    pub fn clear(&mut self) {
        self.by_id.clear();
        self.last = None;
        self.sql_schemas.clear();
    }

    /// A `PREPARE name` (`Some(schema)`: it succeeded under that current schema) or a
    /// `DEALLOCATE PREPARE name` (`None`; a failed `PREPARE` drops the old one too).
    pub fn note_sql_prepared(&mut self, name: Vec<u8>, schema: Option<Option<String>>) {
        match schema {
            Some(schema) if self.sql_schemas.len() < SQL_SCHEMAS_MAX => {
                self.sql_schemas.insert(name, schema);
            }
            _ => {
                self.sql_schemas.remove(&name);
            }
        }
    }

    /// Whether an `EXECUTE name` runs its statement under another schema than `current`.
    pub fn sql_runs_elsewhere(&self, name: &[u8], current: Option<&str>) -> bool {
        self.sql_schemas
            .get(name)
            .is_some_and(|prepared| prepared.as_deref() != current)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Statement)> {
        self.by_id.iter().map(|(&id, s)| (id, s))
    }

    pub fn open_cursors(&self) -> usize {
        self.by_id.values().filter(|s| s.cursor_open).count()
    }

    pub fn pending_long_data(&self) -> bool {
        self.by_id.values().any(|s| s.long_data)
    }
}

/// Remembers the parameter types a COM_STMT_EXECUTE sends, and puts them back into an execute
/// that relies on the server remembering them when the statement was re-prepared on a new
/// backend that never saw them. Returns the rewritten request when one is needed.
pub(super) fn bind_types(stmt: &mut Statement, request: &[u8]) -> Option<BytesMut> {
    let header = parse_header(request)?;
    if header.continues() || stmt.params == 0 {
        return None;
    }
    let payload = request.get(HEADER_LEN..HEADER_LEN + header.len)?;
    let n = usize::from(stmt.params);
    let flag_pos = 10 + n.div_ceil(8);
    match *payload.get(flag_pos)? {
        1 => {
            let types = payload.get(flag_pos + 1..flag_pos + 1 + 2 * n)?;
            match &mut stmt.types {
                Some(known) if known.as_slice() == types => {}
                Some(known) => {
                    known.clear();
                    known.extend_from_slice(types);
                }
                None => stmt.types = Some(types.to_vec()),
            }
            stmt.types_pending = false;
            None
        }
        _ if stmt.types_pending => {
            let patched = with_types(stmt, request)?;
            stmt.types_pending = false;
            Some(patched)
        }
        _ => None,
    }
}

/// A COM_STMT_EXECUTE that relies on the server remembering its parameter types, with the
/// statement's last known types written in (`None`: it carries its own, or none are known).
pub(super) fn with_types(stmt: &Statement, request: &[u8]) -> Option<BytesMut> {
    let header = parse_header(request)?;
    if header.continues() || stmt.params == 0 {
        return None;
    }
    let payload = request.get(HEADER_LEN..HEADER_LEN + header.len)?;
    let flag_pos = 10 + usize::from(stmt.params).div_ceil(8);
    if *payload.get(flag_pos)? == 1 {
        return None;
    }
    let types = stmt.types.as_ref()?;
    let mut patched = Vec::with_capacity(payload.len() + types.len());
    patched.extend_from_slice(&payload[..flag_pos]);
    patched.push(1);
    patched.extend_from_slice(types);
    patched.extend_from_slice(&payload[flag_pos + 1..]);
    Some(BytesMut::from(&frame::packet(&patched, header.seq)[..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stmt() -> Statement {
        Statement {
            backend_id: 7,
            sql: Bytes::from_static(b"SELECT ?"),
            params: 1,
            cursor_open: false,
            long_data: false,
            retry_safe: true,
            may_commit: false,
            replayable: true,
            flags: holdfast_sql::Classification::READ_ONLY,
            types: None,
            types_pending: false,
            read_route: holdfast_sql::ReadRoute::Primary,
        }
    }

    #[test]
    fn ids_are_sequential_and_never_reused() {
        let mut s = Statements::default();
        let a = s.insert(stmt());
        let b = s.insert(stmt());
        assert_eq!((a, b), (1, 2));
        s.remove(a);
        s.clear();
        assert_eq!(s.insert(stmt()), 3);
        assert!(s.get(a).is_none());
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn counts_cursors_and_long_data() {
        let mut s = Statements::default();
        let a = s.insert(stmt());
        s.insert(stmt());
        assert_eq!((s.open_cursors(), s.pending_long_data()), (0, false));
        if let Some(x) = s.get_mut(a) {
            x.cursor_open = true;
            x.long_data = true;
        }
        assert_eq!((s.open_cursors(), s.pending_long_data()), (1, true));
    }
}

/// The prepared statements as a process hands them to the one that replaces it (the
/// backend connection goes with them: the server's ids stay valid).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedStatements {
    statements: Vec<CarriedStatement>,
    next_id: u32,
    last: Option<u32>,
    sql_schemas: Vec<(Vec<u8>, Option<String>)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CarriedStatement {
    id: u32,
    backend_id: u32,
    sql: Vec<u8>,
    params: u16,
    cursor_open: bool,
    long_data: bool,
    retry_safe: bool,
    may_commit: bool,
    replayable: bool,
    flags: u32,
    types: Option<Vec<u8>>,
    types_pending: bool,
}

impl Statements {
    pub fn carry(&self) -> CarriedStatements {
        CarriedStatements {
            statements: self
                .by_id
                .iter()
                .map(|(&id, s)| CarriedStatement {
                    id,
                    backend_id: s.backend_id,
                    sql: s.sql.to_vec(),
                    params: s.params,
                    cursor_open: s.cursor_open,
                    long_data: s.long_data,
                    retry_safe: s.retry_safe,
                    may_commit: s.may_commit,
                    replayable: s.replayable,
                    flags: s.flags.bits,
                    types: s.types.clone(),
                    types_pending: s.types_pending,
                })
                .collect(),
            next_id: self.next_id,
            last: self.last,
            sql_schemas: self
                .sql_schemas
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// The statements as carried; where each may run in a split session is worked out
    /// again under `mode`.
    pub fn from_carried(
        carried: CarriedStatements,
        mode: holdfast_sql::SqlMode,
        server: holdfast_sql::Server,
    ) -> Statements {
        let mut statements = Statements {
            by_id: HashMap::default(),
            next_id: carried.next_id.max(1),
            last: carried.last,
            sql_schemas: carried.sql_schemas.into_iter().collect(),
        };
        for s in carried.statements {
            let flags = holdfast_sql::Classification { bits: s.flags };
            let read_route = holdfast_sql::read_route(&s.sql, flags, mode, server);
            statements.by_id.insert(
                s.id,
                Statement {
                    backend_id: s.backend_id,
                    sql: Bytes::from(s.sql),
                    params: s.params,
                    cursor_open: s.cursor_open,
                    long_data: s.long_data,
                    retry_safe: s.retry_safe,
                    may_commit: s.may_commit,
                    replayable: s.replayable,
                    flags,
                    read_route,
                    types: s.types,
                    types_pending: s.types_pending,
                },
            );
        }
        statements
    }
}
