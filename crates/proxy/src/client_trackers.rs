//! The session trackers as the client itself has them set. holdfast turns on more of them
//! in the backend session than a client has by default (every system variable, state
//! changes, on demand the transaction characteristics); what reaches a client is cut down
//! to what its own settings would have produced: the server's defaults until the client
//! sets a `session_track_*` variable, which the backend reports (holdfast tracks every
//! variable) and [`ClientTrackers::set`] takes.
//!
//! A client's own `SET session_track_...` is followed by holdfast reading the client's new
//! settings and putting its own back; a statement that reads them (`@@session_track_...`,
//! `SHOW VARIABLES LIKE 'session_track%'`) runs with the client's settings in place (see
//! the session's `forward.rs`). Not covered: such reads and `SET`s inside stored programs
//! and prepared statements; a client that turns on `session_track_transaction_info`
//! while holdfast already has it on gets no initial `transaction state` record; the
//! defaults are MariaDB's built-in ones, not a server's configured `session_track_*`.

use std::borrow::Cow;

use holdfast_wire::caps::{
    CLIENT_SESSION_TRACK, SERVER_SESSION_STATE_CHANGED, SERVER_STATUS_AUTOCOMMIT,
};
use holdfast_wire::codec::{put_lenenc_bytes, Reader};
use holdfast_wire::packets::{OkPacket, OK_HEADER};
use holdfast_wire::session_track::{items, TrackItem, SESSION_TRACK_SCHEMA};

/// The OK packet that ends a login, as the server sends it: with the schema record its
/// default `session_track_schema=ON` produces when the client gave a database and
/// negotiated CLIENT_SESSION_TRACK.
pub fn login_ok(client_capabilities: u32, database: Option<&[u8]>) -> Vec<u8> {
    let tracks = client_capabilities & CLIENT_SESSION_TRACK != 0;
    let mut state = Vec::new();
    if let Some(db) = database.filter(|d| tracks && !d.is_empty()) {
        let mut data = Vec::new();
        put_lenenc_bytes(&mut data, db);
        state.push(SESSION_TRACK_SCHEMA);
        put_lenenc_bytes(&mut state, &data);
    }
    let changed = match state.is_empty() {
        true => 0,
        false => SERVER_SESSION_STATE_CHANGED,
    };
    OkPacket {
        header: OK_HEADER,
        affected_rows: 0,
        last_insert_id: 0,
        status: SERVER_STATUS_AUTOCOMMIT | changed,
        warnings: 0,
        info: &[],
        session_state: &state,
    }
    .encode(tracks)
}

/// `session_track_transaction_info`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
enum TransactionInfo {
    Off,
    State,
    Characteristics,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientTrackers {
    /// `session_track_system_variables`, lower-case names; `None`: `*`, every variable.
    /// (Borrowed while they are the defaults: every session starts with them, and most
    /// keep them.)
    variables: Option<Cow<'static, [Cow<'static, [u8]>]>>,
    /// `session_track_system_variables` as the server showed it.
    variables_text: Cow<'static, str>,
    schema: bool,
    state_change: bool,
    transaction_info: TransactionInfo,
}

/// MariaDB 10.11's defaults (and 10.5 to 11.x's).
const DEFAULT_VARIABLES: &str =
    "autocommit,character_set_client,character_set_connection,character_set_results,time_zone";
/// [`DEFAULT_VARIABLES`], parsed.
const DEFAULT_NAMES: &[Cow<'static, [u8]>] = &[
    Cow::Borrowed(b"autocommit"),
    Cow::Borrowed(b"character_set_client"),
    Cow::Borrowed(b"character_set_connection"),
    Cow::Borrowed(b"character_set_results"),
    Cow::Borrowed(b"time_zone"),
];

