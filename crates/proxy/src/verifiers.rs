//! The cache of the servers' own password verifiers, read with the monitor account.
//!
//! holdfast never stores a password. For `mysql_native_password` accounts the server keeps
//! `SHA1(SHA1(password))`; with it holdfast checks a client's answer and recovers the
//! `SHA1(password)` needed to log in to any node.

use crate::backend;
use crate::config::Config;
use arc_swap::ArcSwap;
use holdfast_cluster::control::monitor_connect;
use holdfast_wire::auth::parse_native_verifier;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub user: String,
    pub host: String,
    pub plugin: String,
    pub auth_string: String,
}

/// How holdfast can authenticate an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verifier {
    /// mysql_native_password with this stored `SHA1(SHA1(password))`.
    Native([u8; 20]),
    /// mysql_native_password with an empty password.
    Empty,
    /// Another plugin: the exchange is relayed to the backend.
    Relay { plugin: String },
}

impl Account {
    pub fn verifier(&self) -> Verifier {
        let plugin = if self.plugin.is_empty() {
            "mysql_native_password"
        } else {
            self.plugin.as_str()
        };
        if plugin != "mysql_native_password" {
            return Verifier::Relay {
                plugin: plugin.to_string(),
            };
        }
        if self.auth_string.is_empty() {
            return Verifier::Empty;
        }
        match parse_native_verifier(&self.auth_string) {
            Some(v) => Verifier::Native(v),
            // Not a password hash (`mariadb.sys`'s 'invalid', a hand-edited row): the
            // server accepts no password for it, so neither does holdfast (without a
            // backend, and without waking a paused instance).
            None => Verifier::Native(rand::random()),
        }
    }
}

pub struct VerifierCache {
    accounts: ArcSwap<HashMap<String, Vec<Account>>>,
    last_refresh: Mutex<Option<Instant>>,
    loaded: std::sync::atomic::AtomicBool,
    /// The server's skip_name_resolve is off (so loopback clients are `localhost` to it).
    server_resolves_names: std::sync::atomic::AtomicBool,
}

