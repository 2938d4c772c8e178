//! Real sockets on loopback, relayed in the kernel (the test runs as root, as CI does).

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// A client's connection to a "proxy" and the proxy's connection to a "server":
/// (client, proxy's client side, proxy's server side, server).
fn two_connections() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
    let proxy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = TcpListener::bind("127.0.0.1:0").expect("bind");
    let client = TcpStream::connect(proxy.local_addr().expect("addr")).expect("connect");
    let (a, _) = proxy.accept().expect("accept");
    let b = TcpStream::connect(server.local_addr().expect("addr")).expect("connect");
    let (s, _) = server.accept().expect("accept");
    for t in [&client, &s, &a, &b] {
        t.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
    }
    (client, a, b, s)
}

#[test]
fn bytes_go_both_ways_in_the_kernel_and_user_space_sees_the_end() {
    let relay = KernelRelay::new().expect("a kernel relay (run as root)");
    let (mut client, a, b, mut server) = two_connections();
    let received = (
        bytes_received(a.as_fd()).expect("tcp_info"),
        bytes_received(b.as_fd()).expect("tcp_info"),
    );
    let pair = relay.splice(a.as_fd(), b.as_fd()).expect("spliced");

    client.write_all(b"hello").expect("write");
    let mut buf = [0u8; 64];
    let n = server.read(&mut buf).expect("read");
    assert_eq!(&buf[..n], b"hello");
    // A large answer, in many segments.
    let big = vec![7u8; 1 << 20];
    let writer = std::thread::spawn(move || {
        server.write_all(&big).expect("write");
        server
    });
    let mut got = vec![0u8; 1 << 20];
    client.read_exact(&mut got).expect("the whole answer");
    assert!(got.iter().all(|&x| x == 7));
    let server = writer.join().expect("writer");
    // Counted by TCP, though user space read none of it.
    assert_eq!(bytes_received(a.as_fd()).expect("tcp_info") - received.0, 5);
    assert_eq!(
        bytes_received(b.as_fd()).expect("tcp_info") - received.1,
        1 << 20
    );

    // The server closes: the proxy's side reads the end.
    drop(server);
    b.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = b;
    assert_eq!(b.read(&mut buf).expect("the end"), 0);
    relay.unsplice(pair);
}

#[test]
fn taken_out_of_the_map_bytes_reach_user_space_again() {
    let relay = KernelRelay::new().expect("a kernel relay (run as root)");
    let (mut client, mut a, b, mut server) = two_connections();
    let pair = relay.splice(a.as_fd(), b.as_fd()).expect("spliced");
    client.write_all(b"1").expect("write");
    let mut buf = [0u8; 8];
    assert_eq!(server.read(&mut buf).expect("read"), 1);
    relay.unsplice(pair);
    client.write_all(b"2").expect("write");
    assert_eq!(a.read(&mut buf).expect("read in user space"), 1);
    assert_eq!(&buf[..1], b"2");
}

#[test]
fn an_adopted_map_relays_the_pairs_it_holds() {
    let relay = KernelRelay::new().expect("a kernel relay (run as root)");
    let (mut client, a, b, mut server) = two_connections();
    let _pair = relay.splice(a.as_fd(), b.as_fd()).expect("spliced");
    let handed = relay.map_fd().try_clone_to_owned().expect("dup");
    let id = relay.id();
    drop(relay);
    let adopted = KernelRelay::adopt(handed).expect("adopted");
    assert_eq!(adopted.id(), id);
    client.write_all(b"on").expect("write");
    let mut buf = [0u8; 8];
    assert_eq!(server.read(&mut buf).expect("read"), 2);
    // A descriptor that is not a sockhash is refused.
    let not_a_map: OwnedFd = a.try_clone().expect("dup").into();
    assert!(KernelRelay::adopt(not_a_map).is_err());
}

#[test]
fn the_watcher_hears_the_end_and_not_the_bytes() {
    let relay = KernelRelay::new().expect("a kernel relay (run as root)");
    let watcher = HangupWatcher::start().expect("a watcher");
    let (mut client, a, b, mut server) = two_connections();
    let _pair = relay.splice(a.as_fd(), b.as_fd()).expect("spliced");
    let (heard, on) = counter();
    let _wa = watcher.watch(a.as_fd(), on.clone()).expect("watch");
    let _wb = watcher.watch(b.as_fd(), on).expect("watch");
    let mut buf = [0u8; 8];
    for _ in 0..200 {
        client.write_all(b"ping").expect("write");
        server.read_exact(&mut buf[..4]).expect("read");
        server.write_all(b"pong").expect("write");
        client.read_exact(&mut buf[..4]).expect("read");
    }
    assert_eq!(
        heard.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no call for bytes"
    );
    drop(client);
    wait_for(&heard, 1, "the end was not heard");
}

/// Counts the calls of a callback; waits for a count with a deadline.
fn counter() -> (Arc<std::sync::atomic::AtomicUsize>, OnHangup) {
    let heard = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let on = {
        let heard = heard.clone();
        Arc::new(move || {
            heard.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }) as OnHangup
    };
    (heard, on)
}

fn wait_for(heard: &std::sync::atomic::AtomicUsize, n: usize, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while heard.load(std::sync::atomic::Ordering::SeqCst) < n {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_socket_watched_for_reading_calls_once_for_the_first_bytes_and_at_once_if_they_wait() {
    let watcher = HangupWatcher::start().expect("a watcher");
    let (mut client, a, _b, _server) = two_connections();
    let (heard, on) = counter();
    let watched = watcher
        .watch_readable(a.as_fd(), on.clone())
        .expect("watch");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        heard.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing to read yet"
    );
    client.write_all(b"ping").expect("write");
    wait_for(&heard, 1, "the first bytes were not heard");
    client.write_all(b"more").expect("write");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        heard.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one call until watched again"
    );
    drop(watched);
    // Watched again with bytes unread: the call comes at once.
    let _again = watcher.watch_readable(a.as_fd(), on).expect("watch");
    wait_for(&heard, 2, "bytes waiting when watched again were not heard");
}

#[test]
fn a_socket_watched_for_reading_calls_when_its_peer_closes() {
    let watcher = HangupWatcher::start().expect("a watcher");
    let (client, a, _b, _server) = two_connections();
    let (heard, on) = counter();
    let _watched = watcher.watch_readable(a.as_fd(), on).expect("watch");
    drop(client);
    wait_for(&heard, 1, "the end was not heard");
}

#[test]
fn the_table_of_callbacks_gives_back_its_room_when_a_wave_of_watched_sockets_ends() {
    let watcher = HangupWatcher::start().expect("a watcher");
    let (_client, a, _b, _server) = two_connections();
    let (_heard, on) = counter();
    // 600 sockets watched at once (each a descriptor of the same socket), then let go.
    let fds: Vec<std::os::fd::OwnedFd> = (0..600)
        .map(|_| a.as_fd().try_clone_to_owned().expect("dup"))
        .collect();
    let watched: Vec<_> = fds
        .iter()
        .map(|fd| {
            watcher
                .watch_readable(fd.as_fd(), on.clone())
                .expect("watch")
        })
        .collect();
    let peak = watcher.table_capacity();
    assert!(peak >= 600, "{peak}");
    drop(watched);
    let after = watcher.table_capacity();
    assert!(
        after <= 256,
        "the table kept room for {after} after a peak of {peak}"
    );
    // And serves on.
    let _again = watcher.watch_readable(a.as_fd(), on).expect("watch");
}
