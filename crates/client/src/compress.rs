//! The MySQL compressed protocol as a stream adapter: [`Compressed`] wraps a connection's
//! stream once the login is done, so everything above it reads and writes plain packets.
//! The framing is `holdfast_wire::compressed`'s.
//!
//! The compressed sequence id restarts with each command: a server continues from the last
//! id it read; a client starts each command at 0. Written bytes are buffered and go out,
//! compressed, on flush (every writer in holdfast ends a message with a flush).

use crate::conn::BoxedIo;
use bytes::BytesMut;
use holdfast_wire::compressed;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Written bytes buffered before they are compressed and sent without waiting for a flush.
const WRITE_BATCH: usize = 64 * 1024;

/// Which end of the connection holdfast is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Role {
    /// Towards a server: each command (a packet with sequence id 0) restarts the
    /// compressed sequence at 0.
    Client,
    /// Towards a client: answers continue the client's sequence.
    Server,
}

pub struct Compressed {
    inner: BoxedIo,
    role: Role,
    /// The plain packet stream being written (client role): the header being read, where
    /// it started in `pending`, and how much of the current payload is still to come.
    header: [u8; 4],
    header_len: usize,
    header_at: usize,
    in_payload: usize,
    /// Compressed bytes read and not yet decoded.
    raw: BytesMut,
    /// Decoded bytes; those from `plain_pos` on are not yet handed to the reader.
    plain: Vec<u8>,
    plain_pos: usize,
    /// Bytes written and not yet compressed.
    pending: Vec<u8>,
    /// Compressed bytes; those from `out_pos` on are not yet written to `inner`.
    out: Vec<u8>,
    out_pos: usize,
    /// The sequence id of the next compressed packet written.
    seq: u8,
}

/// Puts the compressed protocol under `conn` (after its login, when CLIENT_COMPRESS was
/// negotiated): bytes already buffered are compressed ones and go to the adapter.
pub fn start(conn: &mut crate::conn::PacketConn, role: Role) {
    let (stream, buffered) = conn.take_stream();
    conn.replace_stream(Box::new(Compressed::new(stream, buffered, role)));
}

/// A compressed stream's state between two messages, as one process hands it to the next
/// (`holdfast ctl upgrade`): each compressed packet is a whole zlib stream, so only the
/// sequence and the compressed bytes read and not decoded yet remain.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct CompressedState {
    role: Role,
    seq: u8,
    /// Compressed bytes read from the stream under it and not decoded yet.
    raw: Vec<u8>,
}

impl CompressedState {
    /// Bytes that were read from under the stream after those it had (a TLS layer's
    /// plaintext nobody read).
    pub fn append_raw(&mut self, bytes: &[u8]) {
        self.raw.extend_from_slice(bytes);
    }
}

impl Compressed {
    /// The stream under the compression.
    pub fn inner(&self) -> &dyn crate::conn::Io {
        self.inner.as_ref()
    }

    /// Whether nothing is in flight: no written byte waits to be compressed or sent, and
    /// no message is half written.
    pub fn can_take(&self) -> bool {
        self.pending.is_empty()
            && self.out_pos == self.out.len()
            && self.header_len == 0
            && self.in_payload == 0
    }

    /// Takes the adapter apart (check [`Compressed::can_take`] first): the stream under
    /// it, its state, and the decoded bytes nobody read yet.
    pub fn into_parts(self) -> (BoxedIo, CompressedState, Vec<u8>) {
        let plain = self.plain[self.plain_pos..].to_vec();
        (
            self.inner,
            CompressedState {
                role: self.role,
                seq: self.seq,
                raw: self.raw.to_vec(),
            },
            plain,
        )
    }

    /// Continues a compressed stream over `inner` from `state`.
    pub fn resume(inner: BoxedIo, state: CompressedState) -> Compressed {
        let mut c = Compressed::new(inner, BytesMut::from(&state.raw[..]), state.role);
        c.seq = state.seq;
        c
    }

    /// `buffered`: compressed bytes already read from `inner` (the client may send its first
    /// command right behind the login).
    pub fn new(inner: BoxedIo, buffered: BytesMut, role: Role) -> Compressed {
        Compressed {
            inner,
            role,
            header: [0; 4],
            header_len: 0,
            header_at: 0,
            in_payload: 0,
            raw: buffered,
            plain: Vec::new(),
            plain_pos: 0,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            seq: 0,
        }
    }

    /// Decodes one whole compressed packet from `raw` into `plain`, if one is there.
    fn decode_one(&mut self) -> io::Result<bool> {
        let Some(len) = compressed::complete_len(&self.raw) else {
            return Ok(false);
        };
        if self.plain_pos == self.plain.len() {
            self.plain.clear();
            self.plain_pos = 0;
        }
        let packet = self.raw.split_to(len);
        let seq = compressed::decode(&packet, &mut self.plain)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.seq = seq.wrapping_add(1);
        Ok(true)
    }

    fn encode_pending(&mut self) -> io::Result<()> {
        self.encode(self.pending.len())
    }

