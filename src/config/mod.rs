//! Configuration: the YAML schema ([`schema`]), read in two passes (the file's tree,
//! [`yaml`], checked by `keys` so every mistake of a file is reported at once, then
//! the typed schema), validation into an immutable compiled form ([`compile`] builds [`tree`], [`rule`], [`limit`]; every error through
//! [`diagnostics`]), loading a file or directory ([`load`], through the one bounded
//! directory [`walk`]), and the [`matcher`] that finds a request descriptor's rule in
//! the compiled tree.
//! The server holds a [`Config`] behind an atomic pointer and swaps whole sets;
//! [`watch`] reports changes on disk (the reload itself is `crate::server::reload`).

pub mod compile;
pub mod diagnostics;
pub mod glob;
mod keys;
pub mod limit;
pub mod load;
pub mod matcher;
pub mod rule;
pub mod schema;
pub mod tree;
pub mod walk;
pub mod watch;
pub mod yaml;

use std::sync::Arc;

use crate::hash::FastMap;

pub use diagnostics::{ConfigError, ConfigErrors};
pub use limit::{Limit, Unit};
pub use load::{load_documents, load_path, load_sources};
pub use rule::{Metadata, Rule, RuleKind, Tarpit};
pub use tree::{Domain, FailureMode, RawBody};

/// A validated config set: every domain by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    domains: FastMap<Arc<str>, Domain>,
}

impl Config {
    pub fn new(domains: Vec<Domain>) -> Self {
        Self {
            domains: domains.into_iter().map(|d| (d.name.clone(), d)).collect(),
        }
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Whether any rule is `global: true`.
    pub fn has_global_rules(&self) -> bool {
        self.domains
            .values()
            .any(|d| d.rules.iter().any(|r| r.global))
    }

    /// Domains in name order.
    pub fn domains(&self) -> Vec<&Domain> {
        let mut all: Vec<&Domain> = self.domains.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}
