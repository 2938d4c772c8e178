//! Serverless: the lab's node1 run by holdfast's process driver, paused when idle (frozen or
//! stopped), woken by clients, scaled in place and metered. Real mariadbd, real clients.

use holdfast_it::{metric, poll, wait_for, Harness, Options};
use mysql::prelude::*;
use mysql::{Conn, Opts, OptsBuilder};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn connect(h: &Harness) -> Conn {
    let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url")).prefer_socket(false);
    Conn::new(opts).expect("connect through holdfast")
}

fn instance(h: &Harness) -> serde_json::Value {
    h.status_json()["serverless"].clone()
}

fn phase(h: &Harness) -> String {
    instance(h)["phase"].as_str().unwrap_or("?").to_string()
}

fn wait_phase(h: &Harness, want: &str, tier: Option<&str>) {
    wait_for(&format!("the instance to be {want}"), WAIT, || {
        let v = instance(h);
        (v["phase"] == want && tier.is_none_or(|t| v["tier"] == t)).then_some(())
    });
}

/// The server's pid, from its pid file.
fn server_pid(h: &Harness) -> Option<u32> {
    std::fs::read_to_string(h.lab.primary().pid_file())
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The process state letter from /proc (R, S, T for stopped by a signal...).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn port_answers(h: &Harness) -> bool {
    let addr = h.direct();
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut b = [0u8; 4];
    s.read_exact(&mut b).is_ok()
}

fn count(h: &Harness, key: &str) -> u64 {
    instance(h)[key].as_u64().unwrap_or(0)
}

#[test]
fn an_idle_instance_freezes_and_the_mariadb_cli_wakes_it() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 1;
        s.stop_after_secs = 0;
    }));
    wait_phase(&h, "paused", Some("freeze"));
    let pid = server_pid(&h).expect("server pid");
    assert_eq!(proc_state(pid), Some('T'), "the server process is frozen");
    assert!(!port_answers(&h), "a frozen server greets nobody");
    let out = h.mariadb(h.proxy, &["-N", "-e", "SELECT 1 + 1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "2");
    // (It may already be frozen again: it pauses after 1 s idle.)
    assert_eq!(server_pid(&h), Some(pid), "a thaw keeps the same process");
    let v = instance(&h);
    assert!(v["resumes"].as_u64() >= Some(1), "{v}");
    assert!(v["last_resume_ms"].as_f64().is_some(), "{v}");
    let m = h.metrics();
    assert!(
        metric(&m, "holdfast_instance_wakes_total{reason=\"login\"}").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert!(
        metric(
            &m,
            "holdfast_instance_transitions_total{from=\"frozen\",to=\"running\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );
}

type StateRow = (i64, String, String, u64, u16);

const STATE: &str = "SELECT @n, CAST(@s AS CHAR), DATABASE(), LAST_INSERT_ID(), @@port";

fn set_state(c: &mut Conn) -> (StateRow, mysql::Statement) {
    c.query_drop("CREATE TABLE sbtest.sl (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
        .unwrap();
    c.query_drop("INSERT INTO sbtest.sl (v) VALUES (1), (2)")
        .unwrap();
    c.query_drop("SET @n = 7, @s = 'kept'").unwrap();
    c.query_drop("USE mysql").unwrap();
    let stmt = c.prep("SELECT ? * 2").unwrap();
    let state: StateRow = c.query_first(STATE).unwrap().expect("state");
    (state, stmt)
}

/// Idle pooled connections stay open while the server is stopped and come back with their
/// state: the seed's "pause with connections open", which Aurora and Neon do not do.
#[test]
fn idle_connections_survive_a_stop_pause_with_their_state() {
    // Paused over the admin API rather than by the idle timer, so that it cannot pause
    // again between the checks below on a slow machine.
    let h = Harness::start_with(Options::default().serverless(|s| s.idle_pause_secs = 0));
    let mut pool: Vec<Conn> = (0..3).map(|_| connect(&h)).collect();
    let (before, stmt) = set_state(&mut pool[0]);
    assert_eq!(before.0, 7);
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    wait_phase(&h, "paused", Some("stop"));
    assert!(!port_answers(&h), "the server is stopped");
    assert_eq!(
        h.status().sessions.len(),
        3,
        "the clients' connections stay open"
    );
    let after: StateRow = pool[0].query_first(STATE).unwrap().expect("state");
    assert_eq!(
        after, before,
        "the session state is restored on the restarted server"
    );
    let four: Option<i64> = pool[0].exec_first(&stmt, (2,)).unwrap();
    assert_eq!(four, Some(4), "the prepared statement keeps its id");
    for c in &mut pool[1..] {
        let one: Option<i64> = c.query_first("SELECT 1").unwrap();
        assert_eq!(one, Some(1));
    }
    assert_eq!(count(&h, "resumes"), 1, "one wake for all three sessions");
    let m = h.metrics();
    assert!(
        metric(
            &m,
            "holdfast_instance_transitions_total{from=\"stopped\",to=\"running\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{m}"
    );
}

#[test]
fn idle_connections_survive_a_freeze_and_the_later_stop() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 1;
        s.stop_after_secs = 2;
    }));
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    wait_phase(&h, "paused", Some("freeze"));
    // Frozen first, then stopped to free the memory; the session stays open throughout.
    wait_phase(&h, "paused", Some("stop"));
    assert!(!port_answers(&h));
    let after: StateRow = c.query_first(STATE).unwrap().expect("state");
    assert_eq!(after, before);
    let four: Option<i64> = c.exec_first(&stmt, (2,)).unwrap();
    assert_eq!(four, Some(4));
}

#[test]
fn an_open_transaction_keeps_the_instance_running_and_status_says_why() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 1;
    }));
    let mut c = connect(&h);
    c.query_drop("CREATE TABLE sbtest.tx (id INT PRIMARY KEY)")
        .unwrap();
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.tx VALUES (1)").unwrap();
    let reasons = wait_for("status to list the blocking session", WAIT, || {
        let v = instance(&h);
        let list = v["pause_blocked_by"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!list.is_empty()).then_some(list)
    });
    let text = format!("{reasons:?}");
    assert!(text.contains("open transaction"), "{text}");
    assert_eq!(phase(&h), "running");
    assert_eq!(count(&h, "pauses"), 0);
    let (code, body) = h.admin_post("/pause", None);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("open transaction"), "{body}");
    c.query_drop("COMMIT").unwrap();
    wait_phase(&h, "paused", None);
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM sbtest.tx").unwrap();
    assert_eq!(n, Some(1), "the committed row is there after the wake");
}

