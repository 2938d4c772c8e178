//! A split session's `FOUND_ROWS()`: the value lives on the connection of the statement
//! that last set it, which may be a replica's or the primary's; it is carried to the node
//! a statement that reads it, or may set it, runs on.
//!
//! What a statement does to it is told by [`holdfast_sql::found_rows_effect`]: a query
//! sets it, a write without one keeps it, a statement whose effect the server decides
//! ([`FoundRowsEffect::Uncertain`]: `INSERT ... VALUES ((SELECT ...))`, `SHOW`, `CALL`...)
//! runs where the value is carried first, so that whatever it does the node it ran on
//! holds the session's value afterwards.

use super::{End, Session};
use crate::restore;
use holdfast_cluster::topology::NodeName;
use holdfast_sql::{fails_before_it_runs, found_rows_effect, FoundRowsEffect};
use holdfast_wire::command::{
    runs_no_statement, COM_INIT_DB, COM_QUERY, COM_QUIT, COM_STMT_EXECUTE, CURSOR_TYPE_READ_ONLY,
};
use holdfast_wire::frame::HEADER_LEN;
use holdfast_wire::packets;

/// Where a split session's `FOUND_ROWS()` lives, and what the request being run does to
/// it.
#[derive(Debug, Default)]
pub(crate) struct FoundRows {
    at: At,
    /// What the request being run does to it...
    effect: Option<FoundRowsEffect>,
    /// ...and where it ran, once it has (`None`: the primary).
    ran: Option<Option<NodeName>>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum At {
    /// No statement of the session has set it (or its node's connection is gone): what
    /// a connection reads then is what the server's thread cache left, nothing to keep.
    #[default]
    Nowhere,
    Primary,
    Replica(NodeName),
}

impl At {
    fn of(node: Option<&NodeName>) -> At {
        node.map_or(At::Primary, |n| At::Replica(n.clone()))
    }
}

/// Where `FOUND_ROWS()` lives, as a session handed to another process carries it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedFoundRows(At);

impl FoundRows {
    pub(super) fn carry(&self) -> CarriedFoundRows {
        CarriedFoundRows(self.at.clone())
    }

    pub(super) fn from_carried(c: CarriedFoundRows) -> FoundRows {
        FoundRows {
            at: c.0,
            ..FoundRows::default()
        }
    }

    /// The session's connections were reset (or changed user).
    pub(super) fn lost(&mut self) {
        self.at = At::Nowhere;
    }

    /// The reads of a transaction pinned to `node` ran again on the primary.
    pub(super) fn moved_to_primary(&mut self, node: &str) {
        if matches!(&self.at, At::Replica(n) if n == node) {
            self.at = At::Primary;
        }
    }

    /// Whether the session's value lives on replica `node`'s connection.
    pub(super) fn lives_on(&self, node: &str) -> bool {
        matches!(&self.at, At::Replica(n) if n == node)
    }

    /// Forgets a value living on a replica for which `keep` says no (its connection is
    /// gone).
    pub(super) fn keep_if(&mut self, keep: impl Fn(&str) -> bool) {
        if matches!(&self.at, At::Replica(node) if !keep(node)) {
            self.at = At::Nowhere;
        }
    }
}

impl Session {
    /// Before a request is classified: where `FOUND_ROWS()` lives after the last one,
    /// from what it does to it, where it ran, and whether it failed before it ran.
    pub(super) fn note_found_rows(&mut self) {
        let error = self.exchange.error;
        let Some(split) = self.split.as_mut() else {
            return;
        };
        let f = &mut split.found_rows;
        let (Some(effect), Some(ran)) = (f.effect.take(), f.ran.take()) else {
            return;
        };
        let sets = match effect {
            FoundRowsEffect::Keeps => false,
            FoundRowsEffect::Sets | FoundRowsEffect::Uncertain => {
                error.is_none_or(|code| !fails_before_it_runs(code))
            }
        };
        if sets {
            f.at = At::of(ran.as_ref());
        }
    }

    /// The classify phase of a split session's request: what it does to `FOUND_ROWS()`.
    pub(super) fn classify_found_rows(&mut self, request: &[u8]) {
        if self.split.is_none() {
            return;
        }
        let mode = self.record.sql_mode.unwrap_or_default();
        let server = self.server();
        let effect = match request.get(HEADER_LEN).copied() {
            Some(COM_QUERY) => request
                .get(HEADER_LEN + 1..)
                .map_or(FoundRowsEffect::Keeps, |sql| {
                    found_rows_effect(sql, mode, server)
                }),
            Some(COM_STMT_EXECUTE) => {
                let cursor = request
                    .get(HEADER_LEN + 5)
                    .is_some_and(|f| f & CURSOR_TYPE_READ_ONLY != 0);
                match packets::statement_id(&request[HEADER_LEN..])
                    .and_then(|id| self.statements.get(self.statements.resolve(id)))
                {
                    Some(s) if !cursor => found_rows_effect(&s.sql, mode, server),
                    _ => FoundRowsEffect::Uncertain,
                }
            }
            // Commands that run no statement (a change of schema neither).
            Some(cmd) if runs_no_statement(cmd) || cmd == COM_INIT_DB || cmd == COM_QUIT => {
                FoundRowsEffect::Keeps
            }
            _ => FoundRowsEffect::Uncertain,
        };
        if let Some(split) = self.split.as_mut() {
            split.found_rows.effect = Some(effect);
            split.found_rows.ran = None;
        }
    }

