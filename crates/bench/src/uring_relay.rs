//! A bare relay on io_uring, the `bare_uring_relay` target of `holdfast-bench bench`: one
//! thread, one ring; every connection's two directions each keep one receive or one send
//! in flight, and each turn of the loop submits all the new ones and reaps all the
//! finished ones in one `io_uring_enter`. It answers one question: how much of a
//! user-space relay's cost batching the system calls across connections takes away (the
//! bare tokio relay makes a `recv` and a `send` call per message and direction, plus
//! `epoll_wait`). Like the tokio one it parses nothing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use anyhow::{Context, Result};
use io_uring::{opcode, squeue, types, IoUring};

/// Bytes one direction reads at a time.
const BUFFER: usize = 16 * 1024;
/// Submission queue entries: each connection has at most two operations in flight.
const ENTRIES: u32 = 4096;
/// `user_data` of the accept; a direction's is `(slot << 1 | to_server) + 1`.
const ACCEPT: u64 = 0;

/// One direction of a relayed connection: reads `from`, writes what it read to `to`.
struct Direction {
    from: RawFd,
    to: RawFd,
    buf: Box<[u8]>,
    /// Bytes of `buf` read and not yet all sent; `sent` of them went.
    filled: usize,
    sent: usize,
    /// An operation of this direction is in the ring (its buffer must stay).
    in_flight: bool,
}

/// A client connection and its server connection; freed once it ended and neither
/// direction has an operation in the ring.
struct Pair {
    client: TcpStream,
    server: TcpStream,
    ways: [Direction; 2],
    ended: bool,
}

/// Relays until killed (or until the ring fails).
pub fn run(listen: SocketAddr, to: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(ENTRIES)
        .context("setting up io_uring")?;
    let mut pairs: Vec<Option<Box<Pair>>> = Vec::new();
    let mut accepting = false;
    loop {
        if !accepting {
            let accept = opcode::Accept::new(
                types::Fd(listener.as_raw_fd()),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
            .build()
            .user_data(ACCEPT);
            push(&mut ring, &accept)?;
            accepting = true;
        }
        ring.submit_and_wait(1).context("io_uring_enter")?;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, result) in done {
            if data == ACCEPT {
                accepting = false;
                if result >= 0 {
                    // SAFETY: a non-negative accept result is a new descriptor that nothing
                    // else owns; the stream takes it over and closes it.
                    let client =
                        unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(result) };
                    if let Some(slot) = open(&mut pairs, client, to) {
                        for way in 0..2 {
                            recv(&mut ring, &mut pairs, slot, way)?;
                        }
                    }
                }
                continue;
            }
            let slot = ((data - 1) >> 1) as usize;
            let way = ((data - 1) & 1) as usize;
            let Some(pair) = pairs.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let d = &mut pair.ways[way];
            d.in_flight = false;
            if pair.ended || result <= 0 {
                end(&mut pairs, slot);
                continue;
            }
            let n = result as usize;
            if d.filled == 0 {
                d.filled = n;
                d.sent = 0;
            } else {
                d.sent += n;
            }
            if d.sent < d.filled {
                send(&mut ring, &mut pairs, slot, way)?;
            } else {
                d.filled = 0;
                recv(&mut ring, &mut pairs, slot, way)?;
            }
        }
    }
}

/// Connects to the server for a new client and keeps the pair in a free slot.
fn open(pairs: &mut Vec<Option<Box<Pair>>>, client: TcpStream, to: SocketAddr) -> Option<usize> {
    let server = TcpStream::connect(to).ok()?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let way = |from: &TcpStream, to: &TcpStream| Direction {
        from: from.as_raw_fd(),
        to: to.as_raw_fd(),
        buf: vec![0; BUFFER].into_boxed_slice(),
        filled: 0,
        sent: 0,
        in_flight: false,
    };
    let pair = Box::new(Pair {
        ways: [way(&client, &server), way(&server, &client)],
        client,
        server,
        ended: false,
    });
    let slot = match pairs.iter().position(Option::is_none) {
        Some(free) => free,
        None => {
            pairs.push(None);
            pairs.len() - 1
        }
    };
    pairs[slot] = Some(pair);
    Some(slot)
}

/// Asks for the next bytes of a direction.
fn recv(
    ring: &mut IoUring,
    pairs: &mut [Option<Box<Pair>>],
    slot: usize,
    way: usize,
) -> Result<()> {
    submit(ring, pairs, slot, way, |d| {
        opcode::Recv::new(types::Fd(d.from), d.buf.as_mut_ptr(), BUFFER as u32).build()
    })
}

/// Sends what a direction read and has not sent yet.
fn send(
    ring: &mut IoUring,
    pairs: &mut [Option<Box<Pair>>],
    slot: usize,
    way: usize,
) -> Result<()> {
    submit(ring, pairs, slot, way, |d| {
        let rest = &d.buf[d.sent..d.filled];
        opcode::Send::new(types::Fd(d.to), rest.as_ptr(), rest.len() as u32).build()
    })
}

/// Queues the operation `make` builds for a direction of a live pair, marked in flight.
fn submit(
    ring: &mut IoUring,
    pairs: &mut [Option<Box<Pair>>],
    slot: usize,
    way: usize,
    make: impl FnOnce(&mut Direction) -> squeue::Entry,
) -> Result<()> {
    let Some(pair) = pairs[slot].as_mut() else {
        return Ok(());
    };
    let d = &mut pair.ways[way];
    let entry = make(d).user_data(user_data(slot, way));
    d.in_flight = true;
    push(ring, &entry)
}

/// Ends a pair: shuts both sockets (an operation still in the ring finishes with an error
/// or end of file), frees it when nothing of it is in the ring.
fn end(pairs: &mut [Option<Box<Pair>>], slot: usize) {
    let Some(pair) = pairs[slot].as_mut() else {
        return;
    };
    if !pair.ended {
        pair.ended = true;
        let _ = pair.client.shutdown(std::net::Shutdown::Both);
        let _ = pair.server.shutdown(std::net::Shutdown::Both);
    }
    if pair.ways.iter().all(|d| !d.in_flight) {
        pairs[slot] = None;
    }
}

fn user_data(slot: usize, way: usize) -> u64 {
    ((slot as u64) << 1 | way as u64) + 1
}

/// Queues an entry, submitting first when the queue is full.
fn push(ring: &mut IoUring, entry: &squeue::Entry) -> Result<()> {
    loop {
        // SAFETY: every entry pushed points at a buffer of a boxed `Pair` (or at nothing,
        // for the accept); a pair is freed only once none of its operations is in the ring
        // (`Direction::in_flight`, cleared when its completion is reaped), and its buffers
        // are boxed slices that do not move with the `Box<Pair>` or the vector of slots.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        ring.submit().context("io_uring_enter")?;
    }
}
