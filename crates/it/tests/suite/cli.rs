//! The `mariadb` command-line client through holdfast, compared with the server itself.

use holdfast_it::{CliOutput, Harness, Options};
use mysql::prelude::*;

/// Replaces the host part of `'user'@'host'` so messages from holdfast (which sees the
/// client as 127.0.0.1) and the server (which may resolve it to localhost) compare.
fn without_host(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("'@'") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        match rest.find('\'') {
            Some(j) => {
                out.push_str("HOST");
                rest = &rest[j..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

fn assert_same(what: &str, via: &CliOutput, direct: &CliOutput) {
    assert_eq!(
        via, direct,
        "{what}: holdfast (left) and the server (right) differ"
    );
}

#[test]
fn select_use_and_show_warnings_match_the_server() {
    let h = Harness::start();
    let sql = "SELECT 1 AS one, 'two' AS two, NULL AS n, 'tab\there' AS esc; \
               USE mysql; SELECT DATABASE() AS db; \
               SELECT 1/0 AS x; SHOW WARNINGS; \
               SELECT COUNT(*) > 0 AS has_users FROM mysql.user";
    let args = ["--batch", "sbtest", "-e", sql];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_eq!(via.code, Some(0), "{via:?}");
    assert_same("SELECT/USE/SHOW WARNINGS", &via, &direct);
    assert!(
        via.stdout
            .contains("one\ttwo\tn\tesc\n1\ttwo\tNULL\ttab\\there\n"),
        "{}",
        via.stdout
    );
    assert!(via.stdout.contains("db\nmysql\n"), "{}", via.stdout);
    assert!(
        via.stdout.contains("Warning\t1365\tDivision by 0"),
        "{}",
        via.stdout
    );
}

#[test]
fn multi_statement_text_with_an_error_in_the_middle_matches_the_server() {
    let h = Harness::start();
    // A changed delimiter makes the CLI send the whole text as one COM_QUERY: several
    // result sets, then an ERR that ends the response.
    let sql = "delimiter //\nSELECT 1 AS a; SELECT 'b' AS b, 2 AS c; SELECT * FROM no_such_table; SELECT 3 AS d//\nSELECT 'after' AS e//";
    for extra in [&[][..], &["--force"][..]] {
        let mut args = vec!["--batch", "sbtest"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-e", sql]);
        let via = h.mariadb(h.proxy, &args);
        let direct = h.mariadb(h.direct(), &args);
        assert_same(&format!("multi-statement {extra:?}"), &via, &direct);
        assert_eq!(via.code, Some(1), "{via:?}");
        assert!(
            via.stdout.starts_with("a\n1\nb\tc\nb\t2\n"),
            "{}",
            via.stdout
        );
        assert!(via.stderr.contains("ERROR 1146 (42S02)"), "{}", via.stderr);
        assert!(
            !via.stdout.contains("\n3\n"),
            "statements after the error must not run: {}",
            via.stdout
        );
    }
}

#[test]
fn load_data_local_infile() {
    let h = Harness::start_with(Options::default().server_args(&["--local-infile=1"]));
    let file = h.lab.dir().join("rows.tsv");
    let mut text = String::new();
    for i in 0..5000 {
        text.push_str(&format!("{i}\tvalue-{i}\n"));
    }
    std::fs::write(&file, text).unwrap();
    let sql = format!(
        "CREATE TABLE loaded (id INT PRIMARY KEY, v VARCHAR(32)); \
         LOAD DATA LOCAL INFILE '{}' INTO TABLE loaded; \
         SELECT COUNT(*), SUM(id), MAX(v) FROM loaded",
        file.display()
    );
    let out = h.mariadb(
        h.proxy,
        &[
            "--batch",
            "--skip-column-names",
            "--local-infile=1",
            "sbtest",
            "-e",
            &sql,
        ],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "5000\t12497500\tvalue-999\n");
    // The session is usable afterwards, and the rows are really on the server.
    assert_eq!(
        h.root_sql("SELECT COUNT(*) FROM sbtest.loaded"),
        vec![vec!["5000".to_string()]]
    );
}

#[test]
fn wrong_password_gives_the_servers_1045() {
    let h = Harness::start();
    let args = ["--batch", "sbtest", "-e", "SELECT 1"];
    let via = h.mariadb_as(h.proxy, "app", "not-the-password", &args);
    let direct = h.mariadb_as(h.direct(), "app", "not-the-password", &args);
    assert_eq!(via.code, Some(1));
    assert!(
        via.stderr
            .starts_with("ERROR 1045 (28000): Access denied for user 'app'@"),
        "{}",
        via.stderr
    );
    assert_eq!(without_host(&via.stderr), without_host(&direct.stderr));
    assert_eq!(via.code, direct.code);
    assert!(via.stdout.is_empty());
    // An unknown user is refused the same way.
    let via = h.mariadb_as(h.proxy, "nobody", "x", &args);
    let direct = h.mariadb_as(h.direct(), "nobody", "x", &args);
    assert!(
        via.stderr.starts_with("ERROR 1045 (28000)"),
        "{}",
        via.stderr
    );
    assert_eq!(without_host(&via.stderr), without_host(&direct.stderr));
}

#[test]
fn unknown_database_at_connect_gives_the_servers_1049() {
    let h = Harness::start();
    let args = ["--batch", "no_such_db", "-e", "SELECT 1"];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_same("unknown database", &via, &direct);
    assert!(
        via.stderr
            .contains("ERROR 1049 (42000): Unknown database 'no_such_db'"),
        "{}",
        via.stderr
    );
}

/// Drops the CLI's timings, e.g. `(0.001 sec)`.
fn without_timing(s: &str) -> String {
    s.lines()
        .map(|l| match l.rfind(" (") {
            Some(i) if l.ends_with(" sec)") => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn verbose_cli_shows_the_servers_info_lines() {
    let h = Harness::start();
    let sql =
        "CREATE TEMPORARY TABLE t (x INT); INSERT INTO t VALUES (1), (2); UPDATE t SET x = x + 1";
    let args = ["-vvv", "sbtest", "-e", sql];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_eq!(via.code, Some(0), "{via:?}");
    assert!(
        without_timing(&direct.stdout).contains("Records: 2  Duplicates: 0  Warnings: 0"),
        "{}",
        direct.stdout
    );
    assert_eq!(without_timing(&via.stdout), without_timing(&direct.stdout));
}

/// An ed25519 account: holdfast cannot verify it, so the exchange is relayed to the server,
/// which sends its own nonce; the right password logs in, a wrong one gets the server's 1045.
#[test]
fn ed25519_account_logs_in_through_the_relay() {
    let h = Harness::start();
    let (user, password) = (holdfast_lab::ED25519_USER, holdfast_lab::ED25519_PASSWORD);
    let args = ["--batch", "-N", "-e", "SELECT CURRENT_USER()"];
    let via = h.mariadb_as(h.proxy, user, password, &args);
    assert_eq!(via.code, Some(0), "{via:?}");
    assert_eq!(via.stdout.trim(), format!("{user}@%"));
    let via = h.mariadb_as(h.proxy, user, "not-the-password", &args);
    let direct = h.mariadb_as(h.direct(), user, "not-the-password", &args);
    assert_eq!(via.code, Some(1));
    assert!(
        via.stderr.starts_with("ERROR 1045 (28000)"),
        "{}",
        via.stderr
    );
    assert_eq!(without_host(&via.stderr), without_host(&direct.stderr));
}

/// Issue 18, item 16: a primary that asks for a client file for a statement that is not
/// `LOAD DATA LOCAL` (a real MariaDB never does: it sends the request only while running
/// `LOAD DATA LOCAL INFILE`, for the file that statement names; this one is compromised,
/// played by `RogueServerMock` in front of the real primary) gets no file: the client gets
/// 1148 saying why instead of the request, holdfast answers the server with an empty file
/// and drops its answer, and the session goes on. A real `LOAD DATA LOCAL` still works.
/// (`[backend_tls]` off: the mock reads the protocol.)
#[test]
fn a_primary_asking_for_a_file_the_statement_did_not_name_gets_nothing() {
    use holdfast_it::rogue::RogueServerMock;
    let secret =
        std::env::temp_dir().join(format!("holdfast-primary-secret-{}", std::process::id()));
    std::fs::write(&secret, "the client's secret\n").expect("write the client's file");
    let mock: std::sync::Arc<std::sync::Mutex<Option<RogueServerMock>>> = Default::default();
    let slot = mock.clone();
    let asked = secret.display().to_string();
    let h = Harness::start_with(Options::default().config(move |c| {
        c.backend_tls.mode = holdfast_config::BackendTlsMode::Disabled;
        let primary = &mut c.backends[0];
        let rogue = RogueServerMock::start(primary.address.parse().expect("address"), &asked);
        primary.address = rogue.addr.to_string();
        *slot.lock().unwrap() = Some(rogue);
    }));
    let mock = mock.lock().unwrap().take().expect("the mock");
    let out = h.mariadb(
        h.proxy,
        &[
            "--local-infile=1",
            "--batch",
            "--skip-column-names",
            "-e",
            &format!("SELECT '{}'", RogueServerMock::TRIGGER),
        ],
    );
    let record = mock.record();
    assert_eq!(record.requests, 1, "{record:?} {out:?}");
    assert!(
        record.stolen.is_empty(),
        "the client's file reached the rogue primary: {:?}",
        String::from_utf8_lossy(&record.stolen)
    );
    assert!(
        out.stderr.contains("ERROR 1148 (42000)") && out.stderr.contains("LOCAL INFILE"),
        "{out:?}"
    );
    // A session goes on after the refusal.
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&h.url()).expect("url"))
        .prefer_socket(false);
    let mut c = mysql::Conn::new(opts).expect("connect through holdfast");
    match c.query_drop(format!("SELECT '{}'", RogueServerMock::TRIGGER)) {
        Err(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1148, "{e:?}"),
        other => panic!("expected ERR 1148, got {other:?}"),
    }
    let two: Option<i64> = c.query_first("SELECT 2").expect("the session goes on");
    assert_eq!(two, Some(2));
    // LOAD DATA LOCAL, which does call for the file it names, still loads it.
    let data = std::env::temp_dir().join(format!("holdfast-primary-data-{}", std::process::id()));
    std::fs::write(&data, "1\tone\n2\ttwo\n").expect("write the data file");
    let sql = format!(
        "CREATE TABLE rogue_loaded (id INT PRIMARY KEY, v VARCHAR(8)); \
         LOAD DATA LOCAL INFILE '{}' INTO TABLE rogue_loaded; \
         SELECT COUNT(*) FROM rogue_loaded",
        data.display()
    );
    let out = h.mariadb(
        h.proxy,
        &[
            "--local-infile=1",
            "--batch",
            "--skip-column-names",
            h.database(),
            "-e",
            &sql,
        ],
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "2", "{out:?}");
    let record = mock.record();
    assert_eq!(record.requests, 2, "{record:?}");
    assert!(record.stolen.is_empty(), "{record:?}");
    let _ = std::fs::remove_file(secret);
    let _ = std::fs::remove_file(data);
}
