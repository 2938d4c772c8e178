//! Binary-protocol result rows (the answer to `COM_STMT_EXECUTE`): the column types that
//! decide each value's width, and a decoder that splits a row into its values.
//!
//! A binary row is `0x00`, a NULL bitmap of `(columns + 7 + 2) / 8` bytes (bit `i + 2`
//! set: column `i` is NULL), then each non-NULL value: fixed-width little-endian for
//! integers and floating-point types, length-encoded bytes for everything else (strings,
//! decimals as text, temporal types with their own length prefix).

use crate::codec::Reader;
use crate::error::Result;

/// `MYSQL_TYPE_DECIMAL`.
pub const TYPE_DECIMAL: u8 = 0;
/// `MYSQL_TYPE_TINY`.
pub const TYPE_TINY: u8 = 1;
/// `MYSQL_TYPE_SHORT`.
pub const TYPE_SHORT: u8 = 2;
/// `MYSQL_TYPE_LONG`.
pub const TYPE_LONG: u8 = 3;
/// `MYSQL_TYPE_FLOAT`.
pub const TYPE_FLOAT: u8 = 4;
/// `MYSQL_TYPE_DOUBLE`.
pub const TYPE_DOUBLE: u8 = 5;
/// `MYSQL_TYPE_NULL`.
pub const TYPE_NULL: u8 = 6;
/// `MYSQL_TYPE_LONGLONG`.
pub const TYPE_LONGLONG: u8 = 8;
/// `MYSQL_TYPE_INT24`.
pub const TYPE_INT24: u8 = 9;
/// `MYSQL_TYPE_YEAR`.
pub const TYPE_YEAR: u8 = 13;
/// `MYSQL_TYPE_VAR_STRING`.
pub const TYPE_VAR_STRING: u8 = 253;
/// `MYSQL_TYPE_NEWDECIMAL`.
pub const TYPE_NEWDECIMAL: u8 = 246;
/// Column flag: the integer is unsigned.
pub const UNSIGNED_FLAG: u16 = 32;

/// The parts of a column definition that decoding a binary row needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnType {
    /// `MYSQL_TYPE_*`.
    pub ty: u8,
    /// Column flags (`UNSIGNED_FLAG`, …).
    pub flags: u16,
}

impl ColumnType {
    /// Reads the type and flags of a ColumnDefinition41 payload.
    pub fn parse(payload: &[u8]) -> Result<ColumnType> {
        Self::parse_with(payload, false)
    }

    /// [`ColumnType::parse`] for a connection that negotiated MariaDB's extended type
    /// info (`extended`): one more length-encoded field after the names.
    pub fn parse_with(payload: &[u8], extended: bool) -> Result<ColumnType> {
        let mut r = Reader::new(payload);
        for what in [
            "catalog",
            "schema",
            "table",
            "org_table",
            "name",
            "org_name",
        ] {
            r.lenenc_bytes(what)?;
        }
        if extended {
            r.lenenc_bytes("extended type info")?;
        }
        r.lenenc_int("fixed length")?;
        r.u16("charset")?;
        r.u32("column length")?;
        let ty = r.u8("type")?;
        let flags = r.u16("flags")?;
        Ok(ColumnType { ty, flags })
    }

    /// Whether the `UNSIGNED` flag is set.
    pub fn is_unsigned(&self) -> bool {
        self.flags & UNSIGNED_FLAG != 0
    }

    /// Width of a fixed-size value of this type, `None` for length-encoded ones.
    pub fn fixed_width(&self) -> Option<usize> {
        match self.ty {
            TYPE_TINY => Some(1),
            TYPE_SHORT | TYPE_YEAR => Some(2),
            TYPE_LONG | TYPE_INT24 | TYPE_FLOAT => Some(4),
            TYPE_LONGLONG | TYPE_DOUBLE => Some(8),
            TYPE_NULL => Some(0),
            _ => None,
        }
    }
}