    /// Compresses the first `n` pending bytes into `out`.
    fn encode(&mut self, n: usize) -> io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        compressed::encode(&self.pending[..n], &mut self.seq, &mut self.out);
        self.pending.drain(..n);
        Ok(())
    }

    /// Appends written bytes to `pending`, following the plain packets (client role): a
    /// packet with sequence id 0 starts a command, whose compressed packets start at 0.
    fn take_written(&mut self, mut rest: &[u8]) -> io::Result<()> {
        if self.role == Role::Server {
            self.pending.extend_from_slice(rest);
            return Ok(());
        }
        while !rest.is_empty() {
            if self.in_payload > 0 {
                let n = self.in_payload.min(rest.len());
                self.pending.extend_from_slice(&rest[..n]);
                self.in_payload -= n;
                rest = &rest[n..];
                continue;
            }
            if self.header_len == 0 {
                self.header_at = self.pending.len();
            }
            self.header[self.header_len] = rest[0];
            self.header_len += 1;
            self.pending.push(rest[0]);
            rest = &rest[1..];
            if self.header_len == 4 {
                self.header_len = 0;
                self.in_payload = usize::from(self.header[0])
                    | usize::from(self.header[1]) << 8
                    | usize::from(self.header[2]) << 16;
                if self.header[3] == 0 {
                    // What came before keeps its numbering.
                    self.encode(self.header_at)?;
                    self.seq = 0;
                }
            }
        }
        Ok(())
    }

    /// Writes `out` to `inner` until it is empty or `inner` would block.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.out.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.out_pos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Compressed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.plain_pos < this.plain.len() {
                let n = (this.plain.len() - this.plain_pos).min(buf.remaining());
                buf.put_slice(&this.plain[this.plain_pos..this.plain_pos + n]);
                this.plain_pos += n;
                return Poll::Ready(Ok(()));
            }
            if this.decode_one()? {
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of stream: a packet cut short is the peer's problem to report.
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => this.raw.extend_from_slice(read.filled()),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Compressed {
    /// Sends everything written so far (compressed) to `inner`.
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match self.poll_drain(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            if self.pending.is_empty() {
                return Poll::Ready(Ok(()));
            }
            self.encode_pending()?;
        }
    }
}

impl AsyncWrite for Compressed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.len() >= WRITE_BATCH {
            match this.poll_send_pending(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        this.take_written(buf)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.poll_send_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn round_trip_small_and_large_with_sequence_ids() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut left = Compressed::new(Box::new(a), BytesMut::new(), Role::Server);
        let mut right = Compressed::new(Box::new(b), BytesMut::new(), Role::Server);
        let small = b"short".to_vec();
        let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 7) as u8).collect();
        for msg in [&small, &large] {
            left.write_all(msg).await.unwrap();
            left.flush().await.unwrap();
            let mut got = vec![0; msg.len()];
            right.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, msg);
            // The answer continues the sender's sequence.
            right.write_all(b"ok").await.unwrap();
            right.flush().await.unwrap();
            let mut ok = [0u8; 2];
            left.read_exact(&mut ok).await.unwrap();
            assert_eq!(&ok, b"ok");
            assert_eq!(left.seq, right.seq);
        }
    }

    /// A client's commands (plain sequence id 0) each start at compressed id 0; a LOCAL
    /// INFILE file (plain ids continuing) continues the compressed sequence.
    #[tokio::test]
    async fn client_role_restarts_the_sequence_at_each_command() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut client = Compressed::new(Box::new(a), BytesMut::new(), Role::Client);
        let mut server = Compressed::new(Box::new(b), BytesMut::new(), Role::Server);
        let packet = |seq: u8, body: &[u8]| {
            let mut p = vec![body.len() as u8, 0, 0, seq];
            p.extend_from_slice(body);
            p
        };
        for round in 0..3u8 {
            // The header split across two writes.
            let cmd = packet(0, b"\x03SELECT 1");
            client.write_all(&cmd[..2]).await.unwrap();
            client.write_all(&cmd[2..]).await.unwrap();
            client.flush().await.unwrap();
            let mut got = vec![0; cmd.len()];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!(got, cmd);
            assert_eq!(
                server.seq, 1,
                "round {round}: the command went out as compressed id 0"
            );
            server.write_all(&packet(1, b"\xfb")).await.unwrap();
            server.flush().await.unwrap();
            let mut ask = [0u8; 5];
            client.read_exact(&mut ask).await.unwrap();
            assert_eq!(client.seq, 2);
            client.write_all(&packet(2, b"file")).await.unwrap();
            client.flush().await.unwrap();
            let mut file = [0u8; 8];
            server.read_exact(&mut file).await.unwrap();
            assert_eq!(server.seq, 3, "the file continues the sequence");
            server.write_all(&packet(3, b"\x00\x00\x00")).await.unwrap();
            server.flush().await.unwrap();
            let mut ok = [0u8; 7];
            client.read_exact(&mut ok).await.unwrap();
        }
    }
}