impl Default for ClientTrackers {
    fn default() -> Self {
        ClientTrackers {
            variables: Some(Cow::Borrowed(DEFAULT_NAMES)),
            variables_text: Cow::Borrowed(DEFAULT_VARIABLES),
            schema: true,
            state_change: false,
            transaction_info: TransactionInfo::Off,
        }
    }
}

fn parse_variables(list: &[u8]) -> Option<Cow<'static, [Cow<'static, [u8]>]>> {
    let mut names = Vec::new();
    for name in list.split(|&b| b == b',') {
        let name = name.trim_ascii();
        if name == b"*" {
            return None;
        }
        if !name.is_empty() {
            names.push(Cow::Owned(name.to_ascii_lowercase()));
        }
    }
    Some(Cow::Owned(names))
}

fn on(value: &[u8]) -> bool {
    value.eq_ignore_ascii_case(b"ON") || value == b"1"
}

impl ClientTrackers {
    /// Takes a reported change of one of the client's `session_track_*` variables; false
    /// for other variables.
    pub fn set(&mut self, name: &[u8], value: &[u8]) -> bool {
        let name = name.to_ascii_lowercase();
        match name.as_slice() {
            b"session_track_system_variables" => {
                self.variables = parse_variables(value);
                self.variables_text = Cow::Owned(String::from_utf8_lossy(value).into_owned());
            }
            b"session_track_schema" => self.schema = on(value),
            b"session_track_state_change" => self.state_change = on(value),
            b"session_track_transaction_info" => {
                self.transaction_info = if value.eq_ignore_ascii_case(b"CHARACTERISTICS") {
                    TransactionInfo::Characteristics
                } else if value.eq_ignore_ascii_case(b"STATE") {
                    TransactionInfo::State
                } else {
                    TransactionInfo::Off
                }
            }
            _ => return false,
        }
        true
    }

    /// The `SET` that gives a session the client's settings.
    pub fn set_statement(&self) -> String {
        let on_off = |b: bool| if b { "ON" } else { "OFF" };
        let transaction_info = match self.transaction_info {
            TransactionInfo::Off => "OFF",
            TransactionInfo::State => "STATE",
            TransactionInfo::Characteristics => "CHARACTERISTICS",
        };
        format!(
            "SET SESSION session_track_system_variables = {}, session_track_schema = {}, \
             session_track_state_change = {}, session_track_transaction_info = '{}'",
            holdfast_sql::quote::string_literal(&self.variables_text),
            on_off(self.schema),
            on_off(self.state_change),
            transaction_info
        )
    }

    /// Whether the client tracks the current schema.
    pub fn schema(&self) -> bool {
        self.schema
    }

    /// Whether the client tracks state changes (which also decides the "state changed"
    /// status flag of EOF packets, which carry no records to filter).
    pub fn state_change(&self) -> bool {
        self.state_change
    }

    fn wants(&self, item: &TrackItem<'_>) -> bool {
        match item {
            TrackItem::SystemVariable { name, .. } => match &self.variables {
                None => true,
                Some(names) => names.iter().any(|n| n.eq_ignore_ascii_case(name)),
            },
            TrackItem::Schema(_) => self.schema,
            TrackItem::StateChanged(_) => self.state_change,
            TrackItem::TransactionState(_) => self.transaction_info >= TransactionInfo::State,
            TrackItem::TransactionCharacteristics(_) => {
                self.transaction_info == TransactionInfo::Characteristics
            }
            // Not turned on by holdfast: only the client's own settings produce these.
            TrackItem::Gtids(_) | TrackItem::Unknown(_) => true,
        }
    }

