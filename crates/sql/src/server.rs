//! Which servers a text may run on, as far as lexing goes: the executable comments
//! (`/*! ... */`, `/*!NNNNN ... */`, `/*M!NNNNNN ... */`) each of them runs or skips.

/// The servers a SQL text may run on: MariaDB, MySQL or either, within a range of
/// versions. The lexer follows exactly what they do with executable comments, and reports
/// a comment they do not all treat alike as uncertain ([`Lexer::is_uncertain`]).
///
/// MariaDB (`sql_lex.cc`, `MY_LEX_LONG_COMMENT`): `/*!` and `/*M!` without a version (fewer
/// than five digits) always run; with a version of five digits, or six when a sixth digit
/// follows, they run when it is at most the server's version, except that `/*!` comments
/// of MySQL versions 5.7.0 to 9.99.99 (`50700`-`99999`) never run (`/*M!` ones do). A
/// skipped comment may hold one level of `/* ... */` inside. `/*!99997` also runs on a
/// Galera node (uncertain here).
///
/// MySQL: `/*M!` is an ordinary comment; `/*!NNNNN` (five digits) runs when NNNNN is at
/// most the server's version. Six-digit versions and comments nested in executable ones
/// changed across MySQL versions: uncertain.
///
/// [`Lexer::is_uncertain`]: crate::Lexer::is_uncertain
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Server {
    mariadb: bool,
    mysql: bool,
    /// Lowest and highest version (`MAJOR * 10000 + MINOR * 100 + PATCH`).
    min: u32,
    max: u32,
}

/// What a server does with an executable comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// Its content is code.
    Code,
    /// A versioned comment it skips (one level of `/* */` nesting allowed inside).
    Skip,
    /// An ordinary comment to it (MySQL's view of `/*M!`): ends at the first `*/`.
    Comment,
    /// The servers do not agree, or the rules are not known well enough.
    Uncertain,
}

/// The oldest server [`Server::UNKNOWN`] stands for: MySQL and MariaDB 5.5 (holdfast's
/// login needs what 5.5 brought).
const OLDEST: u32 = 50500;

impl Default for Server {
    fn default() -> Self {
        Server::UNKNOWN
    }
}

impl Server {
    /// Any MariaDB or MySQL server from 5.5 on: the safe default. Only comments that every
    /// such server treats alike are certain (no version, or a version up to 5.5.0).
    pub const UNKNOWN: Server = Server {
        mariadb: true,
        mysql: true,
        min: OLDEST,
        max: u32::MAX,
    };

    /// Only MariaDB servers (no MySQL).
    pub const fn mariadb_only(&self) -> bool {
        self.mariadb && !self.mysql
    }

    /// A MariaDB server of version `version` (`MAJOR * 10000 + MINOR * 100 + PATCH`,
    /// `101106` for 10.11.6).
    pub const fn mariadb(version: u32) -> Server {
        Server {
            mariadb: true,
            mysql: false,
            min: version,
            max: version,
        }
    }

    /// A MySQL server of version `version` (`80036` for 8.0.36).
    pub const fn mysql(version: u32) -> Server {
        Server {
            mariadb: false,
            mysql: true,
            min: version,
            max: version,
        }
    }

    /// The server that sent `version` in its greeting or as `@@version`
    /// (`5.5.5-10.11.6-MariaDB-log`, `10.11.6-MariaDB`, `8.0.36`): MariaDB when it says so,
    /// MySQL otherwise. [`Server::UNKNOWN`] when no `MAJOR.MINOR.PATCH` can be read.
    pub fn from_version(version: &[u8]) -> Server {
        let text = version.trim_ascii();
        // MariaDB's greeting starts with `5.5.5-` for old replication clients.
        let text = match text.strip_prefix(b"5.5.5-") {
            Some(rest) if rest.first().is_some_and(u8::is_ascii_digit) => rest,
            _ => text,
        };
        let Some(id) = version_id(text) else {
            return Server::UNKNOWN;
        };
        let mariadb = version
            .windows(7)
            .any(|w| w.eq_ignore_ascii_case(b"mariadb"));
        if mariadb {
            Server::mariadb(id)
        } else {
            Server::mysql(id)
        }
    }

    /// Either of two sets of servers (a text that may run on a node of `self` or of
    /// `other`).
    pub const fn or(self, other: Server) -> Server {
        Server {
            mariadb: self.mariadb || other.mariadb,
            mysql: self.mysql || other.mysql,
            min: if self.min < other.min {
                self.min
            } else {
                other.min
            },
            max: if self.max > other.max {
                self.max
            } else {
                other.max
            },
        }
    }

    /// What the servers do with an executable comment: `/*M!` when `mariadb_only`, with
    /// `digits` the run of digits after the `!` (as many as there are) whose value is
    /// `value` (only read for 5 or more digits).
    pub(crate) fn runs(&self, mariadb_only: bool, digits: usize, value: u32) -> Run {
        let mut verdict = None;
        let mut agree = |run: Run| match verdict {
            None => verdict = Some(run),
            Some(v) if v == run => {}
            Some(_) => verdict = Some(Run::Uncertain),
        };
        // Every rule is monotone in the server's version: the range's ends decide.
        for at in [self.min, self.max] {
            if self.mariadb {
                agree(mariadb_runs(at, mariadb_only, digits, value));
            }
            if self.mysql {
                agree(mysql_runs(at, mariadb_only, digits, value));
            }
        }
        verdict.unwrap_or(Run::Uncertain)
    }
}

