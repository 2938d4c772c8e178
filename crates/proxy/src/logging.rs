//! The process's logger, with a filter a reload changes in place (`[log] level`).
//! `holdfast serve` installs it ([`LogLevel::install`]) and hands it to
//! [`crate::Shared::log_level`]; the reload ([`crate::reload`]) checks a new level before
//! anything changes and applies it after.

use std::sync::{Arc, Mutex};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{directives:?}: {reason}")]
    Invalid { directives: String, reason: String },
    #[error("a logger is installed already")]
    AlreadyInstalled,
    #[error("cannot change the log filter: {0}")]
    Reload(String),
}

/// The filter in force and the handle that replaces it.
pub struct LogLevel {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

type Filtered = tracing_subscriber::layer::Layered<reload::Layer<EnvFilter, Registry>, Registry>;

impl LogLevel {
    /// Installs the process's logger: events `directives` lets through, written by `writer`
    /// as text (with ANSI colours when `ansi`) or JSON lines. `directives` are read as
    /// `tracing` reads `RUST_LOG` (a bare word is a target); [`LogLevel::set`] is stricter.
    pub fn install<W>(
        directives: &str,
        json: bool,
        ansi: bool,
        writer: W,
    ) -> Result<Arc<LogLevel>, LogError>
    where
        W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
    {
        let filter =
            EnvFilter::builder()
                .parse(directives.trim())
                .map_err(|e| LogError::Invalid {
                    directives: directives.to_string(),
                    reason: e.to_string(),
                })?;
        let (filter, handle) = reload::Layer::new(filter);
        let text = tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer);
        let format: Box<dyn Layer<Filtered> + Send + Sync> = if json {
            Box::new(text.json())
        } else {
            Box::new(text)
        };
        tracing_subscriber::registry()
            .with(filter)
            .with(format)
            .try_init()
            .map_err(|_| LogError::AlreadyInstalled)?;
        Ok(Arc::new(LogLevel {
            handle,
            current: Mutex::new(directives.trim().to_string()),
        }))
    }

    /// `directives` as a filter, or why not: a level or `target=level` directives
    /// (`holdfast_config::log::check_directives`), then `tracing`'s own parser.
    pub fn check(directives: &str) -> Result<EnvFilter, LogError> {
        let invalid = |reason: String| LogError::Invalid {
            directives: directives.to_string(),
            reason,
        };
        holdfast_config::log::check_directives(directives).map_err(invalid)?;
        EnvFilter::builder()
            .parse(directives.trim())
            .map_err(|e| invalid(e.to_string()))
    }

    /// Puts `directives` in force for every event from now on.
    pub fn set(&self, directives: &str) -> Result<(), LogError> {
        let filter = Self::check(directives)?;
        self.handle
            .reload(filter)
            .map_err(|e| LogError::Reload(e.to_string()))?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = directives.trim().to_string();
        Ok(())
    }

    /// The directives in force.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
