//! Pass-through connections relayed in the kernel ([`holdfast_sockmap`]): this process's
//! own sockhash, loaded at start when `[proxy] kernel_relay = "auto"` and the kernel lets
//! it (the reason logged once when not: relays then copy in user space), and the maps
//! of processes this one replaced, adopted with the relays they handed over (those pairs
//! stay in their map until they end).

use holdfast_config::KernelRelayMode;
use holdfast_sockmap::{HangupWatcher, KernelRelay, SockmapError};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

pub struct KernelRelays {
    own: Option<Arc<KernelRelay>>,
    /// Why there is none (off, or what the kernel said).
    why_not: Option<String>,
    /// Maps handed over by earlier processes, by the kernel's map id.
    adopted: Mutex<HashMap<u32, Arc<KernelRelay>>>,
}

impl KernelRelays {
    /// Loads the relay as `mode` says, when the configuration has a pass-through
    /// listener (`passthrough`; adding one needs a restart): nothing is loaded otherwise.
    pub fn start(mode: KernelRelayMode, passthrough: bool) -> KernelRelays {
        let (own, why_not) = match (mode, passthrough) {
            (_, false) => (None, Some("no pass-through listener".to_string())),
            (KernelRelayMode::Off, true) => {
                (None, Some("[proxy] kernel_relay = \"off\"".to_string()))
            }
            (KernelRelayMode::Auto, true) => match KernelRelay::new() {
                Ok(k) => (Some(Arc::new(k)), None),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        KernelRelays {
            own,
            why_not,
            adopted: Mutex::new(HashMap::new()),
        }
    }

    /// Logs once, at start, whether pass-through listeners relay in the kernel.
    pub fn log(&self, passthrough: bool) {
        if !passthrough {
            return;
        }
        match (&self.own, &self.why_not) {
            (Some(k), _) => tracing::info!(map_id = k.id(), "pass-through connections with plain TCP on both sides are relayed in the kernel (a BPF sockmap)"),
            (None, Some(why)) => tracing::warn!(%why, "pass-through connections are relayed in user space, not in the kernel"),
            (None, None) => {}
        }
    }

    /// This process's relay, when it has one.
    pub fn own(&self) -> Option<&Arc<KernelRelay>> {
        self.own.as_ref()
    }

    /// Why pass-through connections are not relayed in the kernel (`None`: they are).
    pub fn why_not(&self) -> Option<&str> {
        self.why_not.as_deref()
    }

    /// The relay behind `map`, handed over by the process this one replaced (one per map,
    /// however many relays came with it).
    pub fn adopt(&self, map: OwnedFd) -> Result<Arc<KernelRelay>, SockmapError> {
        let relay = KernelRelay::adopt(map)?;
        if let Some(own) = self.own.as_ref().filter(|o| o.id() == relay.id()) {
            return Ok(own.clone());
        }
        let mut adopted = self.adopted.lock().unwrap_or_else(|p| p.into_inner());
        Ok(adopted
            .entry(relay.id())
            .or_insert_with(|| Arc::new(relay))
            .clone())
    }
}

/// The process's one thread for sockets out of the async runtime's reactor: it hears the
/// end of spliced pairs (the kernel relays their bytes) and wakes idle sessions whose
/// sockets are parked (`parking.rs`). Started on first use; `None` when it could not be:
/// then nothing is spliced and nothing parks.
#[derive(Default)]
pub struct SocketWatcher(OnceLock<Option<HangupWatcher>>);

impl SocketWatcher {
    pub fn get(&self) -> Option<&HangupWatcher> {
        self.0
            .get_or_init(|| match HangupWatcher::start() {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "the watcher of sockets out of the reactor did not start: pass-through sessions are relayed in user space, idle sessions keep their sockets in the reactor");
                    None
                }
            })
            .as_ref()
    }
}
