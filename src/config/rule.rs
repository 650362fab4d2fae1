//! The compiled, immutable form of a descriptor node's rule: its limits (see
//! [`super::limit`]), name, `replaces`, shadow and quota mode, metrics detail, metadata,
//! hash tag and tarpit.
//! What the matcher returns and the limiter turns into counter operations.

use std::sync::Arc;
use std::time::Duration;

use super::limit::Limit;

/// What a matched node says about requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleKind {
    /// Always OK; reported with remaining `u32::MAX` and no `current_limit`.
    Unlimited,
    /// One limit (`rate_limit`) or several (`rate_limits`), never empty: all must pass.
    Limited(Vec<Limit>),
}

/// A compiled `rate_limit` at one node of a domain's descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The node's path in the config (`key_value.key2`), for logs and metrics.
    pub path: Arc<str>,
    /// The first limit's `name`, for logs and summaries.
    pub name: Option<Arc<str>>,
    pub kind: RuleKind,
    /// Names of limits this one supersedes when both apply to one request.
    pub replaces: Vec<Arc<str>>,
    /// Decide and count, but always answer OK for this rule.
    pub shadow_mode: bool,
    /// Metrics may carry descriptor values for this rule (envoyproxy/ratelimit meaning).
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit's `quota_mode`: over its limit, this descriptor denies the
    /// request only when every quota-mode descriptor of the request is over too.
    pub quota_mode: bool,
    /// envoyproxy/ratelimit's `value_to_metric`, one flag per level of this rule's
    /// path (root first, as many as the path has entries): true where that level's
    /// node sets it, so the request's value at that level goes into the metric key
    /// (upstream: `domain.key_value.key2_value2`; a level matched by its exact value
    /// always shows the value, a wildcard level shows its pattern unless flagged, a
    /// key-only level shows the key alone unless flagged). `None`: no level sets it.
    pub value_to_metric: Option<Arc<[bool]>>,
    /// envoyproxy/ratelimit's descriptor `metadata`, merged into the answer's
    /// `dynamic_metadata` under `metadata` when this rule passes.
    pub metadata: Option<Metadata>,
    /// tollgate extension: the descriptor keys whose entries form the Redis Cluster
    /// hash tag of this rule's counters (nearest `hash_tag` up the tree, else the
    /// domain's); `None` tags with every entry.
    pub hash_tag: Option<Arc<[Arc<str>]>>,
    /// tollgate extension: hold this rule's OVER_LIMIT answers back.
    pub tarpit: Option<Tarpit>,
}

/// A descriptor's `metadata`, converted once at load into the protobuf `Struct` the
/// answer carries. `Eq` is sound in practice: values come from YAML, and a NaN in
/// metadata only makes two otherwise equal configs compare unequal (a needless swap).
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata(pub Arc<prost_types::Struct>);

impl Eq for Metadata {}

/// Delaying denials: Envoy holds the client's request while tollgate waits, so an
/// attacker's request rate drops to its concurrency over `delay`. At most
/// `max_concurrent` answers of one rule wait at once; beyond that they are immediate,
/// so tarpitting cannot exhaust tollgate itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tarpit {
    pub delay: Duration,
    pub max_concurrent: u32,
}

impl Rule {
    /// Every name this rule answers to in `replaces`.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let limits = match &self.kind {
            RuleKind::Limited(limits) => limits.as_slice(),
            RuleKind::Unlimited => &[],
        };
        self.name
            .as_deref()
            .into_iter()
            .chain(limits.iter().filter_map(|l| l.name.as_deref()))
    }
}
