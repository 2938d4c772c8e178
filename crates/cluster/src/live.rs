//! The configuration in force, shared by everything that reads settings while holdfast
//! runs. A reload (`POST /reload`, SIGHUP) replaces it whole; readers take the current one
//! without a lock ([`arc_swap`]): a cheap `load()` for a value, `load_full()` for a
//! snapshot held across an await. What only a restart can change is kept as it runs by the
//! reload (`holdfast_config::reload::plan`), so every reader may trust what it finds.

use crate::config::Config;
use std::sync::Arc;

/// The configuration in force; see the module documentation.
pub type LiveConfig = Arc<arc_swap::ArcSwap<Config>>;

/// A live configuration starting with `config`.
pub fn live(config: Arc<Config>) -> LiveConfig {
    Arc::new(arc_swap::ArcSwap::new(config))
}
