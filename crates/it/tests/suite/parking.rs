//! Long-idle sessions park their sockets out of the async runtime's reactor (`parking.rs`:
//! less memory per idle session), plain TCP, TLS and the compressed protocol alike (a TLS
//! connection goes on with holdfast's own record layer once woken). Parking touches
//! nothing on the server: a parked session keeps its transaction, row locks, temporary
//! tables, user variables and prepared statements, answers its next request as before,
//! follows a switchover, and hears its client or its server leave while parked; a named
//! lock and LOCK TABLES stay held; a READ ONLY transaction and a server made read-only
//! while the session is parked answer as they do a connection straight to the server.

use holdfast_it::{metric, wait_for, Harness, Options};
use holdfast_proxy::config::BackendTlsConfig;
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

fn parked(h: &Harness) -> f64 {
    metric(&h.metrics(), "holdfast_idle_sockets_parked").unwrap_or(-1.0)
}

fn wait_parked(h: &Harness, n: f64) {
    if let Err(e) = holdfast_lab::wait_for("idle sockets parked", WAIT, || {
        (parked(h) == n).then_some(())
    }) {
        panic!("{e}: {} rather than {n}", parked(h));
    }
}

/// A connection straight to the lab's primary, waiting at most a second for a row lock.
fn straight_to_the_server(h: &Harness) -> Conn {
    let mut direct = Conn::new(
        OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(h.direct().port())
            .user(Some(h.user()))
            .pass(Some(h.password()))
            .prefer_socket(false),
    )
    .expect("a connection straight to the server");
    direct
        .query_drop("SET SESSION innodb_lock_wait_timeout = 1")
        .expect("set");
    direct
}

/// `update` waits for a row a parked session's transaction holds, and gives up (1205).
fn assert_row_held(direct: &mut Conn, update: &str) {
    let err = direct
        .query_drop(update)
        .expect_err("the parked session's transaction holds the row");
    assert!(err.to_string().contains("1205"), "{err}");
}

/// Writes 100,000 bytes into row 1 of `table` (its `v`) and reads them back: a request and
/// an answer of many packets (and TLS records) each.
fn large_request_and_answer(c: &mut Conn, table: &str) {
    let big = "x".repeat(100_000);
    c.exec_drop(format!("UPDATE {table} SET v = ? WHERE id = 1"), (&big,))
        .expect("a large request");
    let back: Option<String> = c
        .query_first(format!("SELECT v FROM {table} WHERE id = 1"))
        .expect("a large answer");
    assert_eq!(back.as_deref(), Some(big.as_str()));
}

/// The length of row 1's `v` in `table`, as the server has it committed.
fn assert_committed_length(h: &Harness, table: &str, length: &str) {
    let committed: Vec<String> = h
        .root_sql(&format!("SELECT LENGTH(v) FROM {table} WHERE id = 1"))
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(committed, [length], "the transaction committed");
}

/// Plain TCP to the nodes: both sockets of a session park.
fn plain_backend() -> Options {
    Options::default().config(|c| c.backend_tls = BackendTlsConfig::default())
}

