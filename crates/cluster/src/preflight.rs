//! `holdfast check`, and the same check `serve` runs at start: can the monitor account (and,
//! in managed HA mode, the replication account) log in to every node, and does it hold each
//! privilege the features this configuration turns on need? Every problem says what to run.
//!
//! Privilege names are MariaDB 10.5+'s (10.11 checked: each one below is what the server's
//! own 1227 names for the statement holdfast runs). Privileges an account holds only through
//! a role are not visible here; such an account is told so instead of being refused.

use crate::config::{BackendConfig, Config, Durability, HaMode, Routing};
use crate::control::connect_as;
use crate::control::BackendError;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The logged-in account as information_schema's GRANTEE columns spell it (`'u'@'h'`).
const GRANTEE: &str = "CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
     SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')";

/// Where a privilege must be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `ON *.*`
    Global,
    /// `ON db.*` (a global grant of the same privilege also does).
    Schema(&'static str),
}

/// One privilege holdfast needs, with what needs it.
#[derive(Debug, Clone)]
struct Need {
    /// Any one of these will do (SUPER covers most of the dynamic ones).
    any_of: &'static [&'static str],
    scope: Scope,
    with_grant_option: bool,
    /// The GRANT's privilege list when none is held.
    grant: &'static str,
    why: &'static str,
}

const fn global(any_of: &'static [&'static str], grant: &'static str, why: &'static str) -> Need {
    Need {
        any_of,
        scope: Scope::Global,
        with_grant_option: false,
        grant,
        why,
    }
}

/// What the monitor account needs for the features `cfg` turns on.
fn monitor_needs(cfg: &Config, nodes: usize) -> Vec<Need> {
    let mut needs = vec![Need {
        any_of: &["SELECT"],
        scope: Scope::Schema("mysql"),
        with_grant_option: false,
        grant: "SELECT",
        why: "reads the password verifiers (mysql.global_priv) to check logins itself",
    }];
    let split = cfg.proxy.routing == Routing::Split
        || cfg.listeners.iter().any(|l| l.routing == Routing::Split);
    if nodes > 1 || split || cfg.ha.mode == HaMode::Managed {
        needs.push(global(
            &["SLAVE MONITOR", "SUPER"],
            "SLAVE MONITOR",
            "reads each replica's replication state (SHOW SLAVE STATUS): without it every \
             replica counts as unreachable, reads go to the primary and no replica can be \
             promoted",
        ));
    }
    // Node removal ends the connections of sessions on the node it removes.
    needs.push(global(
        &["CONNECTION ADMIN", "SUPER"],
        "CONNECTION ADMIN",
        "ends other accounts' connections (node removal, fencing an old primary)",
    ));
    if cfg.ha.mode == HaMode::Managed {
        needs.push(global(
            &["REPLICATION SLAVE ADMIN", "SUPER"],
            "REPLICATION SLAVE ADMIN",
            "runs switchovers and failovers (STOP/START SLAVE, CHANGE MASTER, RESET SLAVE, \
             gtid_slave_pos)",
        ));
        needs.push(global(
            &["READ_ONLY ADMIN"],
            "READ_ONLY ADMIN",
            "sets read_only to fence an old primary and open the new one (SUPER does not \
             cover it in MariaDB 10.11)",
        ));
        needs.push(global(
            &["RELOAD"],
            "RELOAD",
            "blocks every write on the old primary during a switchover (FLUSH TABLES WITH \
             READ LOCK)",
        ));
        if cfg.ha.kill_old_primary_connections {
            needs.push(global(
                &["PROCESS"],
                "PROCESS",
                "lists other accounts' connections on an old primary to end them \
                 ([ha] kill_old_primary_connections)",
            ));
        }
        if cfg.ha.durability == Durability::SemiSync {
            needs.push(global(
                &["REPLICATION MASTER ADMIN", "SUPER"],
                "REPLICATION MASTER ADMIN",
                "turns semi-synchronous replication on on the primary ([ha] durability = \
                 \"semi-sync\")",
            ));
        }
    }
    if cfg.ha.commit_markers {
        const MARKERS: [&[&str]; 9] = [
            &["CREATE"],
            &["ALTER"],
            &["SELECT"],
            &["INSERT"],
            &["UPDATE"],
            &["DELETE"],
            &["CREATE ROUTINE"],
            &["ALTER ROUTINE"],
            &["EXECUTE"],
        ];
        for any_of in MARKERS {
            needs.push(Need {
                any_of,
                scope: Scope::Schema("holdfast"),
                with_grant_option: true,
                grant: "ALL PRIVILEGES",
                why: "keeps the commit marker table and the routines every account runs to \
                      write and read its own markers ([ha] commit_markers)",
            });
        }
    }
    if let Some(s) = &cfg.serverless {
        if s.buffer_pool_mib_per_ccu > 0 {
            needs.push(global(
                &["SUPER"],
                "SUPER",
                "resizes the buffer pool when the instance scales \
                 ([serverless] buffer_pool_mib_per_ccu)",
            ));
        }
        if s.max_connections_per_ccu > 0 {
            needs.push(global(
                &["CONNECTION ADMIN", "SUPER"],
                "CONNECTION ADMIN",
                "sets max_connections when the instance scales \
                 ([serverless] max_connections_per_ccu)",
            ));
        }
    }
    needs
}