impl Default for VerifierCache {
    fn default() -> Self {
        VerifierCache {
            accounts: ArcSwap::from_pointee(HashMap::new()),
            last_refresh: Mutex::new(None),
            loaded: std::sync::atomic::AtomicBool::new(false),
            server_resolves_names: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Where the server tries an account's host pattern: lower first. Literal hosts, then
/// patterns with the longest part before the first wildcard, then `%`.
fn specificity(pattern: &str) -> (u8, std::cmp::Reverse<usize>) {
    match pattern.find(['%', '_']) {
        None => (0, std::cmp::Reverse(pattern.len())),
        Some(0) if pattern == "%" => (2, std::cmp::Reverse(0)),
        Some(at) => (1, std::cmp::Reverse(at)),
    }
}

/// Host pattern match as the server does it for `%` and `_` wildcards.
fn host_matches(pattern: &str, host: &str) -> bool {
    fn go(p: &[u8], h: &[u8]) -> bool {
        match (p.first(), h.first()) {
            (None, None) => true,
            (Some(b'%'), _) => go(&p[1..], h) || (!h.is_empty() && go(p, &h[1..])),
            (Some(b'_'), Some(_)) => go(&p[1..], &h[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => go(&p[1..], &h[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), host.as_bytes())
}

impl VerifierCache {
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn account_count(&self) -> usize {
        self.accounts.load().values().map(Vec::len).sum()
    }

    /// The account the server would pick for `user` connecting over TCP from `host`, in the
    /// server's order: hosts without wildcards first, then patterns by how much of them
    /// comes before the first wildcard, `%` last. An IPv4-mapped IPv6 address is matched as
    /// the IPv4 address the server would see. `localhost` is the unix socket's host (with
    /// skip_name_resolve) and never matches a TCP client; a server that resolves names
    /// (skip_name_resolve off) also calls a loopback TCP client `localhost`.
    pub fn lookup(&self, user: &str, host: IpAddr) -> Option<Account> {
        let map = self.accounts.load();
        let candidates = map.get(user)?;
        let host = host.to_canonical();
        let host_text = host.to_string();
        let loopback_is_localhost = host.is_loopback()
            && self
                .server_resolves_names
                .load(std::sync::atomic::Ordering::Relaxed);
        candidates
            .iter()
            .filter(|a| {
                host_matches(&a.host, &host_text)
                    || (loopback_is_localhost && a.host.eq_ignore_ascii_case("localhost"))
            })
            .min_by_key(|a| specificity(&a.host))
            .cloned()
    }

    /// Whether the account `user` gets depends on the client's address: the server, seeing
    /// `server_sees` (holdfast's own address, without the PROXY protocol), would pick
    /// another account (or none) than for `client`.
    pub fn depends_on_host(&self, user: &str, client: IpAddr, server_sees: IpAddr) -> bool {
        let of = |ip| self.lookup(user, ip).map(|a| a.host);
        of(client) != of(server_sees)
    }

    /// Whether some account named `user` is for particular hosts only (not `%`): only then
    /// can the address the server sees make a difference.
    pub fn has_host_specific_account(&self, user: &str) -> bool {
        self.accounts
            .load()
            .get(user)
            .is_some_and(|accounts| accounts.iter().any(|a| a.host != "%"))
    }

    /// Whether the server has no account named `user` (for any host) and no anonymous
    /// account either, as of the last load: a login as `user` cannot succeed. False while
    /// nothing is loaded.
    pub fn no_such_account(&self, user: &str) -> bool {
        if !self.is_loaded() {
            return false;
        }
        let map = self.accounts.load();
        !map.contains_key(user) && !map.contains_key("")
    }

    /// Whether the server certainly refuses `user` from `host` as of the last load: the
    /// name has accounts, none for this host, every host pattern is one holdfast matches as
    /// the server does (addresses and wildcards, `localhost`; not a host name, which the
    /// server would resolve), and there is no anonymous account.
    pub fn no_account_for(&self, user: &str, host: IpAddr) -> bool {
        if !self.is_loaded() || self.lookup(user, host).is_some() {
            return false;
        }
        let map = self.accounts.load();
        if map.contains_key("") {
            return false;
        }
        let judged = |pattern: &str| {
            pattern.eq_ignore_ascii_case("localhost")
                || pattern
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b".:%_/".contains(&b))
        };
        map.get(user)
            .is_some_and(|accounts| accounts.iter().all(|a| judged(&a.host)))
    }

    /// The client's host as the server names it in its messages (`'user'@'host'`): a
    /// server that resolves names calls a loopback client `localhost`, otherwise it gives
    /// the address. (A server that resolves names gives other clients' DNS names, which
    /// holdfast does not look up: it gives the address.)
    pub fn client_host(&self, ip: IpAddr) -> String {
        let ip = ip.to_canonical();
        let resolves = self
            .server_resolves_names
            .load(std::sync::atomic::Ordering::Relaxed);
        if resolves && ip.is_loopback() {
            "localhost".to_string()
        } else {
            ip.to_string()
        }
    }

    /// What the server's `skip_name_resolve` says (see [`VerifierCache::lookup`]).
    pub fn set_server_resolves_names(&self, resolves: bool) {
        self.server_resolves_names
            .store(resolves, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn replace(&self, accounts: Vec<Account>) {
        let mut map: HashMap<String, Vec<Account>> = HashMap::new();
        for a in accounts {
            map.entry(a.user.clone()).or_default().push(a);
        }
        self.accounts.store(Arc::new(map));
        self.loaded
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Re-reads the verifiers unless that happened less than `min_interval` ago.
    pub async fn refresh(
        &self,
        cfg: &Config,
        addr: &str,
        min_interval: Duration,
    ) -> Result<bool, backend::BackendError> {
        let mut last = self.last_refresh.lock().await;
        if let Some(t) = *last {
            if t.elapsed() < min_interval {
                return Ok(false);
            }
        }
        self.refresh_locked(&mut last, cfg, addr).await
    }

    /// Makes sure the verifiers were read after `arrived` (a login of an account holdfast
    /// has not seen yet gets an answer from accounts read after it came), reading them no
    /// more often than every `min_interval`. Logins waiting together share one read, and
    /// nobody sleeps holding the lock: a flood of unknown names costs one read per
    /// interval, not one interval per login in a queue.
    pub async fn refresh_waiting(
        &self,
        cfg: &Config,
        addr: &str,
        min_interval: Duration,
    ) -> Result<(), backend::BackendError> {
        let arrived = Instant::now();
        loop {
            let mut last = self.last_refresh.lock().await;
            let wait = match *last {
                // A read that started after this login came is done (it held the lock).
                Some(t) if t >= arrived => return Ok(()),
                Some(t) => min_interval.checked_sub(t.elapsed()),
                None => None,
            };
            match wait {
                None | Some(Duration::ZERO) => {
                    return self.refresh_locked(&mut last, cfg, addr).await.map(|_| ())
                }
                Some(wait) => {
                    drop(last);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn refresh_locked(
        &self,
        last: &mut Option<Instant>,
        cfg: &Config,
        addr: &str,
    ) -> Result<bool, backend::BackendError> {
        *last = Some(Instant::now());
        let (accounts, resolves_names) = load_accounts(cfg, addr).await?;
        tracing::debug!(accounts = accounts.len(), "verifier cache refreshed");
        self.set_server_resolves_names(resolves_names);
        self.replace(accounts);
        Ok(true)
    }
}

/// The accounts, and whether the server resolves client host names.
async fn load_accounts(
    cfg: &Config,
    addr: &str,
) -> Result<(Vec<Account>, bool), backend::BackendError> {
    let mut conn = monitor_connect(cfg, addr).await?;
    let skip = conn.query("SELECT @@skip_name_resolve").await?;
    let resolves_names = skip
        .rows
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .is_some_and(|v| v == "0");
    // MariaDB 10.4+ keeps accounts in mysql.global_priv; MySQL in mysql.user.
    let result = match conn
        .query(
            "SELECT User, Host, JSON_VALUE(Priv, '$.plugin'), \
             JSON_VALUE(Priv, '$.authentication_string') FROM mysql.global_priv",
        )
        .await
    {
        Ok(r) => r,
        Err(backend::BackendError::Server { .. }) => {
            conn.query("SELECT user, host, plugin, authentication_string FROM mysql.user")
                .await?
        }
        Err(e) => return Err(e),
    };
    let accounts = result
        .rows
        .into_iter()
        .filter_map(|row| {
            let mut it = row.into_iter();
            Some(Account {
                user: it.next()??,
                host: it.next()??,
                plugin: it.next().flatten().unwrap_or_default(),
                auth_string: it.next().flatten().unwrap_or_default(),
            })
        })
        .collect();
    Ok((accounts, resolves_names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct(user: &str, host: &str, auth: &str) -> Account {
        Account {
            user: user.into(),
            host: host.into(),
            plugin: "mysql_native_password".into(),
            auth_string: auth.into(),
        }
    }

    #[test]
    fn most_specific_host_wins() {
        let c = VerifierCache::default();
        c.replace(vec![
            acct("app", "%", "*AA"),
            acct("app", "127.0.0.%", "*BB"),
            acct("app", "localhost", "*CC"),
            acct("other", "%", ""),
        ]);
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        // With skip_name_resolve, 'localhost' is the unix socket only.
        assert_eq!(c.lookup("app", lo).unwrap().auth_string, "*BB");
        c.set_server_resolves_names(true);
        assert_eq!(c.lookup("app", lo).unwrap().auth_string, "*CC");
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(c.lookup("app", remote).unwrap().auth_string, "*AA");
        assert_eq!(
            c.lookup("other", remote).unwrap().verifier(),
            Verifier::Empty
        );
        assert!(c.lookup("nobody", lo).is_none());
    }

    #[test]
    fn longer_literal_prefix_wins_and_mapped_addresses_match_as_ipv4() {
        let c = VerifierCache::default();
        c.replace(vec![
            acct("app", "10.%", "*A"),
            acct("app", "10.0.%", "*B"),
            acct("app", "10.0.0.7", "*C"),
            acct("app", "%", "*D"),
        ]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(c.lookup("app", ip("10.0.0.7")).unwrap().auth_string, "*C");
        assert_eq!(c.lookup("app", ip("10.0.3.1")).unwrap().auth_string, "*B");
        assert_eq!(c.lookup("app", ip("10.9.3.1")).unwrap().auth_string, "*A");
        assert_eq!(
            c.lookup("app", ip("::ffff:10.0.3.1")).unwrap().auth_string,
            "*B"
        );
        assert_eq!(
            c.lookup("app", ip("192.168.1.1")).unwrap().auth_string,
            "*D"
        );
        // Which account a client gets depends on its address when the server would see
        // holdfast's instead.
        assert!(c.depends_on_host("app", ip("192.168.1.1"), ip("10.0.0.7")));
        assert!(!c.depends_on_host("app", ip("10.0.5.5"), ip("10.0.3.1")));
        c.replace(vec![acct("only_here", "127.0.0.1", "*E")]);
        assert!(c.depends_on_host("only_here", ip("127.0.0.2"), ip("127.0.0.1")));
        assert!(!c.depends_on_host("nobody", ip("127.0.0.2"), ip("127.0.0.1")));
    }

    #[test]
    fn wildcards() {
        assert!(host_matches("127.0.0.%", "127.0.0.1"));
        assert!(host_matches("%", ""));
        assert!(host_matches("10.0._.1", "10.0.5.1"));
        assert!(!host_matches("10.0._.1", "10.0.55.1"));
    }

    #[test]
    fn other_plugins_are_relayed() {
        let mut a = acct("e", "%", "abc");
        a.plugin = "ed25519".into();
        assert_eq!(
            a.verifier(),
            Verifier::Relay {
                plugin: "ed25519".into()
            }
        );
    }
}