#[test]
fn a_parked_session_keeps_its_transaction_locks_and_state_and_answers_as_before() {
    let h = Harness::start_with(plain_backend());
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.pk (id INT PRIMARY KEY, v INT)")
        .expect("create");
    c.query_drop("INSERT INTO sbtest.pk VALUES (1, 10)")
        .expect("insert");
    c.query_drop("CREATE TEMPORARY TABLE sbtest.pk_tmp (v INT)")
        .expect("temporary table");
    c.query_drop("INSERT INTO sbtest.pk_tmp VALUES (7)")
        .expect("insert");
    c.query_drop("SET @kept = 'parked', autocommit = 0")
        .expect("set");
    let stmt = c
        .prep("SELECT v + ? FROM sbtest.pk WHERE id = 1")
        .expect("prepare");
    // An open transaction that holds a row lock and changed the row.
    c.query_drop("UPDATE sbtest.pk SET v = 11 WHERE id = 1")
        .expect("update");
    wait_parked(&h, 2.0);

    // The row lock is held while parked: a connection straight to the server waits for it
    // and gives up.
    let mut direct = straight_to_the_server(&h);
    assert_row_held(&mut direct, "UPDATE sbtest.pk SET v = 99 WHERE id = 1");
    assert_eq!(
        parked(&h),
        2.0,
        "the wait of another connection woke nothing"
    );

    // Another session holds a named lock and LOCK TABLES, and parks too: both stay held,
    // as the server shows a connection straight to it.
    let mut locker = connect(&h);
    locker
        .query_drop("CREATE TABLE sbtest.pk_locked (v INT)")
        .expect("create");
    let got: Option<i64> = locker
        .query_first("SELECT GET_LOCK('pk_named', 0)")
        .expect("get_lock");
    assert_eq!(got, Some(1));
    locker
        .query_drop("LOCK TABLES sbtest.pk_locked WRITE")
        .expect("lock tables");
    wait_parked(&h, 4.0);
    let free: Option<i64> = direct
        .query_first("SELECT IS_FREE_LOCK('pk_named')")
        .expect("is_free_lock");
    assert_eq!(free, Some(0), "the parked session's named lock is held");
    direct
        .query_drop("SET SESSION lock_wait_timeout = 1")
        .expect("set");
    let err = direct
        .query_drop("SELECT * FROM sbtest.pk_locked")
        .expect_err("the parked session's table lock is held");
    assert!(err.to_string().contains("1205"), "{err}");
    let released: Option<i64> = locker
        .query_first("SELECT RELEASE_LOCK('pk_named')")
        .expect("release_lock");
    assert_eq!(released, Some(1), "woken, it still owns its named lock");
    locker.query_drop("UNLOCK TABLES").expect("unlock");
    drop((locker, direct));
    wait_parked(&h, 2.0);

    // Woken by its next request, the session answers from the same server session.
    let v: Option<i64> = c.exec_first(&stmt, (1,)).expect("execute");
    assert_eq!(
        v,
        Some(12),
        "the transaction's own change, through the prepared statement"
    );
    let kept: Option<String> = c.query_first("SELECT @kept").expect("select");
    assert_eq!(kept.as_deref(), Some("parked"));
    let tmp: Option<i64> = c
        .query_first("SELECT v FROM sbtest.pk_tmp")
        .expect("select");
    assert_eq!(tmp, Some(7));
    let autocommit: Option<i64> = c.query_first("SELECT @@autocommit").expect("select");
    assert_eq!(autocommit, Some(0));
    c.query_drop("COMMIT").expect("commit");
    let committed: Vec<String> = h
        .root_sql("SELECT v FROM sbtest.pk WHERE id = 1")
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(committed, ["11"], "the parked transaction committed");
    // Idle again, it parks again.
    wait_parked(&h, 2.0);
    let sessions = metric(&h.metrics(), "holdfast_sessions").unwrap_or(-1.0);
    assert_eq!(sessions, 1.0);
}

fn lost_while_idle(h: &Harness) -> f64 {
    metric(
        &h.metrics(),
        r#"holdfast_backend_connections_lost_total{reason="idle"}"#,
    )
    .unwrap_or(0.0)
}

#[test]
fn a_parked_session_hears_its_server_end_the_connection_and_its_client_leave() {
    let h = Harness::start_with(plain_backend());
    let mut c = connect(&h);
    let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("id");
    wait_parked(&h, 2.0);
    // The server ends the session's connection: the parked session hears it at once (its
    // client's socket parks again alone), and its client's next statement finds its
    // connection ended, as a direct client's would.
    h.root_sql(&format!("KILL {}", thread.expect("an id")));
    wait_for("the loss heard while idle", WAIT, || {
        (lost_while_idle(&h) == 1.0).then_some(())
    });
    wait_parked(&h, 1.0);
    assert!(
        c.query_drop("SELECT 1").is_err(),
        "the connection was killed"
    );
    wait_for("the killed session to end", WAIT, || {
        (metric(&h.metrics(), "holdfast_sessions") == Some(0.0)).then_some(())
    });
    assert_eq!(parked(&h), 0.0, "nothing stays parked");

    // A client that leaves while its session is parked.
    let c2 = connect(&h);
    wait_parked(&h, 2.0);
    drop(c2);
    wait_for("the session to end", WAIT, || {
        (metric(&h.metrics(), "holdfast_sessions") == Some(0.0)).then_some(())
    });
    assert_eq!(parked(&h), 0.0);
}