    /// Appends to `out` the records of `block` the client's own trackers would have
    /// produced, byte for byte. Whatever cannot be decoded is passed on as it is.
    pub fn filter(&self, block: &[u8], out: &mut Vec<u8>) {
        let mut r = Reader::new(block);
        while !r.is_empty() {
            let start = r.position();
            if r.u8("track type").is_err() || r.lenenc_bytes("track data").is_err() {
                out.extend_from_slice(&block[start..]);
                return;
            }
            let record = &block[start..r.position()];
            let keep = match items(record).next() {
                Some(Ok(item)) => self.wants(&item),
                _ => true,
            };
            if keep {
                out.extend_from_slice(record);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_wire::codec::put_lenenc_bytes;

    fn variable(name: &str, value: &str) -> Vec<u8> {
        let mut body = Vec::new();
        put_lenenc_bytes(&mut body, name.as_bytes());
        put_lenenc_bytes(&mut body, value.as_bytes());
        let mut v = vec![0];
        put_lenenc_bytes(&mut v, &body);
        v
    }

    /// The defaults are borrowed, not parsed per session; a session handed to (or from) a
    /// process whose trackers were owned carries the same bytes.
    #[test]
    fn the_borrowed_defaults_are_the_list_parsed_and_carry_as_owned_ones() {
        let parsed = parse_variables(DEFAULT_VARIABLES.as_bytes());
        assert_eq!(parsed.as_deref(), Some(DEFAULT_NAMES));
        let owned = ClientTrackers {
            variables: parsed,
            variables_text: Cow::Owned(DEFAULT_VARIABLES.to_string()),
            ..ClientTrackers::default()
        };
        let (borrowed, owned) = (
            serde_json::to_string(&ClientTrackers::default()).unwrap(),
            serde_json::to_string(&owned).unwrap(),
        );
        assert_eq!(borrowed, owned);
        let back: ClientTrackers = serde_json::from_str(&borrowed).unwrap();
        assert_eq!(back, ClientTrackers::default());
    }

    #[test]
    fn login_ok_names_the_database_for_tracking_clients() {
        use holdfast_wire::packets::ok_payload;
        let plain = ok_payload(0, 0, SERVER_STATUS_AUTOCOMMIT, 0);
        assert_eq!(login_ok(0, Some(b"db")), plain);
        assert_eq!(login_ok(CLIENT_SESSION_TRACK, None), plain);
        assert_eq!(
            login_ok(CLIENT_SESSION_TRACK, Some(b"db")),
            b"\x00\x00\x00\x02\x40\x00\x00\x00\x05\x01\x03\x02db"
        );
    }

    #[test]
    fn keeps_what_the_defaults_track() {
        let time_zone = variable("time_zone", "+01:00");
        let sql_mode = variable("sql_mode", "ANSI");
        let state = b"\x02\x011".to_vec();
        let mut schema = vec![1];
        put_lenenc_bytes(&mut schema, b"\x06sbtest");
        let block = [
            sql_mode.clone(),
            time_zone.clone(),
            schema.clone(),
            state.clone(),
        ]
        .concat();
        let mut t = ClientTrackers::default();
        assert_eq!(
            t.set_statement(),
            "SET SESSION session_track_system_variables = 'autocommit,character_set_client,\
             character_set_connection,character_set_results,time_zone', \
             session_track_schema = ON, session_track_state_change = OFF, \
             session_track_transaction_info = 'OFF'"
        );
        let mut out = Vec::new();
        t.filter(&block, &mut out);
        assert_eq!(out, [time_zone.clone(), schema.clone()].concat());
        assert!(t.set(b"SESSION_TRACK_STATE_CHANGE", b"ON"));
        assert!(t.set(b"session_track_system_variables", b"sql_mode, TIME_ZONE"));
        assert!(!t.set(b"sql_mode", b""));
        out.clear();
        t.filter(&block, &mut out);
        assert_eq!(out, block);
        t.set(b"session_track_schema", b"OFF");
        t.set(b"session_track_system_variables", b"");
        out.clear();
        t.filter(&block, &mut out);
        assert_eq!(out, state);
        out.clear();
        t.filter(b"\x00\xfe", &mut out);
        assert_eq!(out, b"\x00\xfe", "undecodable: passed on");
    }
}
