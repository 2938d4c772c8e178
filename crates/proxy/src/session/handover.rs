//! Handing a live session to the process that replaces this one (`holdfast ctl upgrade`).
//!
//! A session gives itself up only at a safe point: idle between requests, outside a
//! transaction (a split session: no read-only transaction on a replica either), nothing in
//! flight behind a marker, its backend connection alive and not due to move, no
//! compression. Its sockets go to the new process as they are, with nothing said on them:
//! the client's, the backend's and its replica connections'. The server keeps its threads,
//! so what lives there (temporary tables, locks, prepared statements, user variables,
//! `LAST_INSERT_ID`) needs no restore; what holdfast knows of the session goes with the
//! sockets ([`CarriedSession`]). A TLS socket goes with its record-layer state
//! (`holdfast_client::tls_resume`): the new process continues the TLS session.
//!
//! When a backend connection's TLS state cannot be taken at that moment (rustls still
//! has a record to write), a session that could move goes anyway: the old process captures
//! what the trackers do not report and closes that connection, and the new one logs in
//! again and restores the session, as a move to another node does. Any other session stays
//! until its next safe point.

use super::owed_schema::OwedSchema;
use super::{kill, markers, relay, statements, End, Session};
use crate::backend::BackendConn;
use crate::client_trackers::ClientTrackers;
use crate::conn::PacketConn;
use crate::registry::SessionInfo;
use crate::restore::Captured;
use crate::state::SessionRecord;
use crate::Shared;
use holdfast_client::conn::TakenSocket;
use holdfast_client::tls_resume::TlsState;
use holdfast_cluster::topology::NodeName;
use holdfast_wire::auth::PasswordHash;
use holdfast_wire::caps::SERVER_STATUS_IN_TRANS;
use holdfast_wire::handshake::{Greeting, KeptGreeting};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeroize::Zeroize;

use holdfast_client::compress::CompressedState;
pub(super) use holdfast_client::conn::stream_of;

/// What holdfast knows of a session, as one process hands it to the next (JSON on the
/// hand-over channel, with the client's and the backend's sockets beside it).
#[derive(Serialize, Deserialize)]
pub struct CarriedSession {
    pub id: u32,
    pub peer: SocketAddr,
    age_ms: u64,
    capabilities: u32,
    user: String,
    /// `SHA1(password)` when holdfast can log the session in again elsewhere; zeroized
    /// when dropped.
    secret: Option<CarriedSecret>,
    scramble: [u8; 20],
    identity: super::auth::Identity,
    can_reauthenticate: bool,
    backend_name: NodeName,
    backend_age_ms: u64,
    greeting: CarriedGreeting,
    backend_capabilities: u32,
    backend_mariadb_caps: u32,
    /// The backend's socket comes with the session (else the new process logs in again).
    backend_kept: bool,
    /// The TLS sessions on the two sockets, continued by `tls_resume` in the new process.
    client_tls: Option<TlsState>,
    backend_tls: Option<TlsState>,
    /// A split session's replica side (its connections' sockets follow the backend's).
    split: Option<super::split::CarriedSplit>,
    record: SessionRecord,
    /// The record's fields its serialisation leaves out (`SessionRecord` is also what the
    /// admin API shows).
    sql_mode: Option<(bool, bool)>,
    client_trackers: ClientTrackers,
    trackers_overridden: bool,
    opaque_change: bool,
    state_version: u64,
    statements: statements::CarriedStatements,
    sql_kills: Vec<(Vec<u8>, Vec<u8>, bool)>,
    captured: Captured,
    capture_due: bool,
    capture_failing: bool,
    opaque_unattributable: bool,
    tracks_transactions: bool,
    markers: markers::CarriedMarkers,
    row_count_left: Option<i64>,
    owed_schema: Option<OwedSchema>,
    moves: u64,
    commands: u64,
    /// Bytes read from each socket and not used yet (a request's start).
    client_unread: Vec<u8>,
    backend_unread: Vec<u8>,
    /// Under the compressed protocol, each stream's compression state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_compressed: Option<CompressedState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backend_compressed: Option<CompressedState>,
}

