//! The HA manager's building blocks against real MariaDB, without a proxy in front:
//! switchover (and back), failover after SIGKILL with detection, rejoin, and refusing to
//! rejoin a diverged node. (`ha_admin` drives the same through the admin API.)
//!
//! Every wait polls with a deadline; timings are printed, never asserted.

use holdfast_cluster::ha::{self, HaConfig, HaError, LossVerdict};
use holdfast_it::{lab, lab_config, runtime, wait_for};
use holdfast_lab::{node_sql, node_sql_maps, NodeStatus, TestLab, DATABASE};
use holdfast_proxy::config::Config;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// The lab, holdfast's configuration for it (`[ha]` managed) and a runtime to run the HA
/// operations on.
fn setup(replicas: usize) -> (TestLab, Config, HaConfig, tokio::runtime::Runtime) {
    let lab = lab(replicas);
    let cfg = lab_config(&lab);
    let ha = cfg.ha.clone();
    assert_eq!(ha.mode, ha::HaMode::Managed);
    (lab, cfg, ha, runtime().expect("runtime"))
}

fn node<'a>(lab: &'a TestLab, name: &str) -> &'a NodeStatus {
    lab.status
        .nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

fn sql(n: &NodeStatus, s: &str) -> Vec<Vec<String>> {
    node_sql(n, s).unwrap_or_else(|e| panic!("SQL on {}: {s}: {e:#}", n.name))
}

fn value(n: &NodeStatus, s: &str) -> String {
    sql(n, s)
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next())
        .unwrap_or_default()
}

/// The rows in the test table; `None` while the table is missing (or the query fails) on
/// a replica that has not caught up yet.
fn try_count(n: &NodeStatus) -> Option<u64> {
    node_sql(n, &format!("SELECT COUNT(*) FROM {DATABASE}.ha_t"))
        .ok()?
        .into_iter()
        .next()?
        .into_iter()
        .next()?
        .parse()
        .ok()
}

/// The rows in the test table, which must be readable now (a failed query is not 0 rows).
fn count(n: &NodeStatus) -> u64 {
    value(n, &format!("SELECT COUNT(*) FROM {DATABASE}.ha_t"))
        .parse()
        .unwrap_or_else(|e| panic!("row count on {}: {e}", n.name))
}

fn wait_count(n: &NodeStatus, want: u64) {
    wait_for(&format!("{want} rows on {}", n.name), WAIT, || {
        (try_count(n) == Some(want)).then_some(())
    });
}

fn insert(n: &NodeStatus, from: u64, to: u64) {
    let values: Vec<String> = (from..=to).map(|i| format!("({i}, 'row {i}')")).collect();
    sql(
        n,
        &format!("INSERT INTO {DATABASE}.ha_t VALUES {}", values.join(",")),
    );
}

/// `primary` writable, every other node read-only and replicating from it.
fn assert_topology(lab: &TestLab, primary: &str) {
    let p = node(lab, primary);
    assert_eq!(
        value(p, "SELECT @@global.read_only"),
        "0",
        "{primary} writable"
    );
    for n in lab.status.nodes.iter().filter(|n| n.name != primary) {
        assert_eq!(
            value(n, "SELECT @@global.read_only"),
            "1",
            "{} read-only",
            n.name
        );
        wait_for(
            &format!("{} replicating from {primary}", n.name),
            WAIT,
            || {
                let rows = node_sql_maps(n, "SHOW SLAVE STATUS").ok()?;
                let row = rows.into_iter().next()?;
                let ok = row.get("Master_Port") == Some(&p.port.to_string())
                    && row.get("Slave_IO_Running").map(String::as_str) == Some("Yes")
                    && row.get("Slave_SQL_Running").map(String::as_str) == Some("Yes");
                ok.then_some(())
            },
        );
    }
}

fn setup_table(lab: &TestLab, rows: u64) {
    sql(
        lab.primary(),
        &format!("CREATE TABLE {DATABASE}.ha_t (id BIGINT PRIMARY KEY, v VARCHAR(40))"),
    );
    insert(lab.primary(), 1, rows);
    for n in &lab.status.nodes {
        wait_count(n, rows);
    }
}

fn pretty<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

