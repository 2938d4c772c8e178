//! The SQL lexer, splitter, classifier and statement readers (KILL, password changes) on
//! arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = holdfast_sql::classify(data);
    for server in [
        holdfast_sql::Server::mariadb(101119),
        holdfast_sql::Server::mysql(80036),
        holdfast_sql::Server::UNKNOWN,
    ] {
        let mode = holdfast_sql::SqlMode::DEFAULT;
        let flags = holdfast_sql::classify_for(data, mode, server);
        let _ = holdfast_sql::read_route(data, flags, mode, server);
    }
    let mut last = 0;
    for r in holdfast_sql::split_statements(data) {
        assert!(r.start >= last && r.end <= data.len() && r.start <= r.end);
        last = r.end;
    }
    for _ in holdfast_sql::Lexer::new(data) {}
    for mode in holdfast_sql::SqlMode::alternatives(data) {
        let _ = holdfast_sql::parse_kill(data, mode);
        let _ = holdfast_sql::own_password_change(data, mode, b"app");
    }
});
