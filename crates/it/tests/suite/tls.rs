//! TLS: clients verifying holdfast's certificate (the `mariadb` CLI, `openssl s_client`,
//! PyMySQL, the Rust `mysql` crate with rustls), `require_tls`, a certificate replaced
//! while holdfast runs, and holdfast's own connections to the nodes over TLS, verified.

use holdfast_client::tls::{start_tls, TlsClient, Verify};
use holdfast_it::{have, run_with_deadline, wait_for, Harness, Options};
use holdfast_wire::caps::CLIENT_SSL;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn ca(h: &Harness) -> PathBuf {
    h.lab.status.ca.clone().expect("the lab writes a CA")
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// `openssl s_client -starttls mysql` against `addr`: its output (certificate and
/// verification result).
fn s_client(addr: std::net::SocketAddr, ca: &std::path::Path) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-starttls", "mysql", "-connect"])
        .arg(addr.to_string())
        .args(["-CAfile", &path(ca), "-verify_return_error", "-verify_ip"])
        .arg(addr.ip().to_string())
        .arg("-brief");
    let out = run_with_deadline(cmd, Duration::from_secs(30));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn mariadb_cli_verifies_holdfasts_certificate_and_the_session_is_encrypted_to_the_node() {
    let h = Harness::start();
    let ca = path(&ca(&h));
    let args = [
        "--ssl",
        "--ssl-ca",
        &ca,
        "--ssl-verify-server-cert",
        "--batch",
        "-e",
        "\\s SELECT 'ok' AS tls_login; SHOW SESSION STATUS LIKE 'Ssl_cipher'",
    ];
    let out = h.mariadb(h.proxy, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    // `\s`: the client's own connection (to holdfast) is encrypted.
    assert!(
        out.stdout.contains("Cipher in use is TLS_"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("tls_login\nok"), "{}", out.stdout);
    // The server's view of the session: holdfast's connection to the node is TLS too.
    let cipher = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Ssl_cipher\t"))
        .unwrap_or("");
    assert!(!cipher.is_empty(), "no TLS to the node: {}", out.stdout);

    // The same against a CA that did not sign holdfast's certificate: refused.
    let other = tempdir("other-ca");
    let other = holdfast_lab::generate_tls(&other).expect("another CA");
    let out = h.mariadb(
        h.proxy,
        &[
            "--ssl",
            "--ssl-ca",
            &path(&other.ca),
            "--ssl-verify-server-cert",
            "-e",
            "SELECT 1",
        ],
    );
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(
        out.stderr.contains("certificate") || out.stderr.contains("SSL"),
        "{out:?}"
    );
}

#[test]
fn a_large_result_and_a_large_request_over_tls_match_the_server() {
    let h = Harness::start();
    let ca = path(&ca(&h));
    // About 24 MiB of rows back, and a 4 MiB statement out (read from a file by the
    // CLI): many TLS records each way, and writes that fill the socket.
    let dir = tempdir("large");
    let script = dir.join("large.sql");
    let sql = format!(
        "USE sbtest;\nSELECT seq, REPEAT(CHAR(65 + seq % 26), 1000) FROM seq_1_to_24000;\nSELECT LENGTH('{}');\n",
        "y".repeat(4 << 20)
    );
    std::fs::write(&script, sql).expect("script");
    let source = format!("source {}", script.display());
    let args = [
        "--ssl",
        "--ssl-ca",
        &ca,
        "--ssl-verify-server-cert",
        "--batch",
        "--max-allowed-packet=64M",
        "-e",
        &source,
    ];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_eq!(via.code, Some(0), "{}", via.stderr);
    assert_eq!(direct.code, Some(0), "{}", direct.stderr);
    assert!(
        via.stdout.len() > 24_000_000,
        "{}: {}",
        via.stdout.len(),
        &via.stdout[..via.stdout.len().min(400)]
    );
    assert!(
        via.stdout.ends_with("4194304\n"),
        "the large statement's answer"
    );
    assert!(via.stdout == direct.stdout, "the results differ");
}

#[test]
fn a_pass_through_listener_speaks_tls_on_both_sides() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.listeners.push(holdfast_config::ListenerConfig {
            listen: "127.0.0.1:0".into(),
            mode: holdfast_config::ListenerMode::Passthrough,
            routing: Default::default(),
            trusted_proxies: None,
        })
    }));
    let ca = path(&ca(&h));
    let args = [
        "--ssl",
        "--ssl-ca",
        &ca,
        "--ssl-verify-server-cert",
        "--batch",
        "-e",
        "\\s SELECT 'through' AS pass; SHOW SESSION STATUS LIKE 'Ssl_version'",
    ];
    let out = h.mariadb(h.listeners[0], &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("Cipher in use is TLS_"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("pass\nthrough"), "{}", out.stdout);
    assert!(out.stdout.contains("Ssl_version\tTLSv1."), "{}", out.stdout);
}

