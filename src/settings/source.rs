//! Where `serve`'s limits come from, one variant per config source: the config files
//! (`CONFIG_TYPE=FILE`, the default: `--config`, else envoyproxy/ratelimit's
//! `RUNTIME_*` variables) or an xDS control plane (`CONFIG_TYPE=GRPC_XDS_SOTW`, its
//! variables in [`super::xds`]). A new source is a variant here, its settings, and a
//! [`crate::server::reload::Source`] that `serve` starts from it.

use std::path::PathBuf;

use super::ServeFlags;
use super::env::env_bool;
use super::xds::{self, XdsSettings};
use crate::error::Error;

/// Default config location when neither `--config` nor `RUNTIME_ROOT` is given.
pub const DEFAULT_CONFIG: &str = "config";
/// envoyproxy/ratelimit's `RUNTIME_APPDIRECTORY` default.
pub const DEFAULT_APP_DIRECTORY: &str = "config";

/// The config source and its settings.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceSettings {
    Files(FileSettings),
    /// Boxed: its settings are most of the size.
    Xds(Box<XdsSettings>),
}

impl SourceSettings {
    /// The config files, when limits come from files.
    pub fn files(&self) -> Option<&FileSettings> {
        match self {
            SourceSettings::Files(files) => Some(files),
            SourceSettings::Xds(_) => None,
        }
    }
}

/// Limits read from a config file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSettings {
    pub path: PathBuf,
    /// Watch the config for changes (else SIGHUP only).
    pub watch: bool,
    /// More paths whose swap means the config moved: `RUNTIME_ROOT` when the config
    /// comes from the environment and `RUNTIME_WATCH_ROOT` is true (its default).
    pub watch_anchors: Vec<PathBuf>,
    /// A start-up config that does not validate ends the process (`--exit-on-invalid-config`)
    /// instead of serving NOT_SERVING until a valid set loads, as envoyproxy/ratelimit does.
    pub exit_on_invalid_config: bool,
    /// `RUNTIME_IGNOREDOTFILES`; dot names are skipped either way (see README).
    pub ignore_dotfiles: bool,
}

/// `CONFIG_TYPE` picks the source; any other value than the two is refused.
pub(super) fn resolve(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<SourceSettings, Error> {
    match var("CONFIG_TYPE") {
        None => files(flags, var).map(SourceSettings::Files),
        Some(t) if t.trim().eq_ignore_ascii_case("FILE") => {
            files(flags, var).map(SourceSettings::Files)
        }
        Some(t) if t.trim().eq_ignore_ascii_case("GRPC_XDS_SOTW") => {
            xds::resolve(var).map(|xds| SourceSettings::Xds(Box::new(xds)))
        }
        Some(other) => Err(Error::Settings(format!(
            "CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"
        ))),
    }
}

/// envoyproxy/ratelimit reads `<RUNTIME_ROOT>/<RUNTIME_SUBDIRECTORY>/<RUNTIME_APPDIRECTORY>/`
/// and, with RUNTIME_WATCH_ROOT (its default), watches RUNTIME_ROOT for a symlink swap.
fn files(flags: &ServeFlags, var: &dyn Fn(&str) -> Option<String>) -> Result<FileSettings, Error> {
    let watch_root = env_bool(var, "RUNTIME_WATCH_ROOT", true)?;
    let ignore_dotfiles = env_bool(var, "RUNTIME_IGNOREDOTFILES", false)?;
    let mut watch_anchors = Vec::new();
    let path = match (&flags.config, var("RUNTIME_ROOT")) {
        (Some(path), _) => path.clone(),
        (None, Some(root)) => {
            let mut path = PathBuf::from(&root);
            if watch_root {
                watch_anchors.push(path.clone());
            }
            if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
                path.push(sub);
            }
            path.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| DEFAULT_APP_DIRECTORY.into()));
            path
        }
        (None, None) => PathBuf::from(DEFAULT_CONFIG),
    };
    Ok(FileSettings {
        path,
        watch: !flags.no_watch,
        watch_anchors,
        exit_on_invalid_config: flags.exit_on_invalid_config,
        ignore_dotfiles,
    })
}
