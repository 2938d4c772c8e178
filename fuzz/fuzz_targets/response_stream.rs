//! The response state machine driven over an arbitrary byte stream, as the proxy drives it:
//! it must never panic and must always make progress or stop.
#![no_main]

use holdfast_wire::frame::{parse_header, HEADER_LEN};
use holdfast_wire::response::{Expect, Kind, ResponseMachine};
use libfuzzer_sys::fuzz_target;

const EXPECTS: [Expect; 7] = [
    Expect::ResultSets,
    Expect::Prepare,
    Expect::Fetch,
    Expect::FieldList,
    Expect::Status,
    Expect::OnePacket,
    Expect::Nothing,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, stream)) = data.split_first() else { return };
    let mut m = ResponseMachine::new(EXPECTS[usize::from(sel % 7)], sel & 0x80 != 0);
    let mut pos = 0;
    while !m.is_done() {
        let Some(h) = parse_header(&stream[pos..]) else { break };
        let end = pos + h.packet_len();
        if end > stream.len() {
            break;
        }
        let payload = &stream[pos + HEADER_LEN..end];
        if m.classify(h.len, payload.first().copied()) == Kind::Inspect && m.on_packet(payload).is_err() {
            break;
        }
        pos = end;
    }
});