#[test]
fn relayed_ed25519_login_runs_inside_tls_on_both_sides() {
    let h = Harness::start();
    let st = &h.lab.status;
    let (Some(user), Some(password)) = (&st.ed25519_user, &st.ed25519_password) else {
        eprintln!("SKIP: the server has no ed25519 plugin");
        return;
    };
    let ca = path(&ca(&h));
    let args = [
        "--ssl",
        "--ssl-ca",
        &ca,
        "--ssl-verify-server-cert",
        "--batch",
        "-e",
        "\\s SELECT CURRENT_USER(); SHOW SESSION STATUS LIKE 'Ssl_version'",
    ];
    let out = h.mariadb_as(h.proxy, user, password, &args);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains("Cipher in use is TLS_"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("Ssl_version\tTLSv1."), "{}", out.stdout);
}

#[test]
fn openssl_starttls_mysql_sees_holdfasts_certificate_verified() {
    let h = Harness::start();
    if !have("openssl") {
        eprintln!("SKIP: openssl is not installed");
        return;
    }
    let out = s_client(h.proxy, &ca(&h));
    assert!(out.contains("Verification: OK"), "{out}");
    assert!(
        out.contains("CN=holdfast") || out.contains("CN = holdfast"),
        "{out}"
    );
}

#[test]
fn require_tls_refuses_a_clear_login_as_the_server_does_and_accepts_tls() {
    let h = Harness::start_with(Options::default().config(|c| c.tls.require_tls = true));
    let clear = h.mariadb(h.proxy, &["--skip-ssl", "-e", "SELECT 1"]);
    assert_eq!(clear.code, Some(1), "{clear:?}");
    // MariaDB's own answer under require_secure_transport.
    assert!(
        clear.stderr.contains(
            "ERROR 1045 (28000): Access denied for user 'app'@'127.0.0.1' (using password: YES)"
        ),
        "{clear:?}"
    );
    let ca = path(&ca(&h));
    let tls = h.mariadb(
        h.proxy,
        &[
            "--ssl",
            "--ssl-ca",
            &ca,
            "--ssl-verify-server-cert",
            "--batch",
            "-e",
            "SELECT 7",
        ],
    );
    assert_eq!(tls.code, Some(0), "{tls:?}");
    assert!(tls.stdout.contains("7\n7"), "{tls:?}");
}

#[test]
fn pymysql_verifies_holdfast_with_the_lab_ca() {
    let h = Harness::start();
    if !have("python3") {
        eprintln!("SKIP: python3 is not installed");
        return;
    }
    let script = r#"
import ssl, sys
try:
    import pymysql
except ImportError:
    print("SKIP: PyMySQL is not installed"); sys.exit(77)
host, port, user, password, db, ca = sys.argv[1:7]
cnx = pymysql.connect(host=host, port=int(port), user=user, password=password, database=db,
                      ssl_ca=ca, ssl_verify_cert=True, ssl_verify_identity=True,
                      connect_timeout=10)
assert isinstance(cnx._sock, ssl.SSLSocket), type(cnx._sock)
print("version", cnx._sock.version())
cur = cnx.cursor()
cur.execute("SELECT %s", ("tls works",))
assert cur.fetchone() == ("tls works",)
cnx.close()
try:
    bad = ssl.create_default_context(cafile=sys.argv[7])
    pymysql.connect(host=host, port=int(port), user=user, password=password, ssl=bad,
                    connect_timeout=10)
    print("connected with the wrong CA"); sys.exit(1)
except pymysql.err.OperationalError as e:
    print("refused as expected:", e)
"#;
    let other = tempdir("py-other-ca");
    let other = holdfast_lab::generate_tls(&other).expect("another CA");
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(script)
        .arg(h.proxy.ip().to_string())
        .arg(h.proxy.port().to_string())
        .args([h.user(), h.password(), h.database()])
        .arg(ca(&h))
        .arg(&other.ca);
    let out = run_with_deadline(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(77) {
        eprintln!("{stdout}");
        return;
    }
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("version TLSv1."), "{stdout}");
    assert!(stdout.contains("refused as expected"), "{stdout}");
}

