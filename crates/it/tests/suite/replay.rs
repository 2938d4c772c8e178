//! Transaction replay (issue 8, item 3): a transaction open when its primary is killed with
//! SIGKILL runs again on the node that takes over, and the client carries on; when an answer
//! differs from the one the client got, it is rolled back with 1213 as before.

use holdfast_config::Durability;
use holdfast_it::{metric, wait_for, Harness, Options};
use holdfast_lab::node_sql;
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

fn mysql_error(e: &mysql::Error) -> Option<(u16, &str)> {
    match e {
        mysql::Error::MySqlError(e) => Some((e.code, e.state.as_str())),
        _ => None,
    }
}

fn replays(h: &Harness, outcome: &str) -> f64 {
    metric(
        &h.metrics(),
        &format!("holdfast_transaction_replays_total{{reason=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// node1 is killed with SIGKILL and started again: the session's transaction died with it.
fn crash_and_restart(h: &mut Harness) {
    h.lab.kill_node("node1").expect("kill node1");
    h.lab.start_node("node1").expect("start node1");
}

/// A harness with two replicas acknowledging semi-synchronously, so that what was
/// committed before the kill is on the node that takes over.
fn semi_sync_cluster() -> Harness {
    let h = Harness::start_with(Options::default().replicas(2).config(|c| {
        c.ha.durability = Durability::SemiSync;
        c.ha.semi_sync_timeout_ms = 5_000;
    }));
    wait_for("both replicas acknowledging", WAIT, || {
        let s = h.status_json()["ha"]["semi_sync"].clone();
        (s["active"] == true && s["clients"] == 2).then_some(())
    });
    h
}

#[test]
fn an_open_transaction_lost_while_idle_is_replayed_and_the_client_carries_on() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rp (id INT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.rp VALUES (1, 'one'), (2, 'two')")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.rp VALUES (3, 'three')")
        .unwrap();
    // A prepared statement (binary protocol) and a read whose rows the replay compares.
    c.exec_drop("UPDATE sbtest.rp SET v = ? WHERE id = ?", ("uno", 1))
        .unwrap();
    let seen: Vec<(i32, String)> = c.query("SELECT id, v FROM sbtest.rp ORDER BY id").unwrap();
    assert_eq!(seen.len(), 3);
    crash_and_restart(&mut h);
    // The transaction is open again on the restarted node: the next statement joins it.
    c.exec_drop("INSERT INTO sbtest.rp VALUES (?, ?)", (4, "four"))
        .expect("the statement after the crash runs in the replayed transaction");
    let inside: Vec<(i32, String)> = c.query("SELECT id, v FROM sbtest.rp ORDER BY id").unwrap();
    assert_eq!(
        inside,
        vec![
            (1, "uno".into()),
            (2, "two".into()),
            (3, "three".into()),
            (4, "four".into())
        ]
    );
    c.query_drop("COMMIT").unwrap();
    let rows = node_sql(h.node("node1"), "SELECT id, v FROM sbtest.rp ORDER BY id").unwrap();
    assert_eq!(
        rows,
        vec![
            vec!["1".to_string(), "uno".into()],
            vec!["2".into(), "two".into()],
            vec!["3".into(), "three".into()],
            vec!["4".into(), "four".into()],
        ],
        "the replayed transaction committed, each row once"
    );
    assert_eq!(replays(&h, "replayed"), 1.0);
}

#[test]
fn a_replay_whose_answers_differ_is_rolled_back_with_1213() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rd (id INT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.rd VALUES (1, 'before')")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    let v: Option<String> = c
        .query_first("SELECT v FROM sbtest.rd WHERE id = 1")
        .unwrap();
    assert_eq!(v.as_deref(), Some("before"));
    c.query_drop("INSERT INTO sbtest.rd VALUES (2, 'decided on before')")
        .unwrap();
    crash_and_restart(&mut h);
    // Someone else changes what the transaction read before it is replayed.
    node_sql(
        h.node("node1"),
        "UPDATE sbtest.rd SET v = 'after' WHERE id = 1",
    )
    .unwrap();
    let err = c
        .query_drop("INSERT INTO sbtest.rd VALUES (3, 'x')")
        .unwrap_err();
    assert_eq!(mysql_error(&err), Some((1213, "40001")), "{err}");
    c.query_drop("ROLLBACK").unwrap();
    let ids: Vec<i32> = c.query("SELECT id FROM sbtest.rd ORDER BY id").unwrap();
    assert_eq!(ids, vec![1], "nothing of the diverged replay was kept");
    assert_eq!(replays(&h, "diverged"), 1.0);
    assert_eq!(replays(&h, "replayed"), 0.0);
}

#[test]
fn a_transaction_that_used_a_user_variable_is_not_replayed() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.ru (id INT PRIMARY KEY)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("SET @next = 1").unwrap();
    c.query_drop("INSERT INTO sbtest.ru VALUES (@next)")
        .unwrap();
    crash_and_restart(&mut h);
    let err = c
        .query_drop("INSERT INTO sbtest.ru VALUES (2)")
        .unwrap_err();
    assert_eq!(mysql_error(&err), Some((1213, "40001")), "{err}");
    let ids: Vec<i32> = c.query("SELECT id FROM sbtest.ru").unwrap();
    assert!(ids.is_empty(), "{ids:?}");
    assert_eq!(replays(&h, "replayed"), 0.0);
}

/// The primary is killed while a statement of the transaction runs: after the failover
/// the transaction is replayed on the new primary and the statement runs again there; its
/// answer is the client's first. Auto-increment ids and LAST_INSERT_ID() come out as the
/// client saw them.
#[test]
fn a_statement_in_flight_when_the_primary_dies_runs_again_in_the_replayed_transaction() {
    let h = semi_sync_cluster();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rf (id INT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL)")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.rf (v) VALUES (10), (20)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.exec_drop("INSERT INTO sbtest.rf (v) VALUES (?)", (30,))
        .unwrap();
    let id: Option<u64> = c.query_first("SELECT LAST_INSERT_ID()").unwrap();
    assert_eq!(id, Some(3));
    let old = h.status_json()["topology"]["primary"]
        .as_str()
        .expect("a primary")
        .to_string();
    let kill = {
        let lab_dir = h.lab.status.dir.clone();
        let old = old.clone();
        std::thread::spawn(move || {
            // While the statement below sleeps on the primary.
            std::thread::sleep(Duration::from_millis(700));
            holdfast_lab::kill_node(&lab_dir, &old).expect("kill the primary");
        })
    };
    let started = std::time::Instant::now();
    c.query_drop("UPDATE sbtest.rf SET v = v + 1 WHERE id = 1 AND SLEEP(2) = 0")
        .expect("the statement in flight is run again in the replayed transaction");
    kill.join().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "the statement was in flight when the primary died"
    );
    assert_eq!(c.affected_rows(), 1);
    let new = h.wait_primary_other_than(&old, WAIT);
    let id: Option<u64> = c.query_first("SELECT LAST_INSERT_ID()").unwrap();
    assert_eq!(id, Some(3), "LAST_INSERT_ID() as the transaction left it");
    c.query_drop("COMMIT").unwrap();
    let rows = node_sql(h.node(&new), "SELECT id, v FROM sbtest.rf ORDER BY id").unwrap();
    assert_eq!(
        rows,
        vec![
            vec!["1".to_string(), "11".into()],
            vec!["2".into(), "20".into()],
            vec!["3".into(), "30".into()],
        ],
        "on the new primary: the transaction's rows, each once"
    );
    assert_eq!(replays(&h, "replayed"), 1.0);
}

