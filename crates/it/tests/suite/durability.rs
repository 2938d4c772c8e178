//! `[ha] durability = "semi-sync"` (issue 8): holdfast turns MariaDB's semi-synchronous
//! replication on for every node, and `/status` shows whether the primary runs it right
//! now, with its fallbacks to asynchronous replication counted.

use holdfast_config::Durability;
use holdfast_it::{wait_for, Harness, Options};
use holdfast_lab::node_sql;
use serde_json::Value;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn semi_sync(h: &Harness) -> Value {
    h.status_json()["ha"]["semi_sync"].clone()
}

/// A lab with two replicas and `durability = "semi-sync"` (timeout `timeout_ms`), once both
/// replicas acknowledge.
fn semi_sync_lab(timeout_ms: u64) -> Harness {
    let h = Harness::start_with(Options::default().replicas(2).config(move |c| {
        c.ha.durability = Durability::SemiSync;
        c.ha.semi_sync_timeout_ms = timeout_ms;
    }));
    wait_for(
        "semi-sync active with both replicas acknowledging",
        WAIT,
        || {
            let s = semi_sync(&h);
            (s["active"] == true && s["clients"] == 2).then_some(())
        },
    );
    h
}

#[test]
fn semi_sync_is_kept_on_and_a_fallback_is_shown_and_counted() {
    let h = semi_sync_lab(500);
    for n in &h.lab.status.nodes {
        let row = node_sql(
            n,
            "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_slave_enabled, \
             @@rpl_semi_sync_master_wait_point, @@rpl_semi_sync_master_timeout",
        )
        .unwrap();
        // The waiting side on the primary only: a replica with it would make its own
        // applier wait for acknowledgements.
        if n.name == "node1" {
            assert_eq!(row[0], ["1", "1", "AFTER_SYNC", "500"], "{}", n.name);
        } else {
            assert_eq!(row[0][..2], ["0", "1"], "{}", n.name);
        }
    }
    // A write through holdfast is acknowledged by a replica before its OK.
    let write = |v: u32| {
        let out = h.mariadb(
            h.proxy,
            &["-e", &format!("INSERT INTO sbtest.durable VALUES ({v})")],
        );
        assert_eq!(out.code, Some(0), "{out:?}");
    };
    h.root_sql("CREATE TABLE sbtest.durable (a INT PRIMARY KEY)");
    write(1);
    wait_for("an acknowledged commit", WAIT, || {
        (semi_sync(&h)["acknowledged_commits"].as_u64()? > 0).then_some(())
    });
    // No replica acknowledges any more: the next commit waits out the timeout, then
    // MariaDB falls back to asynchronous replication; holdfast shows and counts it.
    for r in h.lab.replicas() {
        node_sql(r, "STOP SLAVE IO_THREAD").unwrap();
    }
    write(2);
    wait_for("the fallback in /status", WAIT, || {
        let s = semi_sync(&h);
        (s["active"] == false && s["fallbacks"] == 1).then_some(())
    });
    let text = holdfast_admin::render_status(&h.status());
    assert!(text.contains("semi-sync: NOT ACTIVE"), "{text}");
    // The replicas come back: semi-sync is active again, the fallback stays counted.
    for r in h.lab.replicas() {
        node_sql(r, "START SLAVE IO_THREAD").unwrap();
    }
    write(3);
    wait_for("semi-sync active again", WAIT, || {
        let s = semi_sync(&h);
        (s["active"] == true && s["fallbacks"] == 1).then_some(())
    });
}

/// A primary killed while a commit waits for an acknowledgement that never comes: the
/// transaction is in its binary log and on no replica. The lab starts it again as a
/// replica (`--init-rpl-role=SLAVE`, another node is the primary now), MariaDB's crash
/// recovery truncates that unacknowledged tail, and `rejoin` takes it back as a replica of
/// the new primary instead of refusing it as diverged.
#[test]
fn a_killed_primary_comes_back_without_its_unacknowledged_tail_and_rejoins() {
    let mut h = semi_sync_lab(120_000);
    h.root_sql("CREATE TABLE sbtest.tail (a INT PRIMARY KEY); INSERT INTO sbtest.tail VALUES (1)");
    let count = |n: &holdfast_lab::NodeStatus| -> Option<String> {
        Some(
            node_sql(n, "SELECT COUNT(*) FROM sbtest.tail")
                .ok()?
                .first()?
                .first()?
                .clone(),
        )
    };
    for r in h.lab.replicas() {
        wait_for(&format!("row 1 on {}", r.name), WAIT, || {
            (count(r)?.as_str() == "1").then_some(())
        });
    }
    for r in h.lab.replicas() {
        node_sql(r, "STOP SLAVE IO_THREAD").unwrap();
    }
    let node1 = h.lab.status.nodes[0].clone();
    let waiting = node1.clone();
    let pending =
        std::thread::spawn(move || node_sql(&waiting, "INSERT INTO sbtest.tail VALUES (2)"));
    wait_for(
        "the commit to wait for a replica's acknowledgement",
        WAIT,
        || {
            let r = node_sql(
            &node1,
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE '%semi-sync%'",
        )
        .ok()?;
            (r.first()?.first()? != "0").then_some(())
        },
    );
    h.lab.kill_node("node1").expect("kill node1");
    assert!(
        pending.join().unwrap().is_err(),
        "the waiting commit never got its OK"
    );
    let new_primary = h.wait_primary_other_than("node1", WAIT);

    h.lab.start_node("node1").expect("node1 starts again");
    assert_eq!(
        count(&node1).as_deref(),
        Some("1"),
        "the unacknowledged row was truncated by crash recovery"
    );
    let (code, body) = h.admin_post("/rejoin?node=node1", None);
    assert_eq!(code, 200, "{body}");
    let out = h.mariadb(h.proxy, &["-e", "INSERT INTO sbtest.tail VALUES (3)"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    wait_for("node1 to replicate from the new primary", WAIT, || {
        let rows = node_sql(&node1, "SELECT GROUP_CONCAT(a ORDER BY a) FROM sbtest.tail").ok()?;
        (rows.first()?.first()? == "1,3").then_some(())
    });
    println!("failover to {new_primary}; node1 rejoined without its unacknowledged tail");
}
