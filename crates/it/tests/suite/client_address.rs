//! The client's own address reaches the server (PROXY protocol v2 to the backends): the
//! server applies its host-based accounts to the client, not to holdfast's address.

use holdfast_it::raw::{server_err, RawConn, BASE_CAPS};
use holdfast_it::{metric, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::net::SocketAddr;
use std::time::Duration;

/// A client connection to holdfast from `source` (a loopback address other than
/// holdfast's own 127.0.0.1).
fn connect_from(h: &Harness, source: &str, user: &str, password: &str) -> mysql::Result<Conn> {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url"))
        .user(Some(user))
        .pass(Some(password))
        .prefer_socket(false)
        .bind_address(Some(SocketAddr::new(source.parse().expect("ip"), 0)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts)
}

fn server_side_user(c: &mut Conn) -> String {
    c.query_first::<String, _>("SELECT USER()")
        .unwrap()
        .expect("a row")
}

#[test]
fn the_server_sees_the_clients_address_and_keeps_seeing_it_after_a_move() {
    let h = Harness::start_with(Options::default().replicas(1));
    let mut c = connect_from(&h, "127.0.0.2", h.user(), h.password()).unwrap();
    assert_eq!(server_side_user(&mut c), format!("{}@127.0.0.2", h.user()));

    h.switch_over_to("node2");
    // The session moved to node2 with a new backend connection: the header went there too.
    assert_eq!(server_side_user(&mut c), format!("{}@127.0.0.2", h.user()));
    let node: String = c.query_first("SELECT @@hostname").unwrap().expect("a row");
    assert!(!node.is_empty());
    let moved = h.status().counters.sessions_moved;
    assert!(moved >= 1, "the session moved ({moved})");
}

#[test]
fn an_account_for_holdfasts_address_only_is_refused_to_another_client() {
    let h = Harness::start();
    h.root_sql(
        "CREATE USER 'local_only'@'127.0.0.1' IDENTIFIED BY 'lo_pass'; \
         GRANT SELECT ON *.* TO 'local_only'@'127.0.0.1'",
    );
    // From 127.0.0.1 (holdfast's own address) the account is the client's: allowed.
    let mut ok = connect_from(&h, "127.0.0.1", "local_only", "lo_pass").unwrap();
    assert_eq!(server_side_user(&mut ok), "local_only@127.0.0.1");
    // From 127.0.0.2 the server must refuse it, as it would directly.
    let e = connect_from(&h, "127.0.0.2", "local_only", "lo_pass")
        .map(|_| ())
        .expect_err("a client from 127.0.0.2 must not log in as 'local_only'@'127.0.0.1'");
    match e {
        mysql::Error::MySqlError(m) => assert_eq!(m.code, 1045, "{m:?}"),
        other => panic!("expected ERR 1045, got {other:?}"),
    }
}

#[test]
fn without_the_proxy_protocol_a_login_that_depends_on_the_host_is_refused() {
    let h = Harness::start_with(Options::default().config(|c| {
        for b in &mut c.backends {
            b.proxy_protocol = false;
        }
    }));
    let before = h.status().verifier_accounts;
    h.root_sql(
        "CREATE USER 'local_only'@'127.0.0.1' IDENTIFIED BY 'lo_pass'; \
         GRANT SELECT ON *.* TO 'local_only'@'127.0.0.1'",
    );
    // Logins from holdfast's own address are what the server would see anyway: allowed.
    // Each one also makes holdfast re-read the accounts until it knows the new one.
    wait_for(
        "holdfast to load the new account",
        Duration::from_secs(20),
        || {
            let mut c = connect_from(&h, "127.0.0.1", "local_only", "lo_pass").ok()?;
            assert_eq!(server_side_user(&mut c), "local_only@127.0.0.1");
            (h.status().verifier_accounts > before).then_some(())
        },
    );
    // From 127.0.0.2 the server would see 127.0.0.1 and let the client in under an account
    // that is not its own: holdfast refuses, as the server would directly.
    let e = connect_from(&h, "127.0.0.2", "local_only", "lo_pass")
        .map(|_| ())
        .expect_err("a login relying on holdfast's address must be refused");
    match e {
        mysql::Error::MySqlError(m) => assert_eq!(m.code, 1045, "{m:?}"),
        other => panic!("expected ERR 1045, got {other:?}"),
    }
    // An account for any host does not depend on it.
    let mut c = connect_from(&h, "127.0.0.2", h.user(), h.password()).unwrap();
    assert_eq!(server_side_user(&mut c), format!("{}@127.0.0.1", h.user()));
}

/// A raw connection to `to` from the loopback address `source`, logged in as `user`.
fn raw_from(to: SocketAddr, source: &str, user: &str, password: &str) -> RawConn {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{source}:0").parse().expect("address");
    socket.bind(&local.into()).expect("bind");
    socket.connect(&to.into()).expect("connect");
    let mut c = RawConn::greet_on(socket.into()).expect("greeting");
    c.login(user, password, None, BASE_CAPS).expect("login");
    c
}

/// What a client from 127.0.0.2 sees when it changes user to an account that exists only
/// for 127.0.0.1: each attempt's answer (code and message), then who it is and whether its
/// user variable survived.
fn change_user_from_elsewhere(
    h: &Harness,
    to: SocketAddr,
) -> (Vec<(u16, String)>, Option<String>, Option<String>) {
    let mut c = raw_from(to, "127.0.0.2", h.user(), h.password());
    c.query("SET @kept = 1").expect("SET");
    let answers = (0..4)
        .map(|_| {
            let e = c
                .change_user("boss", "boss_pw", "")
                .expect_err("change-user to an account for 127.0.0.1 only must be refused");
            let e = server_err(&e).unwrap_or_else(|| panic!("a server ERR: {e:#}"));
            (e.code, e.message.clone())
        })
        .collect();
    let who = c
        .query_value("SELECT CURRENT_USER()")
        .expect("still connected");
    let kept = c.query_value("SELECT @kept").expect("still connected");
    (answers, who, kept)
}

/// COM_CHANGE_USER applies the server's account/host rule to the client's own address, as
/// a login does: without the PROXY protocol the server would see holdfast's 127.0.0.1 and
/// accept `boss`, whose only account is `boss@127.0.0.1`; holdfast refuses as the server
/// refuses a direct client from 127.0.0.2, with the same answers (1045 three times, then
/// 1047), leaves the session as the server leaves it (logged in as before, reset), and
/// counts the failures like a login's.
#[test]
fn change_user_to_an_account_of_another_host_is_refused_as_directly() {
    let h = Harness::start_with(Options::default().config(|c| {
        for b in &mut c.backends {
            b.proxy_protocol = false;
        }
    }));
    let before = h.status().verifier_accounts;
    h.root_sql(
        "CREATE USER 'boss'@'127.0.0.1' IDENTIFIED BY 'boss_pw'; \
         GRANT ALL ON *.* TO 'boss'@'127.0.0.1'",
    );
    wait_for(
        "holdfast to load the new account",
        Duration::from_secs(20),
        || {
            let mut c = connect_from(&h, "127.0.0.1", "boss", "boss_pw").ok()?;
            assert_eq!(server_side_user(&mut c), "boss@127.0.0.1");
            (h.status().verifier_accounts > before).then_some(())
        },
    );
    let direct = change_user_from_elsewhere(&h, h.direct());
    let denied = "Access denied for user 'boss'@'127.0.0.2' (using password: YES)".to_string();
    assert_eq!(
        direct.0,
        vec![
            (1045, denied.clone()),
            (1045, denied.clone()),
            (1045, denied),
            (1047, "Unknown command".into())
        ],
        "directly"
    );
    assert_eq!(
        direct.1.as_deref(),
        Some(format!("{}@%", h.user()).as_str())
    );
    assert_eq!(direct.2, None, "the session is reset");
    let failed = || metric(&h.metrics(), "holdfast_logins_failed_total").unwrap_or(0.0);
    let failed_before = failed();
    let through = change_user_from_elsewhere(&h, h.proxy);
    assert_eq!(through, direct, "through holdfast vs directly");
    assert_eq!(
        failed() - failed_before,
        4.0,
        "each refused change-user counts as a failed login"
    );
    // A user no account is for: the server's refusal names the client's address.
    let unknown = |to| {
        let mut c = raw_from(to, "127.0.0.2", h.user(), h.password());
        let e = c
            .change_user("nobody_here", "pw", "")
            .expect_err("no such account");
        server_err(&e).map(|e| (e.code, e.message.clone()))
    };
    let direct = unknown(h.direct());
    assert_eq!(
        direct,
        Some((
            1045,
            "Access denied for user 'nobody_here'@'127.0.0.2' (using password: YES)".into()
        ))
    );
    assert_eq!(unknown(h.proxy), direct, "through holdfast vs directly");
}

#[test]
fn connections_to_the_nodes_leave_from_the_backend_source_address() {
    // The nodes take the PROXY header from holdfast's configured source address.
    let h = Harness::start_with(
        Options::default()
            .server_args(&["--proxy-protocol-networks=127.0.0.1,127.0.0.9"])
            .config(|c| c.proxy.backend_source_address = Some("127.0.0.9".parse().expect("ip"))),
    );
    let monitor = h.shared.config().auth.monitor_user.clone();
    let mut c = connect_from(&h, "127.0.0.2", h.user(), h.password()).unwrap();
    // The session's connection carried the client's address in its header...
    assert_eq!(server_side_user(&mut c), format!("{}@127.0.0.2", h.user()));
    // ...and holdfast's own (monitor, HA) come from 127.0.0.9.
    let hosts = wait_for(
        "the monitor's connections on the primary",
        Duration::from_secs(20),
        || {
            let rows = h.root_sql(&format!(
                "SELECT HOST FROM information_schema.PROCESSLIST WHERE USER = '{monitor}'"
            ));
            (!rows.is_empty()).then_some(rows)
        },
    );
    for row in &hosts {
        let host = row.first().map(String::as_str).unwrap_or_default();
        assert!(
            host.starts_with("127.0.0.9:"),
            "a monitor connection from {host}, not 127.0.0.9: {hosts:?}"
        );
    }
    let n: i64 = c.query_first("SELECT 1").unwrap().expect("a row");
    assert_eq!(n, 1);
}
