//! The MySQL client/server wire protocol, without I/O.
//!
//! Everything here works on byte slices and is safe to feed arbitrary input: parsers return
//! [`WireError`] instead of panicking, which is what the fuzz targets check. The proxy uses
//! these pieces to frame packets in a stream ([`frame`]), to follow a command's response
//! ([`response`]), and to build and read the handshake ([`handshake`]).

pub mod auth;
pub mod binary_row;
pub mod caps;
pub mod codec;
pub mod command;
pub mod compressed;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod interned;
pub mod packets;
pub mod proxy_protocol;
pub mod response;
pub mod session_track;

pub use error::WireError;
