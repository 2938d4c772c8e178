//! Floods and password guessing: silent sockets from one address cannot take every
//! connection slot, and repeated wrong passwords are answered later and later.

use holdfast_it::{metric, Harness, Options};
use mysql::{Conn, Opts, OptsBuilder};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A TCP connection to `to` from the loopback address `from`.
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{from}:0").parse().expect("address");
    socket.bind(&local.into()).expect("bind");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

/// The first packet holdfast sends on `s`: its payload's first byte tells a greeting (10)
/// from an ERR (0xff).
fn first_packet(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut header = [0u8; 4];
    s.read_exact(&mut header).expect("a packet");
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).expect("its payload");
    payload
}

fn mysql_login(h: &Harness, from: &str, password: &str) -> mysql::Result<Conn> {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url"))
        .pass(Some(password))
        .prefer_socket(false)
        .bind_address(Some(format!("{from}:0").parse::<SocketAddr>().unwrap()))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts)
}

#[test]
fn silent_sockets_from_one_address_do_not_lock_out_other_clients() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.proxy.max_connections = 100;
        c.proxy.max_pending_logins_per_ip = 40;
        c.proxy.handshake_timeout_ms = 60_000;
    }));
    let proxy = h.proxy;
    // 150 connections that never log in, from 127.0.0.3: more than max_connections.
    let mut silent: Vec<TcpStream> = (0..150).map(|_| connect_from("127.0.0.3", proxy)).collect();
    let mut greeted = 0;
    let mut refused = 0;
    for s in &mut silent {
        match first_packet(s).first() {
            Some(10) => greeted += 1,
            Some(0xff) => refused += 1,
            other => panic!("unexpected first packet {other:?}"),
        }
    }
    assert_eq!(
        greeted, 40,
        "only max_pending_logins_per_ip of them are held"
    );
    assert_eq!(refused, 110);
    // A real client elsewhere still gets in, while the 40 are still held.
    let mut c = mysql_login(&h, "127.0.0.2", h.password()).expect("a client from 127.0.0.2");
    use mysql::prelude::Queryable;
    assert_eq!(c.query_first::<i64, _>("SELECT 1").unwrap(), Some(1));
    drop(silent);
}

#[test]
fn wrong_passwords_are_answered_later_and_later() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.proxy.login_failure_delay_ms = 300;
        c.proxy.max_login_failure_delay_ms = 2_000;
    }));
    let wrong = |expect_at_least: Duration| {
        let started = Instant::now();
        let e = mysql_login(&h, "127.0.0.4", "not the password")
            .map(|_| ())
            .expect_err("a wrong password is refused");
        match e {
            mysql::Error::MySqlError(m) => assert_eq!(m.code, 1045, "{m:?}"),
            other => panic!("expected ERR 1045, got {other:?}"),
        }
        let took = started.elapsed();
        assert!(
            took >= expect_at_least,
            "refusal after {took:?}, expected at least {expect_at_least:?}"
        );
    };
    for _ in 0..3 {
        wrong(Duration::ZERO);
    }
    wrong(Duration::from_millis(300));
    wrong(Duration::from_millis(600));
    let delayed = metric(&h.metrics(), "holdfast_logins_delayed_total").unwrap_or(0.0);
    assert_eq!(delayed, 2.0);
    // The right password still works (after its own wait) and clears the count.
    mysql_login(&h, "127.0.0.4", h.password()).expect("the right password");
    wrong(Duration::ZERO);
    let delayed = metric(&h.metrics(), "holdfast_logins_delayed_total").unwrap_or(0.0);
    assert_eq!(delayed, 2.0, "no delay right after a successful login");
}

fn login_as(h: &Harness, user: &str, password: &str) -> mysql::Result<Conn> {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url"))
        .user(Some(user))
        .pass(Some(password))
        .prefer_socket(false)
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts)
}

fn refusal(r: mysql::Result<Conn>) -> (u16, String) {
    match r.map(|_| ()).expect_err("the login is refused") {
        mysql::Error::MySqlError(m) => (m.code, m.message),
        other => panic!("expected an ERR packet, got {other:?}"),
    }
}