/// Scanners, garbage and wrong passwords are answered without waking the instance; a
/// real login then wakes it.
#[test]
fn probes_garbage_and_wrong_passwords_do_not_wake_a_paused_instance() {
    let h = Harness::start_with(
        Options::default()
            .serverless(|s| s.idle_pause_secs = 0)
            .config(|c| c.proxy.handshake_timeout_ms = 500),
    );
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    assert!(!port_answers(&h));
    // A port scan: connect, read the greeting, close.
    let mut s = TcpStream::connect(h.proxy).unwrap();
    let mut greeting = [0u8; 4];
    s.read_exact(&mut greeting).unwrap();
    drop(s);
    // Garbage instead of a login.
    let mut s = TcpStream::connect(h.proxy).unwrap();
    s.read_exact(&mut greeting).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let len = u32::from_le_bytes([greeting[0], greeting[1], greeting[2], 0]) as usize;
    let mut rest = vec![0u8; len];
    s.read_exact(&mut rest).unwrap();
    s.write_all(b"\x05\x00\x00\x01GET /").unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert_eq!(answer.get(4), Some(&0xff), "an ERR packet for garbage");
    // Silence: closed after the handshake timeout (500 ms), not the resume deadline.
    let mut s = TcpStream::connect(h.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut all = Vec::new();
    let closed = s.read_to_end(&mut all).is_ok();
    assert!(closed, "a silent connection is closed by holdfast");
    assert!(t.elapsed() < Duration::from_secs(5));
    // A wrong password for an account whose verifier holdfast holds.
    let out = h.mariadb_as(h.proxy, "app", "wrong", &["-e", "SELECT 1"]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("1045"), "{out:?}");
    assert_eq!(phase(&h), "paused");
    assert_eq!(count(&h, "resumes"), 0, "nothing woke the instance");
    assert!(!port_answers(&h));
    let m = h.metrics();
    for reason in ["not_a_login", "no_login", "wrong_password"] {
        let key = format!("holdfast_closed_without_wake_total{{reason=\"{reason}\"}}");
        assert!(metric(&m, &key).unwrap_or(0.0) >= 1.0, "{key} in {m}");
    }
    let out = h.mariadb(h.proxy, &["-N", "-e", "SELECT 3"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "3");
    assert_eq!(count(&h, "resumes"), 1);
}

#[test]
fn twenty_clients_connecting_at_once_wake_the_instance_once() {
    let h = Harness::start_with(Options::default().serverless(|s| s.idle_pause_secs = 0));
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    let url = h.url();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(20));
    let threads: Vec<_> = (0..20)
        .map(|i| {
            let url = url.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let opts =
                    OptsBuilder::from_opts(Opts::from_url(&url).unwrap()).prefer_socket(false);
                barrier.wait();
                let mut c = Conn::new(opts).map_err(|e| format!("client {i}: {e}"))?;
                c.query_first::<i64, _>(format!("SELECT {i}"))
                    .map_err(|e| format!("client {i}: {e}"))
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let got = t.join().expect("client thread");
        assert_eq!(got, Ok(Some(i as i64)));
    }
    assert_eq!(count(&h, "resumes"), 1, "one resume for twenty clients");
}

/// A server that cannot start: clients get a clear error naming the instance and the
/// deadline, the resume is retried, and once the cause is gone the next client gets in.
#[test]
fn a_failed_resume_gives_a_clear_error_and_is_retried() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.resume_deadline_ms = 1_500;
        s.retry_backoff_ms = 100;
    }));
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    let datadir = h.lab.primary().datadir.clone();
    let moved = datadir.with_extension("away");
    std::fs::rename(&datadir, &moved).unwrap();
    let out = h.mariadb(h.proxy, &["-e", "SELECT 1"]);
    std::fs::rename(&moved, &datadir).unwrap();
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("3032"), "{out:?}");
    assert!(
        out.stderr
            .contains("instance 'lab' did not resume within 1500 ms"),
        "{out:?}"
    );
    assert!(count(&h, "resume_failures") >= 1);
    let out = h.mariadb(h.proxy, &["-N", "-e", "SELECT 5"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "5");
}

