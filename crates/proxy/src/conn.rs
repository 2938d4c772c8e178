//! A framed connection: a TCP stream with its read buffer (`holdfast_client::conn`, shared
//! by the client side of sessions and the backend connections).

pub use holdfast_client::conn::{ConnError, Packet, PacketConn};
