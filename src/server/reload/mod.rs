//! Reloading the config set while serving: load and validate the whole set with
//! [`config::load_path`], swap it into the [`Limiter`] atomically, and keep the
//! [`ReloadState`] (generation, hash of the files, last success and failure) that the
//! admin endpoints read; the limiter's metrics count reloads and show the generation.
//! A set that does not validate never replaces the one being served: it is logged
//! with every error, in one warn event, and counted.
//!
//! Counters are keyed by domain, rule path, entries, algorithm and window, never by
//! generation, so a swap leaves the counters of unchanged rules as they were.
//!
//! Health: with [`Reloader::with_health`] every outcome that changes what is served
//! sets [`Health`]'s `config_loaded`, by envoyproxy/ratelimit's rule: a swapped set is
//! loaded, except a set without domains when `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`
//! asks for one; a failed reload changes nothing (it served what it served). A
//! directory without config files is such a set without domains, as upstream reads it.
//!
//! Triggers: the directory watcher ([`crate::config::watch`], see [`spawn_watch`]) and
//! SIGHUP (`tollgate serve`). Reloads are serialized; each first hashes the files and
//! stops at once when they are what is already served.
//!
//! Sources ([`Source`], `source.rs`): files ([`FileSource`], `files.rs`), or an xDS
//! control plane ([`crate::xds`]), which hands whole sets to [`Reloader::install`] and
//! refused ones to [`Reloader::refuse`]; both end in the same bookkeeping (`apply.rs`),
//! so health, metrics and `/config.json` read one state whichever the source.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::config::ConfigErrors;
use crate::limiter::Limiter;
use crate::server::health::Health;

pub use self::files::{FileSource, LoadedSet, hash_set, is_empty_set, load_set, spawn_watch};
pub use self::source::{ConfigSource, FirstSet, Source, SourceError};

mod apply;
mod files;
mod source;

/// How often a set is read again when its files changed while it was being read.
const LOAD_ATTEMPTS: u32 = 5;

/// What made a reload happen (a field of its log events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The directory watcher saw a change (or, without inotify, a poll tick).
    Watch,
    /// SIGHUP.
    Signal,
    /// A direct call (tests, embedders).
    Manual,
    /// A set pushed by a source that sends every change itself, named by the source
    /// (`xds` for the xDS control plane).
    Pushed(&'static str),
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Watch => "watch",
            Trigger::Signal => "sighup",
            Trigger::Manual => "manual",
            Trigger::Pushed(source) => source,
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new set is served under this generation.
    Swapped { generation: u64 },
    /// The files are those already served; nothing was swapped.
    Unchanged,
}

/// Why a reload kept the old set.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] ConfigErrors),
    #[error("the config files kept changing while being read ({LOAD_ATTEMPTS} attempts)")]
    Unstable,
    #[error("the reload task failed: {0}")]
    Task(String),
}

