//! The differential fuzzer for routing and rewriting (issue 18, part 2): random client
//! sessions from a grammar ([`gen`]) run directly against the primary, through holdfast's
//! main listener and through its split listener, each on fresh, identical state; what the
//! client saw ([`crate::differential`]) and what the session did on the servers
//! ([`effects`]: binlog events, data, locks held at its end, writes on a replica) must be
//! the same. A difference is minimised (steps dropped while it stays) and reported.
//!
//! The targets run one after the other on the same schema names: before each, the schemas
//! `fuzz` and `fuzz_b` are dropped and made again ([`SETUP`]) and the replicas wait until
//! they applied it, so auto-increment counters, sequences and error messages (which name
//! schemas) are the same for every target.

pub mod effects;
pub mod gen;

use crate::differential::{differences, login_outcome, step_outcome, Outcome, Step};
use crate::raw::{RawConn, BASE_CAPS};
use anyhow::{bail, Context, Result};
use effects::{Checker, Effects};
use gen::{Grammar, Session};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The starting state of every run of a session (one COM_QUERY, multi-statements).
pub const SETUP: &str = "SET SESSION lock_wait_timeout = 30; \
    DROP DATABASE IF EXISTS fuzz; DROP DATABASE IF EXISTS fuzz_b; \
    CREATE DATABASE fuzz; CREATE DATABASE fuzz_b; \
    CREATE TABLE fuzz.t (id INT AUTO_INCREMENT PRIMARY KEY, k INT, v VARCHAR(20), UNIQUE KEY (k)); \
    INSERT INTO fuzz.t (k, v) VALUES (1, 'a'), (2, 'x;y'), (3, 'it''s'), (4, '\"q\"'), (5, NULL); \
    CREATE TABLE fuzz.u (id INT PRIMARY KEY, n INT); \
    INSERT INTO fuzz.u VALUES (1, 10), (2, 20); \
    CREATE SEQUENCE fuzz.s START WITH 1 INCREMENT BY 1; \
    CREATE TABLE fuzz_b.t (k INT PRIMARY KEY, v VARCHAR(20)); \
    INSERT INTO fuzz_b.t VALUES (1, 'b1'), (2, 'b2'); \
    CREATE PROCEDURE fuzz.p_ins(x INT) INSERT INTO t (k, v) VALUES (x, 'p'); \
    CREATE PROCEDURE fuzz.p_sel() SELECT id, k, v FROM t ORDER BY id; \
    CREATE PROCEDURE fuzz.p_lock() DO GET_LOCK('fz_p', 0); \
    CREATE PROCEDURE fuzz.p_var() SET @pv = (SELECT COUNT(*) FROM t); \
    CREATE PROCEDURE fuzz.p_tmp() CREATE TEMPORARY TABLE IF NOT EXISTS tt (a INT PRIMARY KEY)";

/// How often a long run prints where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(300);

/// Where the sessions go, and the nodes the checks read.
#[derive(Debug, Clone)]
pub struct Targets {
    /// The primary itself.
    pub direct: SocketAddr,
    /// holdfast's main listener.
    pub main: SocketAddr,
    /// holdfast's split listener.
    pub split: SocketAddr,
    pub user: String,
    pub password: String,
    /// The replicas' addresses (checked for writes, and waited for after the setup).
    pub replicas: Vec<SocketAddr>,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Stop after this many sessions...
    pub sessions: Option<u64>,
    /// ... or once this much time passed (the session under way ends first).
    pub duration: Option<Duration>,
    /// Run only session number K of the seed (a reproduction).
    pub only: Option<u64>,
    /// Time allowed to minimise one difference.
    pub shrink_budget: Duration,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub sessions: u64,
    pub steps: u64,
    /// Statements, counting each part of a multi-statement.
    pub statements: u64,
    /// Sessions that differed on some target.
    pub differing_sessions: u64,
    /// Distinct differences (by signature), with how often each was seen.
    pub distinct: BTreeMap<String, u64>,
    /// Direct runs that differed from each other (see [`Fuzzer::against`]).
    pub unstable: u64,
    pub elapsed: Duration,
}

impl Report {
    pub fn pass(&self) -> bool {
        self.differing_sessions == 0
    }

