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
    /// tollgate extension `overdraft`: every hit is consumed, admitted while the
    /// counter is below its limit (see `algorithm::Mode::Overdraft`).
    pub overdraft: bool,
    /// `value_to_metric`: how each level of the path appears in the rule's metric
    /// key, when a level on it takes the request's value; `None` when none does.
    pub metric_levels: Option<Arc<[MetricLevel]>>,
    /// envoyproxy/ratelimit's descriptor `metadata`, merged into the answer's
    /// `dynamic_metadata` under `metadata` when this rule passes.
    pub metadata: Option<Metadata>,
    /// tollgate extension: the descriptor keys whose entries form the Redis Cluster
    /// hash tag of this rule's counters (nearest `hash_tag` up the tree, else the
    /// domain's); `None` tags with every entry.
    pub hash_tag: Option<Arc<[Arc<str>]>>,
    /// tollgate extension: hold this rule's OVER_LIMIT answers back.
    pub tarpit: Option<Tarpit>,
    /// tollgate extension `global`: one limit across regions; each region decides
    /// against the share a ledger gives it (`src/global/`).
    pub global: bool,
}

/// A descriptor's `metadata`, converted once at load into the protobuf `Struct` the
/// answer carries. `Eq` is sound in practice: values come from YAML, and a NaN in
/// metadata only makes two otherwise equal configs compare unequal (a needless swap).
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata(pub Arc<prost_types::Struct>);

impl Eq for Metadata {}

/// One level of a rule's metric key under envoyproxy/ratelimit's `value_to_metric`
/// (upstream's `domain.route_draw.http_method_GET.subject_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricLevel {
    /// `value_to_metric: true` on a key-only or wildcard node: the request's value.
    RequestValue,
    /// The configured value, or the wildcard pattern (`share_threshold`, or without
    /// `value_to_metric`).
    Configured(Arc<str>),
    /// A key-only node without `value_to_metric`: the key alone.
    KeyOnly,
}

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
    /// Whether this rule's metrics carry request values by `value_to_metric`
    /// (ignored when `detailed_metric` is set, as upstream does).
    pub fn value_to_metric(&self) -> bool {
        self.metric_levels.is_some()
    }

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
