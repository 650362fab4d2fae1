//! A domain's compiled descriptor tree, shaped for envoyproxy/ratelimit's lookup order:
//! at each level, per entry key, the exact values, then the wildcard values in config
//! order, then the key-only node.

use std::collections::HashMap;
use std::sync::Arc;

use super::glob::Glob;
use super::rule::Rule;

/// One domain: the unit of configuration (one per file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: Arc<str>,
    pub root: Level,
    /// Every rule in the tree, in config order (for summaries and `replaces` checks).
    pub rules: Vec<Rule>,
}

/// The children of a node, by entry key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Level {
    pub keys: HashMap<String, Branch>,
}

/// Every node under one entry key at one level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Branch {
    pub exact: HashMap<String, Node>,
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