#[test]
fn rust_mysql_crate_with_rustls_verifies_holdfast() {
    use mysql::prelude::Queryable;
    let h = Harness::start();
    let opts = |ca: PathBuf| {
        mysql::OptsBuilder::new()
            .ip_or_hostname(Some(h.proxy.ip().to_string()))
            .tcp_port(h.proxy.port())
            .user(Some(h.user()))
            .pass(Some(h.password()))
            .db_name(Some(h.database()))
            .prefer_socket(false)
            .ssl_opts(Some(
                mysql::SslOpts::default().with_root_cert_path(Some(ca)),
            ))
    };
    let mut conn = mysql::Conn::new(opts(ca(&h))).expect("TLS login with the lab CA");
    let v: Option<String> = conn.query_first("SELECT 'rustls'").expect("query");
    assert_eq!(v.as_deref(), Some("rustls"));
    let other = tempdir("rs-other-ca");
    let other = holdfast_lab::generate_tls(&other).expect("another CA");
    let Err(e) = mysql::Conn::new(opts(other.ca)) else {
        panic!("a login verified against the wrong CA succeeded");
    };
    assert!(format!("{e}").to_lowercase().contains("certificate"), "{e}");
}

#[test]
fn a_replaced_certificate_is_served_to_new_connections() {
    if !have("openssl") {
        eprintln!("SKIP: openssl is not installed");
        return;
    }
    let h = Harness::start_with(Options::default().config(|c| c.tls.reload_check_secs = 1));
    let before = s_client(h.proxy, &ca(&h));
    assert!(before.contains("Verification: OK"), "{before}");
    // A new CA and certificate pair, copied over the files holdfast serves.
    let fresh = tempdir("fresh-cert");
    let fresh = holdfast_lab::generate_tls(&fresh).expect("new certificates");
    let served = h.lab.status.tls().expect("lab TLS files");
    std::fs::copy(&fresh.holdfast_key, &served.holdfast_key).expect("key");
    std::fs::copy(&fresh.holdfast_cert, &served.holdfast_cert).expect("cert");
    wait_for(
        "holdfast to serve the new certificate",
        Duration::from_secs(20),
        || {
            s_client(h.proxy, &fresh.ca)
                .contains("Verification: OK")
                .then_some(())
        },
    );
    // And the old CA no longer verifies it.
    assert!(!s_client(h.proxy, &ca(&h)).contains("Verification: OK"));
}

#[test]
fn node_certificates_are_verified_by_name_or_only_by_chain() {
    let h = Harness::start();
    let st = &h.lab.status;
    let node = h.lab.primary().address.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let other = tempdir("node-other-ca");
    let other = holdfast_lab::generate_tls(&other).expect("another CA");
    let handshake = |ca: PathBuf, verify: Verify, host: &'static str| {
        let node = node.clone();
        rt.block_on(async move {
            let tls = TlsClient::new(&ca, verify, None).expect("CA loads");
            let (mut conn, greeting) = holdfast_client::open(&node, Duration::from_secs(10))
                .await
                .expect("greeting");
            let login = holdfast_wire::handshake::LoginRequest {
                capabilities: holdfast_client::DEFAULT_CAPABILITIES | CLIENT_SSL,
                max_packet: 1 << 24,
                charset: 45,
                user: b"app".to_vec(),
                auth_response: Vec::new(),
                database: None,
                auth_plugin: Vec::new(),
                attributes: Vec::new(),
                mariadb_caps: 0,
            };
            start_tls(&mut conn, &greeting, &tls, host, &login).await
        })
    };
    let lab_ca = st.ca.clone().expect("lab CA");
    handshake(lab_ca.clone(), Verify::Full, "127.0.0.1").expect("verify-full by IP");
    let wrong_name = handshake(lab_ca.clone(), Verify::Full, "db.example");
    assert!(
        format!("{:?}", wrong_name.err()).contains("NotValidForName"),
        "verify-full must check the name"
    );
    handshake(lab_ca, Verify::Ca, "db.example").expect("verify-ca ignores the name");
    // Both lab CAs have the same name: the chain is refused on its signature.
    let wrong_ca = format!("{:?}", handshake(other.ca, Verify::Ca, "127.0.0.1").err());
    assert!(
        wrong_ca.contains("BadSignature") || wrong_ca.contains("UnknownIssuer"),
        "a CA that did not sign the node's certificate must be refused: {wrong_ca}"
    );
}

