//! What holdfast knows about a session's state, kept up to date from the server's session
//! trackers and the statement classifier. The keep-alive work restores this record on a new
//! backend; here it is observed and reported.

use crate::client_trackers::ClientTrackers;
use holdfast_sql::SqlMode;
use holdfast_wire::caps::*;
use holdfast_wire::session_track::{items, TrackItem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// (Deserialized only from what a process hands over, with the skipped fields carried
/// apart: see `session::handover`.)
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionRecord {
    pub schema: Option<String>,
    /// Session system variables reported changed by the tracker, by name.
    pub variables: BTreeMap<String, String>,
    /// How the session's `sql_mode` quotes (`ANSI_QUOTES`, `NO_BACKSLASH_ESCAPES`), from
    /// the tracker's last report of it; `None` until the session sets it: the server's
    /// default, which holdfast does not know. The classifier lexes statements with it.
    #[serde(skip)]
    pub sql_mode: Option<SqlMode>,
    /// The statement that recreates next-transaction characteristics (empty: none).
    pub next_transaction: String,
    /// The transaction state flags last reported (e.g. `T_______`).
    pub transaction_state: String,
    /// Status flags from the last OK/EOF.
    pub status: u16,
    pub last_insert_id: u64,
    /// Warnings (errors included) the client's last statement left for `SHOW WARNINGS`,
    /// as its last OK/EOF counted them (an ERR counts one).
    pub last_warnings: u16,
    /// The affected rows of the last OK: `ROW_COUNT()` when positive.
    pub last_affected_rows: u64,
    /// A statement may have changed what only a capture reads (user variables,
    /// `LAST_INSERT_ID(expr)`, `collation_connection`) since the last capture.
    pub capture_due: bool,
    pub temporary_tables: bool,
    pub table_locks: bool,
    pub named_locks: bool,
    /// An XA transaction was started and not yet committed or rolled back.
    pub xa: bool,
    pub open_cursors: usize,
    pub pending_long_data: bool,
    pub prepared_statements: usize,
    /// The trackers could not be enabled on the backend.
    pub untracked: bool,
    /// A read-only transaction was ended by `SET autocommit = 1`: MariaDB (10.11) keeps the
    /// session read-only (writes get 1792, a `BEGIN` starts a read-only transaction) until
    /// a `COMMIT` or `ROLLBACK`, though its status says no transaction is open. An
    /// autocommit write is not wrapped then: the wrap's own `COMMIT` would end that state.
    #[serde(default)]
    pub read_only_lingers: bool,
    /// The server reported a session state change (`session_track_state_change`) in the
    /// answer to the current request.
    #[serde(skip)]
    pub state_change_reported: bool,
    /// Code holdfast cannot see into (a procedure, dynamic SQL) changed the session's
    /// state; the next capture tells whether its user variables explain it.
    #[serde(skip)]
    pub opaque_change: bool,
    /// Such a change that the user variables did not explain: a temporary table, a
    /// prepared statement or anything else holdfast cannot recreate may exist. The session
    /// cannot move (its state would be silently lost).
    pub unknown_state: bool,
    /// The session trackers as the client set them (what it is shown).
    #[serde(skip)]
    pub client_trackers: ClientTrackers,
    /// The client set a `session_track_*` variable: holdfast's own setting in the backend
    /// session, to be put back.
    #[serde(skip)]
    pub trackers_overridden: bool,
    /// Counts changes of what a split session's replica connections must follow (schema,
    /// settable variables): a connection synced at an older value is synced again.
    #[serde(skip)]
    pub state_version: u64,
}

impl SessionRecord {
    pub fn in_transaction(&self) -> bool {
        self.status & SERVER_STATUS_IN_TRANS != 0
    }

    /// Records what an OK packet says.
    pub fn observe_ok(&mut self, ok: &holdfast_wire::packets::OkPacket<'_>) {
        self.status = ok.status;
        self.last_warnings = ok.warnings;
        self.last_affected_rows = ok.affected_rows;
        if ok.last_insert_id != 0 {
            self.last_insert_id = ok.last_insert_id;
        }
        if !ok.session_state.is_empty() {
            self.apply_session_state(ok.session_state);
        }
    }

    /// Applies an OK packet's session state records.
    pub fn apply_session_state(&mut self, block: &[u8]) {
        for item in items(block) {
            match item {
                Ok(TrackItem::SystemVariable { name, value }) => {
                    if name.eq_ignore_ascii_case(b"sql_mode") {
                        self.sql_mode = Some(SqlMode::parse(value));
                    }
                    if self.client_trackers.set(name, value) {
                        self.trackers_overridden = true;
                    }
                    // What a restore skips (last_gtid, warning_count...) changes with
                    // statements, not settings: replica connections need no sync for it.
                    let name_text = String::from_utf8_lossy(name);
                    let lower = match name_text.bytes().any(|b| b.is_ascii_uppercase()) {
                        true => std::borrow::Cow::Owned(name_text.to_ascii_lowercase()),
                        false => name_text,
                    };
                    if crate::restore::skip_reason_by_name(&lower).is_none() {
                        self.state_version += 1;
                    }
                    self.variables.insert(
                        String::from_utf8_lossy(name).into_owned(),
                        String::from_utf8_lossy(value).into_owned(),
                    );
                }
                Ok(TrackItem::Schema(s)) => {
                    self.state_version += 1;
                    self.schema = Some(String::from_utf8_lossy(s).into_owned());
                }
                Ok(TrackItem::TransactionCharacteristics(c)) => {
                    self.next_transaction = String::from_utf8_lossy(c).into_owned();
                }
                Ok(TrackItem::TransactionState(s)) => {
                    self.transaction_state = String::from_utf8_lossy(s).into_owned();
                }
                Ok(TrackItem::StateChanged(true)) => self.state_change_reported = true,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable session state record");
                    break;
                }
            }
        }
    }

    /// Why the session could not move to another backend right now, if it could not.
    pub fn blocker(&self) -> Option<Blocker> {
        if self.in_transaction() {
            Some(Blocker::OpenTransaction)
        } else if self.temporary_tables {
            Some(Blocker::TemporaryTable)
        } else if self.table_locks {
            Some(Blocker::LockTables)
        } else if self.named_locks {
            Some(Blocker::GetLock)
        } else if self.xa {
            Some(Blocker::Xa)
        } else if self.open_cursors > 0 {
            Some(Blocker::OpenCursor)
        } else if self.pending_long_data {
            Some(Blocker::PendingLongData)
        } else if self.unknown_state {
            Some(Blocker::UnknownState)
        } else if self.untracked {
            Some(Blocker::Untracked)
        } else {
            None
        }
    }

    /// Whether the session holds server-side state besides an open transaction (a
    /// temporary table, a table or named lock, an XA transaction, a cursor, long data), or
    /// holdfast cannot know (no trackers). Nothing may then be added to what the client
    /// sends: a `BEGIN` of an autocommit wrap releases `LOCK TABLES`, a marker write fails
    /// under them, and the state cannot follow the session to another node anyway, so a
    /// marker would recover nothing.
    pub fn holds_server_state(&self) -> bool {
        self.temporary_tables
            || self.table_locks
            || self.named_locks
            || self.xa
            || self.open_cursors > 0
            || self.pending_long_data
            || self.unknown_state
            || self.untracked
    }

    /// State that died with a lost backend and cannot be recreated on another node (an open
    /// transaction is not here: it is rolled back and the client told so).
    pub fn lost_with_backend(&self) -> Option<Blocker> {
        self.blocker().filter(|b| b.dies_with_backend())
    }

    pub fn reset(&mut self) {
        *self = SessionRecord {
            untracked: self.untracked,
            ..SessionRecord::default()
        };
    }
}

