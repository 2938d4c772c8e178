//! What a newcomer pointing holdfast at their own server must not be misled by (issue 19):
//! `holdfast check` names every privilege the monitor account lacks with the GRANT that
//! fixes it (and the README's grants pass it), a replica the monitor may not read is
//! reachable and says why, a monitor that cannot log in is named in the clients' error,
//! and sessions end the way a client's do (the server counts none of them aborted).

use holdfast_cluster::preflight::{self, Report};
use holdfast_config::{Config, Routing};
use holdfast_it::{runtime, wait_for, Harness, Options};
use std::time::Duration;

fn check(cfg: &Config) -> Report {
    runtime()
        .expect("runtime")
        .block_on(preflight::check(cfg, &cfg.backends))
}

fn with_monitor(h: &Harness, user: &str, password: &str) -> Config {
    let mut cfg = (**h.shared.config()).clone();
    cfg.auth.monitor_user = user.into();
    cfg.auth.monitor_password = password.into();
    cfg
}

/// The SQL block of the README's "Pointing holdfast at an existing server", statement by
/// statement.
fn readme_grants() -> Vec<String> {
    let readme = include_str!("../../../../README.md");
    let section = readme
        .split("## Pointing holdfast at an existing server")
        .nth(1)
        .expect("the README's section");
    let block = section
        .split("```sql")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section's SQL block");
    let sql: String = block
        .lines()
        .map(|l| l.split("--").next().unwrap_or("").trim())
        .collect::<Vec<_>>()
        .join(" ");
    sql.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn check_names_each_missing_privilege_with_the_grant_that_fixes_it() {
    let h = Harness::start_with(Options::default().replicas(1));
    // The lab's monitor has exactly the README's grants: nothing to report.
    let lab = check(&h.shared.config());
    assert_eq!(lab.problem_count(), 0, "{}", lab.render());

    // The grants the README gave before: SELECT on mysql.* and REPLICATION CLIENT.
    h.root_sql(
        "CREATE USER old_monitor@'%' IDENTIFIED BY 'om_pass'; \
         GRANT SELECT ON mysql.* TO old_monitor@'%'; \
         GRANT REPLICATION CLIENT ON *.* TO old_monitor@'%'",
    );
    let cfg = with_monitor(&h, "old_monitor", "om_pass");
    let old = wait_for(
        "old_monitor to log in on both nodes",
        Duration::from_secs(30),
        || {
            let r = check(&cfg);
            r.nodes
                .iter()
                .all(|n| n.problems.iter().all(|p| p.fix.is_some()))
                .then_some(r)
        },
    );
    let text = old.render();
    for node in ["node1", "node2"] {
        let n = old
            .nodes
            .iter()
            .find(|n| n.node == node)
            .expect("every node checked");
        let fixes: Vec<&str> = n.problems.iter().filter_map(|p| p.fix.as_deref()).collect();
        for grant in [
            "GRANT SLAVE MONITOR ON *.* TO 'old_monitor'@'%';",
            "GRANT READ_ONLY ADMIN ON *.* TO 'old_monitor'@'%';",
            "GRANT ALL PRIVILEGES ON holdfast.* TO 'old_monitor'@'%' WITH GRANT OPTION;",
        ] {
            assert!(
                fixes.contains(&grant),
                "{node}: {grant} not asked for:\n{text}"
            );
        }
    }
    assert!(text.contains("SHOW SLAVE STATUS"), "{text}");

    // Running what it says is enough.
    let primary_fixes: Vec<String> = old.nodes[0]
        .problems
        .iter()
        .filter_map(|p| p.fix.clone())
        .collect();
    for fix in &primary_fixes {
        h.root_sql(fix);
    }
    let fixed = wait_for(
        "the grants to reach the replica",
        Duration::from_secs(30),
        || {
            let r = check(&cfg);
            (r.problem_count() == 0).then_some(r)
        },
    );
    assert!(fixed.render().ends_with("0 problem(s) on 2 node(s)"));

    // And the README's own SQL block, run as written, passes the check.
    // (Under another name: the lab's monitor is holdfast_monitor already.)
    let statements = readme_grants();
    assert!(statements.len() >= 4, "{statements:?}");
    for statement in statements {
        let statement = statement
            .replace("choose-a-password", "readme_pass")
            .replace("'holdfast_monitor'", "'readme_monitor'");
        h.root_sql(&statement);
    }
    let readme = wait_for(
        "the README's account to reach the replica",
        Duration::from_secs(30),
        || {
            let r = check(&with_monitor(&h, "readme_monitor", "readme_pass"));
            (r.problem_count() == 0).then_some(r)
        },
    );
    assert_eq!(readme.problem_count(), 0, "{}", readme.render());
}

#[test]
fn a_replica_the_monitor_may_not_read_is_reachable_and_says_why() {
    let h = Harness::start_with(
        Options::default()
            .replicas(1)
            .config(|c| c.proxy.routing = Routing::Split),
    );
    wait_for("node2 to take reads", Duration::from_secs(30), || {
        h.shared.topology.borrow().read_nodes().next().map(|_| ())
    });
    // On node2 only (not binlogged), and the monitor's connections there ended: a
    // server applies a changed global privilege to new connections.
    let monitor = h.shared.config().auth.monitor_user.clone();
    let node2 = h.node("node2");
    holdfast_lab::node_sql(
        node2,
        &format!(
            "SET SESSION sql_log_bin = 0; \
             REVOKE SLAVE MONITOR ON *.* FROM {monitor}@'%'; \
             REVOKE SLAVE MONITOR ON *.* FROM {monitor}@'localhost'"
        ),
    )
    .expect("revoke on node2");
    let threads = holdfast_lab::node_sql(
        node2,
        &format!("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{monitor}'"),
    )
    .expect("processlist");
    for t in threads {
        let _ = holdfast_lab::node_sql(node2, &format!("KILL {}", t[0]));
    }
    let node = wait_for(
        "node2 out of reads for want of SLAVE MONITOR",
        Duration::from_secs(30),
        || {
            let topo = h.shared.topology.borrow().clone();
            let n = topo.nodes.iter().find(|n| n.name == "node2")?.clone();
            let why = n.replication.as_ref()?.error.clone();
            (!n.serves_reads && why.contains("SLAVE MONITOR")).then_some(n)
        },
    );
    // Reachable: it answers; only its replication state is hidden from the monitor.
    assert!(node.reachable, "{node:?}");
    assert_eq!(node.read_only, Some(true));
    let status = holdfast_admin::render_status(&h.status());
    assert!(
        status.contains("cannot read the replication state") && status.contains("1227"),
        "{status}"
    );
}

#[test]
fn clients_are_told_when_the_monitor_cannot_log_in() {
    let h = Harness::start();
    let monitor = h.shared.config().auth.monitor_user.clone();
    // The monitor's password changes under holdfast; its connections are ended, so it must
    // log in again.
    h.root_sql(&format!(
        "ALTER USER {monitor}@'%' IDENTIFIED BY 'not-what-holdfast-has'; \
         ALTER USER {monitor}@'localhost' IDENTIFIED BY 'not-what-holdfast-has'"
    ));
    let threads = h.root_sql(&format!(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{monitor}'"
    ));
    for t in threads {
        let _ = holdfast_lab::node_sql(h.node("node1"), &format!("KILL {}", t[0]));
    }
    let why = wait_for(
        "the monitor's login failure in the topology",
        Duration::from_secs(30),
        || h.shared.topology.borrow().nodes[0].login_error.clone(),
    );
    assert!(
        why.contains(&format!(
            "holdfast cannot log in to node1 as {monitor}: 1045"
        )),
        "{why}"
    );
    // A client (its account's verifier is known) is told the cause, not only "unreachable".
    let out = h.mariadb(h.proxy, &["-e", "SELECT 1"]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains("ERROR 1053")
            && out
                .stderr
                .contains(&format!("cannot log in to node1 as {monitor}: 1045")),
        "{out:?}"
    );
    // /status says the same.
    let status = holdfast_admin::render_status(&h.status());
    assert!(status.contains("cannot log in to node1"), "{status}");
}

fn aborted_clients(h: &Harness, node: &str) -> u64 {
    let rows = holdfast_lab::node_sql(
        h.node(node),
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'ABORTED_CLIENTS'",
    )
    .expect("status");
    rows[0][0].parse().expect("a number")
}

#[test]
fn sessions_end_without_the_server_counting_them_aborted() {
    let h = Harness::start_with(
        Options::default()
            .replicas(1)
            .config(|c| c.proxy.routing = Routing::Split),
    );
    wait_for("node2 to take reads", Duration::from_secs(30), || {
        h.shared.topology.borrow().read_nodes().next().map(|_| ())
    });
    h.mariadb(
        h.proxy,
        &["sbtest", "-e", "CREATE TABLE ab (id INT PRIMARY KEY)"],
    );
    h.wait_sessions(0, Duration::from_secs(10));
    let before = (aborted_clients(&h, "node1"), aborted_clients(&h, "node2"));
    for i in 0..5 {
        let out = h.mariadb(
            h.proxy,
            &[
                "sbtest",
                "-e",
                &format!("INSERT INTO ab VALUES ({i}); SELECT COUNT(*) FROM ab"),
            ],
        );
        assert_eq!(out.code, Some(0), "{out:?}");
    }
    h.wait_sessions(0, Duration::from_secs(10));
    // What the server counts once the sessions' connections are closed.
    let apps = |node: &str| {
        holdfast_lab::node_sql(
            h.node(node),
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'app'",
        )
        .expect("processlist")[0][0]
            .clone()
    };
    let after = wait_for(
        "the backend connections to close",
        Duration::from_secs(10),
        || {
            (apps("node1") == "0" && apps("node2") == "0")
                .then(|| (aborted_clients(&h, "node1"), aborted_clients(&h, "node2")))
        },
    );
    assert_eq!(
        after, before,
        "sessions through holdfast closed their server connections without COM_QUIT \
         (Aborted_clients on node1, node2)"
    );
}

#[test]
fn refused_logins_are_worded_as_the_server_words_them_host_included() {
    for resolves_names in [false, true] {
        let args: &[&str] = if resolves_names {
            &["--skip-name-resolve=0"]
        } else {
            &[]
        };
        let h = Harness::start_with(Options::default().server_args(args));
        for (user, password) in [("nosuch", "x"), ("app", "wrong"), ("nosuch", "")] {
            let via = h.mariadb_as(h.proxy, user, password, &["-e", "SELECT 1"]);
            let direct = h.mariadb_as(h.direct(), user, password, &["-e", "SELECT 1"]);
            assert_eq!(
                via.stderr, direct.stderr,
                "{user}/{password:?}, server resolves names: {resolves_names}"
            );
            assert!(via.stderr.contains("ERROR 1045"), "{via:?}");
        }
    }
}

#[test]
fn rejoining_a_node_that_is_down_says_to_start_it_first() {
    let h = Harness::start_with(Options::default().replicas(1));
    let node2 = h.node("node2").clone();
    let pid = node2.pid.expect("a running node has a pid");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_for("node2 unreachable", Duration::from_secs(30), || {
        let topo = h.shared.topology.borrow().clone();
        topo.nodes
            .iter()
            .any(|n| n.name == "node2" && !n.reachable)
            .then_some(())
    });
    let (code, body) = h.admin_post("/rejoin?node=node2", None);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("cannot reach node2") && body.contains("start node2's server first"),
        "{body}"
    );
}

