//! Every error a client got, by kind, and which of them are explained: the server's own
//! refusals (deadlocks, lock waits), and holdfast's 1213 and 1180 as far as its metrics
//! count the replays and lost COMMITs behind them. Anything else (a lost connection, a 1317,
//! a refused login, a read-only node) is unexplained: holdfast promises to hide those.

use std::collections::BTreeMap;

use super::history::{Op, OpError};

/// What holdfast's metrics say it did during the run (their increase).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recovered {
    /// Transactions it rolled back and answered 1213 for: replays that diverged or
    /// failed, lost COMMITs whose marker said not committed and that were not replayed.
    pub rolled_back: f64,
    /// Lost COMMITs whose outcome it could not learn (the client got 1180).
    pub unknown: f64,
}

/// The kind of an error, for counting.
pub fn kind(e: &OpError) -> String {
    match e.code {
        1213 if e.message.contains("holdfast") => "1213 rolled back by holdfast".into(),
        1213 => "1213 deadlock".into(),
        1205 => "1205 lock wait timeout".into(),
        1180 => "1180 commit outcome unknown".into(),
        0 => format!("client: {}", first_words(&e.message)),
        code => format!("{code}: {}", first_words(&e.message)),
    }
}

fn first_words(message: &str) -> String {
    message
        .split_whitespace()
        .take(6)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Errors by kind, with how many of each are unexplained.
#[derive(Debug, Default)]
pub struct Classified {
    /// Kind -> (count, unexplained).
    pub by_kind: BTreeMap<String, (u64, u64)>,
    /// Indexes of the unexplained errors' operations.
    pub unexplained: Vec<usize>,
}

impl Classified {
    pub fn unexplained_count(&self) -> u64 {
        self.unexplained.len() as u64
    }

    /// `1213 deadlock 12, client: ... 1 (unexplained 1)`.
    pub fn summary(&self) -> String {
        if self.by_kind.is_empty() {
            return "none".into();
        }
        self.by_kind
            .iter()
            .map(|(k, (n, u))| match u {
                0 => format!("{k} x{n}"),
                u => format!("{k} x{n} ({u} unexplained)"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Classifies the errors of `ops` (every one of the history, or those of a window).
/// `recovered`: what holdfast counted; `None` when its errors are not to be matched with its
/// counters (a window of the run), then they count as explained.
pub fn classify<'a>(
    ops: impl Iterator<Item = (usize, &'a Op)>,
    recovered: Option<Recovered>,
) -> Classified {
    let mut out = Classified::default();
    let mut rolled_back = 0.0;
    let mut unknown = 0.0;
    for (i, op) in ops {
        let Some(e) = &op.error else { continue };
        let k = kind(e);
        let explained = match e.code {
            1213 if e.message.contains("holdfast") => {
                rolled_back += 1.0;
                recovered.is_none_or(|r| rolled_back <= r.rolled_back)
            }
            1213 | 1205 => true,
            1180 => {
                unknown += 1.0;
                recovered.is_none_or(|r| unknown <= r.unknown)
            }
            _ => false,
        };
        let entry = out.by_kind.entry(k).or_default();
        entry.0 += 1;
        if !explained {
            entry.1 += 1;
            out.unexplained.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::history::{Body, Listener, Outcome};
    use super::*;

    fn op(code: u16, message: &str) -> Op {
        Op {
            client: 0,
            listener: Listener::Main,
            prepared: false,
            explicit: true,
            start_ms: 0,
            end_ms: 1,
            body: Body::List(Vec::new()),
            outcome: Outcome::Fail,
            error: Some(OpError {
                code,
                message: message.into(),
                at_commit: true,
            }),
        }
    }

    #[test]
    fn holdfast_errors_are_explained_by_its_counters_only() {
        let ops = [
            op(1213, "Deadlock found when trying to get lock"),
            op(
                1213,
                "Deadlock found ... (holdfast: the database node was lost ...)",
            ),
            op(
                1213,
                "Deadlock found ... (holdfast: the database node was lost ...)",
            ),
            op(1180, "Got error during COMMIT"),
            op(0, "Connection reset by peer"),
            op(1317, "Query execution was interrupted"),
        ];
        let r = Recovered {
            rolled_back: 1.0,
            unknown: 1.0,
        };
        let c = classify(ops.iter().enumerate(), Some(r));
        assert_eq!(c.unexplained, vec![2, 4, 5]);
        assert_eq!(c.by_kind["1213 deadlock"], (1, 0));
        assert_eq!(c.by_kind["1213 rolled back by holdfast"], (2, 1));
        let all = classify(ops.iter().enumerate(), None);
        assert_eq!(all.unexplained, vec![4, 5]);
    }
}
