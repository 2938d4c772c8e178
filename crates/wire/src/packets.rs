//! Generic server packets: OK, ERR, EOF, and the COM_STMT_PREPARE answer.

use crate::codec::{put_lenenc_bytes, put_lenenc_int, Reader};
use crate::error::{Result, WireError};

pub const OK_HEADER: u8 = 0x00;
pub const EOF_HEADER: u8 = 0xfe;
pub const ERR_HEADER: u8 = 0xff;
pub const LOCAL_INFILE_HEADER: u8 = 0xfb;

/// A decoded OK packet (header 0x00, or 0xfe when it ends a result set under DEPRECATE_EOF).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OkPacket<'a> {
    pub header: u8,
    pub affected_rows: u64,
    pub last_insert_id: u64,
    pub status: u16,
    pub warnings: u16,
    pub info: &'a [u8],
    /// Raw session state change records (see [`crate::session_track`]).
    pub session_state: &'a [u8],
}

impl<'a> OkPacket<'a> {
    /// Parses an OK packet as sent on a connection that negotiated `session_track`.
    pub fn parse(payload: &'a [u8], session_track: bool) -> Result<Self> {
        let mut r = Reader::new(payload);
        let header = r.u8("ok header")?;
        if header != OK_HEADER && header != EOF_HEADER {
            return Err(WireError::Unexpected(header, "OK packet"));
        }
        let affected_rows = r.lenenc_int("affected rows")?;
        let last_insert_id = r.lenenc_int("last insert id")?;
        // Servers always send status and warnings with PROTOCOL_41, which holdfast requires.
        let status = r.u16("status")?;
        let warnings = r.u16("warnings")?;
        let mut info: &[u8] = &[];
        let mut session_state: &[u8] = &[];
        if session_track {
            if !r.is_empty() {
                info = r.lenenc_bytes("info")?;
            }
            if status & crate::caps::SERVER_SESSION_STATE_CHANGED != 0 && !r.is_empty() {
                session_state = r.lenenc_bytes("session state")?;
            }
        } else {
            // Servers length-encode it anyway; accept the plain form of old servers too.
            let rest = r.rest();
            let mut lr = Reader::new(rest);
            info = match lr.lenenc_bytes("info") {
                Ok(v) if lr.is_empty() => v,
                _ => rest,
            };
        }
        Ok(OkPacket {
            header,
            affected_rows,
            last_insert_id,
            status,
            warnings,
            info,
            session_state,
        })
    }

    /// Encodes the packet for a connection with or without `session_track`. Without it the
    /// session state is dropped and the flag that announces it cleared; the info text stays
    /// length-encoded, as servers send it.
    pub fn encode(&self, session_track: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.info.len() + self.session_state.len());
        self.encode_into(session_track, &mut out);
        out
    }

    /// [`OkPacket::encode`], appended to `out`.
    pub fn encode_into(&self, session_track: bool, out: &mut Vec<u8>) {
        out.push(self.header);
        put_lenenc_int(out, self.affected_rows);
        put_lenenc_int(out, self.last_insert_id);
        let mut status = self.status;
        if !session_track || self.session_state.is_empty() {
            status &= !crate::caps::SERVER_SESSION_STATE_CHANGED;
        }
        out.extend_from_slice(&status.to_le_bytes());
        out.extend_from_slice(&self.warnings.to_le_bytes());
        // Servers length-encode the info text whatever the client negotiated (MariaDB and
        // MySQL both do, and clients such as the Rust `mysql` crate rely on it).
        if !self.info.is_empty() || status & crate::caps::SERVER_SESSION_STATE_CHANGED != 0 {
            put_lenenc_bytes(out, self.info);
        }
        if status & crate::caps::SERVER_SESSION_STATE_CHANGED != 0 {
            put_lenenc_bytes(out, self.session_state);
        }
    }
}

/// An OK packet payload with the given status.
pub fn ok_payload(affected_rows: u64, last_insert_id: u64, status: u16, warnings: u16) -> Vec<u8> {
    OkPacket {
        header: OK_HEADER,
        affected_rows,
        last_insert_id,
        status,
        warnings,
        info: &[],
        session_state: &[],
    }
    .encode(false)
}

/// A decoded ERR packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrPacket<'a> {
    pub code: u16,
    pub sql_state: [u8; 5],
    pub message: &'a [u8],
}

impl<'a> ErrPacket<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let header = r.u8("err header")?;
        if header != ERR_HEADER {
            return Err(WireError::Unexpected(header, "ERR packet"));
        }
        let code = r.u16("error code")?;
        let mut sql_state = *b"HY000";
        if payload.get(3) == Some(&b'#') {
            r.skip(1, "sql state marker")?;
            sql_state.copy_from_slice(r.take(5, "sql state")?);
        }
        Ok(ErrPacket {
            code,
            sql_state,
            message: r.rest(),
        })
    }

    pub fn message_lossy(&self) -> String {
        String::from_utf8_lossy(self.message).into_owned()
    }
}