/// The lab's default config (TLS to the nodes, replay, markers): the client's socket and
/// the node's TLS connection park, and a switchover moves the parked session with its
/// state.
#[test]
fn a_parked_session_follows_a_switchover_with_its_state() {
    let h = Harness::start_with(Options::default().replicas(2));
    let mut c = connect(&h);
    c.query_drop("SET @i = 42, sql_mode = 'ANSI_QUOTES'")
        .expect("set");
    let stmt = c.prep("SELECT ? + 1").expect("prepare");
    let old: Option<u16> = c.query_first("SELECT @@port").expect("port");
    h.wait_captured();
    wait_parked(&h, 2.0);
    let node2 = h.switch_over_to("node2");
    // The switchover ended the session's connection to the old primary; the session heard
    // it while idle, parked its client's socket again, and moves with its next request.
    wait_for("the loss heard while idle", WAIT, || {
        (lost_while_idle(&h) >= 1.0).then_some(())
    });
    wait_parked(&h, 1.0);
    let port: Option<u16> = c.query_first("SELECT @@port").expect("port");
    assert_ne!(port, old);
    assert_eq!(port, Some(node2), "the session follows the primary");
    let state: Option<(i64, String)> = c.query_first("SELECT @i, @@sql_mode").expect("state");
    assert_eq!(state, Some((42, "ANSI_QUOTES".to_string())));
    let v: Option<i64> = c.exec_first(&stmt, (41,)).expect("execute");
    assert_eq!(v, Some(42));
}

