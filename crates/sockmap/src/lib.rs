//! Relaying two TCP sockets to each other in the kernel.
//!
//! A pass-through connection, once holdfast has logged the client in, is bytes both ways
//! and nothing to parse: copying them through user space costs two reads, two writes and
//! a thread wake-up per round trip. With a [`KernelRelay`] the client's socket and its
//! backend socket go into a BPF sockhash (`BPF_MAP_TYPE_SOCKHASH`) keyed by each socket's
//! cookie, the value under a socket's cookie being its partner; a stream verdict program
//! attached to the map (see [`program`]) redirects every byte that arrives on one socket
//! to the other's send side. User space only waits for either socket to end: a peer's
//! FIN still wakes it (`read` returns 0), and [`KernelRelay::unsplice`] takes the pair
//! out of the map, after which bytes reach user space again.
//!
//! The map, with its program attached, lives as long as any descriptor of it: a process
//! that replaces this one (an upgrade) is handed the descriptor with the sockets and
//! [`KernelRelay::adopt`]s it; the relays go on in the kernel meanwhile.
//!
//! Needs `CAP_BPF` and `CAP_NET_ADMIN` (root), a kernel with sockmap (4.20+; a verdict
//! program without a stream parser: 5.8+), and `kernel.unprivileged_bpf_disabled` does not
//! matter to root. [`KernelRelay::new`] says why when it cannot.

pub mod bpf;
pub mod hangup;
pub mod program;

pub use hangup::{Hangup, HangupWatcher, OnHangup, Watched};

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// The most pairs one relay holds (two entries each).
const MAX_PAIRS: u32 = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum SockmapError {
    #[error("creating the BPF sockhash failed: {0} (needs root: CAP_BPF and CAP_NET_ADMIN)")]
    Map(io::Error),
    #[error("loading the BPF verdict program failed: {0}")]
    Program(io::Error),
    #[error("attaching the verdict program to the sockhash failed: {0}")]
    Attach(io::Error),
    #[error("putting the sockets in the sockhash failed: {0}")]
    Splice(io::Error),
    #[error("reading a socket's cookie failed: {0}")]
    Cookie(io::Error),
    #[error("the descriptor handed over is not a sockhash: {0}")]
    NotASockhash(io::Error),
}

/// A sockhash with the redirecting verdict program attached.
#[derive(Debug)]
pub struct KernelRelay {
    map: OwnedFd,
    id: u32,
}

/// Two sockets relayed to each other by a [`KernelRelay`]: their cookies, to take them
/// out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spliced {
    a: u64,
    b: u64,
}

impl KernelRelay {
    /// A new sockhash with the program loaded and attached. The program's descriptor is
    /// closed here: the map holds the program.
    pub fn new() -> Result<KernelRelay, SockmapError> {
        let map = bpf::create_sockhash(2 * MAX_PAIRS).map_err(SockmapError::Map)?;
        let insns = program::redirect_to_partner(map.as_raw_fd());
        let prog = bpf::load_sk_skb(&insns).map_err(SockmapError::Program)?;
        bpf::attach_verdict(map.as_fd(), prog.as_fd()).map_err(SockmapError::Attach)?;
        let id = bpf::map_id(map.as_fd()).map_err(SockmapError::Map)?;
        Ok(KernelRelay { map, id })
    }

    /// The relay whose map `map` is (a descriptor another process handed over).
    pub fn adopt(map: OwnedFd) -> Result<KernelRelay, SockmapError> {
        let id = bpf::map_id(map.as_fd()).map_err(SockmapError::NotASockhash)?;
        Ok(KernelRelay { map, id })
    }

    /// The map, to hand it to another process.
    pub fn map_fd(&self) -> BorrowedFd<'_> {
        self.map.as_fd()
    }

    /// The kernel's id of the map: the same in every process that holds it.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Relays `a` and `b` to each other from now on. Whatever either has received and
    /// not read yet stays for user space to read (read it before, or after
    /// [`KernelRelay::unsplice`]).
    pub fn splice(&self, a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> Result<Spliced, SockmapError> {
        let pair = Spliced {
            a: socket_cookie(a).map_err(SockmapError::Cookie)?,
            b: socket_cookie(b).map_err(SockmapError::Cookie)?,
        };
        bpf::update(self.map.as_fd(), pair.a, b).map_err(SockmapError::Splice)?;
        if let Err(e) = bpf::update(self.map.as_fd(), pair.b, a) {
            let _ = bpf::delete(self.map.as_fd(), pair.a);
            return Err(SockmapError::Splice(e));
        }
        Ok(pair)
    }

    /// The pair `a` and `b` make (spliced already, by this process or the one it
    /// replaced), to take them out later.
    pub fn pair_of(&self, a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> Result<Spliced, SockmapError> {
        Ok(Spliced {
            a: socket_cookie(a).map_err(SockmapError::Cookie)?,
            b: socket_cookie(b).map_err(SockmapError::Cookie)?,
        })
    }

    /// Takes the pair out of the map: bytes that arrive from now on reach user space.
    pub fn unsplice(&self, pair: Spliced) {
        for key in [pair.a, pair.b] {
            // (Gone already when its socket closed: the kernel drops closed sockets.)
            let _ = bpf::delete(self.map.as_fd(), key);
        }
    }
}

/// The socket's cookie (`SO_COOKIE`): a number the kernel gives each socket, unique while
/// the system runs.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are live locals the call writes to, `len` saying how
    // much room `cookie` has; `fd` is a descriptor borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            &mut cookie as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The bytes the TCP socket has received so far (`tcpi_bytes_received`, whoever read
/// them: user space or the kernel relay).
pub fn bytes_received(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // struct tcp_info, read as bytes: `tcpi_bytes_received` is the u64 at offset 128
    // (after the u8 fields, 24 u32 fields, and the u64s pacing_rate, max_pacing_rate and
    // bytes_acked); Linux 4.1 and later fill it.
    const OFFSET: usize = 128;
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` and `len` are live locals the call writes to, `len` saying how much
    // room `info` has; `fd` is a descriptor borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = usize::try_from(len).unwrap_or(0);
    let bytes = info
        .get(OFFSET..OFFSET + 8)
        .filter(|_| got >= OFFSET + 8)
        .ok_or_else(|| io::Error::other("tcp_info has no tcpi_bytes_received"))?;
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes);
    Ok(u64::from_ne_bytes(word))
}

#[cfg(test)]
mod tests;
