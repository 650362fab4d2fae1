//! The file config source ([`FileSource`]): the set at start-up, then the directory
//! watcher (SIGHUP, which `serve` handles for every source, reloads it too); with
//! [`load_set`], which reads a whole set, and the hash of a set's files: how a reload
//! knows the set on disk is the one already served. The files are the loader's own
//! ([`walk`]: the same bounded walk, the same rules), so the hash covers exactly what
//! a load would read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::source::{ConfigSource, FirstSet, Source, SourceError};
use super::{LOAD_ATTEMPTS, ReloadError, ReloadStatus, Reloader, Trigger, config_counts};
use crate::background::Background;
use crate::config::walk::{self, WalkError};
use crate::config::watch::{ConfigWatcher, WatchOptions};
use crate::config::{self, Config};
use crate::metrics::source::SourceMetrics;
use crate::settings::FileSettings;
use crate::telemetry::{self, ratelimited};

/// Limits from a config file or directory.
pub struct FileSource(pub FileSettings);

impl Source for FileSource {
    fn kind(&self) -> ConfigSource {
        ConfigSource::FILES
    }

    fn origin(&self) -> PathBuf {
        self.0.path.clone()
    }

    /// A set that does not validate is served as envoyproxy/ratelimit does: nothing,
    /// NOT_SERVING, until the watcher or SIGHUP loads a valid one; unless
    /// `--exit-on-invalid-config` asks to stop.
    fn first_set(&self, require_domains: bool) -> Result<FirstSet, SourceError> {
        let path = &self.0.path;
        if !self.0.ignore_dotfiles {
            tracing::debug!(
                "names starting with '.' are skipped whatever RUNTIME_IGNOREDOTFILES says: \
                 a ConfigMap's ..data would otherwise load every domain twice"
            );
        }
        let error = match load_set(path) {
            Ok(loaded) => {
                let domains = loaded.config.domains().len();
                tracing::info!(
                    event = "config_loaded",
                    path = %path.display(),
                    domains,
                    hash = %loaded.hash,
                    generation = 1,
                    "config loaded"
                );
                return Ok(FirstSet {
                    config: loaded.config,
                    status: ReloadStatus::new(Some(loaded.hash)),
                    config_loaded: config_counts(domains, require_domains),
                });
            }
            Err(error) if self.0.exit_on_invalid_config => return Err(error.into()),
            Err(error) => error,
        };
        tracing::warn!(
            event = "config_invalid_at_start",
            path = %path.display(),
            errors = %telemetry::Json(&error.messages()),
            "no valid config: NOT_SERVING until a valid set loads (on change or SIGHUP)"
        );
        Ok(FirstSet::nothing_loaded())
    }

    /// Watches the set unless `--no-watch`.
    fn follow(
        &self,
        reloader: Arc<Reloader>,
        _: SourceMetrics,
    ) -> Result<Vec<Background>, SourceError> {
        if !self.0.watch {
            return Ok(Vec::new());
        }
        let mut options = WatchOptions::new(self.0.path.clone());
        options.anchors = self.0.watch_anchors.clone();
        Ok(vec![spawn_watch(reloader, options)])
    }
}

/// A set read from disk and validated, with the hash of exactly the files it came from.
#[derive(Debug)]
pub struct LoadedSet {
    pub config: Config,
    pub hash: String,
}

/// Loads and validates the whole set at `path`, and hashes its files before and after:
/// when they differ the files changed during the read, and it is read again. A
/// directory without config files is a set without domains (envoyproxy/ratelimit's
/// reading; `tollgate validate` still calls it an error, being asked about files).
pub fn load_set(path: &Path) -> Result<LoadedSet, ReloadError> {
    for _ in 0..LOAD_ATTEMPTS {
        let before = hash_set(path);
        let config = if is_empty_set(path) {
            Config::new(Vec::new())
        } else {
            config::load_path(path)?
        };
        match (before, hash_set(path)) {
            (Ok(before), Ok(after)) if before == after => {
                return Ok(LoadedSet {
                    config,
                    hash: after,
                });
            }
            _ => continue,
        }
    }
    Err(ReloadError::Unstable)
}

/// Watches `options.path` (see [`ConfigWatcher`]) and reloads after every settled
/// change, until the returned task is dropped. Must be called inside a Tokio runtime.
pub fn spawn_watch(reloader: Arc<Reloader>, options: WatchOptions) -> Background {
    let mut watcher = ConfigWatcher::new(options);
    Background::spawn(async move {
        loop {
            let change = watcher.next_change().await;
            tracing::debug!(?change, path = %reloader.path().display(), "config change seen");
            if change.errors > 0
                && let Some(suppressed) = ratelimited::admit(&["config_watch_error"])
            {
                tracing::warn!(
                    errors = change.errors,
                    suppressed,
                    "config watcher error; reading the set again"
                );
            }
            // The outcome is logged and recorded by `reload` itself.
            let _ = reloader.reload(Trigger::Watch).await;
        }
    })
}

/// SHA-256 (first 16 hex digits) over the files [`crate::config::load_path`] reads,
/// each as its path relative to `path` and its contents, in name order. Fails as the
/// walk does (a symlink loop, a bound) or when a file cannot be read.
pub fn hash_set(path: &Path) -> Result<String, WalkError> {
    let files = walk::list(path)?;
    let mut digest = Sha256::new();
    for (file, contents) in walk::read(&files) {
        let contents = contents?;
        let relative = file.strip_prefix(path).unwrap_or(&file);
        digest.update(relative.to_string_lossy().as_bytes());
        digest.update([0]);
        digest.update((contents.len() as u64).to_le_bytes());
        digest.update(&contents);
    }
    Ok(digest
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// True when `path` is a directory holding no config file (by the loader's rules):
/// envoyproxy/ratelimit serves such a directory as a set without domains.
pub fn is_empty_set(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
        && walk::list(path).is_ok_and(|files| files.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn hash_covers_names_and_contents_and_skips_dot_names() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), "domain: a\n").unwrap();
        let first = hash_set(dir.path()).unwrap();
        assert_eq!(first.len(), 16);
        fs::write(dir.path().join(".hidden.yaml"), "x").unwrap();
        fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert_eq!(hash_set(dir.path()).unwrap(), first);
        fs::write(dir.path().join("a.yaml"), "domain: b\n").unwrap();
        assert_ne!(hash_set(dir.path()).unwrap(), first);
        fs::rename(dir.path().join("a.yaml"), dir.path().join("b.yaml")).unwrap();
        let renamed = hash_set(dir.path()).unwrap();
        fs::rename(dir.path().join("b.yaml"), dir.path().join("a.yaml")).unwrap();
        assert_ne!(renamed, hash_set(dir.path()).unwrap());
    }

    #[test]
    fn a_directory_without_config_files_is_an_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert!(is_empty_set(dir.path()));
        assert!(
            !is_empty_set(&dir.path().join("missing")),
            "a missing path is an error"
        );
        fs::write(dir.path().join("a.yaml"), "domain: a\n").unwrap();
        assert!(!is_empty_set(dir.path()));
    }

    #[test]
    fn load_set_reports_every_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), "domain: a\nbogus: 1\n").unwrap();
        fs::write(dir.path().join("b.yaml"), "descriptors: []\n").unwrap();
        let error = load_set(dir.path()).unwrap_err();
        assert_eq!(error.messages().len(), 2, "{:?}", error.messages());
    }
}
