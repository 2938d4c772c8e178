//! MariaDB GTID positions: `domain-server-seq[,domain-server-seq...]`, one entry per
//! replication domain (the form of `@@gtid_binlog_pos`, `@@gtid_slave_pos`,
//! `@@gtid_current_pos` and `Gtid_IO_Pos` in `SHOW SLAVE STATUS`).
//!
//! Within a domain the sequence number only grows (holdfast's nodes run with
//! `gtid_strict_mode=ON`), so "A is at least as advanced as B" is: for every domain B has,
//! A has it too with a sequence number at least as high. Two positions where each is ahead
//! in a different domain are not comparable.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One global transaction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl FromStr for Gtid {
    type Err = GtidParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || GtidParseError(s.to_string());
        let mut parts = s.trim().split('-');
        let domain = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let server = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let seq = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Gtid {
            domain,
            server,
            seq,
        })
    }
}

/// A GTID text that is not `domain-server-seq[,...]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a MariaDB GTID position: {0:?}")]
pub struct GtidParseError(pub String);

/// A GTID position: the last transaction per replication domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GtidPos {
    by_domain: BTreeMap<u32, Gtid>,
}

impl serde::Serialize for GtidPos {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for GtidPos {
    type Err = GtidParseError;

    /// Parses a position; the empty string is the empty position. A domain listed twice
    /// is refused (MariaDB never prints one).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut by_domain = BTreeMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let g: Gtid = part.parse().map_err(|_| GtidParseError(s.to_string()))?;
            if by_domain.insert(g.domain, g).is_some() {
                return Err(GtidParseError(s.to_string()));
            }
        }
        Ok(GtidPos { by_domain })
    }
}

impl fmt::Display for GtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.by_domain.values().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl GtidPos {
    /// Whether no transaction is recorded.
    pub fn is_empty(&self) -> bool {
        self.by_domain.is_empty()
    }

    /// The last GTID of `domain`.
    pub fn get(&self, domain: u32) -> Option<&Gtid> {
        self.by_domain.get(&domain)
    }

    /// Every domain's last GTID, ordered by domain.
    pub fn gtids(&self) -> impl Iterator<Item = &Gtid> {
        self.by_domain.values()
    }

    /// Whether this position is at least as advanced as `other` in every domain `other`
    /// has: a replica at `self` has "caught up with" `other`.
    pub fn contains(&self, other: &GtidPos) -> bool {
        other.by_domain.iter().all(|(d, theirs)| {
            self.by_domain
                .get(d)
                .is_some_and(|mine| mine.seq >= theirs.seq)
        })
    }

