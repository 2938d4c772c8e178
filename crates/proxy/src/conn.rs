//! A framed connection: a byte stream ([`BoxedIo`]) with its read buffer
//! (`holdfast_client::conn`, shared by the client side of sessions and the backend
//! connections).

pub use holdfast_client::conn::{BoxedIo, ConnError, Io, Packet, PacketConn};
