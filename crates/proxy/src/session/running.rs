//! The statement a request runs, shown in `/status` (and so on the dashboard) once the
//! request has run past [`super::relay::WATCH_CLIENT_AFTER`], the moment holdfast starts
//! watching its client anyway. A quick request pays for copying at most [`SHOWN_MAX`]
//! bytes into a buffer the session owns (allocated once, and let go while the session
//! idles): no lock, nothing other threads read. Only a slow one publishes its text, and
//! takes it back when answered.

use super::statements::Statements;
use crate::registry::{RunningStatement, SessionInfo};
use holdfast_wire::command::{self, COM_QUERY, COM_STMT_BULK_EXECUTE, COM_STMT_EXECUTE};
use holdfast_wire::frame::HEADER_LEN;
use std::sync::Arc;
use std::time::Instant;

/// Bytes of a statement's text that are shown (the rest is cut, marked with "…").
pub(super) const SHOWN_MAX: usize = 256;

/// The request running now, as far as showing it goes.
pub(super) struct Running {
    /// The start of a COM_QUERY's text.
    head: Vec<u8>,
    /// The text went on past `head`.
    cut: bool,
    /// Its command.
    command: u8,
    /// The client's statement id, for an execute.
    statement: Option<u32>,
    /// When it came.
    since: Instant,
    /// Its text is in the session's [`SessionInfo::statement`].
    shown: bool,
}

impl Default for Running {
    fn default() -> Self {
        Running {
            head: Vec::new(),
            cut: false,
            command: 0,
            statement: None,
            since: Instant::now(),
            shown: false,
        }
    }
}

impl Running {
    /// A request came (`request`: its whole first packet, header included).
    pub fn begin(&mut self, request: &[u8], since: Instant) {
        self.command = request.get(HEADER_LEN).copied().unwrap_or_default();
        self.since = since;
        self.head.clear();
        self.cut = false;
        self.statement = None;
        let body = request.get(HEADER_LEN + 1..).unwrap_or_default();
        match self.command {
            COM_QUERY => {
                self.head
                    .extend_from_slice(&body[..body.len().min(SHOWN_MAX)]);
                self.cut = body.len() > SHOWN_MAX;
            }
            COM_STMT_EXECUTE | COM_STMT_BULK_EXECUTE => {
                self.statement = body
                    .get(..4)
                    .and_then(|id| id.try_into().ok())
                    .map(u32::from_le_bytes);
            }
            _ => {}
        }
    }

    /// When the request came.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// The request has run for a while: its text goes where `/status` reads it (once).
    pub fn show(&mut self, info: &SessionInfo, statements: &Statements) {
        if self.shown {
            return;
        }
        self.shown = true;
        let text = match (self.command, self.statement) {
            (COM_QUERY, _) => shown(&self.head, self.cut),
            (_, Some(id)) => match statements.get(statements.resolve(id)) {
                Some(stmt) => {
                    let sql = &stmt.sql[..stmt.sql.len().min(SHOWN_MAX)];
                    shown(sql, stmt.sql.len() > SHOWN_MAX)
                }
                None => format!("{} of an unknown statement", command::name(self.command)),
            },
            (other, _) => command::name(other).to_string(),
        };
        info.statement.store(Some(Arc::new(RunningStatement {
            text,
            since: self.since,
        })));
    }

    /// The session idles: its buffer goes.
    pub fn release(&mut self) {
        self.head = Vec::new();
    }

    /// The request is answered: a text shown is taken back.
    pub fn end(&mut self, info: &SessionInfo) {
        if std::mem::take(&mut self.shown) {
            info.statement.store(None);
        }
    }
}

/// A statement's text as shown: whitespace runs as one space, cut marked with "…" (a
/// character cut in two is dropped).
fn shown(text: &[u8], cut: bool) -> String {
    let mut s = String::from_utf8_lossy(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if cut {
        if s.ends_with('\u{fffd}') {
            s.pop();
        }
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddr};

    fn request(command: u8, body: &[u8]) -> Vec<u8> {
        let mut r = vec![0, 0, 0, 0, command];
        r.extend_from_slice(body);
        r
    }

    fn info() -> SessionInfo {
        SessionInfo::new(1, SocketAddr::from((Ipv4Addr::LOCALHOST, 1)))
    }

    #[test]
    fn a_query_is_shown_only_when_asked_and_taken_back_when_answered() {
        let (info, statements) = (info(), Statements::default());
        let mut running = Running::default();
        running.begin(&request(COM_QUERY, b"SELECT\n  SLEEP(5)"), Instant::now());
        assert!(info.statement.load().is_none(), "nothing stored at begin");
        running.show(&info, &statements);
        let shown = info.statement.load_full().map(|s| s.text.clone());
        assert_eq!(shown.as_deref(), Some("SELECT SLEEP(5)"));
        running.end(&info);
        assert!(info.statement.load().is_none());
    }

    #[test]
    fn a_long_text_is_cut_and_marked() {
        let (info, statements) = (info(), Statements::default());
        let mut running = Running::default();
        let mut text = b"SELECT '".to_vec();
        text.extend(std::iter::repeat_n(b'x', 400));
        text.extend_from_slice(b"'");
        running.begin(&request(COM_QUERY, &text), Instant::now());
        running.show(&info, &statements);
        let shown = info.statement.load_full().map(|s| s.text.clone());
        let shown = shown.unwrap_or_default();
        assert!(shown.ends_with('…'), "{shown}");
        assert_eq!(shown.chars().count(), SHOWN_MAX + 1);
        // A multi-byte character cut in two is dropped, not shown as a replacement.
        let mut text = vec![b'a'; SHOWN_MAX - 1];
        text.extend_from_slice("é and more".as_bytes());
        running.end(&info);
        running.begin(&request(COM_QUERY, &text), Instant::now());
        running.show(&info, &statements);
        let shown = info.statement.load_full().map(|s| s.text.clone());
        let shown = shown.unwrap_or_default();
        assert!(
            !shown.contains('\u{fffd}') && shown.ends_with("a…"),
            "{shown}"
        );
    }

    #[test]
    fn an_execute_of_an_unknown_statement_and_other_commands_are_named() {
        let (info, statements) = (info(), Statements::default());
        let mut running = Running::default();
        running.begin(&request(COM_STMT_EXECUTE, &[7, 0, 0, 0, 0]), Instant::now());
        running.show(&info, &statements);
        let shown = info.statement.load_full().map(|s| s.text.clone());
        assert_eq!(
            shown.as_deref(),
            Some("COM_STMT_EXECUTE of an unknown statement")
        );
        running.end(&info);
        running.begin(&request(command::COM_PING, &[]), Instant::now());
        running.show(&info, &statements);
        let shown = info.statement.load_full().map(|s| s.text.clone());
        assert_eq!(shown.as_deref(), Some("COM_PING"));
    }
}
