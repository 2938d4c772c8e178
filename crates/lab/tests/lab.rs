//! Integration tests: real MariaDB servers.

use std::time::{Duration, Instant};

use holdfast_lab::mysql_client::{Conn, ServerError};
use holdfast_lab::{
    node_sql, node_sql_maps, node_sql_value, wait_for, LabStatus, NodeStatus, TestLab,
};

fn pid_alive(pid: u32) -> bool {
    // Zombies (exited, not yet reaped) count as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s
                .rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        })
        .unwrap_or(false)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn primary_and_two_replicas_replicate() {
    let t = Instant::now();
    let lab = TestLab::start(2).expect("lab starts");
    eprintln!("TestLab::start(2) took {:?}", t.elapsed());
    let st = &lab.status;
    assert_eq!(st.nodes.len(), 3);
    assert_eq!(lab.primary().role, "primary");
    assert!(lab.replicas().iter().all(|n| n.role == "replica"));
    assert!(st.nodes.iter().all(|n| n.alive && n.pid.is_some()));

    // Roles as configured on the servers.
    assert_eq!(
        node_sql_value(lab.primary(), "SELECT @@read_only")
            .unwrap()
            .as_deref(),
        Some("0")
    );
    for r in lab.replicas() {
        assert_eq!(
            node_sql_value(r, "SELECT @@read_only").unwrap().as_deref(),
            Some("1")
        );
        let rows = node_sql_maps(r, "SHOW SLAVE STATUS").unwrap();
        assert_eq!(rows.len(), 1, "{} has one replication channel", r.name);
        assert_eq!(rows[0]["Master_Port"], lab.primary().port.to_string());
        assert_eq!(rows[0]["Using_Gtid"], "Slave_Pos");
        assert_eq!(rows[0]["Slave_SQL_Running"], "Yes");
    }

    // Accounts reached the replicas by replication.
    for n in &st.nodes {
        let users = node_sql(
            n,
            "SELECT CONCAT(user, '@', host) FROM mysql.user \
             WHERE user IN ('app', 'holdfast_monitor', 'repl') ORDER BY 1",
        )
        .unwrap();
        let users: Vec<&str> = users.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(
            users,
            [
                "app@%",
                "app@localhost",
                "holdfast_monitor@%",
                "holdfast_monitor@localhost",
                "repl@%"
            ],
            "accounts on {}",
            n.name
        );
    }

    // A write on the primary shows up on both replicas.
    node_sql(
        lab.primary(),
        "CREATE TABLE sbtest.t (id INT PRIMARY KEY, v VARCHAR(20)); \
         INSERT INTO sbtest.t VALUES (1, 'tab\there'), (2, NULL)",
    )
    .unwrap();
    for r in lab.replicas() {
        let rows = wait_for("row on replica", Duration::from_secs(30), || {
            node_sql(r, "SELECT id, v FROM sbtest.t ORDER BY id")
                .ok()
                .filter(|rows| rows.len() == 2)
        })
        .unwrap();
        assert_eq!(rows[0], vec!["1".to_string(), "tab\there".to_string()]);
        assert_eq!(rows[1], vec!["2".to_string(), "NULL".to_string()]);
    }

    // The status JSON has the promised fields.
    let json = std::fs::read_to_string(lab.dir().join("lab.json")).unwrap();
    // It and the config's password files name passwords: the owner's only.
    for file in [
        "lab.json",
        "holdfast.toml",
        "monitor.password",
        "repl.password",
    ] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(lab.dir().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file} has mode {mode:o}");
    }
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for key in [
        "dir",
        "proxy",
        "admin",
        "app_user",
        "app_password",
        "database",
        "monitor_user",
        "monitor_password",
        "config",
        "nodes",
    ] {
        assert!(v.get(key).is_some(), "lab.json lacks {key}: {json}");
    }
    for key in [
        "name", "address", "port", "role", "pid", "alive", "socket", "datadir",
    ] {
        assert!(v["nodes"][0].get(key).is_some(), "node lacks {key}");
    }
    let back: LabStatus = serde_json::from_str(&json).unwrap();
    assert_eq!(back.nodes.len(), 3);

    // The admin token: in its own 0600 file, not in lab.json, read back by status().
    {
        use std::os::unix::fs::PermissionsExt;
        assert!(
            v.get("admin_token").is_none(),
            "lab.json keeps the token: {json}"
        );
        let mode = std::fs::metadata(&st.admin_token_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = st.admin_token.as_ref().expect("up() reads the token");
        assert_eq!(
            holdfast_lab::status(lab.dir())
                .unwrap()
                .admin_token
                .as_ref(),
            Some(token)
        );
        let shown = serde_json::to_value(holdfast_lab::status(lab.dir()).unwrap()).unwrap();
        assert_eq!(
            shown["admin_token"],
            token.expose(),
            "status --json shows the token"
        );
    }

    // holdfast.toml is a valid holdfast config that lists every node.
    let cfg = holdfast_config::Config::load(&st.config).unwrap();
    assert_eq!(cfg.proxy.listen, st.proxy);
    assert_eq!(cfg.admin.listen, st.admin);
    assert_eq!(cfg.auth.monitor_user, "holdfast_monitor");
    assert_eq!(cfg.auth.monitor_password.expose(), "monitor_pass");
    assert_eq!(cfg.backends.len(), 3);
    assert_eq!(cfg.backends[1].address, st.nodes[1].address);
    assert_eq!(cfg.driver.kind, holdfast_config::DriverKind::Lab);
    assert_eq!(cfg.admin.token_file.as_ref(), Some(&st.admin_token_file));
    assert_eq!(cfg.driver.binaries, vec![st.mariadbd.clone()]);
    assert_eq!(cfg, holdfast_lab::holdfast_config(st, None).unwrap());

    // down() stops everything; status() agrees.
    let pids: Vec<u32> = st.nodes.iter().filter_map(|n| n.pid).collect();
    holdfast_lab::down(lab.dir()).unwrap();
    for pid in &pids {
        assert!(!pid_alive(*pid), "pid {pid} still alive after down()");
    }
    let after = holdfast_lab::status(lab.dir()).unwrap();
    assert!(after.nodes.iter().all(|n| !n.alive && n.pid.is_none()));
}