#[test]
fn an_ssl_request_followed_by_garbage_or_silence_is_closed_never_hung() {
    use holdfast_it::raw::RawConn;
    use std::io::{Read, Write};
    let h = Harness::start_with(Options::default().config(|c| c.proxy.handshake_timeout_ms = 2000));
    let ssl_request =
        holdfast_wire::handshake::ssl_request(holdfast_client::DEFAULT_CAPABILITIES, 1 << 24, 45);
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[][..]] {
        let mut c = RawConn::greet(h.proxy).expect("greeting");
        c.write_packet(&ssl_request, 1).expect("SSL request");
        c.stream.write_all(garbage).expect("garbage");
        c.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut rest = Vec::new();
        // Closed by holdfast (a TLS alert at most; a reset when it left garbage unread),
        // before the read timeout.
        if let Err(e) = c.stream.read_to_end(&mut rest) {
            assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{garbage:?}: still open after 10 s"
            );
        }
    }
    // holdfast still serves.
    let ok = h.mariadb(h.proxy, &["-e", "SELECT 1"]);
    assert_eq!(ok.code, Some(0), "{ok:?}");
}

#[test]
fn min_version_1_3_refuses_tls_1_2() {
    if !have("openssl") {
        eprintln!("SKIP: openssl is not installed");
        return;
    }
    let tls12 = |h: &Harness| {
        let mut cmd = Command::new("openssl");
        cmd.args([
            "s_client",
            "-starttls",
            "mysql",
            "-tls1_2",
            "-brief",
            "-connect",
        ])
        .arg(h.proxy.to_string());
        let out = run_with_deadline(cmd, Duration::from_secs(30));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let h = Harness::start();
    let out = tls12(&h);
    assert!(out.contains("Protocol version: TLSv1.2"), "{out}");
    drop(h);
    let h = Harness::start_with(
        Options::default().config(|c| c.tls.min_version = holdfast_config::TlsVersion::V1_3),
    );
    let out = tls12(&h);
    assert!(!out.contains("Protocol version: TLSv1.2"), "{out}");
    assert!(out.contains("alert") || out.contains("error"), "{out}");
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("holdfast-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The lab's servers with MariaDB's test plugins loadable (their maturity is "unknown").
fn test_plugins() -> Options {
    Options::default().server_args(&["--plugin-maturity=unknown"])
}

/// An account whose password the client sends in clear: MariaDB's own
/// `cleartext_plugin_server` (auth_test_plugin.so) asks for the `mysql_clear_password`
/// client plugin, as PAM accounts ask for `dialog`. Made on the primary only (the replicas
/// have no such plugin). None when the server does not ship the plugin.
fn clear_password_account(h: &Harness) -> Option<(&'static str, &'static str)> {
    let plugin_dir = h.root_sql("SELECT @@plugin_dir");
    let dir = plugin_dir.first()?.first()?.clone();
    if !std::path::Path::new(&dir)
        .join("auth_test_plugin.so")
        .exists()
    {
        return None;
    }
    h.root_sql(
        "SET SESSION sql_log_bin = 0; \
         INSTALL SONAME 'auth_test_plugin'; \
         CREATE USER 'clear_pw'@'%' IDENTIFIED VIA cleartext_plugin_server USING 'clear secret'; \
         GRANT SELECT ON *.* TO 'clear_pw'@'%'",
    );
    Some(("clear_pw", "clear secret"))
}

/// A TLS client's password sent in clear (`mysql_clear_password`, PAM's `dialog`,
/// caching_sha2_password's full authentication) never leaves holdfast over a plain link to
/// the server: with `[backend_tls]` off the relayed login is refused before the client
/// sends the password, with 1251 and a message naming what to turn on.
#[test]
fn a_clear_text_password_is_not_relayed_over_a_plain_backend_link() {
    let h = Harness::start_with(test_plugins().config(|c| {
        c.backend_tls.mode = holdfast_config::BackendTlsMode::Disabled;
    }));
    let Some((user, password)) = clear_password_account(&h) else {
        eprintln!("SKIP: the server has no auth_test_plugin.so");
        return;
    };
    let ca = path(&ca(&h));
    let tls_args = [
        "--ssl",
        "--ssl-ca",
        &ca,
        "--ssl-verify-server-cert",
        "--batch",
        "-e",
        "SELECT CURRENT_USER()",
    ];
    // The account works when the client speaks to the server itself.
    let direct = h.mariadb_as(h.direct(), user, password, &["--batch", "-e", "SELECT 1"]);
    assert_eq!(direct.code, Some(0), "{direct:?}");
    let out = h.mariadb_as(h.proxy, user, password, &tls_args);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("ERROR 1251 (08004)") && out.stderr.contains("[backend_tls]"),
        "{out:?}"
    );
    // Other logins go on as before over the plain link.
    let app = h.mariadb(h.proxy, &tls_args);
    assert_eq!(app.code, Some(0), "{app:?}");
    // A change of user to the account is refused the same way; the session then ends (its
    // backend connection was left mid-authentication).
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&h.url()).expect("url"))
        .prefer_socket(false);
    let mut c = mysql::Conn::new(opts).expect("connect through holdfast");
    let change = mysql::ChangeUserOpts::DEFAULT
        .with_user(Some(user.to_string()))
        .with_pass(Some(password.to_string()));
    match c.change_user(change) {
        Err(mysql::Error::MySqlError(e)) => {
            assert_eq!(e.code, 1251, "{e:?}");
            assert!(e.message.contains("[backend_tls]"), "{e:?}");
        }
        other => panic!("expected ERR 1251, got {other:?}"),
    }
    let m = h.metrics();
    assert_eq!(
        holdfast_it::metric(
            &m,
            "holdfast_client_connections_rejected_total{reason=\"auth_method_unsupported\"}"
        ),
        Some(1.0),
        "{m}"
    );
}

