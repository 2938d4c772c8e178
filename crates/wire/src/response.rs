//! Following a command's response packet by packet, to know where it ends.
//!
//! The proxy streams response bytes to the client as they arrive. For most packets (rows,
//! column definitions, continuation chunks) it needs only the header and the first payload
//! byte, given to [`ResponseMachine::classify`]; the few packets that carry state (OK, EOF,
//! ERR, the column count, PREPARE OK) are small and handed over whole to
//! [`ResponseMachine::on_packet`].

use crate::caps::*;
use crate::codec::Reader;
use crate::error::{Result, WireError};
use crate::frame::MAX_PAYLOAD;
use crate::packets::*;

/// What kind of answer a command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// COM_QUERY and COM_STMT_EXECUTE: OK, ERR, LOCAL INFILE request, or result sets,
    /// possibly several (MULTI_RESULTS).
    ResultSets,
    /// COM_STMT_PREPARE: PREPARE OK with parameter and column definitions, or ERR.
    Prepare,
    /// COM_STMT_FETCH: rows then EOF, or ERR.
    Fetch,
    /// COM_FIELD_LIST: column definitions then EOF, or ERR.
    FieldList,
    /// OK, ERR or (COM_SET_OPTION) EOF.
    Status,
    /// Exactly one packet of any shape (COM_STATISTICS).
    OnePacket,
    /// No answer at all (COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA, COM_QUIT).
    Nothing,
}

/// How a packet must be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Forward without looking (row, column definition, continuation chunk).
    Opaque,
    /// Needs the whole payload passed to [`ResponseMachine::on_packet`].
    Inspect,
}