impl CarriedSession {
    pub fn backend_kept(&self) -> bool {
        self.backend_kept
    }

    /// Replica connections whose sockets come with the session.
    pub fn readers(&self) -> usize {
        self.split.as_ref().map_or(0, |s| s.readers.len())
    }
}

/// Names the session only (what it holds stays out of logs).
impl std::fmt::Debug for CarriedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CarriedSession")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct CarriedSecret([u8; 20]);

impl Drop for CarriedSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct CarriedGreeting {
    server_version: Vec<u8>,
    connection_id: u32,
    scramble: Vec<u8>,
    capabilities: u32,
    charset: u8,
    status: u16,
    auth_plugin: Vec<u8>,
    mariadb_caps: u32,
}

impl CarriedGreeting {
    pub(super) fn of(g: &KeptGreeting) -> Self {
        CarriedGreeting {
            server_version: g.server_version().to_vec(),
            connection_id: g.connection_id,
            scramble: g.scramble().to_vec(),
            capabilities: g.capabilities,
            charset: g.charset,
            status: g.status,
            auth_plugin: g.auth_plugin().to_vec(),
            mariadb_caps: g.mariadb_caps,
        }
    }

    pub(super) fn into_greeting(self) -> KeptGreeting {
        KeptGreeting::from(Greeting {
            server_version: self.server_version,
            connection_id: self.connection_id,
            scramble: self.scramble,
            capabilities: self.capabilities,
            charset: self.charset,
            status: self.status,
            auth_plugin: self.auth_plugin,
            mariadb_caps: self.mariadb_caps,
        })
    }
}

/// A session given up: what holdfast knows of it, its client's socket, its backend's when
/// it could be taken, and its replica connections' (a split session's).
pub struct HandedSession {
    pub carried: Box<CarriedSession>,
    pub client: std::net::TcpStream,
    pub backend: Option<std::net::TcpStream>,
    pub readers: Vec<std::net::TcpStream>,
}

