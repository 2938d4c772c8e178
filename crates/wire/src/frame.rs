//! Packet framing: a 3-byte little-endian payload length and a 1-byte sequence id.
//!
//! A payload of exactly [`MAX_PAYLOAD`] bytes is continued by the next packet; the logical
//! packet ends with the first chunk shorter than that (possibly empty).

pub const HEADER_LEN: usize = 4;
pub const MAX_PAYLOAD: usize = 0xff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: usize,
    pub seq: u8,
}

impl Header {
    /// Whether another chunk of the same logical packet follows this one.
    pub fn continues(&self) -> bool {
        self.len == MAX_PAYLOAD
    }

    pub fn packet_len(&self) -> usize {
        HEADER_LEN + self.len
    }
}

pub fn parse_header(buf: &[u8]) -> Option<Header> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    Some(Header {
        len: usize::from(buf[0]) | usize::from(buf[1]) << 8 | usize::from(buf[2]) << 16,
        seq: buf[3],
    })
}

pub fn put_header(out: &mut Vec<u8>, len: usize, seq: u8) {
    debug_assert!(len <= MAX_PAYLOAD);
    out.extend_from_slice(&[len as u8, (len >> 8) as u8, (len >> 16) as u8, seq]);
}

/// Appends `payload` framed as one logical packet starting at `seq`; returns the next sequence id.
pub fn put_packet(out: &mut Vec<u8>, payload: &[u8], mut seq: u8) -> u8 {
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_PAYLOAD);
        put_header(out, n, seq);
        out.extend_from_slice(&rest[..n]);
        seq = seq.wrapping_add(1);
        rest = &rest[n..];
        if n < MAX_PAYLOAD {
            return seq;
        }
    }
}

/// Appends one packet to `out`: its header (`seq`, and the length once known), then the
/// payload `write` appends. The payload must fit one frame (< 16 MiB); returns false, with
/// `out` as it was, when it does not.
pub fn frame_into(out: &mut Vec<u8>, seq: u8, write: impl FnOnce(&mut Vec<u8>)) -> bool {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, seq]);
    write(out);
    let len = out.len() - start - HEADER_LEN;
    if len >= MAX_PAYLOAD {
        out.truncate(start);
        return false;
    }
    out[start..start + 3].copy_from_slice(&(len as u32).to_le_bytes()[..3]);
    true
}

/// A packet (payload of one logical packet) framed with `seq`.
pub fn packet(payload: &[u8], seq: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + HEADER_LEN);
    put_packet(&mut out, payload, seq);
    out
}

/// Where the first logical packet in a buffer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The whole logical packet is in the buffer: `wire_len` bytes including every header.
    Complete {
        wire_len: usize,
        payload_len: usize,
        chunks: usize,
        first_seq: u8,
        last_seq: u8,
    },
    /// More bytes are needed.
    Incomplete,
    /// The payload already exceeds `max_payload`.
    TooLarge { payload_len: usize },
}

/// Finds the first complete logical packet in `buf`, enforcing `max_payload` as soon as the
/// headers seen so far exceed it (so an oversized request is refused before it is buffered).
pub fn scan_logical(buf: &[u8], max_payload: usize) -> Scan {
    let mut pos = 0;
    let mut payload_len = 0usize;
    let mut chunks = 0;
    let mut first_seq = 0;
    loop {
        let Some(h) = parse_header(&buf[pos..]) else {
            return Scan::Incomplete;
        };
        if chunks == 0 {
            first_seq = h.seq;
        }
        payload_len = payload_len.saturating_add(h.len);
        if payload_len > max_payload {
            return Scan::TooLarge { payload_len };
        }
        if buf.len() < pos + h.packet_len() {
            return Scan::Incomplete;
        }
        pos += h.packet_len();
        chunks += 1;
        if !h.continues() {
            return Scan::Complete {
                wire_len: pos,
                payload_len,
                chunks,
                first_seq,
                last_seq: h.seq,
            };
        }
    }
}

/// The payload of a complete logical packet at the start of `wire` (as found by
/// [`scan_logical`]). Borrows for a single chunk; only multi-chunk packets are copied.
pub fn logical_payload(wire: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let Some(h) = parse_header(wire) else {
        return std::borrow::Cow::Borrowed(&[]);
    };
    let end = h.packet_len().min(wire.len());
    if !h.continues() {
        return std::borrow::Cow::Borrowed(&wire[HEADER_LEN..end]);
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(h) = parse_header(&wire[pos..]) {
        let end = (pos + h.packet_len()).min(wire.len());
        out.extend_from_slice(&wire[pos + HEADER_LEN..end]);
        pos = end;
        if !h.continues() {
            break;
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_into_matches_packet_and_appends() {
        let mut out = b"ahead".to_vec();
        assert!(frame_into(&mut out, 7, |o| o.extend_from_slice(b"\x03SELECT 1")));
        assert_eq!(&out[..5], b"ahead");
        assert_eq!(&out[5..], &packet(b"\x03SELECT 1", 7)[..]);
        let too_big = frame_into(&mut out, 0, |o| o.resize(o.len() + MAX_PAYLOAD, 0));
        assert!(!too_big);
        assert_eq!(
            out.len(),
            5 + 13,
            "a payload too large for one frame leaves out as it was"
        );
    }

    #[test]
    fn small_packet_round_trip() {
        let p = packet(b"\x03SELECT 1", 0);
        assert_eq!(
            scan_logical(&p, 1 << 20),
            Scan::Complete {
                wire_len: 13,
                payload_len: 9,
                chunks: 1,
                first_seq: 0,
                last_seq: 0
            }
        );
        assert_eq!(&*logical_payload(&p), b"\x03SELECT 1");
        assert_eq!(scan_logical(&p[..12], 1 << 20), Scan::Incomplete);
    }

    #[test]
    fn exact_multiple_of_max_gets_empty_trailer() {
        let payload = vec![7u8; MAX_PAYLOAD];
        let p = packet(&payload, 3);
        assert_eq!(p.len(), MAX_PAYLOAD + 8);
        match scan_logical(&p, usize::MAX) {
            Scan::Complete {
                chunks,
                payload_len,
                last_seq,
                ..
            } => {
                assert_eq!(chunks, 2);
                assert_eq!(payload_len, MAX_PAYLOAD);
                assert_eq!(last_seq, 4);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(logical_payload(&p).len(), MAX_PAYLOAD);
    }

    #[test]
    fn oversize_detected_from_header_alone() {
        let hdr = [0xff, 0xff, 0xff, 0];
        assert_eq!(
            scan_logical(&hdr, 1024),
            Scan::TooLarge {
                payload_len: MAX_PAYLOAD
            }
        );
    }
}
