//! Read/write splitting (`routing = "split"`) against a real primary and two GTID replicas,
//! through the Rust `mysql` crate: which node each kind of statement reaches (by
//! `@@server_id`), and reads that see the session's own writes while a replica lags.

use holdfast_config::{Consistency, Routing};
use holdfast_it::{metric, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn connect_to(url: &str) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(url).expect("url"))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(60)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts).unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

/// A primary, two replicas, holdfast's main listener splitting reads.
pub(crate) fn split_harness(tweak: impl FnOnce(&mut holdfast_config::Config) + 'static) -> Harness {
    let h = Harness::start_with(Options::default().replicas(2).config(move |c| {
        c.proxy.routing = Routing::Split;
        tweak(c);
    }));
    wait_for("both replicas take reads", Duration::from_secs(30), || {
        (h.shared.topology.borrow().read_nodes().count() == 2).then_some(())
    });
    h
}

/// The server ids of the primary and of the replicas.
fn server_ids(h: &Harness) -> (u32, HashSet<u32>) {
    let id = |name: &str| -> u32 {
        let node = h.node(name);
        let rows = holdfast_lab::node_sql(node, "SELECT @@server_id").expect("server id");
        rows[0][0].parse().expect("numeric server id")
    };
    let primary = h.lab.primary().name.clone();
    let replicas = h
        .lab
        .status
        .nodes
        .iter()
        .filter(|n| n.name != primary)
        .map(|n| id(&n.name))
        .collect();
    (id(&primary), replicas)
}

/// The first column of every row of every result of `sql`.
fn ids_of(c: &mut Conn, sql: &str) -> Vec<u32> {
    let mut result = c.query_iter(sql).unwrap();
    let mut ids = Vec::new();
    while let Some(set) = result.iter() {
        for row in set {
            let row = row.unwrap();
            if let Some(id) = row.get::<u32, _>(0) {
                ids.push(id);
            }
        }
    }
    ids
}

/// A replica kept falling behind: its SQL thread stops for 300 ms of every 400 until
/// [`Lagging::stop`].
struct Lagging {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Lagging {
    fn start(node: holdfast_lab::NodeStatus) -> Lagging {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = holdfast_lab::node_sql(&node, "STOP SLAVE SQL_THREAD");
                std::thread::sleep(Duration::from_millis(300));
                let _ = holdfast_lab::node_sql(&node, "START SLAVE SQL_THREAD");
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = holdfast_lab::node_sql(&node, "START SLAVE SQL_THREAD");
        });
        Lagging { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("perturbing thread");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Primary,
    Replica,
}

fn node_of(id: u32, primary: u32, replicas: &HashSet<u32>) -> Node {
    if id == primary {
        Node::Primary
    } else {
        assert!(
            replicas.contains(&id),
            "server id {id} is no node of the lab"
        );
        Node::Replica
    }
}

/// A session's first statement is a read like any other: the session's record began
/// without the autocommit flag (known only from the first answer), so a connection that
/// runs one read and leaves (`mariadb -e 'SELECT ...'`, as in the README; short-lived
/// connections of PHP or CGI) always read the primary. Found by the README walk.
#[test]
fn a_sessions_first_statement_is_read_on_a_replica() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    for _ in 0..4 {
        let out = h.mariadb(h.proxy, &["-N", "-e", "SELECT @@server_id"]);
        assert_eq!(out.code, Some(0), "{out:?}");
        let id: u32 = out.stdout.trim().parse().expect("a server id");
        assert_eq!(
            node_of(id, primary, &replicas),
            Node::Replica,
            "a first statement read on the primary ({id})"
        );
    }
}

#[test]
fn each_kind_of_statement_reaches_the_node_it_must() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let mut c = connect_to(&h.url());
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        .unwrap();
    c.query_drop("INSERT INTO t VALUES (1, 10), (2, 20)")
        .unwrap();
    c.query_drop("CREATE PROCEDURE p() SELECT @@server_id")
        .unwrap();
    let on = |c: &mut Conn, sql: &str| -> Node {
        let id: u32 = c
            .query_first(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_else(|| panic!("{sql}: no row"));
        node_of(id, primary, &replicas)
    };
    let table = [
        ("SELECT @@server_id", Node::Replica),
        ("SELECT @@server_id FROM t WHERE id = 1", Node::Replica),
        (
            "SELECT @@server_id FROM t WHERE id = 1 FOR UPDATE",
            Node::Primary,
        ),
        (
            "SELECT @@server_id FROM t WHERE id = 1 LOCK IN SHARE MODE",
            Node::Primary,
        ),
        ("SELECT @@server_id + 0 * (@x := 1)", Node::Primary),
        ("SELECT @@server_id + 0 * LAST_INSERT_ID()", Node::Primary),
        ("SELECT @@server_id + 0 * FOUND_ROWS()", Node::Primary),
        ("/* holdfast: primary */ SELECT @@server_id", Node::Primary),
    ];
    for (sql, want) in table {
        // Each several times: balancing must never send these elsewhere.
        for _ in 0..4 {
            assert_eq!(on(&mut c, sql), want, "{sql}");
        }
    }
    // Prepared: by the statement's text.
    let read = c.prep("SELECT @@server_id + 0 * ?").unwrap();
    let locking = c
        .prep("SELECT @@server_id FROM t WHERE id = ? FOR UPDATE")
        .unwrap();
    for i in 0..4 {
        let id: u32 = c.exec_first(&read, (i,)).unwrap().unwrap();
        assert_eq!(node_of(id, primary, &replicas), Node::Replica);
        let id: u32 = c.exec_first(&locking, (1,)).unwrap().unwrap();
        assert_eq!(node_of(id, primary, &replicas), Node::Primary);
    }
    // Several statements in one request, and CALL: the primary.
    assert_eq!(
        ids_of(&mut c, "SELECT @@server_id; SELECT @@server_id"),
        vec![primary, primary]
    );
    assert_eq!(ids_of(&mut c, "CALL p()"), vec![primary]);
    // A read-write transaction stays on the primary, reads included.
    c.query_drop("BEGIN").unwrap();
    assert_eq!(on(&mut c, "SELECT @@server_id"), Node::Primary);
    c.query_drop("COMMIT").unwrap();
    assert_eq!(on(&mut c, "SELECT @@server_id"), Node::Replica);
    // A read-only transaction runs on one replica as a whole; a write in it is refused
    // (by the replica's read_only, 1290, where the primary would say 1792).
    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let first: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(first, primary, &replicas), Node::Replica);
    for _ in 0..4 {
        let id: u32 = c
            .query_first("SELECT @@server_id + 0 * COUNT(*) FROM t")
            .unwrap()
            .unwrap();
        assert_eq!(id, first, "the whole transaction on one node");
    }
    let e = c
        .query_drop("UPDATE t SET v = v + 1 WHERE id = 1")
        .unwrap_err();
    assert!(
        matches!(&e, mysql::Error::MySqlError(m) if m.code == 1792 || m.code == 1290),
        "{e}"
    );
    // (A read without tables would run on the primary, where the refusal is in the
    // diagnostics area it keeps.)
    let id: u32 = c
        .query_first("SELECT @@server_id + 0 * COUNT(*) FROM t")
        .unwrap()
        .unwrap();
    assert_eq!(id, first, "the transaction goes on after the refused write");
    c.query_drop("COMMIT").unwrap();
    assert_eq!(
        on(&mut c, "SELECT @@server_id FROM t WHERE id = 1 FOR UPDATE"),
        Node::Primary
    );
    // SHOW WARNINGS reads what the last statement left, where it ran.
    let id: u32 = c
        .query_first("SELECT @@server_id + 0 * CAST('1x' AS INTEGER)")
        .unwrap()
        .unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
    let warnings: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].1, 1292, "{warnings:?}");

    // Once the session holds a temporary table or a named lock, everything stays on the
    // primary (those live on its connection).
    let mut temp = connect_to(&h.url());
    assert_eq!(on(&mut temp, "SELECT @@server_id"), Node::Replica);
    temp.query_drop("CREATE TEMPORARY TABLE tt (a INT)")
        .unwrap();
    assert_eq!(on(&mut temp, "SELECT @@server_id"), Node::Primary);
    assert_eq!(
        on(&mut temp, "SELECT @@server_id + 0 * COUNT(*) FROM tt"),
        Node::Primary
    );
    let mut locked = connect_to(&h.url());
    assert_eq!(
        on(&mut locked, "SELECT @@server_id + 0 * GET_LOCK('split', 0)"),
        Node::Primary
    );
    assert_eq!(on(&mut locked, "SELECT @@server_id"), Node::Primary);

    // User variables: read on the primary until holdfast has captured their values, then
    // carried to the replicas.
    let mut uv = connect_to(&h.url());
    uv.query_drop("SET @uv = 41").unwrap();
    let (id, v): (u32, i64) = uv
        .query_first("SELECT @@server_id, @uv + 1")
        .unwrap()
        .unwrap();
    assert_eq!((node_of(id, primary, &replicas), v), (Node::Primary, 42));
    h.wait_captured();
    for _ in 0..4 {
        let (id, v): (u32, i64) = uv
            .query_first("SELECT @@server_id, @uv + 1")
            .unwrap()
            .unwrap();
        assert_eq!((node_of(id, primary, &replicas), v), (Node::Replica, 42));
    }
    uv.query_drop("SET @uv = 99").unwrap();
    let v: i64 = uv.query_first("SELECT @uv").unwrap().unwrap();
    assert_eq!(v, 99, "a new value is never read stale from a replica");
    h.wait_captured();
    let (id, v): (u32, i64) = uv.query_first("SELECT @@server_id, @uv").unwrap().unwrap();
    assert_eq!((node_of(id, primary, &replicas), v), (Node::Replica, 99));

    // The session's schema and variables follow it to the replicas.
    c.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'")
        .unwrap();
    c.query_drop("SET @@session.group_concat_max_len = 1234")
        .unwrap();
    for _ in 0..4 {
        let (id, mode, len): (u32, String, u32) = c
            .query_first("SELECT @@server_id, @@sql_mode, @@group_concat_max_len")
            .unwrap()
            .unwrap();
        assert_eq!(node_of(id, primary, &replicas), Node::Replica);
        assert_eq!((mode.as_str(), len), ("ANSI_QUOTES", 1234));
    }
    let replica_reads = metric(&h.metrics(), "holdfast_reads_on_replicas_total").unwrap_or(0.0);
    assert!(replica_reads >= 20.0, "{replica_reads}");
}

/// Read-your-writes on a replica kept lagging: each row read right after its INSERT, `n`
/// times (prepared statements). With commit markers on (the lab's default) the INSERT goes
/// out wrapped with its marker, and the GTID to wait for comes with the wrap's COMMIT.
fn reads_own_writes(markers: bool, n: i64) {
    let h = split_harness(move |c| {
        c.ha.commit_markers = markers;
        c.split.consistency = Consistency::Session;
        c.split.causal_wait_ms = 100;
    });
    if markers {
        wait_for("commit markers ready", Duration::from_secs(30), || {
            (h.status_json()["commit_markers"] == "ready").then_some(())
        });
    }
    let mut c = connect_to(&h.url());
    c.query_drop("CREATE TABLE rw (id INT PRIMARY KEY, v INT)")
        .unwrap();
    // One replica keeps falling behind.
    let lagging = h
        .lab
        .status
        .nodes
        .iter()
        .find(|n| n.name != h.lab.primary().name)
        .cloned()
        .expect("a replica");
    let perturb = Lagging::start(lagging);
    let insert = c.prep("INSERT INTO rw VALUES (?, ?)").unwrap();
    let select = c.prep("SELECT v FROM rw WHERE id = ?").unwrap();
    let mut misses = Vec::new();
    for i in 0..n {
        c.exec_drop(&insert, (i, i * 7)).unwrap();
        let v: Option<i64> = c.exec_first(&select, (i,)).unwrap();
        if v != Some(i * 7) {
            misses.push((i, v));
        }
    }
    perturb.stop();
    assert!(
        misses.is_empty(),
        "{} misses: {:?}",
        misses.len(),
        &misses[..misses.len().min(10)]
    );
    let m = h.metrics();
    let on_replicas = metric(&m, "holdfast_reads_on_replicas_total").unwrap_or(0.0);
    let waits = metric(&m, "holdfast_causal_wait_seconds_count").unwrap_or(0.0);
    let timeouts = metric(
        &m,
        "holdfast_reads_fallback_total{reason=\"causal_timeout\"}",
    )
    .unwrap_or(0.0);
    eprintln!("reads on replicas {on_replicas}, waits {waits}, causal timeouts {timeouts}");
    let tenth = n as f64 / 10.0;
    assert!(on_replicas > tenth, "{m}");
    assert!(waits > tenth, "reads after writes waited: {waits}");
    assert!(timeouts > 0.0, "the lag was real: some waits timed out");
}

