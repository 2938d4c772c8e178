//! The backend gate: what, besides the topology, decides whether a request may reach a
//! server now. With `[serverless]` it is the instance's lifecycle (a paused instance is
//! woken and the request waits for it); without, [`Ungated`] is always open. Sessions and
//! logins ask the gate in their route phase and nowhere else.

use crate::serverless::{InFlight, WakeError};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type GateFuture<'a> = Pin<Box<dyn Future<Output = Result<(), WakeError>> + Send + 'a>>;

pub trait BackendGate: Send + Sync {
    /// Whether requests may go to the server now. Read per request: one atomic load.
    fn is_open(&self) -> bool;
    /// Which run of the server this is: a backend connection opened under another epoch
    /// died with the server (a serverless stop).
    fn epoch(&self) -> u64;
    /// Waits until the gate is open (wakes a paused instance), up to its deadline.
    /// `trigger` names who asked, for the log.
    fn open(&self, trigger: &'static str) -> GateFuture<'_>;
    /// Marks a login that passed the gate and is opening its backend connection: the gate
    /// does not close (no pause starts) until the guard drops.
    fn hold_open(&self) -> Option<InFlight<'_>>;
    /// How much longer than the handshake timeout a login may take, because the gate may
    /// have to open first.
    fn login_grace(&self) -> Duration;
    /// Whether a closed gate stands for a paused instance that a login could wake (the
    /// login's refusals are then counted as "closed without wake").
    fn wakes_on_login(&self) -> bool;
}

/// No gate: the backend is always there as far as sessions are concerned.
pub struct Ungated;

impl BackendGate for Ungated {
    fn is_open(&self) -> bool {
        true
    }

    fn epoch(&self) -> u64 {
        0
    }

    fn open(&self, _trigger: &'static str) -> GateFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn hold_open(&self) -> Option<InFlight<'_>> {
        None
    }

    fn login_grace(&self) -> Duration {
        Duration::ZERO
    }

    fn wakes_on_login(&self) -> bool {
        false
    }
}