/// sysbench's way: BEGIN and COMMIT prepared and executed like the other statements. The
/// transaction is replayed from its prepared BEGIN, and its prepared COMMIT commits it.
#[test]
fn a_transaction_of_prepared_statements_from_begin_to_commit_is_replayed() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rps (id INT PRIMARY KEY, v INT)")
        .unwrap();
    c.exec_drop("INSERT INTO sbtest.rps VALUES (?, ?)", (1, 1))
        .unwrap();
    c.exec_drop("BEGIN", ()).unwrap();
    c.exec_drop("UPDATE sbtest.rps SET v = v + ? WHERE id = ?", (10, 1))
        .unwrap();
    let v: Option<i32> = c
        .exec_first("SELECT v FROM sbtest.rps WHERE id = ?", (1,))
        .unwrap();
    assert_eq!(v, Some(11));
    crash_and_restart(&mut h);
    c.exec_drop("INSERT INTO sbtest.rps VALUES (?, ?)", (2, 2))
        .expect("the replayed transaction goes on");
    c.exec_drop("COMMIT", ()).unwrap();
    let rows = node_sql(h.node("node1"), "SELECT id, v FROM sbtest.rps ORDER BY id").unwrap();
    assert_eq!(
        rows,
        vec![
            vec!["1".to_string(), "11".into()],
            vec!["2".into(), "2".into()]
        ]
    );
    assert_eq!(replays(&h, "replayed"), 1.0);
}