#[test]
fn a_lab_on_taken_ports_says_which_and_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = taken.local_addr().expect("addr").port();
    let error = match holdfast_lab::TestLab::start_on(0, base) {
        Ok(_) => panic!("a lab started on a port in use"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains(&format!("port {base} (holdfast's proxy listener"))
            && error.contains("--base-port"),
        "{error}"
    );
}

/// A fresh `mariadb-install-db` server has anonymous accounts (`''@'localhost'`): on a server
/// that resolves host names they shadow a monitor account that exists only `@'%'` for
/// logins from this host. The check names that cause when the login fails, and warns about
/// the anonymous accounts when it does not.
#[test]
fn check_points_at_anonymous_accounts_that_shadow_the_monitor() {
    let h = Harness::start_with(Options::default().server_args(&["--skip-name-resolve=0"]));
    h.root_sql(
        "CREATE USER ''@'localhost'; \
         CREATE USER only_pct@'%' IDENTIFIED BY 'op_pass'; \
         GRANT SELECT ON mysql.* TO only_pct@'%'",
    );
    let shadowed = check(&with_monitor(&h, "only_pct", "op_pass"));
    let text = shadowed.render();
    assert!(
        text.contains("holdfast cannot log in to node1 as only_pct: 1045")
            && text.contains("DROP USER ''@'localhost'"),
        "{text}"
    );
    // The lab's monitor exists @'localhost' too: it logs in, and is warned.
    let lab = check(&h.shared.config());
    assert_eq!(lab.problem_count(), 0, "{}", lab.render());
    assert!(
        lab.render().contains("anonymous account ''@'localhost'"),
        "{}",
        lab.render()
    );
}

