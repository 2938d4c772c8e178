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
