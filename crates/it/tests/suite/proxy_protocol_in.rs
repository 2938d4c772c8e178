//! A load balancer in front of holdfast (issue 18, item 10): from `trusted_proxies` a
//! connection starts with a PROXY protocol header, and the client address in it is the
//! client's for the per-address limits, the accounts' host patterns (holdfast's own check
//! and the server's, through the header holdfast sends on), `/status` and the logs. A
//! header from any other address is refused; IPv6 clients share the limits of their /64.

use holdfast_it::raw::{server_err, RawConn, BASE_CAPS};
use holdfast_it::{have, Harness, Options};
use holdfast_lab::procs;
use holdfast_wire::proxy_protocol::v2_header;
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The load balancer's address in these tests.
const PROXY: &str = "127.0.0.2";

fn with_trusted_proxy(per_ip: usize) -> Harness {
    Harness::start_with(Options::default().config(move |c| {
        c.proxy.trusted_proxies = vec![PROXY.parse().expect("network")];
        c.proxy.max_connections_per_ip = per_ip;
        c.proxy.handshake_timeout_ms = 2_000;
    }))
}

/// A TCP connection to `to` from the loopback address `source`.
fn tcp_from(to: SocketAddr, source: &str) -> TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{source}:0").parse().expect("address");
    socket.bind(&local.into()).expect("bind");
    socket.connect(&to.into()).expect("connect");
    socket.into()
}

/// A connection from `source` that first writes `header`, then reads the greeting.
fn relayed(h: &Harness, source: &str, header: &[u8]) -> anyhow::Result<RawConn> {
    let mut s = tcp_from(h.proxy, source);
    s.write_all(header)?;
    RawConn::greet_on(s)
}

/// A v2 header that says the connection is relayed for `client`.
fn header_for(h: &Harness, client: &str) -> Vec<u8> {
    v2_header(client.parse().expect("client address"), h.proxy)
}

fn refused_with(e: &anyhow::Error) -> (u16, String) {
    let e = server_err(e).unwrap_or_else(|| panic!("an ERR from holdfast: {e:#}"));
    (e.code, e.message.clone())
}

/// The carried address is the one the host check applies, holdfast's and the server's:
/// `x@'10.1.2.3'` logs in only when the header says 10.1.2.3. v1 headers work too.
#[test]
fn the_carried_address_is_the_one_accounts_are_checked_against() {
    let h = with_trusted_proxy(0);
    h.root_sql(
        "CREATE USER 'x'@'10.1.2.3' IDENTIFIED BY 'x_pw'; \
         GRANT SELECT ON *.* TO 'x'@'10.1.2.3'",
    );
    let mut c = relayed(&h, PROXY, &header_for(&h, "10.1.2.3:40000")).expect("greeting");
    c.login("x", "x_pw", None, BASE_CAPS)
        .expect("x logs in from 10.1.2.3");
    assert_eq!(
        c.query_value("SELECT USER()").unwrap().as_deref(),
        Some("x@10.1.2.3"),
        "the server saw the carried address"
    );
    let sessions = h.status_json()["sessions"].clone();
    assert!(
        sessions
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["client"] == "10.1.2.3:40000"),
        "/status shows the carried address: {sessions}"
    );
    // The same account from another carried address: refused, as the server would.
    let mut c2 = relayed(&h, PROXY, &header_for(&h, "10.9.9.9:40000")).expect("greeting");
    let e = c2
        .login("x", "x_pw", None, BASE_CAPS)
        .expect_err("x@'10.1.2.3' must not log in from 10.9.9.9");
    assert_eq!(refused_with(&e).0, 1045, "{e:#}");
    // Version 1.
    let v1 = format!("PROXY TCP4 10.1.2.3 127.0.0.1 40001 {}\r\n", h.proxy.port());
    let mut c3 = relayed(&h, PROXY, v1.as_bytes()).expect("greeting");
    c3.login("x", "x_pw", None, BASE_CAPS)
        .expect("x logs in through a v1 header");
    assert_eq!(
        c3.query_value("SELECT USER()").unwrap().as_deref(),
        Some("x@10.1.2.3")
    );
}

