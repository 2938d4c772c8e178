//! Stopping `holdfast serve` (SIGTERM) while its serverless instance is frozen thaws the
//! server: clients that reach it directly get answers again, and a holdfast started next
//! finds it running (issue 19). Real processes: `holdfast lab up --serverless`, `holdfast
//! serve`, `holdfast ctl pause`, the `mariadb` client.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{holdfast, run, Lab};

/// A serverless lab on a base port whose layout is free.
fn serverless_lab(dir: &Path) -> u16 {
    common::lab_up(dir, &["--serverless"])
}

fn select_one(port: u16) -> Output {
    run(Command::new("mariadb").args([
        "--no-defaults",
        "--protocol=TCP",
        "-h127.0.0.1",
        &format!("-P{port}"),
        "-uapp",
        "-papp_pass",
        "--connect-timeout=5",
        "-e",
        "SELECT 1",
    ]))
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status_text(config: &Path) -> String {
    let out = run(holdfast()
        .args(["ctl", "--config"])
        .arg(config)
        .arg("status"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn serve(config: &Path, log: &Path) -> Child {
    holdfast()
        .args(["serve", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("starting holdfast serve")
}

#[test]
fn sigterm_while_frozen_thaws_the_server() {
    let dir = std::env::temp_dir().join(format!("hf-sl-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base = serverless_lab(&dir);
    let lab = Lab(dir.clone());
    let config = dir.join("holdfast.toml");
    let node_port = base + 10;

    let mut served = serve(&config, &dir.join("serve.log"));
    wait_until(
        "the instance running behind holdfast",
        Duration::from_secs(60),
        || select_one(base).status.success(),
    );
    let paused = run(holdfast()
        .args(["ctl", "--config"])
        .arg(&config)
        .args(["pause", "--tier", "freeze"]));
    assert!(paused.status.success(), "{paused:?}");
    assert!(status_text(&config).contains("paused (freeze)"));

    let term = run(Command::new("kill").args(["-TERM", &served.id().to_string()]));
    assert!(term.status.success());
    let exited = served.wait().expect("holdfast exits");
    assert!(exited.success(), "holdfast serve exited with {exited}");

    // The server answers a direct client at once (it hung until its connect timeout while
    // frozen).
    let direct = select_one(node_port);
    assert!(
        direct.status.success(),
        "the server stayed suspended after holdfast stopped: {}",
        String::from_utf8_lossy(&direct.stderr)
    );
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    assert!(log.contains("thawed the frozen instance"), "{log}");

    // The next holdfast adopts the running server.
    let mut again = serve(&config, &dir.join("serve2.log"));
    wait_until("holdfast serving again", Duration::from_secs(60), || {
        select_one(base).status.success()
    });
    assert!(
        status_text(&config).contains("running"),
        "{}",
        status_text(&config)
    );
    let _ = Command::new("kill")
        .args(["-TERM", &again.id().to_string()])
        .status();
    let _ = again.wait();
    drop(lab);
}

/// Issue 19: the serverless example config's paths that do not exist on this machine were
/// reported as a 3032 after a 10 s wait at the first login; `serve` names them at start.
#[test]
fn a_serverless_config_whose_paths_do_not_exist_is_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("hf-sl-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../holdfast.serverless.example.toml"
    );
    let config = dir.join("holdfast.toml");
    std::fs::copy(example, &config).expect("copy the example");
    let mut child = holdfast()
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve kept running with a datadir that does not exist");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("datadir /var/lib/holdfast/node1 does not exist")
            && stderr.contains("mariadb-install-db"),
        "{stderr}"
    );
    // Nothing was written beside the config on the way (no admin token file).
    assert!(!dir.join("holdfast.admin-token").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
