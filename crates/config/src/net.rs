//! Networks in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`, or one address), as
//! `trusted_proxies` lists them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IPv4 or IPv6 network. An IPv4 network also holds the v4-mapped IPv6 forms of its
/// addresses (`::ffff:10.0.0.1`), as a dual-stack listener sees IPv4 clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(net)), 32, self.prefix)
                    == masked(u128::from(u32::from(ip)), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), 128, self.prefix)
                    == masked(u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// The first `prefix` of `bits` bits of `value`.
fn masked(value: u128, bits: u32, prefix: u8) -> u128 {
    let host_bits = bits - u32::from(prefix);
    value.checked_shr(host_bits).unwrap_or(0)
}

impl FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an IP address or network (10.0.0.0/8, 2001:db8::/32)")
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(IpNet { addr, prefix })
    }
}

impl TryFrom<String> for IpNet {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<IpNet> for String {
    fn from(n: IpNet) -> String {
        n.to_string()
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn networks_hold_their_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(net("10.0.0.0/8").contains(ip("10.255.0.1")));
        assert!(!net("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(net("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")));
        assert!(net("127.0.0.2").contains(ip("127.0.0.2")));
        assert!(!net("127.0.0.2/32").contains(ip("127.0.0.1")));
        assert!(net("0.0.0.0/0").contains(ip("192.0.2.1")));
        assert!(!net("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(net("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(!net("2001:db8::/32").contains(ip("2001:db9::1")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
        assert!(net("::1").contains(ip("::1")));
        assert_eq!(net("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(net("127.0.0.2").to_string(), "127.0.0.2/32");
    }

    #[test]
    fn bad_networks_are_refused() {
        for s in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "host.example",
            "10.0.0.0/",
            "/8",
            "10.0.0.0/-1",
        ] {
            assert!(s.parse::<IpNet>().is_err(), "{s}");
        }
    }
}