#[test]
fn a_passthrough_listener_relays_and_keeps_the_instance_awake() {
    let h = Harness::start_with(
        Options::default()
            .serverless(|s| s.idle_pause_secs = 1)
            .config(|c| {
                c.listeners.push(holdfast_proxy::config::ListenerConfig {
                    listen: "127.0.0.1:0".into(),
                    mode: holdfast_proxy::config::ListenerMode::Passthrough,
                    routing: Default::default(),
                    trusted_proxies: None,
                })
            }),
    );
    let addr = h.listeners[0];
    let url = format!(
        "mysql://{}:{}@127.0.0.1:{}/{}",
        h.user(),
        h.password(),
        addr.port(),
        h.database()
    );
    let opts = OptsBuilder::from_opts(Opts::from_url(&url).unwrap()).prefer_socket(false);
    let mut c = Conn::new(opts).expect("connect through the pass-through listener");
    let stmt = c.prep("SELECT ? + 40").unwrap();
    let v: Option<i64> = c.exec_first(&stmt, (2,)).unwrap();
    assert_eq!(v, Some(42));
    let rows: Vec<(i64, String)> = c
        .query("SELECT seq, CONCAT('r', seq) FROM seq_1_to_1000")
        .unwrap();
    assert_eq!(rows.len(), 1000);
    let reasons = wait_for("status to list the pass-through session", WAIT, || {
        let list = instance(&h)["pause_blocked_by"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!list.is_empty()).then_some(list)
    });
    assert!(
        format!("{reasons:?}").contains("pass-through"),
        "{reasons:?}"
    );
    assert_eq!(phase(&h), "running");
    drop(c);
    wait_phase(&h, "paused", None);
    // The pass-through listener wakes the instance too.
    let out = h.mariadb(addr, &["-N", "-e", "SELECT 6"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "6");
}

#[test]
fn scaling_applies_cpu_and_buffer_pool_in_place() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.autoscale = false;
    }));
    let mut c = connect(&h);
    let id_before: Option<u64> = c.query_first("SELECT CONNECTION_ID()").unwrap();
    let (code, body) = h.admin_post("/scale?ccu=1.5", None);
    assert_eq!(code, 200, "{body}");
    wait_for("the size to be 1.5 CCU", WAIT, || {
        (instance(&h)["ccu"].as_f64() == Some(1.5)).then_some(())
    });
    let pool: Option<u64> = c.query_first("SELECT @@innodb_buffer_pool_size").unwrap();
    assert_eq!(pool, Some(192 << 20), "128 MiB per CCU in the lab");
    let max: Option<u64> = c.query_first("SELECT @@max_connections").unwrap();
    assert_eq!(max, Some(300), "200 connections per CCU in the lab");
    let id_after: Option<u64> = c.query_first("SELECT CONNECTION_ID()").unwrap();
    assert_eq!(id_before, id_after, "no reconnect, no restart");
    let pid = server_pid(&h).expect("pid");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    if std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
        let group = cgroups
            .lines()
            .find_map(|l| {
                l.strip_prefix("1:cpu:")
                    .or_else(|| l.split_once(":cpu:").map(|(_, g)| g))
            })
            .expect("the server's cpu cgroup");
        let quota =
            std::fs::read_to_string(format!("/sys/fs/cgroup/cpu{group}/cpu.cfs_quota_us")).unwrap();
        assert_eq!(quota.trim(), "150000", "1.5 CPUs");
    }
    if std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        let group = cgroups
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, g)| g))
            .expect("the server's memory cgroup");
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory{group}/memory.limit_in_bytes"
        ))
        .unwrap();
        assert_eq!(limit.trim(), (3u64 << 30).to_string(), "2 GiB per CCU");
    }
}

