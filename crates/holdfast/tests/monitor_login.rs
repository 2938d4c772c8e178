//! A monitor account that cannot log in is said where people look (issue 19, item 2): the
//! start-up log has an ERROR naming the node, the account and the server's 1045, and a
//! client's refused login names the same cause instead of only "no writable node". Real
//! processes: `holdfast lab up`, `holdfast serve` with a wrong monitor password, the
//! `mariadb` client.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{holdfast, run, Lab};

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_wrong_monitor_password_is_named_in_the_start_up_log_and_to_clients() {
    let dir = std::env::temp_dir().join(format!("hf-monitor-login-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base = common::lab_up(&dir, &["--replicas", "0"]);
    let _lab = Lab(dir.clone());

    // The lab's config, with the monitor's password file swapped for a wrong one.
    let lab_config = std::fs::read_to_string(dir.join("holdfast.toml")).expect("the lab config");
    let right = format!("\"{}\"", dir.join("monitor.password").display());
    assert!(lab_config.contains(&right), "{lab_config}");
    let wrong_file = dir.join("wrong.password");
    std::fs::write(&wrong_file, "not-the-monitor-password").expect("write");
    let config = dir.join("wrong.toml");
    let wrong = format!("\"{}\"", wrong_file.display());
    std::fs::write(&config, lab_config.replace(&right, &wrong)).expect("write");
    for file in [&wrong_file, &config] {
        let chmod = run(Command::new("chmod").arg("600").arg(file));
        assert!(chmod.status.success());
    }

    let log = dir.join("serve.log");
    let child = holdfast()
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("starting holdfast serve");
    let _served = Served(child);

    let cause = "holdfast cannot log in to node1 as holdfast_monitor: 1045";
    let line = wait_for(
        "the start-up log to name the cause",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&log)
                .ok()?
                .lines()
                .find(|l| l.contains(cause))
                .map(str::to_string)
        },
    );
    assert!(
        line.contains("ERROR"),
        "logged, but not as an error: {line}"
    );
    assert!(
        line.contains("monitor_password"),
        "no hint what to check: {line}"
    );

    // A client is told the same, not only that no node is writable.
    let out = run(Command::new("mariadb").args([
        "--no-defaults",
        "--protocol=TCP",
        "-h127.0.0.1",
        &format!("-P{base}"),
        "-uapp",
        "-papp_pass",
        "--connect-timeout=30",
        "-e",
        "SELECT 1",
    ]));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a login went through a monitor that cannot log in"
    );
    assert!(said.contains("1053") && said.contains(cause), "{said}");
}