/// With `[backend_tls]` on (the lab's default) the same login is relayed inside TLS on
/// both sides.
#[test]
fn a_clear_text_password_is_relayed_inside_backend_tls() {
    let h = Harness::start_with(test_plugins());
    let Some((user, password)) = clear_password_account(&h) else {
        eprintln!("SKIP: the server has no auth_test_plugin.so");
        return;
    };
    let ca = path(&ca(&h));
    let out = h.mariadb_as(
        h.proxy,
        user,
        password,
        &[
            "--ssl",
            "--ssl-ca",
            &ca,
            "--ssl-verify-server-cert",
            "--batch",
            "-e",
            "SELECT CURRENT_USER(); SHOW SESSION STATUS LIKE 'Ssl_version'",
        ],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("clear_pw@%"), "{out:?}");
    assert!(out.stdout.contains("Ssl_version\tTLSv1."), "{out:?}");
}

/// A PAM account (MariaDB's `auth_pam` with a service whose module asks questions: the
/// server switches to the `dialog` client plugin, whose answers are in clear). Made on the
/// primary only. None when the server does not ship the plugin or the test module.
fn pam_account(h: &Harness) -> Option<&'static str> {
    let plugin_dir = h.root_sql("SELECT @@plugin_dir");
    let dir = std::path::PathBuf::from(plugin_dir.first()?.first()?);
    let module = dir.join("test_pam_modules/pam_mariadb_mtr.so");
    if !dir.join("auth_pam.so").exists() || !module.exists() {
        return None;
    }
    // A PAM service of this test's own (the module asks "Enter:" and "PIN:").
    let service = format!("holdfast_it_{}", std::process::id());
    let file = format!("/etc/pam.d/{service}");
    std::fs::write(
        &file,
        format!(
            "auth required {0}\naccount required {0}\n",
            module.display()
        ),
    )
    .ok()?;
    h.root_sql(&format!(
        "SET SESSION sql_log_bin = 0; \
         INSTALL SONAME 'auth_pam'; \
         CREATE USER 'pam_user'@'%' IDENTIFIED VIA pam USING '{service}'"
    ));
    Some("pam_user")
}

/// The PAM case of the test above: the `dialog` plugin's answers are in clear too; the
/// login is refused at the server's switch to it, before the client is asked anything.
#[test]
fn a_pam_login_is_not_relayed_over_a_plain_backend_link() {
    let h = Harness::start_with(Options::default().config(|c| {
        c.backend_tls.mode = holdfast_config::BackendTlsMode::Disabled;
    }));
    let Some(user) = pam_account(&h) else {
        eprintln!("SKIP: no auth_pam.so / pam_mariadb_mtr.so, or /etc/pam.d is not writable");
        return;
    };
    let ca = path(&ca(&h));
    let out = h.mariadb_as(
        h.proxy,
        user,
        "anything",
        &[
            "--ssl",
            "--ssl-ca",
            &ca,
            "--ssl-verify-server-cert",
            "--batch",
            "-e",
            "SELECT CURRENT_USER()",
        ],
    );
    let _ = std::fs::remove_file(format!("/etc/pam.d/holdfast_it_{}", std::process::id()));
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("ERROR 1251 (08004)")
            && out.stderr.contains("dialog (PAM)")
            && out.stderr.contains("[backend_tls]"),
        "{out:?}"
    );
}
