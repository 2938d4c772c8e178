//! Issue 20, part 2: `POST /reload` (and SIGHUP, `holdfast ctl reload`: crates/holdfast/tests
//! /ctl.rs) puts the configuration file in force while holdfast runs. Live settings apply to
//! the next request or connection without anyone reconnecting; settings only a restart can
//! change are listed and keep their running values; a broken file is refused with its file,
//! line and key, and nothing changes.

use holdfast_it::raw::{
    server_err, split_packets, wait_closed, Closing, RawConn, ServerErr, BASE_CAPS,
};
use holdfast_it::{wait_for, Harness, Options};
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn login(h: &Harness) -> anyhow::Result<RawConn> {
    RawConn::connect(h.proxy, h.user(), h.password(), None, BASE_CAPS)
}

/// The keys of a report's `applied` or `needs_restart` list.
fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["key"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The configuration running, written as the file holdfast runs from and put in force
/// once: the file names password files where the harness's configuration had the
/// passwords inline, nothing else differs.
fn from_file(h: &Harness) -> holdfast_config::Config {
    let cfg = (*h.shared.config_snapshot()).clone();
    h.write_config(&cfg);
    let v = reload_ok(h);
    assert!(
        keys(&v["applied"])
            .iter()
            .all(|k| k.ends_with("_password_file")),
        "{v:#}"
    );
    assert!(keys(&v["needs_restart"]).is_empty(), "{v:#}");
    (*h.shared.config_snapshot()).clone()
}

/// `POST /reload`, which must succeed.
fn reload_ok(h: &Harness) -> serde_json::Value {
    let (code, v) = h.reload();
    assert_eq!(code, 200, "{v:#}");
    v
}

#[test]
fn a_lowered_limit_refuses_new_connections_and_keeps_open_sessions() {
    let h = Harness::start();
    let mut cfg = from_file(&h);
    let mut a = login(&h).expect("login");
    let mut b = login(&h).expect("login");

    // Two connections open, the limit lowered to two and the packet limit to 16 KiB.
    cfg.proxy.max_connections = 2;
    cfg.proxy.max_packet_size = 16 * 1024;
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert_eq!(
        keys(&v["applied"]),
        ["proxy.max_connections", "proxy.max_packet_size"],
        "{v:#}"
    );
    assert_eq!(v["applied"][0]["from"], "10000", "{v:#}");
    assert_eq!(v["applied"][0]["to"], "2", "{v:#}");
    assert!(keys(&v["needs_restart"]).is_empty(), "{v:#}");

    // A newcomer gets the server's "Too many connections"; the open sessions go on.
    let e = login(&h).map(|_| ()).unwrap_err();
    let se = server_err(&e).unwrap_or_else(|| panic!("ERR 1040 expected: {e:#}"));
    assert_eq!((se.code, se.state.as_str()), (1040, "08004"), "{se}");
    assert_eq!(a.query_value("SELECT 1").unwrap().as_deref(), Some("1"));
    // An open session's next request sees the new packet limit (the server's ERR 1153):
    // the next one it is asked for after the reload (b was waiting for this one already).
    assert_eq!(b.query_value("SELECT 2").unwrap().as_deref(), Some("2"));
    let mut big = vec![0x03];
    big.extend_from_slice(format!("SELECT '{}'", "b".repeat(20 * 1024)).as_bytes());
    b.command(&big).unwrap();
    match wait_closed(&mut b.stream, Duration::from_secs(20)) {
        Closing::Closed { bytes } => {
            let errs: Vec<ServerErr> = split_packets(&bytes)
                .into_iter()
                .filter(|p| p.first() == Some(&0xff))
                .filter_map(|p| ServerErr::parse(&p).ok())
                .collect();
            assert_eq!(errs.len(), 1, "{bytes:02x?}");
            assert_eq!(errs[0].code, 1153, "{}", errs[0]);
        }
        Closing::StillOpen { bytes } => panic!("not closed after the ERR: {bytes:02x?}"),
    }

    // Raised again: newcomers get in, at once, and a is still there.
    cfg.proxy.max_connections = 10_000;
    cfg.proxy.max_packet_size = 64 << 20;
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert_eq!(v["applied"][0]["to"], "10000", "{v:#}");
    let mut c = login(&h).expect("a login after the limit was raised");
    c.ping().unwrap();
    let mut d = login(&h).expect("a second one");
    d.ping().unwrap();
    assert_eq!(a.query_value("SELECT 2").unwrap().as_deref(), Some("2"));
}

/// Log lines written into memory, for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
    fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn the_log_level_changes_with_a_reload() {
    // The process's logger, as `holdfast serve` installs it (nextest runs each test in a
    // process of its own).
    let log = Captured::default();
    let level = holdfast_proxy::logging::LogLevel::install("info", false, false, log.clone())
        .expect("installing the logger");
    let h = Harness::start();
    h.shared.log_level.set(level).ok().expect("one logger");
    let mut cfg = from_file(&h);
    assert_eq!(h.status_json()["config"]["log_level"], "info");
    const LINE: &str = "configuration reloaded";
    assert_eq!(log.count(LINE), 1, "{}", log.text());

    // warn: the reload's own info line is not written any more.
    cfg.log.level = "warn".into();
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert_eq!(keys(&v["applied"]), ["log.level"], "{v:#}");
    assert_eq!(h.status_json()["config"]["log_level"], "warn");
    reload_ok(&h);
    assert_eq!(log.count(LINE), 1, "{}", log.text());

    // Targets too: the proxy's debug lines (a login writes one) appear.
    cfg.log.level = "warn,holdfast_proxy=debug".into();
    h.write_config(&cfg);
    reload_ok(&h);
    assert_eq!(log.count("session started"), 0, "{}", log.text());
    login(&h).expect("login").ping().unwrap();
    wait_for("a debug line of the login", Duration::from_secs(10), || {
        (log.count("session started") > 0).then_some(())
    });
    assert_eq!(log.count(LINE), 2, "{}", log.text());

    // A level that is none refuses the file; the filter in force stays.
    let text = std::fs::read_to_string(h.config_path()).unwrap();
    h.write_config_text(&text.replace("warn,holdfast_proxy=debug", "loud"));
    let (code, v) = h.reload();
    assert_eq!(code, 400, "{v:#}");
    let error = v["error"].as_str().unwrap();
    assert!(error.contains("key log.level"), "{error}");
    assert_eq!(
        h.status_json()["config"]["log_level"],
        "warn,holdfast_proxy=debug"
    );
}

/// The line (1-based) of the first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"))
        + 1
}

