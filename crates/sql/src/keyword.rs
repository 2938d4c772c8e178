//! Case-insensitive keyword matching without allocation.

/// Longest word worth uppercasing; every keyword and function name we look for is shorter.
const MAX_KEYWORD_LEN: usize = 40;

/// A word uppercased into a stack buffer, for `match`ing against byte-string keywords.
pub(crate) struct Upper {
    buf: [u8; MAX_KEYWORD_LEN],
    len: usize,
}

impl Upper {
    /// The uppercased word, or an empty slice if the word was too long to be a keyword.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Uppercases `word` (ASCII only). Words longer than any keyword come back empty.
pub(crate) fn upper(word: &[u8]) -> Upper {
    let mut out = Upper {
        buf: [0; MAX_KEYWORD_LEN],
        len: 0,
    };
    if word.len() <= MAX_KEYWORD_LEN {
        for (dst, src) in out.buf.iter_mut().zip(word) {
            *dst = src.to_ascii_uppercase();
        }
        out.len = word.len();
    }
    out
}
