//! Hostile and broken clients: each is dealt with, and nobody else notices.

use holdfast_it::raw::{
    self, open, read_packet_from, server_err, split_packets, wait_closed, Closing, RawConn,
    ServerErr, BASE_CAPS,
};
use holdfast_it::{metric, wait_for, Harness, Options};
use std::io::Write;
use std::time::Duration;

const CLOSE_DEADLINE: Duration = Duration::from_secs(20);

fn login(h: &Harness) -> RawConn {
    RawConn::connect(
        h.proxy,
        h.user(),
        h.password(),
        Some(h.database()),
        BASE_CAPS,
    )
    .expect("login")
}

fn errors_in(bytes: &[u8]) -> Vec<ServerErr> {
    split_packets(bytes)
        .into_iter()
        .filter(|p| p.first() == Some(&0xff))
        .map(|p| ServerErr::parse(&p).unwrap())
        .collect()
}

fn rejected(h: &Harness, reason: &str) -> f64 {
    metric(
        &h.metrics(),
        &format!("holdfast_client_connections_rejected_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn garbage_bytes_close_that_connection_only() {
    let h = Harness::start();
    // A logged-in client that keeps working throughout.
    let mut good = login(&h);
    let garbage: [&[u8]; 3] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", // a huge "packet length"
        &[5, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0x00], // a short, meaningless login packet
        &[0xff; 64],                          // 16 MiB length, seq 0xff
    ];
    for (i, g) in garbage.iter().enumerate() {
        let mut s = open(h.proxy).unwrap();
        let greeting = read_packet_from(&mut s).unwrap();
        assert_eq!(greeting.payload[0], 10, "a greeting first");
        // Meanwhile another client logs in from scratch.
        let other = std::thread::spawn({
            let (addr, user, pass) = (h.proxy, h.user().to_string(), h.password().to_string());
            move || {
                let mut c = RawConn::connect(addr, &user, &pass, Some("sbtest"), BASE_CAPS)
                    .expect("concurrent login");
                c.query_value("SELECT 40 + 2").unwrap()
            }
        });
        s.write_all(g).unwrap();
        match wait_closed(&mut s, CLOSE_DEADLINE) {
            Closing::Closed { bytes } => {
                for e in errors_in(&bytes) {
                    assert!(
                        matches!(e.code, 1043 | 1153 | 1835),
                        "garbage #{i}: unexpected {e}"
                    );
                }
            }
            Closing::StillOpen { bytes } => panic!(
                "garbage #{i}: connection still open after {CLOSE_DEADLINE:?} ({bytes:02x?})"
            ),
        }
        assert_eq!(other.join().unwrap().as_deref(), Some("42"));
        assert_eq!(good.query_value("SELECT 1").unwrap().as_deref(), Some("1"));
    }
    let m = h.metrics();
    let total: f64 = m
        .lines()
        .filter(|l| l.starts_with("holdfast_client_connections_rejected_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(total >= 3.0, "3 rejected connections expected in:\n{m}");
    let refused: f64 = ["bad_handshake", "packet_too_large", "malformed_packet"]
        .iter()
        .map(|r| rejected(&h, r))
        .sum();
    assert!(refused >= 3.0, "{m}");
}

#[test]
fn silent_client_is_closed_after_the_handshake_timeout() {
    let h = Harness::start_with(Options::default().config(|c| c.proxy.handshake_timeout_ms = 500));
    let mut silent = open(h.proxy).unwrap();
    let greeting = read_packet_from(&mut silent).unwrap();
    assert_eq!(greeting.payload[0], 10);
    // Another client that answers in time is not affected by the short timeout.
    let mut c = login(&h);
    match wait_closed(&mut silent, CLOSE_DEADLINE) {
        Closing::Closed { bytes } => assert!(
            bytes.is_empty() || !errors_in(&bytes).is_empty(),
            "{bytes:02x?}"
        ),
        Closing::StillOpen { .. } => {
            panic!("a silent client was not disconnected within {CLOSE_DEADLINE:?}")
        }
    }
    // A client that connects and sends nothing at all, not even reading the greeting.
    let mut mute = open(h.proxy).unwrap();
    assert!(matches!(
        wait_closed(&mut mute, CLOSE_DEADLINE),
        Closing::Closed { .. }
    ));
    // Half a login packet, then silence.
    let mut half = open(h.proxy).unwrap();
    read_packet_from(&mut half).unwrap();
    half.write_all(&[100, 0, 0, 1, 0x8d, 0xa6]).unwrap();
    assert!(
        matches!(
            wait_closed(&mut half, CLOSE_DEADLINE),
            Closing::Closed { .. }
        ),
        "half a login packet"
    );
    wait_for(
        "3 handshake timeouts counted",
        Duration::from_secs(5),
        || (rejected(&h, "handshake_timeout") >= 3.0).then_some(()),
    );
    assert_eq!(
        c.query_value("SELECT 'still here'").unwrap().as_deref(),
        Some("still here")
    );
}

#[test]
fn oversized_packet_gets_1153_then_close() {
    let h = Harness::start_with(Options::default().config(|c| c.proxy.max_packet_size = 64 * 1024));
    let mut c = login(&h);
    assert_eq!(c.query_value("SELECT 1").unwrap().as_deref(), Some("1"));
    // A request just under the limit still works.
    let ok_sql = format!("SELECT LENGTH('{}')", "a".repeat(60 * 1024));
    assert_eq!(c.query_value(&ok_sql).unwrap().as_deref(), Some("61440"));
    let mut big = vec![0x03];
    big.extend_from_slice(format!("SELECT '{}'", "b".repeat(100 * 1024)).as_bytes());
    c.command(&big).unwrap();
    match wait_closed(&mut c.stream, CLOSE_DEADLINE) {
        Closing::Closed { bytes } => {
            let errs = errors_in(&bytes);
            assert_eq!(errs.len(), 1, "one ERR expected, got {bytes:02x?}");
            assert_eq!(errs[0].code, 1153, "{}", errs[0]);
            assert_eq!(errs[0].state, "08S01");
        }
        Closing::StillOpen { bytes } => panic!("not closed after ERR: {bytes:02x?}"),
    }
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_errors_total{code=\"1153\"}"),
        Some(1.0),
        "{m}"
    );
    h.wait_sessions(0, Duration::from_secs(10));
    // New sessions are fine.
    let mut d = login(&h);
    d.ping().unwrap();
}

#[test]
fn unknown_command_gets_1047_and_the_session_goes_on() {
    let h = Harness::start();
    let mut c = login(&h);
    for cmd in [
        0x60u8, 0x08, /* COM_SHUTDOWN */
        0x12, /* COM_BINLOG_DUMP */
        0xfa,
    ] {
        c.command(&[cmd, 1, 2, 3]).unwrap();
        let p = c.read_packet().unwrap();
        assert_eq!(p.seq, 1);
        let e = ServerErr::parse(&p.payload)
            .unwrap_or_else(|_| panic!("ERR expected for {cmd:#x}, got {:02x?}", p.payload));
        assert_eq!(e.code, 1047, "command {cmd:#x}: {e}");
        assert_eq!(
            c.query_value("SELECT 1").unwrap().as_deref(),
            Some("1"),
            "after command {cmd:#x}"
        );
    }
    // An empty packet (no command byte at all) is an error, not a crash.
    c.command(&[]).unwrap();
    let p = c.read_packet().unwrap();
    assert_eq!(p.payload.first(), Some(&0xff), "{:02x?}", p.payload);
    assert_eq!(c.query_value("SELECT 2").unwrap().as_deref(), Some("2"));
    // The server is still up (COM_SHUTDOWN was not forwarded).
    assert_eq!(h.root_sql("SELECT 1"), vec![vec!["1".to_string()]]);
    let m = h.metrics();
    assert_eq!(
        metric(&m, "holdfast_errors_total{code=\"1047\"}"),
        Some(4.0),
        "{m}"
    );
}

#[test]
fn client_vanishing_mid_result_does_not_disturb_others() {
    let h = Harness::start();
    let mut other = login(&h);
    for round in 0..3 {
        let mut c = login(&h);
        h.wait_sessions(2, Duration::from_secs(10));
        c.command(b"\x03SELECT seq, REPEAT('x', 200) FROM seq_1_to_5000000")
            .unwrap();
        // Read a little of the result, then vanish.
        let first = c.read_packet().unwrap();
        assert_ne!(
            first.payload[0], 0xff,
            "round {round}: {:02x?}",
            first.payload
        );
        for _ in 0..100 {
            c.read_packet().unwrap();
        }
        drop(c);
        assert_eq!(
            other.query_value("SELECT 'alive'").unwrap().as_deref(),
            Some("alive")
        );
        h.wait_sessions(1, Duration::from_secs(30));
    }
    let mut d = login(&h);
    assert_eq!(
        d.query_value("SELECT COUNT(*) FROM seq_1_to_1000")
            .unwrap()
            .as_deref(),
        Some("1000")
    );
    drop(d);
    drop(other);
    h.wait_sessions(0, Duration::from_secs(30));
}

#[test]
fn malformed_login_gets_1043_or_close_never_a_hang() {
    // Without TLS configured, so that an SSL request is refused (tls.rs has the TLS cases).
    let h = Harness::start_with(Options::default().config(|c| {
        c.proxy.handshake_timeout_ms = 3000;
        c.tls = Default::default();
    }));
    let caps = BASE_CAPS.to_le_bytes();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty packet", vec![]),
        ("capabilities only", caps.to_vec()),
        (
            "pre-4.1 client",
            vec![0x85, 0x00, 0x00, 0x00, 0, 0, 0, 1, 45],
        ),
        ("cut after the filler", {
            let mut v = caps.to_vec();
            v.extend_from_slice(&[0, 0, 0, 1, 45]);
            v.extend_from_slice(&[0; 23]);
            v
        }),
        ("unterminated user name", {
            let mut v = caps.to_vec();
            v.extend_from_slice(&[0, 0, 0, 1, 45]);
            v.extend_from_slice(&[0; 23]);
            v.extend_from_slice(b"app");
            v
        }),
        ("auth length past the end", {
            let mut v = caps.to_vec();
            v.extend_from_slice(&[0, 0, 0, 1, 45]);
            v.extend_from_slice(&[0; 23]);
            v.extend_from_slice(b"app\0\xfc\xff\xff");
            v
        }),
    ];
    for (what, payload) in cases {
        let mut c = RawConn::greet(h.proxy).unwrap();
        c.write_packet(&payload, 1).unwrap();
        match wait_closed(&mut c.stream, CLOSE_DEADLINE) {
            Closing::Closed { bytes } => {
                for e in errors_in(&bytes) {
                    assert!(matches!(e.code, 1043 | 1045 | 1835), "{what}: {e}");
                }
            }
            Closing::StillOpen { bytes } => {
                panic!("{what}: still open after {CLOSE_DEADLINE:?}: {bytes:02x?}")
            }
        }
    }
    // An SSL request (holdfast offers no TLS) is refused, not hung.
    let mut c = RawConn::greet(h.proxy).unwrap();
    let mut ssl = (BASE_CAPS | holdfast_wire::caps::CLIENT_SSL)
        .to_le_bytes()
        .to_vec();
    ssl.extend_from_slice(&[0, 0, 0, 1, 45]);
    ssl.extend_from_slice(&[0; 23]);
    c.write_packet(&ssl, 1).unwrap();
    match wait_closed(&mut c.stream, CLOSE_DEADLINE) {
        Closing::Closed { bytes } => {
            let errs = errors_in(&bytes);
            assert_eq!(errs.len(), 1, "{bytes:02x?}");
            assert_eq!(errs[0].code, 1043);
        }
        Closing::StillOpen { .. } => panic!("SSL request: still open"),
    }
    let mut ok = RawConn::connect(h.proxy, h.user(), h.password(), None, BASE_CAPS).unwrap();
    ok.ping().unwrap();
}

#[test]
fn max_connections_exceeded_gives_1040() {
    let h = Harness::start_with(Options::default().config(|c| c.proxy.max_connections = 2));
    let a = login(&h);
    let mut b = login(&h);
    let e = RawConn::connect(h.proxy, h.user(), h.password(), None, BASE_CAPS)
        .map(|_| ())
        .unwrap_err();
    let se = server_err(&e).unwrap_or_else(|| panic!("ERR expected: {e:#}"));
    assert_eq!((se.code, se.state.as_str()), (1040, "08004"), "{se}");
    // The CLI reports it the usual way.
    let out = h.mariadb(h.proxy, &["-e", "SELECT 1"]);
    assert_eq!(out.code, Some(1));
    // (The CLI words it as "ERROR 2002 ... before completion of TLS handshake ... 1040 - Too
    // many connections", as it does for a server that refuses before its greeting.)
    assert!(
        out.stderr.contains("1040") && out.stderr.contains("Too many connections"),
        "{}",
        out.stderr
    );
    // The logged-in sessions are unaffected; once one leaves, a newcomer gets in.
    b.ping().unwrap();
    drop(a);
    let mut c = wait_for(
        "a free slot after a session ended",
        Duration::from_secs(20),
        || RawConn::connect(h.proxy, h.user(), h.password(), None, BASE_CAPS).ok(),
    );
    c.ping().unwrap();
    let m = h.metrics();
    assert!(
        metric(&m, "holdfast_errors_total{code=\"1040\"}").unwrap_or(0.0) >= 2.0,
        "{m}"
    );
    assert!(
        metric(
            &m,
            "holdfast_client_connections_rejected_total{reason=\"too_many_connections\"}"
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{m}"
    );
    let _ = raw::IO_TIMEOUT;
}