#[test]
fn the_autoscaler_scales_up_under_load() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.scale.down_after_secs = 600;
        // Half of the 0.5-CPU quota is enough to count as load, so the test holds on a
        // busy machine where the server does not get its whole quota.
        s.scale.up_utilization = 0.5;
        s.scale.target_utilization = 0.4;
    }));
    assert_eq!(instance(&h)["ccu"].as_f64(), Some(0.5));
    let url = h.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let opts =
                    OptsBuilder::from_opts(Opts::from_url(&url).unwrap()).prefer_socket(false);
                let mut c = Conn::new(opts).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: Option<i64> = c
                        .query_first("SELECT BENCHMARK(2000000, MD5('holdfast'))")
                        .unwrap();
                }
            })
        })
        .collect();
    let grown = poll(WAIT, || {
        let ccu = instance(&h)["ccu"].as_f64().unwrap_or(0.0);
        (ccu > 0.5).then_some(ccu)
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let cpu = instance(&h)["cpu_used"].as_f64();
    assert!(grown.is_some(), "no scale-up under load; cpu_used {cpu:?}");
}

#[test]
fn usage_is_metered_per_second_and_survives_a_restart_of_holdfast() {
    let mut h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.period_secs = 2;
        s.flush_secs = 1;
    }));
    let ledger_path = h.lab.dir().join("usage.db");
    let t = Instant::now();
    let (code, body) = h.admin_post("/pause?tier=freeze", None);
    assert_eq!(code, 200, "{body}");
    // Wait for settled periods with running and paused seconds.
    let lines = wait_for("settled periods with running and paused time", WAIT, || {
        let body = h.admin_get("/usage?instance=lab");
        let lines: Vec<holdfast_serverless::ledger::UsageLine> =
            serde_json::from_str(&body).unwrap();
        let settled: Vec<_> = lines.iter().filter(|l| l.settled).cloned().collect();
        let ran = settled.iter().any(|l| l.running_secs > 0);
        let paused = settled
            .iter()
            .any(|l| l.paused_secs > 0 && l.running_secs == 0);
        (ran && paused).then_some(settled)
    });
    assert!(t.elapsed() < WAIT);
    h.stop_proxy();
    for l in &lines {
        assert_eq!(l.period_secs, 2);
        assert!(l.running_secs + l.paused_secs <= 2, "{l:?}");
        let expected = l.running_secs as f64 * 0.5;
        assert!(
            (l.ccu_seconds - expected).abs() < 1e-9,
            "CCU-seconds = 0.5 per running second: {l:?}"
        );
    }
    // holdfast is gone; the ledger on disk still has every settled line.
    let ledger = holdfast_serverless::ledger::Ledger::open(&ledger_path).unwrap();
    let stored = ledger.lines(Some("lab"), None).unwrap();
    for l in &lines {
        assert!(
            stored
                .iter()
                .any(|s| s.period_start == l.period_start && s.settled && s == l),
            "settled line {l:?} missing from {stored:?}"
        );
    }
}