/// Issue 18, item 8: a prepared statement executed in the transaction and closed before
/// the backend is lost makes the transaction not replayable: the client gets one 1213 for
/// its next statement and the session stays in step (a replay ran the closed statement's
/// execute and wrote its ERR to the client, one answer too many).
#[test]
fn a_transaction_whose_prepared_statement_was_closed_is_not_replayed() {
    let mut h = Harness::start();
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rc (id INT PRIMARY KEY, v VARCHAR(20))")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    let insert = c.prep("INSERT INTO sbtest.rc VALUES (?, ?)").unwrap();
    c.exec_drop(&insert, (1, "one")).unwrap();
    c.close(insert).unwrap();
    crash_and_restart(&mut h);
    let err = c
        .query_drop("INSERT INTO sbtest.rc VALUES (2, 'two')")
        .expect_err("the transaction was lost and cannot be replayed");
    assert_eq!(mysql_error(&err).map(|e| e.0), Some(1213), "{err}");
    // One answer per request: the session goes on in step.
    let v: Option<i32> = c.query_first("SELECT 42").unwrap();
    assert_eq!(v, Some(42));
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM sbtest.rc").unwrap();
    assert_eq!(n, Some(0), "the lost transaction left nothing");
}

/// Item 11 of issue 18: `replay_max_bytes` bounds the memory the replay log holds, not the
/// bytes of the statements. Tiny statements cost more than they count (an entry each, the
/// log's spare room): under a 4 KiB limit, a transaction of INSERTs whose packets add up
/// to well under 4 KiB stops being replayable where the session's account (in `/status`)
/// reaches the limit, and its loss gets 1213, counted as `too_large`.
#[test]
fn a_transaction_of_many_tiny_statements_stops_being_replayable_at_its_held_bytes() {
    const LIMIT: usize = 4096;
    let mut h = Harness::start_with(Options::default().config(|c| {
        c.proxy.replay_max_bytes = LIMIT;
    }));
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.rt (id INT PRIMARY KEY)")
        .unwrap();
    // The test's only session.
    let account = |h: &Harness| {
        let status = h.status_json();
        let sessions = status["sessions"].as_array().cloned().unwrap_or_default();
        assert_eq!(sessions.len(), 1, "{sessions:?}");
        let mine = &sessions[0];
        (
            mine["replay_held_bytes"]
                .as_u64()
                .expect("replay_held_bytes"),
            mine["replay_blocked_by"].as_str().map(str::to_string),
        )
    };
    c.query_drop("BEGIN").unwrap();
    // Bytes of the statements' packets (header, command byte, text), as the old bound
    // counted them.
    let mut sent = 0;
    let mut held_before = 0;
    let mut n = 0;
    loop {
        n += 1;
        let sql = format!("INSERT INTO sbtest.rt VALUES ({n})");
        c.query_drop(&sql).unwrap();
        let (held, blocked) = account(&h);
        if let Some(why) = blocked {
            assert_eq!(why, "larger than replay_max_bytes");
            // Only the log's own small block is left.
            assert!(
                held < 128,
                "{held}: nothing is kept once it is not replayable"
            );
            break;
        }
        sent += 5 + sql.len();
        assert!(held as usize <= LIMIT, "{held} bytes held");
        assert!(
            held >= held_before,
            "the account never shrinks in a transaction"
        );
        held_before = held;
        assert!(n < 1000, "the transaction never stopped being replayable");
    }
    // It gave up near the limit, with statements worth well under it.
    assert!(held_before as usize > LIMIT - 256, "{held_before}");
    assert!(sent < LIMIT * 3 / 4, "{sent} bytes of statements");
    crash_and_restart(&mut h);
    let err = c
        .query_drop("INSERT INTO sbtest.rt VALUES (0)")
        .unwrap_err();
    assert_eq!(mysql_error(&err), Some((1213, "40001")), "{err}");
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(replays(&h, "too_large"), 1.0);
    assert_eq!(replays(&h, "replayed"), 0.0);
}