/// What keeps a session from moving to another node right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Blocker {
    OpenTransaction = 1,
    TemporaryTable,
    LockTables,
    GetLock,
    Xa,
    OpenCursor,
    PendingLongData,
    /// The session trackers could not be enabled, so holdfast cannot know the state.
    Untracked,
    /// Code holdfast cannot see into changed the session's state in a way it cannot
    /// recreate (a temporary table or prepared statement made in a procedure, say).
    UnknownState,
    /// A pass-through listener's connection: holdfast does not see its statements.
    PassThrough,
}

impl Blocker {
    pub const ALL: [Blocker; 10] = [
        Blocker::OpenTransaction,
        Blocker::TemporaryTable,
        Blocker::LockTables,
        Blocker::GetLock,
        Blocker::Xa,
        Blocker::OpenCursor,
        Blocker::PendingLongData,
        Blocker::Untracked,
        Blocker::UnknownState,
        Blocker::PassThrough,
    ];

    /// As `/status` and `ctl status` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Blocker::OpenTransaction => "open transaction",
            Blocker::TemporaryTable => "temporary table",
            Blocker::LockTables => "LOCK TABLES",
            Blocker::GetLock => "GET_LOCK",
            Blocker::Xa => "XA transaction",
            Blocker::OpenCursor => "open cursor",
            Blocker::PendingLongData => "pending long data",
            Blocker::Untracked => "session trackers unavailable",
            Blocker::UnknownState => "state changed by a procedure or dynamic SQL",
            Blocker::PassThrough => "pass-through connection",
        }
    }

    /// What the client lost when the backend died holding it, as a close message says it.
    pub fn what_is_lost(self) -> &'static str {
        match self {
            Blocker::OpenTransaction => "its open transaction",
            Blocker::TemporaryTable => "its temporary tables",
            Blocker::LockTables => "its LOCK TABLES locks",
            Blocker::GetLock => "its GET_LOCK locks",
            Blocker::Xa => "its XA transaction",
            Blocker::OpenCursor => "an open cursor",
            Blocker::PendingLongData => "pending COM_STMT_SEND_LONG_DATA data",
            Blocker::Untracked => "its untracked session state",
            Blocker::UnknownState => "state a procedure or dynamic SQL made on the server",
            Blocker::PassThrough => "its pass-through connection",
        }
    }

    /// Server-side state that cannot be recreated on another node.
    pub fn dies_with_backend(self) -> bool {
        !matches!(
            self,
            Blocker::OpenTransaction | Blocker::Untracked | Blocker::PassThrough
        )
    }

    /// The metric label of a session closed because the backend died holding this.
    pub fn lost_label(self) -> &'static str {
        match self {
            Blocker::OpenTransaction => "transaction_lost",
            Blocker::TemporaryTable => "temporary_tables_lost",
            Blocker::LockTables => "table_locks_lost",
            Blocker::GetLock => "named_locks_lost",
            Blocker::Xa => "xa_lost",
            Blocker::OpenCursor => "cursor_lost",
            Blocker::PendingLongData => "long_data_lost",
            Blocker::Untracked => "untracked_lost",
            Blocker::UnknownState => "unknown_state_lost",
            Blocker::PassThrough => "passthrough_lost",
        }
    }

    /// The metric label of a session closed because it kept this past the cool-down.
    pub fn cooldown_label(self) -> &'static str {
        match self {
            Blocker::OpenTransaction => "cooldown_open_transaction",
            Blocker::TemporaryTable => "cooldown_temporary_table",
            Blocker::LockTables => "cooldown_lock_tables",
            Blocker::GetLock => "cooldown_get_lock",
            Blocker::Xa => "cooldown_xa",
            Blocker::OpenCursor => "cooldown_open_cursor",
            Blocker::PendingLongData => "cooldown_long_data",
            Blocker::Untracked => "cooldown_untracked",
            Blocker::UnknownState => "cooldown_unknown_state",
            Blocker::PassThrough => "cooldown_passthrough",
        }
    }

    /// The inverse of `as u8`, for the registry's atomic slot (0 is "none").
    pub fn from_code(code: u8) -> Option<Blocker> {
        Blocker::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_wire::codec::put_lenenc_bytes;

    #[test]
    fn tracker_records_update_state() {
        let mut body = Vec::new();
        put_lenenc_bytes(&mut body, b"sql_mode");
        put_lenenc_bytes(&mut body, b"ANSI_QUOTES");
        let mut block = vec![0];
        put_lenenc_bytes(&mut block, &body);
        let mut schema = Vec::new();
        put_lenenc_bytes(&mut schema, b"sbtest");
        block.push(1);
        put_lenenc_bytes(&mut block, &schema);
        let mut r = SessionRecord::default();
        r.apply_session_state(&block);
        assert_eq!(
            r.variables.get("sql_mode").map(String::as_str),
            Some("ANSI_QUOTES")
        );
        assert_eq!(r.sql_mode, Some(SqlMode::parse(b"ANSI_QUOTES")));
        assert_eq!(r.schema.as_deref(), Some("sbtest"));
        for b in Blocker::ALL {
            assert_eq!(Blocker::from_code(b as u8), Some(b));
        }
        assert_eq!(Blocker::from_code(0), None);
        r.status = SERVER_STATUS_IN_TRANS;
        assert_eq!(r.blocker(), Some(Blocker::OpenTransaction));
        assert_eq!(r.lost_with_backend(), None);
        r.status = 0;
        r.temporary_tables = true;
        assert_eq!(r.lost_with_backend(), Some(Blocker::TemporaryTable));
    }
}