/// A client over TLS, to a node over TLS (the lab's default config): both connections park
/// with their record layers' keys only, and the session goes on over holdfast's own record
/// layer once woken: its transaction and row lock held while parked, its state, large
/// answers and requests (many records each way), a second park and wake from that record
/// layer. A compressed client over TLS parks too; a TLS client that leaves while parked
/// ends its session.
#[test]
fn a_tls_session_parks_its_record_layers_and_goes_on_as_before() {
    let h = Harness::start();
    let ca = h.lab.status.ca.clone().expect("the lab writes a CA");
    let tls = |compress: bool| {
        let opts = OptsBuilder::new()
            .ip_or_hostname(Some(h.proxy.ip().to_string()))
            .tcp_port(h.proxy.port())
            .user(Some(h.user()))
            .pass(Some(h.password()))
            .db_name(Some(h.database()))
            .prefer_socket(false)
            .ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(ca.clone())),
            ));
        let opts = match compress {
            true => opts.compress(Some(mysql::Compression::default())),
            false => opts,
        };
        Conn::new(opts).expect("a TLS login through holdfast")
    };
    let mut c = tls(false);
    c.query_drop("CREATE TABLE sbtest.tp (id INT PRIMARY KEY, v LONGTEXT)")
        .expect("create");
    c.query_drop("INSERT INTO sbtest.tp VALUES (1, 'a')")
        .expect("insert");
    c.query_drop("SET @kept = 'under tls', autocommit = 0")
        .expect("set");
    let stmt = c
        .prep("SELECT LENGTH(v) + ? FROM sbtest.tp WHERE id = 1")
        .expect("prepare");
    let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("id");
    c.query_drop("UPDATE sbtest.tp SET v = 'bb' WHERE id = 1")
        .expect("update");
    wait_parked(&h, 2.0);

    // The row lock is held while parked.
    let mut direct = straight_to_the_server(&h);
    assert_row_held(&mut direct, "UPDATE sbtest.tp SET v = 'zz' WHERE id = 1");

    for round in 1..=2 {
        // Woken by its request: the same server session, still over TLS to the node.
        let v: Option<i64> = c.exec_first(&stmt, (round,)).expect("execute");
        let len = if round == 1 { 2 } else { 100_000 };
        assert_eq!(v, Some(len + round), "round {round}");
        let same: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("id");
        assert_eq!(same, thread, "the same server thread");
        let kept: Option<String> = c.query_first("SELECT @kept").expect("select");
        assert_eq!(kept.as_deref(), Some("under tls"));
        let cipher: Option<(String, String)> = c
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .expect("status");
        assert!(
            cipher.is_some_and(|(_, v)| !v.is_empty()),
            "the node's connection is TLS"
        );
        // A request and an answer of many records each.
        large_request_and_answer(&mut c, "sbtest.tp");
        // Idle again: both park again (from holdfast's record layer the second time).
        wait_parked(&h, 2.0);
    }
    c.query_drop("COMMIT").expect("commit");
    assert_committed_length(&h, "sbtest.tp", "100000");
    wait_parked(&h, 2.0);

    // The compressed protocol over TLS parks and goes on too.
    let mut z = tls(true);
    z.query_drop("SET @z = 'zipped'").expect("set");
    wait_parked(&h, 4.0);
    let got: Option<(String, u64)> = z
        .query_first("SELECT @z, SUM(LENGTH(REPEAT('z', seq))) FROM seq_1_to_3000")
        .expect("after parking");
    assert_eq!(got, Some(("zipped".to_string(), 4_501_500)));
    let status: Option<(String, String)> = z
        .query_first("SHOW SESSION STATUS LIKE 'Compression'")
        .expect("status");
    assert_eq!(status.map(|s| s.1).as_deref(), Some("ON"));
    wait_parked(&h, 4.0);

    // A TLS client that leaves while parked ends its session.
    drop(z);
    wait_for("the session to end", WAIT, || {
        (metric(&h.metrics(), "holdfast_sessions") == Some(1.0)).then_some(())
    });
    assert_eq!(parked(&h), 2.0);
    drop((c, direct));
    wait_for("the last session to end", WAIT, || {
        (metric(&h.metrics(), "holdfast_sessions") == Some(0.0)).then_some(())
    });
    assert_eq!(parked(&h), 0.0, "nothing stays parked");
}

/// A read-only transaction and a read-only server, parked over TLS (the lab's default
/// config): a parked session answers as a connection straight to the server does. Its
/// READ ONLY transaction still refuses a write (1792) and still reads what it began with;
/// with the server made read-only while the session is parked, its write is refused (1290)
/// as the direct connection's is.
#[test]
fn a_parked_read_only_transaction_and_a_read_only_server_answer_as_the_server_does() {
    let h = Harness::start();
    // An account `read_only` stops (no SUPER, no READ_ONLY ADMIN), as in MariaDB's tests.
    h.root_sql(
        "CREATE USER 'ro_user'@'%' IDENTIFIED BY 'ro_pass'; \
         GRANT ALL PRIVILEGES ON sbtest.* TO 'ro_user'@'%'; \
         CREATE TABLE sbtest.ro (id INT PRIMARY KEY, v INT); INSERT INTO sbtest.ro VALUES (1, 10)",
    );
    let as_limited = |addr: std::net::SocketAddr| {
        Conn::new(
            OptsBuilder::new()
                .ip_or_hostname(Some(addr.ip().to_string()))
                .tcp_port(addr.port())
                .user(Some("ro_user"))
                .pass(Some("ro_pass"))
                .prefer_socket(false),
        )
        .expect("the limited account logs in")
    };
    let mut c = as_limited(h.proxy);
    let mut direct = as_limited(h.direct());
    c.query_drop("START TRANSACTION READ ONLY").expect("begin");
    let v: Option<i64> = c
        .query_first("SELECT v FROM sbtest.ro WHERE id = 1")
        .expect("read");
    assert_eq!(v, Some(10));
    wait_parked(&h, 2.0);
    // Changed by another connection meanwhile: the snapshot the transaction read stays.
    direct
        .query_drop("UPDATE sbtest.ro SET v = 20 WHERE id = 1")
        .expect("a direct write");
    let err = c
        .query_drop("UPDATE sbtest.ro SET v = 30 WHERE id = 1")
        .expect_err("a read-only transaction refuses a write");
    let mut direct_ro = as_limited(h.direct());
    direct_ro
        .query_drop("START TRANSACTION READ ONLY")
        .expect("begin");
    let direct_err = direct_ro
        .query_drop("UPDATE sbtest.ro SET v = 30 WHERE id = 1")
        .expect_err("the server refuses it too");
    assert!(err.to_string().contains("1792"), "{err}");
    assert!(direct_err.to_string().contains("1792"), "{direct_err}");
    let v: Option<i64> = c
        .query_first("SELECT v FROM sbtest.ro WHERE id = 1")
        .expect("read");
    assert_eq!(v, Some(10), "the transaction's snapshot");
    c.query_drop("COMMIT").expect("commit");
    drop(direct_ro);

    // The server made read-only while the session is parked.
    wait_parked(&h, 2.0);
    h.root_sql("SET GLOBAL read_only = 1");
    let err = c
        .query_drop("UPDATE sbtest.ro SET v = 40 WHERE id = 1")
        .expect_err("a read-only server refuses the write");
    let direct_err = direct
        .query_drop("UPDATE sbtest.ro SET v = 40 WHERE id = 1")
        .expect_err("and the direct connection's");
    h.root_sql("SET GLOBAL read_only = 0");
    assert!(err.to_string().contains("1290"), "{err}");
    assert!(direct_err.to_string().contains("1290"), "{direct_err}");
    let v: Option<i64> = c
        .query_first("SELECT v FROM sbtest.ro WHERE id = 1")
        .expect("read");
    assert_eq!(v, Some(20), "neither write went through");
}

