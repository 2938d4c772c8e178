//! The inbound PROXY protocol header parser (v1 and v2) on arbitrary bytes: it may not
//! panic, a header it accepts lies within the input and within the specification's
//! bounds, and no prefix of a complete header is read as another one.
#![no_main]

use holdfast_wire::proxy_protocol::{parse_header, starts_header, V1_MAX_LEN, V2_MAX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = starts_header(data);
    if let Ok(Some((_, len))) = parse_header(data) {
        assert!(len <= data.len());
        assert!(len <= V1_MAX_LEN.max(V2_MAX_LEN));
        // The same header with nothing after it reads the same.
        assert_eq!(parse_header(&data[..len]).ok().flatten().map(|(_, l)| l), Some(len));
        for n in 0..len {
            assert!(!matches!(parse_header(&data[..n]), Ok(Some(_))));
        }
    }
});
