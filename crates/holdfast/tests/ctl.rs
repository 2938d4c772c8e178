//! `holdfast serve` and `holdfast ctl` as processes: the admin token file holdfast generates,
//! the ways `ctl` finds the token, and the refusal to expose the admin API without one. No
//! database is needed: the backend does not answer, and the admin API serves regardless.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn holdfast() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    cmd.env_remove("HOLDFAST_ADMIN_TOKEN")
        .env_remove("HOLDFAST_ADMIN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    cmd
}

fn scratch_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!(
        "holdfast-ctl-{name}-{}-{nanos:09}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A config with an unreachable backend, the proxy on `proxy` and the admin API on `admin`.
fn write_config(dir: &Path, proxy: u16, admin: &str, admin_extra: &str) -> PathBuf {
    let path = dir.join("holdfast.toml");
    std::fs::write(
        &path,
        format!(
            "[proxy]\nlisten = \"127.0.0.1:{proxy}\"\n\n[admin]\nlisten = \"{admin}\"\n{admin_extra}\n\
             [[backend]]\nname = \"node1\"\naddress = \"127.0.0.1:1\"\n"
        ),
    )
    .unwrap();
    path
}

/// `holdfast serve`, killed on drop; its stderr goes to `log`.
struct Served {
    child: Child,
    log: PathBuf,
}

impl Served {
    fn start(config: &Path, log: PathBuf) -> Served {
        let file = std::fs::File::create(&log).unwrap();
        let child = holdfast()
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Served { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `addr` accepts connections.
    fn wait_listening(&mut self, addr: SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("holdfast serve exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "holdfast serve does not listen on {addr}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd`, killing it after 30 s.
fn run(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn serve_generates_a_private_token_file_and_ctl_finds_the_token() {
    let dir = scratch_dir("token");
    let ports = holdfast_lab::procs::free_ports(2).unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", ports[1]).parse().unwrap();
    let config = write_config(&dir, ports[0], &admin.to_string(), "");
    let mut served = Served::start(&config, dir.join("serve.log"));
    served.wait_listening(admin);

    // The token file: beside the config, named after it, 0600, logged by path only.
    let token_file = dir.join("holdfast.admin-token");
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&token_file)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", token_file.display(), served.log()))
            .permissions()
            .mode()
    };
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    assert_eq!(token.len(), 64, "32 random bytes in hex");
    let log = served.log();
    assert!(log.contains(&token_file.display().to_string()), "{log}");
    assert!(!log.contains(token), "the token is logged: {log}");

    // `holdfast ctl ARGS status --json` with HOLDFAST_ADMIN_TOKEN = `env`.
    let status_json = |args: &[&str], env: Option<&str>| -> Output {
        let mut cmd = holdfast();
        cmd.arg("ctl").args(args).args(["status", "--json"]);
        if let Some(t) = env {
            cmd.env("HOLDFAST_ADMIN_TOKEN", t);
        }
        run(cmd)
    };
    let ok = |out: Output, how: &str| {
        assert!(
            out.status.success(),
            "{how}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["topology"]["nodes"][0]["name"], "node1", "{how}");
    };
    let a = admin.to_string();
    let file = token_file.display().to_string();
    let wrong = Some("wrong-wrong-wrong-wrong");
    ok(
        status_json(&["--admin", &a, "--token-file", &file], None),
        "--token-file",
    );
    ok(
        status_json(&["--admin", &a], Some(token)),
        "HOLDFAST_ADMIN_TOKEN",
    );
    // --config: the admin address and the token file from the config.
    let cfg = config.display().to_string();
    ok(status_json(&["--config", &cfg], None), "--config");
    // --token-file comes before the environment, the environment before --config.
    ok(
        status_json(&["--admin", &a, "--token-file", &file], wrong),
        "--token-file before HOLDFAST_ADMIN_TOKEN",
    );
    let out = status_json(&["--config", &cfg], wrong);
    assert!(
        !out.status.success(),
        "HOLDFAST_ADMIN_TOKEN before --config"
    );

    // Without a token, or with a wrong one: refused, and ctl says where a token comes from.
    let out = status_json(&["--admin", &a], None);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("401") && err.contains("--token-file") && err.contains("HOLDFAST_ADMIN_TOKEN"),
        "{err}"
    );
    let out = status_json(&["--admin", &a], wrong);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));

    // A second start reuses the file.
    drop(served);
    let mut served = Served::start(&config, dir.join("serve2.log"));
    served.wait_listening(admin);
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    drop(served);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn serve_refuses_a_non_loopback_admin_listener_without_a_configured_token() {
    let dir = scratch_dir("exposed");
    let ports = holdfast_lab::procs::free_ports(2).unwrap();
    let config = write_config(&dir, ports[0], &format!("0.0.0.0:{}", ports[1]), "");
    let out = run({
        let mut c = holdfast();
        c.args(["serve", "--config"]).arg(&config);
        c
    });
    assert!(!out.status.success(), "holdfast serve started");
    let err = text(&out.stderr);
    assert!(
        err.contains("0.0.0.0")
            && err.contains("not a loopback address")
            && err.contains("token_file"),
        "{err}"
    );
    assert!(!dir.join("holdfast.admin-token").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ctl_node_commands_reach_the_api_and_show_its_refusals() {
    let dir = scratch_dir("nodes");
    let ports = holdfast_lab::procs::free_ports(2).unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", ports[1]).parse().unwrap();
    let config = write_config(&dir, ports[0], &admin.to_string(), "");
    let mut served = Served::start(&config, dir.join("serve.log"));
    served.wait_listening(admin);
    let cfg = config.display().to_string();
    let ctl = |args: &[&str]| {
        let mut cmd = holdfast();
        cmd.args(["ctl", "--config", &cfg]).args(args);
        run(cmd)
    };
    // The only node cannot go; a name that is not a node neither; nothing changes.
    let out = ctl(&["node", "remove", "node1", "--drain-ms", "10"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("only node"),
        "{}",
        text(&out.stderr)
    );
    let out = ctl(&["node", "remove", "nodeX"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no node named"),
        "{}",
        text(&out.stderr)
    );
    // An address where no server answers is not added.
    let out = ctl(&["node", "add", "--name", "node2", "--address", "127.0.0.1:2"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no primary") || err.contains("not a database server"),
        "{err}"
    );
    let out = ctl(&["status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["topology"]["nodes"].as_array().map(Vec::len), Some(1));
    drop(served);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 20, part 2, as an operator sees it: `holdfast ctl reload` prints what applied and
/// what waits for a restart, a broken file is refused (exit 1, file, line and key) and
/// nothing changes, SIGHUP takes the same path (its refusal and success in the log), `ctl
/// status` shows the file in force with the hash `sha256sum` prints, and the log level
/// follows `[log] level`.
#[test]
fn ctl_reload_and_sighup_put_the_file_in_force_or_say_why_not() {
    let dir = scratch_dir("reload");
    let ports = holdfast_lab::procs::free_ports(3).unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", ports[1]).parse().unwrap();
    let config = write_config(&dir, ports[0], &admin.to_string(), "");
    let good = std::fs::read_to_string(&config).unwrap();
    let log_file = dir.join("serve.log");
    let mut served = {
        let file = std::fs::File::create(&log_file).unwrap();
        let child = holdfast()
            .env_remove("RUST_LOG")
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Served {
            child,
            log: log_file.clone(),
        }
    };
    served.wait_listening(admin);
    let cfg = config.display().to_string();
    let ctl = |args: &[&str]| {
        let mut cmd = holdfast();
        cmd.args(["ctl", "--config", &cfg]).args(args);
        run(cmd)
    };
    let sha256 = || {
        let out = Command::new("sha256sum").arg(&config).output().unwrap();
        text(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let status_hash = || {
        let out = ctl(&["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["config"]["hash"].as_str().unwrap_or_default().to_string()
    };
    let wait_log = |needle: &str, times: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = std::fs::read_to_string(&log_file).unwrap_or_default();
            if log.matches(needle).count() >= times {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} x{times} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let start_hash = sha256();
    assert_eq!(status_hash(), start_hash);
    let out = ctl(&["status"]);
    let status = text(&out.stdout);
    assert!(
        status.contains(&format!("config: {cfg}  sha256 {}", &start_hash[..12]))
            && status.contains("log level: info"),
        "{status}"
    );

    // Unchanged: said so.
    let out = ctl(&["reload"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "reloaded {cfg} (sha256 {}, unchanged)",
            &start_hash[..12]
        )) && said.contains("no setting changed"),
        "{said}"
    );

    // A limit and the log level apply; the listener's address waits for a restart.
    let moved = format!("127.0.0.1:{}", ports[2]);
    std::fs::write(
        &config,
        good.replace(&format!("127.0.0.1:{}", ports[0]), &moved)
            .replace(
                "[admin]",
                "max_connections = 5\n\n[log]\nlevel = \"warn\"\n\n[admin]",
            ),
    )
    .unwrap();
    let out = ctl(&["reload"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    for line in [
        "(sha256 ",
        ", changed)",
        "applied now:\n",
        "  log.level: \"info\" -> \"warn\"\n",
        "  proxy.max_connections: 10000 -> 5\n",
        "not applied, need a restart (",
        &format!(
            "  proxy.listen: \"127.0.0.1:{}\" -> \"{moved}\"\n",
            ports[0]
        ),
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    let changed_hash = sha256();
    assert_eq!(status_hash(), changed_hash);
    let status = text(&ctl(&["status"]).stdout);
    assert!(
        status.contains("log level: warn")
            && status.contains(&format!(
                "waits for a restart: proxy.listen: \"127.0.0.1:{}\"",
                ports[0]
            )),
        "{status}"
    );
    // The reload's own info line was not logged under warn.
    assert_eq!(
        served.log().matches("configuration reloaded").count(),
        1,
        "{}",
        served.log()
    );

    // A broken file: refused with its line and key, exit 1, nothing changed.
    let broken = good.replace("[[backend]]", "[[backend]]\nweight = 3");
    std::fs::write(&config, &broken).unwrap();
    let line = broken.lines().position(|l| l == "weight = 3").unwrap() + 1;
    let want = format!(
        "invalid config {cfg}, line {line}, column 1, key backend[0].weight: unknown field `weight`"
    );
    // Asked through the admin address and token: holdfast refuses it.
    let token_file = dir.join("holdfast.admin-token").display().to_string();
    let a = admin.to_string();
    let out = run({
        let mut cmd = holdfast();
        cmd.args(["ctl", "--admin", &a, "--token-file", &token_file, "reload"]);
        cmd
    });
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("reload refused (HTTP 400): {want}"))
            && err.contains("; nothing changed"),
        "{err}"
    );
    // With --config, ctl reads the file itself first and says the same.
    let out = ctl(&["reload"]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains(&want), "{err}");
    let status_hash = || {
        let out = run({
            let mut cmd = holdfast();
            cmd.args(["ctl", "--admin", &a, "--token-file", &token_file])
                .args(["status", "--json"]);
            cmd
        });
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["config"]["hash"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(status_hash(), changed_hash);

    // SIGHUP with the broken file: refused in the log; fixed: in force.
    let hup = || {
        let ok = Command::new("kill")
            .args(["-HUP", &served.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -HUP");
    };
    hup();
    let log = wait_log("reload refused: invalid config", 1);
    assert!(log.contains("key backend[0].weight"), "{log}");
    assert_eq!(status_hash(), changed_hash);
    std::fs::write(&config, &good).unwrap();
    hup();
    // Back to info (the file has no [log]): the reload's line is logged again.
    wait_log("configuration reloaded", 2);
    assert_eq!(status_hash(), start_hash);
    let status = text(&ctl(&["status"]).stdout);
    assert!(
        status.contains("log level: info") && !status.contains("waits for a restart"),
        "{status}"
    );
    drop(served);
    std::fs::remove_dir_all(&dir).unwrap();
}