/// A packet that carries state, reported by [`ResponseMachine::on_packet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    None,
    Ok(OkPacket<'a>),
    Eof(EofPacket),
    Err(ErrPacket<'a>),
    /// The server wants the client to send a local file; the client's data packets and
    /// the closing empty packet go to the server, then the machine expects OK or ERR.
    LocalInfile,
    PrepareOk(PrepareOk),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting the first packet of a (next) result.
    First,
    ColumnDefs {
        left: u64,
    },
    ColumnsEof,
    Rows,
    PrepareParams {
        left: u16,
        columns: u16,
    },
    PrepareParamsEof {
        columns: u16,
    },
    PrepareColumns {
        left: u16,
    },
    PrepareColumnsEof,
    /// FieldList: definitions until EOF.
    Definitions,
    /// Waiting for OK/ERR after the client sent its LOCAL INFILE data.
    AfterInfile,
    Done,
}

#[derive(Debug, Clone)]
pub struct ResponseMachine {
    expect: Expect,
    state: State,
    deprecate_eof: bool,
    /// The previous packet was a full chunk: this one continues it.
    continuation: bool,
    /// Status flags of the last terminator seen (OK/EOF).
    last_status: u16,
    /// The command is a COM_STMT_EXECUTE that asked for a cursor: an EOF after the column
    /// definitions with SERVER_STATUS_CURSOR_EXISTS ends the response (rows come through
    /// COM_STMT_FETCH). Anywhere else the flag only reports a cursor open on the server
    /// (a stored program's `OPEN c` sets it in text-protocol answers) and the rows follow.
    cursor: bool,
    /// Results ended by an OK or EOF so far (a multi-statement's statements that ran, when
    /// none is a CALL).
    results: u32,
}

impl ResponseMachine {
    /// `deprecate_eof`: whether the connection negotiated CLIENT_DEPRECATE_EOF. OK packets
    /// are parsed as on a connection with CLIENT_SESSION_TRACK (holdfast's backends always are).
    pub fn new(expect: Expect, deprecate_eof: bool) -> Self {
        let state = match expect {
            Expect::Nothing => State::Done,
            Expect::Fetch => State::Rows,
            Expect::FieldList => State::Definitions,
            _ => State::First,
        };
        ResponseMachine {
            expect,
            state,
            deprecate_eof,
            continuation: false,
            last_status: 0,
            cursor: false,
            results: 0,
        }
    }

    /// The machine for the answer to a COM_STMT_EXECUTE sent with a cursor type (flags
    /// other than CURSOR_TYPE_NO_CURSOR): a result set may stop after its metadata.
    pub fn with_cursor(mut self, cursor: bool) -> Self {
        self.cursor = cursor && self.expect == Expect::ResultSets;
        self
    }

    /// Results ended by an OK or EOF so far.
    pub fn results(&self) -> u32 {
        self.results
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Whether the client must now send LOCAL INFILE data.
    pub fn awaiting_infile(&self) -> bool {
        self.state == State::AfterInfile
    }

    /// Status flags from the last OK/EOF seen.
    pub fn last_status(&self) -> u16 {
        self.last_status
    }

    /// Classifies the next packet from its payload length and first byte (`None` when empty).
    /// An opaque packet is accounted for here; an inspected one must be given to `on_packet`.
    pub fn classify(&mut self, len: usize, first: Option<u8>) -> Kind {
        let continuation = self.continuation;
        self.continuation = len == MAX_PAYLOAD;
        if continuation {
            return Kind::Opaque;
        }
        let small = len < MAX_PAYLOAD;
        let inspect = match self.state {
            State::First | State::AfterInfile | State::ColumnsEof | State::PrepareColumnsEof => {
                true
            }
            State::PrepareParamsEof { .. } => true,
            State::Rows | State::Definitions => {
                small && matches!(first, Some(EOF_HEADER) | Some(ERR_HEADER))
            }
            State::ColumnDefs { .. }
            | State::PrepareParams { .. }
            | State::PrepareColumns { .. } => small && first == Some(ERR_HEADER),
            State::Done => false,
        };
        if inspect && small {
            return Kind::Inspect;
        }
        // A data packet: advance the counters.
        self.count_data_packet();
        Kind::Opaque
    }

    fn count_data_packet(&mut self) {
        self.state = match self.state {
            State::ColumnDefs { left } if left <= 1 => {
                if self.deprecate_eof {
                    State::Rows
                } else {
                    State::ColumnsEof
                }
            }
            State::ColumnDefs { left } => State::ColumnDefs { left: left - 1 },
            State::PrepareParams { left, columns } if left <= 1 => {
                if self.deprecate_eof {
                    self.after_prepare_params(columns)
                } else {
                    State::PrepareParamsEof { columns }
                }
            }
            State::PrepareParams { left, columns } => State::PrepareParams {
                left: left - 1,
                columns,
            },
            State::PrepareColumns { left } if left <= 1 => {
                if self.deprecate_eof {
                    State::Done
                } else {
                    State::PrepareColumnsEof
                }
            }
            State::PrepareColumns { left } => State::PrepareColumns { left: left - 1 },
            // A one-packet answer of any shape (COM_STATISTICS), or a result's first packet
            // that is a huge column count (impossible in practice): the response is over.
            State::First if self.expect == Expect::OnePacket => State::Done,
            s => s,
        }
    }

    fn after_prepare_params(&self, columns: u16) -> State {
        if columns > 0 {
            State::PrepareColumns { left: columns }
        } else {
            State::Done
        }
    }

    fn end_of_result(&mut self, status: u16) {
        self.last_status = status;
        self.results += 1;
        self.state = if status & SERVER_MORE_RESULTS_EXISTS != 0
            && matches!(self.expect, Expect::ResultSets)
        {
            State::First
        } else {
            State::Done
        };
    }

    /// Handles a packet that `classify` marked [`Kind::Inspect`], given its whole payload.
    pub fn on_packet<'a>(&mut self, payload: &'a [u8]) -> Result<Event<'a>> {
        let first = payload.first().copied();
        if first == Some(ERR_HEADER) && self.state != State::Done {
            let err = ErrPacket::parse(payload)?;
            self.state = State::Done;
            return Ok(Event::Err(err));
        }
        match self.state {
            State::First => self.on_first(payload),
            State::AfterInfile => {
                let ok = OkPacket::parse(payload, true)?;
                self.end_of_result(ok.status);
                Ok(Event::Ok(ok))
            }
            State::ColumnsEof => {
                let eof = EofPacket::parse(payload)?;
                self.last_status = eof.status;
                // A cursor was opened for this execution: rows come later through
                // COM_STMT_FETCH. Only when one was asked for: the flag also reports a
                // stored program's open cursor, and then the rows follow as usual.
                self.state = if self.cursor && eof.status & SERVER_STATUS_CURSOR_EXISTS != 0 {
                    State::Done
                } else {
                    State::Rows
                };
                Ok(Event::Eof(eof))
            }
            State::Rows | State::Definitions => self.on_terminator(payload),
            State::PrepareParamsEof { columns } => {
                let eof = EofPacket::parse(payload)?;
                self.state = self.after_prepare_params(columns);
                Ok(Event::Eof(eof))
            }
            State::PrepareColumnsEof => {
                let eof = EofPacket::parse(payload)?;
                self.state = State::Done;
                Ok(Event::Eof(eof))
            }
            State::ColumnDefs { .. }
            | State::PrepareParams { .. }
            | State::PrepareColumns { .. }
            | State::Done => Err(WireError::Malformed("packet after the end of a response")),
        }
    }

    fn on_terminator<'a>(&mut self, payload: &'a [u8]) -> Result<Event<'a>> {
        // Under DEPRECATE_EOF the terminator is an OK packet; COM_FIELD_LIST may still end
        // with a short legacy EOF on some servers, told apart by its 5-byte length.
        let is_ok = self.deprecate_eof && (self.expect != Expect::FieldList || payload.len() > 5);
        if is_ok {
            let ok = OkPacket::parse(payload, true)?;
            self.end_of_result(ok.status);
            Ok(Event::Ok(ok))
        } else {
            let eof = EofPacket::parse(payload)?;
            self.end_of_result(eof.status);
            Ok(Event::Eof(eof))
        }
    }

    fn on_first<'a>(&mut self, payload: &'a [u8]) -> Result<Event<'a>> {
        let Some(&first) = payload.first() else {
            return Err(WireError::Truncated("response"));
        };
        match (self.expect, first) {
            (Expect::OnePacket, _) => {
                self.state = State::Done;
                Ok(Event::None)
            }
            (Expect::Prepare, OK_HEADER) => {
                let p = PrepareOk::parse(payload)?;
                self.state = if p.num_params > 0 {
                    State::PrepareParams {
                        left: p.num_params,
                        columns: p.num_columns,
                    }
                } else {
                    self.after_prepare_params(p.num_columns)
                };
                Ok(Event::PrepareOk(p))
            }
            (Expect::ResultSets | Expect::Status, OK_HEADER) => {
                let ok = OkPacket::parse(payload, true)?;
                self.end_of_result(ok.status);
                Ok(Event::Ok(ok))
            }
            (Expect::Status, EOF_HEADER) => {
                let eof = EofPacket::parse(payload)?;
                self.end_of_result(eof.status);
                Ok(Event::Eof(eof))
            }
            (Expect::ResultSets, LOCAL_INFILE_HEADER) => {
                self.state = State::AfterInfile;
                Ok(Event::LocalInfile)
            }
            (Expect::ResultSets, _) => {
                let mut r = Reader::new(payload);
                let columns = r.lenenc_int("column count")?;
                if columns == 0 {
                    return Err(WireError::Malformed("result set with zero columns"));
                }
                self.state = State::ColumnDefs { left: columns };
                Ok(Event::None)
            }
            (_, b) => Err(WireError::Unexpected(b, "response")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{packet, parse_header, HEADER_LEN};

    /// Drives the machine over a byte stream; returns events as strings and whether it ended
    /// exactly at the end of the input.
    fn run(m: &mut ResponseMachine, stream: &[u8]) -> (Vec<String>, usize) {
        let mut pos = 0;
        let mut ev = Vec::new();
        while !m.is_done() && pos < stream.len() {
            let h = parse_header(&stream[pos..]).unwrap();
            let payload = &stream[pos + HEADER_LEN..pos + h.packet_len()];
            match m.classify(h.len, payload.first().copied()) {
                Kind::Opaque => ev.push("data".to_string()),
                Kind::Inspect => ev.push(format!("{:?}", m.on_packet(payload).unwrap())),
            }
            pos += h.packet_len();
        }
        (ev, pos)
    }

    fn col() -> Vec<u8> {
        let mut c = b"\x03def".to_vec();
        c.extend_from_slice(&[0; 10]);
        c
    }

    fn eof(status: u16) -> Vec<u8> {
        EofPacket {
            warnings: 0,
            status,
        }
        .payload()
        .to_vec()
    }

    fn ok(header: u8, status: u16) -> Vec<u8> {
        let mut p = ok_payload(0, 0, status, 0);
        p[0] = header;
        p
    }

    #[test]
    fn text_result_legacy_eof_then_more_results() {
        let mut s = Vec::new();
        s.extend(packet(&[2], 1));
        s.extend(packet(&col(), 2));
        s.extend(packet(&col(), 3));
        s.extend(packet(&eof(0), 4));
        s.extend(packet(b"\x011\x012", 5));
        s.extend(packet(&eof(SERVER_MORE_RESULTS_EXISTS), 6));
        s.extend(packet(&ok(0, 2), 7));
        s.extend(b"trailing");
        let mut m = ResponseMachine::new(Expect::ResultSets, false);
        let (ev, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len() - 8);
        assert_eq!(ev.len(), 7);
    }

    #[test]
    fn deprecate_eof_rows_end_with_fe_ok() {
        let mut s = Vec::new();
        s.extend(packet(&[1], 1));
        s.extend(packet(&col(), 2));
        s.extend(packet(b"\x011", 3));
        s.extend(packet(&ok(EOF_HEADER, 2), 4));
        let mut m = ResponseMachine::new(Expect::ResultSets, true);
        let (_, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
        assert_eq!(m.last_status(), 2);
    }

    #[test]
    fn error_mid_stream_ends_response() {
        let mut s = Vec::new();
        s.extend(packet(&[1], 1));
        s.extend(packet(&col(), 2));
        s.extend(packet(b"\x011", 3));
        s.extend(packet(
            &err_payload(1317, "70100", "Query execution was interrupted"),
            4,
        ));
        let mut m = ResponseMachine::new(Expect::ResultSets, true);
        let (ev, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
        assert!(ev.last().unwrap().contains("1317"));
    }

    #[test]
    fn prepare_with_params_and_columns_legacy() {
        let mut prep = vec![0u8];
        prep.extend_from_slice(&7u32.to_le_bytes());
        prep.extend_from_slice(&1u16.to_le_bytes());
        prep.extend_from_slice(&2u16.to_le_bytes());
        prep.extend_from_slice(&[0, 0, 0]);
        let mut s = packet(&prep, 1);
        s.extend(packet(&col(), 2));
        s.extend(packet(&col(), 3));
        s.extend(packet(&eof(2), 4));
        s.extend(packet(&col(), 5));
        s.extend(packet(&eof(2), 6));
        let mut m = ResponseMachine::new(Expect::Prepare, false);
        let (_, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
    }

    #[test]
    fn cursor_open_ends_after_metadata() {
        let mut s = packet(&[1], 1);
        s.extend(packet(&col(), 2));
        s.extend(packet(&eof(SERVER_STATUS_CURSOR_EXISTS | 2), 3));
        let mut m = ResponseMachine::new(Expect::ResultSets, false).with_cursor(true);
        let (_, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
    }

    /// A stored program's `OPEN c` sets SERVER_STATUS_CURSOR_EXISTS in the text-protocol
    /// answers that follow (`BEGIN NOT ATOMIC DECLARE c CURSOR FOR ...; OPEN c; SELECT 5;
    /// CLOSE c; END`): the rows still follow, then the final OK.
    fn procedure_cursor_stream(status: u16) -> Vec<u8> {
        let mut s = packet(&[1], 1);
        s.extend(packet(&col(), 2));
        s.extend(packet(&eof(status | SERVER_MORE_RESULTS_EXISTS), 3));
        s.extend(packet(b"\x015", 4));
        s.extend(packet(&eof(status | SERVER_MORE_RESULTS_EXISTS), 5));
        s.extend(packet(&ok(0, 2), 6));
        s
    }

    #[test]
    fn cursor_flag_in_a_text_result_does_not_end_it() {
        let s = procedure_cursor_stream(SERVER_STATUS_CURSOR_EXISTS | 2);
        let mut m = ResponseMachine::new(Expect::ResultSets, false);
        let (ev, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
        assert_eq!(ev.len(), 6);
        assert_eq!(m.last_status(), 2);
        // Also when a caller passes `with_cursor(false)`, and for other commands.
        let mut m = ResponseMachine::new(Expect::ResultSets, false).with_cursor(false);
        assert_eq!(run(&mut m, &s).1, s.len());
        let m = ResponseMachine::new(Expect::Status, false).with_cursor(true);
        assert!(!m.cursor);
    }

    #[test]
    fn cursor_flag_under_deprecate_eof_does_not_end_rows() {
        let mut s = packet(&[1], 1);
        s.extend(packet(&col(), 2));
        s.extend(packet(b"\x015", 3));
        s.extend(packet(
            &ok(
                EOF_HEADER,
                SERVER_STATUS_CURSOR_EXISTS | SERVER_MORE_RESULTS_EXISTS | 2,
            ),
            4,
        ));
        s.extend(packet(&ok(0, 2), 5));
        let mut m = ResponseMachine::new(Expect::ResultSets, true);
        let (_, pos) = run(&mut m, &s);
        assert!(m.is_done());
        assert_eq!(pos, s.len());
    }

    #[test]
    fn local_infile_then_ok() {
        let mut m = ResponseMachine::new(Expect::ResultSets, true);
        assert_eq!(m.classify(5, Some(0xfb)), Kind::Inspect);
        assert_eq!(m.on_packet(b"\xfbfile").unwrap(), Event::LocalInfile);
        assert!(m.awaiting_infile());
        let okp = ok(0, 2);
        assert_eq!(m.classify(okp.len(), Some(0)), Kind::Inspect);
        m.on_packet(&okp).unwrap();
        assert!(m.is_done());
    }

    #[test]
    fn huge_row_continuation_is_opaque() {
        let mut m = ResponseMachine::new(Expect::ResultSets, true);
        assert_eq!(m.classify(1, Some(1)), Kind::Inspect);
        m.on_packet(&[1]).unwrap();
        assert_eq!(m.classify(20, Some(3)), Kind::Opaque);
        // A 16 MiB row chunk, then a continuation that happens to start with 0xfe.
        assert_eq!(m.classify(MAX_PAYLOAD, Some(0xfe)), Kind::Opaque);
        assert_eq!(m.classify(3, Some(0xfe)), Kind::Opaque);
        assert_eq!(m.classify(7, Some(0xfe)), Kind::Inspect);
        m.on_packet(&ok(EOF_HEADER, 2)).unwrap();
        assert!(m.is_done());
    }

    #[test]
    fn statistics_is_one_packet() {
        let mut m = ResponseMachine::new(Expect::OnePacket, true);
        assert_eq!(m.classify(10, Some(b'U')), Kind::Inspect);
        m.on_packet(b"Uptime: 10").unwrap();
        assert!(m.is_done());
    }
}