/// One thing that stops a feature from working, and what to run about it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Problem {
    pub what: String,
    /// SQL to run on the node (as an administrator), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// What the check found on one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeReport {
    pub node: String,
    pub address: String,
    /// Features that will not work until these are fixed.
    pub problems: Vec<Problem>,
    /// Things that may bite later.
    pub warnings: Vec<String>,
}

/// What the check found on every node.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    pub nodes: Vec<NodeReport>,
}

impl Report {
    pub fn problem_count(&self) -> usize {
        self.nodes.iter().map(|n| n.problems.len()).sum()
    }

    /// For a person: one block per node, each problem with its fix.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let verdict = if n.problems.is_empty() {
                "ok"
            } else {
                "PROBLEMS"
            };
            let _ = writeln!(out, "{} ({}): {verdict}", n.node, n.address);
            for p in &n.problems {
                let _ = writeln!(out, "  problem: {}", p.what);
                if let Some(fix) = &p.fix {
                    let _ = writeln!(out, "    run:   {fix}");
                }
            }
            for w in &n.warnings {
                let _ = writeln!(out, "  warning: {w}");
            }
        }
        let _ = write!(
            out,
            "{} problem(s) on {} node(s)",
            self.problem_count(),
            self.nodes.len()
        );
        out
    }
}

/// Checks every node of `nodes` (the `[[backend]]`s, or the members now).
pub async fn check(cfg: &Config, nodes: &[BackendConfig]) -> Report {
    let mut report = Report::default();
    for node in nodes {
        report.nodes.push(check_node(cfg, node, nodes.len()).await);
    }
    report
}

/// [`check`], with every problem logged as an error (with the SQL that fixes it) and every
/// warning as a warning, as `serve` does at start.
pub async fn check_and_log(cfg: &Config, nodes: &[BackendConfig]) -> Report {
    let report = check(cfg, nodes).await;
    for n in &report.nodes {
        for p in &n.problems {
            match &p.fix {
                Some(fix) => tracing::error!(node = %n.node, fix = %fix, "{}", p.what),
                None => tracing::error!(node = %n.node, "{}", p.what),
            }
        }
        for w in &n.warnings {
            tracing::warn!(node = %n.node, "{w}");
        }
    }
    if report.problem_count() == 0 {
        tracing::info!(
            nodes = report.nodes.len(),
            "start-up check: the monitor account can do what this configuration needs"
        );
    }
    report
}

/// Why the monitor cannot log in, in the words the start-up log and clients get.
pub fn login_failure(cfg: &Config, node: &str, e: &BackendError) -> String {
    let user = &cfg.auth.monitor_user;
    match e {
        BackendError::Server { code, message, .. } => {
            let mut s = format!("holdfast cannot log in to {node} as {user}: {code} {message}");
            if *code == 1045 {
                s.push_str(
                    " (check [auth] monitor_password; on a server set up by mariadb-install-db, \
                     the anonymous accounts ''@'localhost' shadow a monitor account @'%' for \
                     local logins: DROP USER ''@'localhost')",
                );
            }
            s
        }
        other => format!("holdfast cannot reach {node} as {user}: {other}"),
    }
}

