//! Capability and server status flags.

pub const CLIENT_LONG_PASSWORD: u32 = 1;
pub const CLIENT_FOUND_ROWS: u32 = 1 << 1;
pub const CLIENT_LONG_FLAG: u32 = 1 << 2;
pub const CLIENT_CONNECT_WITH_DB: u32 = 1 << 3;
pub const CLIENT_NO_SCHEMA: u32 = 1 << 4;
pub const CLIENT_COMPRESS: u32 = 1 << 5;
pub const CLIENT_ODBC: u32 = 1 << 6;
pub const CLIENT_LOCAL_FILES: u32 = 1 << 7;
pub const CLIENT_IGNORE_SPACE: u32 = 1 << 8;
pub const CLIENT_PROTOCOL_41: u32 = 1 << 9;
pub const CLIENT_INTERACTIVE: u32 = 1 << 10;
pub const CLIENT_SSL: u32 = 1 << 11;
pub const CLIENT_IGNORE_SIGPIPE: u32 = 1 << 12;
pub const CLIENT_TRANSACTIONS: u32 = 1 << 13;
pub const CLIENT_RESERVED: u32 = 1 << 14;
pub const CLIENT_SECURE_CONNECTION: u32 = 1 << 15;
pub const CLIENT_MULTI_STATEMENTS: u32 = 1 << 16;
pub const CLIENT_MULTI_RESULTS: u32 = 1 << 17;
pub const CLIENT_PS_MULTI_RESULTS: u32 = 1 << 18;
pub const CLIENT_PLUGIN_AUTH: u32 = 1 << 19;
pub const CLIENT_CONNECT_ATTRS: u32 = 1 << 20;
pub const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA: u32 = 1 << 21;
pub const CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS: u32 = 1 << 22;
pub const CLIENT_SESSION_TRACK: u32 = 1 << 23;
pub const CLIENT_DEPRECATE_EOF: u32 = 1 << 24;
pub const CLIENT_OPTIONAL_RESULTSET_METADATA: u32 = 1 << 25;
pub const CLIENT_ZSTD_COMPRESSION: u32 = 1 << 26;
pub const CLIENT_QUERY_ATTRIBUTES: u32 = 1 << 27;

/// MariaDB's extended capabilities: the upper half of its 64-bit flags, sent in the
/// greeting's and the login request's reserved bytes when CLIENT_LONG_PASSWORD (MariaDB's
/// `CLIENT_MYSQL`) is clear.
pub const MARIADB_CLIENT_PROGRESS: u32 = 1;
pub const MARIADB_CLIENT_COM_MULTI: u32 = 1 << 1;
pub const MARIADB_CLIENT_STMT_BULK_OPERATIONS: u32 = 1 << 2;
pub const MARIADB_CLIENT_EXTENDED_TYPE_INFO: u32 = 1 << 3;
pub const MARIADB_CLIENT_CACHE_METADATA: u32 = 1 << 4;

/// The MariaDB extended capabilities holdfast offers clients (when the servers have them):
/// extended type info (a column definition field holdfast only skips) and bulk execution
/// (COM_STMT_BULK_EXECUTE, a statement command like COM_STMT_EXECUTE). Progress reports
/// (packets inside a response) and cached metadata (responses whose shape depends on
/// the client's cache) are not offered.
pub const PROXY_MARIADB_CAPABILITIES: u32 =
    MARIADB_CLIENT_STMT_BULK_OPERATIONS | MARIADB_CLIENT_EXTENDED_TYPE_INFO;

/// What holdfast offers clients (CLIENT_SSL is added with `[tls]`). Optional metadata and
/// query attributes are masked: holdfast must understand every byte it forwards.
/// Compression (zlib) is undone below the packet layer (`holdfast_client::compress`).
pub const PROXY_CAPABILITIES: u32 = CLIENT_LONG_PASSWORD
    | CLIENT_COMPRESS
    | CLIENT_FOUND_ROWS
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_NO_SCHEMA
    | CLIENT_ODBC
    | CLIENT_LOCAL_FILES
    | CLIENT_IGNORE_SPACE
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_IGNORE_SIGPIPE
    | CLIENT_TRANSACTIONS
    | CLIENT_SECURE_CONNECTION
    | CLIENT_MULTI_STATEMENTS
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS
    | CLIENT_SESSION_TRACK
    | CLIENT_DEPRECATE_EOF;

/// Flags holdfast always needs on its backend connections, whatever the client asked for.
pub const BACKEND_REQUIRED: u32 = CLIENT_PROTOCOL_41
    | CLIENT_SECURE_CONNECTION
    | CLIENT_PLUGIN_AUTH
    | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA
    | CLIENT_TRANSACTIONS
    | CLIENT_LONG_PASSWORD
    | CLIENT_SESSION_TRACK;

/// Capabilities for a backend connection serving a client that negotiated `client_caps`
/// (a session's link, and the monitor's with plain client semantics).
pub fn backend_capabilities(client_caps: u32, server_caps: u32) -> u32 {
    ((client_caps & PROXY_CAPABILITIES) | BACKEND_REQUIRED) & (server_caps | CLIENT_SESSION_TRACK)
}

/// Capabilities for a pass-through backend connection: the client's own, plus only what
/// holdfast's login exchange needs.
pub fn exact_capabilities(client_caps: u32, server_caps: u32) -> u32 {
    ((client_caps & PROXY_CAPABILITIES) | (BACKEND_REQUIRED & !CLIENT_SESSION_TRACK)) & server_caps
}

pub const SERVER_STATUS_IN_TRANS: u16 = 1;
pub const SERVER_STATUS_AUTOCOMMIT: u16 = 2;
pub const SERVER_MORE_RESULTS_EXISTS: u16 = 8;
pub const SERVER_STATUS_NO_GOOD_INDEX_USED: u16 = 0x10;
pub const SERVER_STATUS_NO_INDEX_USED: u16 = 0x20;
pub const SERVER_STATUS_CURSOR_EXISTS: u16 = 0x40;
pub const SERVER_STATUS_LAST_ROW_SENT: u16 = 0x80;
pub const SERVER_STATUS_DB_DROPPED: u16 = 0x100;
pub const SERVER_STATUS_NO_BACKSLASH_ESCAPES: u16 = 0x200;
/// MariaDB: the session's `sql_mode` has `ANSI_QUOTES` (tried on 10.11).
pub const SERVER_STATUS_ANSI_QUOTES: u16 = 0x8000;
pub const SERVER_STATUS_METADATA_CHANGED: u16 = 0x400;
pub const SERVER_QUERY_WAS_SLOW: u16 = 0x800;
pub const SERVER_PS_OUT_PARAMS: u16 = 0x1000;
pub const SERVER_STATUS_IN_TRANS_READONLY: u16 = 0x2000;
pub const SERVER_SESSION_STATE_CHANGED: u16 = 0x4000;