#[test]
fn a_session_reads_its_own_writes_on_a_lagging_replica() {
    reads_own_writes(false, 10_000);
}

/// Issue 18, item 3: the same with the lab's defaults (markers on, autocommit writes
/// wrapped): 688 misses of 2,000 before the wrap's COMMIT passed its GTID on.
#[test]
fn a_session_reads_its_own_wrapped_writes_on_a_lagging_replica() {
    reads_own_writes(true, 2_000);
}

#[test]
fn a_replica_whose_replication_stops_leaves_reads_and_comes_back() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let node2 = h.node("node2").clone();
    let id2: u32 = holdfast_lab::node_sql(&node2, "SELECT @@server_id").unwrap()[0][0]
        .parse()
        .unwrap();
    assert!(replicas.contains(&id2) && id2 != primary);
    let serves = |name: &str| {
        h.shared
            .topology
            .borrow()
            .nodes
            .iter()
            .any(|n| n.name == name && n.serves_reads)
    };
    let mut c = connect_to(&h.url());
    let reads_on = |c: &mut Conn| -> Vec<u32> {
        (0..40)
            .map(|_| c.query_first("SELECT @@server_id").unwrap().unwrap())
            .collect()
    };
    assert!(
        reads_on(&mut c).contains(&id2),
        "node2 takes reads at first"
    );
    holdfast_lab::node_sql(&node2, "STOP SLAVE SQL_THREAD").unwrap();
    wait_for("node2 out of reads", Duration::from_secs(10), || {
        (!serves("node2")).then_some(())
    });
    let ids = reads_on(&mut c);
    assert!(!ids.contains(&id2), "{ids:?}");
    assert!(ids.iter().all(|id| replicas.contains(id)), "{ids:?}");
    holdfast_lab::node_sql(&node2, "START SLAVE SQL_THREAD").unwrap();
    wait_for("node2 back in reads", Duration::from_secs(10), || {
        serves("node2").then_some(())
    });
    assert!(reads_on(&mut c).contains(&id2), "node2 takes reads again");
}

#[test]
fn global_consistency_reads_what_other_sessions_committed() {
    let h = split_harness(|c| {
        c.split.consistency = Consistency::Global;
        c.split.causal_wait_ms = 100;
    });
    let mut writer = connect_to(&h.url());
    let mut reader = connect_to(&h.url());
    writer
        .query_drop("CREATE TABLE g (id INT PRIMARY KEY, v INT)")
        .unwrap();
    let perturb = Lagging::start(h.node("node2").clone());
    let select = reader.prep("SELECT v FROM g WHERE id = ?").unwrap();
    let mut misses = 0;
    for i in 0..2_000i64 {
        writer
            .exec_drop("INSERT INTO g VALUES (?, ?)", (i, i + 1))
            .unwrap();
        // Another session: its own writes tell nothing; the primary's position does (in
        // "session" mode this loop misses about half its rows).
        let v: Option<i64> = reader.exec_first(&select, (i,)).unwrap();
        if v != Some(i + 1) {
            misses += 1;
        }
    }
    perturb.stop();
    assert_eq!(misses, 0);
    let m = h.metrics();
    let on_replicas = metric(&m, "holdfast_reads_on_replicas_total").unwrap_or(0.0);
    assert!(on_replicas > 200.0, "{m}");
}

/// The CLI's Ctrl-C of a read running on a replica: the read stops with the server's
/// 1317, the session goes on, and nothing runs the read again (on the primary, where the
/// statement before it ran: a server stops such a read once).
#[test]
fn kill_query_through_holdfast_stops_a_read_on_a_replica() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let mut c = connect_to(&h.url());
    c.query_drop("SELECT 1").unwrap();
    // (The server ends the read after that whatever happens; counted on the node.)
    c.query_drop("SET max_statement_time = 20").unwrap();
    let timed_out = || -> u64 {
        h.root_sql("SHOW GLOBAL STATUS LIKE 'Max_statement_time_exceeded'")[0][1]
            .parse()
            .unwrap()
    };
    let before = timed_out();
    // The statement before the read runs on the primary (a function with effects).
    c.query_drop("DO RELEASE_ALL_LOCKS()").unwrap();
    // holdfast's id, from the greeting: what the CLI's Ctrl-C kills.
    let id = c.connection_id();
    let (mut c, result) = std::thread::scope(|s| {
        let running = s.spawn(move || {
            let r = c.query_first::<u64, _>(
                "SELECT COUNT(*) FROM seq_1_to_5000000000 WHERE seq % 7 = 3",
            );
            (c, r)
        });
        // Running on a replica, as the replica itself says (holdfast's own marks of the
        // `SELECT 1` before may still stand: they drop after its answer went out).
        h.wait_replica_running("SELECT COUNT(*) FROM seq_1_to_5000000000");
        let mut killer = connect_to(&h.url());
        killer.query_drop(format!("KILL QUERY {id}")).unwrap();
        running.join().expect("reading thread")
    });
    match result {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1317, "{e:?}"),
        other => panic!("the read should have been stopped: {other:?}"),
    }
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(
        node_of(id, primary, &replicas),
        Node::Replica,
        "the session goes on"
    );
    // (Before: the read ran again on the primary, and the session's next statement
    // waited for its time limit.)
    assert_eq!(timed_out(), before, "the read ran again on the primary");
}

/// The `Command` column of every row of a processlist answer (`SHOW [FULL] PROCESSLIST`,
/// `SELECT * FROM information_schema.PROCESSLIST`).
fn commands_of(c: &mut Conn, sql: &str) -> Vec<String> {
    let rows: Vec<mysql::Row> = c.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .map(|row| {
            let i = row
                .columns_ref()
                .iter()
                .position(|col| col.name_str().eq_ignore_ascii_case("command"))
                .unwrap_or_else(|| panic!("{sql}: no Command column"));
            row.get::<String, _>(i).unwrap_or_default()
        })
        .collect()
}

/// Issue 18, item 5, against the real lab through the split listener (with the harness's
/// defaults: commit markers and replay on).
#[test]
fn locks_behind_skipped_executable_comments_are_taken_on_the_primary() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let primary_node = h.lab.primary().clone();
    let mut c = connect_to(&h.url());
    // A plain read still reaches a replica: the split is on.
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);

    // Item 5: MariaDB skips `/*!90000 ... */` (a MySQL version above 5.7), so the quote or
    // `--` inside it means nothing and GET_LOCK runs. It must run on the primary.
    for (sql, lock) in [
        (
            "SELECT @@server_id /*!90000 ' */, GET_LOCK('j',0) -- '",
            "j",
        ),
        ("SELECT @@server_id /*!90000 -- */ , GET_LOCK('jj',0)", "jj"),
    ] {
        for _ in 0..4 {
            let (id, got): (u32, Option<i64>) = c
                .query_first(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .unwrap_or_else(|| panic!("{sql}: no row"));
            assert_eq!(got, Some(1), "{sql}: the lock was taken");
            assert_eq!(node_of(id, primary, &replicas), Node::Primary, "{sql}");
            let holder = holdfast_lab::node_sql_value(
                &primary_node,
                &format!("SELECT IS_USED_LOCK('{lock}')"),
            )
            .expect("IS_USED_LOCK on the primary");
            assert!(
                holder.as_deref().is_some_and(|v| v != "NULL"),
                "{sql}: the primary holds no lock {lock} ({holder:?})"
            );
            c.query_drop(format!("DO RELEASE_LOCK('{lock}')")).unwrap();
        }
    }
    // (The session, having taken named locks, now reads on the primary: another one
    // still reads on a replica.)
    let mut other = connect_to(&h.url());
    let id: u32 = other.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
}

/// Issue 18, item 6, against the real lab through the split listener (with the harness's
/// defaults): what describes the server that answers comes from the primary. Its
/// processlist has the replicas' binlog dump threads and no replication threads of its own.
#[test]
fn server_local_reads_run_on_the_primary() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let mut c = connect_to(&h.url());
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
    let replication = |cmds: &[String]| {
        cmds.iter()
            .filter(|c| c.starts_with("Slave_") || c.starts_with("Replica_"))
            .count()
    };
    let dumps = |cmds: &[String]| cmds.iter().filter(|c| c.starts_with("Binlog Dump")).count();
    for sql in [
        "SHOW FULL PROCESSLIST",
        "SHOW PROCESSLIST",
        "SELECT * FROM information_schema.PROCESSLIST",
        "SET STATEMENT max_statement_time = 10 FOR SHOW FULL PROCESSLIST",
    ] {
        for _ in 0..4 {
            let cmds = commands_of(&mut c, sql);
            assert_eq!(
                replication(&cmds),
                0,
                "{sql}: a replica's threads: {cmds:?}"
            );
            assert_eq!(
                dumps(&cmds),
                2,
                "{sql}: the primary's binlog dumps: {cmds:?}"
            );
        }
    }
    for _ in 0..4 {
        let read_only: u32 = c.query_first("SELECT @@read_only").unwrap().unwrap();
        assert_eq!(read_only, 0, "@@read_only is the primary's");
        let running: Option<(String, String)> = c
            .query_first("SHOW GLOBAL STATUS LIKE 'Slave_running'")
            .unwrap();
        assert_eq!(
            running.map(|(_, v)| v).as_deref(),
            Some("OFF"),
            "SHOW STATUS is the primary's"
        );
    }
    // A plain read still goes to a replica afterwards.
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
}

/// Issue 18, item 4: a statement that changes the session inside a read-only transaction
/// running on a replica must not change that connection only: the DATABASE() the client
/// then saw was not the one its next INSERT went to. A setting (`USE`, here) now runs on
/// both connections; a statement whose effects holdfast cannot see (a compound statement)
/// gives the transaction up with 1213 (it only read), does not run, and the session's read-only
/// transactions run on the primary from then on. (Such a statement first tries to move the
/// transaction to the primary; here it cannot: its read of `@@server_id` answers otherwise
/// there.) The lab's defaults (markers, replay) stay on.
#[test]
fn a_session_change_inside_a_read_only_transaction_on_a_replica_is_not_lost() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    h.root_sql(
        "CREATE DATABASE other; CREATE TABLE other.w (a INT); CREATE TABLE sbtest.w (a INT)",
    );
    wait_for(
        "the tables on the replicas",
        Duration::from_secs(30),
        || {
            h.lab
                .replicas()
                .iter()
                .all(|r| holdfast_lab::node_sql(r, "SELECT COUNT(*) FROM other.w").is_ok())
                .then_some(())
        },
    );
    let mut c = connect_to(&h.url());
    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
    c.query_drop("USE other").unwrap();
    let (db, id): (Option<String>, u32) = c
        .query_first("SELECT DATABASE(), @@server_id")
        .unwrap()
        .unwrap();
    assert_eq!(
        db.as_deref(),
        Some("other"),
        "the replica's connection has it"
    );
    assert_eq!(
        node_of(id, primary, &replicas),
        Node::Replica,
        "still pinned"
    );
    c.query_drop("COMMIT").unwrap();
    c.query_drop("INSERT INTO w VALUES (7)").unwrap();
    let count = |table: &str| h.root_sql(&format!("SELECT COUNT(*) FROM {table}"))[0][0].clone();
    assert_eq!(
        count("other.w"),
        "1",
        "the INSERT went where DATABASE() said"
    );
    assert_eq!(count("sbtest.w"), "0");

    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
    let err = c
        .query_drop("BEGIN NOT ATOMIC SELECT 1; END")
        .expect_err("rolled back, not run");
    assert!(err.to_string().contains("1213"), "{err}");

    // The client restarts its transaction: on the primary now.
    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Primary);
    c.query_drop("USE sbtest").unwrap();
    c.query_drop("COMMIT").unwrap();
    c.query_drop("INSERT INTO w VALUES (8)").unwrap();
    assert_eq!(count("sbtest.w"), "1");
}

