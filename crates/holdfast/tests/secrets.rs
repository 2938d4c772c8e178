//! No secret reaches holdfast's log: a `holdfast serve` process at trace level, in front of a
//! real lab, through good and wrong logins and a switchover (which writes the replication
//! password into CHANGE MASTER), logs no password and no password verifier.

use holdfast_lab::{procs, TestLab};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

fn mariadb(port: u16, user: &str, password: &str, sql: &str) -> std::process::Output {
    Command::new("mariadb")
        .args([
            "--protocol=TCP",
            "-h127.0.0.1",
            &format!("-P{port}"),
            &format!("-u{user}"),
            &format!("-p{password}"),
            "-N",
            "-e",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("running the mariadb client")
}

#[test]
fn no_log_line_holds_a_password_or_a_verifier() {
    let lab = TestLab::start(1).expect("a lab with one replica");
    let st = &lab.status;
    let log_path = lab.dir().join("serve-trace.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["serve", "--config"])
        .arg(&st.config)
        .env("RUST_LOG", "trace")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting holdfast serve");
    let proxy: SocketAddr = st.proxy.parse().unwrap();
    procs::wait_tcp(&proxy, Duration::from_secs(30), || true).expect("holdfast listening");

    let ok = mariadb(proxy.port(), &st.app_user, &st.app_password, "SELECT 1");
    assert!(ok.status.success(), "{ok:?}");
    let wrong = mariadb(proxy.port(), &st.app_user, "wrong_secret_xyz", "SELECT 1");
    assert!(!wrong.status.success(), "{wrong:?}");
    let switch = Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["ctl", "--config"])
        .arg(&st.config)
        .args(["switchover", "--to", "node2"])
        .output()
        .unwrap();
    assert!(switch.status.success(), "{switch:?}");
    let after = mariadb(proxy.port(), &st.app_user, &st.app_password, "SELECT 2");
    assert!(after.status.success(), "{after:?}");

    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let _ = serve.wait();
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        text.contains("login refused"),
        "the log is the real one, at trace level"
    );
    let verifiers = holdfast_lab::node_sql(
        lab.primary(),
        "SELECT authentication_string FROM mysql.user WHERE authentication_string <> ''",
    )
    .expect("reading the verifiers");
    let mut secrets: Vec<String> = vec![
        st.app_password.clone(),
        st.monitor_password.clone(),
        holdfast_lab::REPL_PASSWORD.to_string(),
        "wrong_secret_xyz".to_string(),
    ];
    secrets.extend(verifiers.into_iter().filter_map(|r| r.into_iter().next()));
    for secret in &secrets {
        assert!(
            !text.contains(secret.as_str()),
            "the log holds a secret ({} characters) in {}",
            secret.len(),
            log_path.display()
        );
    }
}
