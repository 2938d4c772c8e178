//! The hand-over channel between an old and a new holdfast process: a unix stream socket
//! carrying framed messages (a little-endian `u32` length, then a JSON body), each with
//! the file descriptors it hands over riding on its first byte (`SCM_RIGHTS`).
//!
//! Both take the stream by shared reference: one task may read while another writes (the
//! overlap's questions go both ways, see [`super::peer`]). At most one task reads, and
//! writers take turns (a message is several writes).

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The most descriptors one message carries (a session: its client socket, the primary's
/// and a few replicas').
pub const MAX_FDS: usize = 16;

/// The largest body a message may have.
pub const MAX_BODY: usize = 64 << 20;

/// A message received: its body and the descriptors that came with it.
#[derive(Debug)]
pub struct Received {
    pub body: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Sends one message: `body` framed, `fds` on its first byte.
pub async fn send(stream: &UnixStream, body: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    if fds.len() > MAX_FDS || body.len() > MAX_BODY {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a hand-over message of {} bytes with {} descriptors is too large",
                body.len(),
                fds.len()
            ),
        ));
    }
    let len = (body.len() as u32).to_le_bytes();
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(std::io::Error::other("no room for the descriptors"));
            }
            let iov = [IoSlice::new(&len), IoSlice::new(body)];
            sendmsg(stream, &iov, &mut control, SendFlags::NOSIGNAL).map_err(std::io::Error::from)
        })
        .await?;
    // The descriptors went with the first byte; the rest is plain bytes.
    let frame_len = len.len() + body.len();
    if sent < frame_len {
        let rest: Vec<u8> = len.iter().chain(body.iter()).skip(sent).copied().collect();
        write_all(stream, &rest).await?;
    }
    Ok(())
}

async fn write_all(stream: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn read_exact(stream: &UnixStream, mut into: &mut [u8]) -> std::io::Result<()> {
    while !into.is_empty() {
        stream.readable().await?;
        match stream.try_read(into) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => into = &mut into[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Receives one message; `None` at the end of the stream before one began.
pub async fn recv(stream: &UnixStream) -> std::io::Result<Option<Received>> {
    let mut len = [0u8; 4];
    let mut fds = Vec::new();
    // The first byte, with whatever descriptors ride on it.
    let first = stream
        .async_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut len[..1])];
            let got = recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
                .map_err(std::io::Error::from)?;
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            Ok(got)
        })
        .await?;
    if first.bytes == 0 {
        return Ok(None);
    }
    if first.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a hand-over message carried more descriptors than expected",
        ));
    }
    read_exact(stream, &mut len[1..]).await?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_BODY {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a hand-over message of {n} bytes"),
        ));
    }
    let mut body = vec![0u8; n];
    read_exact(stream, &mut body).await?;
    Ok(Some(Received { body, fds }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn messages_carry_their_descriptors() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (mut left, right) = std::os::unix::net::UnixStream::pair().expect("pair");
        let big = vec![7u8; 300_000];
        let sent = big.clone();
        // (Larger than the socket's buffer: sent while the other side reads.)
        let sender = tokio::spawn(async move {
            let fd = right.as_fd();
            send(&a, b"first", &[fd]).await.expect("send");
            send(&a, b"", &[]).await.expect("send");
            let other = dup(&right);
            send(&a, &sent, &[other.as_fd(), fd]).await.expect("send");
        });
        let m = recv(&b).await.expect("recv").expect("a message");
        assert_eq!(m.body, b"first");
        assert_eq!(m.fds.len(), 1);
        // The descriptor received is the same socket.
        let mut passed =
            std::os::unix::net::UnixStream::from(m.fds.into_iter().next().expect("fd"));
        passed.write_all(b"x").expect("write");
        let mut got = [0u8; 1];
        left.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"x");
        let m = recv(&b).await.expect("recv").expect("a message");
        assert!(m.body.is_empty() && m.fds.is_empty());
        let m = recv(&b).await.expect("recv").expect("a message");
        assert_eq!(m.body, big);
        assert_eq!(m.fds.len(), 2);
        sender.await.expect("the sender");
        assert!(recv(&b).await.expect("recv").is_none());
    }

    fn dup(s: &std::os::unix::net::UnixStream) -> OwnedFd {
        s.as_fd().try_clone_to_owned().expect("dup")
    }
}