/// A split session (reads to the replicas, TLS to the nodes: the lab's default config with
/// `routing = "split"`) parks its replica connection with its own two. A read-only
/// transaction pinned to a replica keeps its snapshot while parked and goes on on the same
/// replica; the session's user variable and prepared read reach the replicas afterwards;
/// and a replica connection its server ends while parked costs the client nothing: its
/// next reads are answered.
#[test]
fn a_split_sessions_replica_connection_parks_with_it_and_goes_on() {
    let h = crate::split::split_harness(|_| {});
    let server_id = |name: &str| -> String {
        holdfast_lab::node_sql(h.node(name), "SELECT @@server_id").expect("server id")[0][0].clone()
    };
    let primary = h.lab.primary().name.clone();
    let primary_id = server_id(&primary);
    h.root_sql(
        "CREATE TABLE sbtest.sp (id INT PRIMARY KEY, v INT); INSERT INTO sbtest.sp VALUES (1, 10)",
    );
    for node in &h.lab.status.nodes {
        wait_for("the replicas to have the row", WAIT, || {
            holdfast_lab::node_sql(node, "SELECT v FROM sbtest.sp")
                .ok()
                .filter(|rows| !rows.is_empty())
        });
    }
    let mut c = connect(&h);
    c.query_drop("SET @kept = 7").expect("set");
    let read = c.prep("SELECT @@server_id + 0 * ?").expect("prepare");

    // A read-only transaction pinned to a replica.
    c.query_drop("START TRANSACTION READ ONLY").expect("begin");
    let (on, v): (u32, i64) = c
        .query_first("SELECT @@server_id, v FROM sbtest.sp WHERE id = 1")
        .expect("read")
        .expect("a row");
    let replica = h
        .lab
        .status
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .find(|n| server_id(n) == on.to_string())
        .expect("a node of the lab");
    assert_ne!(
        on.to_string(),
        primary_id,
        "the transaction reads a replica"
    );
    assert_eq!(v, 10);
    // The client's, the primary's and the replicas' connections (the prepared read was
    // prepared on a replica too: one or two).
    let parked_with_replicas = || {
        wait_for("the replica connections parked too", WAIT, || {
            (parked(&h) >= 3.0).then_some(())
        })
    };
    parked_with_replicas();

    // Changed meanwhile, and replicated: the parked transaction's snapshot stays.
    h.root_sql("UPDATE sbtest.sp SET v = 20 WHERE id = 1");
    wait_for("the replica to apply the change", WAIT, || {
        let rows = holdfast_lab::node_sql(h.node(&replica), "SELECT v FROM sbtest.sp")
            .expect("read the replica");
        (rows[0][0] == "20").then_some(())
    });
    let (again, v): (u32, i64) = c
        .query_first("SELECT @@server_id, v FROM sbtest.sp WHERE id = 1")
        .expect("read")
        .expect("a row");
    assert_eq!((again, v), (on, 10), "the same replica, the same snapshot");
    c.query_drop("COMMIT").expect("commit");

    // The replica's server ends every connection of the account while they are parked.
    parked_with_replicas();
    let threads = holdfast_lab::node_sql(
        h.node(&replica),
        &format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{}'",
            h.user()
        ),
    )
    .expect("the replica's threads");
    assert!(!threads.is_empty(), "the session's replica connection");
    for t in threads {
        holdfast_lab::node_sql(h.node(&replica), &format!("KILL {}", t[0])).expect("kill");
    }
    for n in 1..=4 {
        let got: Option<(i64, i64)> = c
            .query_first("SELECT @kept, v FROM sbtest.sp WHERE id = 1")
            .expect("a read after the replica ended its connection");
        assert_eq!(got, Some((7, 20)), "read {n}");
        let id: Option<u32> = c.exec_first(&read, (n,)).expect("the prepared read");
        assert!(id.is_some());
    }
    // Idle again: its connections park, a replica's among them.
    parked_with_replicas();
    drop(c);
    wait_for("the session to end", WAIT, || {
        (metric(&h.metrics(), "holdfast_sessions") == Some(0.0)).then_some(())
    });
    assert_eq!(parked(&h), 0.0, "nothing stays parked");
}