async fn check_node(cfg: &Config, node: &BackendConfig, nodes: usize) -> NodeReport {
    let mut report = NodeReport {
        node: node.name.clone(),
        address: node.address.clone(),
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let mut conn = match connect_as(
        cfg,
        &node.address,
        &cfg.auth.monitor_user,
        &cfg.auth.monitor_password,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            report.problems.push(Problem {
                what: login_failure(cfg, &node.name, &e),
                fix: None,
            });
            return report;
        }
    };
    let who = conn
        .query(&format!(
            "SELECT CURRENT_USER(), CURRENT_ROLE(), VERSION(), {GRANTEE}"
        ))
        .await;
    let row = match who {
        Ok(r) => r.rows.into_iter().next().unwrap_or_default(),
        Err(e) => {
            report.problems.push(Problem {
                what: format!("the monitor account logged in but cannot run a query: {e}"),
                fix: None,
            });
            return report;
        }
    };
    let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let (account, role, version, grantee) = (col(0), col(1), col(2), col(3));
    if !version_names_privileges(&version) {
        report.warnings.push(format!(
            "server {version}: this check knows MariaDB 10.5+'s privilege names only; \
             compare the account's grants with the README by hand"
        ));
    } else {
        let held = held_privileges(&mut conn, &grantee).await;
        match held {
            Ok(held) => {
                let mut needs = monitor_needs(cfg, nodes);
                if cfg.ha.commit_markers && !public_may_run_the_markers(&mut conn).await {
                    needs.push(global(
                        &["CREATE USER"],
                        "CREATE USER",
                        "lets every account run its marker routines (GRANT EXECUTE ... TO \
                         PUBLIC, which MariaDB allows only with CREATE USER or INSERT on \
                         mysql.*); not needed once those two grants exist: an administrator \
                         may run them instead once holdfast has created the routines",
                    ));
                }
                if cfg.ha.commit_markers && creating_functions_takes_super(&mut conn).await {
                    needs.push(global(
                        &["SUPER"],
                        "SUPER",
                        "creates the commit marker reader (a stored function: with binary \
                         logging on, MariaDB lets only SUPER create one unless \
                         log_bin_trust_function_creators is ON; setting that instead in the \
                         server's configuration also does)",
                    ));
                }
                let missing: Vec<Need> = needs
                    .into_iter()
                    .filter(|need| !is_held(&held, need))
                    .collect();
                add_missing(&mut report, &missing, &grantee, &role);
            }
            Err(e) => report
                .warnings
                .push(format!("cannot read the monitor account's privileges: {e}")),
        }
    }
    if account.starts_with('@') {
        report.problems.push(Problem {
            what: format!(
                "holdfast logged in as {} but the server took it for the anonymous account \
                 {account}: an anonymous account for holdfast's host shadows {}",
                cfg.auth.monitor_user, cfg.auth.monitor_user
            ),
            fix: Some(format!("DROP USER '{}';", account.replacen('@', "'@'", 1))),
        });
    }
    match conn
        .query("SELECT User, Host FROM mysql.user WHERE User = '' ORDER BY Host")
        .await
    {
        Ok(r) => {
            for row in r.rows {
                let host = row.get(1).cloned().flatten().unwrap_or_default();
                report.warnings.push(format!(
                    "anonymous account ''@'{host}': on a server that resolves host names \
                     (skip_name_resolve OFF), a login from {host} as an account that exists \
                     only @'%' (holdfast's monitor, an application) is taken for it and \
                     refused; drop it: DROP USER ''@'{host}';"
                ));
            }
        }
        Err(e) => report
            .warnings
            .push(format!("cannot look for anonymous accounts: {e}")),
    }
    if cfg.ha.mode == HaMode::Managed {
        check_replication_account(cfg, node, &mut report).await;
    }
    report
}

