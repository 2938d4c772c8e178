//! Who may connect and try to log in: connections and unfinished logins per client address,
//! growing delays after wrong passwords (per address and per account), and refusal logs
//! that a flood cannot turn into a log flood. Touched per connection and per login, never
//! per query.

use holdfast_config::ProxyConfig;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Wrong passwords allowed before answers are delayed.
const FREE_FAILURES: u32 = 3;
/// A source or account with no failure for this long starts afresh.
const FAILURES_FORGOTTEN_AFTER: Duration = Duration::from_secs(600);
/// Entries kept at most per table (the oldest are dropped first).
const MAX_TRACKED: usize = 100_000;

#[derive(Default)]
struct PerAddress {
    open: usize,
    logging_in: usize,
}

struct Failures {
    count: u32,
    last: Instant,
}

/// The key an address's limits are kept under: an IPv4 address (also as a v4-mapped IPv6
/// one) is itself; an IPv6 address is its /64, the smallest network a site is given, so a
/// client cannot escape the limits by walking through the addresses of its own prefix.
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// Why a connection was turned away at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections_per_ip` connections from this address are open.
    TooManyFromAddress,
    /// `max_pending_logins_per_ip` connections from this address have not logged in yet.
    TooManyLoginsFromAddress,
}

pub struct Admission {
    /// The limits and delays of `[proxy]`, set again by a reload ([`Admission::apply`]).
    max_per_ip: AtomicUsize,
    max_pending_per_ip: AtomicUsize,
    failure_delay_ms: AtomicU64,
    max_failure_delay_ms: AtomicU64,
    addresses: Mutex<HashMap<IpAddr, PerAddress>>,
    failed_sources: Mutex<HashMap<IpAddr, Failures>>,
    failed_accounts: Mutex<HashMap<String, Failures>>,
    refusal_log: RateLimitedLog,
    /// When each address last woke a paused instance for a login of an unknown user.
    unknown_user_wakes: Mutex<HashMap<IpAddr, Instant>>,
}

/// One wake per address per this long for logins of users holdfast does not know.
const UNKNOWN_USER_WAKE_EVERY: Duration = Duration::from_secs(60);

impl Admission {
    pub fn new(cfg: &ProxyConfig) -> Self {
        Admission {
            max_per_ip: AtomicUsize::new(cfg.max_connections_per_ip),
            max_pending_per_ip: AtomicUsize::new(cfg.max_pending_logins_per_ip),
            failure_delay_ms: AtomicU64::new(cfg.login_failure_delay_ms),
            max_failure_delay_ms: AtomicU64::new(cfg.max_login_failure_delay_ms),
            addresses: Mutex::new(HashMap::new()),
            failed_sources: Mutex::new(HashMap::new()),
            failed_accounts: Mutex::new(HashMap::new()),
            refusal_log: RateLimitedLog::new(Duration::from_secs(1)),
            unknown_user_wakes: Mutex::new(HashMap::new()),
        }
    }

    /// The limits and delays of a reloaded `[proxy]`, for the next connection and the next
    /// failed login (connections over a lowered limit stay).
    pub fn apply(&self, cfg: &ProxyConfig) {
        self.max_per_ip
            .store(cfg.max_connections_per_ip, Ordering::Relaxed);
        self.max_pending_per_ip
            .store(cfg.max_pending_logins_per_ip, Ordering::Relaxed);
        self.failure_delay_ms
            .store(cfg.login_failure_delay_ms, Ordering::Relaxed);
        self.max_failure_delay_ms
            .store(cfg.max_login_failure_delay_ms, Ordering::Relaxed);
    }