#[test]
fn a_broken_file_is_refused_with_its_line_and_key_and_nothing_changes() {
    let h = Harness::start();
    from_file(&h);
    let path = h.config_path();
    let good = std::fs::read_to_string(&path).unwrap();
    let hash = h.status_json()["config"]["hash"].clone();
    assert_eq!(hash.as_str().map(str::len), Some(64), "{hash}");
    let mut kept = login(&h).expect("login");
    let file = path.display().to_string();
    let line = line_of(&good, "max_connections = ");
    let cases = [
        (
            "a value of the wrong type",
            good.replace("max_connections = 10000", "max_connections = \"many\""),
            format!("invalid config {file}, line {line}, column 19, key proxy.max_connections: invalid type: string \"many\", expected usize"),
        ),
        (
            "an unknown key",
            good.replace("max_connections = 10000", "max_conections = 5"),
            format!("invalid config {file}, line {line}, column 1, key proxy.max_conections: unknown field `max_conections`"),
        ),
        (
            "not TOML",
            good.replace("max_connections = 10000", "max_connections = 5\n[proxy"),
            format!("invalid config {file}, line {}, column 7", line + 1),
        ),
        (
            "a value validation refuses",
            good.replace("max_connections = 10000", "max_connections = 0"),
            format!("invalid config {file}, line {line}, key proxy.max_connections: must be at least 1; nothing changed"),
        ),
    ];
    for (what, text, want) in cases {
        h.write_config_text(&text);
        let (code, v) = h.reload();
        assert_eq!(code, 400, "{what}: {v:#}");
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&want), "{what}: {error}\nwanted: {want}");
        assert!(error.ends_with("nothing changed"), "{what}: {error}");
        // Nothing changed: the file in force, the values, the service.
        let status = h.status_json();
        assert_eq!(status["config"]["hash"], hash, "{what}");
        assert_eq!(h.shared.config().proxy.max_connections, 10_000, "{what}");
        assert_eq!(kept.query_value("SELECT 1").unwrap().as_deref(), Some("1"));
        login(&h).expect("a new login").ping().unwrap();
    }
    // Fixed: in force again, and the hash is the file's.
    h.write_config_text(&good.replace("max_connections = 10000", "max_connections = 500"));
    let v = reload_ok(&h);
    assert_eq!(keys(&v["applied"]), ["proxy.max_connections"], "{v:#}");
    assert_ne!(h.status_json()["config"]["hash"], hash);
    assert_eq!(v["config"]["hash"], h.status_json()["config"]["hash"]);
    assert_eq!(h.shared.config().proxy.max_connections, 500);
}

