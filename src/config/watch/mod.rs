//! Watching a config set on disk for changes, robust to how Kubernetes mounts a
//! ConfigMap: the files are symlinks into `..data`, itself a symlink to a timestamped
//! directory that is replaced by an atomic rename. A watch on a file dies with that
//! swap, so directories are watched, never single files:
//!
//! - a config directory recursively (edits, new and deleted files, `..data` swaps);
//! - a config file through its parent directory: a change to the file, or to a
//!   directory or symlink beside it (the file may be a symlink that a `..data` swap
//!   retargets), counts; a regular file beside it does not (a log written next to the
//!   config would otherwise reload it with every line);
//! - each *anchor* (the config directory itself, a config path that does not exist
//!   yet, and `RUNTIME_ROOT` when `RUNTIME_WATCH_ROOT` asks for it) through its
//!   parent, so a swap of the anchor (a symlink retargeted, a directory replaced or
//!   created) is seen; the watch on the set is then set up again on what the path now
//!   names. Nothing else in that parent counts.
//!
//! Events are debounced ([`WatchOptions::debounce`] of quiet, at most
//! [`MAX_SETTLE`] in all). Reading the files back produces access events, which are
//! ignored. Without inotify (or when the watch cannot be set up) the watcher falls
//! back to polling: a change is reported every [`POLL_INTERVAL`] and the reloader's
//! hash check makes unchanged polls cheap. Watcher errors are counted in the
//! [`Change`] for the consumer to log rate-limited (this layer logs nothing that can
//! repeat per event).

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};

/// Quiet period after the last event before a change is reported.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);
/// A stream of events that never pauses is still reported this long after it began.
pub const MAX_SETTLE: Duration = Duration::from_secs(2);
/// Period of the fallback poll, and of retrying a watch that could not be set up.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// The config file or directory, as given to `load_path`.
    pub path: PathBuf,
    /// More paths whose replacement may move the set (`RUNTIME_ROOT`).
    pub anchors: Vec<PathBuf>,
    pub debounce: Duration,
}

impl WatchOptions {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            anchors: Vec::new(),
            debounce: DEFAULT_DEBOUNCE,
        }
    }
}

/// What was seen, merged over a debounced burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Change {
    /// Files of the set (or beside a config file) changed.
    pub files: bool,
    /// An anchor was replaced: the recursive watch was set up again.
    pub moved: bool,
    /// The kernel's event queue overflowed, or the watcher failed: anything may have
    /// changed.
    pub rescan: bool,
    /// A fallback poll tick.
    pub poll: bool,
    /// Errors the watcher reported in the burst (each also a `rescan`). Not logged
    /// here, one WARN each: a failing watch can report them in a storm, so the
    /// consumer logs them rate-limited, with this count.
    pub errors: u32,
}

impl Change {
    fn merge(&mut self, other: Change) {
        self.files |= other.files;
        self.moved |= other.moved;
        self.rescan |= other.rescan;
        self.poll |= other.poll;
        self.errors = self.errors.saturating_add(other.errors);
    }
}

/// Which paths matter, shared with the watcher's event thread. Whether the path is a
/// directory, a file or absent is asked at each event: it may become any of them.
#[derive(Debug, Clone)]
struct Scope {
    path: PathBuf,
    anchors: Vec<PathBuf>,
}

impl Scope {
    /// How an event bears on the set, if at all.
    fn classify(&self, event: &Event) -> Option<Change> {
        if event.need_rescan() {
            return Some(Change {
                rescan: true,
                ..Change::default()
            });
        }
        match event.kind {
            // Our own reads open and close the files; only a finished write matters.
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
            EventKind::Access(_) => return None,
            _ => {}
        }
        let mut change = Change::default();
        if event.paths.is_empty() {
            change.files = true;
        }
        for path in &event.paths {
            if self.anchors.iter().any(|a| a == path) {
                change.moved = true;
            } else if self.covers(path) {
                change.files = true;
            }
        }
        (change != Change::default()).then_some(change)
    }

    /// Inside a config directory; a config file, or a directory or symlink beside it.
    /// A path that does not exist covers nothing: it is an anchor.
    fn covers(&self, path: &Path) -> bool {
        match std::fs::metadata(&self.path) {
            Ok(meta) if meta.is_dir() => path.starts_with(&self.path),
            Ok(_) => {
                path == self.path
                    || (path.parent() == self.path.parent()
                        && !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()))
            }
            Err(_) => false,
        }
    }

    fn is_dir(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.is_dir())
    }
}