#[test]
fn app_logs_in_over_tcp_and_wrong_password_fails() {
    let t = Instant::now();
    let lab = TestLab::start(0).expect("lab starts");
    eprintln!("TestLab::start(0) took {:?}", t.elapsed());
    let p: &NodeStatus = lab.primary();
    let st = &lab.status;
    rt().block_on(async {
        let mut c = Conn::connect(
            &p.address,
            &st.app_user,
            &st.app_password,
            Some("sbtest"),
            Duration::from_secs(10),
        )
        .await
        .expect("app logs in");
        assert!(c.server_version.contains("MariaDB"));
        assert_eq!(c.query("SELECT 1").await.unwrap(), 1);
        assert_eq!(c.query("SELECT 1 UNION SELECT 2").await.unwrap(), 2);
        assert_eq!(c.query("DO 1").await.unwrap(), 0);
        c.quit().await.unwrap();

        let mut m = Conn::connect(
            &p.address,
            &st.monitor_user,
            &st.monitor_password,
            None,
            Duration::from_secs(10),
        )
        .await
        .expect("monitor logs in");
        assert!(m.query("SELECT user, host FROM mysql.user").await.unwrap() > 0);

        // Over TLS, trusting the lab's CA (the bench's idle clients with `--tls`): the
        // server sees an encrypted session.
        let ca = st.ca.clone().expect("the lab writes a CA");
        let tls = holdfast_client::tls::TlsClient::new(&ca, holdfast_client::tls::Verify::Ca, None)
            .expect("the lab's CA");
        let mut t = Conn::connect_tls(
            &p.address,
            &st.app_user,
            &st.app_password,
            &tls,
            Duration::from_secs(10),
        )
        .await
        .expect("app logs in over TLS");
        assert_eq!(
            t.query("SHOW SESSION STATUS WHERE Variable_name = 'Ssl_cipher' AND Value <> ''")
                .await
                .unwrap(),
            1,
            "the session is encrypted"
        );
        assert_eq!(
            t.query("SHOW SESSION STATUS WHERE Variable_name = 'Ssl_cipher' AND Value = ''")
                .await
                .unwrap(),
            0
        );
        t.quit().await.unwrap();

        let err = Conn::connect(
            &p.address,
            &st.app_user,
            "wrong",
            None,
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
        let server = err.downcast_ref::<ServerError>().expect("a server error");
        assert_eq!(server.code, 1045, "{err:#}");
    });

    // An ed25519 account exists when the server has the plugin.
    if let Some(user) = &st.ed25519_user {
        let plugin = node_sql_value(
            p,
            &format!("SELECT plugin FROM mysql.user WHERE user = '{user}'"),
        )
        .unwrap();
        assert_eq!(plugin.as_deref(), Some("ed25519"));
    }
}

#[test]
fn nodes_restart_with_their_data() {
    let mut lab = TestLab::start(1).expect("lab starts");
    node_sql(
        lab.primary(),
        "CREATE TABLE sbtest.r (id INT PRIMARY KEY); INSERT INTO sbtest.r VALUES (7)",
    )
    .unwrap();
    let old_pid = lab.replicas()[0].pid.unwrap();
    lab.stop_node("node2").unwrap();
    assert!(!pid_alive(old_pid));
    assert!(!lab.status.nodes[1].alive);
    // Written while the replica is down; it catches up after the restart.
    node_sql(lab.primary(), "INSERT INTO sbtest.r VALUES (8)").unwrap();
    lab.start_node("node2").unwrap();
    assert!(lab.status.nodes[1].alive);
    let replica = lab.replicas()[0].clone();
    wait_for("replica catch-up", Duration::from_secs(30), || {
        node_sql_value(&replica, "SELECT COUNT(*) FROM sbtest.r")
            .ok()
            .flatten()
            .filter(|c| c == "2")
    })
    .unwrap();

    // A whole-lab down/up cycle keeps data and refuses a second up while running.
    let dir = lab.dir().to_path_buf();
    let opts = holdfast_lab::LabOptions::new(&dir, 1);
    let err = holdfast_lab::up(&opts).unwrap_err();
    assert!(
        format!("{err:#}").contains("already holds a running lab"),
        "{err:#}"
    );
    holdfast_lab::down(&dir).unwrap();
    let st = holdfast_lab::up(&opts).unwrap();
    assert!(st.nodes.iter().all(|n| n.alive));
    assert_eq!(
        node_sql_value(&st.nodes[1], "SELECT COUNT(*) FROM sbtest.r")
            .unwrap()
            .as_deref(),
        Some("2")
    );
    lab.refresh().unwrap();
    // Drop tears it all down.
    let pids: Vec<u32> = lab.status.nodes.iter().filter_map(|n| n.pid).collect();
    drop(lab);
    for pid in pids {
        assert!(!pid_alive(pid), "pid {pid} survived TestLab drop");
    }
    assert!(!dir.exists(), "TestLab drop removes {}", dir.display());
}

/// The lab's file `name` as text (to show that a refused operation changed nothing).
fn lab_file(lab: &TestLab, name: &str) -> String {
    std::fs::read_to_string(lab.dir().join(name)).unwrap()
}

fn count(node: &NodeStatus, sql: &str) -> Option<String> {
    node_sql_value(node, sql).ok().flatten()
}

#[test]
fn add_replica_copies_the_primary_after_its_binlogs_are_purged() {
    const BASE: u16 = 21410;
    let mut lab = TestLab::start_on(1, BASE).expect("lab starts");
    let primary = lab.primary().clone();
    assert_eq!(primary.port, BASE + 10);
    // Data, the commit markers' schema and an account made after the lab's setup.
    node_sql(
        &primary,
        "CREATE TABLE sbtest.a (id INT PRIMARY KEY, v VARCHAR(20)); \
         INSERT INTO sbtest.a VALUES (1, 'one'), (2, 'two'); \
         CREATE DATABASE holdfast; \
         CREATE TABLE holdfast.commit_marker (session BIGINT PRIMARY KEY, n BIGINT) ENGINE=InnoDB; \
         INSERT INTO holdfast.commit_marker VALUES (1, 1); \
         CREATE USER later@'%' IDENTIFIED BY 'later_pass'; \
         FLUSH BINARY LOGS; \
         INSERT INTO sbtest.a VALUES (3, 'three'); \
         FLUSH BINARY LOGS",
    )
    .unwrap();
    // Only the active binary log is left: a replica starting from nothing could not
    // replicate (its first GTIDs are purged). The server keeps a file node2's binlog dump
    // thread still reads: purge until it moved on.
    let current = node_sql_value(&primary, "SHOW MASTER STATUS")
        .unwrap()
        .unwrap();
    wait_for(
        "the old binary logs purged",
        Duration::from_secs(30),
        || {
            node_sql(&primary, &format!("PURGE BINARY LOGS TO '{current}'")).ok()?;
            (node_sql(&primary, "SHOW BINARY LOGS").ok()?.len() == 1).then_some(())
        },
    )
    .unwrap();
    let purged = node_sql_value(&primary, "SELECT @@gtid_binlog_pos").unwrap();

    let added = lab.add_replica(None).expect("add-replica");
    assert_eq!(added.name, "node3");
    assert_eq!(added.port, BASE + 12, "node3's slot of the port layout");
    assert_eq!(added.address, format!("127.0.0.1:{}", BASE + 12));
    assert_eq!(added.role, "replica");
    assert_eq!(added.replicates_from.as_deref(), Some("node1"));
    let node3 = lab.status.node("node3").unwrap().clone();
    assert!(node3.alive);
    assert_eq!(node3.live_role.as_deref(), Some("replica"));
    assert_eq!(node3.replicates_from.as_deref(), Some("node1"));

    // It has the rows (add_replica returns once it caught up) and the account.
    assert_eq!(
        count(&node3, "SELECT GROUP_CONCAT(v ORDER BY id) FROM sbtest.a").as_deref(),
        Some("one,two,three")
    );
    assert_eq!(
        count(
            &node3,
            "SELECT n FROM holdfast.commit_marker WHERE session = 1"
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        count(&node3, "SELECT COUNT(*) FROM mysql.user WHERE user IN ('later', 'app', 'holdfast_monitor', 'repl')")
            .as_deref(),
        Some("6")
    );
    assert_eq!(count(&node3, "SELECT @@server_id").as_deref(), Some("3"));
    assert_eq!(count(&node3, "SELECT @@read_only").as_deref(), Some("1"));
    // Its position is the primary's; the load wrote nothing to its own binlog.
    assert_eq!(
        count(&node3, "SELECT @@gtid_slave_pos"),
        purged.clone(),
        "gtid_slave_pos after the seed"
    );
    let own = count(&node3, "SELECT @@gtid_binlog_pos").unwrap_or_default();
    assert!(!own.contains("-3-"), "local GTIDs on node3: {own}");

    // New writes, to the data and to the commit markers, replicate.
    node_sql(
        &primary,
        "INSERT INTO sbtest.a VALUES (4, 'four'); \
         INSERT INTO holdfast.commit_marker VALUES (1, 2) ON DUPLICATE KEY UPDATE n = VALUES(n)",
    )
    .unwrap();
    wait_for(
        "node3 replicates new writes",
        Duration::from_secs(30),
        || {
            (count(&node3, "SELECT COUNT(*) FROM sbtest.a").as_deref() == Some("4")
                && count(
                    &node3,
                    "SELECT n FROM holdfast.commit_marker WHERE session = 1",
                )
                .as_deref()
                    == Some("2"))
            .then_some(())
        },
    )
    .unwrap();
    let slave = &node_sql_maps(&node3, "SHOW SLAVE STATUS").unwrap()[0];
    assert_eq!(slave["Slave_IO_Running"], "Yes");
    assert_eq!(slave["Slave_SQL_Running"], "Yes");
    assert_eq!(slave["Using_Gtid"], "Slave_Pos");
    assert_eq!(slave["Master_Port"], primary.port.to_string());

    // lab.json and holdfast.toml know it; the split listener sits at BASE+2.
    let st = holdfast_lab::status(lab.dir()).unwrap();
    assert_eq!(
        st.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["node1", "node2", "node3"]
    );
    assert!(!lab_file(&lab, "lab.json").contains("live_role"));
    let cfg = holdfast_config::Config::load(&st.config).unwrap();
    assert_eq!(
        cfg.backends
            .iter()
            .map(|b| (b.name.as_str(), b.address.as_str()))
            .collect::<Vec<_>>(),
        [
            ("node1", st.nodes[0].address.as_str()),
            ("node2", st.nodes[1].address.as_str()),
            ("node3", added.address.as_str())
        ]
    );
    let split = format!("127.0.0.1:{}", BASE + 2);
    assert_eq!(st.split.as_deref(), Some(split.as_str()));
    assert_eq!(cfg.listeners.len(), 1);
    assert_eq!(cfg.listeners[0].listen, split);
    assert_eq!(cfg.listeners[0].routing, holdfast_config::Routing::Split);
    assert_eq!(
        cfg.listeners[0].mode,
        holdfast_config::ListenerMode::Session
    );
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["split"], split.as_str());
}

#[test]
fn remove_refuses_unknown_primary_and_last_node_and_removes_replicas() {
    let mut lab = TestLab::start(1).expect("lab starts");
    let before = (lab_file(&lab, "lab.json"), lab_file(&lab, "holdfast.toml"));
    let err = lab.remove_node("node9").unwrap_err();
    assert!(
        format!("{err:#}").contains("has no node \"node9\""),
        "{err:#}"
    );
    let err = lab.remove_node("node1").unwrap_err();
    assert!(
        format!("{err:#}").contains("node1 is the lab's primary"),
        "{err:#}"
    );
    assert_eq!(
        (lab_file(&lab, "lab.json"), lab_file(&lab, "holdfast.toml")),
        before,
        "a refused remove changes nothing"
    );
    assert!(lab.status.nodes.iter().all(|n| n.alive));

    // A replica with a name of its own, then the original replica goes.
    let extra = lab
        .add_replica(Some("extra"))
        .expect("add-replica --name extra");
    assert_eq!(count(&extra, "SELECT @@server_id").as_deref(), Some("3"));
    let node2 = lab.status.node("node2").unwrap().clone();
    let removed = lab.remove_node("node2").expect("remove node2");
    assert_eq!(removed.name, "node2");
    assert!(!pid_alive(node2.pid.unwrap()), "node2's mariadbd stopped");
    assert!(!node2.datadir.exists(), "node2's data deleted");
    assert!(!node2.socket.exists());
    let names: Vec<&str> = lab.status.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node1", "extra"]);
    let cfg = holdfast_config::Config::load(&lab.status.config).unwrap();
    let backends: Vec<&str> = cfg.backends.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(backends, ["node1", "extra"]);

    // The replica still replicates.
    node_sql(
        lab.primary(),
        "CREATE TABLE sbtest.k (id INT PRIMARY KEY); INSERT INTO sbtest.k VALUES (1)",
    )
    .unwrap();
    wait_for("extra replicates", Duration::from_secs(30), || {
        (count(&extra, "SELECT COUNT(*) FROM sbtest.k").as_deref() == Some("1")).then_some(())
    })
    .unwrap();

    lab.remove_node("extra").expect("remove extra");
    let err = lab.remove_node("node1").unwrap_err();
    assert!(format!("{err:#}").contains("last node"), "{err:#}");
    assert_eq!(lab.status.nodes.len(), 1);
    assert!(lab.status.nodes[0].alive);
}

#[test]
fn status_shows_live_roles_after_a_switchover() {
    let mut lab = TestLab::start(1).expect("lab starts");
    let (node1, node2) = (lab.primary().clone(), lab.replicas()[0].clone());
    let st = holdfast_lab::status(lab.dir()).unwrap();
    assert_eq!(st.nodes[0].live_role.as_deref(), Some("primary"));
    assert_eq!(st.nodes[1].live_role.as_deref(), Some("replica"));
    assert_eq!(st.nodes[1].replicates_from.as_deref(), Some("node1"));
    assert_eq!(st.primary().unwrap().name, "node1");

    // A switchover by hand: node2 becomes the writable primary, node1 its replica.
    node_sql(&node1, "SET GLOBAL read_only = 1").unwrap();
    let pos = node_sql_value(&node1, "SELECT @@gtid_binlog_pos")
        .unwrap()
        .unwrap();
    node_sql_value(&node2, &format!("SELECT MASTER_GTID_WAIT('{pos}', 30)")).unwrap();
    node_sql(
        &node2,
        "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0",
    )
    .unwrap();
    node_sql(
        &node1,
        &format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='repl', \
             MASTER_PASSWORD='repl_pass', MASTER_USE_GTID=current_pos; START SLAVE",
            node2.port
        ),
    )
    .unwrap();

    let st = holdfast_lab::status(lab.dir()).unwrap();
    assert_eq!(st.nodes[0].live_role.as_deref(), Some("replica"));
    assert_eq!(st.nodes[0].replicates_from.as_deref(), Some("node2"));
    assert_eq!(st.nodes[1].live_role.as_deref(), Some("primary"));
    assert_eq!(st.nodes[1].replicates_from, None);
    // The recorded roles stay; primary() follows the servers.
    assert_eq!(st.nodes[0].role, "primary");
    assert_eq!(st.primary().unwrap().name, "node2");
    assert_eq!(
        st.replicas().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["node1"]
    );
    let table = holdfast_lab::status_table(&st);
    assert!(
        table.lines().any(|l| l.starts_with("node2    primary ")),
        "{table}"
    );
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["nodes"][1]["live_role"], "primary");
    assert_eq!(json["nodes"][1]["role"], "replica");

    // The live primary cannot be removed; the old one, now a replica, could be.
    let err = lab.remove_node("node2").unwrap_err();
    assert!(
        format!("{err:#}").contains("node2 is the lab's primary"),
        "{err:#}"
    );

    // A new replica follows the current primary, not the recorded one.
    let node3 = lab
        .add_replica(None)
        .expect("add-replica after the switchover");
    assert_eq!(node3.replicates_from.as_deref(), Some("node2"));
    let slave = &node_sql_maps(&node3, "SHOW SLAVE STATUS").unwrap()[0];
    assert_eq!(slave["Master_Port"], node2.port.to_string());
    node_sql(
        &node2,
        "CREATE TABLE sbtest.s (id INT PRIMARY KEY); INSERT INTO sbtest.s VALUES (1)",
    )
    .unwrap();
    for n in [&node1, &node3] {
        wait_for(
            "a write on node2 replicates",
            Duration::from_secs(30),
            || (count(n, "SELECT COUNT(*) FROM sbtest.s").as_deref() == Some("1")).then_some(()),
        )
        .unwrap();
    }

    // A stopped node is down.
    lab.kill_node("node1").unwrap();
    let st = holdfast_lab::status(lab.dir()).unwrap();
    assert_eq!(st.nodes[0].live_role.as_deref(), Some("down"));
    assert_eq!(st.primary().unwrap().name, "node2");
}
