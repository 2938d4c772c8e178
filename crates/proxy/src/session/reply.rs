//! What a client waits for after each command: its [`Reply`] shape, decided in one place
//! from the command byte, and the sequence id the reply comes at. It decides what holdfast
//! relays and what it owes the client when the backend is lost: nothing at all for a
//! command without a reply, one ERR after the client's file for a LOCAL INFILE exchange,
//! the command run again or an ERR otherwise.

use holdfast_wire::command::*;
use holdfast_wire::frame::{self, parse_header, HEADER_LEN};
use holdfast_wire::response::Expect;

/// The shape of the reply a command gets: what the client waits for, so what holdfast
/// relays and what the client is owed if the backend is lost before answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    /// Nothing at all: COM_STMT_CLOSE, COM_STMT_SEND_LONG_DATA (and COM_QUIT, which ends
    /// the session). The client sends its next command without reading anything, so
    /// holdfast must never answer these, not even with an error.
    None,
    /// Exactly one packet of any shape (COM_STATISTICS).
    OnePacket,
    /// OK or ERR (COM_SET_OPTION: EOF): COM_PING, COM_INIT_DB, COM_RESET_CONNECTION,
    /// COM_STMT_RESET...
    Status,
    /// OK, ERR, or result sets (COM_QUERY, COM_STMT_EXECUTE, COM_PROCESS_INFO). The server
    /// may instead ask for a LOCAL INFILE file: the client then sends it, up to an empty
    /// packet, and waits for OK or ERR at the sequence id that follows that packet.
    ResultSets,
    /// PREPARE-OK with its definitions, or ERR (COM_STMT_PREPARE).
    Prepare,
    /// Rows then EOF, or ERR (COM_STMT_FETCH).
    Fetch,
    /// Column definitions then EOF, or ERR (COM_FIELD_LIST).
    FieldList,
    /// An authentication exchange, then OK or ERR (COM_CHANGE_USER).
    Authentication,
    /// A command holdfast does not forward: it answers with ERR itself.
    Refused,
}

impl Reply {
    pub(super) fn of(cmd: u8) -> Reply {
        match cmd {
            COM_QUIT | COM_STMT_CLOSE | COM_STMT_SEND_LONG_DATA => Reply::None,
            COM_STATISTICS => Reply::OnePacket,
            COM_INIT_DB | COM_PING | COM_SET_OPTION | COM_PROCESS_KILL | COM_DEBUG
            | COM_REFRESH | COM_CREATE_DB | COM_DROP_DB | COM_RESET_CONNECTION | COM_STMT_RESET => {
                Reply::Status
            }
            COM_QUERY | COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE | COM_PROCESS_INFO => {
                Reply::ResultSets
            }
            COM_STMT_PREPARE => Reply::Prepare,
            COM_STMT_FETCH => Reply::Fetch,
            COM_FIELD_LIST => Reply::FieldList,
            COM_CHANGE_USER => Reply::Authentication,
            _ => Reply::Refused,
        }
    }

    /// The reply shape of a whole request (`None` for an empty one).
    pub(super) fn of_request(request: &[u8]) -> Option<Reply> {
        request.get(HEADER_LEN).map(|&cmd| Reply::of(cmd))
    }

    /// How the backend's answer is followed (`None`: there is no answer to relay).
    pub(super) fn expect(self) -> Option<Expect> {
        match self {
            Reply::None | Reply::Authentication | Reply::Refused => None,
            Reply::OnePacket => Some(Expect::OnePacket),
            Reply::Status => Some(Expect::Status),
            Reply::ResultSets => Some(Expect::ResultSets),
            Reply::Prepare => Some(Expect::Prepare),
            Reply::Fetch => Some(Expect::Fetch),
            Reply::FieldList => Some(Expect::FieldList),
        }
    }
}

/// The sequence id of the reply to a request: one after its last chunk's.
pub(super) fn reply_seq(request: &[u8]) -> u8 {
    match frame::scan_logical(request, usize::MAX) {
        frame::Scan::Complete { last_seq, .. } => last_seq.wrapping_add(1),
        _ => parse_header(request).map_or(1, |h| h.seq.wrapping_add(1)),
    }
}