    /// The request ran on `node` (`None`: the primary).
    pub(super) fn found_rows_ran(&mut self, node: Option<NodeName>) {
        if let Some(split) = self.split.as_mut() {
            split.found_rows.ran = Some(node);
        }
    }

    /// Whether the request needs the session's `FOUND_ROWS()` where it runs: it reads it,
    /// or may set it.
    fn needs_found_rows(&self, request: &[u8]) -> bool {
        let Some(split) = self.split.as_ref() else {
            return false;
        };
        split.found_rows.effect == Some(FoundRowsEffect::Uncertain)
            || self.reads_found_rows(request)
    }

    /// Whether the value will be carried for this request to the node the session's last
    /// statement ran on (whose `ROW_COUNT()` the carrying changes: the session's is written
    /// into the request, as after a wrap).
    pub(super) fn found_rows_carried_to_last(&self, request: &[u8]) -> bool {
        let Some(split) = self.split.as_ref() else {
            return false;
        };
        split.found_rows.at != At::Nowhere
            && split.found_rows.at != At::of(split.last_node())
            && self.needs_found_rows(request)
    }

    /// Before a request that needs the session's `FOUND_ROWS()` runs on the primary
    /// (`on` is `None`) or on replica `on`: when it lives on another node, it is read there
    /// and set here, by a `SELECT` of as many rows (without tables up to a thousand: the
    /// diagnostics area stays). A value on the primary is not carried to a replica:
    /// `false`, the request runs on the primary.
    pub(super) async fn carry_found_rows(
        &mut self,
        request: &[u8],
        on: Option<usize>,
    ) -> Result<bool, End> {
        let Some(split) = self.split.as_ref() else {
            return Ok(true);
        };
        let target = At::of(on.and_then(|i| split.reader_node(i)));
        // A pinned transaction's reads run on its replica whatever it holds; what runs on
        // the primary beside it (a statement the server refuses there, a read of what
        // such a statement left) gets the value carried as any statement on the primary
        // does (seed 2050 session 116).
        if split.found_rows.at == target
            || split.found_rows.at == At::Nowhere
            || (split.pinned() && on.is_some())
            || !self.needs_found_rows(request)
        {
            return Ok(true);
        }
        let At::Replica(source) = split.found_rows.at.clone() else {
            return Ok(false);
        };
        let Some(from) = split.reader(&source) else {
            return Ok(true);
        };
        // Read there (which leaves 1 there: from now on it lives here, or nowhere).
        let Some(split) = self.split.as_mut() else {
            return Ok(true);
        };
        split.found_rows.at = At::Nowhere;
        let read = match split.reader_conn(from) {
            Some(conn) => restore::read_diagnostics(conn).await,
            None => return Ok(true),
        };
        let found = match read {
            Ok(d) if d.found_rows_restorable() => d.found_rows,
            Ok(d) => {
                tracing::debug!(
                    session = self.info.id,
                    found_rows = d.found_rows,
                    "FOUND_ROWS() too large to carry"
                );
                return Ok(true);
            }
            Err(e) => {
                tracing::debug!(session = self.info.id, error = %e, "FOUND_ROWS() not read");
                return Ok(true);
            }
        };
        let sql = restore::found_rows_select(found);
        let conn = match on {
            None => &mut self.backend,
            Some(i) => match self.split.as_mut().and_then(|s| s.reader_conn(i)) {
                Some(conn) => conn,
                None => return Ok(false),
            },
        };
        match restore::execute(conn, sql.as_bytes()).await {
            Ok(_) => {
                if let Some(split) = self.split.as_mut() {
                    split.found_rows.at = target;
                }
                Ok(true)
            }
            Err(crate::backend::BackendError::Conn(error)) if on.is_none() => {
                Err(End::BackendLost {
                    started: false,
                    error,
                })
            }
            Err(e) => {
                tracing::debug!(session = self.info.id, error = %e, "FOUND_ROWS() not carried");
                Ok(on.is_none())
            }
        }
    }

    /// Whether a request reads `FOUND_ROWS()` (a text, or an execute of a statement that
    /// does).
    fn reads_found_rows(&self, request: &[u8]) -> bool {
        let sql = match request.get(HEADER_LEN) {
            Some(&COM_QUERY) => request.get(HEADER_LEN + 1..),
            Some(&COM_STMT_EXECUTE) => packets::statement_id(&request[HEADER_LEN..])
                .and_then(|id| self.statements.get(self.statements.resolve(id)))
                .map(|s| &s.sql[..]),
            _ => None,
        };
        let Some(sql) = sql else {
            return false;
        };
        const NAME: &[u8] = b"FOUND_ROWS";
        let mode = self.record.sql_mode.unwrap_or_default();
        sql.windows(NAME.len())
            .any(|w| w.eq_ignore_ascii_case(NAME))
            && holdfast_sql::Lexer::with_mode(sql, mode).any(|t| t.is_word("FOUND_ROWS"))
    }
}