/// A header from an address not in `trusted_proxies` is refused with 1130 after the
/// greeting (its sender wrote it before the greeting came); a trusted sender must send
/// one (1043 in place of the greeting when it does not in time, or sends garbage).
#[test]
fn a_header_from_an_untrusted_address_is_refused_and_a_trusted_one_must_send_one() {
    let h = with_trusted_proxy(0);
    let mut c = relayed(&h, "127.0.0.3", &header_for(&h, "10.1.2.3:40000"))
        .expect("the greeting comes first");
    let e = c
        .login(h.user(), h.password(), None, BASE_CAPS)
        .expect_err("the header must be refused");
    let (code, message) = refused_with(&e);
    assert_eq!(code, 1130, "{message}");
    assert!(message.contains("127.0.0.3"), "{message}");
    assert!(message.contains("trusted_proxies"), "{message}");
    // Version 1 too.
    let v1 = format!("PROXY TCP4 10.1.2.3 127.0.0.1 40001 {}\r\n", h.proxy.port());
    let mut c = relayed(&h, "127.0.0.3", v1.as_bytes()).expect("greeting");
    let e = c
        .login(h.user(), h.password(), None, BASE_CAPS)
        .unwrap_err();
    assert_eq!(refused_with(&e).0, 1130);
    // A plain client from an untrusted address logs in as always.
    let mut plain = relayed(&h, "127.0.0.3", b"").expect("greeting");
    plain
        .login(h.user(), h.password(), None, BASE_CAPS)
        .expect("a client without a header");

    // From the trusted address: no header within the handshake timeout, or a bad one.
    let e = relayed(&h, PROXY, b"")
        .map(|_| ())
        .expect_err("no greeting without a header");
    let (code, message) = refused_with(&e);
    assert_eq!(code, 1043, "{message}");
    assert!(message.contains("PROXY protocol header"), "{message}");
    let e = relayed(&h, PROXY, b"PROXY TCP4 10.1.2.3\r\n")
        .map(|_| ())
        .expect_err("a malformed header");
    let (code, message) = refused_with(&e);
    assert_eq!(code, 1043, "{message}");
    assert!(message.contains("malformed"), "{message}");
    // A LOCAL header (a health check) speaks for the balancer itself.
    let mut local = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    local.extend_from_slice(&[0x20, 0x00, 0, 0]);
    let mut c = relayed(&h, PROXY, &local).expect("greeting after a LOCAL header");
    c.login(h.user(), h.password(), None, BASE_CAPS)
        .expect("the balancer's own login");
    assert_eq!(
        c.query_value("SELECT USER()")
            .unwrap()
            .map(|u| u.ends_with("@127.0.0.2")),
        Some(true)
    );
}

/// Per-address limits count the carried addresses: two clients behind one balancer each
/// get `max_connections_per_ip`, and IPv6 clients share the limit of their /64.
#[test]
fn clients_behind_one_balancer_get_limits_of_their_own() {
    let h = with_trusted_proxy(1);
    let login = |client: &str| -> anyhow::Result<RawConn> {
        let mut c = relayed(&h, PROXY, &header_for(&h, client))?;
        c.login(h.user(), h.password(), None, BASE_CAPS)?;
        Ok(c)
    };
    let _a = login("10.0.0.1:1000").expect("client A");
    let _b = login("10.0.0.2:1000").expect("client B: a limit of its own");
    let e = login("10.0.0.1:1001")
        .map(|_| ())
        .expect_err("client A's second connection is over its limit");
    let (code, message) = refused_with(&e);
    assert_eq!(code, 1040, "{message}");
    assert!(message.contains("10.0.0.1"), "{message}");
    // IPv6: one /64 is one client.
    let _c = login("[2001:db8:1:2::1]:1000").expect("an IPv6 client");
    let e = login("[2001:db8:1:2::ffff]:1000")
        .map(|_| ())
        .expect_err("the same /64");
    assert_eq!(refused_with(&e).0, 1040);
    let _d = login("[2001:db8:1:3::1]:1000").expect("another /64");
    // A v4-mapped address is the IPv4 address.
    let e = login("[::ffff:10.0.0.2]:1000")
        .map(|_| ())
        .expect_err("client B again, v4-mapped");
    assert_eq!(refused_with(&e).0, 1040);
}