/// An ERR packet payload (PROTOCOL_41 form with SQL state).
pub fn err_payload(code: u16, sql_state: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + message.len());
    out.push(ERR_HEADER);
    out.extend_from_slice(&code.to_le_bytes());
    out.push(b'#');
    let state = sql_state.as_bytes();
    for i in 0..5 {
        out.push(*state.get(i).unwrap_or(&b'0'));
    }
    out.extend_from_slice(message.as_bytes());
    out
}

/// A legacy EOF packet: header, warnings, status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EofPacket {
    pub warnings: u16,
    pub status: u16,
}

impl EofPacket {
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let header = r.u8("eof header")?;
        if header != EOF_HEADER {
            return Err(WireError::Unexpected(header, "EOF packet"));
        }
        // Pre-4.1 EOF has no body; treat missing fields as zero.
        let warnings = if r.remaining() >= 2 {
            r.u16("warnings")?
        } else {
            0
        };
        let status = if r.remaining() >= 2 {
            r.u16("status")?
        } else {
            0
        };
        Ok(EofPacket { warnings, status })
    }

    pub fn payload(&self) -> [u8; 5] {
        let w = self.warnings.to_le_bytes();
        let s = self.status.to_le_bytes();
        [EOF_HEADER, w[0], w[1], s[0], s[1]]
    }
}

/// The first packet of a successful COM_STMT_PREPARE answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOk {
    pub statement_id: u32,
    pub num_columns: u16,
    pub num_params: u16,
    pub warnings: u16,
}

impl PrepareOk {
    pub fn parse(payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let header = r.u8("prepare ok header")?;
        if header != OK_HEADER {
            return Err(WireError::Unexpected(header, "COM_STMT_PREPARE OK"));
        }
        let statement_id = r.u32("statement id")?;
        let num_columns = r.u16("column count")?;
        let num_params = r.u16("param count")?;
        let warnings = if r.remaining() >= 3 {
            r.skip(1, "filler")?;
            r.u16("warnings")?
        } else {
            0
        };
        Ok(PrepareOk {
            statement_id,
            num_columns,
            num_params,
            warnings,
        })
    }
}

/// Replaces the statement id at bytes 1..5 of a payload (PREPARE OK, or an EXECUTE / FETCH /
/// CLOSE / RESET / SEND_LONG_DATA request). Returns false when the payload is too short.
pub fn set_statement_id(payload: &mut [u8], id: u32) -> bool {
    match payload.get_mut(1..5) {
        Some(slot) => {
            slot.copy_from_slice(&id.to_le_bytes());
            true
        }
        None => false,
    }
}

/// Reads the statement id at bytes 1..5 of a request payload.
pub fn statement_id(payload: &[u8]) -> Option<u32> {
    let b = payload.get(1..5)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::*;

    #[test]
    fn ok_with_session_state_strips_for_plain_clients() {
        let full = OkPacket {
            header: 0,
            affected_rows: 3,
            last_insert_id: 7,
            status: SERVER_STATUS_AUTOCOMMIT | SERVER_SESSION_STATE_CHANGED,
            warnings: 1,
            info: b"Rows matched: 3",
            session_state: b"\x01\x05\x04test",
        }
        .encode(true);
        let parsed = OkPacket::parse(&full, true).unwrap();
        assert_eq!(parsed.session_state, b"\x01\x05\x04test");
        assert_eq!(parsed.info, b"Rows matched: 3");
        let plain = parsed.encode(false);
        let back = OkPacket::parse(&plain, false).unwrap();
        assert_eq!(back.status, SERVER_STATUS_AUTOCOMMIT);
        assert_eq!(back.info, b"Rows matched: 3");
        assert_eq!(back.affected_rows, 3);
        assert_eq!(back.last_insert_id, 7);
    }

    #[test]
    fn minimal_ok_under_session_track() {
        let p = [0u8, 0, 0, 2, 0, 0, 0];
        let ok = OkPacket::parse(&p, true).unwrap();
        assert_eq!(ok.status, 2);
        assert!(ok.info.is_empty());
    }

    #[test]
    fn err_round_trip() {
        let p = err_payload(1045, "28000", "Access denied");
        let e = ErrPacket::parse(&p).unwrap();
        assert_eq!(e.code, 1045);
        assert_eq!(&e.sql_state, b"28000");
        assert_eq!(e.message, b"Access denied");
    }

    #[test]
    fn statement_id_rewrite() {
        let mut p = vec![0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(statement_id(&p), Some(1));
        assert!(set_statement_id(&mut p, 0x01020304));
        assert_eq!(statement_id(&p), Some(0x01020304));
        assert!(!set_statement_id(&mut [0x17, 1], 5));
    }
}
