//! `holdfast ctl upgrade`: the running process starts the binary at its own path and hands
//! it the listening sockets, HA and its idle sessions. Tested as processes on a lab: no
//! connection attempt is refused while it happens, sessions go to the new process with
//! their state (or stay on the old one, which exits once they end, when they cannot), the
//! new one serves with the next generation, and a second upgrade works.

mod common;

use common::{holdfast, lab_up, run, Lab};
use mysql::prelude::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The processes a test started or caused, killed when dropped (a failed run must not
/// leave a holdfast behind).
struct Processes {
    first: Child,
    pids: Vec<u32>,
    /// Every holdfast serving this config goes too (an upgrade's process the test did not
    /// get to note before it failed).
    config: PathBuf,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        let _ = self.first.kill();
        let _ = self.first.wait();
        let _ = std::process::Command::new("pkill")
            .args(["-f", "--"])
            .arg(format!("serve --config {}", self.config.display()))
            .status();
    }
}

fn ctl(config: &Path, args: &[&str]) -> (bool, String, String) {
    let out = run(holdfast().arg("ctl").arg("--config").arg(config).args(args));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(config: &Path) -> serde_json::Value {
    let (ok, out, err) = ctl(config, &["status", "--json"]);
    assert!(ok, "ctl status: {err}");
    serde_json::from_str(&out).expect("a /status body")
}

fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    holdfast_lab::wait_for(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until a process started by an upgrade says it runs HA (in `log`, which every
/// generation writes to).
fn wait_in_charge(log: &Path) {
    wait_for(
        "the new process in charge of HA",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains("upgrade: in charge of HA")
                .then_some(())
        },
    );
}

fn url(port: u16) -> String {
    format!("mysql://app:app_pass@127.0.0.1:{port}/sbtest?prefer_socket=false")
}

/// A session of the lab's app user on `port`.
fn session(port: u16) -> mysql::Conn {
    mysql::Conn::new(mysql::Opts::from_url(&url(port)).expect("url")).expect("a session")
}

/// `holdfast ctl upgrade --json`, which must succeed; the new process is killed with the
/// test's others. Returns its pid.
/// Waits until `n` idle sockets are parked out of the reactor (`parking.rs`).
fn wait_parked(config: &Path, n: f64) {
    wait_for(
        "the idle sessions' sockets parked",
        Duration::from_secs(30),
        || {
            let (ok, out, _) = ctl(config, &["metrics"]);
            let parked = out
                .lines()
                .find_map(|l| l.strip_prefix("holdfast_idle_sockets_parked "))
                .and_then(|v| v.trim().parse::<f64>().ok());
            (ok && parked == Some(n)).then_some(())
        },
    );
}

fn upgrade(config: &Path, procs: &mut Processes, log: &Path) -> u32 {
    let (ok, out, err) = ctl(config, &["upgrade", "--json"]);
    assert!(
        ok,
        "ctl upgrade failed: {err}\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    let report: serde_json::Value = serde_json::from_str(&out).expect("a report");
    let pid = report["pid"].as_u64().expect("pid") as u32;
    procs.pids.push(pid);
    pid
}

/// The session threads (`holdfast-sessions-N`, cut to 15 bytes by the kernel) of process
/// `pid`.
fn session_threads(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("holdfast-sessio"))
        .count()
}

/// Waits until the processes' shared log names at least `count` sessions taken over
/// (lines holding `needle`).
fn wait_handed(log: &Path, needle: &str, count: usize, what: &str) {
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    holdfast_lab::wait_for(what, Duration::from_secs(30), || {
        (read_log().matches(needle).count() >= count).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
}

/// A lab (`replicas` replicas) in a directory of this test's own, and `holdfast serve`
/// on it (from `exe`, or the built binary), serving once this returns. The lab is stopped
/// and deleted after the processes.
struct Served {
    procs: Processes,
    base: u16,
    config: PathBuf,
    log: PathBuf,
    _lab: Lab,
}

impl Served {
    fn start(name: &str, replicas: &str, exe: Option<&dyn Fn(&Path) -> PathBuf>) -> Served {
        Served::start_with(name, replicas, exe, |_| {})
    }

    /// [`Served::start`] with the lab's configuration edited first.
    fn start_with(
        name: &str,
        replicas: &str,
        exe: Option<&dyn Fn(&Path) -> PathBuf>,
        edit: impl FnOnce(&Path),
    ) -> Served {
        Served::start_lab(name, &["--replicas", replicas], exe, edit)
    }

    /// [`Served::start_with`] on a lab made with `lab_args` (`--serverless`).
    fn start_lab(
        name: &str,
        lab_args: &[&str],
        exe: Option<&dyn Fn(&Path) -> PathBuf>,
        edit: impl FnOnce(&Path),
    ) -> Served {
        let dir: PathBuf =
            std::env::temp_dir().join(format!("holdfast-upgrade-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let base = lab_up(&dir, lab_args);
        let lab = Lab(dir.clone());
        let config = dir.join("holdfast.toml");
        edit(&config);
        let log = dir.join("serve.log");
        let mut cmd = match exe {
            Some(place) => {
                let mut cmd = std::process::Command::new(place(&dir));
                cmd.env_remove("HOLDFAST_ADMIN_TOKEN")
                    .env_remove("HOLDFAST_ADMIN")
                    .stdin(Stdio::null());
                cmd
            }
            None => holdfast(),
        };
        let first = cmd
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("holdfast serve");
        let served = Served {
            procs: Processes {
                first,
                pids: Vec::new(),
                config: config.clone(),
            },
            base,
            config,
            log,
            _lab: lab,
        };
        holdfast_lab::wait_for("holdfast to serve", Duration::from_secs(30), || {
            mysql::Conn::new(mysql::Opts::from_url(&url(base)).ok()?).ok()
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}",
                std::fs::read_to_string(&served.log).unwrap_or_default()
            )
        });
        served
    }
}

#[test]
fn an_upgrade_hands_the_listeners_over_without_refusing_a_connection() {
    let served = Served::start("listeners", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let (main, split) = (base, base + 2);
    let before = status(&config);
    let old_pid = before["pid"].as_u64().expect("pid") as u32;
    assert_eq!(before["generation"], 1);

    // A session with state on each listener, open across the upgrade.
    let mut sessions = Vec::new();
    for port in [main, split] {
        let mut c =
            mysql::Conn::new(mysql::Opts::from_url(&url(port)).expect("url")).expect("a session");
        c.query_drop("SET @kept = 'before', time_zone = '+03:00'")
            .expect("set");
        let id: u32 = c
            .query_first("SELECT CONNECTION_ID()")
            .expect("id")
            .expect("a row");
        sessions.push((c, id));
    }

    // New connections all along, each one used: none may be refused.
    let stop = Arc::new(AtomicBool::new(false));
    let (made, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let connector = {
        let (stop, made, failed, errors) =
            (stop.clone(), made.clone(), failed.clone(), errors.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for port in [main, split] {
                    let result = mysql::Conn::new(mysql::Opts::from_url(&url(port)).expect("url"))
                        .and_then(|mut c| c.query_first::<u32, _>("SELECT 1"));
                    match result {
                        Ok(Some(1)) => made.fetch_add(1, Ordering::Relaxed),
                        other => {
                            if let Ok(mut e) = errors.lock() {
                                e.push(format!("{other:?}"));
                            }
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }
        })
    };
    wait_for(
        "connections before the upgrade",
        Duration::from_secs(30),
        || (made.load(Ordering::Relaxed) >= 20).then_some(()),
    );

    let open = status(&config);
    assert!(
        open["counters"]["sessions_open"].as_u64() >= Some(2),
        "{open}\n{}",
        read_log()
    );
    let (ok, out, err) = ctl(&config, &["upgrade"]);
    assert!(ok, "ctl upgrade failed: {err}\n{}", read_log());
    assert!(out.starts_with("upgraded: process "), "{out}");
    let after = status(&config);
    let new_pid = after["pid"].as_u64().expect("pid") as u32;
    procs.pids.push(new_pid);
    assert_ne!(new_pid, old_pid, "{after}");
    assert_eq!(after["generation"], 2, "{after}");
    // Connections keep coming, now to the new process.
    let at_upgrade = made.load(Ordering::Relaxed);
    wait_for(
        "connections after the upgrade",
        Duration::from_secs(30),
        || (made.load(Ordering::Relaxed) >= at_upgrade + 20).then_some(()),
    );

    // The sessions open before go on in the new process, state and all, each on its
    // own connections (the split one's replica connection too: the same threads).
    wait_for(
        "both sessions in the new process",
        Duration::from_secs(30),
        || {
            (read_log()
                .matches("session handed over from the previous process")
                .count()
                >= 2)
                .then_some(())
        },
    );
    for (c, id) in &mut sessions {
        let row: Option<(String, String, u32)> = c
            .query_first("SELECT @kept, @@time_zone, CONNECTION_ID()")
            .expect("the session goes on");
        assert_eq!(row, Some(("before".into(), "+03:00".into(), *id)));
    }
    // The split session's connection to the replica went with it.
    assert!(read_log().contains("replicas=1"), "{}", read_log());
    // The old process holds nothing: it exits, and they work on.
    let exit = wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    assert!(exit.success(), "{exit}\n{}", read_log());
    for (c, id) in &mut sessions {
        let row: Option<(String, u32)> = c
            .query_first("SELECT @kept, CONNECTION_ID()")
            .expect("the session handed over outlives the old process");
        assert_eq!(row, Some(("before".into(), *id)));
    }

    // A second upgrade, from the process the first started.
    let (ok, out, err) = ctl(&config, &["upgrade", "--json"]);
    assert!(ok, "the second upgrade failed: {err}\n{}", read_log());
    let report: serde_json::Value = serde_json::from_str(&out).expect("a report");
    let third = report["pid"].as_u64().expect("pid") as u32;
    procs.pids.push(third);
    assert_eq!(report["generation"], 3, "{report}");
    let at_second = made.load(Ordering::Relaxed);
    wait_for(
        "connections after the second upgrade",
        Duration::from_secs(30),
        || (made.load(Ordering::Relaxed) >= at_second + 20).then_some(()),
    );
    stop.store(true, Ordering::Relaxed);
    connector.join().expect("the connecting thread");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "connections failed during the upgrades: {:?}\n{}",
        errors.lock().map(|e| e.clone()).unwrap_or_default(),
        read_log()
    );
    let last = status(&config);
    assert_eq!(last["pid"].as_u64(), Some(u64::from(third)), "{last}");
    // HA is the newest process's: its detector runs, the others' are gone.
    wait_in_charge(&log);
    // (The lab is stopped and deleted with `_lab`, after the processes.)
}

/// The binary at the process's path is whatever is there when the upgrade runs: a new
/// process that cannot take over (here it exits at once) leaves the old one serving, and
/// the command says why; two upgrades at once get one clear refusal; once a working binary
/// is back at the path, the upgrade goes through.
#[test]
fn a_failed_or_concurrent_upgrade_leaves_the_running_process_serving() {
    // Served from a copy, as after a package install: the file can be replaced.
    let copy = |dir: &Path| {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("a bin directory");
        let exe = bin.join("holdfast");
        std::fs::copy(env!("CARGO_BIN_EXE_holdfast"), &exe).expect("a copy of holdfast");
        exe
    };
    let served = Served::start("fail", "0", Some(&copy));
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let bin = config.with_file_name("bin");
    let exe = bin.join("holdfast");
    let replace = |with: &[u8], mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let next = bin.join("holdfast.next");
        std::fs::write(&next, with).expect("a new file");
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode)).expect("chmod");
        std::fs::rename(&next, &exe).expect("replacing the binary");
    };
    let mut session = session(base);
    session.query_drop("SET @kept = 7").expect("set");

    // A binary that exits at once.
    let real = std::fs::read(env!("CARGO_BIN_EXE_holdfast")).expect("the binary");
    replace(b"#!/bin/sh\nexit 3\n", 0o755);
    let (ok, _, err) = ctl(&config, &["upgrade"]);
    assert!(!ok, "an upgrade to a binary that exits succeeded");
    assert!(
        err.contains("the new process exited (exit status: 3) before it took over"),
        "{err}"
    );
    let s = status(&config);
    assert_eq!(s["generation"], 1, "{s}");
    assert!(s.get("handed_over_to").is_none(), "{s}");
    let kept: Option<u32> = session.query_first("SELECT @kept").expect("still served");
    assert_eq!(kept, Some(7));
    mysql::Conn::new(mysql::Opts::from_url(&url(base)).expect("url"))
        .expect("new connections still served");

    // The real binary back: two upgrades at once, one refused.
    replace(&real, 0o755);
    let racing: Vec<_> = (0..2)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || ctl(&config, &["upgrade", "--json"]))
        })
        .collect();
    let outcomes: Vec<_> = racing
        .into_iter()
        .map(|t| t.join().expect("a ctl thread"))
        .collect();
    // Either they overlapped (one is refused), or the second reached the process the
    // first started and upgraded that one: never two upgrades of one process.
    let mut generations = Vec::new();
    for (ok, out, err) in &outcomes {
        if *ok {
            let report: serde_json::Value = serde_json::from_str(out).expect("a report");
            procs.pids.push(report["pid"].as_u64().expect("pid") as u32);
            generations.push(report["generation"].as_u64().expect("generation"));
        } else {
            assert!(
                err.contains("an upgrade is already running")
                    || err.contains("has already handed over to process"),
                "{err}"
            );
        }
    }
    generations.sort_unstable();
    assert!(
        generations == [2] || generations == [2, 3],
        "{outcomes:?}\n{}",
        read_log()
    );
    let kept: Option<u32> = session.query_first("SELECT @kept").expect("still served");
    assert_eq!(kept, Some(7));
}

