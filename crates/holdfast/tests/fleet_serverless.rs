//! A serverless instance behind a fleet of two `holdfast serve` processes (`holdfast lab up
//! --serverless --proxies 2`: a real mariadbd paused by the process driver, a real etcd):
//! the instance pauses only when the clients of every member are idle and no member has a
//! session that could not survive it; a client of any member wakes it, and a burst of
//! clients on both members wakes it once; the usage meter loses no second when the
//! leading member is killed, and counts none twice.

mod common;

use common::{holdfast, run, Lab, Serving};
use mysql::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// One member of the lab's fleet.
struct Member {
    config: PathBuf,
    log: PathBuf,
    port: u16,
}

impl Member {
    fn serve(&self) -> Serving {
        Serving(
            holdfast()
                .args(["serve", "--config"])
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&self.log).expect("a log"))
                .spawn()
                .expect("holdfast serve"),
        )
    }

    fn status(&self) -> Option<serde_json::Value> {
        ctl_json(&self.config, &["status", "--json"])
    }

    fn session(&self) -> mysql::Conn {
        let url = format!(
            "mysql://app:app_pass@127.0.0.1:{}/sbtest?prefer_socket=false",
            self.port
        );
        mysql::Conn::new(mysql::Opts::from_url(&url).expect("url")).expect("a session")
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        run(holdfast()
            .args(["ctl", "--config"])
            .arg(&self.config)
            .args(args))
    }
}

