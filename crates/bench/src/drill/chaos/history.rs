//! What the chaos drill's clients record: one [`Op`] per transaction (or autocommit
//! statement), with what it asked, what it saw and how it ended.

/// Which of holdfast's listeners a client went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    Main,
    Split,
}

/// How an operation ended, as Jepsen records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: the COMMIT (or the autocommit statement) got its OK.
    Ok,
    /// The server said it did not happen (a rollback it reported, or an error before the
    /// COMMIT was sent).
    Fail,
    /// Unknown: it may or may not have happened (the COMMIT's answer was lost, 1180 ...).
    Info,
}

/// One micro-operation of a list-append transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    /// Appends `value` (unique across the run) to the list at `key`.
    Append { key: u32, value: u64 },
    /// Reads the list at `key`; `None` until the read answered.
    Read { key: u32, list: Option<Vec<u64>> },
}

/// What an operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A list-append transaction.
    List(Vec<Mop>),
    /// A bank transfer between two accounts; `id` (unique across the run) names its two
    /// legs in the ledger.
    Transfer {
        id: u64,
        from: u32,
        to: u32,
        amount: i64,
    },
    /// A read of every account's balance (in account order); `None` until answered.
    Balances(Option<Vec<i64>>),
    /// A login that failed (recorded for its error; it did nothing).
    Connect,
}

/// An error a client got, as it got it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    /// The server's (or holdfast's) error code; 0 when it is the driver's (the connection
    /// was lost, a timeout).
    pub code: u16,
    pub message: String,
    /// The error answered the COMMIT (or the autocommit statement itself).
    pub at_commit: bool,
}

/// One operation of one client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: u32,
    pub listener: Listener,
    /// Prepared statements (binary protocol) rather than text queries.
    pub prepared: bool,
    /// Inside `START TRANSACTION ... COMMIT` rather than autocommit.
    pub explicit: bool,
    /// Milliseconds since the run started.
    pub start_ms: u64,
    pub end_ms: u64,
    pub body: Body,
    pub outcome: Outcome,
    pub error: Option<OpError>,
}

impl Op {
    /// The appends of a list-append operation.
    pub fn appends(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let mops: &[Mop] = match &self.body {
            Body::List(m) => m,
            _ => &[],
        };
        mops.iter().filter_map(|m| match m {
            Mop::Append { key, value } => Some((*key, *value)),
            Mop::Read { .. } => None,
        })
    }

    /// A short description for reports: `op 12 (client 3, split, prepared, txn, ok)`.
    pub fn label(&self, index: usize) -> String {
        format!(
            "op {index} (client {}, {}, {}, {}, {:?} at {} ms)",
            self.client,
            match self.listener {
                Listener::Main => "main",
                Listener::Split => "split",
            },
            if self.prepared { "prepared" } else { "text" },
            if self.explicit { "txn" } else { "autocommit" },
            self.outcome,
            self.end_ms
        )
    }
}

/// Parses a list column (`1,2,3`; empty or NULL: the empty list). A value that is not a
/// number becomes `u64::MAX`, which no client writes: the checker reports it as garbage.
pub fn parse_list(text: Option<&str>) -> Vec<u64> {
    match text {
        None | Some("") => Vec::new(),
        Some(t) => t
            .split(',')
            .map(|v| v.trim().parse().unwrap_or(u64::MAX))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse() {
        assert_eq!(parse_list(None), Vec::<u64>::new());
        assert_eq!(parse_list(Some("")), Vec::<u64>::new());
        assert_eq!(parse_list(Some("1,22,3")), vec![1, 22, 3]);
        assert_eq!(parse_list(Some("1,x")), vec![1, u64::MAX]);
    }
}