/// A file the client has and a rogue server must not get.
fn client_secret_file(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("holdfast-{name}-{}", std::process::id()));
    std::fs::write(&path, "the client's secret\n").expect("write the client's file");
    path
}

/// Issue 18, item 16: a replica that answers a read with a LOCAL INFILE request (a real
/// replica never does: a SELECT reads no client file; this one is compromised, played by
/// `RogueServerMock` in front of the real replica) gets no file: the client gets an ERR
/// 1148 saying why instead of the request, its session goes on, and holdfast drops its
/// connection to that replica. (`[backend_tls]` off: the mock reads the protocol.)
#[test]
fn a_replica_asking_for_a_client_file_during_a_read_gets_nothing() {
    use holdfast_it::rogue::RogueServerMock;
    let secret = client_secret_file("replica-secret");
    let mock: Arc<std::sync::Mutex<Option<RogueServerMock>>> = Default::default();
    let slot = mock.clone();
    let asked = secret.display().to_string();
    let h = Harness::start_with(Options::default().replicas(1).config(move |c| {
        c.proxy.routing = Routing::Split;
        c.split.primary_read_weight = 0.0;
        c.backend_tls.mode = holdfast_config::BackendTlsMode::Disabled;
        let replica = c
            .backends
            .iter_mut()
            .find(|b| b.name != "node1")
            .expect("a replica");
        let rogue = RogueServerMock::start(replica.address.parse().expect("address"), &asked);
        replica.address = rogue.addr.to_string();
        *slot.lock().unwrap() = Some(rogue);
    }));
    wait_for("the replica takes reads", Duration::from_secs(30), || {
        (h.shared.topology.borrow().read_nodes().count() == 1).then_some(())
    });
    let mock = mock.lock().unwrap().take().expect("the mock");
    let replica = h
        .lab
        .status
        .nodes
        .iter()
        .find(|n| n.name != "node1")
        .expect("a replica")
        .name
        .clone();
    let out = h.mariadb(
        h.proxy,
        &[
            "--local-infile=1",
            "--batch",
            "--skip-column-names",
            "-e",
            &format!(
                "SELECT @@server_id > 0; SELECT '{}'",
                RogueServerMock::TRIGGER
            ),
        ],
    );
    let record = mock.record();
    assert_eq!(
        record.requests, 1,
        "the mock asked once: {record:?} {out:?}"
    );
    assert!(
        record.stolen.is_empty(),
        "the client's file reached the rogue replica: {:?}",
        String::from_utf8_lossy(&record.stolen)
    );
    assert!(
        out.stderr.contains("ERROR 1148 (42000)")
            && out.stderr.contains("LOCAL INFILE")
            && out.stderr.contains(&format!("server {replica}")),
        "{out:?}"
    );
    // A session that stays open: its connection to the replica is dropped at once.
    let mut c = connect_to(&h.url());
    let _: Option<i64> = c.query_first("SELECT 1").expect("a first read");
    match c.query_drop(format!("SELECT '{}'", RogueServerMock::TRIGGER)) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1148, "{e:?}"),
        other => panic!("expected ERR 1148, got {other:?}"),
    }
    wait_for(
        "holdfast to drop its connection to the rogue replica",
        Duration::from_secs(10),
        || (mock.record().dropped_after_request == 2).then_some(()),
    );
    let one: Option<i64> = c.query_first("SELECT 1").expect("the session goes on");
    assert_eq!(one, Some(1));
    assert_eq!(mock.record().requests, 2);
    assert!(mock.record().stolen.is_empty());
    let _ = std::fs::remove_file(secret);
}

