//! A primary an operator made read-only is no failover (issue 18, item 12): sessions stay,
//! logins go on at once, reads work and writes get the server's own 1290, as directly.
//! MariaDB's `main.read_only_innodb` does exactly this on the only server.

use holdfast_it::{wait_for, Harness, Options};
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// An account `read_only` stops (no SUPER, no READ_ONLY ADMIN), as in MariaDB's tests.
fn limited_account(h: &Harness) {
    h.root_sql(
        "CREATE USER 'ro_user'@'%' IDENTIFIED BY 'ro_pass'; \
         GRANT ALL PRIVILEGES ON sbtest.* TO 'ro_user'@'%'; \
         CREATE TABLE sbtest.ro_t (a INT PRIMARY KEY); INSERT INTO sbtest.ro_t VALUES (1)",
    );
}

/// `sql` as the limited account at `addr`: exit code, output and error text.
fn as_limited(h: &Harness, addr: SocketAddr, sql: &str) -> (Option<i32>, String, String) {
    let out = h.mariadb_as(addr, "ro_user", "ro_pass", &["-N", "-B", "-e", sql]);
    (out.code, out.stdout.trim().to_string(), out.stderr)
}

/// Directly and through holdfast, the same answers while the only server is read-only:
/// a login, a read, a write refused with 1290; then writable again.
fn same_as_direct(h: &Harness) {
    for addr in [h.direct(), h.proxy] {
        let (code, out, err) = as_limited(h, addr, "SELECT COUNT(*) FROM sbtest.ro_t");
        assert_eq!((code, out.as_str()), (Some(0), "1"), "{addr}: {err}");
        let (code, _, err) = as_limited(h, addr, "INSERT INTO sbtest.ro_t VALUES (2)");
        assert_eq!(code, Some(1), "{addr}: a write on a read-only server");
        assert!(err.contains("1290"), "{addr}: {err}");
    }
}

fn read_only_primary_test(h: Harness) {
    limited_account(&h);
    // A session open before (it stays on its server, as a direct one would).
    let mut before = mysql::Conn::new(
        mysql::OptsBuilder::new()
            .ip_or_hostname(Some(h.proxy.ip().to_string()))
            .tcp_port(h.proxy.port())
            .user(Some("ro_user"))
            .pass(Some("ro_pass")),
    )
    .expect("a session through holdfast");
    let id_before: u32 =
        mysql::prelude::Queryable::query_first(&mut before, "SELECT CONNECTION_ID()")
            .expect("connection id")
            .expect("a row");

    h.root_sql("SET GLOBAL read_only=1");
    // Logins right away, and after the monitor saw it.
    same_as_direct(&h);
    wait_for("/status to show a read-only primary", WAIT, || {
        let t = h.status_json()["topology"].clone();
        (t["read_only_primary"] == true && t["primary"] == "node1").then_some(())
    });
    same_as_direct(&h);
    let err =
        mysql::prelude::Queryable::query_drop(&mut before, "INSERT INTO sbtest.ro_t VALUES (3)")
            .expect_err("a write on a read-only server");
    assert!(err.to_string().contains("1290"), "{err}");
    let id_now: u32 = mysql::prelude::Queryable::query_first(&mut before, "SELECT CONNECTION_ID()")
        .expect("the session goes on")
        .expect("a row");
    assert_eq!(id_now, id_before, "the session stayed where it was");

    h.root_sql("SET GLOBAL read_only=0");
    for addr in [h.direct(), h.proxy] {
        let n = if addr == h.direct() { 10 } else { 11 };
        let (code, _, err) = as_limited(&h, addr, &format!("INSERT INTO sbtest.ro_t VALUES ({n})"));
        assert_eq!(code, Some(0), "{addr}: {err}");
    }
    mysql::prelude::Queryable::query_drop(&mut before, "INSERT INTO sbtest.ro_t VALUES (12)")
        .expect("writable again");
}

/// MariaDB's `main.read_only_innodb` on the only server.
#[test]
fn a_single_server_made_read_only_keeps_serving() {
    read_only_primary_test(Harness::start());
}

/// The same on the lab's primary with its replicas (managed HA: no failover either).
#[test]
fn a_primary_made_read_only_is_no_failover() {
    let h = Harness::start_with(Options::default().replicas(2));
    read_only_primary_test(h);
}
