//! Descriptor -> rule, with envoyproxy/ratelimit's semantics. Pure, no I/O, and no
//! allocation: it walks the compiled tree with borrowed request strings.
//!
//! At each level, for the request's next entry: the node for the exact value, else the
//! first wildcard value (config order) that matches, else the key-only node. There is
//! no backtracking: a choice made at one level is never revisited when a deeper level
//! fails. A rule applies only when the request's *last* entry lands on a node with a
//! `rate_limit`; a limit on an intermediate node does not apply to longer descriptors.

use crate::config::tree::{Level, Node};
use crate::config::{Domain, Rule};

/// Entries beyond this index are never marked as shared (requests are bounded well
/// below it by the service's validation).
pub const MAX_SHARED_ENTRIES: usize = 64;

/// A descriptor's rule, and which of its entries matched a `share_threshold` wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match<'a> {
    pub rule: &'a Rule,
    /// Bit `i` set: entry `i` matched a wildcard with `share_threshold`, so every value
    /// it matches counts against one shared counter.
    pub shared: u64,
}

/// Finds the rule for a descriptor's `(key, value)` entries within one domain.
pub fn find<'a, 'e, I>(domain: &'a Domain, entries: I) -> Option<Match<'a>>
where
    I: IntoIterator<Item = (&'e str, &'e str)>,
    I::IntoIter: ExactSizeIterator,
{
    let entries = entries.into_iter();
    let last = entries.len().checked_sub(1)?;
    let mut level: &'a Level = &domain.root;
    let mut shared = 0u64;
    for (i, (key, value)) in entries.enumerate() {
        let (node, via_shared_wildcard) = step(level, key, value)?;
        if via_shared_wildcard && i < MAX_SHARED_ENTRIES {
            shared |= 1 << i;
        }
        if i == last {
            return node.rule.as_ref().map(|rule| Match { rule, shared });
        }
        if node.children.is_empty() {
            return None;
        }
        level = &node.children;
    }
    None
}

/// One level of lookup: exact, then wildcards in order, then key-only.
fn step<'a>(level: &'a Level, key: &str, value: &str) -> Option<(&'a Node, bool)> {
    let branch = level.keys.get(key)?;
    if let Some(node) = branch.exact.get(value) {
        return Some((node, false));
    }
    if let Some((_, node)) = branch
        .wildcards
        .iter()
        .find(|(glob, _)| glob.matches(value))
    {
        return Some((node, node.share_threshold));
    }
    branch.key_only.as_deref().map(|node| (node, false))
}

/// [`find`] for an unordered set of entries (an RLQS `BucketId`): at each level, the
/// entry whose key that level names (the first in key order when it names several),
/// stepped as [`find`] steps; the walk stops when the next level names no entry left.
/// Entries the tree never names are not part of the match. Returns the rule and the
/// entries walked, in tree order (the descriptor the bucket stands for).
pub fn find_unordered<'a, 'e, I>(
    domain: &'a Domain,
    entries: I,
) -> Option<(Match<'a>, Vec<(&'e str, &'e str)>)>
where
    I: IntoIterator<Item = (&'e str, &'e str)> + Clone,
{
    let mut level: &'a Level = &domain.root;
    let mut walked: Vec<(&'e str, &'e str)> = Vec::new();
    let mut shared = 0u64;
    loop {
        let named = entries.clone().into_iter().find(|(key, _)| {
            level.keys.contains_key(*key) && !walked.iter().any(|(k, _)| k == key)
        })?;
        let (node, via_shared_wildcard) = step(level, named.0, named.1)?;
        if via_shared_wildcard && walked.len() < MAX_SHARED_ENTRIES {
            shared |= 1 << walked.len();
        }
        walked.push(named);
        let more = entries.clone().into_iter().any(|(key, _)| {
            node.children.keys.contains_key(key) && !walked.iter().any(|(k, _)| *k == key)
        });
        if !more {
            return node
                .rule
                .as_ref()
                .map(|rule| (Match { rule, shared }, walked));
        }
        level = &node.children;
    }
}
