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

#[test]
fn semi_sync_is_kept_on_and_a_fallback_is_shown_and_counted() {
    let h = Harness::start_with(Options::default().replicas(2).config(|c| {
        c.ha.durability = Durability::SemiSync;
        c.ha.semi_sync_timeout_ms = 500;
    }));
    wait_for(
        "semi-sync active with both replicas acknowledging",
        WAIT,
        || {
            let s = semi_sync(&h);
            (s["active"] == true && s["clients"] == 2).then_some(())
        },
    );
    for n in &h.lab.status.nodes {
        let row = node_sql(
            n,
            "SELECT @@rpl_semi_sync_master_enabled, @@rpl_semi_sync_slave_enabled, \
             @@rpl_semi_sync_master_wait_point, @@rpl_semi_sync_master_timeout",
        )
        .unwrap();
        assert_eq!(row[0], ["1", "1", "AFTER_SYNC", "500"], "{}", n.name);
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