    pub fn verdict(&self, seed: u64) -> String {
        format!(
            "fuzz: seed {seed}, {} sessions, {} requests ({} statements), {} sessions differed \
             ({} distinct differences; the server differed from itself {} times) in {:.0} s: {}",
            self.sessions,
            self.steps,
            self.statements,
            self.differing_sessions,
            self.distinct.len(),
            self.unstable,
            self.elapsed.as_secs_f64(),
            if self.pass() { "PASS" } else { "FAIL" }
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Main,
    Split,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Main => "main",
            Via::Split => "split",
        }
    }
}

/// One run of a session on one target.
struct Run {
    outcomes: Vec<Outcome>,
    effects: Effects,
}

pub struct Fuzzer {
    targets: Targets,
    grammar: Grammar,
    checker: Checker,
    /// Sessions whose two direct runs differed (the server's own nondeterminism).
    pub unstable: u64,
}

impl Fuzzer {
    pub fn new(targets: Targets) -> Result<Fuzzer> {
        let mut checker = Checker::connect(&targets)?;
        let grammar = Grammar {
            server_version: checker.server_version()?,
        };
        Ok(Fuzzer {
            targets,
            grammar,
            checker,
            unstable: 0,
        })
    }

    /// The session number `k` of `seed`.
    pub fn session(&self, seed: u64, k: u64) -> Session {
        let mut r = StdRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k);
        self.grammar.session(&mut r)
    }

    /// Runs the plan, printing a line per difference (and its minimised reproduction)
    /// through `out`.
    pub fn run(&mut self, plan: &Plan, out: &mut dyn FnMut(&str)) -> Result<Report> {
        let started = Instant::now();
        let mut report = Report::default();
        let mut k = plan.only.unwrap_or(0);
        let mut progress = started;
        loop {
            if progress.elapsed() >= PROGRESS_EVERY {
                progress = Instant::now();
                out(&format!(
                    "progress at {:.0} s: {} sessions, {} requests ({} statements), {} sessions \
                     differed ({} distinct)",
                    started.elapsed().as_secs_f64(),
                    report.sessions,
                    report.steps,
                    report.statements,
                    report.differing_sessions,
                    report.distinct.len()
                ));
            }
            if plan.only.is_some() && report.sessions == 1 {
                break;
            }
            if plan.sessions.is_some_and(|n| report.sessions >= n)
                || plan.duration.is_some_and(|d| started.elapsed() >= d)
            {
                break;
            }
            let session = self.session(plan.seed, k);
            report.sessions += 1;
            report.steps += session.steps.len() as u64;
            report.statements += session.steps.iter().map(statements_in).sum::<u64>();
            let found = self.compare(&session)?;
            if !found.is_empty() {
                report.differing_sessions += 1;
            }
            for (via, diff) in found {
                let signature = format!("{} {}", via.name(), diff.signature);
                let seen = report.distinct.entry(signature.clone()).or_insert(0);
                *seen += 1;
                if *seen > 1 {
                    out(&format!(
                        "DIFF session {k} ({}): again: {signature}",
                        via.name()
                    ));
                    continue;
                }
                out(&format!(
                    "DIFF session {k} ({}): {signature}\n{}",
                    via.name(),
                    indent(&diff.text)
                ));
                let kind = diff.kinds.first().cloned().unwrap_or_default();
                let small = self.shrink(&session, via, &kind, plan.shrink_budget)?;
                out(&format!(
                    "  reproduction ({} of {} steps; --seed {} --session {k}):\n{}",
                    small.steps.len(),
                    session.steps.len(),
                    plan.seed,
                    indent(&reproduction(&small))
                ));
                if let Some(d) = self.differs(&small, via)? {
                    out(&format!("  minimised difference:\n{}", indent(&d.text)));
                }
            }
            k += 1;
        }
        report.elapsed = started.elapsed();
        report.unstable = self.unstable;
        Ok(report)
    }

    /// Runs `session` directly, then through each listener: the differences found.
    pub fn compare(&mut self, session: &Session) -> Result<Vec<(Via, Difference)>> {
        let mut direct = vec![self.run_on(self.targets.direct, session)?];
        let mut found = Vec::new();
        for via in [Via::Main, Via::Split] {
            let run = self.run_on(self.address(via), session)?;
            if let Some(d) = self.against(session, &mut direct, &run)? {
                found.push((via, d));
            }
        }
        Ok(found)
    }

    /// The difference between `run` and the direct runs of `session`. A first difference
    /// is checked against a second direct run: what the server itself answers differently
    /// from one run to the next (`FOUND_ROWS()` after statements that leave it undefined,
    /// InnoDB's background work) is no difference of holdfast's, as long as holdfast's
    /// answer is one the server gave.
    fn against(
        &mut self,
        session: &Session,
        direct: &mut Vec<Run>,
        run: &Run,
    ) -> Result<Option<Difference>> {
        let Some(first) = direct.first() else {
            return Ok(None);
        };
        let Some(d) = difference(session, first, run) else {
            return Ok(None);
        };
        if direct.len() == 1 {
            direct.push(self.run_on(self.targets.direct, session)?);
            if difference(session, &direct[0], &direct[1]).is_some() {
                self.unstable += 1;
            }
        }
        Ok(direct[1..]
            .iter()
            .all(|again| difference(session, again, run).is_some())
            .then_some(d))
    }

    fn address(&self, via: Via) -> SocketAddr {
        match via {
            Via::Main => self.targets.main,
            Via::Split => self.targets.split,
        }
    }

    /// Whether `session` differs between the primary and `via`.
    fn differs(&mut self, session: &Session, via: Via) -> Result<Option<Difference>> {
        let mut direct = vec![self.run_on(self.targets.direct, session)?];
        let run = self.run_on(self.address(via), session)?;
        self.against(session, &mut direct, &run)
    }

    /// Drops steps (the last first) while the difference stays (its first kind: another
    /// difference the shorter session happens to show is not the one being minimised);
    /// then clears pauses.
    fn shrink(
        &mut self,
        session: &Session,
        via: Via,
        kind: &str,
        budget: Duration,
    ) -> Result<Session> {
        let started = Instant::now();
        let mut best = session.clone();
        let mut i = best.steps.len();
        while i > 0 && started.elapsed() < budget {
            i -= 1;
            let mut candidate = best.clone();
            candidate.steps.remove(i);
            candidate.pauses.remove(i);
            if self
                .differs(&candidate, via)?
                .is_some_and(|d| d.kinds.iter().any(|k| k == kind))
            {
                best = candidate;
            }
        }
        for i in 0..best.pauses.len() {
            if started.elapsed() >= budget || best.pauses[i].is_zero() {
                continue;
            }
            let mut candidate = best.clone();
            candidate.pauses[i] = Duration::ZERO;
            if self
                .differs(&candidate, via)?
                .is_some_and(|d| d.kinds.iter().any(|k| k == kind))
            {
                best = candidate;
            }
        }
        Ok(best)
    }

    /// Fresh state, then `session` on `addr` with its effects.
    fn run_on(&mut self, addr: SocketAddr, session: &Session) -> Result<Run> {
        self.checker.reset().context("resetting the schema")?;
        let mark = self.checker.mark().context("reading the binlog position")?;
        let login = (
            self.targets.user.as_str(),
            self.targets.password.as_str(),
            Some("fuzz"),
        );
        let mut c = RawConn::connect(addr, login.0, login.1, login.2, session.caps)
            .with_context(|| format!("connecting to {addr}"))?;
        let mut outcomes = vec![login_outcome(&c)];
        // `FOUND_ROWS()` before a connection's first SELECT is what the server's thread
        // cache left (MariaDB reuses a closed connection's THD without resetting it): the
        // session starts with one, not compared, so that a read of it after a SELECT that
        // failed is defined.
        c.query("SELECT 1").context("the session's first SELECT")?;
        let mut lost = false;
        for (step, pause) in session.steps.iter().zip(&session.pauses) {
            match step_outcome(&mut c, step) {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    // The connection failed: that is what the client saw; the session ends.
                    outcomes.push(Outcome::Err {
                        code: 0,
                        state: String::new(),
                        message: format!("connection lost: {}", first_line(&format!("{e:#}"))),
                    });
                    lost = true;
                    break;
                }
            }
            if !pause.is_zero() {
                std::thread::sleep(*pause);
            }
        }
        let locks = if lost {
            Vec::new()
        } else {
            self.checker.locks().context("reading the locks held")?
        };
        // COM_QUIT; then the session's connections must go (their locks with them).
        let _ = c.command(&[0x01]);
        drop(c);
        self.checker
            .wait_sessions_gone()
            .context("waiting for the session's connections to close")?;
        let effects = self
            .checker
            .effects(&mark, locks)
            .context("reading the session's effects")?;
        Ok(Run { outcomes, effects })
    }
}