#[cfg(test)]
mod sql_mode_tests {
    use super::*;
    use holdfast_wire::codec::put_lenenc_bytes;

    fn variable_block(name: &str, value: &str) -> Vec<u8> {
        let mut body = Vec::new();
        put_lenenc_bytes(&mut body, name.as_bytes());
        put_lenenc_bytes(&mut body, value.as_bytes());
        let mut block = vec![0];
        put_lenenc_bytes(&mut block, &body);
        block
    }

    #[test]
    fn the_lexer_mode_follows_the_tracked_sql_mode() {
        let mut r = SessionRecord::default();
        assert_eq!(r.sql_mode, None, "the server's default is not known");
        r.apply_session_state(&variable_block(
            "SQL_MODE",
            "NO_BACKSLASH_ESCAPES,ANSI_QUOTES",
        ));
        assert_eq!(
            r.sql_mode,
            Some(SqlMode {
                ansi_quotes: true,
                no_backslash_escapes: true
            })
        );
        r.apply_session_state(&variable_block("time_zone", "+00:00"));
        assert!(r.sql_mode.is_some_and(|m| m.ansi_quotes));
        r.apply_session_state(&variable_block("sql_mode", "STRICT_TRANS_TABLES"));
        assert_eq!(r.sql_mode, Some(SqlMode::DEFAULT));
        // COM_RESET_CONNECTION / COM_CHANGE_USER: back to the unknown default.
        r.reset();
        assert_eq!(r.sql_mode, None);
    }
}