/// A debounced stream of changes to one config set.
pub struct ConfigWatcher {
    scope: Scope,
    debounce: Duration,
    watcher: Option<RecommendedWatcher>,
    events: mpsc::UnboundedReceiver<Change>,
    /// Whether the recursive (or parent) watch on the set itself is in place.
    watching: bool,
}

impl ConfigWatcher {
    /// Sets up the watches; never fails: what cannot be watched is polled, with a
    /// warning saying why.
    pub fn new(options: WatchOptions) -> Self {
        // Events name paths as watched; absolute (symlinks kept: they are what may
        // be swapped) so that they compare with what we ask about.
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let path = absolute(&options.path);
        let mut anchors: Vec<PathBuf> = options.anchors.iter().map(|a| absolute(a)).collect();
        // A file is watched through its parent already.
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            anchors.push(path.clone());
        }
        anchors.sort();
        anchors.dedup();
        let scope = Scope { path, anchors };
        let (tx, events) = mpsc::unbounded_channel();
        let classify = scope.clone();
        let handler = move |result: notify::Result<Event>| {
            let change = match result {
                Ok(event) => classify.classify(&event),
                Err(error) => {
                    // Counted in the change; the WARN is the consumer's, rate-limited.
                    tracing::debug!(%error, "config watcher error; reading the set again");
                    Some(Change {
                        rescan: true,
                        errors: 1,
                        ..Change::default()
                    })
                }
            };
            if let Some(change) = change {
                let _ = tx.send(change);
            }
        };
        let watcher = match notify::recommended_watcher(handler) {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                tracing::warn!(
                    %error,
                    interval = ?POLL_INTERVAL,
                    "cannot watch the config (no inotify?); polling it instead"
                );
                None
            }
        };
        let mut this = Self {
            scope,
            debounce: options.debounce,
            watcher,
            events,
            watching: false,
        };
        this.watch_anchors(false);
        this.rewatch();
        this
    }

    /// Watches the parent of each anchor; `again` first drops the old watches, which
    /// may name directories that a swap has since replaced.
    fn watch_anchors(&mut self, again: bool) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let mut parents: Vec<&Path> = self
            .scope
            .anchors
            .iter()
            .filter_map(|a| a.parent())
            .collect();
        parents.sort();
        parents.dedup();
        for parent in parents {
            if again {
                let _ = watcher.unwatch(parent);
            }
            if let Err(error) = watcher.watch(parent, RecursiveMode::NonRecursive) {
                tracing::warn!(path = %parent.display(), %error, "cannot watch; a swap of the directory below it will be missed");
            }
        }
    }

    /// (Re)establishes the watch on the set, which may now live elsewhere.
    fn rewatch(&mut self) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let (target, mode) = if self.scope.is_dir() {
            (self.scope.path.clone(), RecursiveMode::Recursive)
        } else {
            let parent = self.scope.path.parent().unwrap_or(Path::new("/"));
            (parent.to_path_buf(), RecursiveMode::NonRecursive)
        };
        if self.watching {
            let _ = watcher.unwatch(&target);
        }
        match watcher.watch(&target, mode) {
            Ok(()) => {
                if !self.watching {
                    tracing::debug!(path = %target.display(), "watching the config");
                }
                self.watching = true;
            }
            Err(error) => {
                if self.watching {
                    tracing::warn!(path = %target.display(), %error, "cannot watch the config; retrying every {POLL_INTERVAL:?}");
                }
                self.watching = false;
            }
        }
    }

    /// Waits for the next change and for it to settle. While the set cannot be
    /// watched, resolves on each poll tick instead.
    pub async fn next_change(&mut self) -> Change {
        let mut change = self.first().await;
        let began = Instant::now();
        loop {
            tokio::select! {
                more = self.events.recv() => match more {
                    Some(more) => change.merge(more),
                    None => break,
                },
                _ = sleep(self.debounce) => break,
                _ = sleep_until(began + MAX_SETTLE) => break,
            }
        }
        // Watches first, reading second (the reload comes after this returns): a
        // change made in between is then seen by the read, or reported again.
        if change.moved || change.rescan {
            self.watch_anchors(true);
        }
        if change.moved || change.rescan || !self.watching {
            self.rewatch();
        }
        change
    }

    async fn first(&mut self) -> Change {
        loop {
            if !self.watching {
                sleep(POLL_INTERVAL).await;
                self.rewatch();
                // Drain what the new watch saw; the poll itself is the change.
                while self.events.try_recv().is_ok() {}
                return Change {
                    poll: true,
                    ..Change::default()
                };
            }
            match self.events.recv().await {
                Some(change) => return change,
                // The sender lives in the watcher we own; it cannot be gone while
                // we are, but if it were, polling is the safe answer.
                None => self.watching = false,
            }
        }
    }
}

#[cfg(test)]
mod tests;
