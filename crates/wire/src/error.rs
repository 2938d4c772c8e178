use thiserror::Error;

/// A packet that does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("packet truncated while reading {0}")]
    Truncated(&'static str),
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    #[error("unexpected packet header byte 0x{0:02x} in {1}")]
    Unexpected(u8, &'static str),
}

pub type Result<T> = std::result::Result<T, WireError>;