/// Adds one problem per missing privilege, with the GRANT that fixes it.
fn add_missing(report: &mut NodeReport, missing: &[Need], grantee: &str, role: &str) {
    let via_role = if role.is_empty() || role == "NULL" {
        String::new()
    } else {
        format!(
            " (the account also has role {role}, whose privileges this check cannot see: \
             if {role} holds it, ignore this)"
        )
    };
    let mut seen = std::collections::BTreeSet::new();
    for need in missing {
        let on = match need.scope {
            Scope::Global => "*.*".to_string(),
            Scope::Schema(db) => format!("{db}.*"),
        };
        if !seen.insert((need.grant, on.clone())) {
            continue;
        }
        let option = if need.with_grant_option {
            " WITH GRANT OPTION"
        } else {
            ""
        };
        report.problems.push(Problem {
            what: format!(
                "the monitor account lacks {} ON {on}{option}: holdfast {}{via_role}",
                need.any_of.join(" or "),
                need.why
            ),
            fix: Some(format!(
                "GRANT {} ON {on} TO {grantee}{option};",
                need.grant
            )),
        });
    }
}

/// EXECUTE on both marker routines is granted to PUBLIC already.
async fn public_may_run_the_markers(conn: &mut crate::control::BackendConn) -> bool {
    conn.query(
        "SELECT COUNT(*) FROM mysql.procs_priv \
         WHERE User = 'PUBLIC' AND Db = 'holdfast' AND FIND_IN_SET('Execute', Proc_priv)",
    )
    .await
    .ok()
    .and_then(|r| r.rows.into_iter().next())
    .and_then(|row| row.into_iter().next().flatten())
    .is_some_and(|n| n == "2")
}

/// holdfast's marker function is not there yet and the server binlogs without
/// `log_bin_trust_function_creators`: creating it takes SUPER.
async fn creating_functions_takes_super(conn: &mut crate::control::BackendConn) -> bool {
    let r = conn
        .query(
            "SELECT @@global.log_bin, @@global.log_bin_trust_function_creators, \
             (SELECT COUNT(*) FROM information_schema.ROUTINES \
              WHERE ROUTINE_SCHEMA = 'holdfast' AND ROUTINE_TYPE = 'FUNCTION')",
        )
        .await;
    let Some(row) = r.ok().and_then(|r| r.rows.into_iter().next()) else {
        return false;
    };
    let on = |i: usize| {
        row.get(i)
            .cloned()
            .flatten()
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("ON"))
    };
    let none_yet = row.get(2).cloned().flatten().is_some_and(|n| n == "0");
    on(0) && !on(1) && none_yet
}

/// MariaDB 10.5 introduced the privilege names the needs use.
fn version_names_privileges(version: &str) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    version.contains("MariaDB") && (major, minor) >= (10, 5)
}

/// A privilege the account holds: its name, the schema ("" for global) and whether it may
/// grant it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    privilege: String,
    schema: String,
    grantable: bool,
}

async fn held_privileges(
    conn: &mut crate::control::BackendConn,
    grantee: &str,
) -> Result<Vec<Held>, BackendError> {
    let quoted = grantee.replace('\\', "\\\\").replace('\'', "\\'");
    let r = conn
        .query(&format!(
            "SELECT PRIVILEGE_TYPE, IS_GRANTABLE, '' FROM information_schema.USER_PRIVILEGES \
             WHERE GRANTEE = '{quoted}' \
             UNION ALL SELECT PRIVILEGE_TYPE, IS_GRANTABLE, TABLE_SCHEMA \
             FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = '{quoted}'"
        ))
        .await?;
    Ok(r.rows
        .into_iter()
        .map(|row| {
            let col = |i: usize| row.get(i).cloned().flatten().unwrap_or_default();
            Held {
                privilege: col(0),
                grantable: col(1) == "YES",
                schema: col(2),
            }
        })
        .collect())
}

fn is_held(held: &[Held], need: &Need) -> bool {
    held.iter().any(|h| {
        need.any_of
            .iter()
            .any(|p| h.privilege.eq_ignore_ascii_case(p))
            && (h.grantable || !need.with_grant_option)
            && match need.scope {
                Scope::Global => h.schema.is_empty(),
                Scope::Schema(db) => h.schema.is_empty() || h.schema == db,
            }
    })
}