/// Splits a binary row into one raw value per column (`None` for NULL). Integers and
/// floats are their little-endian bytes, other types their length-encoded bytes without
/// the length. Bytes after the last value are ignored.
pub fn decode_binary_row<'a>(
    payload: &'a [u8],
    columns: &[ColumnType],
) -> Result<Vec<Option<&'a [u8]>>> {
    let mut r = Reader::new(payload);
    r.u8("row header")?;
    let bitmap = r.take((columns.len() + 7 + 2) / 8, "null bitmap")?;
    let mut out = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        let bit = i + 2;
        // The bitmap holds at least `bit / 8 + 1` bytes (checked by `take` above).
        if bitmap
            .get(bit / 8)
            .is_some_and(|b| b & (1 << (bit % 8)) != 0)
        {
            out.push(None);
            continue;
        }
        let v = match c.fixed_width() {
            Some(n) => r.take(n, "fixed value")?,
            None => r.lenenc_bytes("value")?,
        };
        out.push(Some(v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::put_lenenc_bytes;

    fn col(ty: u8, flags: u16) -> ColumnType {
        ColumnType { ty, flags }
    }

    #[test]
    fn decodes_fixed_lenenc_and_null_values() {
        let cols = [
            col(TYPE_LONGLONG, UNSIGNED_FLAG),
            col(TYPE_DOUBLE, 0),
            col(TYPE_VAR_STRING, 0),
            col(TYPE_LONGLONG, 0),
            col(TYPE_TINY, 0),
        ];
        // Column 3 is NULL: bit 5 of the first bitmap byte.
        let mut p = vec![0u8, 0b0010_0000];
        p.extend_from_slice(&u64::MAX.to_le_bytes());
        p.extend_from_slice(&0.1f64.to_le_bytes());
        put_lenenc_bytes(&mut p, b"hi");
        p.push(0x80);
        let row = decode_binary_row(&p, &cols).unwrap();
        assert_eq!(row.len(), 5);
        assert_eq!(row[0], Some(&u64::MAX.to_le_bytes()[..]));
        assert_eq!(row[1], Some(&0.1f64.to_le_bytes()[..]));
        assert_eq!(row[2], Some(&b"hi"[..]));
        assert_eq!(row[3], None);
        assert_eq!(row[4], Some(&[0x80][..]));
        assert!(cols[0].is_unsigned() && !cols[1].is_unsigned());
    }

    #[test]
    fn bitmap_grows_with_the_column_count() {
        // 7 columns: bits 2..=8, two bitmap bytes; the last column NULL (bit 8 = byte 1 bit 0).
        let cols = [col(TYPE_TINY, 0); 7];
        let mut p = vec![0u8, 0, 1];
        p.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        let row = decode_binary_row(&p, &cols).unwrap();
        assert_eq!(row[6], None);
        assert_eq!(row[5], Some(&[6][..]));
        assert!(decode_binary_row(&p[..2], &cols).is_err());
    }

    #[test]
    fn truncated_rows_are_errors() {
        let cols = [col(TYPE_LONG, 0), col(TYPE_VAR_STRING, 0)];
        assert!(decode_binary_row(&[], &cols).is_err());
        assert!(decode_binary_row(&[0, 0, 1, 2, 3], &cols).is_err());
        assert!(decode_binary_row(&[0, 0, 1, 2, 3, 4, 5, b'a'], &cols).is_err());
        assert_eq!(
            decode_binary_row(&[0, 0], &[]).unwrap(),
            Vec::<Option<&[u8]>>::new()
        );
    }

    #[test]
    fn parses_column_definitions() {
        let mut p = Vec::new();
        for s in ["def", "", "", "", "@v", ""] {
            put_lenenc_bytes(&mut p, s.as_bytes());
        }
        p.push(0x0c);
        p.extend_from_slice(&63u16.to_le_bytes());
        p.extend_from_slice(&20u32.to_le_bytes());
        p.push(TYPE_LONGLONG);
        p.extend_from_slice(&(UNSIGNED_FLAG | 128).to_le_bytes());
        p.extend_from_slice(&[0, 0, 0]);
        let c = ColumnType::parse(&p).unwrap();
        assert_eq!(c, col(TYPE_LONGLONG, UNSIGNED_FLAG | 128));
        assert_eq!(c.fixed_width(), Some(8));
        assert!(ColumnType::parse(&p[..p.len() - 6]).is_err());
        // With MariaDB's extended type info: a length-encoded block after the names
        // (here: format "json").
        let mut ext = Vec::new();
        for s in ["def", "", "", "", "@v", ""] {
            put_lenenc_bytes(&mut ext, s.as_bytes());
        }
        put_lenenc_bytes(&mut ext, &[1, 4, b'j', b's', b'o', b'n']);
        ext.extend_from_slice(&p[p.len() - 13..]);
        assert_eq!(ColumnType::parse_with(&ext, true).unwrap(), c);
        assert_eq!(ColumnType::parse_with(&p, false).unwrap(), c);
    }

    /// Random bytes against random column lists: the decoder returns errors, never panics
    /// (a stand-in for the `binary_row` fuzz target where cargo-fuzz is not available).
    #[test]
    fn random_input_never_panics() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let types = [
            TYPE_TINY,
            TYPE_SHORT,
            TYPE_LONG,
            TYPE_LONGLONG,
            TYPE_DOUBLE,
            TYPE_NULL,
            TYPE_VAR_STRING,
            TYPE_NEWDECIMAL,
        ];
        for _ in 0..20_000 {
            let ncols = (next() % 20) as usize;
            let cols: Vec<ColumnType> = (0..ncols)
                .map(|_| col(types[(next() % types.len() as u64) as usize], next() as u16))
                .collect();
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if let Ok(row) = decode_binary_row(&bytes, &cols) {
                assert_eq!(row.len(), cols.len());
            }
            let _ = ColumnType::parse(&bytes);
        }
    }
}