/// A pool's keep-alive pings do not keep the instance awake, and while it is paused they
/// are answered without waking it.
#[test]
fn keepalive_pings_neither_keep_it_awake_nor_wake_it() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 1;
        s.stop_after_secs = 0;
    }));
    let mut c = connect(&h);
    let paused = poll(WAIT, || {
        c.ping().expect("ping");
        std::thread::sleep(Duration::from_millis(200));
        (phase(&h) == "paused").then_some(())
    });
    assert!(paused.is_some(), "pinging kept the instance awake");
    for _ in 0..5 {
        c.ping().expect("ping while paused");
    }
    assert_eq!(phase(&h), "paused");
    assert_eq!(count(&h, "resumes"), 0, "pings woke the instance");
    let one: Option<i64> = c.query_first("SELECT 1").unwrap();
    assert_eq!(one, Some(1));
    assert_eq!(count(&h, "resumes"), 1);
}

/// An account holdfast cannot verify itself (ed25519) still wakes the instance, through the
/// relayed login; its session survives a freeze but keeps the instance from stopping, since
/// holdfast could not log in again for it.
#[test]
fn relayed_logins_wake_the_instance_and_block_only_the_stop_tier() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.stop_after_secs = 0;
    }));
    let (user, password) = (holdfast_lab::ED25519_USER, holdfast_lab::ED25519_PASSWORD);
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    let out = h.mariadb_as(
        h.proxy,
        user,
        password,
        &["-N", "-e", "SELECT CURRENT_USER()"],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), format!("{user}@%"));
    assert_eq!(count(&h, "resumes"), 1);
    // An open relayed session (the mariadb CLI reading statements from a pipe): freezing
    // keeps its connection; stopping would lose it.
    let mut cli = std::process::Command::new("mariadb")
        .args([
            "--no-defaults",
            "--protocol=TCP",
            "-h127.0.0.1",
            &format!("-P{}", h.proxy.port()),
            &format!("-u{user}"),
            &format!("-p{password}"),
            "--batch",
            "-N",
            "--unbuffered",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("mariadb CLI");
    let mut stdin = cli.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(cli.stdout.take().unwrap());
    let mut ask = |sql: &str| -> String {
        use std::io::BufRead;
        writeln!(stdin, "{sql}").unwrap();
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        line.trim().to_string()
    };
    assert_eq!(ask("SET @kept = 9; SELECT 'ready';"), "ready");
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("login was relayed"), "{body}");
    let (code, body) = h.admin_post("/pause?tier=freeze", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        ask("SELECT @kept;"),
        "9",
        "the relayed session survives the freeze"
    );
    let _ = cli.kill();
    let _ = cli.wait();
}

