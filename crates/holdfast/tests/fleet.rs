//! Two `holdfast serve` processes in front of one lab, members of one fleet (`[cluster]`)
//! through a real etcd: one of them leads and runs HA; the primary killed, exactly one
//! failover is made, by the leader, and both members' sessions move; the leader killed,
//! the other member leads within the lease's TTL.

mod common;

use common::{holdfast, lab_up, low_port, run, Lab, Serving};
use holdfast_lab::etcd::Etcd;
use mysql::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// A port for a member's listener: below the ephemeral range, as the lab's (see
/// [`low_port`]).
fn free_port() -> u16 {
    low_port(0)
}

fn status(config: &Path) -> Option<serde_json::Value> {
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(config)
        .args(["status", "--json"]));
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    holdfast_lab::wait_for(what, Duration::from_secs(30), f).unwrap_or_else(|e| panic!("{e}"))
}

fn serve(config: &Path, log: &Path) -> Serving {
    Serving(
        holdfast()
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("a log"))
            .spawn()
            .expect("holdfast serve"),
    )
}

fn session(port: u16) -> mysql::Conn {
    let url = format!("mysql://app:app_pass@127.0.0.1:{port}/sbtest?prefer_socket=false");
    mysql::Conn::new(mysql::Opts::from_url(&url).expect("url")).expect("a session")
}

/// A lab of `replicas` replicas, an etcd, and two members' configs: `a` on the lab's
/// ports, `b` on others.
struct Fleet {
    /// A third member's config (on ports of its own).
    c_text: String,
    dir: PathBuf,
    base: u16,
    b_port: u16,
    a_config: PathBuf,
    b_config: PathBuf,
    a_log: PathBuf,
    b_log: PathBuf,
    // (Dropped last: the members first, then etcd, then the lab.)
    etcd: Etcd,
    _lab: Lab,
}

impl Fleet {
    fn new(name: &str, replicas: &str) -> Fleet {
        Fleet::with_ttl(name, replicas, 2)
    }

