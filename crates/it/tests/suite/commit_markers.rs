//! Commit markers (issue 8, item 4): a COMMIT whose answer is lost because its primary was
//! killed with SIGKILL gets the truth. The primary is made to hold the COMMIT (semi-sync
//! with nobody to acknowledge: the commit waits after it is written to the binary log) and
//! is killed while it waits. If a replica had already received the transaction, the new
//! primary has it and the client gets the COMMIT's OK; if none had, the transaction is
//! replayed and committed on the new primary. Either way each row is there once.

use holdfast_it::{metric, wait_for, Harness, Options};
use holdfast_lab::{node_sql, node_sql_value, NodeStatus};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);
/// When the primary is killed, after the COMMIT went out.
const KILL_AFTER: Duration = Duration::from_millis(800);

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

fn outcomes(h: &Harness, outcome: &str) -> f64 {
    metric(
        &h.metrics(),
        &format!("holdfast_lost_commit_outcomes_total{{reason=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Two replicas (asynchronous: the test decides who acknowledges), markers ready and the
/// marker table on every node.
fn cluster() -> Harness {
    let h = Harness::start_with(Options::default().replicas(2));
    wait_for("commit markers ready", WAIT, || {
        (h.status_json()["commit_markers"] == "ready").then_some(())
    });
    for n in &h.lab.status.nodes {
        wait_for("the marker table on every node", WAIT, || {
            node_sql_value(
                n,
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = 'holdfast' AND TABLE_NAME = 'commit_marker'",
            )
            .ok()
            .flatten()
            .filter(|v| v == "1")
        });
    }
    h
}

fn primary(h: &Harness) -> String {
    h.status_json()["topology"]["primary"]
        .as_str()
        .expect("a primary")
        .to_string()
}

/// Every commit on `primary` from now on waits (up to 60 s) for an acknowledgement that
/// no replica sends: it is in the binary log, not yet answered.
fn hold_commits(h: &Harness, primary: &str) {
    node_sql(
        h.node(primary),
        "SET GLOBAL rpl_semi_sync_master_timeout = 60000; \
         SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON; \
         SET GLOBAL rpl_semi_sync_master_enabled = ON",
    )
    .expect("semi-sync on the primary");
}

/// Sends COMMIT and kills `primary` with SIGKILL while it waits; returns the COMMIT's
/// result.
fn commit_while_the_primary_dies(h: &Harness, c: &mut Conn, primary: &str) -> mysql::Result<()> {
    let lab_dir = h.lab.status.dir.clone();
    let victim = primary.to_string();
    let kill = std::thread::spawn(move || {
        std::thread::sleep(KILL_AFTER);
        holdfast_lab::kill_node(&lab_dir, &victim).expect("kill the primary");
    });
    let started = Instant::now();
    let result = c.query_drop("COMMIT");
    let took = started.elapsed();
    kill.join().unwrap();
    assert!(
        took >= KILL_AFTER,
        "the COMMIT was answered after {took:?}, before the primary died: it was not in flight"
    );
    result
}

fn rows(n: &NodeStatus, table: &str) -> Vec<Vec<String>> {
    node_sql(n, &format!("SELECT id, v FROM sbtest.{table} ORDER BY id")).unwrap()
}

#[test]
fn a_commit_lost_after_a_replica_received_it_is_answered_ok() {
    let h = cluster();
    let old = primary(&h);
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.cm (id INT PRIMARY KEY, v INT)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.exec_drop("INSERT INTO sbtest.cm VALUES (?, ?)", (1, 10))
        .unwrap();
    c.query_drop("UPDATE sbtest.cm SET v = v + 1 WHERE id = 1")
        .unwrap();
    // The replicas stop acknowledging (they replicate asynchronously): they receive the
    // transaction at once, while the primary waits for an acknowledgement.
    for n in h.lab.status.nodes.iter().filter(|n| n.name != old) {
        node_sql(
            n,
            "SET GLOBAL rpl_semi_sync_slave_enabled = OFF; STOP SLAVE IO_THREAD; START SLAVE IO_THREAD",
        )
        .unwrap();
    }
    hold_commits(&h, &old);
    commit_while_the_primary_dies(&h, &mut c, &old)
        .expect("the COMMIT is answered OK: its marker is on the new primary");
    let new = h.wait_primary_other_than(&old, WAIT);
    assert_eq!(
        rows(h.node(&new), "cm"),
        vec![vec!["1".to_string(), "11".into()]]
    );
    assert_eq!(outcomes(&h, "committed"), 1.0);
    // The session goes on, outside any transaction.
    c.query_drop("INSERT INTO sbtest.cm VALUES (2, 20)")
        .unwrap();
    let n: Option<u64> = c.query_first("SELECT COUNT(*) FROM sbtest.cm").unwrap();
    assert_eq!(n, Some(2));
}

#[test]
fn a_commit_lost_before_any_replica_received_it_is_replayed_and_committed_once() {
    let h = cluster();
    let old = primary(&h);
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.cr (id INT PRIMARY KEY, v INT)")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.cr VALUES (1, 10)")
        .unwrap();
    // The table and its first row are on the replicas before they stop receiving.
    for n in h.lab.status.nodes.iter().filter(|n| n.name != old) {
        wait_for("the first row replicated", WAIT, || {
            node_sql_value(n, "SELECT COUNT(*) FROM sbtest.cr")
                .ok()
                .flatten()
                .filter(|v| v == "1")
        });
        node_sql(n, "STOP SLAVE IO_THREAD").unwrap();
    }
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.cr VALUES (2, 20)")
        .unwrap();
    c.exec_drop("UPDATE sbtest.cr SET v = v + ? WHERE id = ?", (5, 1))
        .unwrap();
    hold_commits(&h, &old);
    commit_while_the_primary_dies(&h, &mut c, &old)
        .expect("the transaction is replayed and committed on the new primary");
    let new = h.wait_primary_other_than(&old, WAIT);
    assert_eq!(
        rows(h.node(&new), "cr"),
        vec![
            vec!["1".to_string(), "15".into()],
            vec!["2".into(), "20".into()]
        ],
        "the transaction committed once, on the new primary"
    );
    assert_eq!(outcomes(&h, "replayed"), 1.0);
}

/// An autocommit INSERT (as text, and prepared) is wrapped with a marker: lost in flight
/// after a replica received it, the client gets its OK (affected rows and insert id) and
/// the row is there once; lost before any replica received it, it runs again on the new
/// primary, once. Either way `LAST_INSERT_ID()` and `ROW_COUNT()` read the write's next.
#[test]
fn an_autocommit_insert_lost_in_flight_is_applied_exactly_once() {
    for (received, prepared) in [(true, false), (false, false), (true, true), (false, true)] {
        let case = format!("received={received} prepared={prepared}");
        let h = cluster();
        let old = primary(&h);
        let mut c = connect(&h);
        c.query_drop("CREATE TABLE sbtest.ai (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
            .unwrap();
        c.query_drop("INSERT INTO sbtest.ai (v) VALUES (1), (2)")
            .unwrap();
        for n in h.lab.status.nodes.iter().filter(|n| n.name != old) {
            wait_for("the first rows replicated", WAIT, || {
                node_sql_value(n, "SELECT COUNT(*) FROM sbtest.ai")
                    .ok()
                    .flatten()
                    .filter(|v| v == "2")
            });
            let stop = match received {
                true => "SET GLOBAL rpl_semi_sync_slave_enabled = OFF; STOP SLAVE IO_THREAD; START SLAVE IO_THREAD",
                false => "STOP SLAVE IO_THREAD",
            };
            node_sql(n, stop).unwrap();
        }
        hold_commits(&h, &old);
        let lab_dir = h.lab.status.dir.clone();
        let victim = old.clone();
        let kill = std::thread::spawn(move || {
            std::thread::sleep(KILL_AFTER);
            holdfast_lab::kill_node(&lab_dir, &victim).expect("kill the primary");
        });
        let started = Instant::now();
        let result = match prepared {
            true => c.exec_drop("INSERT INTO sbtest.ai (v) VALUES (?)", (3,)),
            false => c.query_drop("INSERT INTO sbtest.ai (v) VALUES (3)"),
        };
        let took = started.elapsed();
        kill.join().unwrap();
        assert!(took >= KILL_AFTER, "answered after {took:?}: not in flight");
        result.unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(c.affected_rows(), 1, "{case}");
        assert_eq!(c.last_insert_id(), 3, "{case}");
        // What the session reads of the write next is the write's, on the new primary too.
        let after: Option<(u64, i64)> = c
            .query_first("SELECT LAST_INSERT_ID(), ROW_COUNT()")
            .unwrap();
        assert_eq!(after, Some((3, 1)), "{case}: LAST_INSERT_ID(), ROW_COUNT()");
        let new = h.wait_primary_other_than(&old, WAIT);
        assert_eq!(
            rows(h.node(&new), "ai"),
            vec![
                vec!["1".to_string(), "1".into()],
                vec!["2".into(), "2".into()],
                vec!["3".into(), "3".into()]
            ],
            "{case}: the row once"
        );
        let outcome = if received { "committed" } else { "replayed" };
        assert_eq!(outcomes(&h, outcome), 1.0, "{case}");
        // A read-only transaction next writes no marker (a marker there is refused with
        // 1792, and the session's writes went on without markers from then on)...
        c.query_drop("START TRANSACTION READ ONLY").unwrap();
        let _: Option<i64> = c.query_first("SELECT COUNT(*) FROM sbtest.ai").unwrap();
        c.query_drop("COMMIT").unwrap();
        let seq =
            || node_sql_value(h.node(&new), "SELECT MAX(seq) FROM holdfast.commit_marker").unwrap();
        let before = seq();
        // ...and, not in a transaction, the next write commits by itself, marked.
        c.query_drop("INSERT INTO sbtest.ai (v) VALUES (4)")
            .unwrap();
        assert_ne!(seq(), before, "{case}: the next autocommit write is marked");
        let n = node_sql_value(h.node(&new), "SELECT COUNT(*) FROM sbtest.ai").unwrap();
        assert_eq!(n.as_deref(), Some("4"));
    }
}

/// Which statements write a marker: a transaction that wrote (at its COMMIT), an autocommit
/// write unless `mark_autocommit_writes = false`; never a read-only transaction.
#[test]
fn markers_are_written_for_writes_only_and_autocommit_ones_can_be_left_out() {
    for wrap in [true, false] {
        let h = Harness::start_with(Options::default().config(move |c| {
            c.ha.mark_autocommit_writes = wrap;
        }));
        let mut c = connect(&h);
        let markers = |h: &Harness| {
            h.root_sql("SELECT COALESCE(SUM(seq), 0) FROM holdfast.commit_marker")[0][0].clone()
        };
        c.query_drop("CREATE TABLE sbtest.mw (id INT PRIMARY KEY)")
            .unwrap();
        c.query_drop("BEGIN").unwrap();
        let _: Vec<i32> = c.query("SELECT id FROM sbtest.mw").unwrap();
        c.query_drop("COMMIT").unwrap();
        assert_eq!(markers(&h), "0", "wrap={wrap}: a read-only transaction");
        c.query_drop("INSERT INTO sbtest.mw VALUES (1)").unwrap();
        assert_eq!(c.affected_rows(), 1);
        let expected = if wrap { "1" } else { "0" };
        assert_eq!(markers(&h), expected, "wrap={wrap}: an autocommit insert");
        c.query_drop("BEGIN").unwrap();
        c.query_drop("INSERT INTO sbtest.mw VALUES (2)").unwrap();
        c.query_drop("COMMIT").unwrap();
        let expected = if wrap { "2" } else { "1" };
        assert_eq!(
            markers(&h),
            expected,
            "wrap={wrap}: a transaction that wrote"
        );
        // Not left in a transaction by the wrap.
        let in_trx: Option<i32> = c.query_first("SELECT @@in_transaction").unwrap();
        assert_eq!(in_trx, Some(0));
    }
}

/// `sql` on a direct connection to `node` with a 1 s lock wait: `Some(code)` of its error.
fn blocked_read(node: &NodeStatus, sql: &str) -> Option<String> {
    node_sql(node, &format!("SET SESSION lock_wait_timeout = 1; {sql}"))
        .err()
        .map(|e| format!("{e:#}"))
}

/// Issue 18, item 2: with markers on, a write under `LOCK TABLES` is not wrapped (the
/// wrap's `BEGIN` released the locks: another session read the table at once), nor a
/// COMMIT marked while table locks are held (`autocommit=0`: the marker write fails there,
/// 1100). Another session waits for the lock, as it does directly (1205 after
/// lock_wait_timeout).
#[test]
fn writes_under_lock_tables_are_neither_wrapped_nor_marked() {
    let h = cluster();
    let primary_node = h.node(&primary(&h)).clone();
    h.root_sql("CREATE TABLE sbtest.lt (a INT PRIMARY KEY)");
    let mut c = connect(&h);
    c.query_drop("LOCK TABLES lt WRITE").unwrap();
    c.query_drop("INSERT INTO lt VALUES (1)").unwrap();
    let err = blocked_read(&primary_node, "SELECT COUNT(*) FROM sbtest.lt")
        .expect("the table is still locked: another session waits");
    assert!(err.contains("1205"), "{err}");
    c.query_drop("UNLOCK TABLES").unwrap();

    // autocommit=0: the COMMIT does not release table locks, and gets no marker.
    let markers_before =
        node_sql_value(&primary_node, "SELECT COUNT(*) FROM holdfast.commit_marker").unwrap();
    c.query_drop("SET autocommit = 0").unwrap();
    c.query_drop("LOCK TABLES lt WRITE").unwrap();
    c.query_drop("INSERT INTO lt VALUES (2)").unwrap();
    c.query_drop("COMMIT").unwrap();
    let err = blocked_read(&primary_node, "SELECT COUNT(*) FROM sbtest.lt")
        .expect("still locked after COMMIT");
    assert!(err.contains("1205"), "{err}");
    c.query_drop("UNLOCK TABLES").unwrap();
    c.query_drop("SET autocommit = 1").unwrap();
    let rows: u32 = c.query_first("SELECT COUNT(*) FROM lt").unwrap().unwrap();
    assert_eq!(rows, 2);
    assert_eq!(
        node_sql_value(&primary_node, "SELECT COUNT(*) FROM holdfast.commit_marker").unwrap(),
        markers_before,
        "no marker was written under table locks"
    );
    // The session still marks its writes afterwards (no marker was refused).
    c.query_drop("INSERT INTO lt VALUES (3)").unwrap();
    assert_ne!(
        node_sql_value(&primary_node, "SELECT COUNT(*) FROM holdfast.commit_marker").unwrap(),
        markers_before,
        "markers go on once the locks are released"
    );
}

/// Issue 18, item 7: no account but holdfast's may read or change another session's
/// marker. A plain account (all rights on sbtest only) can neither read nor update the
/// table, and even knowing a session's key, the definer routines do not let it change or
/// read that row (it belongs to the user name that wrote it).
#[test]
fn a_plain_account_cannot_forge_a_commit_marker() {
    let h = cluster();
    let primary_node = h.node(&primary(&h)).clone();
    h.root_sql(
        "CREATE TABLE sbtest.fm (a INT PRIMARY KEY); \
         CREATE USER 'plain'@'%' IDENTIFIED BY 'plain_pass'; \
         GRANT ALL PRIVILEGES ON sbtest.* TO 'plain'@'%'",
    );
    // An app session writes a marker (an autocommit insert is wrapped with one).
    let mut c = connect(&h);
    c.query_drop("INSERT INTO fm VALUES (1)").unwrap();
    let row = node_sql(
        &primary_node,
        "SELECT session, owner, seq FROM holdfast.commit_marker ORDER BY at DESC LIMIT 1",
    )
    .unwrap();
    let (key, owner, seq) = (row[0][0].clone(), row[0][1].clone(), row[0][2].clone());
    assert_eq!(owner, "app");

    let plain = |sql: &str| {
        let out = h.mariadb_as(h.proxy, "plain", "plain_pass", &["-N", "-B", "-e", sql]);
        (out.code, out.stdout.trim().to_string(), out.stderr)
    };
    for sql in [
        "UPDATE holdfast.commit_marker SET seq = 18446744073709551615".to_string(),
        "UPDATE holdfast.commit_marker SET seq = 0".to_string(),
        "SELECT session, seq FROM holdfast.commit_marker".to_string(),
        format!("INSERT INTO holdfast.commit_marker (session, seq) VALUES ({key}, 0) ON DUPLICATE KEY UPDATE seq = 0"),
    ] {
        let (code, _, err) = plain(&sql);
        assert_eq!(code, Some(1), "{sql} must be refused");
        assert!(err.contains("1142"), "{sql}: {err}");
    }
    // With the key (leaked), through the routines: nothing changes, nothing is read.
    let (code, _, err) = plain(&format!(
        "CALL holdfast.mark_v1({key}, 18446744073709551615, 0, 0)"
    ));
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = plain(&format!("SELECT holdfast.marker_of_v1({key})"));
    assert_eq!((code, out.as_str()), (Some(0), "NULL"), "{err}");
    let now = node_sql(
        &primary_node,
        &format!("SELECT owner, seq FROM holdfast.commit_marker WHERE session = {key}"),
    )
    .unwrap();
    assert_eq!(
        now,
        vec![vec!["app".to_string(), seq]],
        "the row is unchanged"
    );
}
