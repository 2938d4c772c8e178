//! The compressed protocol's framing on arbitrary bytes: decoding never panics nor
//! allocates beyond what a packet announces, and whatever is encoded decodes back.
#![no_main]

use holdfast_wire::compressed;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut raw = data;
    let mut plain = Vec::new();
    while let Some(len) = compressed::complete_len(raw) {
        let before = plain.len();
        if compressed::decode(&raw[..len], &mut plain).is_err() {
            assert_eq!(plain.len(), before, "an error appends nothing");
        }
        raw = &raw[len..];
    }
    let mut seq = data.first().copied().unwrap_or(0);
    let start = seq;
    let mut out = Vec::new();
    compressed::encode(data, &mut seq, &mut out);
    let mut back = Vec::new();
    let mut rest = &out[..];
    let mut expect = start;
    while let Some(len) = compressed::complete_len(rest) {
        let got = compressed::decode(&rest[..len], &mut back).expect("encoded packets decode");
        assert_eq!(got, expect);
        expect = expect.wrapping_add(1);
        rest = &rest[len..];
    }
    assert!(rest.is_empty());
    assert_eq!(back, data);
});