/// A topology change that does not concern a parked session (a replica's replication
/// stops: it takes no more reads) wakes it to look, and leaves its sockets parked: no
/// socket is taken back into the reactor, so no TLS connection is rebuilt (the lab's
/// default config: TLS to the nodes). Its next request wakes both and is answered as
/// before.
#[test]
fn a_topology_change_that_does_not_concern_a_parked_session_leaves_it_parked() {
    let h = Harness::start_with(Options::default().replicas(1));
    let counter = |name: &str| metric(&h.metrics(), name).unwrap_or(-1.0);
    let mut c = connect(&h);
    c.query_drop("SET @kept = 'parked'").expect("set");
    wait_parked(&h, 2.0);
    let woken = counter("holdfast_idle_sockets_woken_total");
    let rung = counter("holdfast_idle_sessions_rung_total");
    assert!(woken >= 0.0 && rung >= 0.0, "both counted");

    let replica = h.lab.replicas()[0].clone();
    holdfast_lab::node_sql(&replica, "STOP SLAVE SQL_THREAD").expect("stop replication");
    wait_for("the session woken by the change", WAIT, || {
        (counter("holdfast_idle_sessions_rung_total") > rung).then_some(())
    });
    holdfast_lab::node_sql(&replica, "START SLAVE SQL_THREAD").expect("start replication");
    assert_eq!(
        counter("holdfast_idle_sockets_woken_total"),
        woken,
        "no socket taken back for a change that does not concern the session"
    );
    assert_eq!(parked(&h), 2.0);

    let kept: Option<String> = c.query_first("SELECT @kept").expect("select");
    assert_eq!(kept.as_deref(), Some("parked"));
    assert_eq!(
        counter("holdfast_idle_sockets_woken_total"),
        woken + 2.0,
        "its request took both back"
    );
}

