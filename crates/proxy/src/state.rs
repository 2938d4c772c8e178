//! What holdfast knows about a session's state, kept up to date from the server's session
//! trackers and the statement classifier. The keep-alive work restores this record on a new
//! backend; here it is observed and reported.

use holdfast_wire::caps::*;
use holdfast_wire::session_track::{items, TrackItem};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionRecord {
    pub schema: Option<String>,
    /// Session system variables reported changed by the tracker, by name.
    pub variables: BTreeMap<String, String>,
    /// The statement that recreates next-transaction characteristics (empty: none).
    pub next_transaction: String,
    /// The transaction state flags last reported (e.g. `T_______`).
    pub transaction_state: String,
    /// Status flags from the last OK/EOF.
    pub status: u16,
    pub last_insert_id: u64,
    /// Whether a statement may have assigned user variables since the last capture.
    pub user_variables_touched: bool,
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
}

impl SessionRecord {
    pub fn in_transaction(&self) -> bool {
        self.status & SERVER_STATUS_IN_TRANS != 0
    }

    /// Applies an OK packet's session state records.
    pub fn apply_session_state(&mut self, block: &[u8]) {
        for item in items(block) {
            match item {
                Ok(TrackItem::SystemVariable { name, value }) => {
                    self.variables.insert(
                        String::from_utf8_lossy(name).into_owned(),
                        String::from_utf8_lossy(value).into_owned(),
                    );
                }
                Ok(TrackItem::Schema(s)) => {
                    self.schema = Some(String::from_utf8_lossy(s).into_owned());
                }
                Ok(TrackItem::TransactionCharacteristics(c)) => {
                    self.next_transaction = String::from_utf8_lossy(c).into_owned();
                }
                Ok(TrackItem::TransactionState(s)) => {
                    self.transaction_state = String::from_utf8_lossy(s).into_owned();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "undecodable session state record");
                    break;
                }
            }
        }
    }

    /// Why the session could not move to another backend right now, if it could not.
    pub fn blocker(&self) -> Option<&'static str> {
        if self.in_transaction() {
            Some("open transaction")
        } else if self.temporary_tables {
            Some("temporary table")
        } else if self.table_locks {
            Some("LOCK TABLES")
        } else if self.named_locks {
            Some("GET_LOCK")
        } else if self.xa {
            Some("XA transaction")
        } else if self.open_cursors > 0 {
            Some("open cursor")
        } else if self.pending_long_data {
            Some("pending long data")
        } else if self.untracked {
            Some("session trackers unavailable")
        } else {
            None
        }
    }

    pub fn reset(&mut self) {
        *self = SessionRecord {
            untracked: self.untracked,
            ..SessionRecord::default()
        };
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
        assert_eq!(r.schema.as_deref(), Some("sbtest"));
        r.status = SERVER_STATUS_IN_TRANS;
        assert_eq!(r.blocker(), Some("open transaction"));
    }
}