#[test]
fn a_listener_address_change_waits_for_a_restart_and_nothing_breaks() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.listeners.push(holdfast_config::ListenerConfig {
            listen: "127.0.0.1:0".into(),
            mode: holdfast_config::ListenerMode::Passthrough,
            routing: Default::default(),
            trusted_proxies: None,
        })
    }));
    let mut cfg = from_file(&h);
    let mut open = login(&h).expect("login");
    // The main listener and the extra one move; the hold window changes too.
    let free = |n: usize| holdfast_lab::procs::free_ports(n).expect("free ports");
    let ports = free(2);
    cfg.proxy.listen = format!("127.0.0.1:{}", ports[0]);
    cfg.listeners[0].listen = format!("127.0.0.1:{}", ports[1]);
    cfg.proxy.hold_window_ms = 1_234;
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert_eq!(keys(&v["applied"]), ["proxy.hold_window_ms"], "{v:#}");
    let extra_new = format!("listener.\"127.0.0.1:{}\"", ports[1]);
    assert_eq!(
        keys(&v["needs_restart"]),
        [
            "listener.\"127.0.0.1:0\"",
            extra_new.as_str(),
            "proxy.listen"
        ],
        "{v:#}"
    );
    assert!(
        v["restart_note"]
            .as_str()
            .unwrap_or_default()
            .contains("restart"),
        "{v:#}"
    );
    // /status lists them; the running values stay in force.
    let status = h.status_json();
    assert_eq!(
        keys(&status["config"]["needs_restart"]),
        keys(&v["needs_restart"]),
        "{status:#}"
    );
    let running = h.shared.config();
    assert_eq!(running.proxy.listen, "127.0.0.1:0");
    assert_eq!(running.listeners[0].listen, "127.0.0.1:0");
    assert_eq!(running.proxy.hold_window_ms, 1_234);
    drop(running);
    // Both listeners still serve where they were; nobody listens on the new addresses.
    assert_eq!(open.query_value("SELECT 1").unwrap().as_deref(), Some("1"));
    login(&h).expect("the main listener").ping().unwrap();
    let mut through = RawConn::connect(h.listeners[0], h.user(), h.password(), None, BASE_CAPS)
        .expect("the pass-through listener");
    through.ping().unwrap();
    for p in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "something listens on {p}"
        );
    }
    // The file going back: nothing waits any more.
    cfg.proxy.listen = "127.0.0.1:0".into();
    cfg.listeners[0].listen = "127.0.0.1:0".into();
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert!(keys(&v["needs_restart"]).is_empty(), "{v:#}");
    assert!(v["applied"].as_array().is_some_and(Vec::is_empty), "{v:#}");
    let status = h.status_json();
    assert!(
        status["config"].get("needs_restart").is_none(),
        "{status:#}"
    );
}

#[test]
fn a_reload_without_a_file_is_refused() {
    let h = Harness::start();
    let (code, v) = h.reload();
    assert_eq!(code, 400, "{v:#}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not started from a configuration file"),
        "{v:#}"
    );
    assert!(h.status_json()["config"]["hash"].is_null());
    wait_for("the proxy to serve", Duration::from_secs(10), || {
        login(&h).ok().map(|mut c| c.ping().ok())
    });
    let _ = std::io::stderr().flush();
}

