//! Passwords are the server's: a wrong password through holdfast counts where a direct one
//! counts (`max_password_errors` blocks the account as it would directly), and a password
//! changed on the server works at once through holdfast.

use holdfast_it::{CliOutput, Harness, Options};

fn login(h: &Harness, addr: std::net::SocketAddr, user: &str, password: &str) -> CliOutput {
    h.mariadb_as(
        addr,
        user,
        password,
        &["--batch", "-e", "SELECT CURRENT_USER()"],
    )
}

fn error_code(out: &CliOutput) -> Option<u16> {
    let rest = out.stderr.split("ERROR ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn max_password_errors_blocks_the_account_through_holdfast_as_directly() {
    let h = Harness::start_with(Options::default().server_args(&["--max-password-errors=2"]));
    for user in ["via_pe", "direct_pe"] {
        h.root_sql(&format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY 'right'; GRANT USAGE ON *.* TO '{user}'@'%'"
        ));
    }
    let attempts = |addr, user| {
        let wrong1 = error_code(&login(&h, addr, user, "wrong"));
        let wrong2 = error_code(&login(&h, addr, user, "wrong"));
        let right = login(&h, addr, user, "right");
        (wrong1, wrong2, error_code(&right), right)
    };
    let direct = attempts(h.direct(), "direct_pe");
    let via = attempts(h.proxy, "via_pe");
    // Directly: two refusals, then the account is blocked even for the right password.
    assert_eq!(
        (direct.0, direct.1, direct.2),
        (Some(1045), Some(1045), Some(4150)),
        "{:?}",
        direct.3
    );
    assert_eq!(
        (via.0, via.1, via.2),
        (direct.0, direct.1, direct.2),
        "through holdfast: {:?}",
        via.3
    );
    assert_eq!(
        via.3.stderr, direct.3.stderr,
        "the server's own message through holdfast"
    );
    // Unblocked on the server, the account logs in through holdfast again.
    h.root_sql("FLUSH PRIVILEGES");
    let again = login(&h, h.proxy, "via_pe", "right");
    assert_eq!(again.code, Some(0), "{again:?}");
}

#[test]
fn a_password_changed_on_the_server_works_through_holdfast_at_once() {
    let h = Harness::start();
    h.root_sql("CREATE USER 'rot'@'%' IDENTIFIED BY 'first'; GRANT USAGE ON *.* TO 'rot'@'%'");
    let first = login(&h, h.proxy, "rot", "first");
    assert_eq!(first.code, Some(0), "{first:?}");
    h.root_sql("ALTER USER 'rot'@'%' IDENTIFIED BY 'second'");
    let second = login(&h, h.proxy, "rot", "second");
    assert_eq!(second.code, Some(0), "the new password: {second:?}");
    assert!(second.stdout.contains("rot@%"), "{second:?}");
    let old = login(&h, h.proxy, "rot", "first");
    assert_eq!(error_code(&old), Some(1045), "the old password: {old:?}");
}

#[test]
fn expired_and_locked_accounts_get_the_servers_answers() {
    let h = Harness::start();
    for user in ["exp_via", "exp_direct"] {
        h.root_sql(&format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY 'old' PASSWORD EXPIRE; \
             GRANT USAGE ON *.* TO '{user}'@'%'"
        ));
    }
    h.root_sql("CREATE USER 'locked'@'%' IDENTIFIED BY 'pw' ACCOUNT LOCK");
    let sandbox = |addr, user| {
        let query = login(&h, addr, user, "old");
        let change = h.mariadb_as(
            addr,
            user,
            "old",
            &[
                "--batch",
                "-e",
                "SET PASSWORD = PASSWORD('renewed'); SELECT 'set'",
            ],
        );
        let renewed = login(&h, addr, user, "renewed");
        (error_code(&query), change.code, renewed.code, change)
    };
    let direct = sandbox(h.direct(), "exp_direct");
    let via = sandbox(h.proxy, "exp_via");
    // Directly: logged in to the sandbox (1820 for anything but SET PASSWORD), the password
    // changed, and the new one works.
    assert_eq!(
        (direct.0, direct.1, direct.2),
        (Some(1820), Some(0), Some(0)),
        "{:?}",
        direct.3
    );
    assert_eq!(
        (via.0, via.1, via.2),
        (direct.0, direct.1, direct.2),
        "{:?}",
        via.3
    );
    let locked_direct = login(&h, h.direct(), "locked", "pw");
    let locked_via = login(&h, h.proxy, "locked", "pw");
    assert_eq!(error_code(&locked_direct), Some(4151), "{locked_direct:?}");
    assert_eq!(locked_via.stderr, locked_direct.stderr);
}

/// A session that changes its own password keeps working after it moves: holdfast logs it
/// in again on the new primary with the new password (`SET PASSWORD = PASSWORD(..)`,
/// then `SET PASSWORD FOR 'pw'@'%'`; `ALTER USER` needs the CREATE USER privilege). A password given as a hash cannot be
/// logged in with from holdfast: the session says so in `/status` (it can no longer move).
#[test]
fn a_session_that_changes_its_own_password_survives_a_move() {
    use mysql::prelude::Queryable;
    let h = Harness::start_with(Options::default().replicas(1));
    h.root_sql("CREATE USER 'pw'@'%' IDENTIFIED BY 'old'; GRANT ALL ON sbtest.* TO 'pw'@'%'");
    let opts = mysql::OptsBuilder::new()
        .ip_or_hostname(Some(h.proxy.ip().to_string()))
        .tcp_port(h.proxy.port())
        .user(Some("pw"))
        .pass(Some("old"))
        .db_name(Some("sbtest"))
        .prefer_socket(false);
    let mut c = mysql::Conn::new(opts).expect("login as pw");
    c.query_drop("SET @kept = 42").unwrap();
    let moved = |c: &mut mysql::Conn| -> (Option<String>, Option<i64>) {
        let user: Option<String> = c
            .query_first("SELECT CURRENT_USER()")
            .expect("after the move");
        let kept: Option<i64> = c.query_first("SELECT @kept").expect("state kept");
        (user, kept)
    };
    c.query_drop("SET PASSWORD = PASSWORD('new1')").unwrap();
    h.switch_over_to("node2");
    assert_eq!(moved(&mut c), (Some("pw@%".into()), Some(42)));
    c.query_drop("SET PASSWORD FOR 'pw'@'%' = PASSWORD('new2')")
        .unwrap();
    h.switch_over_to("node1");
    assert_eq!(moved(&mut c), (Some("pw@%".into()), Some(42)));
    let out = h.mariadb_as(h.proxy, "pw", "new2", &["--batch", "-e", "SELECT 1"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    // A hash: holdfast cannot log in with it any more, and says so.
    c.query_drop("SET PASSWORD = '*E8D46CE25265E545D225A8A6F1BAF642FEBEE5CB'")
        .unwrap();
    let st = h.status();
    let me = st
        .sessions
        .iter()
        .find(|s| s.user == "pw")
        .expect("the session in /status");
    assert!(!me.can_reauthenticate, "{me:?}");
}
