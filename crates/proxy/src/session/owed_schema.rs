//! The schema record the server still owes the client after an `EXECUTE` that ran in
//! another schema.
//!
//! MariaDB runs a statement prepared with `PREPARE` under the schema that was current then,
//! switching to it and back; each switch marks its schema tracker changed. The record goes
//! out with the first OK of a statement that marks any tracker changed. When the `EXECUTE`
//! answers with an OK, that is its own OK. When it answers with a result set (an EOF has no
//! records) or an ERR (it failed while it ran), the record waits on the server for a later
//! statement that changes something a tracker reports.
//!
//! holdfast's own trackers report more than the client's (user variables, every system
//! variable, the state-change flag), so its backend sends the waiting record with an
//! earlier OK than the client's trackers would. That OK gets it only if the client's
//! trackers report something there too; otherwise holdfast leaves it out and keeps it, and
//! puts it into the first OK where they do.

use super::Session;
use crate::backend::BackendError;
use crate::restore::Executed;
use holdfast_wire::codec::{put_lenenc_bytes, Reader};
use holdfast_wire::packets::OkPacket;
use holdfast_wire::session_track::{items, TrackItem, SESSION_TRACK_SCHEMA};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct OwedSchema {
    /// The current schema when the `EXECUTE` ended (the one it switched back to).
    schema: Vec<u8>,
    /// The backend sent the record (and holdfast left it out): it is owed for certain.
    /// Until then the server may hold none (the `EXECUTE` failed before it switched).
    confirmed: bool,
}

impl OwedSchema {
    pub fn new(schema: &[u8]) -> Self {
        OwedSchema {
            schema: schema.to_vec(),
            confirmed: false,
        }
    }

    /// At an OK with session state that holdfast relays: `kept` holds the records the
    /// client's trackers would have produced of the backend's `block`, and is edited here
    /// to what the server would have sent the client. Returns whether the record is still
    /// owed after this OK.
    pub fn settle(&mut self, block: &[u8], kept: &mut Vec<u8>) -> bool {
        let sent = schema_record(block);
        let reports_more = records(kept).any(|r| r.first() != Some(&SESSION_TRACK_SCHEMA));
        match sent {
            // Another schema since: that record is the session's news, nothing is owed.
            Some(s) if s != self.schema.as_slice() => false,
            Some(_) if reports_more => false,
            Some(_) => {
                remove_schema_records(kept);
                self.confirmed = true;
                true
            }
            // The backend reported a change without the record: it held none.
            None if !self.confirmed => false,
            None if reports_more => {
                insert_schema_record(kept, &self.schema);
                false
            }
            None => true,
        }
    }
}

impl OwedSchema {
    /// At an OK of holdfast's own statement (none of it goes to the client): a record of
    /// this schema there is what the server owed, sent now; holdfast owes it to the
    /// client from here on. A record of another schema means the session's schema
    /// changed since: nothing is owed. Returns whether it still is.
    pub fn seen_elsewhere(&mut self, block: &[u8]) -> bool {
        match schema_record(block) {
            Some(s) if s != self.schema.as_slice() => false,
            Some(_) => {
                self.confirmed = true;
                true
            }
            None => true,
        }
    }
}

impl Session {
    /// An OK of holdfast's own statements on the session's connection (a wrap's `BEGIN`,
    /// a marker's write): the server sends a schema record an `EXECUTE` left owed with the
    /// first OK of a statement that changes what one of holdfast's trackers reports. Seen
    /// there, it is owed to the client for certain (fuzzer seed 2051 session 1677).
    pub(super) fn own_ok_seen(&mut self, payload: &[u8]) {
        if self.exchange.owed_schema.is_none() {
            return;
        }
        if let Ok(ok) = OkPacket::parse(payload, true) {
            self.own_session_state_seen(ok.session_state);
        }
    }

    fn own_session_state_seen(&mut self, block: &[u8]) {
        if let Some(owed) = self.exchange.owed_schema.as_mut() {
            if !owed.seen_elsewhere(block) {
                self.exchange.owed_schema = None;
            }
        }
    }

    /// Runs one of holdfast's own statements on the session's connection (see
    /// [`crate::restore::execute`]), minding a schema record its OKs carry.
    pub(super) async fn run_own(&mut self, sql: &[u8]) -> Result<Executed, BackendError> {
        let done = crate::restore::execute(&mut self.backend, sql).await?;
        for ok in &done.oks {
            self.own_session_state_seen(&ok.session_state);
        }
        Ok(done)
    }
}

/// The schema a session-state block reports, if it holds a schema record.
fn schema_record(block: &[u8]) -> Option<&[u8]> {
    items(block).find_map(|item| match item {
        Ok(TrackItem::Schema(s)) => Some(s),
        _ => None,
    })
}

/// The records of a session-state block, each as its bytes (type, length, data). Stops at
/// what cannot be decoded.
fn records(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut r = Reader::new(block);
    std::iter::from_fn(move || {
        let start = r.position();
        if r.is_empty() || r.u8("track type").is_err() || r.lenenc_bytes("track data").is_err() {
            return None;
        }
        block.get(start..r.position())
    })
}

fn remove_schema_records(block: &mut Vec<u8>) {
    let mut out = Vec::with_capacity(block.len());
    for record in records(block).filter(|r| r.first() != Some(&SESSION_TRACK_SCHEMA)) {
        out.extend_from_slice(record);
    }
    *block = out;
}

