//! Command bytes: the first payload byte of a client request.

pub const COM_SLEEP: u8 = 0x00;
pub const COM_QUIT: u8 = 0x01;
pub const COM_INIT_DB: u8 = 0x02;
pub const COM_QUERY: u8 = 0x03;
pub const COM_FIELD_LIST: u8 = 0x04;
pub const COM_CREATE_DB: u8 = 0x05;
pub const COM_DROP_DB: u8 = 0x06;
pub const COM_REFRESH: u8 = 0x07;
pub const COM_SHUTDOWN: u8 = 0x08;
pub const COM_STATISTICS: u8 = 0x09;
pub const COM_PROCESS_INFO: u8 = 0x0a;
pub const COM_CONNECT: u8 = 0x0b;
pub const COM_PROCESS_KILL: u8 = 0x0c;
pub const COM_DEBUG: u8 = 0x0d;
pub const COM_PING: u8 = 0x0e;
pub const COM_TIME: u8 = 0x0f;
pub const COM_DELAYED_INSERT: u8 = 0x10;
pub const COM_CHANGE_USER: u8 = 0x11;
pub const COM_BINLOG_DUMP: u8 = 0x12;
pub const COM_TABLE_DUMP: u8 = 0x13;
pub const COM_CONNECT_OUT: u8 = 0x14;
pub const COM_REGISTER_SLAVE: u8 = 0x15;
pub const COM_STMT_PREPARE: u8 = 0x16;
pub const COM_STMT_EXECUTE: u8 = 0x17;
pub const COM_STMT_SEND_LONG_DATA: u8 = 0x18;
pub const COM_STMT_CLOSE: u8 = 0x19;
pub const COM_STMT_RESET: u8 = 0x1a;
pub const COM_SET_OPTION: u8 = 0x1b;
pub const COM_STMT_FETCH: u8 = 0x1c;
pub const COM_DAEMON: u8 = 0x1d;
pub const COM_BINLOG_DUMP_GTID: u8 = 0x1e;
pub const COM_RESET_CONNECTION: u8 = 0x1f;
/// MariaDB bulk execute (array binding).
pub const COM_STMT_BULK_EXECUTE: u8 = 0xfa;

/// Cursor flag in COM_STMT_EXECUTE.
pub const CURSOR_TYPE_READ_ONLY: u8 = 1;

/// Whether a command runs no statement, leaving what the connection's last statement
/// left (`ROW_COUNT()`, `FOUND_ROWS()`, its diagnostics) as it was.
pub fn runs_no_statement(cmd: u8) -> bool {
    matches!(
        cmd,
        COM_STMT_PREPARE
            | COM_STMT_CLOSE
            | COM_STMT_RESET
            | COM_STMT_SEND_LONG_DATA
            | COM_PING
            | COM_STATISTICS
    )
}

pub fn name(cmd: u8) -> &'static str {
    match cmd {
        COM_SLEEP => "COM_SLEEP",
        COM_QUIT => "COM_QUIT",
        COM_INIT_DB => "COM_INIT_DB",
        COM_QUERY => "COM_QUERY",
        COM_FIELD_LIST => "COM_FIELD_LIST",
        COM_CREATE_DB => "COM_CREATE_DB",
        COM_DROP_DB => "COM_DROP_DB",
        COM_REFRESH => "COM_REFRESH",
        COM_SHUTDOWN => "COM_SHUTDOWN",
        COM_STATISTICS => "COM_STATISTICS",
        COM_PROCESS_INFO => "COM_PROCESS_INFO",
        COM_CONNECT => "COM_CONNECT",
        COM_PROCESS_KILL => "COM_PROCESS_KILL",
        COM_DEBUG => "COM_DEBUG",
        COM_PING => "COM_PING",
        COM_TIME => "COM_TIME",
        COM_DELAYED_INSERT => "COM_DELAYED_INSERT",
        COM_CHANGE_USER => "COM_CHANGE_USER",
        COM_BINLOG_DUMP => "COM_BINLOG_DUMP",
        COM_TABLE_DUMP => "COM_TABLE_DUMP",
        COM_CONNECT_OUT => "COM_CONNECT_OUT",
        COM_REGISTER_SLAVE => "COM_REGISTER_SLAVE",
        COM_STMT_PREPARE => "COM_STMT_PREPARE",
        COM_STMT_EXECUTE => "COM_STMT_EXECUTE",
        COM_STMT_SEND_LONG_DATA => "COM_STMT_SEND_LONG_DATA",
        COM_STMT_CLOSE => "COM_STMT_CLOSE",
        COM_STMT_RESET => "COM_STMT_RESET",
        COM_SET_OPTION => "COM_SET_OPTION",
        COM_STMT_FETCH => "COM_STMT_FETCH",
        COM_DAEMON => "COM_DAEMON",
        COM_BINLOG_DUMP_GTID => "COM_BINLOG_DUMP_GTID",
        COM_RESET_CONNECTION => "COM_RESET_CONNECTION",
        COM_STMT_BULK_EXECUTE => "COM_STMT_BULK_EXECUTE",
        _ => "COM_UNKNOWN",
    }
}