fn mariadb_runs(server: u32, mariadb_only: bool, digits: usize, value: u32) -> Run {
    if digits < 5 {
        return Run::Code;
    }
    if value <= server && (!(50700..=99999).contains(&value) || mariadb_only) {
        Run::Code
    } else if value == 99997 && !mariadb_only {
        // WSREP's consistency check runs it on a Galera node.
        Run::Uncertain
    } else {
        Run::Skip
    }
}

fn mysql_runs(server: u32, mariadb_only: bool, digits: usize, value: u32) -> Run {
    if mariadb_only {
        Run::Comment
    } else if digits < 5 {
        Run::Code
    } else if digits > 5 {
        Run::Uncertain
    } else if value <= server {
        Run::Code
    } else {
        Run::Skip
    }
}

/// `MAJOR.MINOR.PATCH...` as `MAJOR * 10000 + MINOR * 100 + PATCH`.
fn version_id(text: &[u8]) -> Option<u32> {
    let mut parts = text.splitn(3, |&c| c == b'.');
    let number = |part: &[u8], max: u32| -> Option<u32> {
        let digits = part.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 3 {
            return None;
        }
        let n = std::str::from_utf8(part.get(..digits)?)
            .ok()?
            .parse()
            .ok()?;
        (n <= max).then_some(n)
    };
    let major = number(parts.next()?, 99)?;
    let minor = number(parts.next()?, 99)?;
    let patch = number(parts.next()?, 99)?;
    Some(major * 10000 + minor * 100 + patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_greetings() {
        assert_eq!(
            Server::from_version(b"5.5.5-10.11.19-MariaDB-0+deb12u1"),
            Server::mariadb(101119)
        );
        assert_eq!(
            Server::from_version(b"10.11.6-MariaDB-log"),
            Server::mariadb(101106)
        );
        assert_eq!(
            Server::from_version(b"11.4.2-MariaDB"),
            Server::mariadb(110402)
        );
        assert_eq!(Server::from_version(b"8.0.36"), Server::mysql(80036));
        assert_eq!(Server::from_version(b"5.7.44-log"), Server::mysql(50744));
        assert_eq!(Server::from_version(b""), Server::UNKNOWN);
        assert_eq!(Server::from_version(b"holdfast"), Server::UNKNOWN);
        assert_eq!(Server::from_version(b"10.x.1-MariaDB"), Server::UNKNOWN);
    }

    #[test]
    fn mariadb_rules() {
        let s = Server::mariadb(101119);
        assert_eq!(s.runs(false, 0, 0), Run::Code);
        assert_eq!(s.runs(false, 2, 0), Run::Code);
        assert_eq!(s.runs(false, 5, 40101), Run::Code);
        assert_eq!(s.runs(false, 5, 50699), Run::Code);
        // MySQL 5.7 and later: never, unless written /*M!.
        assert_eq!(s.runs(false, 5, 50700), Run::Skip);
        assert_eq!(s.runs(false, 5, 90000), Run::Skip);
        assert_eq!(s.runs(true, 5, 90000), Run::Code);
        assert_eq!(s.runs(false, 6, 101119), Run::Code);
        assert_eq!(s.runs(false, 6, 101120), Run::Skip);
        assert_eq!(s.runs(true, 6, 101100), Run::Code);
        assert_eq!(s.runs(true, 6, 110000), Run::Skip);
        assert_eq!(s.runs(false, 5, 99997), Run::Uncertain);
    }

    #[test]
    fn mysql_rules() {
        let s = Server::mysql(80036);
        assert_eq!(s.runs(true, 6, 100100), Run::Comment);
        assert_eq!(s.runs(true, 0, 0), Run::Comment);
        assert_eq!(s.runs(false, 5, 80036), Run::Code);
        assert_eq!(s.runs(false, 5, 80037), Run::Skip);
        assert_eq!(s.runs(false, 6, 100000), Run::Uncertain);
    }

    #[test]
    fn several_servers_must_agree() {
        let both = Server::mariadb(100611).or(Server::mariadb(101119));
        assert_eq!(both.runs(true, 6, 100700), Run::Uncertain);
        assert_eq!(both.runs(true, 6, 100500), Run::Code);
        assert_eq!(both.runs(true, 6, 110000), Run::Skip);
        let u = Server::UNKNOWN;
        assert_eq!(u.runs(false, 0, 0), Run::Code);
        assert_eq!(u.runs(false, 5, 40101), Run::Code);
        assert_eq!(u.runs(false, 5, 50500), Run::Code);
        assert_eq!(u.runs(false, 5, 50501), Run::Uncertain);
        assert_eq!(u.runs(false, 5, 90000), Run::Uncertain);
        assert_eq!(u.runs(true, 6, 100100), Run::Uncertain);
        assert_eq!(Server::default(), Server::UNKNOWN);
    }
}
