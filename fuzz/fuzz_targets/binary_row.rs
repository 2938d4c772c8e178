//! The binary-protocol row decoder and column-definition parser on arbitrary bytes: none
//! may panic. The first byte picks the column count, the next ones the column types.
#![no_main]

use holdfast_wire::binary_row::{decode_binary_row, ColumnType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ColumnType::parse(data);
    let _ = ColumnType::parse_with(data, true);
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 32).min(rest.len());
    let (types, row) = rest.split_at(n);
    let columns: Vec<ColumnType> = types
        .iter()
        .map(|&ty| ColumnType {
            ty,
            flags: u16::from(ty & 1) << 5,
        })
        .collect();
    if let Ok(values) = decode_binary_row(row, &columns) {
        assert_eq!(values.len(), columns.len());
    }
});