    /// [`Fleet::new`] with a lease of `ttl` seconds.
    fn with_ttl(name: &str, replicas: &str, ttl: u64) -> Fleet {
        let dir: PathBuf =
            std::env::temp_dir().join(format!("holdfast-fleet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let base = lab_up(&dir, &["--replicas", replicas]);
        let lab = Lab(dir.clone());
        let etcd = Etcd::start_on(&dir.join("etcd"), low_port(0), low_port(0)).expect("etcd");
        let lab_config =
            std::fs::read_to_string(dir.join("holdfast.toml")).expect("the lab's config");
        // The lab's semi-sync timeout (2 s) can pass on a loaded machine, and MariaDB then
        // acknowledges commits no replica has: the tests' kills would lose them. Here a
        // commit waits for its replica as long as the tests do.
        let lab_config = {
            let short = "semi_sync_timeout_ms = 2000";
            assert!(lab_config.contains(short), "{lab_config}");
            lab_config.replace(short, "semi_sync_timeout_ms = 60000")
        };
        let cluster = |member: &str| {
            format!(
                "\n[cluster]\nname = \"lab\"\netcd = [\"{}\"]\nmember = \"{member}\"\nlease_ttl_secs = {ttl}\n",
                etcd.endpoint
            )
        };
        let a_config = dir.join("a.toml");
        std::fs::write(&a_config, format!("{lab_config}{}", cluster("a"))).expect("a's config");
        let b_port = free_port();
        let b_text = on_ports(&lab_config, base, b_port);
        let b_config = dir.join("b.toml");
        std::fs::write(&b_config, format!("{b_text}{}", cluster("b"))).expect("b's config");
        let c_text = format!(
            "{}{}",
            on_ports(&lab_config, base, free_port()),
            cluster("c")
        );
        Fleet {
            c_text,
            a_log: dir.join("a.log"),
            b_log: dir.join("b.log"),
            dir,
            base,
            b_port,
            a_config,
            b_config,
            etcd,
            _lab: lab,
        }
    }

    /// A third member's config, named `member`.
    fn member_config(&self, member: &str) -> String {
        self.c_text
            .replace("member = \"c\"", &format!("member = \"{member}\""))
    }

    fn logs(&self) -> String {
        format!(
            "a:\n{}\nb:\n{}\netcd (its last 40 lines):\n{}",
            std::fs::read_to_string(&self.a_log).unwrap_or_default(),
            std::fs::read_to_string(&self.b_log).unwrap_or_default(),
            tail(&self.etcd.dir().join("etcd.log"), 40)
        )
    }

    /// Waits for a leader; whether it is `a`.
    fn a_leads(&self) -> bool {
        let leaders = || -> Option<(bool, bool)> {
            let (sa, sb) = (status(&self.a_config)?, status(&self.b_config)?);
            let (la, lb) = (
                sa["fleet"]["leader"].as_bool()?,
                sb["fleet"]["leader"].as_bool()?,
            );
            (la || lb).then_some((la, lb))
        };
        let (a, b) = holdfast_lab::wait_for("a leader", Duration::from_secs(30), leaders)
            .unwrap_or_else(|e| panic!("{e}\n{}", self.logs()));
        assert!(a != b, "two leaders\n{}", self.logs());
        a
    }
}

/// The last `n` lines of the file at `path`.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The lab's config `text` (listening from port `base` on) moved to free ports, the client
/// listener on `port`.
fn on_ports(text: &str, base: u16, port: u16) -> String {
    let mut text = text.to_string();
    for (i, port) in [port, free_port(), free_port()].iter().enumerate() {
        let from = format!("\"127.0.0.1:{}\"", base + i as u16);
        assert!(text.contains(&from), "the lab's config listens on {from}");
        text = text.replace(&from, &format!("\"127.0.0.1:{port}\""));
    }
    text
}

/// The members a `/status` fleet view lists, by name.
fn member_names(fleet: &serde_json::Value) -> Option<Vec<String>> {
    Some(
        fleet["members"]
            .as_array()?
            .iter()
            .filter_map(|m| m["member"].as_str().map(String::from))
            .collect(),
    )
}

fn failovers(config: &Path) -> u64 {
    status(config).expect("a status")["ha"]["counters"]["failovers"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn one_member_leads_fails_over_once_and_the_lead_moves_when_it_dies() {
    let f = Fleet::new("failover", "1");
    let (dir, base, b_port) = (f.dir.clone(), f.base, f.b_port);
    let (a_config, b_config) = (f.a_config.clone(), f.b_config.clone());
    let logs = || f.logs();
    let mut a = Some(serve(&a_config, &f.a_log));
    let _b = serve(&b_config, &f.b_log);

    // One leader, the same fleet on both.
    let a_leads = f.a_leads();
    // Each member lists both, and names the leader.
    let leader_name = if a_leads { "a" } else { "b" };
    for config in [&a_config, &b_config] {
        wait_for("both members listed", || {
            let fleet = status(config)?["fleet"].clone();
            (member_names(&fleet)? == ["a", "b"] && fleet["leader_member"] == leader_name)
                .then_some(())
        });
    }
    // `ctl status` says so to an operator.
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(&a_config)
        .arg("status"));
    let text = String::from_utf8_lossy(&out.stdout);
    let said = match a_leads {
        true => "fleet lab: member a leads",
        false => "fleet lab: member a does not lead",
    };
    assert!(text.contains(said), "{text}");
    assert!(text.contains("  member b: clients 127.0.0.1:"), "{text}");
    let (leader, follower) = match a_leads {
        true => (&a_config, &b_config),
        false => (&b_config, &a_config),
    };
    // A third member configured for other nodes is refused at start, saying why.
    let node2 = holdfast_lab::status(&dir)
        .expect("the lab")
        .nodes
        .iter()
        .find(|n| n.name == "node2")
        .map(|n| format!("address = \"127.0.0.1:{}\"", n.port))
        .expect("node2");
    let c_text = f.member_config("c");
    assert!(c_text.contains(&node2), "{node2} in c's config");
    let c_config = dir.join("c.toml");
    std::fs::write(
        &c_config,
        c_text.replace(&node2, "address = \"127.0.0.1:1\""),
    )
    .expect("c's config");
    let mut c = holdfast()
        .args(["serve", "--config"])
        .arg(&c_config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("holdfast serve");
    let exit = wait_for("the misfit member to stop", || c.try_wait().ok().flatten());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().expect("stderr"), &mut said)
        .expect("its stderr");
    assert!(!exit.success(), "{said}");
    assert!(
        said.contains("is configured for another cluster") && said.contains("127.0.0.1:1"),
        "{said}"
    );

    // A session on each member, with state.
    let mut on_a = session(base);
    let mut on_b = session(b_port);
    on_a.query_drop("SET @who = 'a'").expect("set");
    on_b.query_drop("SET @who = 'b'").expect("set");
    // Each member's session count is in the fleet's listing, on every member.
    for config in [&a_config, &b_config] {
        wait_for("each member's session listed", || {
            let members = status(config)?["fleet"]["members"].as_array()?.clone();
            let sessions: Vec<u64> = members
                .iter()
                .filter_map(|m| m["sessions"].as_u64())
                .collect();
            (sessions == [1, 1]).then_some(())
        });
    }

    // (What the sessions set is captured first, as an idle session's is within moments.)
    for config in [&a_config, &b_config] {
        wait_for("the sessions' state captured", || {
            let sessions = status(config)?["sessions"].as_array()?.clone();
            (!sessions.is_empty() && sessions.iter().all(|s| s["capture_due"] == false))
                .then_some(())
        });
    }
    // The primary killed: one failover, the leader's.
    holdfast_lab::kill_node(&dir, "node1").expect("kill node1");
    for config in [&a_config, &b_config] {
        wait_for("node2 the primary on both members", || {
            (status(config)?["topology"]["primary"] == "node2").then_some(())
        });
    }
    assert_eq!(failovers(leader), 1, "{}", logs());
    assert_eq!(failovers(follower), 0, "{}", logs());
    // The member that does not lead heard from the leader which node it promoted.
    let follower_log = match a_leads {
        true => &f.b_log,
        false => &f.a_log,
    };
    wait_for("the follower to hear of the new primary", || {
        std::fs::read_to_string(follower_log)
            .ok()?
            .contains("fleet: the leader made a new primary")
            .then_some(())
    });
    // Every member shows the decision, who made it and under which epoch.
    let epoch = status(leader).expect("a status")["fleet"]["epoch"].clone();
    for config in [&a_config, &b_config] {
        let decision = wait_for("the failover in the fleet's decisions", || {
            let decisions = status(config)?["fleet"]["decisions"].as_array()?.clone();
            decisions.last().cloned()
        });
        assert_eq!(decision["by"], leader_name, "{decision}");
        assert_eq!(decision["epoch"], epoch, "{decision}");
        assert_eq!(decision["ok"], true, "{decision}");
        assert!(
            decision["what"]
                .as_str()
                .is_some_and(|w| w.starts_with("failover (automatic)")),
            "{decision}"
        );
    }
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(follower)
        .arg("status"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "by member {leader_name} (epoch {epoch}): failover (automatic)"
        )),
        "{text}"
    );
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(leader)
        .arg("metrics"));
    let metrics = String::from_utf8_lossy(&out.stdout);
    for line in [
        "holdfast_fleet_leader 1",
        "holdfast_fleet_members 2",
        "holdfast_fleet_elections_total 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    // Both members' sessions went on, on the new primary.
    for (c, who) in [(&mut on_a, "a"), (&mut on_b, "b")] {
        let v: Option<Option<String>> = c
            .query_first("SELECT @who")
            .unwrap_or_else(|e| panic!("the session goes on: {e}\n{}", logs()));
        let v = v.flatten();
        assert_eq!(v.as_deref(), Some(who), "{}", logs());
    }

    // The leader killed (SIGKILL: its lease runs out): the other member leads.
    if a_leads {
        drop(a.take());
    } else {
        drop(_b);
    }
    let survivor = match a_leads {
        true => &b_config,
        false => &a_config,
    };
    wait_for("the other member to lead", || {
        status(survivor)?["fleet"]["leader"]
            .as_bool()?
            .then_some(())
    });
}

/// The leader frozen (SIGSTOP) past its lease: the other member leads and fails the
/// killed primary over; thawed, the old leader makes no decision (it asks etcd before
/// any: it no longer leads), and the new leader's promotion stands.
#[test]
fn a_frozen_leader_thawed_after_its_lease_makes_no_promotion() {
    let f = Fleet::new("frozen", "2");
    let a = serve(&f.a_config, &f.a_log);
    let b = serve(&f.b_config, &f.b_log);
    let a_leads = f.a_leads();
    let (leader, follower, leader_pid, leader_log) = match a_leads {
        true => (&f.a_config, &f.b_config, a.0.id(), &f.a_log),
        false => (&f.b_config, &f.a_config, b.0.id(), &f.b_log),
    };
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &leader_pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    wait_for("the other member to lead", || {
        status(follower)?["fleet"]["leader"]
            .as_bool()?
            .then_some(())
    });
    holdfast_lab::kill_node(&f.dir, "node1").expect("kill node1");
    let promoted = wait_for("the new leader's failover", || {
        let s = status(follower)?;
        (s["ha"]["counters"]["failovers"].as_u64()? == 1)
            .then(|| s["topology"]["primary"].as_str().map(str::to_string))
            .flatten()
    });
    signal("-CONT");
    // Thawed, it answers again, says it does not lead, and follows the new primary.
    wait_for("the old leader to say it does not lead", || {
        (!status(leader)?["fleet"]["leader"].as_bool()?).then_some(())
    });
    wait_for("the old leader to see the new primary", || {
        (status(leader)?["topology"]["primary"] == promoted.as_str()).then_some(())
    });
    assert_eq!(failovers(leader), 0, "{}", f.logs());
    assert_eq!(failovers(follower), 1, "{}", f.logs());
    let log = std::fs::read_to_string(leader_log).unwrap_or_default();
    assert!(!log.contains("ha: failover promoting"), "{}", f.logs());
    drop((a, b));
}

/// A switchover asked of the member that does not lead runs on the leader (forwarded to
/// its admin API): one switchover, counted by the leader; both members follow the new
/// primary.
#[test]
fn a_switchover_asked_of_a_member_that_does_not_lead_runs_on_the_leader() {
    let f = Fleet::new("forward", "1");
    let _a = serve(&f.a_config, &f.a_log);
    let _b = serve(&f.b_config, &f.b_log);
    let (leader, follower) = match f.a_leads() {
        true => (&f.a_config, &f.b_config),
        false => (&f.b_config, &f.a_config),
    };
    let out = run(holdfast().args(["ctl", "--config"]).arg(follower).args([
        "switchover",
        "--to",
        "node2",
    ]));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.logs()
    );
    let switchovers = |config: &Path| {
        status(config).expect("a status")["ha"]["counters"]["switchovers"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(switchovers(leader), 1, "{}", f.logs());
    assert_eq!(switchovers(follower), 0, "{}", f.logs());
    for config in [leader, follower] {
        wait_for("node2 the primary on both members", || {
            (status(config)?["topology"]["primary"] == "node2").then_some(())
        });
    }
}

/// A planned switchover holds every member's sessions at safe points before the fence:
/// a session in a transaction on the member that does not lead finishes it on the old
/// primary (its connection is not killed under it, nothing is replayed), and its next
/// statement waits for the new primary.
#[test]
fn a_switchover_holds_the_sessions_of_every_member() {
    let f = Fleet::new("park", "1");
    let _a = serve(&f.a_config, &f.a_log);
    let _b = serve(&f.b_config, &f.b_log);
    let a_leads = f.a_leads();
    let (leader, follower, follower_port, follower_log) = match a_leads {
        true => (&f.a_config, &f.b_config, f.b_port, &f.b_log),
        false => (&f.b_config, &f.a_config, f.base, &f.a_log),
    };
    let mut s = session(follower_port);
    s.query_drop("CREATE TABLE sbtest.parked (id INT PRIMARY KEY)")
        .expect("a table");
    s.query_drop("BEGIN").expect("begin");
    s.query_drop("INSERT INTO sbtest.parked VALUES (1)")
        .expect("insert");
    let leader_config = leader.clone();
    let switchover = std::thread::spawn(move || {
        run(holdfast()
            .args(["ctl", "--config"])
            .arg(&leader_config)
            .args(["switchover", "--to", "node2"]))
    });
    wait_for("the member to hold its sessions", || {
        std::fs::read_to_string(follower_log)
            .ok()?
            .contains("fleet: the leader switches over")
            .then_some(())
    });
    // The transaction ends on the old primary; the next statement waits for the new one.
    s.query_drop("COMMIT")
        .unwrap_or_else(|e| panic!("commit: {e}\n{}", f.logs()));
    s.query_drop("INSERT INTO sbtest.parked VALUES (2)")
        .unwrap_or_else(|e| panic!("insert after: {e}\n{}", f.logs()));
    let out = switchover.join().expect("the switchover");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.logs()
    );
    let port: u16 = s
        .query_first("SELECT @@port")
        .expect("a read")
        .expect("a row");
    let lab = holdfast_lab::status(&f.dir).expect("the lab");
    let node2 = lab.nodes.iter().find(|n| n.name == "node2").expect("node2");
    assert_eq!(port, node2.port, "the session is on the new primary");
    let rows: Vec<u32> = s
        .query("SELECT id FROM sbtest.parked ORDER BY id")
        .expect("rows");
    assert_eq!(rows, vec![1, 2]);
    // Nothing was replayed: the transaction was not cut.
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(follower)
        .arg("metrics"));
    let metrics = String::from_utf8_lossy(&out.stdout);
    let replays: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("holdfast_transaction_replays_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(replays, 0.0, "{metrics}\n{}", f.logs());
}

/// etcd stopped for 10 s: both members keep serving their sessions (reads and writes);
/// neither leads, so the primary killed meanwhile is not failed over by anyone; etcd back
/// (the same data), one member leads again, fails the primary over once, and both
/// members' sessions go on on the new primary with their state.
#[test]
fn with_etcd_stopped_members_serve_and_decide_nothing_until_it_is_back() {
    let mut f = Fleet::new("etcd-down", "1");
    let _a = serve(&f.a_config, &f.a_log);
    let _b = serve(&f.b_config, &f.b_log);
    f.a_leads();
    // Acknowledged writes survive a failover only once the primary runs semi-sync.
    // (The leader's status says: the member that does not lead watches no primary.)
    wait_for("semi-sync on the primary", || {
        [&f.a_config, &f.b_config]
            .into_iter()
            .any(|c| status(c).is_some_and(|s| s["ha"]["semi_sync"]["active"] == true))
            .then_some(())
    });
    let mut on_a = session(f.base);
    let mut on_b = session(f.b_port);
    on_a.query_drop("CREATE TABLE sbtest.kept (who CHAR(1) PRIMARY KEY)")
        .expect("a table");
    for (c, who) in [(&mut on_a, "a"), (&mut on_b, "b")] {
        c.query_drop(format!("SET @who = '{who}'")).expect("set");
    }
    for config in [&f.a_config, &f.b_config] {
        wait_for("the sessions' state captured", || {
            let sessions = status(config)?["sessions"].as_array()?.clone();
            (!sessions.is_empty() && sessions.iter().all(|s| s["capture_due"] == false))
                .then_some(())
        });
    }

    f.etcd.kill();
    let stopped = std::time::Instant::now();
    // Neither member leads (the leader stops within two thirds of the lease's TTL).
    for config in [&f.a_config, &f.b_config] {
        wait_for("no member to lead", || {
            (!status(config)?["fleet"]["leader"].as_bool()?).then_some(())
        });
    }
    // The sessions are served: reads and writes.
    for (c, who) in [(&mut on_a, "a"), (&mut on_b, "b")] {
        c.query_drop(format!("INSERT INTO sbtest.kept VALUES ('{who}')"))
            .unwrap_or_else(|e| panic!("{who} writes without etcd: {e}\n{}", f.logs()));
    }
    // The primary killed: no member may decide; until etcd has been gone 10 s, none does.
    holdfast_lab::kill_node(&f.dir, "node1").expect("kill node1");
    while stopped.elapsed() < Duration::from_secs(10) {
        for config in [&f.a_config, &f.b_config] {
            let s = status(config).expect("a member answers without etcd");
            assert_eq!(s["ha"]["counters"]["failovers"], 0, "{}", f.logs());
            assert_eq!(s["fleet"]["leader"], false, "{}", f.logs());
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    f.etcd.start_again().expect("etcd again");
    for config in [&f.a_config, &f.b_config] {
        wait_for("node2 the primary on both members", || {
            (status(config)?["topology"]["primary"] == "node2").then_some(())
        });
    }
    let total = failovers(&f.a_config) + failovers(&f.b_config);
    assert_eq!(total, 1, "exactly one failover\n{}", f.logs());
    for (c, who) in [(&mut on_a, "a"), (&mut on_b, "b")] {
        let v: Option<Option<String>> = c
            .query_first("SELECT @who")
            .unwrap_or_else(|e| panic!("the session goes on: {e}\n{}", f.logs()));
        assert_eq!(v.flatten().as_deref(), Some(who), "{}", f.logs());
    }
    let rows: Vec<String> = on_a
        .query("SELECT who FROM sbtest.kept ORDER BY who")
        .expect("rows");
    assert_eq!(
        rows,
        ["a", "b"],
        "the writes made without etcd are there\n{}",
        f.logs()
    );
}

/// `lab up --proxies 2` starts an etcd and writes one config per member; `lab status
/// --json` lists them; both served, they form one fleet with one leader; `lab down` stops
/// the etcd too, and `lab up` on the stopped lab starts it again.
#[test]
fn a_lab_with_two_proxies_is_a_fleet() {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("holdfast-fleet-lab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Ports below the ephemeral range: the second member binds its listeners only when
    // served (see `low_port`).
    let mut base = 0;
    for _ in 0..3 {
        let try_base = low_port(64);
        let out = run(holdfast()
            .args(["lab", "up", "--replicas", "1", "--proxies", "2", "--dir"])
            .arg(&dir)
            .args(["--base-port", &try_base.to_string()]));
        if out.status.success() {
            base = try_base;
            break;
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("is in use"), "lab up failed: {why}");
    }
    assert!(base > 0, "no free base port for the lab");
    let lab = Lab(dir.clone());
    let out = run(holdfast()
        .args(["lab", "status", "--json", "--dir"])
        .arg(&dir));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lab status --json");
    let endpoint = st["etcd"]["endpoint"]
        .as_str()
        .expect("an etcd")
        .to_string();
    let proxies = st["proxies"].as_array().expect("the proxies").clone();
    let configs: Vec<PathBuf> = proxies
        .iter()
        .map(|p| PathBuf::from(p["config"].as_str().expect("a config")))
        .collect();
    assert_eq!(configs.len(), 2, "{st}");
    assert_eq!(
        configs[0],
        PathBuf::from(st["config"].as_str().expect("config"))
    );
    let logs: Vec<PathBuf> = (1..=2).map(|i| dir.join(format!("proxy{i}.log"))).collect();
    let members: Vec<Serving> = configs
        .iter()
        .zip(&logs)
        .map(|(c, l)| serve(c, l))
        .collect();
    let member_logs = || {
        logs.iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    for config in &configs {
        holdfast_lab::wait_for(
            "both members listed, one leading",
            Duration::from_secs(30),
            || {
                let fleet = status(config)?["fleet"].clone();
                (member_names(&fleet)? == ["proxy1", "proxy2"]
                    && fleet["leader_member"].is_string())
                .then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", member_logs()));
    }
    drop(members);
    let address = endpoint.trim_start_matches("http://").to_string();
    let out = run(holdfast().args(["lab", "down", "--dir"]).arg(&dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "etcd stopped with the lab"
    );
    let out = run(holdfast()
        .args([
            "lab",
            "up",
            "--replicas",
            "1",
            "--base-port",
            &base.to_string(),
            "--dir",
        ])
        .arg(&dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("etcd again", || std::net::TcpStream::connect(&address).ok());
    drop(lab);
}

/// A process killed after the test (an upgrade's successor, not a child of the test).
struct Pid(u32);

impl Drop for Pid {
    fn drop(&mut self) {
        let _ = holdfast_lab::procs::kill_now(self.0);
    }
}

/// A member that leaves on purpose hands the lead on at once, not when its lease runs
/// out (60 s here, longer than any wait below): upgraded (`ctl upgrade`: the old process
/// resigns as it lets go), or stopped (SIGTERM).
#[test]
fn a_member_that_upgrades_or_stops_hands_the_lead_on_at_once() {
    let f = Fleet::with_ttl("leave", "1", 60);
    let a = serve(&f.a_config, &f.a_log);
    let b = serve(&f.b_config, &f.b_log);
    let leader = match f.a_leads() {
        true => &f.a_config,
        false => &f.b_config,
    };
    let old_pid = status(leader).expect("a status")["pid"].clone();
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(leader)
        .args(["upgrade", "--json"]));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.logs()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a report");
    let successor = Pid(report["pid"].as_u64().expect("pid") as u32);
    // The old process resigned: a member leads (the other, first in line, or the
    // successor), long before the old lease could run out.
    let leads = |config: &Path| -> Option<bool> { status(config)?["fleet"]["leader"].as_bool() };
    wait_for("a member to lead after the upgrade", || {
        let (la, lb) = (leads(&f.a_config)?, leads(&f.b_config)?);
        let upgraded = status(leader)?["pid"] != old_pid;
        (upgraded && la != lb).then_some(())
    });
    // The one that leads now stops (SIGTERM): the other leads at once.
    let (stopping, other) = match leads(&f.a_config) == Some(true) {
        true => (&f.a_config, &f.b_config),
        false => (&f.b_config, &f.a_config),
    };
    let pid = status(stopping).expect("a status")["pid"]
        .as_u64()
        .expect("pid");
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    wait_for("the other member to lead", || leads(other)?.then_some(()));
    drop((a, b, successor));
}