/// An upgrade asked for as soon as a switchover is under way (or, on a quick machine,
/// just done): HA is handed over between operations, never in the middle of one (the
/// switchover finishes first); both succeed, and the new process, in charge of HA, serves
/// from the new primary and shows the switchover in its counters. Also: a process with no client left exits only after it has
/// answered the upgrade's own request.
#[test]
fn an_upgrade_during_a_switchover_waits_for_it() {
    let served = Served::start("ha", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("a primary and a replica", Duration::from_secs(30), || {
        let s = status(&config);
        (s["topology"]["primary"] == "node1").then_some(())
    });
    let switchover = {
        let config = config.clone();
        std::thread::spawn(move || ctl(&config, &["switchover", "--to", "node2"]))
    };
    // Asked for while the switchover runs.
    wait_for("the switchover to start", Duration::from_secs(30), || {
        let s = status(&config);
        (!s["ha"]["in_progress"].is_null() || s["topology"]["primary"] == "node2").then_some(())
    });
    upgrade(&config, &mut procs, &log);
    let (ok, _, err) = switchover.join().expect("the switchover thread");
    assert!(ok, "the switchover failed: {err}\n{}", read_log());
    let s = status(&config);
    assert_eq!(s["generation"], 2, "{s}");
    // (The new process's monitor has its first round to make.)
    wait_for(
        "node2 primary in the new process",
        Duration::from_secs(30),
        || (status(&config)["topology"]["primary"] == "node2").then_some(()),
    );
    wait_in_charge(&log);
    // HA's state goes on: the switchover is counted, and is the last operation.
    let s = status(&config);
    assert_eq!(s["ha"]["counters"]["switchovers"], 1, "{s}");
    assert_eq!(s["ha"]["last"]["operation"], "switchover", "{s}");
    // Writes reach the new primary through the new process.
    let mut c = session(base);
    let server: Option<u32> = c.query_first("SELECT @@server_id").expect("a read");
    let node2: Option<u32> = mysql::Conn::new(
        mysql::Opts::from_url(&format!(
            "mysql://app:app_pass@127.0.0.1:{}/sbtest?prefer_socket=false",
            base + 11
        ))
        .expect("url"),
    )
    .expect("node2 directly")
    .query_first("SELECT @@server_id")
    .expect("a read");
    assert_eq!(server, node2);
}

/// What a test session holds and reads back after the upgrade.
const STATE: &str = "SELECT @kept, @@time_zone, LAST_INSERT_ID(), @@sql_mode";

/// Sessions idle at the upgrade go to the new process whole: the client's connection, the
/// backend connection (the same server thread: `CONNECTION_ID()` does not change, a
/// temporary table stays), their state and their prepared statements (the client's
/// statement ids). TLS sessions too, from the client and to the nodes (the lab's default):
/// the new process continues them with the keys the old one took out of rustls. A session
/// in a transaction goes once it commits. The old process exits once it holds no session,
/// and the sessions work on; a second upgrade hands them on again.
fn idle_sessions_are_handed_over(plain_backend: bool) {
    let name = if plain_backend { "plain" } else { "tls" };
    let served = Served::start_with(name, "1", None, |config| {
        if !plain_backend {
            // Sessions on threads of their own (`[proxy] worker_threads` above one): each
            // handed-over session joins one in the new process.
            let text = std::fs::read_to_string(config).expect("the lab's config");
            assert!(text.contains("worker_threads = 0"), "{text}");
            let edited = text.replace("worker_threads = 0", "worker_threads = 3");
            std::fs::write(config, edited).expect("the edited config");
        }
        if plain_backend {
            let text = std::fs::read_to_string(config).expect("the lab's config");
            let start = text.find("[backend_tls]").expect("a [backend_tls] section");
            let end = text[start + 1..]
                .find("\n[")
                .map_or(text.len(), |i| start + 1 + i + 1);
            let edited = format!("{}{}", &text[..start], &text[end..]);
            std::fs::write(config, edited).expect("the edited config");
        }
    });
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |what: &str, timeout: Duration, f: &mut dyn FnMut() -> Option<()>| {
        holdfast_lab::wait_for(what, timeout, f).unwrap_or_else(|e| panic!("{e}\n{}", read_log()))
    };
    let open = || session(base);
    let open_tls = || {
        let opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(base)
            .user(Some("app"))
            .pass(Some("app_pass"))
            .db_name(Some("sbtest"))
            .prefer_socket(false)
            .ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(dir.join("tls/ca.pem"))),
            ));
        mysql::Conn::new(opts).expect("a TLS session")
    };
    let thread = |c: &mut mysql::Conn| -> u32 {
        c.query_first("SELECT CONNECTION_ID()")
            .expect("id")
            .expect("a row")
    };
    let handed = || {
        read_log()
            .matches("session handed over from the previous process")
            .count()
    };
    // Logins of the application's user on the primary (node1): `userstat` counts them.
    let mut root = mysql::Conn::new(
        mysql::OptsBuilder::new()
            .socket(Some(dir.join("node1.sock").display().to_string()))
            .user(Some("root")),
    )
    .expect("root on the primary's socket");
    root.query_drop("SET GLOBAL userstat = 1")
        .expect("userstat on");
    let mut app_logins = || -> u64 {
        root.query_first(
            "SELECT TOTAL_CONNECTIONS FROM information_schema.USER_STATISTICS \
             WHERE USER = 'app'",
        )
        .expect("the user's statistics")
        .unwrap_or(0)
    };

    // A session with state and a prepared statement, over TLS from the client.
    let mut movable = open_tls();
    movable
        .query_drop("SET @kept = 'before', time_zone = '+03:00', sql_mode = 'ANSI_QUOTES'")
        .expect("set");
    movable
        .query_drop(
            "CREATE TABLE sbtest.ho (id INT AUTO_INCREMENT PRIMARY KEY, c VARCHAR(20)); \
             INSERT INTO sbtest.ho (c) VALUES ('first')",
        )
        .expect("a table");
    movable
        .query_drop("INSERT INTO sbtest.ho (c) VALUES ('handover')")
        .expect("insert");
    let last_id: u64 = movable
        .query_first("SELECT LAST_INSERT_ID()")
        .expect("id")
        .expect("a row");
    let stmt = movable
        .prep("SELECT c FROM sbtest.ho WHERE id = ?")
        .expect("prepare");
    let movable_thread = thread(&mut movable);
    // One with a temporary table, plain TCP from the client.
    let mut pinned = open();
    pinned
        .query_drop("CREATE TEMPORARY TABLE tt (a INT); INSERT INTO tt VALUES (7)")
        .expect("a temporary table");
    let pinned_thread = thread(&mut pinned);
    // One in a transaction.
    let mut in_txn = open();
    in_txn.query_drop("SET @mine = 'txn'").expect("set");
    let txn_thread = thread(&mut in_txn);
    in_txn.query_drop("BEGIN").expect("begin");
    in_txn
        .query_drop("UPDATE sbtest.ho SET c = 'during' WHERE id = 1")
        .expect("update");

    // Idle for a second, the sessions park their sockets out of the reactor
    // (`parking.rs`), TLS ones with their record layers' keys only; the hand-over takes
    // them from there.
    wait_parked(&config, 6.0);
    let logins_before = app_logins();
    // (The three sessions above logged in through holdfast: the count works.)
    assert!(logins_before >= 3, "{logins_before} logins of 'app'");
    let mut pids = vec![status(&config)["pid"].as_u64().expect("pid") as u32];
    let threads_wanted = if plain_backend { 0 } else { 3 };
    assert_eq!(session_threads(pids[0]), threads_wanted);
    for round in 1..=2usize {
        let new_pid = upgrade(&config, &mut procs, &log);
        pids.push(new_pid);
        assert_eq!(session_threads(new_pid), threads_wanted);

        // The idle sessions go over by themselves.
        wait_for(
            "the idle sessions in the new process",
            Duration::from_secs(30),
            &mut || (handed() >= 3 * round - 1).then_some(()),
        );
        let row: Option<(String, String, u64, String)> =
            movable.query_first(STATE).expect("the session goes on");
        assert_eq!(
            row,
            Some((
                "before".into(),
                "+03:00".into(),
                last_id,
                "ANSI_QUOTES".into()
            )),
            "{}",
            read_log()
        );
        let c: Option<String> = movable
            .exec_first(&stmt, (last_id,))
            .expect("the statement prepared before the upgrade");
        assert_eq!(c.as_deref(), Some("handover"));
        assert_eq!(
            thread(&mut movable),
            movable_thread,
            "the same server thread"
        );
        let a: Option<i32> = pinned.query_first("SELECT a FROM tt").expect("its table");
        assert_eq!(a, Some(7));
        assert_eq!(thread(&mut pinned), pinned_thread);

        if round == 1 {
            // The transaction finishes on the old process, then its session goes over.
            in_txn.query_drop("COMMIT").expect("commit");
            wait_for(
                "the session that was in a transaction in the new process",
                Duration::from_secs(30),
                &mut || (handed() >= 3).then_some(()),
            );
        }
        let mine: Option<String> = in_txn.query_first("SELECT @mine").expect("goes on");
        assert_eq!(mine.as_deref(), Some("txn"));
        assert_eq!(thread(&mut in_txn), txn_thread);

        // The old process holds nothing: it exits, and the sessions work on.
        let old = pids[round - 1];
        holdfast_lab::wait_for("the old process to exit", Duration::from_secs(30), || {
            let alive = std::path::Path::new(&format!("/proc/{old}")).exists()
                && !std::fs::read_to_string(format!("/proc/{old}/stat"))
                    .unwrap_or_default()
                    .contains(") Z ");
            (!alive).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
        if round == 1 {
            let exit = procs.first.wait().expect("the first process's status");
            assert!(exit.success(), "{exit}\n{}", read_log());
        }
        let row: Option<(String, String, u64, String)> = movable
            .query_first(STATE)
            .expect("goes on after the old process exited");
        assert_eq!(
            row,
            Some((
                "before".into(),
                "+03:00".into(),
                last_id,
                "ANSI_QUOTES".into()
            ))
        );
    }
    let s = status(&config);
    assert_eq!(s["pid"].as_u64(), pids.last().map(|&p| u64::from(p)), "{s}");
    assert_eq!(s["generation"], 3, "{s}");
    // Nothing logged in again for them: the primary saw no new login of the user.
    assert_eq!(
        app_logins(),
        logins_before,
        "logins of 'app' on the primary during two upgrades\n{}",
        read_log()
    );
}

#[test]
fn idle_sessions_are_handed_over_with_their_backend_connection() {
    idle_sessions_are_handed_over(true);
}

#[test]
fn idle_sessions_are_handed_over_with_their_tls_sessions() {
    idle_sessions_are_handed_over(false);
}

/// An idle pooled connection of another ecosystem's driver (PyMySQL, over TLS to
/// holdfast; the lab's nodes behind TLS too) keeps its session across two upgrades in a
/// row: state, a temporary table, an SQL prepared statement, and its connection id (the
/// same server thread).
#[test]
fn an_idle_pymysql_connection_keeps_its_session_across_two_upgrades() {
    use std::io::{BufRead, BufReader, Write};
    let served = Served::start("pymysql", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/upgrade_idle.py");
    let mut py = std::process::Command::new("python3")
        .arg(script)
        .args(["127.0.0.1", &base.to_string(), "app", "app_pass", "sbtest"])
        .arg(dir.join("tls/ca.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = py.stdin.take().expect("stdin");
    let mut lines = BufReader::new(py.stdout.take().expect("stdout")).lines();
    let mut state = |ask: bool| -> String {
        if ask {
            writeln!(stdin, "state").expect("to the script");
            stdin.flush().expect("flush");
        }
        lines
            .next()
            .expect("a line from the script")
            .expect("utf-8")
    };
    let before = state(false);
    if before.starts_with("SKIP") {
        let _ = py.kill();
        panic!("{before}: the test needs PyMySQL (python3-pymysql)");
    }
    for round in 1..=2usize {
        let (ok, out, err) = ctl(&config, &["upgrade", "--json"]);
        assert!(ok, "ctl upgrade failed: {err}\n{}", read_log());
        let report: serde_json::Value = serde_json::from_str(&out).expect("a report");
        procs.pids.push(report["pid"].as_u64().expect("pid") as u32);
        wait_for(
            "the idle session in the new process",
            Duration::from_secs(30),
            || {
                (read_log()
                    .matches("session handed over from the previous process")
                    .count()
                    >= round)
                    .then_some(())
            },
        );
        let after = state(true);
        assert_eq!(after, before, "round {round}\n{}", read_log());
    }
    assert!(
        read_log().contains("client_tls=true backend_tls=true backend_kept=true"),
        "{}",
        read_log()
    );
    let _ = writeln!(stdin, "quit");
    let _ = py.wait();
}

/// A split session is handed over with its replica connections and what it knows of
/// them: the warnings of a read that ran on a replica and `FOUND_ROWS()` there read the
/// same after the upgrade, from the same replica thread.
#[test]
fn a_split_session_keeps_what_its_replica_reads_left() {
    let served = Served::start("split", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut primary = session(base);
    primary
        .query_drop(
            "CREATE TABLE sbtest.sp (id INT PRIMARY KEY, v VARCHAR(10)); \
             INSERT INTO sbtest.sp VALUES (1, '1x'), (2, '2y'), (3, '3')",
        )
        .expect("a table");
    let mut c =
        mysql::Conn::new(mysql::Opts::from_url(&url(base + 2)).expect("url")).expect("a session");
    // The replica has the table once a read sees it (the split waits for the session's
    // own writes only).
    wait_for("the table on the replica", Duration::from_secs(30), || {
        c.query_first::<u32, _>("SELECT COUNT(*) FROM sbtest.sp")
            .ok()
            .flatten()
            .filter(|&n| n == 3)
    });
    // A read with warnings, and one that sets FOUND_ROWS(), on the replica.
    let rows: Vec<Option<i64>> = c
        .query("SELECT SQL_CALC_FOUND_ROWS CAST(v AS SIGNED) FROM sbtest.sp ORDER BY id LIMIT 2")
        .expect("a read");
    assert_eq!(rows, vec![Some(1), Some(2)]);
    let before: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").expect("warnings");
    assert_eq!(before.len(), 2, "{before:?}");
    let rows: Vec<Option<i64>> = c
        .query("SELECT SQL_CALC_FOUND_ROWS CAST(v AS SIGNED) FROM sbtest.sp ORDER BY id LIMIT 2")
        .expect("a read");
    assert_eq!(rows.len(), 2);
    // Idle, both sessions park their sockets, the split one its replica connection too
    // (`parking.rs`): the hand-over takes them from there.
    wait_parked(&config, 5.0);

    upgrade(&config, &mut procs, &log);
    wait_for(
        "the split session in the new process",
        Duration::from_secs(30),
        || read_log().contains("replicas=1").then_some(()),
    );
    let after: Vec<(String, u32, String)> = c.query("SHOW WARNINGS").expect("warnings");
    assert_eq!(after, before, "{}", read_log());
    let found: Option<u64> = c.query_first("SELECT FOUND_ROWS()").expect("found rows");
    assert_eq!(found, Some(3), "{}", read_log());
    let exit = wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    assert!(exit.success(), "{exit}\n{}", read_log());
    let n: Option<u32> = c
        .query_first("SELECT COUNT(*) FROM sbtest.sp")
        .expect("reads go on");
    assert_eq!(n, Some(3));
}

/// A hand-over cut short: the new process is killed (SIGKILL) after it took one session
/// and before another (in a transaction) could go. The session it took is lost with it;
/// the old process serves again: it keeps the other session (which commits and goes on),
/// accepts new connections and admin requests, and a second upgrade then hands the kept
/// session over.
#[test]
fn a_hand_over_cut_short_leaves_the_old_process_serving_what_it_holds() {
    let served = Served::start("cut", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let open = || session(base);
    let old_pid = status(&config)["pid"].as_u64().expect("pid") as u32;
    let mut idle = open();
    idle.query_drop("SET @v = 'idle'").expect("set");
    let mut in_txn = open();
    in_txn
        .query_drop("CREATE TABLE sbtest.cut (id INT PRIMARY KEY)")
        .expect("a table");
    in_txn.query_drop("SET @v = 'txn'").expect("set");
    let txn_thread: Option<u32> = in_txn.query_first("SELECT CONNECTION_ID()").expect("id");
    in_txn.query_drop("BEGIN").expect("begin");
    in_txn
        .query_drop("INSERT INTO sbtest.cut VALUES (1)")
        .expect("insert");

    let new_pid = upgrade(&config, &mut procs, &log);
    wait_for(
        "the idle session in the new process",
        Duration::from_secs(30),
        || {
            read_log()
                .contains("session handed over from the previous process")
                .then_some(())
        },
    );
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &new_pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_for(
        "the old process to serve again",
        Duration::from_secs(30),
        || {
            read_log()
                .contains("the new process exited; this one serves again")
                .then_some(())
        },
    );

    // The session the killed process took went with it.
    assert!(
        idle.query_first::<String, _>("SELECT @v").is_err(),
        "a session handed to the killed process answered"
    );
    // The one the old process kept finishes its transaction there and goes on.
    in_txn
        .query_drop("COMMIT")
        .expect("commit on the old process");
    let row: Option<(String, u32)> = in_txn
        .query_first("SELECT @v, CONNECTION_ID()")
        .expect("goes on");
    assert_eq!(row, Some(("txn".into(), txn_thread.expect("a thread"))));
    // New connections and the admin API are the old process's again.
    let mut fresh = open();
    let n: Option<u32> = fresh
        .query_first("SELECT COUNT(*) FROM sbtest.cut")
        .expect("a new connection");
    assert_eq!(n, Some(1));
    let s = status(&config);
    assert_eq!(s["pid"].as_u64(), Some(u64::from(old_pid)), "{s}");
    assert!(
        procs.first.try_wait().expect("try_wait").is_none(),
        "{}",
        read_log()
    );

    // A second upgrade goes through and hands the kept session over.
    upgrade(&config, &mut procs, &log);
    wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    let row: Option<(String, u32)> = in_txn
        .query_first("SELECT @v, CONNECTION_ID()")
        .expect("goes on in the newest process");
    assert_eq!(row, Some(("txn".into(), txn_thread.expect("a thread"))));
    let n: Option<u32> = fresh
        .query_first("SELECT COUNT(*) FROM sbtest.cut")
        .expect("so does the fresh one");
    assert_eq!(n, Some(1));
}

/// A session that stays in a transaction past the drain window (`[proxy] cooldown_ms`)
/// is closed when the old process exits, and the log counts it; a session idle at the
/// upgrade went over and goes on.
#[test]
fn a_transaction_left_open_past_the_drain_window_is_closed_and_counted() {
    let served = Served::start_with("cooldown", "1", None, |config| {
        let text = std::fs::read_to_string(config).expect("the lab's config");
        let edited = text.replace("cooldown_ms = 60000", "cooldown_ms = 1500");
        assert_ne!(edited, text, "the lab's config names cooldown_ms = 60000");
        std::fs::write(config, edited).expect("the edited config");
    });
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let open = || session(base);
    let mut idle = open();
    idle.query_drop("SET @v = 'idle'").expect("set");
    let mut stuck = open();
    stuck
        .query_drop("CREATE TABLE sbtest.stuck (id INT PRIMARY KEY)")
        .expect("a table");
    stuck.query_drop("BEGIN").expect("begin");
    stuck
        .query_drop("INSERT INTO sbtest.stuck VALUES (1)")
        .expect("insert");
    upgrade(&config, &mut procs, &log);
    let exit = wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    assert!(exit.success(), "{exit}\n{}", read_log());
    assert!(
        read_log().contains(
            "upgrade: the drain window passed; closing the sessions left and exiting sessions=1"
        ),
        "{}",
        read_log()
    );
    assert!(
        stuck.query_drop("COMMIT").is_err(),
        "a session closed with the old process answered"
    );
    // Its transaction was not committed.
    let n: Option<u32> = idle
        .query_first("SELECT COUNT(*) FROM sbtest.stuck")
        .expect("the idle session went over");
    assert_eq!(n, Some(0));
    let v: Option<String> = idle.query_first("SELECT @v").expect("its state");
    assert_eq!(v.as_deref(), Some("idle"));
}

/// With `[serverless]` the instance's lifecycle goes with HA: the new process pauses,
/// resumes, scales and meters it from where the old one left it. An upgrade while it is
/// paused, with a pool of idle connections open: the connections go over (the same server
/// threads), nothing wakes the instance, the pause count goes on, the first statement
/// wakes it, and the new process pauses it again once idle.
#[test]
fn a_paused_serverless_instance_and_its_pool_are_handed_over() {
    let served = Served::start_lab("serverless", &["--serverless"], None, |config| {
        let text = std::fs::read_to_string(config).expect("the lab's config");
        let text = text
            .replace("idle_pause_secs = 60", "idle_pause_secs = 2")
            .replace("stop_after_secs = 300", "stop_after_secs = 0");
        std::fs::write(config, text).expect("the edited config");
    });
    let serving = std::time::Instant::now();
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let pid_file = served._lab.0.join("node1.pid");
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let instance = |key: &str| status(&config)["serverless"][key].clone();
    let frozen = || {
        let server = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .expect("node1's pid");
        holdfast_lab::procs::is_stopped(server)
    };
    let wait_paused = |pauses: u64| {
        holdfast_lab::wait_for("the instance paused", Duration::from_secs(60), || {
            (instance("phase") == "paused" && instance("pauses").as_u64() >= Some(pauses))
                .then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    };
    let id_and_state = |c: &mut mysql::Conn| -> (u32, String) {
        c.query_first("SELECT CONNECTION_ID(), @kept")
            .expect("the session goes on")
            .expect("a row")
    };

    // A pool of two idle connections with state.
    let mut pool: Vec<mysql::Conn> = (0..2).map(|_| session(base)).collect();
    let mut before = Vec::new();
    for (i, c) in pool.iter_mut().enumerate() {
        c.query_drop(format!("SET @kept = 'conn{i}'")).expect("set");
        before.push(id_and_state(c));
    }
    wait_paused(1);
    let pauses = instance("pauses").as_u64().expect("pauses");
    let resumes = instance("resumes").as_u64().expect("resumes");
    assert!(frozen(), "the paused server is SIGSTOPped");

    upgrade(&config, &mut procs, &log);
    holdfast_lab::wait_for(
        "the pool in the new process",
        Duration::from_secs(30),
        || {
            (read_log()
                .matches("session handed over from the previous process")
                .count()
                >= 2)
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    // The new process answers now (its lifecycle asks the driver first: the phase shows
    // once it has): still paused, nothing woke it, the counts go on.
    assert_eq!(status(&config)["generation"], 2);
    holdfast_lab::wait_for("the new process's phase", Duration::from_secs(10), || {
        (instance("phase") == "paused").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", instance("phase"), read_log()));
    // The old process, its sessions handed over, exits without thawing the server: the
    // instance is the new process's, paused. (It used to thaw it on the way out: the new
    // process then said "paused" of a running server, or, when it asked the driver after
    // the thaw, paused it a second time.)
    let exit = wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    assert!(exit.success(), "{exit}\n{}", read_log());
    assert!(
        frozen(),
        "the old process thawed the server on its way out\n{}",
        read_log()
    );
    assert_eq!(instance("phase"), "paused", "{}", read_log());
    let counts = (instance("pauses").as_u64(), instance("resumes").as_u64());
    assert_eq!(counts, (Some(pauses), Some(resumes)), "{}", read_log());

    // The first statement wakes it; each connection is the one it was.
    for (c, was) in pool.iter_mut().zip(&before) {
        assert_eq!(&id_and_state(c), was, "{}", read_log());
    }
    assert_eq!(instance("resumes").as_u64(), Some(resumes + 1));

    // An upgrade while it runs, under a client's statements: nothing pauses or wakes it.
    let busy = pool.pop().expect("a connection");
    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut busy = busy;
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let kept: Option<String> = busy.query_first("SELECT @kept")?;
                assert_eq!(kept.as_deref(), Some("conn1"));
                done += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok::<u64, mysql::Error>(done)
        })
    };
    upgrade(&config, &mut procs, &log);
    holdfast_lab::wait_for(
        "the third process to answer",
        Duration::from_secs(30),
        || (status(&config)["generation"] == 3).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let done = client
        .join()
        .expect("the client thread")
        .unwrap_or_else(|e| panic!("a statement failed during the upgrade: {e}\n{}", read_log()));
    assert!(done > 0);
    assert_eq!(instance("phase"), "running", "{}", read_log());
    assert_eq!(instance("pauses").as_u64(), Some(pauses));
    assert_eq!(instance("resumes").as_u64(), Some(resumes + 1));
    // Idle again: the newest process pauses it (it runs the lifecycle now).
    wait_paused(pauses + 1);
    assert_eq!(&id_and_state(&mut pool[0]), &before[0]);

    // Metered once, across three processes: the open period's seconds are the time
    // served (the meter started a little before `serving`; a hand-over may cost one).
    let (ok, out, err) = ctl(&config, &["usage", "--json"]);
    assert!(ok, "{err}");
    let lines: serde_json::Value = serde_json::from_str(&out).expect("usage lines");
    let metered: u64 = lines
        .as_array()
        .expect("a list")
        .iter()
        .map(|l| l["running_secs"].as_u64().unwrap_or(0) + l["paused_secs"].as_u64().unwrap_or(0))
        .sum();
    let served_secs = serving.elapsed().as_secs();
    assert!(
        metered + 3 >= served_secs && metered <= served_secs + 5,
        "{metered} s metered in {served_secs} s served: {lines}"
    );
}

/// With `[serverless]`, while the old process still serves a session in a transaction
/// (the new one does not see it), the new process does not pause the instance under it,
/// however long it has been idle: the transaction commits; once the old process is gone,
/// the instance pauses.
#[test]
fn the_instance_is_not_paused_under_a_transaction_left_in_the_old_process() {
    let served = Served::start_lab("serverless-txn", &["--serverless"], None, |config| {
        let text = std::fs::read_to_string(config).expect("the lab's config");
        let text = text
            .replace("idle_pause_secs = 60", "idle_pause_secs = 1")
            .replace("stop_after_secs = 300", "stop_after_secs = 0")
            .replace("flush_secs = 10", "flush_secs = 1");
        assert!(text.contains("flush_secs = 1\n"), "{text}");
        std::fs::write(config, text).expect("the edited config");
    });
    // Seconds metered so far, as the ledger holds them (every period's line: the test may
    // cross into the next period).
    let ledger = served._lab.0.join("usage.db");
    let metered = || -> u32 {
        holdfast_serverless::ledger::Ledger::open(&ledger)
            .and_then(|l| l.lines(Some("lab"), None))
            .expect("the ledger")
            .iter()
            .map(|l| l.running_secs + l.paused_secs)
            .sum()
    };
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let instance = |key: &str| status(&config)["serverless"][key].clone();
    let mut txn = session(base);
    txn.query_drop("CREATE TABLE sbtest.left_txn (id INT PRIMARY KEY)")
        .expect("a table");
    txn.query_drop("BEGIN").expect("begin");
    txn.query_drop("INSERT INTO sbtest.left_txn VALUES (1)")
        .expect("insert");
    let pauses = instance("pauses").as_u64().expect("pauses");

    upgrade(&config, &mut procs, &log);
    // The new process would pause the idle instance now, but for the old one's session
    // (before: it paused it).
    holdfast_lab::wait_for(
        "the new process to pause or hold the pause back",
        Duration::from_secs(30),
        || {
            (read_log().contains("the previous process still serves sessions")
                || instance("phase") != "running")
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    assert_eq!(instance("phase"), "running", "{}", read_log());
    assert_eq!(instance("pauses").as_u64(), Some(pauses));
    // The new process meters now, and writes the open period every second.
    let written_by_the_new_one = metered() + 2;
    wait_for(
        "the new process to write the period",
        Duration::from_secs(30),
        || (metered() >= written_by_the_new_one).then_some(()),
    );
    let before_the_old_one_exits = metered();
    txn.query_drop("COMMIT")
        .unwrap_or_else(|e| panic!("commit: {e}\n{}", read_log()));
    let n: Option<u32> = txn
        .query_first("SELECT COUNT(*) FROM sbtest.left_txn")
        .expect("a read");
    assert_eq!(n, Some(1));
    // The session goes over; the old process exits; idle, the instance pauses.
    let exit = wait_for("the old process to exit", Duration::from_secs(30), || {
        procs.first.try_wait().expect("try_wait")
    });
    assert!(exit.success(), "{exit}\n{}", read_log());
    // The old process did not write its period again on the way out (it wrote it as it
    // let go): what the new one wrote since stands.
    let after = metered();
    assert!(
        after >= before_the_old_one_exits,
        "the old process set the period back: {after} s metered, {before_the_old_one_exits} s before it exited"
    );
    holdfast_lab::wait_for("the instance paused", Duration::from_secs(60), || {
        (instance("pauses").as_u64() > Some(pauses)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
}

/// Pass-through sessions (a `mode = "passthrough"` listener) go to the new process too:
/// the relay stops reading, writes out what it holds, and hands both sockets over (with
/// their TLS state, from the client and to the node), idle (parked) or under statements. Two
/// upgrades; the same server threads, the state kept, no statement failed.
#[test]
fn pass_through_sessions_are_handed_over() {
    pass_through_handed_over(false);
}

/// The same with plain TCP to the node: the plain sessions are relayed in the kernel (a
/// BPF sockmap), and go over with the map itself, relayed in the kernel all along; the
/// TLS ones are copied in user space, as before.
#[test]
fn pass_through_sessions_relayed_in_the_kernel_are_handed_over() {
    pass_through_handed_over(true);
}

fn pass_through_handed_over(plain_backend: bool) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let name = if plain_backend {
        "passthrough-kernel"
    } else {
        "passthrough"
    };
    let served = Served::start_with(name, "1", None, |config| {
        let mut text = std::fs::read_to_string(config).expect("the lab's config");
        if plain_backend {
            assert!(text.contains("mode = \"verify-full\""), "{text}");
            text = text.replace("mode = \"verify-full\"", "mode = \"disabled\"");
        }
        text.push_str(&format!(
            "\n[[listener]]\nlisten = \"127.0.0.1:{port}\"\nmode = \"passthrough\"\n"
        ));
        std::fs::write(config, text).expect("the edited config");
    });
    let (config, log) = (served.config.clone(), served.log.clone());
    let mut procs = served.procs;
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let open = |tls: bool| {
        let mut opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(port)
            .user(Some("app"))
            .pass(Some("app_pass"))
            .db_name(Some("sbtest"))
            .prefer_socket(false);
        if tls {
            opts = opts.ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(dir.join("tls/ca.pem"))),
            ));
        }
        mysql::Conn::new(opts).expect("a pass-through session")
    };
    let id_and_state = |c: &mut mysql::Conn| -> (u32, String) {
        c.query_first("SELECT CONNECTION_ID(), @kept")
            .expect("the session goes on")
            .expect("a row")
    };
    let mut idle: Vec<mysql::Conn> = vec![open(false), open(true)];
    let in_kernel = || {
        let metrics = run(holdfast()
            .args(["ctl", "--config"])
            .arg(&config)
            .arg("metrics"));
        String::from_utf8_lossy(&metrics.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("holdfast_sessions_kernel_relayed "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let mut before = Vec::new();
    for (i, c) in idle.iter_mut().enumerate() {
        c.query_drop(format!("SET @kept = 'relay{i}'"))
            .expect("set");
        before.push(id_and_state(c));
    }
    // One under statements throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = open(true);
    busy.query_drop("SET @kept = 'busy'").expect("set");
    let busy_id = id_and_state(&mut busy).0;
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let row: Option<(u32, String)> =
                    busy.query_first("SELECT CONNECTION_ID(), @kept")?;
                assert_eq!(row, Some((busy_id, "busy".to_string())));
                done += 1;
            }
            Ok::<u64, mysql::Error>(done)
        })
    };
    for round in 1..=2usize {
        // The idle relays copied in user space are parked when they go (two sockets each:
        // both with TLS to the node, the TLS client's alone with plain TCP).
        wait_parked(&config, if plain_backend { 2.0 } else { 4.0 });
        upgrade(&config, &mut procs, &log);
        wait_handed(
            &log,
            "pass-through session handed over from the previous process",
            3 * round,
            "the pass-through sessions in the new process",
        );
        for (c, was) in idle.iter_mut().zip(&before) {
            assert_eq!(&id_and_state(c), was, "{}", read_log());
        }
        // The plain client's session (and none of the TLS ones) relayed in the kernel,
        // in the new process too.
        let want = if plain_backend { 1.0 } else { 0.0 };
        assert_eq!(in_kernel(), Some(want), "{}", read_log());
    }
    stop.store(true, Ordering::Relaxed);
    let done = client
        .join()
        .expect("the client thread")
        .unwrap_or_else(|e| {
            panic!(
                "a statement failed during the upgrades: {e}\n{}",
                read_log()
            )
        });
    assert!(done > 0);
    assert_eq!(status(&config)["generation"], 3);
}

/// Sessions under the compressed protocol go too (each compressed packet is a whole zlib
/// stream: the sequence and the bytes not decoded yet go with the sockets), over plain TCP
/// and over TLS, from the client and to the node.
#[test]
fn compressed_sessions_are_handed_over() {
    let served = Served::start("compressed", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let open = |tls: bool| {
        let mut opts = mysql::OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(base)
            .user(Some("app"))
            .pass(Some("app_pass"))
            .db_name(Some("sbtest"))
            .prefer_socket(false)
            .compress(Some(mysql::Compression::default()));
        if tls {
            opts = opts.ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(dir.join("tls/ca.pem"))),
            ));
        }
        mysql::Conn::new(opts).expect("a compressed session")
    };
    let state = |c: &mut mysql::Conn| -> (u32, String, String) {
        c.query_first("SELECT CONNECTION_ID(), @kept, REPEAT(@kept, 3000)")
            .expect("the session goes on")
            .expect("a row")
    };
    let mut conns: Vec<mysql::Conn> = vec![open(false), open(true)];
    let mut before = Vec::new();
    let mut stmts = Vec::new();
    for (i, c) in conns.iter_mut().enumerate() {
        c.query_drop(format!("SET @kept = 'compressed{i}'"))
            .expect("set");
        stmts.push(c.prep("SELECT ? + 1").expect("prepare"));
        before.push(state(c));
    }
    for round in 1..=2usize {
        upgrade(&config, &mut procs, &log);
        wait_handed(
            &log,
            "session handed over from the previous process",
            2 * round,
            "the compressed sessions in the new process",
        );
        for ((c, was), stmt) in conns.iter_mut().zip(&before).zip(&stmts) {
            assert_eq!(&state(c), was, "{}", read_log());
            let n: Option<i64> = c.exec_first(stmt, (41,)).expect("the prepared statement");
            assert_eq!(n, Some(42));
        }
    }
    assert_eq!(status(&config)["generation"], 3);
}

/// The `mariadb` CLI over TLS 1.2 and over TLS 1.3 (OpenSSL on its side), one statement at
/// a time on its standard input, across two upgrades: the same connection, its state, the
/// same server thread; it never reconnects (`--skip-reconnect`).
#[test]
fn the_mariadb_cli_over_tls_keeps_its_session_across_two_upgrades() {
    use std::io::{BufRead, Write};
    let served = Served::start("cli", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    struct Cli {
        child: Child,
        stdin: std::process::ChildStdin,
        lines: std::sync::mpsc::Receiver<String>,
    }
    impl Drop for Cli {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
    let spawn = |version: &str| -> Cli {
        let mut child = std::process::Command::new("mariadb")
            .args(["--host", "127.0.0.1", "--port", &base.to_string()])
            .args([
                "--user",
                "app",
                "--password=app_pass",
                "--database",
                "sbtest",
            ])
            .arg(format!("--ssl-ca={}", dir.join("tls/ca.pem").display()))
            .arg(format!("--tls-version={version}"))
            .args([
                "--batch",
                "--skip-column-names",
                "--unbuffered",
                "--skip-reconnect",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the mariadb CLI");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
        Cli {
            child,
            stdin,
            lines,
        }
    };
    let ask = |cli: &mut Cli, sql: &str| -> String {
        writeln!(cli.stdin, "{sql}").expect("a statement to the CLI");
        cli.stdin.flush().expect("flush");
        cli.lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("no answer to {sql}: {e}\n{}", read_log()))
    };
    let mut clis = [("TLSv1.2", spawn("TLSv1.2")), ("TLSv1.3", spawn("TLSv1.3"))];
    let mut before = Vec::new();
    for (version, cli) in clis.iter_mut() {
        ask(cli, &format!("SET @kept = '{version}'; SELECT 'set';"));
        before.push(ask(cli, "SELECT CONNECTION_ID(), @kept;"));
    }
    for round in 1..=2usize {
        upgrade(&config, &mut procs, &log);
        wait_handed(
            &log,
            "session handed over from the previous process",
            2 * round,
            "the CLI sessions in the new process",
        );
        for ((_, cli), was) in clis.iter_mut().zip(&before) {
            assert_eq!(
                &ask(cli, "SELECT CONNECTION_ID(), @kept;"),
                was,
                "{}",
                read_log()
            );
        }
    }
    assert_eq!(status(&config)["generation"], 3);
}

/// An idle pooled JDBC connection (MariaDB Connector/J, over TLS, a server-side prepared
/// statement) across two upgrades: the same connection id, its state, its statement.
#[test]
fn an_idle_jdbc_connection_keeps_its_session_across_two_upgrades() {
    use std::io::{BufRead, Write};
    let jar = Path::new("/usr/share/java/mariadb-java-client.jar");
    assert!(
        jar.exists(),
        "{} is missing: scripts/deps.sh installs libmariadb-java",
        jar.display()
    );
    let served = Served::start("jdbc", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/UpgradeIdle.java");
    let classes = dir.join("java");
    std::fs::create_dir_all(&classes).expect("a class directory");
    let out = run(std::process::Command::new("javac")
        .arg("-cp")
        .arg(jar)
        .arg("-d")
        .arg(&classes)
        .arg(&source));
    assert!(
        out.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut child = std::process::Command::new("java")
        .arg("-cp")
        .arg(format!("{}:{}", classes.display(), jar.display()))
        .arg("UpgradeIdle")
        .arg(base.to_string())
        .arg(dir.join("tls/ca.pem"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("java");
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let _child = Kill(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no line from the JDBC client: {e}\n{}", read_log()))
    };
    let first = next();
    assert!(first.ends_with(" jdbc +05:00 42"), "{first}");
    for round in 1..=2usize {
        upgrade(&config, &mut procs, &log);
        wait_handed(
            &log,
            "session handed over from the previous process",
            round,
            "the JDBC session in the new process",
        );
        writeln!(stdin, "check").expect("to the JDBC client");
        stdin.flush().expect("flush");
        assert_eq!(next(), first, "{}", read_log());
    }
    assert_eq!(status(&config)["generation"], 3);
}

/// A read that runs long on a replica.
const LONG_READ: &str = "SELECT COUNT(*) FROM seq_1_to_100000000000 WHERE seq % 7 = 8";

/// While both processes serve, a `KILL` names a session of the other: a long statement
/// still running in the old process (on the primary, and a split session's read on the
/// replica), killed from a new connection (which the new process takes); a session handed
/// over, killed from a transaction left in the old process. The server's answers, as
/// without an upgrade: `KILL QUERY` ends the statement and the session goes on; `KILL`
/// ends the connection, its transaction rolled back; an id nobody holds gets 1094.
#[test]
fn a_kill_finds_its_session_in_the_other_process() {
    let served = Served::start("kill", "1", None);
    let (config, base, log) = (served.config.clone(), served.base, served.log.clone());
    let mut procs = served.procs;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let open = || session(base);
    let mut setup = open();
    setup
        .query_drop("CREATE TABLE sbtest.killed (id INT PRIMARY KEY)")
        .expect("a table");

    // Stays in the old process: a statement runs across the upgrade.
    let mut long = open();
    let long_id = long.connection_id();
    let sleeping = std::thread::spawn(move || {
        let slept: Result<Option<u32>, mysql::Error> = long.query_first("SELECT SLEEP(60)");
        (slept, long)
    });
    // And a split session's read on the replica.
    let mut split_long =
        mysql::Conn::new(mysql::Opts::from_url(&url(base + 2)).expect("url")).expect("a session");
    let split_long_id = split_long.connection_id();
    // (A read of a table of the sequence engine, long enough; `SLEEP` runs on the primary.
    // The server ends it after a minute whatever happens.)
    split_long
        .query_drop("SET max_statement_time = 60")
        .expect("set");
    let split_sleeping = std::thread::spawn(move || {
        let slept: Result<Option<u64>, mysql::Error> = split_long.query_first(LONG_READ);
        (slept, split_long)
    });
    // Stay in the old process too: transactions open.
    let mut stuck = open();
    let stuck_id = stuck.connection_id();
    stuck.query_drop("BEGIN").expect("begin");
    stuck
        .query_drop("INSERT INTO sbtest.killed VALUES (1)")
        .expect("insert");
    let mut killer_left = open();
    killer_left.query_drop("BEGIN").expect("begin");
    killer_left
        .query_drop("INSERT INTO sbtest.killed VALUES (2)")
        .expect("insert");
    // Goes over.
    let mut idle = open();
    let idle_id = idle.connection_id();
    idle.query_drop("SET @v = 'idle'").expect("set");
    let dir = config.parent().expect("the lab's directory").to_path_buf();
    let root_on = |node: &str| {
        mysql::Conn::new(
            mysql::OptsBuilder::new()
                .socket(Some(dir.join(format!("{node}.sock")).display().to_string()))
                .user(Some("root")),
        )
        .expect("root on a node's socket")
    };
    for (node, sql) in [("node1", "SELECT SLEEP(60)"), ("node2", LONG_READ)] {
        let mut root = root_on(node);
        wait_for(
            "the long statements to run",
            Duration::from_secs(30),
            || {
                let n: Option<u32> = root
                    .exec_first(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = ?",
                        (sql,),
                    )
                    .expect("the processlist");
                (n == Some(1)).then_some(())
            },
        );
    }

    upgrade(&config, &mut procs, &log);
    wait_handed(
        &log,
        "session handed over from the previous process",
        1,
        "the idle session to go over",
    );
    assert!(
        procs.first.try_wait().expect("try_wait").is_none(),
        "the old process still serves what it holds"
    );

    // A new connection: the new process's.
    let mut killer = open();
    let unknown = killer.query_drop(format!("KILL {}", long_id + 1000));
    assert!(
        matches!(&unknown, Err(mysql::Error::MySqlError(e)) if e.code == 1094),
        "an id nobody holds: {unknown:?}"
    );
    killer
        .query_drop(format!("KILL QUERY {long_id}"))
        .unwrap_or_else(|e| {
            panic!(
                "KILL QUERY of the old process's session: {e}\n{}",
                read_log()
            )
        });
    let (slept, mut long) = sleeping.join().expect("the sleeping thread");
    match slept {
        // MariaDB ends a SLEEP killed by KILL QUERY with 1, or with 1317.
        Ok(Some(1)) => {}
        Err(mysql::Error::MySqlError(e)) if e.code == 1317 => {}
        other => panic!("the long statement was not interrupted: {other:?}"),
    }
    let one: Option<u32> = long.query_first("SELECT 1").expect("the session goes on");
    assert_eq!(one, Some(1));
    killer
        .query_drop(format!("KILL QUERY {split_long_id}"))
        .unwrap_or_else(|e| {
            panic!(
                "KILL QUERY of the old process's replica read: {e}\n{}",
                read_log()
            )
        });
    let (slept, mut split_long) = split_sleeping.join().expect("the sleeping thread");
    match slept {
        Err(mysql::Error::MySqlError(e)) if e.code == 1317 => {}
        other => panic!("the read on the replica was not interrupted: {other:?}"),
    }
    let one: Option<u32> = split_long
        .query_first("SELECT 1")
        .unwrap_or_else(|e| panic!("the session goes on: {e}\n{}", read_log()));
    assert_eq!(one, Some(1));

    // Of the old process's session, its connection.
    killer
        .query_drop(format!("KILL CONNECTION {stuck_id}"))
        .unwrap_or_else(|e| panic!("KILL of the old process's session: {e}\n{}", read_log()));
    assert!(
        stuck.query_drop("COMMIT").is_err(),
        "a killed session's connection is closed"
    );

    // From the old process, the session handed over.
    killer_left
        .query_drop(format!("KILL {idle_id}"))
        .unwrap_or_else(|e| panic!("KILL of the new process's session: {e}\n{}", read_log()));
    let after = idle.query_drop("SELECT 1");
    assert!(
        after.is_err(),
        "a killed session's connection is closed\n{}",
        read_log()
    );
    killer_left
        .query_drop("COMMIT")
        .unwrap_or_else(|e| panic!("commit: {e}\n{}", read_log()));

    // Only the transaction left to commit went in.
    let rows: Vec<u32> = killer
        .query("SELECT id FROM sbtest.killed ORDER BY id")
        .expect("rows");
    assert_eq!(rows, vec![2]);
    assert!(!read_log().contains("panicked"), "{}", read_log());
}