impl ReloadError {
    /// One line per error, as `validate` prints them.
    pub fn messages(&self) -> Vec<String> {
        match self {
            ReloadError::Invalid(errors) => errors.0.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

/// The reload bookkeeping, as the admin endpoints and metrics read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadState {
    pub source: ConfigSource,
    /// 1 for the set loaded at start-up, one more per swap.
    pub generation: u64,
    /// [`hash_set`] of the served set's files; `None` when it did not come from disk.
    pub hash: Option<String>,
    /// xDS: the `version_info` of the served (ACKed) response.
    pub version: Option<String>,
    /// When the served set was loaded.
    pub loaded_at: Option<SystemTime>,
    /// The last reload that ended with the files on disk being served (swapped or
    /// found unchanged).
    pub last_success: Option<SystemTime>,
    pub last_failure: Option<SystemTime>,
    /// Every error of the last failed reload; cleared by the next success.
    pub last_error: Option<Vec<String>>,
    /// Swaps since start-up.
    pub successes: u64,
    /// Failed reloads since start-up.
    pub failures: u64,
}

/// The shared, readable reload state.
#[derive(Debug, Default)]
pub struct ReloadStatus {
    state: Mutex<ReloadState>,
}

impl ReloadStatus {
    /// Generation 1, loaded now, with the files' hash when the set came from disk.
    pub fn new(hash: Option<String>) -> Self {
        let now = SystemTime::now();
        Self {
            state: Mutex::new(ReloadState {
                generation: 1,
                hash,
                loaded_at: Some(now),
                last_success: Some(now),
                ..ReloadState::default()
            }),
        }
    }

    /// Nothing served yet (the start-up set did not validate): generation 0, no hash,
    /// so the first reload that validates swaps its set in whatever it hashes to.
    pub fn nothing_loaded() -> Self {
        Self::default()
    }

    /// Nothing served yet, and what is served will come from `source`.
    pub fn waiting_for(source: ConfigSource) -> Self {
        Self {
            state: Mutex::new(ReloadState {
                source,
                ..ReloadState::default()
            }),
        }
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> ReloadState {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, ReloadState> {
        // The state is plain data, consistent after every statement: a panic elsewhere
        // while holding the lock leaves nothing half-written to fear.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reloads one config path into one limiter.
pub struct Reloader {
    limiter: Arc<Limiter>,
    path: PathBuf,
    status: Arc<ReloadStatus>,
    /// One reload at a time, so two triggers cannot swap out of order.
    serial: tokio::sync::Mutex<()>,
    /// Readiness to update after each swap, and whether a set needs a domain to count.
    health: Option<(Arc<Health>, bool)>,
    source: ConfigSource,
}

impl Reloader {
    /// `status` describes the set `limiter` serves now (see [`ReloadStatus::new`]).
    pub fn new(limiter: Arc<Limiter>, path: PathBuf, status: Arc<ReloadStatus>) -> Self {
        let served = status.snapshot();
        apply::publish(&limiter, &served);
        Self {
            limiter,
            path,
            status,
            serial: tokio::sync::Mutex::new(()),
            health: None,
            source: served.source,
        }
    }

    /// The reloader of `source`'s set: its kind is taken from the source itself, so a
    /// source whose [`FirstSet`] status does not name it (the default is files) is
    /// still never reloaded, shown or counted as files.
    pub fn for_source(
        limiter: Arc<Limiter>,
        source: &dyn Source,
        status: Arc<ReloadStatus>,
    ) -> Self {
        status.lock().source = source.kind();
        Self::new(limiter, source.origin(), status)
    }

    /// Every swap sets `health`'s `config_loaded`: true, or false for a set without
    /// domains when `require_domains` (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub fn with_health(mut self, health: Arc<Health>, require_domains: bool) -> Self {
        self.health = Some((health, require_domains));
        self
    }

    /// The config path (files), or the control plane's URL (xDS), for logs.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn source(&self) -> ConfigSource {
        self.source
    }

    pub fn status(&self) -> &Arc<ReloadStatus> {
        &self.status
    }

    /// Reads the set again and swaps it in if it changed and validates; otherwise the
    /// served set stays, and the failure is logged and recorded.
    pub async fn reload(&self, trigger: Trigger) -> Result<ReloadOutcome, ReloadError> {
        let _serial = self.serial.lock().await;
        if !self.source.rereads {
            // Nothing on disk to read: the source sends every change itself.
            return Ok(ReloadOutcome::Unchanged);
        }
        let path = self.path.clone();
        let served = self.status.snapshot().hash;
        let loaded = tokio::task::spawn_blocking(move || {
            // Unchanged files: nothing to parse (this keeps polling and stray events
            // cheap). A hash error falls through to the loader, which names it.
            match hash_set(&path) {
                Ok(hash) if Some(&hash) == served.as_ref() => Ok(None),
                _ => load_set(&path).map(Some),
            }
        })
        .await
        .unwrap_or_else(|e| Err(ReloadError::Task(e.to_string())));
        match loaded {
            Ok(None) => {
                self.unchanged(trigger);
                Ok(ReloadOutcome::Unchanged)
            }
            Ok(Some(set)) => {
                let generation = self.swapped(set.config, Some(set.hash), None, trigger);
                Ok(ReloadOutcome::Swapped { generation })
            }
            Err(error) => {
                self.failed(&error, trigger);
                Err(error)
            }
        }
    }
}

/// Whether a set with `domains` domains makes health's `config_loaded` true.
pub fn config_counts(domains: usize, require_domains: bool) -> bool {
    domains > 0 || !require_domains
}
