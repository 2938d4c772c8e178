//! What a client may learn when holdfast itself answers with an error.
//!
//! Every ERR packet holdfast writes (as opposed to the ones it relays from a server) is a
//! [`ClientError`]: an [`ErrorKind`], which fixes the MySQL code, its SQLSTATE and the
//! metric label, and a message written for the client. Internal detail (backend
//! addresses, a driver's error text) goes to the log, never into the message.
//!
//! Drivers decide on the SQLSTATE whether to retry (JDBC's `SQLTransientException` for
//! class 40, connection errors for class 08), so each kind carries the state MariaDB itself
//! sends with that code.

use std::fmt;

/// MySQL error codes holdfast reads in servers' answers.
pub mod code {
    /// Sent by a server that is shutting down.
    pub const ER_SERVER_SHUTDOWN: u16 = 1053;
    /// Sent when the connection was killed (KILL, or holdfast's own fence in a switchover).
    pub const ER_CONNECTION_KILLED: u16 = 1927;
    /// MariaDB's idle-timeout disconnect.
    pub const ER_CLIENT_IDLE_TIMEOUT: u16 = 4031;
    pub const ER_ACCESS_DENIED_ERROR: u16 = 1045;
}

/// The errors holdfast answers clients with, one per situation a client can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `proxy.max_connections` reached (1040).
    TooManyConnections,
    /// The client's handshake could not be read, or asked for what is not offered (1043).
    BadHandshake,
    /// Wrong password or unknown account, worded as the server words it (1045).
    AccessDenied,
    /// The client cannot answer the authentication method the account needs (1251).
    AuthMethodUnsupported,
    /// A command holdfast does not forward (1047).
    UnknownCommand,
    /// A request over `proxy.max_packet_size` (1153).
    PacketTooLarge,
    /// A request that cannot be parsed (1835).
    MalformedPacket,
    /// A prepared statement id the session does not hold (1243).
    UnknownStatement,
    /// The node was lost with the session's transaction open: rolled back, retry (1213,
    /// the deadlock victim's code, so applications that retry deadlocks retry this).
    TransactionRolledBack,
    /// The node was lost while a COMMIT, or a statement that commits implicitly (DDL,
    /// `BEGIN`, `SET autocommit`, `LOCK TABLES`, a prepared COMMIT...), was in flight inside
    /// a transaction; whether it committed is unknown (1180).
    CommitOutcomeUnknown,
    /// The node was lost while a statement was in flight; it may have run (1317). (A
    /// connection killed on purpose ends its session instead, as the server ends it.)
    StatementInterrupted,
    /// The session had to move and could not (no writable node within the hold window,
    /// state the new node refused); the connection closes (1927).
    SessionLost,
    /// A serverless instance did not resume in time; nothing ran (3032).
    InstanceUnavailable,
    /// No writable node is known, or none could be reached, for a new login (1053, see
    /// [`ErrorKind::code`]).
    NoBackend,
    /// A `KILL` names a connection id holdfast does not have, or one on another node
    /// (1094, the server's "Unknown thread id").
    UnknownThread,
    /// A server asked for a client file (LOCAL INFILE) for a statement that is not
    /// `LOAD DATA LOCAL`, or a replica asked during a read: not passed on (1148, the
    /// server's "The used command is not allowed").
    FileRequestRefused,
    /// A PROXY protocol header from an address not in `trusted_proxies` (1130, MariaDB's
    /// answer to one from outside `proxy_protocol_networks`).
    ProxyHeaderNotTrusted,
}

