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
