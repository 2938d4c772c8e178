//! Every packet parser on arbitrary bytes: none may panic, and what encodes must parse back.
#![no_main]

use holdfast_wire::handshake::{AuthSwitch, ChangeUser, ClientHello, Greeting};
use holdfast_wire::packets::{EofPacket, ErrPacket, OkPacket, PrepareOk};
use holdfast_wire::{frame, session_track};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = frame::scan_logical(data, 1 << 20);
    let _ = frame::logical_payload(data);
    if let Ok(ClientHello::Login(l)) = ClientHello::parse(data) {
        let again = ClientHello::parse(&l.encode());
        assert!(again.is_ok(), "re-encoded login does not parse");
    }
    if let Ok(g) = Greeting::parse(data) {
        let _ = Greeting::parse(&g.encode());
    }
    for track in [false, true] {
        if let Ok(ok) = OkPacket::parse(data, track) {
            let enc = ok.encode(track);
            let back = OkPacket::parse(&enc, track).expect("re-encoded OK parses");
            assert_eq!(back.affected_rows, ok.affected_rows);
            assert_eq!(back.last_insert_id, ok.last_insert_id);
            let _ = ok.encode(!track);
            for item in session_track::items(ok.session_state) {
                let _ = item;
            }
        }
    }
    let _ = ErrPacket::parse(data);
    let _ = EofPacket::parse(data);
    let _ = PrepareOk::parse(data);
    let _ = AuthSwitch::parse(data);
    let _ = ChangeUser::parse(data, u32::MAX);
    let _ = ChangeUser::parse(data, 0);
    for item in session_track::items(data) {
        let _ = item;
    }
});