    /// Counts a new connection from `ip`, or says why it is refused. The ticket uncounts it
    /// when dropped.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, Refusal> {
        let ip = address_key(ip);
        let max_per_ip = self.max_per_ip.load(Ordering::Relaxed);
        let max_pending_per_ip = self.max_pending_per_ip.load(Ordering::Relaxed);
        let mut map = self.addresses.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(ip).or_default();
        if max_per_ip > 0 && entry.open >= max_per_ip {
            return Err(Refusal::TooManyFromAddress);
        }
        if max_pending_per_ip > 0 && entry.logging_in >= max_pending_per_ip {
            return Err(Refusal::TooManyLoginsFromAddress);
        }
        entry.open += 1;
        entry.logging_in += 1;
        Ok(Ticket {
            admission: self.clone(),
            ip,
            logging_in: true,
        })
    }

    /// A session handed over by the process this one replaced: it was admitted there, so
    /// it counts against its address's limit here whatever that limit says.
    pub fn admit_handed_over(self: &Arc<Self>, ip: IpAddr) -> Ticket {
        let ip = address_key(ip);
        let mut map = self.addresses.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(ip).or_default().open += 1;
        Ticket {
            admission: self.clone(),
            ip,
            logging_in: false,
        }
    }

    /// After a wrong password from `ip` for `user`: how long to wait before answering.
    /// Grows with the failures of the address or of the account, whichever has more.
    pub fn login_failed(&self, ip: IpAddr, user: &str) -> Duration {
        let ip = address_key(ip);
        let now = Instant::now();
        let bump = |f: &mut Failures| {
            if now.duration_since(f.last) > FAILURES_FORGOTTEN_AFTER {
                f.count = 0;
            }
            f.count = f.count.saturating_add(1);
            f.last = now;
            f.count
        };
        let by_source = {
            let mut m = self
                .failed_sources
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            bounded(&mut m);
            bump(m.entry(ip).or_insert(Failures {
                count: 0,
                last: now,
            }))
        };
        let by_account = {
            let mut m = self
                .failed_accounts
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            bounded(&mut m);
            bump(m.entry(user.to_string()).or_insert(Failures {
                count: 0,
                last: now,
            }))
        };
        self.delay_after(by_source.max(by_account))
    }

    /// Whether a login from `ip` of a user holdfast does not know may wake a paused
    /// instance (to re-read the accounts): once per address per minute, so that guessing
    /// user names cannot keep an instance running.
    pub fn may_wake_for_unknown_user(&self, ip: IpAddr) -> bool {
        let ip = address_key(ip);
        let now = Instant::now();
        let mut m = self
            .unknown_user_wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_TRACKED {
            m.retain(|_, t| now.duration_since(*t) < UNKNOWN_USER_WAKE_EVERY);
        }
        match m.get(&ip) {
            Some(t) if now.duration_since(*t) < UNKNOWN_USER_WAKE_EVERY => false,
            _ => {
                m.insert(ip, now);
                true
            }
        }
    }

    /// A successful login clears the address's and the account's failures.
    pub fn login_succeeded(&self, ip: IpAddr, user: &str) {
        self.failed_sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&address_key(ip));
        self.failed_accounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(user);
    }

    /// Doubling from `login_failure_delay_ms` after the free failures, up to the maximum.
    fn delay_after(&self, failures: u32) -> Duration {
        if failures <= FREE_FAILURES {
            return Duration::ZERO;
        }
        let doublings = (failures - FREE_FAILURES - 1).min(16);
        Duration::from_millis(self.failure_delay_ms.load(Ordering::Relaxed))
            .saturating_mul(1 << doublings)
            .min(Duration::from_millis(
                self.max_failure_delay_ms.load(Ordering::Relaxed),
            ))
    }

    /// Whether a refusal may be logged now; otherwise it is counted and reported with the
    /// next one that is.
    pub fn refusal_log(&self) -> &RateLimitedLog {
        &self.refusal_log
    }
}

/// Keeps the tables from growing without bound under a flood of distinct keys.
fn bounded<K: Clone + Eq + std::hash::Hash>(m: &mut HashMap<K, Failures>) {
    if m.len() < MAX_TRACKED {
        return;
    }
    let now = Instant::now();
    m.retain(|_, f| now.duration_since(f.last) <= FAILURES_FORGOTTEN_AFTER);
    if m.len() >= MAX_TRACKED {
        if let Some(oldest) = m.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| k.clone()) {
            m.remove(&oldest);
        }
    }
}

/// A counted connection (see [`Admission::admit`]).
pub struct Ticket {
    admission: Arc<Admission>,
    ip: IpAddr,
    logging_in: bool,
}