/// A difference between the direct run and one through holdfast.
#[derive(Debug, Clone)]
pub struct Difference {
    /// Short and stable: what differed, with digits left out (to count repeats).
    pub signature: String,
    /// What differed: the first answer that did, then each kind of effect.
    pub kinds: Vec<String>,
    /// Side by side.
    pub text: String,
}

fn difference(session: &Session, direct: &Run, via: &Run) -> Option<Difference> {
    let outcomes = differences(&session.steps, &direct.outcomes, &via.outcomes);
    let mut text = outcomes.clone();
    let mut kinds = Vec::new();
    if !outcomes.is_empty() {
        let first = outcomes.lines().next().unwrap_or("");
        // "step 3 Query(\"...\")": the statement, without numbers.
        let what = first.split_once(' ').map_or(first, |(_, rest)| rest);
        let what = what.split_once(' ').map_or(what, |(_, rest)| rest);
        kinds.push(format!("answer to {}", without_digits(what)));
    }
    for (kind, d, v) in direct.effects.fields(&via.effects) {
        if d != v {
            kinds.push(kind.to_string());
            let _ = writeln!(text, "{kind}\n  server:   {d:?}\n  holdfast: {v:?}");
        }
    }
    if !via.effects.replica_writes.is_empty() {
        kinds.push("written on a replica".into());
        let _ = writeln!(
            text,
            "written on a replica: {:?}",
            via.effects.replica_writes
        );
    }
    if kinds.is_empty() {
        return None;
    }
    Some(Difference {
        signature: kinds.join(", "),
        kinds,
        text,
    })
}

