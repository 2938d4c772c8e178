//! The MySQL error codes holdfast itself sends, and the messages that go with them.

pub const ER_CON_COUNT_ERROR: u16 = 1040;
pub const ER_HANDSHAKE_ERROR: u16 = 1043;
pub const ER_ACCESS_DENIED_ERROR: u16 = 1045;
pub const ER_UNKNOWN_COM_ERROR: u16 = 1047;
pub const ER_NET_PACKET_TOO_LARGE: u16 = 1153;
pub const ER_UNKNOWN_STMT_HANDLER: u16 = 1243;
pub const ER_NOT_SUPPORTED_AUTH_MODE: u16 = 1251;
pub const ER_MALFORMED_PACKET: u16 = 1835;
/// Sent by a server that is shutting down.
pub const ER_SERVER_SHUTDOWN: u16 = 1053;
/// Sent when the connection was killed (KILL, or holdfast's own fence in a switchover).
pub const ER_CONNECTION_KILLED: u16 = 1927;
/// MariaDB's idle-timeout disconnect.
pub const ER_CLIENT_IDLE_TIMEOUT: u16 = 4031;
/// "The server is currently in offline mode": a serverless instance did not resume in time;
/// nothing ran and the connection stays usable.
pub const ER_INSTANCE_UNAVAILABLE: u16 = 3032;
/// Client-side code, used when holdfast cannot reach any backend.
pub const CR_CONN_HOST_ERROR: u16 = 2003;
/// Client-side code, used when the backend is lost during a command.
pub const CR_SERVER_LOST: u16 = 2013;

pub fn sql_state(code: u16) -> &'static str {
    match code {
        ER_CON_COUNT_ERROR => "08004",
        ER_HANDSHAKE_ERROR => "08S01",
        ER_ACCESS_DENIED_ERROR => "28000",
        ER_UNKNOWN_COM_ERROR => "08S01",
        ER_NET_PACKET_TOO_LARGE => "08S01",
        ER_NOT_SUPPORTED_AUTH_MODE => "08004",
        _ => "HY000",
    }
}

pub fn err(code: u16, message: &str) -> Vec<u8> {
    holdfast_wire::packets::err_payload(code, sql_state(code), message)
}