/// Found by MariaDB's `main.require_secure_transport` through holdfast: a server that
/// requires TLS of its clients (`require_secure_transport = ON`) refused a plain client
/// directly, but took it through holdfast (whose own link to it is TLS). holdfast applies
/// the server's rule to its clients: refused as the server refuses, TLS clients go on.
#[test]
fn a_server_that_requires_tls_gets_no_plain_client_through_holdfast() {
    let h = Harness::start();
    h.root_sql("SET GLOBAL require_secure_transport = ON");
    wait_for(
        "the monitor to see the rule",
        Duration::from_secs(30),
        || {
            h.shared.topology.borrow().nodes[0]
                .requires_secure_transport
                .then_some(())
        },
    );
    let plain = ["--skip-ssl", "-e", "SELECT 1"];
    let via = h.mariadb(h.proxy, &plain);
    let direct = h.mariadb(h.direct(), &plain);
    assert_ne!(direct.code, Some(0), "{direct:?}");
    assert_eq!(via.stderr, direct.stderr, "refused as the server refuses");
    let tls = h.mariadb(h.proxy, &["--ssl", "-e", "SELECT 1"]);
    h.root_sql("SET GLOBAL require_secure_transport = OFF");
    assert_eq!(tls.code, Some(0), "{tls:?}");
}
