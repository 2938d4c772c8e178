//! A framed connection: a TCP stream with its read buffer, reading and writing whole
//! logical packets (continuations joined).

use bytes::{Bytes, BytesMut};
use holdfast_wire::frame::{self, Scan};
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection closed by peer")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("packet of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("{0}")]
    Wire(#[from] holdfast_wire::WireError),
}

/// What a connection whose buffer was released reads into while it waits.
const IDLE_READ_BUFFER: usize = 256;

pub struct PacketConn {
    pub stream: TcpStream,
    pub rbuf: BytesMut,
}

/// One logical packet: its payload (continuations joined) and the last sequence id used.
pub struct Packet {
    pub payload: Bytes,
    pub seq: u8,
}

impl PacketConn {
    pub fn new(stream: TcpStream) -> Self {
        PacketConn {
            stream,
            rbuf: BytesMut::with_capacity(4096),
        }
    }

    /// Reads more bytes into the buffer; `Closed` at end of stream.
    pub async fn fill(&mut self) -> Result<usize, ConnError> {
        if self.rbuf.capacity() == 0 {
            // A buffer released while idle. An idle connection waits here, so a small one:
            // it takes the next request's first bytes (a short query whole), and a longer
            // request grows it on the next read.
            self.rbuf.reserve(IDLE_READ_BUFFER);
        } else if self.rbuf.capacity() - self.rbuf.len() < 1024 {
            self.rbuf.reserve(16 * 1024);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            return Err(ConnError::Closed);
        }
        Ok(n)
    }

    /// Waits until a whole logical packet is buffered and returns its wire length
    /// (headers included) without consuming it.
    pub async fn buffer_packet(&mut self, max: usize) -> Result<usize, ConnError> {
        loop {
            match frame::scan_logical(&self.rbuf, max) {
                Scan::Complete { wire_len, .. } => return Ok(wire_len),
                Scan::TooLarge { payload_len } => {
                    return Err(ConnError::TooLarge {
                        len: payload_len,
                        max,
                    })
                }
                Scan::Incomplete => {
                    self.fill().await?;
                }
            }
        }
    }

    /// Reads one logical packet.
    pub async fn read_packet(&mut self, max: usize) -> Result<Packet, ConnError> {
        let wire_len = self.buffer_packet(max).await?;
        let wire = self.rbuf.split_to(wire_len);
        let last_seq = last_seq(&wire);
        let payload = match frame::logical_payload(&wire) {
            std::borrow::Cow::Borrowed(_) => {
                let mut wire = wire;
                let _ = wire.split_to(frame::HEADER_LEN);
                wire.freeze()
            }
            std::borrow::Cow::Owned(v) => Bytes::from(v),
        };
        Ok(Packet {
            payload,
            seq: last_seq,
        })
    }

    pub async fn write_packet(&mut self, payload: &[u8], seq: u8) -> Result<(), ConnError> {
        let out = frame::packet(payload, seq);
        self.stream.write_all(&out).await?;
        Ok(())
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }
}

fn last_seq(wire: &[u8]) -> u8 {
    let mut pos = 0;
    let mut seq = 0;
    while let Some(h) = frame::parse_header(&wire[pos..]) {
        seq = h.seq;
        pos += h.packet_len();
        if !h.continues() || pos >= wire.len() {
            break;
        }
    }
    seq
}
