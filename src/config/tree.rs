//! A domain's compiled descriptor tree, shaped for envoyproxy/ratelimit's lookup order:
//! at each level, per entry key, the exact values, then the wildcard values in config
//! order, then the key-only node.

use std::sync::Arc;

use super::glob::Glob;
use super::rule::Rule;
use crate::hash::FastMap;

/// One domain: the unit of configuration (one per file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: Arc<str>,
    pub root: Level,
    /// Every rule in the tree, in config order (for summaries and `replaces` checks).
    pub rules: Vec<Rule>,
    /// The body of this domain's 429s (`raw_body`), or the default JSON.
    pub raw_body: RawBody,
    /// What to answer when the counter store cannot decide.
    pub failure_mode: FailureMode,
}

/// What a domain's requests get while the counter store is unreachable or slow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Fail open: every limit passes (a Redis outage must not become an API outage).
    #[default]
    Allow,
    /// Fail closed: every limited descriptor is OVER_LIMIT.
    Deny,
    /// Answer UNAVAILABLE and let Envoy's `failure_mode_deny` decide.
    Error,
    /// Count in this process with the same rules, each replica admitting its share.
    Local,
}

impl FailureMode {
    pub const ALL: [(FailureMode, &'static str); 4] = [
        (FailureMode::Allow, "allow"),
        (FailureMode::Deny, "deny"),
        (FailureMode::Error, "error"),
        (FailureMode::Local, "local"),
    ];

    pub fn parse(text: &str) -> Option<FailureMode> {
        Self::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(text))
            .map(|(m, _)| *m)
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("allow", |(_, n)| n)
    }
}

/// What Envoy sends as the body of a 429 for this domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawBody {
    /// `{limit}` and `{retry_after}` are replaced per answer.
    pub body: String,
    pub content_type: String,
}

impl Default for RawBody {
    fn default() -> Self {
        RawBody {
            body:
                r#"{"error":"rate_limited","limit":"{limit}","retry_after_seconds":{retry_after}}"#
                    .to_owned(),
            content_type: "application/json".to_owned(),
        }
    }
}

/// The children of a node, by entry key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Level {
    pub keys: FastMap<String, Branch>,
}

/// Every node under one entry key at one level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Branch {
    pub exact: FastMap<String, Node>,
    pub wildcards: Vec<(Glob, Node)>,
    pub key_only: Option<Box<Node>>,
}

/// One descriptor node: maybe a rule, maybe children.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub rule: Option<Rule>,
    pub children: Level,
    /// A wildcard node whose matching values all count against one shared counter
    /// (`share_threshold`), instead of one counter per value.
    pub share_threshold: bool,
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}