fn ctl_json(config: &Path, args: &[&str]) -> Option<serde_json::Value> {
    let out = run(holdfast().args(["ctl", "--config"]).arg(config).args(args));
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// A serverless lab with two members; `edit` changes both members' configs.
struct ServerlessFleet {
    members: [Member; 2],
    _lab: Lab,
}

impl ServerlessFleet {
    fn new(name: &str, edit: impl Fn(String) -> String) -> ServerlessFleet {
        let dir: PathBuf =
            std::env::temp_dir().join(format!("holdfast-slfleet-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        common::lab_up(&dir, &["--serverless", "--proxies", "2"]);
        let lab = Lab(dir.clone());
        let out = run(holdfast()
            .args(["lab", "status", "--json", "--dir"])
            .arg(&dir));
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lab status --json");
        let proxies = st["proxies"].as_array().expect("the members").clone();
        assert_eq!(proxies.len(), 2, "{st}");
        let member = |i: usize| {
            let p = &proxies[i];
            let config = PathBuf::from(p["config"].as_str().expect("a config"));
            let text = std::fs::read_to_string(&config).expect("the member's config");
            std::fs::write(&config, edit(text)).expect("the member's config");
            let port = p["proxy"]
                .as_str()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a client port");
            Member {
                config,
                log: dir.join(format!("member{i}.log")),
                port,
            }
        };
        ServerlessFleet {
            members: [member(0), member(1)],
            _lab: lab,
        }
    }

    fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| std::fs::read_to_string(&m.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    /// Waits for one member to lead; (leader, the other).
    fn leader(&self) -> (&Member, &Member) {
        let [a, b] = &self.members;
        let leads = |m: &Member| m.status().and_then(|s| s["fleet"]["leader"].as_bool());
        let a_leads = wait_for(self, "a leader", || match (leads(a)?, leads(b)?) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        });
        if a_leads {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// Waits until every member says the instance is in `phase`.
    fn phase_everywhere(&self, phase: &str) {
        for m in &self.members {
            wait_for(
                self,
                &format!("the instance {phase} on every member"),
                || (m.status()?["serverless"]["phase"] == phase).then_some(()),
            );
        }
    }
}

fn wait_for<T>(f: &ServerlessFleet, what: &str, check: impl FnMut() -> Option<T>) -> T {
    holdfast_lab::wait_for(what, Duration::from_secs(60), check)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()))
}

fn with_idle_pause(secs: u64) -> impl Fn(String) -> String {
    move |text: String| {
        assert!(text.contains("idle_pause_secs = 60"), "{text}");
        text.replace("idle_pause_secs = 60", &format!("idle_pause_secs = {secs}"))
    }
}

fn instance(m: &Member) -> serde_json::Value {
    m.status().expect("a status")["serverless"].clone()
}

/// Pauses only when every member's clients are idle and no member's session blocks it;
/// a client of the member that does not lead wakes it; a burst on both wakes it once;
/// idle sessions of both members survive a freeze and a stop; `ctl pause` asked of the
/// member that does not lead runs on the leader.
#[test]
fn the_fleet_pauses_its_instance_only_when_every_member_is_idle_and_any_member_wakes_it() {
    let f = ServerlessFleet::new("idle", with_idle_pause(3));
    let _served: Vec<Serving> = f.members.iter().map(Member::serve).collect();
    let (leader, other) = f.leader();
    f.phase_everywhere("running");
    let mut kept: Vec<mysql::Conn> = Vec::new();
    for (m, who) in [(leader, "leader"), (other, "other")] {
        let mut c = m.session();
        c.query_drop(format!("SET @who = '{who}'")).expect("set");
        kept.push(c);
    }
    let mut busy = other.session();
    busy.query_drop("CREATE TABLE sbtest.slf (a INT)")
        .expect("a table");

    // A client of the other member only: no pause for three times the idle limit.
    let until = Instant::now() + Duration::from_secs(9);
    while Instant::now() < until {
        busy.query_drop("SELECT 1").expect("a statement");
        let s = instance(leader);
        assert_eq!(
            s["phase"],
            "running",
            "paused under the other member's client: {s}\n{}",
            f.logs()
        );
        assert_eq!(s["pauses"], 0, "{s}\n{}", f.logs());
        std::thread::sleep(Duration::from_millis(500));
    }

    // A transaction open on the other member keeps it running, and says why.
    busy.query_drop("BEGIN").expect("begin");
    busy.query_drop("INSERT INTO sbtest.slf VALUES (1)")
        .expect("insert");
    let blocked = wait_for(
        &f,
        "the leader to name the other member's transaction",
        || {
            let s = instance(leader);
            let why = s["pause_blocked_by"].as_array()?.clone();
            why.iter()
                .any(|b| {
                    b.as_str().is_some_and(|b| {
                        b.starts_with("member proxy") && b.contains("open transaction")
                    })
                })
                .then_some(why)
        },
    );
    assert_eq!(instance(leader)["phase"], "running", "{blocked:?}");
    busy.query_drop("COMMIT").expect("commit");

    // Idle everywhere: one pause, seen by both members.
    f.phase_everywhere("paused");
    assert_eq!(instance(leader)["pauses"], 1, "{}", f.logs());

    // A burst of new clients on both members: all served, after one resume.
    let ports = [leader.port, other.port];
    let burst: Vec<std::thread::JoinHandle<Result<u64, String>>> = (0..8)
        .map(|i| {
            let port = ports[i % 2];
            std::thread::spawn(move || {
                let url =
                    format!("mysql://app:app_pass@127.0.0.1:{port}/sbtest?prefer_socket=false");
                let mut c =
                    mysql::Conn::new(mysql::Opts::from_url(&url).map_err(|e| e.to_string())?)
                        .map_err(|e| e.to_string())?;
                c.query_first::<u64, _>("SELECT COUNT(*) FROM sbtest.slf")
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "no row".to_string())
            })
        })
        .collect();
    for b in burst {
        let n = b.join().expect("a client thread");
        assert_eq!(n, Ok(1), "{}", f.logs());
    }
    assert_eq!(
        instance(leader)["resumes"],
        1,
        "one wake for the burst\n{}",
        f.logs()
    );

    // The idle sessions of both members go on, with their state.
    for (c, who) in kept.iter_mut().zip(["leader", "other"]) {
        let v: Option<String> = c.query_first("SELECT @who").expect("the session goes on");
        assert_eq!(v.as_deref(), Some(who));
    }

    // An operator's stop asked of the member that does not lead: the leader stops the
    // server; every member's idle sessions move to it when it starts again.
    drop(busy);
    // (A temporary table on a session of the other member could not survive it:
    // refused, and the answer names that member's session.)
    let mut scratch = other.session();
    scratch
        .query_drop("CREATE TEMPORARY TABLE sbtest.scratch (a INT)")
        .expect("a temporary table");
    let out = other.ctl(&["pause", "--tier", "stop"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("member proxy") && said.contains("temporary table"),
        "{said}"
    );
    assert_eq!(instance(leader)["phase"], "running", "{}", f.logs());
    drop(scratch);
    // (Its session closed, the stop goes ahead.)
    wait_for(&f, "the stop to go ahead", || {
        other
            .ctl(&["pause", "--tier", "stop"])
            .status
            .success()
            .then_some(())
    });
    f.phase_everywhere("paused");
    assert_eq!(instance(other)["tier"], "stop", "{}", f.logs());
    for (c, who) in kept.iter_mut().zip(["leader", "other"]) {
        let v: Option<String> = c
            .query_first("SELECT @who")
            .unwrap_or_else(|e| panic!("the {who}'s session after a stop: {e}\n{}", f.logs()));
        assert_eq!(v.as_deref(), Some(who));
    }
    f.phase_everywhere("running");

    // One ledger line per period, the same on both members (the leader's, copied).
    let periods = |m: &Member| -> Vec<(i64, bool)> {
        let lines = ctl_json(&m.config, &["usage", "--json"]).expect("usage");
        lines
            .as_array()
            .expect("lines")
            .iter()
            .map(|l| {
                (
                    l["period_start"].as_i64().unwrap_or(-1),
                    l["settled"] == true,
                )
            })
            .collect()
    };
    let (on_leader, on_other) = (periods(leader), periods(other));
    assert!(!on_leader.is_empty());
    let mut starts: Vec<i64> = on_leader.iter().map(|(s, _)| *s).collect();
    starts.dedup();
    assert_eq!(
        starts.len(),
        on_leader.len(),
        "one line per period: {on_leader:?}"
    );
    assert_eq!(on_leader, on_other, "the same lines on both members");
}

/// The sum of the running and paused seconds the member's ledger has (its live open
/// period included).
fn metered_secs(m: &Member) -> Option<u64> {
    let lines = ctl_json(&m.config, &["usage", "--json"])?;
    Some(
        lines
            .as_array()?
            .iter()
            .map(|l| {
                l["running_secs"].as_u64().unwrap_or(0) + l["paused_secs"].as_u64().unwrap_or(0)
            })
            .sum(),
    )
}

/// The leading member killed (SIGKILL): the other leads after the lease (6 s) and meters
/// on from where the killed one stopped, the seconds between counted once; before, the
/// member that does not lead shows the leader's figures, not a count of its own.
#[test]
fn a_leader_change_loses_no_second_of_usage_and_counts_none_twice() {
    let f = ServerlessFleet::new("usage", |text| {
        assert!(text.contains("lease_ttl_secs = 3"), "{text}");
        text.replace("lease_ttl_secs = 3", "lease_ttl_secs = 6")
    });
    let mut served: Vec<Option<Serving>> = f.members.iter().map(|m| Some(m.serve())).collect();
    let (leader, other) = f.leader();
    // Both say the same figures (one meter, the leader's).
    wait_for(&f, "the leader's usage on both members", || {
        let (a, b) = (metered_secs(leader)?, metered_secs(other)?);
        (a >= 3 && a.abs_diff(b) <= 1).then_some(())
    });
    let before = metered_secs(other).expect("usage");
    let t0 = Instant::now();
    let leader_index = f
        .members
        .iter()
        .position(|m| m.config == leader.config)
        .expect("the leader");
    drop(served[leader_index].take());
    wait_for(&f, "the other member to lead", || {
        other.status()?["fleet"]["leader"].as_bool()?.then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = metered_secs(other).expect("usage");
    let elapsed = t0.elapsed().as_secs_f64();
    let counted = after.saturating_sub(before) as f64;
    assert!(
        (counted - elapsed).abs() <= 2.0,
        "{counted} s metered over {elapsed:.1} s\n{}",
        f.logs()
    );
}

/// The server frozen while the fleet's leader says it runs (what a former leader that
/// lost the lead between its last check and its freeze would leave): the leader thaws
/// it, and a client's statement, waiting meanwhile, is answered.
#[test]
fn a_server_frozen_behind_the_leaders_back_is_thawed() {
    let f = ServerlessFleet::new("frozen", |text| text);
    let _served: Vec<Serving> = f.members.iter().map(Member::serve).collect();
    let (leader, other) = f.leader();
    f.phase_everywhere("running");
    // (A client that would wait forever on a frozen server gives up after 20 s.)
    let url = format!(
        "mysql://app:app_pass@127.0.0.1:{}/sbtest?prefer_socket=false",
        other.port
    );
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&url).expect("url"))
        .read_timeout(Some(Duration::from_secs(20)));
    let mut c = mysql::Conn::new(opts).expect("a session");
    c.query_drop("SELECT 1").expect("a statement");
    let datadir = format!("--datadir={}/node1", f._lab.0.display());
    let stopped = std::process::Command::new("pkill")
        .args(["-STOP", "-f", "--", &datadir])
        .status()
        .expect("pkill");
    assert!(stopped.success(), "the server frozen");
    let t = Instant::now();
    let answer = std::thread::spawn(move || c.query_first::<u64, _>("SELECT 2"));
    let answered = answer.join().expect("the client thread");
    assert_eq!(answered.ok().flatten(), Some(2), "{}", f.logs());
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "answered after {:?}",
        t.elapsed()
    );
    assert_eq!(instance(leader)["phase"], "running", "{}", f.logs());
}