/// In managed mode a replica is pointed at the new primary with `[ha] repl_user`: it must
/// log in from the replicas and hold REPLICATION SLAVE. holdfast can only try from its own
/// host.
async fn check_replication_account(cfg: &Config, node: &BackendConfig, report: &mut NodeReport) {
    let user = &cfg.ha.repl_user;
    match connect_as(cfg, &node.address, user, &cfg.ha.repl_password).await {
        Ok(mut conn) => {
            let ok = conn
                .query(&format!(
                    "SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
                     WHERE GRANTEE = {GRANTEE} AND PRIVILEGE_TYPE IN ('REPLICATION SLAVE', 'SUPER')"
                ))
                .await
                .ok()
                .and_then(|r| r.rows.into_iter().next())
                .and_then(|row| row.into_iter().next().flatten())
                .is_some_and(|n| n != "0");
            if !ok {
                report.problems.push(Problem {
                    what: format!(
                        "the replication account {user} lacks REPLICATION SLAVE: a replica \
                         pointed at {} after a failover cannot replicate",
                        node.name
                    ),
                    fix: Some(format!("GRANT REPLICATION SLAVE ON *.* TO '{user}'@'%';")),
                });
            }
        }
        Err(e) => report.problems.push(Problem {
            what: format!(
                "the replication account ([ha] repl_user = {user}) cannot log in to {}: {e}; \
                 replicas pointed at it after a failover could not replicate",
                node.name
            ),
            fix: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(list: &[(&str, &str, bool)]) -> Vec<Held> {
        list.iter()
            .map(|(p, s, g)| Held {
                privilege: p.to_string(),
                schema: s.to_string(),
                grantable: *g,
            })
            .collect()
    }

    #[test]
    fn super_covers_what_the_server_says_it_covers_and_nothing_more() {
        let h = held(&[("SUPER", "", false)]);
        let slave_monitor = global(&["SLAVE MONITOR", "SUPER"], "SLAVE MONITOR", "");
        let read_only = global(&["READ_ONLY ADMIN"], "READ_ONLY ADMIN", "");
        assert!(is_held(&h, &slave_monitor));
        assert!(!is_held(&h, &read_only));
    }

    #[test]
    fn a_schema_grant_needs_its_grant_option_and_a_global_grant_serves() {
        let need = Need {
            any_of: &["CREATE"],
            scope: Scope::Schema("holdfast"),
            with_grant_option: true,
            grant: "ALL PRIVILEGES",
            why: "",
        };
        assert!(!is_held(&held(&[("CREATE", "holdfast", false)]), &need));
        assert!(is_held(&held(&[("CREATE", "holdfast", true)]), &need));
        assert!(is_held(&held(&[("CREATE", "", true)]), &need));
        assert!(!is_held(&held(&[("CREATE", "other", true)]), &need));
    }

    #[test]
    fn only_mariadb_10_5_and_later_get_a_privilege_check() {
        assert!(version_names_privileges("10.11.19-MariaDB-0+deb12u1-log"));
        assert!(version_names_privileges("11.4.2-MariaDB"));
        assert!(!version_names_privileges("10.4.30-MariaDB"));
        assert!(!version_names_privileges("8.0.36"));
    }

    #[test]
    fn the_needs_follow_the_features_turned_on() {
        let mut cfg = Config::default();
        let base = monitor_needs(&cfg, 1);
        assert!(!base.iter().any(|n| n.grant == "SLAVE MONITOR"));
        assert!(monitor_needs(&cfg, 2)
            .iter()
            .any(|n| n.grant == "SLAVE MONITOR"));
        cfg.ha.mode = HaMode::Managed;
        cfg.ha.durability = Durability::SemiSync;
        cfg.ha.commit_markers = true;
        let grants: Vec<&str> = monitor_needs(&cfg, 1).iter().map(|n| n.grant).collect();
        for g in [
            "REPLICATION SLAVE ADMIN",
            "READ_ONLY ADMIN",
            "RELOAD",
            "REPLICATION MASTER ADMIN",
            "ALL PRIVILEGES",
        ] {
            assert!(grants.contains(&g), "{g} missing from {grants:?}");
        }
    }
}