fn without_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut last_digit = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('N');
            }
            last_digit = true;
        } else {
            out.push(c);
            last_digit = false;
        }
    }
    out
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The session as a test would write it.
pub fn reproduction(s: &Session) -> String {
    let mut out = format!("caps {:#x}{}\n", s.caps, caps_note(s.caps));
    for (step, pause) in s.steps.iter().zip(&s.pauses) {
        let line = match step {
            Step::Query(sql) => format!("q({sql:?})"),
            Step::Binary(sql) => format!("binary({sql:?})"),
            other => format!("{other:?}"),
        };
        let _ = write!(out, "{line},");
        if !pause.is_zero() {
            let _ = write!(out, " // then {} ms idle", pause.as_millis());
        }
        out.push('\n');
    }
    out
}

fn caps_note(caps: u32) -> String {
    use holdfast_wire::caps::*;
    let mut names = vec!["BASE_CAPS"];
    if caps & CLIENT_DEPRECATE_EOF != 0 && BASE_CAPS & CLIENT_DEPRECATE_EOF == 0 {
        names.push("CLIENT_DEPRECATE_EOF");
    }
    if caps & CLIENT_SESSION_TRACK != 0 && BASE_CAPS & CLIENT_SESSION_TRACK == 0 {
        names.push("CLIENT_SESSION_TRACK");
    }
    format!(" ({})", names.join(" | "))
}

/// Statements in a step (a multi-statement counts each part).
fn statements_in(step: &Step) -> u64 {
    match step {
        Step::Query(sql) | Step::Masked(sql, _) => sql
            .split(';')
            .filter(|p| !p.trim().is_empty())
            .count()
            .max(1) as u64,
        _ => 1,
    }
}

/// `10.11.19-MariaDB-...` → 101119.
pub fn version_number(version: &str) -> Result<u32> {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>());
    let (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) = (parts.next(), parts.next(), parts.next()) else {
        bail!("cannot read the version {version:?}");
    };
    Ok(a * 10_000 + b * 100 + c)
}