impl ErrorKind {
    pub fn code(self) -> u16 {
        match self {
            ErrorKind::TooManyConnections => 1040,
            ErrorKind::BadHandshake => 1043,
            ErrorKind::AccessDenied => code::ER_ACCESS_DENIED_ERROR,
            ErrorKind::AuthMethodUnsupported => 1251,
            ErrorKind::UnknownCommand => 1047,
            ErrorKind::PacketTooLarge => 1153,
            ErrorKind::MalformedPacket => 1835,
            ErrorKind::UnknownStatement => 1243,
            ErrorKind::TransactionRolledBack => 1213,
            ErrorKind::CommitOutcomeUnknown => 1180,
            ErrorKind::StatementInterrupted => 1317,
            ErrorKind::SessionLost => code::ER_CONNECTION_KILLED,
            ErrorKind::InstanceUnavailable => 3032,
            // Every code in an ERR packet must be a server's (< 2000 or >= 3000): clients
            // read 2000-2999 as their own, and the `mariadb` CLI reports an ERR carrying
            // 2003 as "2027 Received malformed packet". ER_SERVER_SHUTDOWN is what a
            // server that cannot serve now answers a login with; its SQLSTATE 08S01 is a
            // connection failure, which drivers and pools treat as "try again later".
            ErrorKind::NoBackend => code::ER_SERVER_SHUTDOWN,
            ErrorKind::UnknownThread => 1094,
            ErrorKind::FileRequestRefused => 1148,
            ErrorKind::ProxyHeaderNotTrusted => 1130,
        }
    }

    /// The SQLSTATE MariaDB sends with [`ErrorKind::code`].
    pub fn sql_state(self) -> &'static str {
        match self {
            ErrorKind::TooManyConnections | ErrorKind::AuthMethodUnsupported => "08004",
            ErrorKind::BadHandshake
            | ErrorKind::UnknownCommand
            | ErrorKind::PacketTooLarge
            | ErrorKind::NoBackend => "08S01",
            ErrorKind::AccessDenied => "28000",
            ErrorKind::TransactionRolledBack => "40001",
            ErrorKind::StatementInterrupted | ErrorKind::SessionLost => "70100",
            ErrorKind::MalformedPacket
            | ErrorKind::UnknownStatement
            | ErrorKind::CommitOutcomeUnknown
            | ErrorKind::InstanceUnavailable
            | ErrorKind::UnknownThread
            | ErrorKind::ProxyHeaderNotTrusted => "HY000",
            ErrorKind::FileRequestRefused => "42000",
        }
    }

    /// The label of this kind in metrics (`reason` of rejected connections and closes).
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::TooManyConnections => "too_many_connections",
            ErrorKind::BadHandshake => "bad_handshake",
            ErrorKind::AccessDenied => "access_denied",
            ErrorKind::AuthMethodUnsupported => "auth_method_unsupported",
            ErrorKind::UnknownCommand => "unknown_command",
            ErrorKind::PacketTooLarge => "packet_too_large",
            ErrorKind::MalformedPacket => "malformed_packet",
            ErrorKind::UnknownStatement => "unknown_statement",
            ErrorKind::TransactionRolledBack => "transaction_rolled_back",
            ErrorKind::CommitOutcomeUnknown => "commit_outcome_unknown",
            ErrorKind::StatementInterrupted => "statement_interrupted",
            ErrorKind::SessionLost => "session_lost",
            ErrorKind::InstanceUnavailable => "instance_unavailable",
            ErrorKind::NoBackend => "no_backend",
            ErrorKind::UnknownThread => "unknown_thread",
            ErrorKind::FileRequestRefused => "file_request_refused",
            ErrorKind::ProxyHeaderNotTrusted => "proxy_header_not_trusted",
        }
    }

    /// Every kind, for tests and documentation.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::TooManyConnections,
        ErrorKind::BadHandshake,
        ErrorKind::AccessDenied,
        ErrorKind::AuthMethodUnsupported,
        ErrorKind::UnknownCommand,
        ErrorKind::PacketTooLarge,
        ErrorKind::MalformedPacket,
        ErrorKind::UnknownStatement,
        ErrorKind::TransactionRolledBack,
        ErrorKind::CommitOutcomeUnknown,
        ErrorKind::StatementInterrupted,
        ErrorKind::SessionLost,
        ErrorKind::InstanceUnavailable,
        ErrorKind::NoBackend,
        ErrorKind::UnknownThread,
        ErrorKind::FileRequestRefused,
        ErrorKind::ProxyHeaderNotTrusted,
    ];
}

