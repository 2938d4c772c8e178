//! The server's session trackers, which holdfast reads the session's state from, around
//! the statements that read or set their settings: the client is shown its own settings
//! (see [`crate::client_trackers`]) and holdfast's are put back after.

use super::{End, Session};
use crate::backend::BackendError;

impl Session {
    /// Re-enables the trackers after the server reset the session's variables.
    pub(super) async fn restore_trackers(&mut self) -> Result<(), End> {
        // The server reset the session: its transaction tracker is off again.
        self.tracks_transactions = false;
        match self.backend.enable_trackers().await {
            Ok(ok) => {
                self.record.untracked = !ok;
                Ok(())
            }
            Err(BackendError::Conn(e)) => Err(End::Backend(e)),
            Err(e) => Err(End::Protocol(e.to_string())),
        }
    }

    /// Turns the transaction tracker on before the session's first `SET TRANSACTION`
    /// (see [`crate::restore::TRACK_TRANSACTIONS`]). A `SET` without tables: it leaves the warnings
    /// and `FOUND_ROWS()` as they were and `ROW_COUNT()` at 0, as the client's `SET
    /// TRANSACTION` right after it does anyway.
    pub(super) async fn track_transactions(&mut self) -> Result<(), End> {
        if self.tracks_transactions || self.record.untracked || self.backend_dead {
            return Ok(());
        }
        match self
            .run_own(crate::restore::TRACK_TRANSACTIONS.as_bytes())
            .await
        {
            Ok(_) => self.tracks_transactions = true,
            Err(BackendError::Conn(error)) => {
                return Err(End::BackendLost {
                    started: false,
                    error,
                })
            }
            Err(e) => {
                tracing::info!(session = self.info.id, error = %e, "cannot track next-transaction characteristics");
            }
        }
        Ok(())
    }

    /// Gives the backend session the client's own tracker settings for one statement
    /// ([`Session::reassert_trackers`] puts holdfast's back after it), keeping
    /// `FOUND_ROWS()` and `ROW_COUNT()`.
    pub(super) async fn show_client_trackers(&mut self) -> Result<(), End> {
        if self.backend_dead {
            return Ok(());
        }
        let lost = |e: crate::restore::CaptureError| match e {
            crate::restore::CaptureError::Backend(BackendError::Conn(e)) => End::Backend(e),
            e => End::Protocol(format!("giving the session the client's trackers: {e}")),
        };
        let before = crate::restore::read_diagnostics(&mut self.backend)
            .await
            .map_err(lost)?;
        let set = self.record.client_trackers.set_statement();
        self.run_own(set.as_bytes())
            .await
            .map_err(|e| lost(e.into()))?;
        crate::restore::put_back_diagnostics(&mut self.backend, before)
            .await
            .map_err(lost)
    }

    /// Reads the client's new `session_track_*` settings after it set one of them, and
    /// puts holdfast's trackers back (the client is shown what its own settings produce,
    /// see [`crate::client_trackers`]). A `SELECT` without tables and `SET`s keep the
    /// warnings; `FOUND_ROWS()` and `ROW_COUNT()` are read before and put back after.
    pub(super) async fn reassert_trackers(&mut self) -> Result<(), End> {
        self.record.trackers_overridden = false;
        if self.backend_dead {
            return Ok(());
        }
        let lost = |e: crate::restore::CaptureError| match e {
            crate::restore::CaptureError::Backend(BackendError::Conn(e)) => End::Backend(e),
            e => End::Protocol(format!("restoring holdfast's session trackers: {e}")),
        };
        let before = crate::restore::read_diagnostics(&mut self.backend)
            .await
            .map_err(lost)?;
        let names = [
            "session_track_system_variables",
            "session_track_schema",
            "session_track_state_change",
            "session_track_transaction_info",
        ];
        let select = format!(
            "SELECT @@session.{}{}",
            names.join(", @@session."),
            crate::restore::NO_LIMIT
        );
        let values = self
            .run_own(select.as_bytes())
            .await
            .map_err(|e| lost(e.into()))?;
        // A value that differs from holdfast's own is the client's; one that does not was
        // either not set by it or reported when it was (under holdfast's `*`).
        let transaction_info: &[u8] = match self.tracks_transactions {
            true => b"CHARACTERISTICS",
            false => b"OFF",
        };
        let holdfasts: [&[u8]; 4] = [b"*", b"1", b"1", transaction_info];
        if let Some(row) = values.rows.first() {
            for ((name, value), own) in names.iter().zip(row).zip(holdfasts) {
                let value = value.as_deref().unwrap_or_default();
                if !value.eq_ignore_ascii_case(own) {
                    self.record.client_trackers.set(name.as_bytes(), value);
                }
            }
        }
        let mut statements = vec![holdfast_client::ENABLE_TRACKERS];
        if self.tracks_transactions {
            statements.push(crate::restore::TRACK_TRANSACTIONS);
        }
        for sql in statements {
            self.run_own(sql.as_bytes())
                .await
                .map_err(|e| lost(e.into()))?;
        }
        crate::restore::put_back_diagnostics(&mut self.backend, before)
            .await
            .map_err(lost)?;
        self.row_count_not_put_back(before.row_count);
        Ok(())
    }
}

/// Whether a statement's text has `session_track` in it (any case): a look at the bytes
/// around each `_` only.
pub(super) fn mentions_trackers(sql: &[u8]) -> bool {
    const WORD: &[u8] = b"session_track";
    const UNDERSCORE_AT: usize = 7;
    sql.iter().enumerate().any(|(i, &b)| {
        b == b'_'
            && i >= UNDERSCORE_AT
            && sql
                .get(i - UNDERSCORE_AT..i - UNDERSCORE_AT + WORD.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(WORD))
    })
}

#[cfg(test)]
mod tracker_mention_tests {
    #[test]
    fn finds_session_track_in_any_case() {
        assert!(super::mentions_trackers(b"SELECT @@Session_Track_Schema"));
        assert!(super::mentions_trackers(
            b"SHOW VARIABLES LIKE 'session_track%'"
        ));
        assert!(super::mentions_trackers(b"session_track"));
        assert!(!super::mentions_trackers(b"SELECT session_trac, _x FROM t"));
        assert!(!super::mentions_trackers(b"_"));
    }
}