#[test]
fn switchover_and_back() {
    let (lab, cfg, ha, rt) = setup(2);
    setup_table(&lab, 50);
    // An account that read_only stops: everything but SUPER and READ_ONLY ADMIN.
    sql(
        lab.primary(),
        "CREATE USER 'limited'@'%' IDENTIFIED BY 'limited_pass'; \
         GRANT ALL PRIVILEGES ON *.* TO 'limited'@'%'; \
         REVOKE SUPER, READ_ONLY ADMIN ON *.* FROM 'limited'@'%'",
    );
    // Rows the replicas have not necessarily applied yet when the switchover starts.
    insert(lab.primary(), 51, 100);

    let report = rt
        .block_on(ha::switchover(&cfg, &cfg.backends, Some("node2"), &ha))
        .expect("switchover to node2");
    println!("switchover node1 -> node2: {}", pretty(&report));
    assert_eq!(report.new_primary, "node2");
    assert!(report.skipped.is_empty(), "{}", pretty(&report));
    assert!(report.warnings.is_empty(), "{}", pretty(&report));
    // Nothing lost: every row written before is on the new primary right away.
    assert_eq!(count(node(&lab, "node2")), 100);
    assert_topology(&lab, "node2");
    let probes = rt.block_on(ha::probe_all(&cfg, &cfg.backends, ha.statement_timeout()));
    let writable = ha::find_writable(&probes).expect("one writable");
    assert_eq!(
        writable.map(|w| w.name.as_str()),
        Some("node2"),
        "{}",
        pretty(&probes)
    );

    // read_only stops an account without SUPER / READ_ONLY ADMIN on the old primary.
    let out = std::process::Command::new("mariadb")
        .args([
            "--no-defaults",
            "-h127.0.0.1",
            &format!("-P{}", node(&lab, "node1").port),
            "-ulimited",
            "-plimited_pass",
            "-e",
            &format!("INSERT INTO {DATABASE}.ha_t VALUES (999, 'sneaky')"),
        ])
        .output()
        .expect("mariadb client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "write on the old primary succeeded");
    assert!(
        stderr.contains("1290"),
        "expected ER_OPTION_PREVENTS_STATEMENT: {stderr}"
    );

    insert(node(&lab, "node2"), 101, 110);
    for n in &lab.status.nodes {
        wait_count(n, 110);
    }

    // And back.
    let report = rt
        .block_on(ha::switchover(&cfg, &cfg.backends, Some("node1"), &ha))
        .expect("switchover back to node1");
    println!("switchover node2 -> node1: {}", pretty(&report));
    assert!(report.warnings.is_empty(), "{}", pretty(&report));
    assert_topology(&lab, "node1");
    insert(lab.primary(), 111, 120);
    for n in &lab.status.nodes {
        wait_count(n, 120);
    }

    // Without a target: the most advanced healthy replica.
    let report = rt
        .block_on(ha::switchover(&cfg, &cfg.backends, None, &ha))
        .expect("switchover to any");
    println!(
        "switchover node1 -> {} (auto) in {:?}",
        report.new_primary, report.total
    );
    assert_ne!(report.new_primary, "node1");
    assert_topology(&lab, &report.new_primary);
    insert(node(&lab, &report.new_primary), 121, 130);
    for n in &lab.status.nodes {
        wait_count(n, 130);
    }
    // Unknown targets and the current primary are refused.
    assert!(matches!(
        rt.block_on(ha::switchover(&cfg, &cfg.backends, Some("nope"), &ha)),
        Err(HaError::UnknownNode(_))
    ));
    assert!(matches!(
        rt.block_on(ha::switchover(
            &cfg,
            &cfg.backends,
            Some(&report.new_primary),
            &ha
        )),
        Err(HaError::AlreadyPrimary(_))
    ));
}

#[test]
fn failover_after_kill_then_rejoin() {
    let (mut lab, cfg, ha, rt) = setup(2);
    setup_table(&lab, 100);

    let mut guard = ha::FailoverGuard::from_config(&ha);
    lab.kill_node("node1").expect("kill node1");
    let lost_at = Instant::now();
    let verdict = rt
        .block_on(ha::detect_primary_loss(
            &cfg,
            &cfg.backends,
            "node1",
            &ha,
            WAIT,
        ))
        .expect("detector");
    let detected = lost_at.elapsed();
    let LossVerdict::Lost(loss) = verdict else {
        panic!("primary loss not detected: {verdict:?}");
    };
    println!("detected after {detected:?}: {}", pretty(&loss));
    guard
        .try_begin(Instant::now())
        .expect("first failover allowed");
    let report = rt
        .block_on(ha::failover(&cfg, &cfg.backends, "node1", None, false, &ha))
        .expect("failover");
    let writable = lost_at.elapsed();
    println!(
        "failover: primary killed -> new primary writable in {writable:?} \
         (detection {detected:?}, failover {:?}): {}",
        report.total,
        pretty(&report)
    );
    assert_eq!(report.needs_rejoin, vec!["node1".to_string()]);
    let new = report.new_primary.clone();
    assert_ne!(new, "node1");
    assert_eq!(count(node(&lab, &new)), 100, "no committed row lost");
    assert_eq!(value(node(&lab, &new), "SELECT @@global.read_only"), "0");
    insert(node(&lab, &new), 101, 110);
    for n in lab
        .status
        .nodes
        .iter()
        .filter(|n| n.name != new && n.name != "node1")
    {
        assert_eq!(value(n, "SELECT @@global.read_only"), "1");
        wait_count(n, 110);
    }
    // A flapping node cannot cause a second failover right away.
    assert!(matches!(
        guard.try_begin(Instant::now()),
        Err(HaError::CoolingOff { .. })
    ));

    lab.start_node("node1").expect("restart node1");
    let rejoin = rt
        .block_on(ha::rejoin(&cfg, &cfg.backends, "node1", None, &ha))
        .expect("rejoin");
    println!("rejoin: {}", pretty(&rejoin));
    assert_eq!(rejoin.primary, new);
    assert_topology(&lab, &new);
    wait_count(node(&lab, "node1"), 110);
    insert(node(&lab, &new), 111, 120);
    for n in &lab.status.nodes {
        wait_count(n, 120);
    }
}

#[test]
fn diverged_node_is_not_rejoined() {
    let (mut lab, cfg, ha, rt) = setup(2);
    setup_table(&lab, 10);
    // The replicas stop receiving; node1 commits a row nobody else gets, then dies.
    for r in lab.replicas() {
        sql(r, "STOP SLAVE IO_THREAD");
    }
    insert(lab.primary(), 11, 11);
    lab.kill_node("node1").expect("kill node1");
    for r in lab.replicas() {
        sql(r, "START SLAVE IO_THREAD");
    }
    let report = rt
        .block_on(ha::failover(
            &cfg,
            &cfg.backends,
            "node1",
            Some("node3"),
            false,
            &ha,
        ))
        .expect("failover");
    assert_eq!(report.new_primary, "node3", "{:?}", report.warnings);
    assert_eq!(count(node(&lab, "node3")), 10);
    // Two transactions: node3 is now further in the domain than node1's stray 0-1-11
    // equivalent, so only the server can tell (error 1236 when node1 connects).
    insert(node(&lab, "node3"), 12, 12);
    insert(node(&lab, "node3"), 13, 13);

    lab.start_node("node1").expect("restart node1");
    let err = rt
        .block_on(ha::rejoin(&cfg, &cfg.backends, "node1", None, &ha))
        .expect_err("a diverged node must not be rejoined");
    println!("rejoin refused: {err}");
    assert!(matches!(err, HaError::Diverged { .. }), "{err}");
    // Left read-only and not replicating.
    assert_eq!(value(node(&lab, "node1"), "SELECT @@global.read_only"), "1");
    let status = node_sql_maps(node(&lab, "node1"), "SHOW SLAVE STATUS").expect("status");
    assert!(status
        .first()
        .is_none_or(|r| r.get("Slave_IO_Running").map(String::as_str) != Some("Yes")));
}

/// Waits until `replica`'s IO thread has received everything `primary` has in its binlog.
fn wait_received(primary: &NodeStatus, replica: &NodeStatus) {
    let want = value(primary, "SELECT @@global.gtid_binlog_pos");
    wait_for(&format!("{} to receive {want}", replica.name), WAIT, || {
        let rows = node_sql_maps(replica, "SHOW SLAVE STATUS").ok()?;
        let io = rows.into_iter().next()?.get("Gtid_IO_Pos")?.clone();
        (io == want).then_some(())
    });
}

/// Issue 18, item 1: a replica whose SQL thread is stopped has the writes the primary
/// acknowledged in its relay log only. The failover starts the SQL thread and promotes it
/// once it applied them (before: `RESET SLAVE ALL` deleted the relay log, and the table
/// and every row with it).
#[test]
fn failover_applies_the_relay_log_of_a_stopped_sql_thread() {
    let (mut lab, cfg, ha, rt) = setup(1);
    setup_table(&lab, 10);
    let replica = node(&lab, "node2").clone();
    sql(&replica, "STOP SLAVE SQL_THREAD");
    sql(
        lab.primary(),
        &format!("CREATE TABLE {DATABASE}.acked (id INT PRIMARY KEY)"),
    );
    for i in 1..=200 {
        sql(
            lab.primary(),
            &format!("INSERT INTO {DATABASE}.acked VALUES ({i})"),
        );
    }
    wait_received(lab.primary(), &replica);
    lab.kill_node("node1").expect("kill node1");

    let report = rt
        .block_on(ha::failover(&cfg, &cfg.backends, "node1", None, false, &ha))
        .expect("failover");
    println!("failover: {}", pretty(&report));
    assert_eq!(report.new_primary, "node2");
    assert_eq!(
        value(&replica, &format!("SELECT COUNT(*) FROM {DATABASE}.acked")),
        "200",
        "every acknowledged row is on the new primary"
    );
    assert_eq!(value(&replica, "SELECT @@global.read_only"), "0");
}

/// Issue 18, item 1: a replica that cannot apply what it received (its SQL thread fails on
/// a row) is not promoted: the failover is withheld, names the transactions that would be
/// lost, and leaves the replica read-only with its relay log. `force` promotes it anyway
/// and says what it lost.
#[test]
fn failover_is_withheld_when_it_would_lose_received_transactions() {
    let (mut lab, cfg, mut ha, rt) = setup(1);
    ha.relay_apply_timeout_ms = 1_000;
    setup_table(&lab, 10);
    let replica = node(&lab, "node2").clone();
    // A row only the replica has: the primary's insert of the same key stops its applier.
    sql(
        &replica,
        &format!(
            "SET SESSION sql_log_bin=0; SET GLOBAL read_only=OFF; \
             INSERT INTO {DATABASE}.ha_t VALUES (11, 'replica only'); SET GLOBAL read_only=ON"
        ),
    );
    insert(lab.primary(), 11, 20);
    wait_received(lab.primary(), &replica);
    let primary_at = value(lab.primary(), "SELECT @@global.gtid_binlog_pos");
    lab.kill_node("node1").expect("kill node1");

    let err = rt
        .block_on(ha::failover(&cfg, &cfg.backends, "node1", None, false, &ha))
        .expect_err("a failover that loses a received transaction must be withheld");
    println!("withheld: {err}");
    assert!(err.is_withheld(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&primary_at),
        "names what was received: {text}"
    );
    assert!(text.contains("1 transaction"), "{text}");
    assert_eq!(value(&replica, "SELECT @@global.read_only"), "1");
    let status = node_sql_maps(&replica, "SHOW SLAVE STATUS").expect("status");
    assert_eq!(
        status.first().and_then(|r| r.get("Gtid_IO_Pos")).cloned(),
        Some(primary_at.clone()),
        "replication (and its relay log) kept"
    );

    let report = rt
        .block_on(ha::failover(&cfg, &cfg.backends, "node1", None, true, &ha))
        .expect("forced failover");
    println!("forced: {}", pretty(&report));
    assert_eq!(report.new_primary, "node2");
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.starts_with("forced:") && w.contains("1 transaction")),
        "{}",
        pretty(&report)
    );
    assert_eq!(value(&replica, "SELECT @@global.read_only"), "0");
}

