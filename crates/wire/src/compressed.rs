//! The compressed protocol's framing (zlib), without I/O: each compressed packet has a
//! 7-byte header (3 bytes payload length, a sequence id of its own, 3 bytes uncompressed
//! length, 0 when the payload went uncompressed) and carries any slice of the plain
//! packet stream.

use crate::error::Result;
use crate::WireError;
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use flate2::Compression;
use std::io::{Read, Write};

/// Largest payload of one compressed packet, and of what it inflates to.
pub const MAX_CHUNK: usize = 0xff_ffff;
/// Shorter payloads go uncompressed (deflate would only grow them), as the server does.
pub const MIN_COMPRESS_LENGTH: usize = 50;
pub const HEADER_LEN: usize = 7;

fn u24(b: &[u8]) -> usize {
    usize::from(b[0]) | usize::from(b[1]) << 8 | usize::from(b[2]) << 16
}

/// The wire length of the compressed packet at the start of `raw`, once it is all there.
pub fn complete_len(raw: &[u8]) -> Option<usize> {
    if raw.len() < HEADER_LEN {
        return None;
    }
    let len = HEADER_LEN + u24(raw);
    (raw.len() >= len).then_some(len)
}

/// Decodes one whole compressed packet (`packet`, as [`complete_len`] measured it),
/// appending its plain bytes to `plain`. Returns the packet's sequence id. An inflated
/// size other than the one announced is an error (and never allocates beyond it).
pub fn decode(packet: &[u8], plain: &mut Vec<u8>) -> Result<u8> {
    if packet.len() < HEADER_LEN || packet.len() != HEADER_LEN + u24(packet) {
        return Err(WireError::Malformed("compressed packet length"));
    }
    let seq = packet[3];
    let inflated = u24(&packet[4..]);
    let body = &packet[HEADER_LEN..];
    if inflated == 0 {
        plain.extend_from_slice(body);
        return Ok(seq);
    }
    let start = plain.len();
    plain.resize(start + inflated, 0);
    let mut decoder = ZlibDecoder::new(body);
    let mut filled = 0;
    while filled < inflated {
        match decoder.read(&mut plain[start + filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(_) => {
                plain.truncate(start);
                return Err(WireError::Malformed("compressed packet: bad zlib data"));
            }
        }
    }
    let mut extra = [0u8; 1];
    if filled != inflated || !matches!(decoder.read(&mut extra), Ok(0)) {
        plain.truncate(start);
        return Err(WireError::Malformed(
            "compressed packet inflates to another size than announced",
        ));
    }
    Ok(seq)
}

/// Appends `data` as compressed packets numbered from `*seq` (advanced past them), each
/// carrying at most [`MAX_CHUNK`] plain bytes.
pub fn encode(data: &[u8], seq: &mut u8, out: &mut Vec<u8>) {
    for chunk in data.chunks(MAX_CHUNK) {
        let compressed = (chunk.len() >= MIN_COMPRESS_LENGTH)
            .then(|| {
                let mut e =
                    ZlibEncoder::new(Vec::with_capacity(chunk.len() / 2), Compression::fast());
                e.write_all(chunk).ok()?;
                e.finish().ok()
            })
            .flatten()
            .filter(|z| z.len() < chunk.len());
        let (body, inflated) = match &compressed {
            Some(z) => (&z[..], chunk.len()),
            None => (chunk, 0),
        };
        let len = body.len();
        out.extend_from_slice(&[
            len as u8,
            (len >> 8) as u8,
            (len >> 16) as u8,
            *seq,
            inflated as u8,
            (inflated >> 8) as u8,
            (inflated >> 16) as u8,
        ]);
        out.extend_from_slice(body);
        *seq = seq.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_short_long_and_incompressible() {
        let long: Vec<u8> = (0..100_000u32).map(|i| (i % 13) as u8).collect();
        let noise: Vec<u8> = (0..5_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for data in [&b"tiny"[..], &long, &noise] {
            let mut seq = 5;
            let mut out = Vec::new();
            encode(data, &mut seq, &mut out);
            assert_eq!(seq, 6);
            let len = complete_len(&out).unwrap();
            assert_eq!(len, out.len());
            let mut plain = Vec::new();
            assert_eq!(decode(&out, &mut plain).unwrap(), 5);
            assert_eq!(plain, data);
        }
    }

    #[test]
    fn a_lying_size_is_an_error() {
        let mut seq = 0;
        let mut out = Vec::new();
        encode(&[7u8; 100], &mut seq, &mut out);
        for announced in [10usize, 99, 101, MAX_CHUNK] {
            let mut p = out.clone();
            p[4..7].copy_from_slice(&[
                announced as u8,
                (announced >> 8) as u8,
                (announced >> 16) as u8,
            ]);
            let mut plain = vec![1, 2];
            assert!(decode(&p, &mut plain).is_err(), "announced {announced}");
            assert_eq!(plain, [1, 2], "nothing appended on error");
        }
        let mut plain = Vec::new();
        assert!(decode(&[5, 0, 0, 0, 100, 0, 0, 1, 2, 3, 4, 5], &mut plain).is_err());
    }
}