/// An error holdfast sends to a client: its kind and the message the client sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ClientError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ClientError {
            kind,
            message: message.into(),
        }
    }

    /// The ERR packet payload.
    pub fn payload(&self) -> Vec<u8> {
        holdfast_wire::packets::err_payload(self.kind.code(), self.kind.sql_state(), &self.message)
    }

    pub fn too_many_connections() -> Self {
        Self::new(ErrorKind::TooManyConnections, "Too many connections")
    }

    /// The server's own wording, so applications matching on it see no difference.
    /// `host` as the server names the client (see `VerifierCache::client_host`).
    pub fn access_denied(user: &str, host: &str, with_password: bool) -> Self {
        let using = if with_password { "YES" } else { "NO" };
        Self::new(
            ErrorKind::AccessDenied,
            format!("Access denied for user '{user}'@'{host}' (using password: {using})"),
        )
    }

    pub fn auth_method_unsupported() -> Self {
        Self::new(
            ErrorKind::AuthMethodUnsupported,
            "Client does not support authentication protocol requested by server; consider upgrading MariaDB client",
        )
    }

    pub fn transaction_rolled_back() -> Self {
        Self::new(
            ErrorKind::TransactionRolledBack,
            "Deadlock found when trying to get lock; try restarting transaction (holdfast: the database node was lost and the open transaction was rolled back)",
        )
    }

    pub fn commit_outcome_unknown() -> Self {
        Self::new(
            ErrorKind::CommitOutcomeUnknown,
            "Got error during COMMIT: holdfast lost the database node while a statement that commits (COMMIT, or one that commits implicitly) was in flight; whether the transaction committed is unknown",
        )
    }

    pub fn statement_interrupted() -> Self {
        Self::new(
            ErrorKind::StatementInterrupted,
            "Query execution was interrupted: holdfast lost the database node while the statement was in flight; it may or may not have been applied",
        )
    }

    pub fn malformed(what: impl fmt::Display) -> Self {
        Self::new(
            ErrorKind::MalformedPacket,
            format!("Malformed communication packet: {what}"),
        )
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.kind.code(),
            self.kind.label(),
            self.message
        )
    }
}

impl std::error::Error for ClientError {}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_wire::packets::ErrPacket;

    #[test]
    fn each_kind_has_the_state_mariadb_sends_with_its_code() {
        // From MariaDB's sql_state.h.
        let expected = [
            (1040, "08004"),
            (1043, "08S01"),
            (1045, "28000"),
            (1251, "08004"),
            (1047, "08S01"),
            (1153, "08S01"),
            (1835, "HY000"),
            (1243, "HY000"),
            (1213, "40001"),
            (1180, "HY000"),
            (1317, "70100"),
            (1927, "70100"),
            (3032, "HY000"),
            (1053, "08S01"),
        ];
        for (kind, (code, state)) in ErrorKind::ALL.iter().zip(expected) {
            assert_eq!((kind.code(), kind.sql_state()), (code, state), "{kind:?}");
        }
    }

    #[test]
    fn every_code_is_a_server_code() {
        // 2000-2999 are the client library's own codes; in an ERR packet clients misread
        // them (the `mariadb` CLI: "2027 Received malformed packet").
        for kind in ErrorKind::ALL {
            assert!(!(2000..3000).contains(&kind.code()), "{kind:?}");
        }
    }

    #[test]
    fn labels_are_distinct_metric_names() {
        let mut labels: Vec<_> = ErrorKind::ALL.iter().map(|k| k.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), ErrorKind::ALL.len());
        assert!(labels
            .iter()
            .all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
    }

    #[test]
    fn the_packet_carries_code_state_and_message() {
        let e = ClientError::transaction_rolled_back();
        let payload = e.payload();
        let p = ErrPacket::parse(&payload).expect("an ERR packet");
        assert_eq!(p.code, 1213);
        assert_eq!(p.sql_state, *b"40001");
        assert!(p.message_lossy().contains("rolled back"));
    }
}