/// The instance's server is killed (kill -9) while sessions are idle: holdfast notices,
/// the next statement starts it again, and the sessions carry on with their state.
#[test]
fn a_killed_server_is_started_again_and_idle_sessions_carry_on() {
    let h = Harness::start_with(Options::default().serverless(|s| s.idle_pause_secs = 0));
    let mut c = connect(&h);
    let (before, stmt) = set_state(&mut c);
    h.wait_captured();
    let pid = server_pid(&h).expect("pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_phase(&h, "paused", Some("stop"));
    let v = instance(&h);
    assert!(
        v["last_error"]
            .as_str()
            .unwrap_or("")
            .contains("outside holdfast"),
        "{v}"
    );
    let after: StateRow = c.query_first(STATE).unwrap().expect("state");
    assert_eq!(after, before, "the idle session carries on with its state");
    assert_ne!(server_pid(&h), Some(pid), "a new server process");
    assert_eq!(count(&h, "resumes"), 1);
    let four: Option<i64> = c.exec_first(&stmt, (2,)).unwrap();
    assert_eq!(four, Some(4));
    let m = h.metrics();
    assert!(
        metric(
            &m,
            "holdfast_instance_transitions_total{from=\"running\",to=\"crashed\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{m}"
    );
}

#[test]
fn connections_that_do_not_log_in_do_not_keep_the_instance_running() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 2;
        s.stop_after_secs = 0;
    }));
    // A port scanner: connects, reads the greeting (or not), closes, every 200 ms, and
    // sometimes sends garbage. It must not count as use of the instance.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scanner = {
        let (stop, addr) = (stop.clone(), h.proxy);
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    if n % 3 == 0 {
                        let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            n
        })
    };
    wait_phase(&h, "paused", Some("freeze"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scans = scanner.join().expect("scanner thread");
    assert!(
        scans >= 5,
        "the scanner kept connecting ({scans} connections)"
    );
}

#[test]
fn guessed_user_names_wake_a_paused_instance_once_a_minute_per_address() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 1;
        s.stop_after_secs = 0;
    }));
    let guess = |user: &str| {
        let opts = OptsBuilder::from_opts(Opts::from_url(&h.url()).expect("url"))
            .user(Some(user))
            .pass(Some("guess"))
            .prefer_socket(false);
        match Conn::new(opts).map(|_| ()).expect_err("refused") {
            mysql::Error::MySqlError(m) => assert_eq!(m.code, 1045, "{m:?}"),
            other => panic!("expected ERR 1045, got {other:?}"),
        }
    };
    wait_phase(&h, "paused", Some("freeze"));
    // The first unknown name from this address may wake it: the accounts are read again.
    guess("nobody_1");
    let resumes = count(&h, "resumes");
    assert_eq!(resumes, 1, "the first guess woke the instance once");
    wait_phase(&h, "paused", Some("freeze"));
    // Further guesses within the minute are answered from the accounts already known.
    for name in ["nobody_2", "nobody_3", "nobody_4"] {
        guess(name);
    }
    assert_eq!(count(&h, "resumes"), resumes, "no wake for further guesses");
    assert_eq!(phase(&h), "paused");
}