/// What grants a fleet leader its decisions, as a test scripts it: in charge for the
/// first question only (the controller asks as the operation starts; counting from 1, the
/// failover's own question before the promotion is a second one: the lease ran out while
/// the failover confirmed the loss and let the replicas apply their relay logs).
struct LeadLostMidway(std::sync::atomic::AtomicU32);

impl ha::controller::ChargeCheck for LeadLostMidway {
    fn still_in_charge(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        let asked = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move { asked == 0 })
    }
}

/// A failover asks once more, right before the promotion, whether this process may still
/// decide: a fleet leader that lost its lease meanwhile promotes nothing (every replica
/// stays read-only), and says why.
#[test]
fn a_failover_whose_leader_lost_the_lead_midway_promotes_nothing() {
    let (mut lab, cfg, ha, rt) = setup(2);
    setup_table(&lab, 10);
    lab.kill_node("node1").expect("kill node1");
    // `asked`: the questions asked before this failover's own.
    let fail_over = |asked: u32| {
        let charge = LeadLostMidway(std::sync::atomic::AtomicU32::new(asked));
        rt.block_on(ha::failover_checked(
            &cfg,
            &cfg.backends,
            "node1",
            None,
            false,
            &ha,
            Some(&charge),
        ))
    };
    let result = fail_over(1);
    assert!(
        matches!(&result, Err(HaError::NotInCharge(_))),
        "refused: {result:?}"
    );
    for n in lab.status.nodes.iter().filter(|n| n.name != "node1") {
        assert_eq!(
            value(n, "SELECT @@global.read_only"),
            "1",
            "{} stays read-only",
            n.name
        );
    }
    // In charge throughout, the same failover promotes.
    let report = fail_over(0).expect("failover");
    assert_eq!(
        value(node(&lab, &report.new_primary), "SELECT @@global.read_only"),
        "0"
    );
}
