//! The config-source seam: where the served limits come from. A source gives the
//! server its first set before any port opens ([`Source::first_set`]: the config, its
//! reload state and whether it counts as loaded for health), then follows its origin
//! and hands the [`Reloader`] every change until the server stops
//! ([`Source::follow`]). Files (`files.rs`: read at start-up, watched, SIGHUP) and an
//! xDS control plane (`crate::xds::source`) are sources; `tollgate serve` picks one
//! from `settings::source::SourceSettings` and starts it, whichever it is.

use std::path::PathBuf;
use std::sync::Arc;

use super::{ReloadError, ReloadStatus, Reloader};
use crate::background::Background;
use crate::config::Config;
use crate::metrics::source::SourceMetrics;

/// What a config source is called, and whether a reload reads it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigSource {
    /// Its name in logs, `/config.json` and `tollgate_config_source_info{source}`.
    pub name: &'static str,
    /// Whether [`Reloader::reload`] (a SIGHUP, a watch event) reads the files again;
    /// a source that pushes its changes (xDS) hands whole sets in instead.
    pub rereads: bool,
}

impl ConfigSource {
    /// Config files on disk.
    pub const FILES: ConfigSource = ConfigSource {
        name: "file",
        rereads: true,
    };

    /// A source that pushes whole sets ([`Reloader::install`]) under `name`.
    pub const fn pushed(name: &'static str) -> Self {
        ConfigSource {
            name,
            rereads: false,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.name
    }
}

impl Default for ConfigSource {
    fn default() -> Self {
        Self::FILES
    }
}

/// The set a source serves before the ports open.
#[derive(Debug)]
pub struct FirstSet {
    pub config: Config,
    /// Its reload state (generation 1 with a hash, or nothing loaded yet).
    pub status: ReloadStatus,
    /// Whether it counts as a loaded config for health.
    pub config_loaded: bool,
}

impl FirstSet {
    /// No config yet (an invalid set at start, or a pushed source still waiting):
    /// no domain limits anything, and health stays NOT_SERVING.
    pub fn nothing_loaded() -> Self {
        FirstSet {
            config: Config::new(Vec::new()),
            status: ReloadStatus::nothing_loaded(),
            config_loaded: false,
        }
    }
}

/// Why a source could not start; the process stops before binding a port.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The first set does not validate and the settings say to stop.
    #[error(transparent)]
    Config(#[from] ReloadError),
    /// A setting or file no retry can fix (a URL, a certificate).
    #[error("{source_name}: {message}")]
    Start {
        source_name: &'static str,
        message: String,
    },
}

/// A place limits come from.
pub trait Source: Send + Sync {
    /// Its name and whether reloads read it again.
    fn kind(&self) -> ConfigSource;

    /// Where it reads from, for logs: the config path, the control plane's URL.
    fn origin(&self) -> PathBuf;

    /// The set to serve first. `require_domains`: a set without domains does not
    /// count as loaded (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    fn first_set(&self, require_domains: bool) -> Result<FirstSet, SourceError>;

    /// Starts following the origin, handing `reloader` every change, until the
    /// returned tasks are dropped. Must be called inside a Tokio runtime.
    fn follow(
        &self,
        reloader: Arc<Reloader>,
        metrics: SourceMetrics,
    ) -> Result<Vec<Background>, SourceError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Limiter, LimiterOptions};
    use crate::store::memory::MemoryStore;

    const PUSHED: ConfigSource = ConfigSource::pushed("pushed-test");

    /// A source that follows the docs but builds its status without naming itself.
    struct Pushing;

    impl Source for Pushing {
        fn kind(&self) -> ConfigSource {
            PUSHED
        }

        fn origin(&self) -> PathBuf {
            "https://control-plane.test".into()
        }

        fn first_set(&self, _require_domains: bool) -> Result<FirstSet, SourceError> {
            Ok(FirstSet::nothing_loaded())
        }

        fn follow(
            &self,
            _reloader: Arc<Reloader>,
            _metrics: SourceMetrics,
        ) -> Result<Vec<Background>, SourceError> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_sources_kind_reaches_the_reloader_and_its_status() {
        let source = Pushing;
        let first = source.first_set(false).expect("the first set");
        let limiter = Arc::new(Limiter::new(
            first.config,
            Arc::new(MemoryStore::new()),
            LimiterOptions::default(),
        ));
        let status = Arc::new(first.status);
        let reloader = Reloader::for_source(limiter, &source, status.clone());
        assert_eq!(reloader.source(), PUSHED);
        assert_eq!(status.snapshot().source, PUSHED);
    }
}