/// Puts a schema record where MariaDB writes it: after the system variables' records,
/// before the state-change and transaction records.
fn insert_schema_record(block: &mut Vec<u8>, schema: &[u8]) {
    let at = records(block)
        .take_while(|r| r.first().is_some_and(|&t| t <= SESSION_TRACK_SCHEMA))
        .map(<[u8]>::len)
        .sum::<usize>();
    let mut data = Vec::with_capacity(schema.len() + 9);
    put_lenenc_bytes(&mut data, schema);
    let mut record = vec![SESSION_TRACK_SCHEMA];
    put_lenenc_bytes(&mut record, &data);
    block.splice(at..at, record);
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_wire::session_track::{
        SESSION_TRACK_STATE_CHANGE, SESSION_TRACK_SYSTEM_VARIABLES,
    };

    fn record(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut r = vec![kind];
        put_lenenc_bytes(&mut r, body);
        r
    }

    fn schema(name: &str) -> Vec<u8> {
        let mut data = Vec::new();
        put_lenenc_bytes(&mut data, name.as_bytes());
        record(SESSION_TRACK_SCHEMA, &data)
    }

    fn variable(name: &str, value: &str) -> Vec<u8> {
        let mut data = Vec::new();
        put_lenenc_bytes(&mut data, name.as_bytes());
        put_lenenc_bytes(&mut data, value.as_bytes());
        record(SESSION_TRACK_SYSTEM_VARIABLES, &data)
    }

    fn state_change() -> Vec<u8> {
        record(SESSION_TRACK_STATE_CHANGE, b"1")
    }

    #[test]
    fn a_record_the_client_would_not_get_yet_is_kept_for_the_ok_where_it_would() {
        let mut owed = OwedSchema::new(b"db2");
        // holdfast's trackers report sql_mode; the client's nothing else.
        let block = [variable("sql_mode", "ANSI_QUOTES"), schema("db2")].concat();
        let mut kept = schema("db2");
        assert!(owed.settle(&block, &mut kept));
        assert!(kept.is_empty());
        // A user variable (holdfast tracks state changes; the client does not).
        let block = state_change();
        let mut kept = Vec::new();
        assert!(owed.settle(&block, &mut kept));
        assert!(kept.is_empty());
        // The client's time_zone tracker reports: the record goes with it, after it.
        let block = [variable("time_zone", "+01:00"), state_change()].concat();
        let mut kept = variable("time_zone", "+01:00");
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(
            kept,
            [variable("time_zone", "+01:00"), schema("db2")].concat()
        );
    }

    #[test]
    fn a_record_the_client_gets_anyway_is_left_as_it_is() {
        let mut owed = OwedSchema::new(b"db2");
        let block = [
            variable("time_zone", "+01:00"),
            schema("db2"),
            state_change(),
        ]
        .concat();
        let mut kept = [variable("time_zone", "+01:00"), schema("db2")].concat();
        let before = kept.clone();
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(kept, before);
    }

    #[test]
    fn nothing_is_owed_when_the_backend_reports_a_change_without_the_record() {
        // An EXECUTE refused before it ran switched nothing.
        let mut owed = OwedSchema::new(b"db2");
        let block = [variable("time_zone", "+01:00"), state_change()].concat();
        let mut kept = variable("time_zone", "+01:00");
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(kept, variable("time_zone", "+01:00"));
    }

    #[test]
    fn another_schema_reported_since_settles_it() {
        let mut owed = OwedSchema::new(b"db2");
        let block = schema("db2");
        let mut kept = schema("db2");
        assert!(owed.settle(&block, &mut kept));
        let block = schema("db3");
        let mut kept = schema("db3");
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(kept, schema("db3"));
    }

    #[test]
    fn a_record_sent_with_holdfasts_own_ok_is_owed_for_certain() {
        // A wrap's BEGIN carried it: the next OK the client's trackers report in gets it.
        let mut owed = OwedSchema::new(b"db2");
        assert!(owed.seen_elsewhere(&[schema("db2"), state_change()].concat()));
        let block = [variable("time_zone", "+01:00"), state_change()].concat();
        let mut kept = variable("time_zone", "+01:00");
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(
            kept,
            [variable("time_zone", "+01:00"), schema("db2")].concat()
        );
        // Another schema there: the session's schema changed, nothing is owed.
        let mut owed = OwedSchema::new(b"db2");
        assert!(!owed.seen_elsewhere(&schema("db3")));
        // Nothing there: still owed, not yet for certain.
        let mut owed = OwedSchema::new(b"db2");
        assert!(owed.seen_elsewhere(&state_change()));
        let mut kept = variable("time_zone", "+01:00");
        assert!(!owed.settle(&block, &mut kept));
        assert_eq!(kept, variable("time_zone", "+01:00"));
    }

    #[test]
    fn the_record_goes_before_state_change_and_transaction_records() {
        let mut block = [variable("a", "1"), state_change()].concat();
        insert_schema_record(&mut block, b"s");
        assert_eq!(
            block,
            [variable("a", "1"), schema("s"), state_change()].concat()
        );
        let mut block = Vec::new();
        insert_schema_record(&mut block, b"s");
        assert_eq!(block, schema("s"));
    }
}