fn replays(h: &Harness, outcome: &str) -> f64 {
    holdfast_it::metric(
        &h.metrics(),
        &format!("holdfast_transaction_replays_total{{reason=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// `[proxy] transaction_replay` changed by a reload applies from the next transaction: one
/// open when it changes is never replayed from a log that misses part of it (its start, or
/// what came after the change), which would commit part of a transaction.
#[test]
fn transaction_replay_changed_by_a_reload_applies_from_the_next_transaction() {
    use mysql::prelude::*;
    let mut h = Harness::start();
    let mut cfg = from_file(&h);
    assert!(cfg.proxy.transaction_replay, "the harness runs with replay");
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&h.url()).expect("url"))
        .prefer_socket(false);
    let mut c = mysql::Conn::new(opts).expect("connect through holdfast");
    let code = |e: &mysql::Error| match e {
        mysql::Error::MySqlError(e) => Some((e.code, e.state.clone())),
        _ => None,
    };
    let set_replay = |h: &Harness, cfg: &mut holdfast_config::Config, on: bool| {
        cfg.proxy.transaction_replay = on;
        h.write_config(cfg);
        let v = reload_ok(h);
        assert_eq!(keys(&v["applied"]), ["proxy.transaction_replay"], "{v:#}");
    };
    c.query_drop("CREATE TABLE sbtest.rl (id INT PRIMARY KEY)")
        .unwrap();

    // Turned off in the middle: the transaction is not replayed (1213), nothing of it kept.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.rl VALUES (1)").unwrap();
    set_replay(&h, &mut cfg, false);
    c.query_drop("INSERT INTO sbtest.rl VALUES (2)").unwrap();
    h.lab.kill_node("node1").expect("kill node1");
    h.lab.start_node("node1").expect("start node1");
    let err = c
        .query_drop("INSERT INTO sbtest.rl VALUES (3)")
        .unwrap_err();
    assert_eq!(code(&err), Some((1213, "40001".into())), "{err}");
    c.query_drop("ROLLBACK").unwrap();

    // Turned on in the middle: the same.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.rl VALUES (10)").unwrap();
    set_replay(&h, &mut cfg, true);
    c.query_drop("INSERT INTO sbtest.rl VALUES (11)").unwrap();
    h.lab.kill_node("node1").expect("kill node1");
    h.lab.start_node("node1").expect("start node1");
    let err = c
        .query_drop("INSERT INTO sbtest.rl VALUES (12)")
        .unwrap_err();
    assert_eq!(code(&err), Some((1213, "40001".into())), "{err}");
    c.query_drop("ROLLBACK").unwrap();
    assert_eq!(replays(&h, "replayed"), 0.0);

    // The next transaction is replayed whole.
    c.query_drop("BEGIN").unwrap();
    c.query_drop("INSERT INTO sbtest.rl VALUES (20)").unwrap();
    h.lab.kill_node("node1").expect("kill node1");
    h.lab.start_node("node1").expect("start node1");
    c.query_drop("INSERT INTO sbtest.rl VALUES (21)")
        .expect("the statement after the crash runs in the replayed transaction");
    c.query_drop("COMMIT").unwrap();
    let ids: Vec<i32> = c.query("SELECT id FROM sbtest.rl ORDER BY id").unwrap();
    assert_eq!(ids, [20, 21], "only the replayed transaction committed");
    assert_eq!(replays(&h, "replayed"), 1.0);
}

/// `openssl s_client -starttls mysql` against `addr`, verifying with `ca`: whether it did.
fn verifies(addr: std::net::SocketAddr, ca: &std::path::Path) -> bool {
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-starttls", "mysql", "-connect"])
        .arg(addr.to_string())
        .arg("-CAfile")
        .arg(ca)
        .args(["-verify_return_error", "-brief"]);
    let out = holdfast_it::run_with_deadline(cmd, Duration::from_secs(30));
    String::from_utf8_lossy(&out.stdout).contains("Verification: OK")
        || String::from_utf8_lossy(&out.stderr).contains("Verification: OK")
}

#[test]
fn a_reload_serves_the_certificate_the_file_names_or_refuses_one_that_does_not_load() {
    if !holdfast_it::have("openssl") {
        eprintln!("SKIP: openssl is not installed");
        return;
    }
    // Only a reload changes the certificate here (no watch of the files).
    let h = Harness::start_with(Options::default().config(|c| c.tls.reload_check_secs = 0));
    let mut cfg = from_file(&h);
    let lab_ca = h.lab.status.ca.clone().expect("the lab writes a CA");
    assert!(verifies(h.proxy, &lab_ca));
    let dir = h.lab.status.dir.join("renewed-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let renewed = holdfast_lab::generate_tls(&dir).expect("new certificates");
    assert!(!verifies(h.proxy, &renewed.ca));

    cfg.tls.cert = Some(renewed.holdfast_cert.clone());
    cfg.tls.key = Some(renewed.holdfast_key.clone());
    h.write_config(&cfg);
    let v = reload_ok(&h);
    assert_eq!(keys(&v["applied"]), ["tls.cert", "tls.key"], "{v:#}");
    // The next connection gets it, at once.
    assert!(verifies(h.proxy, &renewed.ca));
    assert!(!verifies(h.proxy, &lab_ca));

    // A certificate that does not load: refused, the one in force stays.
    let broken = dir.join("broken.pem");
    std::fs::write(&broken, "not a certificate\n").unwrap();
    let good = cfg.clone();
    cfg.tls.cert = Some(broken);
    h.write_config(&cfg);
    let (code, v) = h.reload();
    assert_eq!(code, 400, "{v:#}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(", key tls: ") && error.contains("broken.pem"),
        "{error}"
    );
    assert!(verifies(h.proxy, &renewed.ca));
    assert_eq!(h.shared.config().tls, good.tls);
    let mut c = login(&h).expect("login");
    c.ping().unwrap();
}