/// Issue 18, item 15: failed logins that holdfast can refuse by itself never wake a paused
/// instance: `mariadb.sys` (a mysql_native_password account whose hash is 'invalid': the
/// server accepts no password) and a name whose accounts are all for other hosts, guessed
/// again within the minute. (Both used to reach the wake before any check.)
#[test]
fn failed_logins_for_impossible_accounts_do_not_wake_a_paused_instance() {
    let h = Harness::start_with(Options::default().serverless(|s| s.idle_pause_secs = 0));
    h.root_sql("CREATE USER 'elsewhere'@'10.9.9.9' IDENTIFIED BY 'pw'");
    // holdfast reads the accounts (the new one included) before the pause.
    let out = h.mariadb(h.proxy, &["-N", "-e", "SELECT 1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let (code, body) = h.admin_post("/pause", None);
    assert_eq!(code, 200, "{body}");
    wait_phase(&h, "paused", None);
    let before = count(&h, "resumes");

    let out = h.mariadb_as(h.proxy, "mariadb.sys", "x", &["-e", "SELECT 1"]);
    assert!(out.stderr.contains("1045"), "{out:?}");
    assert_eq!(
        count(&h, "resumes"),
        before,
        "mariadb.sys woke the instance"
    );
    assert_eq!(phase(&h), "paused");

    // A guessed name uses this address's one wake a minute; the next name whose accounts
    // are for other hosts is refused without one.
    let out = h.mariadb_as(h.proxy, "no_such_user_x", "x", &["-e", "SELECT 1"]);
    assert!(out.stderr.contains("1045"), "{out:?}");
    let after_guess = count(&h, "resumes");
    if phase(&h) != "paused" {
        let (code, body) = h.admin_post("/pause", None);
        assert_eq!(code, 200, "{body}");
        wait_phase(&h, "paused", None);
    }
    let out = h.mariadb_as(h.proxy, "elsewhere", "pw", &["-e", "SELECT 1"]);
    assert!(out.stderr.contains("1045"), "{out:?}");
    assert_eq!(
        count(&h, "resumes"),
        after_guess,
        "a host-mismatched name woke it"
    );
    assert_eq!(phase(&h), "paused");
}

/// A TCP relay between one client and holdfast that passes holdfast's greeting at once but
/// holds the client's first bytes (its login) until `release` is sent: a login that
/// connected before a pause and logs in after it.
struct HeldLogin {
    addr: std::net::SocketAddr,
    greeted: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
}

impl HeldLogin {
    fn start(upstream: std::net::SocketAddr) -> HeldLogin {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (greeted_tx, greeted) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let Ok((client, _)) = listener.accept() else {
                return;
            };
            let server = TcpStream::connect(upstream).expect("connect to holdfast");
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_read, mut c_write) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                let mut first = true;
                while let Ok(n) = s_read.read(&mut buf) {
                    if n == 0 || c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if std::mem::take(&mut first) {
                        let _ = greeted_tx.send(());
                    }
                }
                let _ = c_write.shutdown(std::net::Shutdown::Both);
            });
            if release_rx.recv().is_err() {
                return;
            }
            let _ = std::io::copy(&mut c_read, &mut s_write);
            let _ = s_write.shutdown(std::net::Shutdown::Both);
        });
        HeldLogin {
            addr,
            greeted,
            release,
        }
    }
}

/// Issue 18, item 16: a login that connected before a stop-tier pause and logs in after it
/// (waking the instance) works on the new server run: its first statements run on the
/// connection it logged in with, which is not taken for one that died with the old run.
#[test]
fn a_login_racing_a_stop_pause_keeps_its_fresh_backend_connection() {
    let h = Harness::start_with(
        Options::default()
            .serverless(|s| s.idle_pause_secs = 0)
            .config(|c| c.proxy.handshake_timeout_ms = 60_000),
    );
    let held = HeldLogin::start(h.proxy);
    let (user, password, db) = (
        h.user().to_string(),
        h.password().to_string(),
        h.database().to_string(),
    );
    let addr = held.addr;
    let client = std::thread::spawn(move || {
        let opts = OptsBuilder::new()
            .ip_or_hostname(Some(addr.ip().to_string()))
            .tcp_port(addr.port())
            .user(Some(user))
            .pass(Some(password))
            .db_name(Some(db))
            .prefer_socket(false);
        Conn::new(opts)
    });
    // holdfast has accepted the connection and greeted it: the login has begun.
    held.greeted
        .recv_timeout(WAIT)
        .expect("holdfast's greeting");
    let (code, body) = h.admin_post("/pause?tier=stop", None);
    assert_eq!(code, 200, "{body}");
    wait_phase(&h, "paused", Some("stop"));
    held.release.send(()).expect("release the login");
    let mut c = client
        .join()
        .expect("client thread")
        .expect("the login wakes the instance and succeeds");
    let before = metric(&h.metrics(), "holdfast_sessions_moved_total").unwrap_or(0.0);
    for n in 1..=3i64 {
        let got: Option<i64> = c
            .query_first(format!("SELECT {n}"))
            .unwrap_or_else(|e| panic!("statement {n} after the racing login: {e}"));
        assert_eq!(got, Some(n));
    }
    assert_eq!(
        metric(&h.metrics(), "holdfast_sessions_moved_total").unwrap_or(0.0),
        before,
        "the session's fresh backend connection was taken for a dead one"
    );
    assert_eq!(count(&h, "resumes"), 1);
}

