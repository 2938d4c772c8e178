//! Nodes added and removed at run time (`/nodes/add`, `/nodes/remove`, `ctl node`) under
//! split sessions: a new replica takes reads; a removed one is drained while 20 sysbench
//! threads read through holdfast, and nobody is dropped; a statement still running when the
//! drain window closes gets an ERR and its session goes on; bad requests change nothing; a
//! deposed node that is removed is waited for no more and its name can be reused.

use holdfast_config::Routing;
use holdfast_it::{run_with_deadline, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::process::Command;
use std::time::Duration;

fn connect_to(url: &str) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(url).expect("url"))
        .prefer_socket(false)
        .read_timeout(Some(Duration::from_secs(120)))
        .tcp_connect_timeout(Some(Duration::from_secs(10)));
    Conn::new(opts).unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

fn split_harness() -> Harness {
    let h = Harness::start_with(
        Options::default()
            .replicas(2)
            .config(|c| c.proxy.routing = Routing::Split),
    );
    wait_reading(&h, 2);
    h
}

fn wait_reading(h: &Harness, n: usize) {
    wait_for(
        &format!("{n} replicas taking reads"),
        Duration::from_secs(30),
        || (h.shared.topology.borrow().read_nodes().count() == n).then_some(()),
    );
}

fn node_server_id(h: &Harness, name: &str) -> u32 {
    let rows = holdfast_lab::node_sql(h.node(name), "SELECT @@server_id").expect("server id");
    rows[0][0].parse().expect("numeric")
}

fn error_of(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn an_added_replica_takes_reads_and_bad_requests_change_nothing() {
    let mut h = split_harness();
    let primary = h.lab.primary().clone();
    let node4 = h.lab.add_replica(Some("node4")).expect("lab add-replica");
    // A replica of another replica is refused.
    let node2 = h.node("node2").address.clone();
    let (host2, port2) = node2.rsplit_once(':').unwrap();
    holdfast_lab::node_sql(
        &node4,
        &format!(
            "STOP SLAVE; CHANGE MASTER TO MASTER_HOST='{host2}', MASTER_PORT={port2}; START SLAVE"
        ),
    )
    .unwrap();
    let (code, body) = h.admin_post(
        &format!("/nodes/add?name=node4&address={}", node4.address),
        None,
    );
    assert_eq!(code, 400, "{body}");
    assert!(error_of(&body).contains("replicates from"), "{body}");
    let (phost, pport) = primary.address.rsplit_once(':').unwrap();
    holdfast_lab::node_sql(
        &node4,
        &format!(
            "STOP SLAVE; CHANGE MASTER TO MASTER_HOST='{phost}', MASTER_PORT={pport}; START SLAVE"
        ),
    )
    .unwrap();
    // Other bad requests: a name taken, an address taken, something that is no server.
    for (path, want) in [
        (
            format!("/nodes/add?name=node2&address={}", node4.address),
            "exists already",
        ),
        (
            format!("/nodes/add?name=node9&address={}", primary.address),
            "has the address",
        ),
        (
            format!("/nodes/add?name=node9&address={}", h.admin),
            "not a database server",
        ),
        (
            "/nodes/add?name=bad%20name&address=127.0.0.1:1".to_string(),
            "invalid node name",
        ),
        ("/nodes/remove?name=node7".to_string(), "no node named"),
        (
            format!("/nodes/remove?name={}", primary.name),
            "is the primary",
        ),
    ] {
        let (code, body) = h.admin_post(&path, None);
        assert_eq!(code, 400, "{path}: {body}");
        assert!(error_of(&body).contains(want), "{path}: {body}");
    }
    assert_eq!(
        h.shared.membership.members.borrow().len(),
        3,
        "nothing changed"
    );
    let (code, body) = h.admin_post(
        &format!("/nodes/add?name=node4&address={}", node4.address),
        None,
    );
    assert_eq!(code, 200, "{body}");
    wait_reading(&h, 3);
    let id4 = node_server_id(&h, "node4");
    let mut c = connect_to(&h.url());
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY)").unwrap();
    c.query_drop("INSERT INTO t VALUES (1)").unwrap();
    // Reads spread over the three replicas; node4 gets its share (and sees the data).
    let mut on4 = 0;
    for _ in 0..60 {
        let (id, n): (u32, u32) = c
            .query_first("SELECT @@server_id, COUNT(*) FROM t")
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "the session's write is visible wherever it reads");
        if id == id4 {
            on4 += 1;
        }
    }
    assert!(on4 > 0, "node4 took no reads");
    let status = h.status_json();
    let nodes = status["topology"]["nodes"].as_array().unwrap();
    let n4 = nodes.iter().find(|n| n["name"] == "node4").unwrap();
    assert_eq!(n4["serves_reads"], true, "{n4}");
    assert!(n4["reads"].as_u64().unwrap() > 0, "{n4}");
}