#[test]
fn an_unknown_user_is_answered_like_a_wrong_password_without_a_backend_connection() {
    let h = Harness::start();
    let before = h.status().counters.backend_connects;
    let (code, message) = refusal(login_as(&h, "nobody_here", "guess"));
    assert_eq!(code, 1045);
    assert_eq!(
        message,
        "Access denied for user 'nobody_here'@'127.0.0.1' (using password: YES)"
    );
    let (known_code, known_message) = refusal(login_as(&h, h.user(), "guess"));
    assert_eq!(known_code, code, "the same answer for a known user");
    assert_eq!(
        known_message.replace(h.user(), "nobody_here"),
        message,
        "the same wording"
    );
    assert_eq!(
        h.status().counters.backend_connects,
        before,
        "no backend connection for a user that does not exist"
    );
}

#[test]
fn accounts_created_just_before_their_first_login_log_in() {
    let h = Harness::start();
    for name in ["newcomer_1", "newcomer_2", "newcomer_3"] {
        h.root_sql(&format!(
            "CREATE USER '{name}'@'%' IDENTIFIED BY 'pw_{name}'; GRANT SELECT ON *.* TO '{name}'@'%'"
        ));
        let mut c = login_as(&h, name, &format!("pw_{name}"))
            .unwrap_or_else(|e| panic!("{name} logs in right after CREATE USER: {e}"));
        use mysql::prelude::Queryable;
        assert_eq!(c.query_first::<i64, _>("SELECT 1").unwrap(), Some(1));
    }
}

#[test]
fn an_idle_client_is_closed_after_client_idle_timeout_secs_and_a_busy_one_is_not() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.proxy.client_idle_timeout_secs = 1;
    }));
    use mysql::prelude::Queryable;
    let mut idle = login_as(&h, h.user(), h.password()).unwrap();
    let mut busy = login_as(&h, h.user(), h.password()).unwrap();
    assert_eq!(idle.query_first::<i64, _>("SELECT 1").unwrap(), Some(1));
    // The busy one sends a statement every 300 ms for 3 s; the idle one sends nothing.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(busy.query_first::<i64, _>("SELECT 2").unwrap(), Some(2));
        std::thread::sleep(Duration::from_millis(300));
    }
    holdfast_it::wait_for(
        "holdfast to close the idle session",
        Duration::from_secs(10),
        || (h.shared.sessions.len() == 1).then_some(()),
    );
    assert!(
        idle.query_first::<i64, _>("SELECT 1").is_err(),
        "the idle connection was closed"
    );
    assert_eq!(busy.query_first::<i64, _>("SELECT 3").unwrap(), Some(3));
    let m = h.metrics();
    assert_eq!(
        metric(
            &m,
            "holdfast_sessions_closed_by_holdfast_total{reason=\"idle_timeout\"}"
        ),
        Some(1.0),
        "{m}"
    );
}

/// Issue 18, item 10: clients looping over unknown user names do not stall a real login.
/// Each unknown name makes holdfast read the accounts again; those reads were taken one
/// after the other, each waiting out `verifier_miss_refresh_ms` under one lock, so a new
/// account's first login queued behind every guess (4.99 s with four loopers, the login
/// deadline 5 s). Now waiting logins share one read. With a 2.5 s handshake deadline the
/// new account still logs in, again and again, while four loopers guess names.
#[test]
fn guessed_user_names_do_not_stall_a_real_login() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.proxy.handshake_timeout_ms = 2_500;
    }));
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (h, stop) = (&h, &stop);
            s.spawn(move || {
                let mut i = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let _ = login_as(h, &format!("guess_{t}_{i}"), "x");
                }
            });
        }
        // The loopers are at it before the account exists.
        std::thread::sleep(Duration::from_millis(1500));
        for n in 0..3 {
            let name = format!("fresh_{n}");
            h.root_sql(&format!(
                "CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'; GRANT SELECT ON *.* TO '{name}'@'%'"
            ));
            let login = login_as(&h, &name, "pw");
            stop.store(n == 2, std::sync::atomic::Ordering::Relaxed);
            let mut c = login.unwrap_or_else(|e| {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("{name}'s first login, with four clients guessing names: {e}")
            });
            use mysql::prelude::Queryable;
            assert_eq!(c.query_first::<i64, _>("SELECT 1").unwrap(), Some(1));
        }
    });
}