impl Ticket {
    /// The connection logged in: it no longer counts against the pending-login limit.
    pub fn logged_in(&mut self) {
        if std::mem::take(&mut self.logging_in) {
            let mut map = self
                .admission
                .addresses
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(e) = map.get_mut(&self.ip) {
                e.logging_in = e.logging_in.saturating_sub(1);
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self
            .admission
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&self.ip) {
            e.open = e.open.saturating_sub(1);
            if self.logging_in {
                e.logging_in = e.logging_in.saturating_sub(1);
            }
            if e.open == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// At most one log line per interval; the lines in between are counted.
pub struct RateLimitedLog {
    interval_ms: u64,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last line written, plus one (0: none yet).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    pub fn new(interval: Duration) -> Self {
        RateLimitedLog {
            interval_ms: interval.as_millis() as u64,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log now, mentioning the `n` lines suppressed since the last one; `None`:
    /// stay quiet (counted).
    pub fn permit(&self) -> Option<u64> {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.interval_ms {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(per_ip: usize, pending: usize) -> Arc<Admission> {
        Arc::new(Admission::new(&ProxyConfig {
            max_connections_per_ip: per_ip,
            max_pending_logins_per_ip: pending,
            login_failure_delay_ms: 100,
            max_login_failure_delay_ms: 1000,
            ..ProxyConfig::default()
        }))
    }

    #[test]
    fn pending_logins_are_limited_per_address_and_freed_by_login_or_close() {
        let a = admission(0, 2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let mut t1 = a.admit(ip).unwrap();
        let t2 = a.admit(ip).unwrap();
        assert_eq!(a.admit(ip).err(), Some(Refusal::TooManyLoginsFromAddress));
        assert!(a.admit(other).is_ok(), "other addresses are not affected");
        t1.logged_in();
        let t3 = a.admit(ip).unwrap();
        drop(t2);
        drop(t3);
        let _t4 = a.admit(ip).unwrap();
        let _t5 = a.admit(ip).unwrap();
        assert!(a.admit(ip).is_err());
        drop(t1);
    }

    #[test]
    fn connections_are_limited_per_address() {
        let a = admission(2, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut t1 = a.admit(ip).unwrap();
        let mut t2 = a.admit(ip).unwrap();
        t1.logged_in();
        t2.logged_in();
        assert_eq!(a.admit(ip).err(), Some(Refusal::TooManyFromAddress));
        drop(t1);
        assert!(a.admit(ip).is_ok());
        drop(t2);
    }

    #[test]
    fn sessions_handed_over_count_against_their_address_whatever_the_limit() {
        let a = admission(1, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut t1 = a.admit(ip).unwrap();
        t1.logged_in();
        let handed = a.admit_handed_over(ip);
        assert_eq!(a.admit(ip).err(), Some(Refusal::TooManyFromAddress));
        drop(t1);
        assert_eq!(a.admit(ip).err(), Some(Refusal::TooManyFromAddress));
        drop(handed);
        assert!(a.admit(ip).is_ok());
    }

    #[test]
    fn delays_grow_after_free_failures_and_reset_on_success() {
        let a = admission(0, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let delays: Vec<u64> = (0..8)
            .map(|_| a.login_failed(ip, "app").as_millis() as u64)
            .collect();
        assert_eq!(delays, [0, 0, 0, 100, 200, 400, 800, 1000]);
        a.login_succeeded(ip, "app");
        assert_eq!(a.login_failed(ip, "app"), Duration::ZERO);
        // Another address guessing the same account is slowed by the account's count.
        for _ in 0..3 {
            a.login_failed(ip, "root");
        }
        let elsewhere: IpAddr = "10.9.9.9".parse().unwrap();
        assert_eq!(
            a.login_failed(elsewhere, "root"),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn unknown_user_wakes_once_per_address_per_minute() {
        let a = admission(0, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(a.may_wake_for_unknown_user(ip));
        assert!(!a.may_wake_for_unknown_user(ip));
        assert!(a.may_wake_for_unknown_user("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn ipv6_clients_share_the_limits_of_their_64_and_mapped_addresses_are_ipv4() {
        let a = admission(2, 0);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _t1 = a.admit(one).unwrap();
        let _t2 = a.admit(same_64).unwrap();
        assert_eq!(a.admit(one).err(), Some(Refusal::TooManyFromAddress));
        assert!(a.admit(next_64).is_ok(), "another /64 has its own limit");
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(address_key(mapped), v4);
        let _t3 = a.admit(v4).unwrap();
        let _t4 = a.admit(mapped).unwrap();
        assert!(
            a.admit(v4).is_err(),
            "a v4-mapped address is the IPv4 address"
        );
        // Failures too.
        for _ in 0..3 {
            a.login_failed(one, "u1");
        }
        assert_eq!(a.login_failed(same_64, "u2"), Duration::from_millis(100));
        assert_eq!(a.login_failed(next_64, "u3"), Duration::ZERO);
    }

    #[test]
    fn refusal_log_lets_one_line_through_per_interval() {
        let log = RateLimitedLog::new(Duration::from_secs(3600));
        assert_eq!(log.permit(), Some(0));
        assert_eq!(log.permit(), None);
        assert_eq!(log.permit(), None);
        let log = RateLimitedLog::new(Duration::ZERO);
        assert_eq!(log.permit(), Some(0));
        assert_eq!(log.permit(), Some(0));
    }
}