/// HAProxy stopped on drop.
struct Haproxy(Child);

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// HAProxy on a free port, relaying to holdfast from 127.0.0.2 with `send-proxy-v2`.
fn haproxy_in_front(h: &Harness) -> (Haproxy, SocketAddr) {
    let port = procs::free_ports(1).expect("a free port")[0];
    let cfg = std::env::temp_dir().join(format!("holdfast-it-haproxy-{port}.cfg"));
    std::fs::write(
        &cfg,
        format!(
            "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1m\n    timeout server 1m\n\n\
             frontend mysql\n    bind 127.0.0.1:{port}\n    default_backend holdfast\n\n\
             backend holdfast\n    source {PROXY}\n    server holdfast {} send-proxy-v2\n",
            h.proxy
        ),
    )
    .expect("haproxy.cfg");
    let child = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy");
    let guard = Haproxy(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pid = guard.0.id();
    procs::wait_tcp(&addr, Duration::from_secs(10), || procs::is_alive(pid))
        .expect("HAProxy listens");
    (guard, addr)
}

/// A real client through HAProxy from `source`.
fn through_haproxy(h: &Harness, at: SocketAddr, source: &str) -> mysql::Result<Conn> {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url"))
        .ip_or_hostname(Some(at.ip().to_string()))
        .tcp_port(at.port())
        .prefer_socket(false)
        .bind_address(Some(SocketAddr::new(source.parse().expect("ip"), 0)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts)
}

/// The same through HAProxy (`send-proxy-v2`) with real clients: the server and
/// `max_connections_per_ip` see each client's own address, not HAProxy's.
#[test]
fn behind_haproxy_each_client_is_itself() {
    if !have("haproxy") {
        eprintln!("haproxy is not installed; skipped");
        return;
    }
    let h = with_trusted_proxy(1);
    let (_haproxy, at) = haproxy_in_front(&h);
    let mut a = through_haproxy(&h, at, "127.0.0.3").expect("client A through HAProxy");
    let mut b = through_haproxy(&h, at, "127.0.0.4").expect("client B: a limit of its own");
    let user = |c: &mut Conn| -> String { c.query_first("SELECT USER()").unwrap().unwrap() };
    assert_eq!(user(&mut a), format!("{}@127.0.0.3", h.user()));
    assert_eq!(user(&mut b), format!("{}@127.0.0.4", h.user()));
    match through_haproxy(&h, at, "127.0.0.3") {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!(e.code, 1040, "{e:?}");
            assert!(e.message.contains("127.0.0.3"), "{e:?}");
        }
        Err(other) => panic!("expected ERR 1040, got {other:?}"),
        Ok(_) => panic!("client A's second connection is over its limit"),
    }
}

/// A `[[listener]]`'s own `trusted_proxies` replaces `[proxy]`'s: the balancer's header is
/// taken there and refused on the main listener, which trusts no one.
#[test]
fn a_listener_trusts_the_proxies_it_names() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.listeners.push(holdfast_config::ListenerConfig {
            listen: "127.0.0.1:0".into(),
            mode: Default::default(),
            routing: Default::default(),
            trusted_proxies: Some(vec![PROXY.parse().expect("network")]),
        });
    }));
    let listener = h.listeners[0];
    let mut s = tcp_from(listener, PROXY);
    s.write_all(&v2_header("10.1.2.3:40000".parse().unwrap(), listener))
        .unwrap();
    let mut c = RawConn::greet_on(s).expect("greeting");
    c.login(h.user(), h.password(), None, BASE_CAPS)
        .expect("login through the listener's trusted proxy");
    assert_eq!(
        c.query_value("SELECT USER()").unwrap(),
        Some(format!("{}@10.1.2.3", h.user()))
    );
    let mut c = relayed(&h, PROXY, &header_for(&h, "10.1.2.3:40000")).expect("greeting");
    let e = c
        .login(h.user(), h.password(), None, BASE_CAPS)
        .expect_err("the main listener trusts no proxy");
    assert_eq!(refused_with(&e).0, 1130);
}