/// Found by the fuzzer: diagnostics read through the binary protocol go where the last
/// statement ran, as a text `SHOW WARNINGS` does. A read that failed on a replica, then a
/// prepared `SHOW WARNINGS`: the prepare went to the primary and the session forgot where
/// the last statement ran, so the client got the primary's (older) diagnostics.
#[test]
fn prepared_diagnostics_read_where_the_last_statement_ran() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    let mut steps = vec![
        q("SET NAMES latin1;\nRELEASE SAVEPOINT sp"),
        q("-- dash ' ;\n SELECT * FROM tt ORDER BY a /*!101118 */"),
        binary("SHOW WARNINGS"),
    ];
    // Reads are balanced over the primary too: several, so that some run on a replica.
    for i in 0..4 {
        steps.extend([
            q("RELEASE SAVEPOINT nope"),
            q(&format!("SELECT * FROM no_such_table_{i}")),
            binary("SHOW WARNINGS"),
            q("RELEASE SAVEPOINT nope"),
            q(&format!("SELECT * FROM no_such_table_{i}")),
            binary("SHOW COUNT(*) WARNINGS"),
            binary("SELECT @@warning_count, @@error_count"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let caps = BASE_CAPS | holdfast_wire::caps::CLIENT_DEPRECATE_EOF;
    let direct = run(h.direct(), login, caps, &steps).expect("directly");
    let via = run(h.proxy, login, caps, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
}

/// Found by the fuzzer: `SET TRANSACTION READ ONLY` sets the next transaction's
/// characteristics, and the next statement that opens one (an autocommit read) uses them
/// up. That read ran on a replica, so on the primary they were still pending and the
/// session's next write failed with 1792 (a read-only transaction). While characteristics
/// are pending, the session's statements run on the primary.
#[test]
fn pending_transaction_characteristics_are_used_up_on_the_primary() {
    use holdfast_it::differential::{differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    h.root_sql("CREATE TABLE sbtest.chars_read (a INT) ENGINE=InnoDB");
    h.root_sql("CREATE TABLE sbtest.chars_written (a INT) ENGINE=InnoDB");
    for node in ["node2", "node3"] {
        wait_for(
            "the tables on the replicas",
            Duration::from_secs(30),
            || {
                holdfast_lab::node_sql(h.node(node), "SELECT COUNT(*) FROM sbtest.chars_written")
                    .ok()
                    .map(|_| ())
            },
        );
    }
    let mut steps = Vec::new();
    for _ in 0..4 {
        steps.extend([
            q("SET TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM chars_read"),
            q("INSERT INTO chars_written VALUES (1)"),
            q("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            q("SELECT COUNT(*) FROM chars_read"),
            q("SELECT @@tx_isolation"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
}

/// A table `sbtest.t` with rows 1 to 5, on every node.
fn table_t_everywhere(h: &Harness) {
    h.root_sql("CREATE TABLE sbtest.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB");
    h.root_sql("INSERT INTO sbtest.t VALUES (1, 1), (2, 2), (3, 3), (4, 4), (5, 5)");
    rows_on_the_replicas(h, "sbtest.t", 5);
}

/// Waits until both replicas hold `rows` rows in `table`.
fn rows_on_the_replicas(h: &Harness, table: &str, rows: u32) {
    let count = format!("SELECT COUNT(*) FROM {table}");
    for node in ["node2", "node3"] {
        wait_for("the rows on the replicas", Duration::from_secs(30), || {
            holdfast_lab::node_sql(h.node(node), &count)
                .ok()
                .filter(|r| r[0][0] == rows.to_string())
                .map(|_| ())
        });
    }
}

/// Found by the fuzzer: `FOUND_ROWS()` and `ROW_COUNT()` after a read that ran on a replica
/// were read on the primary (1, 0 where the server answers 2, -1). A statement that reads
/// what the last statement left runs where it ran when it is a plain read; when it cannot
/// run there (it sets a user variable, is a multi-statement, ...), the read is run again on
/// the primary first.
#[test]
fn reads_of_the_last_statements_counts_see_that_statement() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    // Reads are balanced over the primary too: several, so that some run on a replica.
    for _ in 0..4 {
        steps.extend([
            q("UNLOCK TABLES"),
            q("SELECT id FROM t ORDER BY id LIMIT 2"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            binary("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t ORDER BY id LIMIT 2"),
            q("SELECT ROW_COUNT() INTO @rc"),
            q("SELECT @rc"),
            q("SELECT id FROM t ORDER BY id LIMIT 4"),
            q("SELECT FOUND_ROWS(); SELECT 1"),
            q("SELECT * FROM no_such_table"),
            q("GET DIAGNOSTICS CONDITION 1 @e = MYSQL_ERRNO"),
            q("SELECT @e"),
            q("SELECT CAST(CONCAT('x', id) AS SIGNED) FROM t ORDER BY id LIMIT 2"),
            q("SELECT @@warning_count, FOUND_ROWS() INTO @w, @f"),
            q("SELECT @w, @f"),
            // A COMMIT with nothing to commit leaves 0 (fuzzer, seed 2029 session 248).
            q("SELECT v FROM t WHERE id = 3"),
            q("COMMIT"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT v FROM t WHERE id = 3"),
            q("ROLLBACK"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("/*+ MAX_EXECUTION_TIME(1000) */ SELECT v FROM t WHERE id = 3 /* plain */"),
            q("/* ; ' \" ` */ COMMIT"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
}

/// Found by the fuzzer (seed 2029 sessions 248, 1082, 1366, 1557, 1558; seed 2033
/// sessions 1672, 2168, 2303): `FOUND_ROWS()` is what the session's last statement that
/// set it left. Queries set it (to the rows they found, not the rows they answered: `LIMIT
/// ... OFFSET`, `UNION ALL ... LIMIT`), also inside `INSERT ... SELECT` and as they fail
/// while running (a duplicate key, a subquery of several rows); writes without a query,
/// `USE`, `COMMIT`, `VALUES`, `CHECKSUM TABLE`, `SHOW WARNINGS` and statements that fail before they run
/// (an unknown column) leave it; nested queries, `DESCRIBE`, multi-table updates set it
/// as the server decides. With statements spread over the nodes it lives on the node of
/// the statement that set it: it is carried (read there, made so by a `SELECT` of as many
/// rows) to where a read of it, or a statement that may set it, runs; the last
/// statement's `ROW_COUNT()` is written in.
#[test]
fn found_rows_is_the_servers_wherever_statements_run() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    // A table without the `id` column the reads below name.
    two_rows_everywhere(&h, "no_id", "k");
    // A table that grows (the same in both runs: what is read of it does not change).
    two_rows_everywhere(&h, "grow", "k");
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            // A read on a replica, then a read that fails on the primary.
            binary("USE no_id"),
            q("DESCRIBE t"),
            q("SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("USE sbtest"),
            // A read without rows, a read that fails, statements without a result set.
            q("/*+ MAX_EXECUTION_TIME(1000) */ SELECT v FROM t WHERE id = 9"),
            q("SELECT nosuchcol FROM t"),
            q("COMMIT"),
            q("EXECUTE nosuch USING 2"),
            q("SELECT SQL_CALC_FOUND_ROWS id FROM no_id.t ORDER BY id LIMIT 1"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            // A read with rows on a replica, then a write on the primary.
            q("(SELECT id FROM t WHERE id < 3) UNION (SELECT k FROM no_id.t) ORDER BY 1"),
            q("DELETE FROM t WHERE id = 11"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t ORDER BY id LIMIT 4"),
            q("UPDATE t SET v = v WHERE id = 12"),
            binary("SELECT FOUND_ROWS()"),
            // A read with rows on the primary, then one that fails on a replica: the
            // count is the primary's, the error the replica's (it is run again on the
            // primary, where it fails the same way).
            q("SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"),
            q("SELECT nosuchcol FROM t"),
            q("SELECT FOUND_ROWS(), @@error_count, ROW_COUNT()"),
            // Inside a transaction (its reads run on the primary).
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            q("BEGIN"),
            q("SELECT * FROM nosuch"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SHOW WARNINGS"),
            q("ROLLBACK"),
            // A query inside a write on the primary after a read on a replica.
            q("SHOW TABLES"),
            q("INSERT INTO grow.t SELECT MAX(k) + 1, 0 FROM grow.t"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            binary("SELECT id FROM t ORDER BY id LIMIT 3"),
            binary("INSERT INTO grow.t SELECT MAX(k) + 1, 0 FROM grow.t"),
            binary("SELECT FOUND_ROWS()"),
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            q("SET @b = (SELECT COUNT(*) FROM t)"),
            q("SELECT FOUND_ROWS()"),
            q("SELECT id FROM t ORDER BY id LIMIT 2"),
            q("SET @c = (SELECT 7)"),
            q("SELECT FOUND_ROWS()"),
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            q("UPDATE t JOIN grow.t AS g ON t.id = g.k SET t.v = t.v"),
            q("SELECT FOUND_ROWS()"),
            // Rows found, not answered.
            q("SELECT id FROM t ORDER BY id LIMIT 2 OFFSET 1"),
            q("UPDATE t SET v = v WHERE id = 1"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t UNION ALL SELECT id FROM t LIMIT 3"),
            q("DELETE FROM t WHERE id = 11"),
            q("SELECT FOUND_ROWS()"),
            // Answers with rows that keep it, or set it to something else.
            q("SELECT id FROM t ORDER BY id LIMIT 4"),
            q("CHECKSUM TABLE t"),
            q("SELECT FOUND_ROWS()"),
            q("SELECT id FROM t ORDER BY id LIMIT 2"),
            q("VALUES (1), (2), (3)"),
            q("SELECT FOUND_ROWS()"),
            q("SELECT id FROM t ORDER BY id LIMIT 1"),
            q("DESCRIBE t"),
            q("UPDATE t SET v = v WHERE id = 2"),
            q("SELECT FOUND_ROWS()"),
            // Statements that fail while they run.
            q("SELECT id FROM t ORDER BY id LIMIT 4"),
            q("INSERT INTO grow.t SELECT id + 6, v FROM t ORDER BY id"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            q("SELECT id FROM t WHERE id = (SELECT id FROM t)"),
            q("SELECT FOUND_ROWS()"),
            // `SHOW COUNT(*) WARNINGS` answers one row and sets it to 1; `SHOW WARNINGS`
            // keeps it (fuzzer, seed 2053 session 499).
            q("SELECT v FROM t WHERE id = 9"),
            q("UPDATE t SET v = v WHERE id = 2"),
            q("SHOW COUNT(*) WARNINGS"),
            q("SELECT FOUND_ROWS(), ROW_COUNT()"),
            q("SELECT id FROM t ORDER BY id LIMIT 3"),
            q("DELETE FROM t WHERE id = 11"),
            binary("SHOW COUNT(*) ERRORS"),
            q("SHOW WARNINGS"),
            q("SELECT FOUND_ROWS()"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// `name.t`, two rows, on the primary and both replicas, for the lab's client account:
/// its key column is `key`, its other one `v`.
fn two_rows_everywhere(h: &Harness, name: &str, key: &str) {
    h.root_sql(&format!(
        "CREATE DATABASE {name}; CREATE TABLE {name}.t ({key} INT PRIMARY KEY, v INT); \
         INSERT INTO {name}.t VALUES (7, 7), (8, 8)"
    ));
    h.root_sql(&format!("GRANT ALL ON {name}.* TO '{}'@'%'", h.user()));
    for node in ["node2", "node3"] {
        wait_for("the table on the replicas", Duration::from_secs(30), || {
            holdfast_lab::node_sql(h.node(node), &format!("SELECT COUNT(*) FROM {name}.t"))
                .ok()
                .filter(|rows| rows[0][0] == "2")
                .map(|_| ())
        });
    }
}

/// Runs `steps` directly and through holdfast, with and without the session tracker
/// capability, and fails with the steps that differ.
fn same_as_directly(h: &Harness, steps: &[holdfast_it::differential::Step]) {
    use holdfast_it::differential::{differences, run};
    use holdfast_it::raw::BASE_CAPS;
    let login = (h.user(), h.password(), Some(h.database()));
    for caps in [
        BASE_CAPS,
        BASE_CAPS | holdfast_wire::caps::CLIENT_SESSION_TRACK,
    ] {
        let direct = run(h.direct(), login, caps, steps).expect("directly");
        let via = run(h.proxy, login, caps, steps).expect("through holdfast");
        let diff = differences(steps, &direct, &via);
        assert!(
            diff.is_empty(),
            "holdfast differs from the server (caps {caps:#x}):\n{diff}"
        );
    }
}

/// Found by the fuzzer (seed 2039 session 268): a user variable set by a statement whose
/// capture waits (a multi-statement that also changed rows) lives on the primary only; a
/// read-only transaction begun then on a replica read it there as NULL. Such a transaction
/// begins on the primary.
#[test]
fn a_read_only_transaction_sees_user_variables_set_just_before_it() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for round in 0..3 {
        steps.extend([
            q(&format!(
                "SET @b = (SELECT COUNT(*) FROM t) + {round}; UPDATE t SET v = v + 1 WHERE id = 2"
            )),
            q("START TRANSACTION READ ONLY"),
            q("SELECT @b, @@in_transaction"),
            q("SELECT id FROM t WHERE id <= @b ORDER BY id"),
            q("COMMIT"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2038 session 4): a read-only transaction on a replica moves
/// to the primary (for a statement the replica's connection cannot follow) by running its
/// reads again there; after a `USE` (made on both connections) they ran in the new schema,
/// answered otherwise, and the transaction was given up (1213 where the server answers
/// 1792). Each read runs again in the schema it ran in.
#[test]
fn a_read_only_transaction_moves_to_the_primary_with_its_reads_in_their_schema() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    two_rows_everywhere(&h, "other", "id");
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("START TRANSACTION READ ONLY"),
            q("SELECT id, v FROM t ORDER BY id"),
            q("USE other"),
            q("UPDATE t SET v = 1 WHERE id = 1; START TRANSACTION READ WRITE"),
            q("SELECT @@in_transaction, DATABASE()"),
            q("SELECT id, v FROM t ORDER BY id"),
            q("ROLLBACK"),
            q("USE sbtest"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2036 session 51; seed 2037 session 59 for SQL `PREPARE`): a
/// procedure whose statements open no table
/// (`DO GET_LOCK(...)`) leaves the diagnostics area as the statement before it left it, as
/// such a statement does. After a read on a replica (which cleared the client's area), a
/// `CALL` on the primary showed the primary's older error in `@@warning_count`: the read
/// runs again on the primary first, as before any statement that keeps the area.
#[test]
fn a_procedure_that_opens_no_table_keeps_a_replica_reads_diagnostics() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    h.root_sql("CREATE PROCEDURE sbtest.p_quiet() DO 1");
    wait_for(
        "the procedure on the replicas",
        Duration::from_secs(30),
        || {
            ["node2", "node3"]
            .iter()
            .all(|n| {
                holdfast_lab::node_sql(
                    h.node(n),
                    "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_NAME = 'p_quiet'",
                )
                .ok()
                .is_some_and(|rows| rows[0][0] == "1")
            })
            .then_some(())
        },
    );
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("XA COMMIT 'x' ONE PHASE"),
            q("SELECT id, v FROM t ORDER BY id"),
            binary("CALL p_quiet()"),
            q("SET sql_select_limit = DEFAULT; SELECT @@warning_count, @@error_count"),
            q("XA COMMIT 'x' ONE PHASE"),
            q("SELECT id, v FROM t ORDER BY id"),
            q("CALL p_quiet()"),
            q("SHOW WARNINGS"),
            // SQL-level prepared statements (seed 2037 session 59).
            q("XA ROLLBACK 'x'"),
            q("SELECT COUNT(*) FROM t"),
            q("PREPARE ps FROM 'SELECT GET_LOCK(?, 0)'"),
            q("SHOW WARNINGS"),
            q("XA ROLLBACK 'x'"),
            q("SELECT COUNT(*) FROM t"),
            q("EXECUTE IMMEDIATE 'DO 1'"),
            q("SHOW WARNINGS"),
            q("XA ROLLBACK 'x'"),
            q("SELECT COUNT(*) FROM t"),
            q("DEALLOCATE PREPARE ps"),
            q("SELECT @@warning_count"),
            // A prepared read without tables after an error (seed 2038 session 144).
            q("DROP TEMPORARY TABLE nosuch"),
            binary("SELECT @@tx_read_only, @@tx_isolation"),
            q("SHOW WARNINGS"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2035 session 600): a temporary table made by dynamic SQL
/// (`EXECUTE IMMEDIATE 'CREATE TEMPORARY TABLE ...'`, or a statement prepared in SQL from
/// such a text) lives on the primary's connection. The server reports a change of the
/// session; a capture then found a user variable set by an earlier statement (whose capture
/// had waited) and took it for the explanation: a read of the table went to a replica and
/// got 1146. A change of user variables explains such a change only when the capture
/// before it was up to date; else the session's state is unknown (its reads stay on the
/// primary).
#[test]
fn dynamic_sql_that_makes_a_temporary_table_keeps_reads_of_it_on_the_primary() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            // A user variable set while the capture waits (a count of changed rows), then
            // the table: the variable's change does not explain the procedure's.
            q("SET @s = 5; UPDATE t SET v = v + 1 WHERE id = 1"),
            q("EXECUTE IMMEDIATE 'CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT)'"),
            q("SELECT * FROM tt ORDER BY a"),
            q("EXECUTE IMMEDIATE 'DROP TEMPORARY TABLE tt'"),
            q("EXECUTE IMMEDIATE 'CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT)'"),
            q("SELECT * FROM tt ORDER BY a"),
            binary("SELECT COUNT(*) FROM tt"),
            q("EXECUTE IMMEDIATE 'DROP TEMPORARY TABLE tt'"),
            q("SELECT COUNT(*) FROM t"),
            q("PREPARE ps FROM 'CREATE TEMPORARY TABLE tt2 (a INT)'"),
            q("EXECUTE ps"),
            q("SELECT * FROM tt2"),
            q("DROP TEMPORARY TABLE tt2"),
            q("DEALLOCATE PREPARE ps"),
            q("SELECT COUNT(*) FROM t"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2034 session 606): inside a read-only transaction on a
/// replica, a setting made on both connections (`SET autocommit = 0`) was then run again
/// on the primary before the next statement that ran there (an `XA START` the server
/// refuses), as a replica's read would be; holdfast took that for a change of the session
/// on the primary, and the transaction, whose read of the clock cannot move, was given up:
/// the next statement got 1213 where the server answers 1792.
#[test]
fn a_setting_made_on_both_connections_of_a_read_only_transaction_is_not_run_again() {
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut c = connect_to(&h.url());
    for _ in 0..3 {
        c.query_drop("START TRANSACTION READ ONLY").expect("start");
        let _: Option<(i32, String)> = c
            .query_first("SELECT id, NOW(6) FROM t ORDER BY id LIMIT 1")
            .expect("a read");
        let code = |r: Result<(), mysql::Error>| match r {
            Err(mysql::Error::MySqlError(e)) => e.code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(c.query_drop("UPDATE t SET v = 9 WHERE id = 1")), 1792);
        assert_eq!(code(c.query_drop("REPLACE INTO t VALUES (3, 3)")), 1792);
        c.query_drop("SET autocommit = 0").expect("a setting");
        assert_eq!(code(c.query_drop("XA START 'x'")), 1400);
        assert_eq!(code(c.query_drop("INSERT INTO t VALUES (99, 1)")), 1792);
        let open: Option<u8> = c.query_first("SELECT @@in_transaction").expect("a read");
        assert_eq!(open, Some(1));
        c.query_drop("ROLLBACK").expect("rollback");
        c.query_drop("SET autocommit = 1").expect("a setting");
    }
}

/// Found by the fuzzer: a write inside `START TRANSACTION READ ONLY` that ran on a replica
/// got the replica's 1290 (`--read-only`), or 1146 for a table the replica checks first,
/// where the server answers 1792. What is not a plain read runs on the primary, in a
/// read-only transaction of its own: the client gets the server's own answer.
#[test]
fn writes_in_a_read_only_transaction_on_a_replica_get_the_servers_answer() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..4 {
        steps.extend([
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            q("INSERT INTO t VALUES (100, 1)"),
            q("SHOW WARNINGS"),
            // A read without tables keeps the primary's error (seed 2029 session 1385).
            q("INSERT INTO t VALUES (101, 1)"),
            q("SELECT DATABASE()"),
            q("SHOW ERRORS"),
            q("INSERT INTO tt VALUES (10)"),
            q("UPDATE t SET v = 9 WHERE id = 1"),
            binary("DELETE FROM t WHERE id = 2"),
            q("SELECT id FROM t WHERE id = 1 FOR UPDATE"),
            q("SELECT @@in_transaction, @@tx_read_only"),
            q("SELECT v FROM t WHERE id = 1"),
            q("COMMIT"),
            // The primary's error, then a read on the replica (which clears the area), then
            // a statement that commits the transaction and keeps the area (seed 2033
            // session 2045).
            q("START TRANSACTION READ ONLY"),
            q("INSERT INTO t VALUES (102, 1)"),
            q("SELECT v FROM t WHERE id = 2"),
            binary("START TRANSACTION READ WRITE"),
            q("SHOW WARNINGS"),
            q("START TRANSACTION READ ONLY"),
            q("UPDATE t SET v = 9 WHERE id = 1"),
            q("SELECT v FROM t WHERE id = 3"),
            q("BEGIN"),
            q("SELECT @@warning_count"),
            q("COMMIT"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
    let rows = h.root_sql("SELECT COUNT(*), SUM(v) FROM sbtest.t");
    assert_eq!(rows[0], ["5", "15"], "no write went in");
}

/// Found by the fuzzer: by issue 18 item 4, a statement that changes the session inside a
/// read-only transaction on a replica gets 1213; so did statements whose change lives on the
/// primary or that change nothing (`RELEASE_LOCK`, `CALL` of a missing procedure, `EXECUTE`
/// of an unknown statement, `IS_FREE_LOCK` in a multi-statement), and session variables that
/// can be set on both connections (`SET SESSION TRANSACTION`, prepared `SET NAMES`,
/// `SET sql_select_limit`, user variables). They get the server's answer now, and the
/// replica's reads see the changes.
#[test]
fn session_statements_in_a_read_only_transaction_on_a_replica_get_the_servers_answer() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..4 {
        steps.extend([
            // Settings on both connections leave the transaction open on both.
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t; SET SESSION sql_select_limit = 0; SET sql_mode = DEFAULT"),
            q("INSERT INTO tt VALUES (3)"),
            q("SET sql_select_limit = DEFAULT"),
            q("COMMIT"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            q("UNLOCK TABLES"),
            q("SELECT RELEASE_LOCK('a')"),
            q("SELECT GET_LOCK('hs_a', 0)"),
            q("SELECT IS_FREE_LOCK('hs_a'), IS_USED_LOCK('hs_b'); SELECT 1"),
            q("SELECT 1; SELECT GET_LOCK('hs_c', 0); SET NAMES latin1"),
            q("SELECT @@character_set_client, COUNT(*) FROM t"),
            q("SELECT RELEASE_LOCK('hs_c')"),
            q("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
            binary("SET NAMES latin1"),
            q("SET sql_select_limit = 2"),
            q("SELECT id FROM t ORDER BY id"),
            q("CALL p_nope()"),
            q("EXECUTE nope"),
            q("SET @a = 5"),
            q("SELECT @a, @@tx_isolation, @@character_set_client, @@sql_select_limit"),
            q("SELECT id FROM t WHERE id = @a"),
            q("SELECT id FROM t WHERE id = 2; SET SESSION sql_select_limit = 1; USE sbtest"),
            q("SET autocommit = 0"),
            q("SELECT @@autocommit, @@sql_select_limit, DATABASE()"),
            q("SELECT id FROM t ORDER BY id"),
            q("COMMIT"),
            q("SET autocommit = 1"),
            q("SELECT RELEASE_LOCK('hs_a')"),
            q("SET sql_select_limit = DEFAULT, NAMES utf8mb4"),
            q("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
            // Statements the server commits the transaction for before it runs them.
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            q("LOCK TABLES t READ"),
            q("SELECT @@in_transaction"),
            q("UNLOCK TABLES"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            q("BEGIN"),
            q("SELECT @@in_transaction, COUNT(*) FROM t"),
            q("COMMIT"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
}

/// A statement of a read-only transaction on a replica that runs on the primary and
/// changes the session there (a procedure that sets a user variable) leaves the replica's
/// connection behind: the client gets the statement's answer, then 1213 for its next
/// statement (the transaction was rolled back), and its read-only transactions run on the
/// primary from then on. (The transaction cannot move to the primary: its read of
/// `@@server_id` answers otherwise there.)
#[test]
fn a_procedure_that_changes_the_session_in_a_read_only_transaction_gives_it_up() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    h.root_sql("CREATE PROCEDURE sbtest.p_var() SET @from_p = 3");
    table_t_everywhere(&h);
    let mut c = connect_to(&h.url());
    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Replica);
    c.query_drop("CALL p_var()").unwrap();
    let err = c
        .query_drop("SELECT id FROM t")
        .expect_err("the transaction was given up");
    assert!(err.to_string().contains("1213"), "{err}");
    let (value, id): (u32, u32) = c
        .query_first("SELECT @from_p, @@server_id")
        .unwrap()
        .unwrap();
    assert_eq!(
        (value, node_of(id, primary, &replicas)),
        (3, Node::Primary),
        "the procedure's variable is the session's"
    );
    c.query_drop("START TRANSACTION READ ONLY").unwrap();
    let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
    assert_eq!(node_of(id, primary, &replicas), Node::Primary);
    c.query_drop("COMMIT").unwrap();
}

/// Found by the fuzzer: a statement that opens no table (`USE`, `SET`, `SELECT @@x`) keeps the
/// diagnostics area as the statement before it left it. After a read on a replica, such a
/// statement ran on the primary and kept the primary's older warnings: `SHOW COUNT(*)
/// WARNINGS` then counted those. When the read's warnings and the primary's differ, the
/// read runs again on the primary before it.
#[test]
fn statements_that_open_no_table_keep_a_replica_reads_diagnostics() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..4 {
        steps.extend([
            q("INSERT INTO no_such_table VALUES (1)"),
            q("SELECT COUNT(*) FROM t"),
            q("USE sbtest"),
            q("SHOW COUNT(*) WARNINGS"),
            // The primary keeps its error through a statement that opens no table.
            q("SELECT 1; DROP TEMPORARY TABLE no_such_table"),
            q("USE sbtest"),
            q("SELECT COUNT(*) FROM t"),
            q("USE sbtest"),
            q("SHOW COUNT(*) WARNINGS"),
            q("SELECT CAST(CONCAT('x', id) AS SIGNED) FROM t ORDER BY id LIMIT 2"),
            q("SET @z = 1"),
            q("SHOW WARNINGS"),
            // A SELECT without tables that runs on the primary keeps it too.
            binary("INSERT INTO no_such_table VALUES (2)"),
            q("SELECT COUNT(*) FROM t"),
            q("SELECT @@in_transaction"),
            q("SHOW WARNINGS"),
            // A read without tables keeps the area as the primary's last statement left it.
            q("CALL no_such_procedure()"),
            q("SELECT DATABASE()"),
            q("SHOW WARNINGS"),
            q("SELECT CAST(CONCAT('x', id) AS SIGNED) FROM t ORDER BY id LIMIT 1"),
            q("SELECT DATABASE()"),
            q("SHOW COUNT(*) WARNINGS"),
            // A prepared statement that opens no table keeps it as well (fuzzer, seed
            // 2027 session 180).
            q("INSERT INTO no_such_table VALUES (3)"),
            q("SELECT COUNT(*) FROM t"),
            binary("SET sql_mode = DEFAULT"),
            q("SELECT @@warning_count, @@error_count"),
            q("INSERT INTO no_such_table VALUES (4)"),
            q("SELECT CAST(CONCAT('x', id) AS SIGNED) FROM t ORDER BY id LIMIT 1"),
            binary("SELECT @@in_transaction"),
            q("SHOW COUNT(*) WARNINGS"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
}

/// Found by the fuzzer: a procedure that made a temporary table reports only that the
/// session changed; the read of that table right after it (before holdfast's capture had
/// looked, on an idle session) ran on a replica: 1146. Until a capture tells what changed,
/// reads stay on the primary.
#[test]
fn a_read_right_after_a_procedure_changed_the_session_runs_on_the_primary() {
    let h = split_harness(|_| {});
    h.root_sql(
        "CREATE PROCEDURE sbtest.p_tmp() CREATE TEMPORARY TABLE IF NOT EXISTS tmp_p (a INT)",
    );
    let mut c = connect_to(&h.url());
    for _ in 0..5 {
        c.query_drop("CALL p_tmp(); SELECT 1").unwrap();
        let rows: Vec<u32> = c
            .query("SELECT a FROM tmp_p")
            .unwrap_or_else(|e| panic!("the table is there: {e}"));
        assert!(rows.is_empty());
        c.query_drop("DROP TEMPORARY TABLE tmp_p").unwrap();
    }
}

/// Found by the fuzzer (seed 2048, session 1402): a procedure made a temporary table, and a
/// user variable was set before holdfast's capture looked (in the same request, or in the
/// next one, before the session went quiet). The capture found the user variables changed
/// and took them for the procedure's whole change: the session was movable again, and the
/// read of the temporary table ran on a replica (1146). A change of user variables by a
/// statement holdfast reads does not explain a procedure's.
#[test]
fn a_user_variable_set_after_a_procedure_does_not_explain_the_procedures_change() {
    let h = split_harness(|_| {});
    h.root_sql(
        "CREATE PROCEDURE sbtest.p_tmp() CREATE TEMPORARY TABLE IF NOT EXISTS tmp_p (a INT)",
    );
    for (round, texts) in [
        &["CALL p_tmp(); SET @a = 1"][..],
        &["CALL p_tmp()", "SET @a = 2"][..],
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = connect_to(&h.url());
        for text in texts {
            c.query_drop(*text).unwrap();
        }
        // The capture has looked, and the session holds what only the primary has.
        let unknown = Some("state changed by a procedure or dynamic SQL");
        let mut last = None;
        let captured = holdfast_it::poll(Duration::from_secs(10), || {
            let st = h.status();
            let s = st.sessions.first()?;
            last = Some((s.capture_due, s.blocked_by.clone()));
            (!s.capture_due && s.blocked_by.as_deref() == unknown).then_some(())
        });
        assert!(
            captured.is_some(),
            "round {round}: /status shows (capture_due, blocked_by) = {last:?}"
        );
        let rows: Vec<u32> = c
            .query("SELECT a FROM tmp_p")
            .unwrap_or_else(|e| panic!("round {round}: the table is there: {e}"));
        assert!(rows.is_empty());
        drop(c);
        holdfast_it::poll(Duration::from_secs(10), || {
            h.status().sessions.is_empty().then_some(())
        })
        .expect("the session ended");
    }
}

/// Found by the fuzzer (seed 2054 session 51): a read-only transaction on a replica whose
/// reads include one that opens no table (`SELECT @@warning_count`) could not move to the
/// primary for a statement the replica cannot follow (a multi-statement that ends it with
/// `LOCK TABLES`): that read answered otherwise there, where the diagnostics area is
/// another statement's, and the client got 1213 where the server answers. So did one
/// that read the time. Such a read says nothing of the snapshot: it runs again (for what
/// it leaves: `FOUND_ROWS()`), its answer not compared.
#[test]
fn a_read_only_transaction_that_read_no_table_moves_to_the_primary() {
    use holdfast_it::differential::q;
    let h = split_harness(|c| c.split.primary_read_weight = 0.0);
    table_t_everywhere(&h);
    let steps = vec![
        q("START TRANSACTION READ ONLY"),
        q("SELECT v FROM t WHERE id = 2"),
        q("SELECT @@warning_count, @@error_count"),
        q("SELECT NOW() > '2000-01-01', CONNECTION_ID() > 0"),
        // Fails at its first statement: runs on the primary beside the pinned
        // transaction, and leaves its error in the primary's diagnostics area.
        q("SELECT nosuchcol FROM t; SELECT 1"),
        q("SELECT id FROM t ORDER BY id LIMIT 3; LOCK TABLES t READ"),
        q("SELECT @@in_transaction, FOUND_ROWS()"),
        q("INSERT INTO t VALUES (200, 1)"),
        q("UNLOCK TABLES"),
    ];
    same_as_directly(&h, &steps);
    // A read whose answer the primary cannot repeat (the time, to the microsecond).
    let mut c = connect_to(&h.url());
    c.query_drop("START TRANSACTION READ ONLY").expect("start");
    c.query_drop("SELECT v FROM t WHERE id = 2")
        .expect("a read");
    let _: Vec<String> = c.query("SELECT NOW(6)").expect("the time");
    let ids: Vec<u32> = c
        .query("SELECT id FROM t ORDER BY id LIMIT 3; LOCK TABLES t READ")
        .expect("the server's answer, not 1213");
    assert_eq!(ids, [1, 2, 3]);
    let left: Vec<(u8, u8)> = c
        .query("SELECT @@in_transaction, @@tx_read_only")
        .expect("after the lock");
    assert_eq!(left, [(0, 0)], "LOCK TABLES committed the transaction");
    let m = h.metrics();
    let moved = metric(
        &m,
        "holdfast_reads_fallback_total{reason=\"replica_transaction_moved\"}",
    );
    assert!(moved.is_some_and(|n| n >= 1.0), "{m}");
}

/// Found by the fuzzer (seed 2026, sessions 53, 116, 227, 515, 535, 624; seed 8 session 304):
/// inside a read-only transaction on a replica, a statement the replica's connection cannot
/// follow (a user variable set from a query, a multi-statement that ends the transaction or
/// commits it for DDL, `UNLOCK TABLES` among others, a compound statement) got 1213 where the
/// server answers; a write prepared there was prepared (the server refuses the prepare with
/// 1792). Now the transaction moves to the primary first: its reads run again there in a
/// read-only transaction, and when every answer is the one the client got, the statement
/// runs there as on the server. The lab's defaults (markers, replay) stay on.
#[test]
fn a_read_only_transaction_on_a_replica_moves_to_the_primary_for_what_the_replica_cannot_follow() {
    use holdfast_it::differential::{binary, differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            binary("INSERT INTO t VALUES (100, 1)"),
            q("SELECT v FROM t WHERE id = 2"),
            q("SET @x = (SELECT MAX(v) FROM t)"),
            q("SELECT @x, @@in_transaction, @@tx_read_only"),
            q("INSERT INTO t VALUES (101, 1)"),
            q("COMMIT"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT SUM(v) FROM t"),
            q("SELECT 1; UNLOCK TABLES; SELECT @@in_transaction"),
            q("SELECT id FROM t ORDER BY id; COMMIT; SELECT @@in_transaction"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT v FROM t WHERE id = 3"),
            q("SELECT 2; DROP TABLE IF EXISTS t_nope; SELECT @@in_transaction"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT v FROM t WHERE id = 4"),
            q("BEGIN NOT ATOMIC SELECT COUNT(*) FROM t; END"),
            q("SELECT @@in_transaction"),
            q("ROLLBACK"),
            // A read prepared, run and closed; a setting prepared (seed 2029 sessions 335
            // and 546).
            q("START TRANSACTION READ ONLY"),
            binary("SELECT id FROM t ORDER BY id LIMIT 3"),
            binary("SET NAMES utf8mb4"),
            q("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
               RELEASE SAVEPOINT sp; LOCK TABLES t READ"),
            q("SAVEPOINT sp"),
            q("SELECT @@in_transaction, @@tx_isolation"),
            q("ROLLBACK"),
            q("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
            q("START TRANSACTION READ ONLY"),
            binary("SET NAMES utf8mb4"),
            q("INSERT INTO t (id, v) VALUES (4, 6) /*!999999 /* nested? */"),
            q("SELECT @@in_transaction"),
            q("ROLLBACK"),
            // Settings made on the primary before a write there failed are made on the
            // replica too (seed 2029 session 695).
            q("START TRANSACTION READ ONLY"),
            q("SELECT CONCAT('x', v) FROM t WHERE id = 1"),
            q("SET NAMES latin1; UPDATE t SET v = 1 WHERE id = 5; SET NAMES utf8mb4"),
            q("EXECUTE IMMEDIATE 'INSERT INTO t VALUES (?, 1)' USING 107"),
            q("SELECT @@character_set_client, COUNT(*) FROM t"),
            q("ROLLBACK"),
            q("SET NAMES utf8mb4"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
    let rows = h.root_sql("SELECT COUNT(*), SUM(v) FROM sbtest.t");
    assert_eq!(rows[0], ["5", "15"], "no write went in");
    // The six of the first round at least moved (later rounds may start on the primary:
    // a compound statement leaves reads there until a capture).
    let m = h.metrics();
    let moved = holdfast_it::metric(
        &m,
        "holdfast_reads_fallback_total{reason=\"replica_transaction_moved\"}",
    );
    assert!(moved.is_some_and(|n| n >= 6.0), "{m}");
}

/// Found by the fuzzer (seed 2028, session 292): `SET autocommit = 1` commits a read-only
/// transaction, and MariaDB keeps the session read-only after it (a write prepared or run
/// then gets 1792, until the next transaction ends). With the transaction on a replica,
/// holdfast committed it there and ran the `SET` on the primary, where no transaction was
/// open: the writes went in. A statement that commits the transaction now runs where the
/// server can say what it leaves: the transaction is opened on the primary first.
#[test]
fn what_a_statement_that_commits_a_read_only_transaction_leaves_is_the_servers() {
    use holdfast_it::differential::{differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("SET autocommit = 0"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT COUNT(*) FROM t"),
            q("SET autocommit = 1"),
            q("PREPARE ps FROM 'INSERT INTO t (id, v) VALUES (?, 1)'"),
            q("INSERT INTO t (id, v) VALUES (102, 1)"),
            q("SELECT @@in_transaction, @@autocommit"),
            q("DEALLOCATE PREPARE ps"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT SUM(v) FROM t"),
            q("BEGIN"),
            q("INSERT INTO t (id, v) VALUES (103, 1)"),
            q("SELECT COUNT(*) FROM t"),
            q("ROLLBACK"),
            q("START TRANSACTION READ ONLY"),
            q("SELECT v FROM t WHERE id = 2"),
            q("LOCK TABLES t READ"),
            q("SELECT @@in_transaction, COUNT(*) FROM t"),
            q("UNLOCK TABLES"),
            q("SELECT COUNT(*) FROM t"),
        ]);
    }
    let login = (h.user(), h.password(), Some(h.database()));
    let direct = run(h.direct(), login, BASE_CAPS, &steps).expect("directly");
    let via = run(h.proxy, login, BASE_CAPS, &steps).expect("through holdfast");
    let diff = differences(&steps, &direct, &via);
    assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
    let rows = h.root_sql("SELECT COUNT(*), SUM(v) FROM sbtest.t");
    assert_eq!(rows[0], ["5", "15"], "no write went in");
}

/// Found by the fuzzer (seed 2029, session 656): a read that fails on a replica (1064: the
/// executable comment runs, and its `--` comments out the rest, `*/` included), then `XA
/// START`, which opens no table and keeps the diagnostics area: `SHOW WARNINGS` shows the
/// 1064 on the server, nothing through holdfast (the primary's area was empty).
#[test]
fn xa_statements_keep_a_replica_reads_diagnostics() {
    use holdfast_it::differential::{differences, q, run};
    use holdfast_it::raw::BASE_CAPS;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = [
        q("INSERT INTO t (id, v) SELECT MAX(id) + 1, 1 FROM t"),
        q("SELECT 2 /*!101118 -- */ , GET_LOCK('fz_b', 0)"),
        q("xa START 'x' /*!999999 */"),
        q("SHOW WARNINGS; SELECT 1; DELETE FROM t WHERE id = 9 /*M!999999 */"),
        q("SELECT @@in_transaction"),
        q("SELECT RELEASE_ALL_LOCKS()"),
        q("SELECT 3 /*!101118 -- */ , 4"),
        q("XA END 'x'"),
        q("SHOW COUNT(*) WARNINGS"),
        q("XA ROLLBACK 'x'"),
    ];
    let login = (h.user(), h.password(), Some(h.database()));
    for caps in [
        BASE_CAPS,
        BASE_CAPS | holdfast_wire::caps::CLIENT_SESSION_TRACK,
    ] {
        let direct = run(h.direct(), login, caps, &steps).expect("directly");
        let via = run(h.proxy, login, caps, &steps).expect("through holdfast");
        h.root_sql("DELETE FROM sbtest.t WHERE id > 5");
        let diff = differences(&steps, &direct, &via);
        assert!(diff.is_empty(), "holdfast differs from the server:\n{diff}");
    }
}

/// Reads on a replica run in the database a prepared `USE`, or one with an executable
/// comment, made current. (Written for the fuzzer's seed 2029 sessions 248 and 1082; what
/// differed there was `FOUND_ROWS()` after a read that failed, see
/// `found_rows_is_read_where_the_last_answer_with_rows_ran`.)
#[test]
fn reads_on_a_replica_follow_every_kind_of_use() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    two_rows_everywhere(&h, "other_db", "id");
    let steps = [
        binary("USE other_db"),
        q("DESCRIBE t"),
        q("SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"),
        q("SELECT FOUND_ROWS(), ROW_COUNT()"),
        q("SELECT id FROM t ORDER BY id"),
        q("SELECT DATABASE()"),
        q("USE sbtest /*M!100000 */"),
        q("SELECT id FROM t ORDER BY id"),
        q("USE other_db /*!100000 */"),
        q("SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"),
        q("SELECT FOUND_ROWS(), ROW_COUNT()"),
        binary("USE sbtest"),
        binary("SELECT id FROM t ORDER BY id"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2039 session 885): in a read-only transaction, a statement
/// prepared through the binary protocol that fails (`DEALLOCATE PREPARE` of an unknown
/// name) leaves its error in the diagnostics area of the node it ran on; a prepared `SHOW
/// COUNT(*) WARNINGS` after it counts that error, as the server does.
#[test]
fn a_failed_prepared_statement_in_a_read_only_transaction_is_counted_where_it_is_read() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..2 {
        steps.extend([
            q("DROP TEMPORARY TABLE IF EXISTS tt"),
            q("START TRANSACTION READ ONLY"),
            binary("DEALLOCATE PREPARE ps"),
            binary("SHOW COUNT(*) WARNINGS"),
            binary("DEALLOCATE PREPARE ps"),
            q("SHOW WARNINGS"),
            q("SELECT COUNT(*) FROM t"),
            binary("DEALLOCATE PREPARE ps"),
            q("SELECT @@warning_count"),
            q("COMMIT"),
            binary("DEALLOCATE PREPARE ps"),
            binary("SHOW COUNT(*) WARNINGS"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2040 session 1356): in a read-only transaction on a replica,
/// a text whose comment is never closed (here an executable comment with one nested in
/// it) is refused by the server before anything runs (1064). holdfast took it for a
/// statement it could not read, which must leave the replica; the transaction could not
/// move (a setting made since changed what its read answers) and was given up (1213), and
/// the client's next write ran outside it. Such a text fails at parse wherever it runs:
/// it goes to the primary, beside the transaction. Outside one (seed 2041 session 388), its
/// error is what the statements after it that keep the diagnostics area show.
#[test]
fn a_text_with_an_unclosed_comment_fails_inside_a_read_only_transaction_as_the_server_says() {
    use holdfast_it::differential::{binary, q};
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("START TRANSACTION READ ONLY"),
        q("SELECT v FROM t WHERE id = 2"),
        q("SET SESSION sql_select_limit = 0"),
        q("/*!101118 /* nested? */ SELECT 1 FROM"),
        q("REPLACE INTO t (id, v) VALUES (9, 'q')"),
        q("SELECT 'after' /* x"),
        q("SHOW WARNINGS"),
        q("SET SESSION sql_select_limit = DEFAULT"),
        q("SELECT COUNT(*) FROM t"),
        q("COMMIT"),
        q("SELECT id, v FROM t ORDER BY id"),
        q("SELECT COUNT(*) FROM t WHERE id > 9"),
        q("SHOW COUNT(*) WARNINGS /*!101119 /* nested? */"),
        binary("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"),
        q("SELECT '#' AS s, '#' AS s2"),
        q("SELECT @@warning_count, @@error_count"),
        q("SHOW WARNINGS"),
        // The same after a write the primary refuses.
        q("UPDATE t SET nosuch = 1"),
        binary("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"),
        q("SELECT '#' AS s, '#' AS s2"),
        q("SELECT @@warning_count, @@error_count"),
        q("SHOW WARNINGS"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2040 session 1942): MariaDB keeps a session read-only after
/// `SET autocommit = 1` ends its read-only transaction (writes get 1792 until a `COMMIT`
/// or `ROLLBACK`); the same with the transaction pinned to a replica, where the primary
/// must end up in that state too.
#[test]
fn a_read_only_transaction_on_a_replica_ended_by_autocommit_leaves_writes_refused() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("SET autocommit = 0"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT COUNT(*) FROM t"),
        q("SET autocommit = 1"),
        q("UPDATE t SET v = 7 WHERE id = 1"),
        q("INSERT INTO t (id, v) VALUES (20, 1)"),
        q("SELECT @@in_transaction"),
        q("ROLLBACK"),
        q("INSERT INTO t (id, v) VALUES (21, 1)"),
        q("SELECT id, v FROM t ORDER BY id"),
        // (The same rows for the run through holdfast.)
        q("DELETE FROM t WHERE id IN (20, 21)"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2042 session 1058): `UNLOCK TABLES` keeps the diagnostics
/// area as the statement before it left it (`LOCK TABLES` clears it). After a read on a
/// replica, an `UNLOCK TABLES` on the primary showed the primary's older note.
#[test]
fn unlock_tables_keeps_a_replica_reads_diagnostics() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("DROP TEMPORARY TABLE IF EXISTS nosuch"),
        q("SELECT COUNT(*) FROM t"),
        q("UNLOCK TABLES"),
        q("SHOW COUNT(*) WARNINGS"),
        q("DROP TEMPORARY TABLE IF EXISTS nosuch"),
        q("UNLOCK TABLES"),
        q("SHOW WARNINGS"),
        q("SELECT CAST('1x' AS SIGNED) FROM t LIMIT 1"),
        q("UNLOCK TABLES"),
        q("SELECT @@warning_count"),
        q("LOCK TABLES t READ"),
        q("SHOW COUNT(*) WARNINGS"),
        q("UNLOCK TABLES"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2042 session 1138): `START TRANSACTION READ ONLY` keeps the
/// diagnostics area as the statement before it left it (tried): after an error on the
/// primary, `SHOW ERRORS` inside the transaction shows it.
#[test]
fn a_read_only_transaction_shows_the_error_before_it() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("/**/ XA COMMIT 'x' ONE PHASE"),
        q("START TRANSACTION READ ONLY"),
        q("SHOW ERRORS"),
        q("SELECT COUNT(*) FROM t"),
        q("SHOW ERRORS"),
        q("COMMIT"),
        // The same after a read with a warning on a replica.
        q("SELECT CAST('1x' AS SIGNED) FROM t LIMIT 1"),
        q("START TRANSACTION READ ONLY"),
        q("SHOW WARNINGS"),
        q("SELECT @@warning_count"),
        q("COMMIT"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2041 session 177, seed 2042 session 1138): in a read-only
/// transaction on a replica, a text the server refuses from its first statement (an `XA`
/// statement inside a transaction: 1400) or that ends the transaction after settings
/// only (`SET ...; ROLLBACK; <a text holdfast cannot read for sure>`) cost the
/// transaction (1213) when it could not move to the primary (a `SET NAMES` since changes
/// a read's answer there), and the statements after it ran outside it: writes went in
/// where the server refused them (1792).
#[test]
fn a_read_only_transaction_on_a_replica_keeps_to_the_server_s_answers_when_it_cannot_move() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        // The end of the transaction refused at parse (a comment that never closes,
        // nested in one MariaDB skips): the settings before it made, the transaction
        // still open.
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET NAMES latin1"),
        q("SET sql_mode = 'NO_BACKSLASH_ESCAPES';\nROLLBACK -- dash ' ; /*!40101 */;\n/*!101120 /* nested? */ SELECT v FROM t WHERE id = 2"),
        q("SELECT @@in_transaction, @@sql_mode"),
        q("INSERT INTO t (id, v) VALUES (33, 1)"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("ROLLBACK"),
        q("SET sql_mode = DEFAULT, NAMES utf8mb4"),
        // The end of the transaction after settings, then a text holdfast cannot read
        // for sure.
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET NAMES latin1"),
        q("SET sql_mode = 'NO_BACKSLASH_ESCAPES';\nROLLBACK -- dash ' ;\n;\n/*!100000 /* nested? */ SELECT v FROM t WHERE id = 2 */"),
        q("SELECT @@in_transaction, @@sql_mode"),
        q("INSERT INTO t (id, v) VALUES (30, 1)"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET NAMES utf8mb4"),
        q("SET @c = 1; COMMIT AND CHAIN; SELECT @@in_transaction, @c"),
        q("INSERT INTO t (id, v) VALUES (31, 1)"),
        q("ROLLBACK"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET NAMES latin1"),
        q("XA COMMIT 'x'; SELECT GET_LOCK('g', 0); LOCK TABLES t WRITE"),
        q("SHOW ERRORS"),
        q("SELECT @@in_transaction, IS_USED_LOCK('g') IS NULL"),
        q("INSERT INTO t (id, v) VALUES (32, 1)"),
        q("ROLLBACK"),
        q("SELECT id FROM t WHERE id >= 30 ORDER BY id"),
        q("DELETE FROM t WHERE id >= 30"),
        q("SET sql_mode = DEFAULT, NAMES utf8mb4"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2042 session 1973): a read that fails before it runs keeps
/// `FOUND_ROWS()` as the statement before left it. On the replica holding the session's
/// value, the wait for the session's last write (a `SELECT MASTER_GTID_WAIT(...)`) set it
/// to 1 first.
#[test]
fn a_failed_read_after_a_write_keeps_found_rows() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    // Reads are balanced over the replicas: several rounds, so that the failed read runs
    // where the one before it did.
    for round in 0..4 {
        steps.extend([
            q(&format!("SELECT id FROM t WHERE id <= {}", round + 2)),
            q("UPDATE t SET v = v + 1 WHERE id = 5"),
            q("SELECT * FROM nosuch"),
            q("SELECT FOUND_ROWS()"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// An operator's kill of a split session whose statement runs on a replica: `--query`
/// stops it there and the session goes on (same backend connection); a whole kill stops
/// it too, and the session's connection is gone at its next statement, as after a
/// server's `KILL`.
#[test]
fn an_operators_kill_reaches_a_read_on_a_replica() {
    let h = split_harness(|c| c.split.primary_read_weight = 0.0);
    h.root_sql(
        "CREATE TABLE sbtest.big (id INT PRIMARY KEY) SELECT seq AS id FROM sbtest.seq_1_to_2000",
    );
    rows_on_the_replicas(&h, "sbtest.big", 2000);
    for whole in [false, true] {
        let mut c = connect_to(&h.url());
        let id = c.connection_id();
        let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("an id");
        let started = std::time::Instant::now();
        let reading = std::thread::spawn(move || {
            // A long read (`SLEEP` or `BENCHMARK` has the primary run it).
            let r: mysql::Result<Option<i64>> =
                c.query_first("SELECT COUNT(*) FROM big a, big b, big c");
            (c, r.map_err(|e| e.to_string()))
        });
        let ran_on = wait_for("the read on a replica", Duration::from_secs(10), || {
            ["node1", "node2", "node3"].into_iter().find(|node| {
                holdfast_lab::node_sql(
                    h.node(node),
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT COUNT(*) FROM big a%'",
                )
                .is_ok_and(|rows| !rows.is_empty())
            })
        });
        assert_ne!(ran_on, "node1", "the read runs on a replica");
        let path = format!("/sessions/kill?id={id}&query={}", !whole);
        let (code, body) = h.admin_post(&path, None);
        assert_eq!(code, 200, "{body}");
        let (mut c, r) = reading.join().expect("the reading client");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the read was stopped"
        );
        let e = r.expect_err("the read was stopped");
        assert!(e.contains("1317"), "{e}");
        let next: mysql::Result<Option<u64>> = c.query_first("SELECT CONNECTION_ID()");
        match whole {
            false => assert_eq!(next.expect("the session goes on"), thread),
            true => assert!(next.is_err(), "the session is gone: {next:?}"),
        }
        if !whole {
            // A statement without tables keeps the area the stopped read left, as
            // directly (the read did not run again on the primary to leave it there: it
            // would have run for minutes, and the statement above waited for it).
            let shown: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").expect("warnings");
            assert_eq!(
                shown,
                interrupted_directly(&h),
                "through holdfast vs directly"
            );
        }
    }
}

/// The warnings a direct connection shows after its long read was stopped by a `KILL
/// QUERY` and a statement without tables ran.
fn interrupted_directly(h: &Harness) -> Vec<(String, u32, String)> {
    let url = format!(
        "mysql://{}:{}@{}/sbtest",
        h.user(),
        h.password(),
        h.node("node2").address
    );
    let mut c = connect_to(&url);
    let thread: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("an id");
    let thread = thread.expect("an id");
    let reading = std::thread::spawn(move || {
        let r: mysql::Result<Option<i64>> =
            c.query_first("SELECT COUNT(*) FROM big a, big b, big c");
        (c, r.is_err())
    });
    wait_for("the direct read", Duration::from_secs(10), || {
        holdfast_lab::node_sql(
            h.node("node2"),
            &format!("SELECT ID FROM information_schema.PROCESSLIST WHERE ID = {thread} AND INFO LIKE 'SELECT COUNT(*) FROM big a%'"),
        )
        .is_ok_and(|rows| !rows.is_empty())
        .then_some(())
    });
    holdfast_lab::node_sql(h.node("node2"), &format!("KILL QUERY {thread}")).expect("KILL QUERY");
    let (mut c, failed) = reading.join().expect("the direct reader");
    assert!(failed, "the direct read was stopped");
    let _: Option<u64> = c.query_first("SELECT CONNECTION_ID()").expect("an id");
    c.query("SHOW WARNINGS").expect("warnings")
}

/// Found by the fuzzer (seed 2050 session 116): in a read-only transaction on a replica, a
/// read sets `FOUND_ROWS()` there; a statement the server refuses in it (an `XA END` with
/// no XA transaction, 1399; a `CREATE TEMPORARY TABLE`, 1792) runs on the primary beside
/// the pinned transaction and, refused before it runs, keeps the value. The next
/// `FOUND_ROWS()` read ran on the primary, where the value had never been carried (1 where
/// the server answers 2, or 3).
#[test]
fn found_rows_after_a_statement_refused_beside_a_read_only_transaction_on_a_replica() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for refused in [
        "XA END 'x'",
        "CREATE TEMPORARY TABLE tmp_refused (a INT)",
        "XA START 'y'",
    ] {
        for read in ["DESCRIBE t", "SELECT id FROM t WHERE id <= 3"] {
            steps.extend([
                q("START TRANSACTION READ ONLY"),
                q(read),
                q(refused),
                q("SELECT FOUND_ROWS(), ROW_COUNT()"),
                q("SELECT id FROM t WHERE id = 1"),
                q(refused),
                q("SELECT FOUND_ROWS()"),
                q("COMMIT"),
            ]);
        }
    }
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2052 session 11): a multi-statement whose statements all keep
/// the diagnostics area (`SELECT GET_LOCK(...)` opens no table; `START TRANSACTION` is a
/// setting) keeps it as the read on a replica before it left it; run on the primary, it
/// showed the primary's older error.
#[test]
fn a_multi_statement_that_keeps_the_diagnostics_area_keeps_a_replica_reads() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("EXECUTE nosuch USING 10"),
        q("SELECT v FROM t WHERE id = 2"),
        q("SELECT GET_LOCK('ms_b', 0); START TRANSACTION WITH CONSISTENT SNAPSHOT"),
        q("SHOW ERRORS"),
        q("COMMIT"),
        q("SELECT * FROM nosuch"),
        q("SELECT v FROM t WHERE id = 3"),
        q("SET @m = 1; SELECT RELEASE_LOCK('ms_b')"),
        q("SHOW WARNINGS"),
        q("SELECT v FROM t WHERE id = 4"),
        // A statement that opens a table among them clears it.
        q("DO 1; SELECT v FROM t WHERE id = 5"),
        q("SHOW WARNINGS"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2042 session 792): a read that fails on a replica after a
/// write (it ran again on the primary, and failed the same) leaves its error in that
/// replica connection's diagnostics area: a later read without tables, which keeps the
/// area it finds, must not run there.
#[test]
fn a_failed_read_leaves_its_error_on_its_replica_connection() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("UPDATE t SET v = v + 1 WHERE id = 5"),
            q("SELECT * FROM nosuch"),
            q("SELECT v FROM t WHERE id = 2 FOR UPDATE"),
        ]);
        // (Reads without tables are balanced over the nodes: one of them lands on the
        // replica of the failed read.)
        for _ in 0..3 {
            steps.extend([q("SELECT @@tx_read_only"), q("SHOW COUNT(*) WARNINGS")]);
        }
    }
    same_as_directly(&h, &steps);
}

/// MariaDB skips the executable comments of MySQL 5.7 and later (`/*!50700 ... */`, tried
/// on 10.11): a `SELECT` whose tables or sequences are only in one opens none, and keeps
/// the diagnostics area as the statement before left it (seed 2045 session 513: it was
/// read on a replica, whose area was empty).
#[test]
fn a_read_whose_tables_are_in_a_skipped_executable_comment_keeps_the_diagnostics_area() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    // (Reads without tables are balanced over the nodes: repeated, one lands on a replica.)
    for _ in 0..3 {
        steps.extend([
            q("XA COMMIT 'x' ONE PHASE"),
            q("SELECT 3 /*!50700 , NEXTVAL(s) */"),
            q("SHOW COUNT(*) WARNINGS"),
            q("SELECT 4 /*!50700 FROM t */"),
            q("SHOW WARNINGS"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// A read-only transaction on a replica moves to the primary when a statement needs it
/// there (`SELECT 1; BEGIN`: the `BEGIN` commits it): its reads run again there, and
/// answer the same though a `SET sql_mode` made since sets `NO_BACKSLASH_ESCAPES` in the
/// status of every answer (seed 2046 session 540: the transaction was given up, 1213).
#[test]
fn a_read_only_transaction_moves_to_the_primary_after_a_change_of_sql_mode() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET sql_mode = 'NO_BACKSLASH_ESCAPES'"),
        q("SELECT 1; BEGIN"),
        q("COMMIT"),
        q("SET sql_mode = 'ANSI_QUOTES'"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT `t`.`v` AS `a;b` FROM `t` WHERE `id` = 2 # hash \" ;"),
        q("SET sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES'"),
        q("SELECT 2; BEGIN"),
        q("COMMIT"),
        // A read under the default mode, then `ANSI_QUOTES` (its own status flag), then a
        // setting from a query: the transaction moves (seed 2048 session 547).
        q("SET sql_mode = DEFAULT"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT v FROM t WHERE id = 2"),
        q("SET sql_mode = 'ANSI_QUOTES'"),
        q("SELECT @@in_transaction; SET @b = (SELECT COUNT(*) FROM t)"),
        q("SELECT @b, @@in_transaction"),
        q("SELECT @@in_transaction, @@sql_mode"),
        q("COMMIT"),
        q("SET sql_mode = DEFAULT"),
    ];
    same_as_directly(&h, &steps);
}

/// `COMMIT AND CHAIN` in a read-only transaction on a replica ends it and opens the next
/// one there: the reads that move a transaction to the primary are the new one's only
/// (seed 2047 session 138: the first one's reads ran again in the second on the primary,
/// holding their tables; one that answered otherwise by then cost the transaction).
#[test]
fn a_chained_read_only_transaction_moves_with_its_own_reads_only() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("SET @n = 1"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT @n, v FROM t WHERE id = 1"),
        q("COMMIT AND CHAIN"),
        q("SET @n = 2"),
        // A setting from a query: the transaction moves to the primary.
        q("SET @m = (SELECT v FROM t WHERE id = 1)"),
        q("SELECT @m, @n, @@in_transaction"),
        q("COMMIT"),
    ];
    same_as_directly(&h, &steps);
}

/// A multi-statement that begins with `BEGIN` inside a read-only transaction on a replica:
/// the server commits that transaction first, then opens one that may write, and the text
/// goes on there (seed 2048 session 262: the transaction was given up, 1213, where the
/// server answered the `INSERT`'s 1062 and kept the new transaction open).
#[test]
fn a_multi_statement_beginning_a_transaction_ends_the_read_only_one_as_the_server_does() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("SELECT SQL_CALC_FOUND_ROWS id FROM t ORDER BY id LIMIT 1"),
        q("SET @s = X'41'"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT `t`.`v` AS `a;b` FROM `t` WHERE `id` = 2 # hash \" ;"),
        q("SET sql_mode = 'ANSI_QUOTES'"),
        q("BEGIN; INSERT INTO t (id, v) VALUES (2, 0), (90, 0); SELECT 1"),
        q("SHOW WARNINGS"),
        q("SELECT @@in_transaction, @@tx_read_only"),
        q("INSERT INTO t (id, v) VALUES (91, 0)"),
        q("ROLLBACK"),
        q("SELECT COUNT(*) FROM t WHERE id >= 90"),
        q("SET sql_mode = DEFAULT"),
    ];
    same_as_directly(&h, &steps);
}

/// A setting inside a read-only transaction on a replica runs on both connections and
/// keeps each one's diagnostics area as it was: what the next statement reads of the
/// last is still the area the statement before the setting left (seed 2048 session 320:
/// the primary's older warning was read).
#[test]
fn a_setting_in_a_read_only_transaction_keeps_the_diagnostics_the_client_had() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend([
            q("DROP TABLE IF EXISTS nosuch"),
            q("SELECT v FROM t WHERE id = 1"),
            q("START TRANSACTION READ ONLY"),
            q("SET autocommit = 0"),
            q("SELECT @@warning_count, @@error_count"),
            q("SET @x = 1"),
            q("SHOW WARNINGS"),
            q("COMMIT"),
            q("SET autocommit = 1"),
        ]);
    }
    same_as_directly(&h, &steps);
}

/// A text whose last statement is only a comment is two statements to MariaDB (tried):
/// through the split listener too, answered as the server answers it.
#[test]
fn a_comment_after_the_last_semicolon_is_a_statement_of_its_own() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("INSERT INTO t (id, v) VALUES (40, 1); -- done"),
        q("SELECT COUNT(*) FROM t; /* done */"),
        q("SELECT @@warning_count; # done"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT COUNT(*) FROM t; -- done"),
        q("SET @a = 1; /* never closed"),
        q("SELECT @a, @@in_transaction"),
        q("COMMIT; -- done"),
        q("DELETE FROM t WHERE id = 40; /*!101120 /* nested */ never closed"),
        q("SELECT COUNT(*) FROM t"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2043 session 976): MariaDB's read-only state after `SET
/// autocommit = 1` ended a read-only transaction ends with the next statement that opens
/// a table (a read in autocommit mode commits; tried: `SELECT 1` does not, a read of a
/// missing table does not). Such a read ran on a replica, and the primary refused the
/// writes after it (1792) where the server took them. While that state lasts, statements
/// run on the primary.
#[test]
fn the_read_only_state_after_autocommit_ends_where_the_server_ends_it() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        q("/* plain */ SELECT RELEASE_LOCK('fz_a'); START TRANSACTION READ ONLY"),
        q("SET @@session.autocommit = 0"),
        q("SET autocommit = 1"),
        q("SELECT 1"),
        q("UPDATE t SET v = v WHERE id = 9"),
        q("WITH c AS (SELECT id FROM t) SELECT COUNT(*) FROM c"),
        q("UPDATE t SET v = v WHERE id = 9"),
        q("DELETE FROM t WHERE id > 100"),
        // The same with a read-only transaction begun while the state lasts.
        q("SET autocommit = 0"),
        q("START TRANSACTION READ ONLY"),
        q("SET autocommit = 1"),
        q("START TRANSACTION READ ONLY"),
        q("SELECT COUNT(*) FROM t"),
        q("COMMIT"),
        q("UPDATE t SET v = v WHERE id = 9"),
        q("SELECT COUNT(*) FROM t"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2043 session 1872): in a read-only transaction on a replica
/// that cannot move (a `SET NAMES` since changes a read's answer), a multi-statement whose
/// write the server refuses (1792) after an `UNLOCK TABLES` that does nothing cost the
/// transaction (1213), and the writes after went in. The server's answers, whatever
/// follows the refused statement.
#[test]
fn writes_refused_in_a_read_only_transaction_on_a_replica_do_not_cost_it() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    let steps = vec![
        // Writes the server refuses in the transaction (1792), after a setting and an
        // `UNLOCK TABLES` that does nothing (seed 2043 session 1872), and before a text
        // holdfast cannot read for sure.
        q("START TRANSACTION READ ONLY"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("SET NAMES latin1"),
        q("UNLOCK TABLES; CREATE TEMPORARY TABLE tt (a INT PRIMARY KEY); CREATE TEMPORARY TABLE tt AS SELECT id AS a FROM t"),
        q("SET @w = 1; INSERT INTO t (id, v) VALUES (33, 1); /*!100000 /* nested? */ SELECT 1 */"),
        q("SELECT @w, @@in_transaction"),
        q("SHOW ERRORS"),
        q("DELETE FROM t WHERE id = 1; SELECT 1"),
        q("CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT PRIMARY KEY)"),
        q("SELECT CONCAT('v', v) FROM t WHERE id = 2"),
        q("COMMIT"),
        q("SET NAMES utf8mb4"),
        q("SELECT id FROM t WHERE id >= 30 ORDER BY id"),
    ];
    same_as_directly(&h, &steps);
}

/// Found by the fuzzer (seed 2048, session 1296): in a read-only transaction on a replica
/// with `autocommit` turned off inside it, a procedure that sets a user variable runs on
/// the primary; the transaction must move there (the replica's connection cannot follow).
/// The move ran the transaction's reads again and found an answer otherwise: it gave the
/// transaction up (1213) where the server answers, and the `DELETE` after it went in (the
/// server: 1792).
#[test]
fn a_procedure_in_a_read_only_transaction_with_autocommit_off_moves_it_to_the_primary() {
    use holdfast_it::differential::q;
    let h = split_harness(|_| {});
    table_t_everywhere(&h);
    h.root_sql("CREATE PROCEDURE sbtest.p_var() SET @pv = (SELECT COUNT(*) FROM t)");
    let steps = [
        q("START TRANSACTION READ ONLY"),
        q("SHOW TABLES"),
        q("SET autocommit = 0"),
        q("CALL p_var()"),
        q("SELECT COUNT(*) FROM t"),
        q("DELETE FROM t WHERE id = 6"),
        q("SELECT @pv, @@autocommit, @@in_transaction"),
        q("ROLLBACK"),
        q("SET autocommit = 1"),
    ];
    same_as_directly(&h, &steps);
}

/// A replica's system variable types (how each session variable is written back there)
/// are read once per server, not once per session: six sessions open replica connections
/// with their state synced (sql_mode, a length), and each replica's general log shows
/// one `information_schema.SYSTEM_VARIABLES` read at most. The table is some 600 rows, and
/// each replica connection kept its own copy (60 KB per idle split session).
#[test]
fn a_replicas_variable_types_are_read_once_for_all_sessions() {
    let h = split_harness(|_| {});
    let (primary, replicas) = server_ids(&h);
    let replica_nodes = h.lab.replicas().to_vec();
    for node in &replica_nodes {
        holdfast_lab::node_sql(
            node,
            "SET GLOBAL log_output = 'TABLE'; TRUNCATE mysql.general_log; SET GLOBAL general_log = 1",
        )
        .expect("the general log on");
    }
    let mut sessions: Vec<Conn> = (0..6).map(|_| connect_to(&h.url())).collect();
    let mut on_replicas = HashSet::new();
    for (i, c) in sessions.iter_mut().enumerate() {
        c.query_drop(format!(
            "SET SESSION sql_mode = 'ANSI_QUOTES', group_concat_max_len = {}",
            1000 + i
        ))
        .unwrap();
        for _ in 0..2 {
            let (id, mode, len): (u32, String, usize) = c
                .query_first("SELECT @@server_id, @@sql_mode, @@group_concat_max_len")
                .unwrap()
                .unwrap();
            assert_eq!(node_of(id, primary, &replicas), Node::Replica);
            assert_eq!((mode.as_str(), len), ("ANSI_QUOTES", 1000 + i));
            on_replicas.insert(id);
        }
    }
    let mut loads = Vec::new();
    for node in &replica_nodes {
        let rows = holdfast_lab::node_sql(
            node,
            "SELECT COUNT(*) FROM mysql.general_log WHERE argument LIKE '%information_schema.SYSTEM_VARIABLES%' \
             AND argument NOT LIKE '%general_log%'",
        )
        .expect("the general log");
        holdfast_lab::node_sql(node, "SET GLOBAL general_log = 0").expect("the general log off");
        loads.push(rows[0][0].parse::<u32>().expect("a count"));
    }
    assert!(!on_replicas.is_empty());
    assert!(
        loads.iter().all(|&n| n <= 1),
        "SYSTEM_VARIABLES reads per replica: {loads:?}"
    );
    assert!(loads.iter().sum::<u32>() >= 1, "read where a session read");
}
