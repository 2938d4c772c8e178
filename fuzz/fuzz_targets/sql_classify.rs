//! The SQL lexer, splitter, classifier and statement readers (KILL, password changes) on
//! arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = holdfast_sql::classify(data);
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