impl Session {
    /// Whether the session is at a point where it can be handed over (see the module
    /// documentation), and why not when it is not.
    fn why_not_handed_over(&self) -> Option<&'static str> {
        if let Some(why) = self.split.as_ref().and_then(|s| s.why_not_handed_over()) {
            return Some(why);
        }
        if self.record.status & SERVER_STATUS_IN_TRANS != 0 || self.txn_log.is_some() {
            return Some("a transaction is open");
        }
        if !self.client.can_take_socket() {
            return Some("the client's TLS state cannot be taken now");
        }
        if !self.backend.conn.can_take_socket()
            && (!self.can_reauthenticate
                || self.record.blocker().is_some()
                || self.record.opaque_change
                || self.record.capture_due)
        {
            return Some(
                "the backend's TLS state cannot be taken now, and the session cannot move",
            );
        }
        if self.backend_dead
            || self.lost_while_idle.is_some()
            || self.transaction_lost
            || self.move_pending_since.is_some()
        {
            return Some("a move is due");
        }
        if self.info.kill_requested.load(Ordering::Acquire) != 0 {
            return Some("a KILL is pending");
        }
        if self.markers.carry().is_none() || self.exchange.checksum.is_some() {
            return Some("a statement is in flight");
        }
        None
    }

    /// The process that replaces this one takes sessions: where to send this one (it is at
    /// a safe point). `news`: the hand-over just began. (An atomic load on every request;
    /// the watch's lock only when it changed.)
    pub(super) fn hand_over_asked(
        &mut self,
        news: bool,
    ) -> Option<Arc<crate::upgrade::SessionChannel>> {
        if news || self.hand_over_to.has_changed().unwrap_or(false) {
            self.hand_over_channel = self.hand_over_to.borrow_and_update().clone();
        }
        let sink = self.hand_over_channel.clone()?;
        (!sink.is_broken()).then_some(sink)
    }

    /// Gives the session up to `sink` (the session ends here with [`End::HandedOver`]), or
    /// goes on here if the new process does not take it. `news`: the hand-over just began
    /// (a session that stays says why, once).
    pub(super) async fn hand_over(
        &mut self,
        sink: Arc<crate::upgrade::SessionChannel>,
        news: bool,
    ) -> Option<End> {
        if !self.backend.conn.can_take_socket() {
            // The new process logs in again: what only a capture reads goes with the session.
            self.capture_if_due(true).await;
        }
        let handed = self.give_up(news)?;
        let id = self.info.id;
        match sink.send(handed).await {
            Ok(()) => {
                self.shared.metrics.sessions_handed_over.inc();
                Some(End::HandedOver)
            }
            Err(returned) => {
                // The new process did not take it: the session goes on here.
                self.take_back(returned);
                tracing::warn!(session = id, "upgrade: the session stays in this process");
                None
            }
        }
    }

    /// Puts the sockets of a session given up back (a TLS one continues with the record
    /// layer of `tls_resume`, as in the new process).
    fn take_back(&mut self, handed: HandedSession) {
        let HandedSession {
            mut carried,
            client,
            backend,
            readers,
        } = handed;
        let put = |conn: &mut PacketConn, taken| {
            if let Err(e) = conn.put_back_socket(taken) {
                tracing::error!(error = %e, "a socket given back could not be used");
            }
        };
        put(
            &mut self.client,
            TakenSocket {
                socket: client,
                tls: carried.client_tls.take(),
                compressed: carried.client_compressed.take(),
                unread: carried.client_unread[..].into(),
            },
        );
        if let Some(backend) = backend {
            put(
                &mut self.backend.conn,
                TakenSocket {
                    socket: backend,
                    tls: carried.backend_tls.take(),
                    compressed: carried.backend_compressed.take(),
                    unread: carried.backend_unread[..].into(),
                },
            );
        }
        self.backend.quit_on_drop = true;
        if let Some(split) = carried.split.take() {
            let types = &self.shared.variable_types;
            match super::split::Split::resume(self.shared.topology.clone(), split, readers, types) {
                Ok(s) => self.split = Some(s),
                Err(e) => {
                    tracing::error!(error = %e, "replica connections given back could not be used")
                }
            }
        }
    }

    /// Gives the session up to the process that replaces this one, when it is at a safe
    /// point: its sockets and what holdfast knows of it. `None` leaves it as it was.
    fn give_up(&mut self, news: bool) -> Option<HandedSession> {
        if let Some(why) = self.why_not_handed_over() {
            match news {
                true => tracing::info!(
                    session = self.info.id,
                    why,
                    "upgrade: the session stays in this process for now"
                ),
                false => tracing::debug!(
                    session = self.info.id,
                    why,
                    "upgrade: the session stays in this process for now"
                ),
            }
            return None;
        }
        let markers = self.markers.carry()?;
        // The replica side first: should one of its connections not come out, the session
        // stays (it opens others as it needs them).
        let (split, readers) = match self.split.as_mut() {
            Some(s) => {
                let (carried, sockets) = s.give_up()?;
                (Some(carried), sockets)
            }
            None => (None, Vec::new()),
        };
        let TakenSocket {
            socket: client,
            tls: client_tls,
            compressed: client_compressed,
            unread: client_unread,
        } = self.client.take_socket()?;
        // A backend connection whose TLS state cannot be taken stays, and is closed as the
        // session ends here (the new process logs in again).
        let taken = match self.backend.conn.can_take_socket() {
            true => self.backend.conn.take_socket(),
            false => None,
        };
        let (backend, backend_tls, backend_compressed, backend_unread) = match taken {
            Some(t) => {
                // Nothing may be said on the connection the new process continues.
                self.backend.quit_on_drop = false;
                (Some(t.socket), t.tls, t.compressed, t.unread)
            }
            None => (None, None, None, Default::default()),
        };
        self.captured.last_insert_id = self.record.last_insert_id;
        let carried = CarriedSession {
            id: self.info.id,
            peer: self.info.client,
            age_ms: self.info.started.elapsed().as_millis() as u64,
            capabilities: self.capabilities,
            user: String::from_utf8_lossy(&self.identity.user).into_owned(),
            secret: self.secret.as_ref().map(|s| CarriedSecret(s.to_bytes())),
            scramble: self.scramble,
            identity: (*self.identity).clone(),
            can_reauthenticate: self.can_reauthenticate,
            backend_name: self.backend_name.clone(),
            backend_age_ms: self.backend_since.elapsed().as_millis() as u64,
            greeting: CarriedGreeting::of(&self.backend.greeting),
            backend_capabilities: self.backend.capabilities,
            backend_mariadb_caps: self.backend.mariadb_caps,
            backend_kept: backend.is_some(),
            client_tls,
            backend_tls,
            split,
            record: self.record.clone(),
            sql_mode: self
                .record
                .sql_mode
                .map(|m| (m.ansi_quotes, m.no_backslash_escapes)),
            client_trackers: self.record.client_trackers.clone(),
            trackers_overridden: self.record.trackers_overridden,
            opaque_change: self.record.opaque_change,
            state_version: self.record.state_version,
            statements: self.statements.carry(),
            sql_kills: self.sql_kills.carry(),
            captured: self.captured.clone(),
            capture_due: self.capture_due_since.is_some(),
            capture_failing: self.capture_failing,
            opaque_unattributable: self.opaque_unattributable,
            tracks_transactions: self.tracks_transactions,
            markers,
            row_count_left: self.exchange.row_count_left,
            owed_schema: self.exchange.owed_schema.as_deref().cloned(),
            moves: self.info.moves.load(Ordering::Relaxed),
            commands: self.info.commands.load(Ordering::Relaxed),
            client_unread: client_unread.to_vec(),
            backend_unread: backend_unread.to_vec(),
            client_compressed,
            backend_compressed,
        };
        Some(HandedSession {
            carried: Box::new(carried),
            client,
            backend,
            readers,
        })
    }

    /// The session handed over by the process this one replaces, on its own sockets,
    /// registered under its id; it goes on with the client's next request.
    pub(super) fn resume(
        shared: Arc<Shared>,
        carried: CarriedSession,
        client: std::net::TcpStream,
        backend: Option<std::net::TcpStream>,
        readers: Vec<std::net::TcpStream>,
    ) -> std::io::Result<Box<Session>> {
        let CarriedSession {
            id,
            peer,
            age_ms,
            capabilities,
            user,
            secret,
            scramble,
            identity,
            can_reauthenticate,
            backend_name,
            backend_age_ms,
            greeting: g,
            backend_capabilities,
            backend_mariadb_caps,
            backend_kept: _,
            client_tls,
            backend_tls,
            split,
            mut record,
            sql_mode,
            client_trackers,
            trackers_overridden,
            opaque_change,
            state_version,
            statements,
            sql_kills,
            captured,
            capture_due,
            capture_failing,
            opaque_unattributable,
            tracks_transactions,
            markers,
            row_count_left,
            owed_schema,
            moves,
            commands,
            client_unread,
            backend_unread,
            client_compressed,
            backend_compressed,
        } = carried;
        let tls = (client_tls.is_some(), backend_tls.is_some());
        let replicas = readers.len();
        let mut client = PacketConn::new(stream_of(client, client_tls, client_compressed)?);
        client.rbuf.extend_from_slice(&client_unread);
        let backend_dead = backend.is_none();
        let mut conn = match backend {
            Some(socket) => PacketConn::new(stream_of(socket, backend_tls, backend_compressed)?),
            // Logged in again before the session goes on (`run_resumed`).
            None => PacketConn::new(Box::new(tokio::io::duplex(1).0)),
        };
        conn.rbuf.extend_from_slice(&backend_unread);
        let backend = BackendConn {
            conn,
            greeting: g.into_greeting(),
            capabilities: backend_capabilities,
            mariadb_caps: backend_mariadb_caps,
            quit_on_drop: true,
        };
        record.sql_mode =
            sql_mode.map(
                |(ansi_quotes, no_backslash_escapes)| holdfast_sql::SqlMode {
                    ansi_quotes,
                    no_backslash_escapes,
                },
            );
        record.client_trackers = client_trackers;
        record.trackers_overridden = trackers_overridden;
        record.opaque_change = opaque_change;
        record.state_version = state_version;
        let now = Instant::now();
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now);
        let info = Arc::new(SessionInfo::started_at(id, peer, ago(age_ms)));
        info.set_user(shared.user_names.get(&user));
        // The topology's name where it knows the node (one allocation for all its sessions).
        let backend_name = shared
            .topology
            .borrow()
            .node(&backend_name)
            .map_or(backend_name, |n| n.name.clone());
        info.set_backend(&backend_name, backend.greeting.connection_id);
        info.can_reauthenticate
            .store(can_reauthenticate, Ordering::Relaxed);
        info.moves.store(moves, Ordering::Relaxed);
        info.commands.store(commands, Ordering::Relaxed);
        info.status.store(record.status, Ordering::Relaxed);
        info.set_blocker(record.blocker());
        shared.sessions.insert(info.clone());
        shared.metrics.sessions_active.inc();
        if !can_reauthenticate {
            shared.metrics.sessions_passthrough_auth.inc();
        }
        let mut topology = shared.topology.clone();
        topology.borrow_and_update();
        let server = {
            let own = holdfast_sql::Server::from_version(backend.greeting.server_version());
            match topology.borrow().node_servers {
                Some(nodes) => own.or(nodes),
                None => own,
            }
        };
        let mode = record.sql_mode.unwrap_or_default();
        shared.metrics.sessions_taken_over.inc();
        tracing::info!(session = id, client = %peer, user = %user, backend = %backend_name, thread = backend.greeting.connection_id, client_tls = tls.0, backend_tls = tls.1, backend_kept = !backend_dead, replicas, "session handed over from the previous process");
        shared.feed_idle_wake();
        Ok(Box::new(Session {
            info,
            client,
            backend,
            capabilities,
            secret: secret.as_ref().map(|s| PasswordHash::from_bytes(s.0)),
            scramble,
            record,
            statements: statements::Statements::from_carried(statements, mode, server),
            sql_kills: kill::SqlKills::from_carried(sql_kills),
            scratch: Vec::new(),
            idle_timer: Default::default(),
            idle_deadline: None,
            ticket: None,
            running: Default::default(),
            // Shared with this process's sessions of the same user and driver, as a login's.
            identity: Box::new(super::auth::Identity {
                user: shared.login_texts.get(&identity.user),
                attributes: shared.login_texts.get(&identity.attributes),
                ..identity
            }),
            can_reauthenticate,
            backend_name,
            backend_dead,
            backend_epoch: shared.gate.epoch(),
            backend_since: ago(backend_age_ms),
            transaction_lost: false,
            lost_while_idle: None,
            exchange: relay::Exchange {
                row_count_left,
                owed_schema: owed_schema.map(Box::new),
                ..relay::Exchange::default()
            },
            txn_log: None,
            markers: markers::Markers::from_carried(markers),
            captured,
            capture_due_since: capture_due.then_some(now),
            capture_failing,
            opaque_unattributable,
            tracks_transactions,
            topology,
            switching: shared.switching.subscribe(),
            move_pending_since: None,
            split: match split {
                Some(carried) => Some(super::split::Split::resume(
                    shared.topology.clone(),
                    carried,
                    readers,
                    &shared.variable_types,
                )?),
                None => None,
            },
            hand_over_channel: None,
            hand_over_to: shared.upgrader.session_sink(),
            shared,
        }))
    }
}