fn sysbench(h: &Harness, cmd: &str, extra: &[&str]) -> std::process::Output {
    let mut c = Command::new("sysbench");
    c.arg("oltp_read_only")
        .arg(format!("--mysql-host={}", h.proxy.ip()))
        .arg(format!("--mysql-port={}", h.proxy.port()))
        .arg(format!("--mysql-user={}", h.user()))
        .arg(format!("--mysql-password={}", h.password()))
        .arg(format!("--mysql-db={}", h.database()))
        .args(["--tables=4", "--table-size=1000"])
        .args(extra)
        .arg(cmd);
    run_with_deadline(c, Duration::from_secs(180))
}

#[test]
fn removing_a_replica_under_20_reading_threads_drops_nobody() {
    holdfast_it::require("sysbench").expect("sysbench");
    let h = split_harness();
    let prep = sysbench(&h, "prepare", &[]);
    assert!(prep.status.success(), "{prep:?}");
    wait_for(
        "the tables on the replicas",
        Duration::from_secs(30),
        || {
            let sql = format!("SELECT COUNT(*) FROM {}.sbtest4", h.database());
            let n = holdfast_lab::node_sql(h.node("node3"), &sql).ok()?;
            (n[0][0] == "1000").then_some(())
        },
    );
    let run = std::thread::scope(|s| {
        let bench = s.spawn(|| {
            sysbench(
                &h,
                "run",
                &[
                    "--threads=20",
                    "--time=8",
                    "--skip_trx=on",
                    "--db-ps-mode=auto",
                    "--report-interval=0",
                ],
            )
        });
        wait_for("reads on node3", Duration::from_secs(20), || {
            let v = h.status_json();
            let n = v["topology"]["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == "node3")?
                .clone();
            (n["reads"].as_u64()? > 100).then_some(())
        });
        let (code, body) = h.admin_post("/nodes/remove?name=node3&drain_ms=3000", None);
        assert_eq!(code, 200, "{body}");
        bench.join().expect("sysbench thread")
    });
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{out}\n{err}");
    assert!(
        !out.contains("FATAL") && !err.contains("FATAL"),
        "{out}\n{err}"
    );
    let ignored = out
        .lines()
        .find(|l| l.trim_start().starts_with("ignored errors:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(ignored, Some(0), "{out}");
    assert!(!h
        .shared
        .topology
        .borrow()
        .nodes
        .iter()
        .any(|n| n.name == "node3"));
    assert_eq!(
        holdfast_it::metric(&h.metrics(), "holdfast_sessions_closed_by_holdfast_total"),
        None,
        "no session closed"
    );
    // Nothing of holdfast's is left on node3.
    wait_for(
        "holdfast's connections to node3 closed",
        Duration::from_secs(10),
        || {
            let rows = holdfast_lab::node_sql(
                h.node("node3"),
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'app'",
            )
            .ok()?;
            (rows[0][0] == "0").then_some(())
        },
    );
}

#[test]
fn a_statement_past_the_drain_window_gets_an_error_and_its_session_goes_on() {
    let h = split_harness();
    let mut c = connect_to(&h.url());
    c.query_drop("SELECT 1").unwrap();
    let long = std::thread::scope(|s| {
        let running = s.spawn(move || {
            // A WHERE keeps the sequence engine from answering at once.
            let r = c.query_first::<u64, _>(
                "SELECT COUNT(*) FROM seq_1_to_5000000000 WHERE seq % 7 = 3",
            );
            (c, r)
        });
        let node = wait_for(
            "the long read running on a replica",
            Duration::from_secs(20),
            || {
                let v = h.status_json();

                v["topology"]["nodes"]
                    .as_array()?
                    .iter()
                    .find(|n| n["active_requests"].as_u64() == Some(1))
                    .and_then(|n| n["name"].as_str().map(str::to_string))
            },
        );
        let (code, body) = h.admin_post(&format!("/nodes/remove?name={node}&drain_ms=1000"), None);
        assert_eq!(code, 200, "{body}");
        let report: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(report["interrupted"], 1, "{report}");
        (node, running.join().expect("reading thread"))
    });
    let (node, (mut c, result)) = long;
    match result {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1317, "{e:?}"),
        other => panic!("the long read should have been stopped: {other:?}"),
    }
    // The same connection goes on, on the nodes that are left.
    let removed = node_server_id(&h, &node);
    for _ in 0..10 {
        let id: u32 = c.query_first("SELECT @@server_id").unwrap().unwrap();
        assert_ne!(id, removed);
    }
}

#[test]
fn a_reload_applies_the_backend_list_of_the_config_file() {
    let mut h = split_harness();
    let (code, body) = h.admin_post("/reload", None);
    assert_eq!(code, 400, "no config file: {body}");
    let node4 = h.lab.add_replica(Some("node4")).expect("lab add-replica");
    // The configuration running, with node4.
    let mut cfg = (*h.shared.config_snapshot()).clone();
    cfg.backends.push(holdfast_config::BackendConfig {
        name: "node4".into(),
        address: node4.address.clone(),
        proxy_protocol: true,
    });
    let write = |cfg: &holdfast_config::Config| {
        h.write_config(cfg);
    };
    write(&cfg);
    let (code, body) = h.admin_post("/reload", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["added"], serde_json::json!(["node4"]), "{v}");
    wait_reading(&h, 3);
    // node3 leaves the file: it is drained and removed; node2's address changed: refused.
    cfg.backends.retain(|b| b.name != "node3");
    for b in &mut cfg.backends {
        if b.name == "node2" {
            b.address = "127.0.0.1:1".into();
        }
    }
    write(&cfg);
    let (code, body) = h.admin_post("/reload", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["removing"], serde_json::json!(["node3"]), "{v}");
    assert!(
        v["refused"][0]
            .as_str()
            .unwrap()
            .contains("address changed"),
        "{v}"
    );
    wait_for("node3 gone", Duration::from_secs(30), || {
        (!h.shared
            .membership
            .members
            .borrow()
            .iter()
            .any(|m| m.backend.name == "node3"))
        .then_some(())
    });
    wait_reading(&h, 2);
}

/// Issue 18, item 16: node removal stops holdfast's connections there with the monitor
/// account; when the server refuses (a monitor without CONNECTION ADMIN, as the README's
/// grants were), the report says so instead of counting them as closed.
#[test]
fn a_removal_whose_kills_are_refused_says_so() {
    let h = split_harness();
    let mut c = connect_to(&h.url());
    c.query_drop("SELECT 1").unwrap();
    // Every replica: the monitor may not stop other accounts' statements there.
    for r in h.lab.replicas() {
        holdfast_lab::node_sql(
            r,
            "SET SESSION sql_log_bin = 0; \
             REVOKE SUPER, CONNECTION ADMIN ON *.* FROM 'holdfast_monitor'@'%'; \
             REVOKE SUPER, CONNECTION ADMIN ON *.* FROM 'holdfast_monitor'@'localhost'",
        )
        .expect("revoke on a replica");
    }
    let report = std::thread::scope(|s| {
        let running = s.spawn(move || {
            c.query_first::<u64, _>("SELECT COUNT(*) FROM seq_1_to_5000000000 WHERE seq % 7 = 3")
        });
        let node = h.wait_replica_running("SELECT COUNT(*) FROM seq_1_to_5000000000");
        let (code, body) = h.admin_post(
            &format!("/nodes/remove?name={}&drain_ms=500", node.name),
            None,
        );
        assert_eq!(code, 200, "{body}");
        // Stop the read ourselves (as root) so the thread ends.
        holdfast_lab::node_sql(
            &node,
            "SELECT CONCAT('KILL QUERY ', ID) INTO @k FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE 'SELECT COUNT(*) FROM seq_1_to_5000000000%' LIMIT 1; \
             PREPARE s FROM @k; EXECUTE s",
        )
        .expect("root stops the read");
        let _ = running.join();
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    });
    println!("{report:#}");
    assert_eq!(report["interrupted"], 1, "{report}");
    let failures = report["kill_failures"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !failures.is_empty(),
        "the refused KILLs are reported: {report}"
    );
    assert!(
        failures
            .iter()
            .any(|f| f.as_str().is_some_and(|f| f.contains("1095"))),
        "{report}"
    );
}

/// A node a failover left out (deposed, in `needs_rejoin`) that is removed instead of
/// rejoined is waited for no more; a fresh replica added later under its name is a new
/// node: not deposed, and it takes reads.
#[test]
fn a_removed_deposed_node_leaves_needs_rejoin_and_its_name_can_be_reused() {
    let mut h = split_harness();
    wait_for(
        "the detector to watch node1",
        Duration::from_secs(30),
        || (h.status_json()["ha"]["watching"] == "node1").then_some(()),
    );
    h.lab.kill_node("node1").expect("kill node1");
    let new_primary = h.wait_primary_other_than("node1", Duration::from_secs(30));
    let node_json = |h: &Harness, name: &str| {
        h.status_json()["topology"]["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["name"] == name).cloned())
    };
    wait_for(
        "node1 left out by the failover",
        Duration::from_secs(30),
        || (h.status_json()["ha"]["needs_rejoin"] == serde_json::json!(["node1"])).then_some(()),
    );
    let n1 = node_json(&h, "node1").expect("node1 in /status");
    assert_eq!(n1["deposed"], true, "{n1}");

    let (code, body) = h.admin_post("/nodes/remove?name=node1&drain_ms=0", None);
    assert_eq!(code, 200, "{body}");
    let ha = h.status_json()["ha"].clone();
    assert_eq!(ha["needs_rejoin"], serde_json::json!([]), "{ha:#}");
    wait_for("node1 gone from /status", Duration::from_secs(30), || {
        node_json(&h, "node1").is_none().then_some(())
    });

    // The lab replaces it with a fresh replica of the new primary, under the same name.
    h.lab.remove_node("node1").expect("lab remove node1");
    let fresh = h
        .lab
        .add_replica(Some("node1"))
        .expect("lab add-replica node1");
    let (code, body) = h.admin_post(
        &format!("/nodes/add?name=node1&address={}", fresh.address),
        None,
    );
    assert_eq!(code, 200, "{body}");
    wait_reading(&h, 2);
    let n1 = node_json(&h, "node1").expect("node1 in /status");
    // `deposed` is shown only when true.
    assert_ne!(n1["deposed"], true, "{n1}");
    assert_eq!(n1["serves_reads"], true, "{n1}");
    let st = h.status_json();
    assert_eq!(st["topology"]["primary"], new_primary.as_str(), "{st:#}");
    assert_eq!(st["ha"]["needs_rejoin"], serde_json::json!([]), "{st:#}");
}