/// A pass-through session relayed in user space (the lab's default config: TLS to the
/// node, so even a plain client's relay copies) parks both sockets once it has relayed
/// nothing for a second, and relays on as before once its client speaks: the transaction,
/// its row lock (held while parked), the temporary table, the user variable and the
/// prepared statement are the server's, untouched; large requests and answers go through;
/// it parks again. A TLS client's relay parks its two record layers. A server that ends a
/// parked session's connection ends the session there and then, and a client that leaves
/// while parked ends its own.
#[test]
fn a_pass_through_session_relayed_in_user_space_parks_and_goes_on() {
    use holdfast_proxy::config::{ListenerConfig, ListenerMode};
    let h = Harness::start_with(Options::default().config(|c| {
        c.listeners.push(ListenerConfig {
            listen: "127.0.0.1:0".into(),
            mode: ListenerMode::Passthrough,
            routing: Default::default(),
            trusted_proxies: None,
        })
    }));
    let ca = h.lab.status.ca.clone().expect("the lab writes a CA");
    let open = |tls: bool| {
        let opts = OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(h.listeners[0].port())
            .user(Some(h.user()))
            .pass(Some(h.password()))
            .db_name(Some(h.database()))
            .prefer_socket(false);
        let opts = match tls {
            true => opts.ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(ca.clone())),
            )),
            false => opts,
        };
        Conn::new(opts).expect("a pass-through session")
    };
    let sessions = || metric(&h.metrics(), "holdfast_sessions").unwrap_or(-1.0);
    let mut c = open(true);
    c.query_drop("CREATE TABLE sbtest.pt (id INT PRIMARY KEY, v LONGTEXT)")
        .expect("create");
    c.query_drop("INSERT INTO sbtest.pt VALUES (1, 'a')")
        .expect("insert");
    c.query_drop("CREATE TEMPORARY TABLE sbtest.pt_tmp (v INT)")
        .expect("temporary table");
    c.query_drop("INSERT INTO sbtest.pt_tmp VALUES (7)")
        .expect("insert");
    c.query_drop("SET @kept = 'relayed', autocommit = 0")
        .expect("set");
    let stmt = c
        .prep("SELECT LENGTH(v) + ? FROM sbtest.pt WHERE id = 1")
        .expect("prepare");
    let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("id");
    c.query_drop("UPDATE sbtest.pt SET v = 'bb' WHERE id = 1")
        .expect("update");
    wait_parked(&h, 2.0);
    let mut direct = straight_to_the_server(&h);
    assert_row_held(&mut direct, "UPDATE sbtest.pt SET v = 'zz' WHERE id = 1");

    for round in 1..=2 {
        let v: Option<i64> = c.exec_first(&stmt, (round,)).expect("execute");
        let len = if round == 1 { 2 } else { 100_000 };
        assert_eq!(v, Some(len + round), "round {round}");
        let state: Option<(u64, String, i64, i64)> = c
            .query_first(
                "SELECT CONNECTION_ID(), @kept, @@autocommit, (SELECT v FROM sbtest.pt_tmp)",
            )
            .expect("state");
        assert_eq!(
            state,
            Some((thread.expect("an id"), "relayed".into(), 0, 7)),
            "the same server session, its state untouched"
        );
        large_request_and_answer(&mut c, "sbtest.pt");
        wait_parked(&h, 2.0);
    }
    c.query_drop("COMMIT").expect("commit");
    assert_committed_length(&h, "sbtest.pt", "100000");

    // A plain client's relay parks too.
    let mut p = open(false);
    let plain: Option<u64> = p.query_first("SELECT CONNECTION_ID()").expect("id");
    wait_parked(&h, 4.0);
    assert_eq!(sessions(), 2.0);
    // Its server ends the connection: the relay hears it while parked and ends.
    h.root_sql(&format!("KILL {}", plain.expect("an id")));
    wait_for("the killed relay to end", WAIT, || {
        (sessions() == 1.0).then_some(())
    });
    assert_eq!(parked(&h), 2.0, "the other session stays parked");
    assert!(
        p.query_drop("SELECT 1").is_err(),
        "the connection was killed"
    );

    // The TLS client leaves while parked.
    drop(c);
    wait_for("the last relay to end", WAIT, || {
        (sessions() == 0.0).then_some(())
    });
    assert_eq!(parked(&h), 0.0, "nothing stays parked");
}
