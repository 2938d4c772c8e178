//! Primitive encodings: fixed-width little-endian integers, length-encoded integers and strings.

use crate::error::{Result, WireError};

/// A cursor over a packet payload.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let r = &self.buf[self.pos..];
        self.pos = self.buf.len();
        r
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(WireError::Truncated(what));
        }
        let r = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(r)
    }

    pub fn skip(&mut self, n: usize, what: &'static str) -> Result<()> {
        self.take(n, what).map(|_| ())
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u24(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(3, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], 0]))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length-encoded integer. `0xfb` (NULL in rows) is reported as malformed here.
    pub fn lenenc_int(&mut self, what: &'static str) -> Result<u64> {
        match self.u8(what)? {
            n @ 0..=0xfa => Ok(u64::from(n)),
            0xfc => Ok(u64::from(self.u16(what)?)),
            0xfd => Ok(u64::from(self.u24(what)?)),
            0xfe => self.u64(what),
            _ => Err(WireError::Malformed(what)),
        }
    }

    pub fn lenenc_bytes(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let n = self.lenenc_int(what)?;
        let n = usize::try_from(n).map_err(|_| WireError::Malformed(what))?;
        self.take(n, what)
    }

    /// Bytes up to (not including) the next NUL, consuming the NUL.
    pub fn null_terminated(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let rest = &self.buf[self.pos..];
        match rest.iter().position(|&b| b == 0) {
            Some(i) => {
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            None => Err(WireError::Truncated(what)),
        }
    }
}

pub fn put_lenenc_int(out: &mut Vec<u8>, v: u64) {
    if v < 0xfb {
        out.push(v as u8);
    } else if v <= 0xffff {
        out.push(0xfc);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if v <= 0xff_ffff {
        out.push(0xfd);
        out.extend_from_slice(&(v as u32).to_le_bytes()[..3]);
    } else {
        out.push(0xfe);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

pub fn put_lenenc_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_lenenc_int(out, b.len() as u64);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenenc_round_trip() {
        for v in [
            0u64,
            1,
            250,
            251,
            0xffff,
            0x10000,
            0xff_ffff,
            0x100_0000,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_lenenc_int(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.lenenc_int("v"), Ok(v));
            assert!(r.is_empty());
        }
    }

    #[test]
    fn truncated_is_an_error() {
        let mut r = Reader::new(&[0xfd, 1]);
        assert_eq!(r.lenenc_int("x"), Err(WireError::Truncated("x")));
        let mut r = Reader::new(b"abc");
        assert!(r.null_terminated("s").is_err());
    }
}