/// The steps of the last size change, as `/status` shows them: (what, detail).
fn last_scale(h: &Harness) -> Vec<(String, String)> {
    instance(h)["last_scale"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| {
                    let field = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                    (field("what"), field("detail"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 18, item 16: the memory cap never falls below what the server holds. Scaling down,
/// the buffer pool shrinks first (the resize done) and the driver's limits (CPU, cgroup
/// memory cap) come down after; scaling up, the limits rise first and the pool grows after.
/// Seen in the order the scaling task applied its steps, then in the server's variable and
/// the real cgroup.
#[test]
fn scaling_down_shrinks_the_buffer_pool_before_lowering_the_memory_cap() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.autoscale = false;
    }));
    let scale_to = |ccu: f64| {
        let (code, body) = h.admin_post(&format!("/scale?ccu={ccu}"), None);
        assert_eq!(code, 200, "{body}");
        wait_for(&format!("the size to be {ccu} CCU"), WAIT, || {
            (instance(&h)["ccu"].as_f64() == Some(ccu)).then_some(())
        });
        last_scale(&h)
    };
    let whats = |steps: &[(String, String)]| steps.iter().map(|s| s.0.clone()).collect::<Vec<_>>();
    let up = scale_to(2.0);
    assert_eq!(
        whats(&up),
        ["limits", "server"],
        "growing: the cap first; {up:?}"
    );
    let down = scale_to(0.5);
    assert_eq!(
        whats(&down),
        ["server", "limits"],
        "shrinking: the pool first; {down:?}"
    );
    assert!(
        down[0]
            .1
            .contains("innodb_buffer_pool_size=67108864 (resize done"),
        "{down:?}"
    );
    let mut c = connect(&h);
    let pool: Option<u64> = c.query_first("SELECT @@innodb_buffer_pool_size").unwrap();
    assert_eq!(pool, Some(64 << 20), "128 MiB per CCU in the lab");
    let pid = server_pid(&h).expect("pid");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    if std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        let group = cgroups
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, g)| g))
            .expect("the server's memory cgroup");
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory{group}/memory.limit_in_bytes"
        ))
        .unwrap();
        assert_eq!(limit.trim(), (1u64 << 30).to_string(), "2 GiB per CCU");
    }
}

/// Issue 19: `ctl scale 1.5` was undone by the autoscaler about a minute later without a
/// word. An operator's size holds until `ctl scale auto` (`POST /scale?auto=true`), and
/// `/status` says so.
#[test]
fn an_operators_size_holds_until_the_autoscaler_is_given_it_back() {
    let h = Harness::start_with(Options::default().serverless(|s| {
        s.idle_pause_secs = 0;
        s.autoscale = true;
        // An idle server is scaled down after a second.
        s.scale.down_after_secs = 1;
        s.scale.min_ccu = 0.5;
    }));
    let (code, body) = h.admin_post("/scale?ccu=1.5", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(instance(&h)["ccu"].as_f64(), Some(1.5));
    assert_eq!(instance(&h)["manual_ccu"].as_f64(), Some(1.5));
    // Idle for several times what the autoscaler needs to scale down.
    wait_for("5 s of idleness", WAIT, || {
        (instance(&h)["idle_secs"].as_f64().unwrap_or(0.0) >= 5.0).then_some(())
    });
    assert_eq!(
        instance(&h)["ccu"].as_f64(),
        Some(1.5),
        "the autoscaler undid an operator's size"
    );
    let status = holdfast_admin::render_status(&h.status());
    assert!(status.contains("holdfast ctl scale auto"), "{status}");
    // Given back, the autoscaler scales the idle server down.
    let (code, body) = h.admin_post("/scale?auto=true", None);
    assert_eq!(code, 200, "{body}");
    assert!(instance(&h)["manual_ccu"].is_null());
    wait_for("the autoscaler to scale down", WAIT, || {
        (instance(&h)["ccu"].as_f64().unwrap_or(9.0) < 1.5).then_some(())
    });
}
