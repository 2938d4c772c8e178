//! Session state change records carried in OK packets (CLIENT_SESSION_TRACK).

use crate::codec::Reader;
use crate::error::Result;

pub const SESSION_TRACK_SYSTEM_VARIABLES: u8 = 0;
pub const SESSION_TRACK_SCHEMA: u8 = 1;
pub const SESSION_TRACK_STATE_CHANGE: u8 = 2;
pub const SESSION_TRACK_GTIDS: u8 = 3;
pub const SESSION_TRACK_TRANSACTION_CHARACTERISTICS: u8 = 4;
pub const SESSION_TRACK_TRANSACTION_STATE: u8 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackItem<'a> {
    SystemVariable {
        name: &'a [u8],
        value: &'a [u8],
    },
    Schema(&'a [u8]),
    StateChanged(bool),
    Gtids(&'a [u8]),
    /// The statement that would recreate the next transaction's characteristics,
    /// e.g. `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE;` (empty: defaults).
    TransactionCharacteristics(&'a [u8]),
    /// Eight flag characters, e.g. `T_______` inside an explicit transaction.
    TransactionState(&'a [u8]),
    Unknown(u8),
}

/// Iterates the records in an OK packet's session state block.
pub struct TrackIter<'a> {
    r: Reader<'a>,
    failed: bool,
}

pub fn items(session_state: &[u8]) -> TrackIter<'_> {
    TrackIter {
        r: Reader::new(session_state),
        failed: false,
    }
}

impl<'a> Iterator for TrackIter<'a> {
    type Item = Result<TrackItem<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.is_empty() {
            return None;
        }
        let item = self.next_item();
        if item.is_err() {
            self.failed = true;
        }
        Some(item)
    }
}

impl<'a> TrackIter<'a> {
    fn next_item(&mut self) -> Result<TrackItem<'a>> {
        let kind = self.r.u8("track type")?;
        let data = self.r.lenenc_bytes("track data")?;
        let mut d = Reader::new(data);
        Ok(match kind {
            SESSION_TRACK_SYSTEM_VARIABLES => TrackItem::SystemVariable {
                name: d.lenenc_bytes("variable name")?,
                value: d.lenenc_bytes("variable value")?,
            },
            SESSION_TRACK_SCHEMA => TrackItem::Schema(d.lenenc_bytes("schema")?),
            // Sent as the bare string "1" (MariaDB, MySQL), unlike the other records.
            SESSION_TRACK_STATE_CHANGE => TrackItem::StateChanged(data == b"1" || data == b"\x011"),
            SESSION_TRACK_GTIDS => {
                d.u8("gtid encoding")?;
                TrackItem::Gtids(d.lenenc_bytes("gtids")?)
            }
            SESSION_TRACK_TRANSACTION_CHARACTERISTICS => {
                TrackItem::TransactionCharacteristics(d.lenenc_bytes("trx characteristics")?)
            }
            SESSION_TRACK_TRANSACTION_STATE => {
                TrackItem::TransactionState(d.lenenc_bytes("trx state")?)
            }
            other => TrackItem::Unknown(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::put_lenenc_bytes;

    fn record(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![kind];
        put_lenenc_bytes(&mut v, body);
        v
    }

    #[test]
    fn decodes_records() {
        let mut var = Vec::new();
        put_lenenc_bytes(&mut var, b"autocommit");
        put_lenenc_bytes(&mut var, b"OFF");
        let mut schema = Vec::new();
        put_lenenc_bytes(&mut schema, b"sbtest");
        let mut state = Vec::new();
        put_lenenc_bytes(&mut state, b"T_______");
        let mut all = record(0, &var);
        all.extend(record(1, &schema));
        all.extend(record(5, &state));
        let got: Vec<_> = items(&all).collect::<Result<_>>().unwrap();
        assert_eq!(
            got,
            vec![
                TrackItem::SystemVariable {
                    name: b"autocommit",
                    value: b"OFF"
                },
                TrackItem::Schema(b"sbtest"),
                TrackItem::TransactionState(b"T_______"),
            ]
        );
    }

    #[test]
    fn garbage_stops_with_error() {
        let got: Vec<_> = items(&[0, 0xfe, 1]).collect();
        assert_eq!(got.len(), 1);
        assert!(got[0].is_err());
    }
}