    /// Partial order: `Less` when `other` contains `self` and not the reverse, `None` when
    /// each is ahead somewhere.
    pub fn partial_compare(&self, other: &GtidPos) -> Option<Ordering> {
        match (self.contains(other), other.contains(self)) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Greater),
            (false, true) => Some(Ordering::Less),
            (false, false) => None,
        }
    }

    /// Sum of the sequence numbers: a tie-break between incomparable positions only.
    pub fn total(&self) -> u128 {
        self.by_domain.values().map(|g| u128::from(g.seq)).sum()
    }

    /// Per domain the more advanced of the two (what a node has when its binlog and its
    /// slave position are both considered).
    pub fn merge_max(&self, other: &GtidPos) -> GtidPos {
        let mut by_domain = self.by_domain.clone();
        for (d, g) in &other.by_domain {
            match by_domain.get(d) {
                Some(mine) if mine.seq >= g.seq => {}
                _ => {
                    by_domain.insert(*d, *g);
                }
            }
        }
        GtidPos { by_domain }
    }

    /// Per domain, the transactions this position has beyond `have`: what a node at `have`
    /// lacks of `self`, as one line a person can act on (`domain 0: 0-1-201 .. 0-1-400, 200
    /// transactions`). Empty when `have` contains `self`.
    pub fn missing_from(&self, have: &GtidPos) -> Vec<String> {
        self.by_domain
            .iter()
            .filter_map(|(d, want)| {
                let from = have.by_domain.get(d).map_or(0, |g| g.seq);
                (want.seq > from).then(|| {
                    format!(
                        "domain {d}: {d}-{}-{} .. {want}, {} transaction{}",
                        want.server,
                        from + 1,
                        want.seq - from,
                        if want.seq - from == 1 { "" } else { "s" }
                    )
                })
            })
            .collect()
    }

    /// Transactions this position has that `reference` provably lacks: domains where this
    /// position is further, or where both stop at the same sequence number written by
    /// different servers (two different transactions). A node with such GTIDs has diverged
    /// from `reference` and must not simply replicate from it.
    ///
    /// The converse case (`reference` is further in the domain and this node's last GTID
    /// is not in its binlog) cannot be seen from positions alone; the server reports it
    /// when the replica connects (error 1236).
    pub fn ahead_of(&self, reference: &GtidPos) -> Vec<Gtid> {
        self.by_domain
            .iter()
            .filter(|(d, mine)| match reference.by_domain.get(d) {
                None => true,
                Some(theirs) => {
                    mine.seq > theirs.seq
                        || (mine.seq == theirs.seq && mine.server != theirs.server)
                }
            })
            .map(|(_, g)| *g)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> GtidPos {
        s.parse().unwrap()
    }

    #[test]
    fn missing_transactions_are_named_per_domain() {
        let received = p("0-1-400,1-2-7");
        assert!(received.missing_from(&p("0-1-400,1-2-9")).is_empty());
        assert_eq!(
            received.missing_from(&p("0-1-200,1-2-7")),
            vec!["domain 0: 0-1-201 .. 0-1-400, 200 transactions".to_string()]
        );
        assert_eq!(
            received.missing_from(&p("0-1-399")),
            vec![
                "domain 0: 0-1-400 .. 0-1-400, 1 transaction".to_string(),
                "domain 1: 1-2-1 .. 1-2-7, 7 transactions".to_string()
            ]
        );
    }

    #[test]
    fn parses_and_prints() {
        assert!(p("").is_empty());
        assert!(p("  ").is_empty());
        let x = p("0-1-100");
        assert_eq!(
            x.get(0),
            Some(&Gtid {
                domain: 0,
                server: 1,
                seq: 100
            })
        );
        // Order normalised by domain, whitespace and newlines tolerated.
        let y = p("2-3-7,\n0-1-5");
        assert_eq!(y.to_string(), "0-1-5,2-3-7");
        assert_eq!(p(&y.to_string()), y);
        assert_eq!(
            p("4294967295-4294967295-18446744073709551615").total(),
            u128::from(u64::MAX)
        );
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            "x",
            "0-1",
            "0-1-2-3",
            "0-1-x",
            "-1-1-1",
            "0-1-2,0-1-3",
            "0-1-2,,x",
        ] {
            assert!(bad.parse::<GtidPos>().is_err(), "{bad}");
        }
    }

    #[test]
    fn compares() {
        assert!(p("0-1-10").contains(&p("0-1-10")));
        assert!(p("0-2-11").contains(&p("0-1-10")));
        assert!(!p("0-1-9").contains(&p("0-1-10")));
        assert!(p("0-1-1").contains(&p("")));
        assert!(!p("").contains(&p("0-1-1")));
        assert!(!p("0-1-10").contains(&p("0-1-10,1-1-1")));
        assert_eq!(
            p("0-1-5").partial_compare(&p("0-1-6")),
            Some(Ordering::Less)
        );
        assert_eq!(
            p("0-1-6,1-2-1").partial_compare(&p("0-1-6")),
            Some(Ordering::Greater)
        );
        assert_eq!(p("0-1-6,1-2-1").partial_compare(&p("0-1-7")), None);
        assert_eq!(
            p("0-1-6").partial_compare(&p("0-2-6")),
            Some(Ordering::Equal)
        );
    }

    #[test]
    fn merges_and_finds_divergence() {
        assert_eq!(p("0-1-5,1-1-2").merge_max(&p("0-2-7")), p("0-2-7,1-1-2"));
        assert!(p("0-1-10").ahead_of(&p("0-1-10")).is_empty());
        assert!(p("0-1-9").ahead_of(&p("0-2-10")).is_empty());
        assert_eq!(p("0-1-11").ahead_of(&p("0-2-10")).len(), 1);
        // Same sequence number, different server: two different transactions.
        assert_eq!(p("0-1-10").ahead_of(&p("0-2-10")).len(), 1);
        assert_eq!(p("0-2-10,5-1-1").ahead_of(&p("0-2-10")).len(), 1);
    }
}
