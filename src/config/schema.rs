//! The YAML schema of one config file, exactly as envoyproxy/ratelimit reads it.
//!
//! These types only mirror the file: every field a user may write, wrapped in [`At`]
//! where a later validation error must point at its line. They are deserialized from
//! the file's tree (`super::yaml`) after [`super::keys`] has reported and taken out
//! every unknown key and mistyped value, so that a file's mistakes are reported all at
//! once, not one per run. A key added here is added there too (a test compares them).
//! Unknown keys are refused (`deny_unknown_fields`), as envoyproxy/ratelimit refuses
//! them.

use serde::Deserialize;

use super::yaml::At;

/// One file: one domain and its descriptor tree.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainYaml {
    pub domain: Option<At<String>>,
    #[serde(default)]
    pub descriptors: Option<Vec<At<DescriptorYaml>>>,
    /// tollgate extension: descriptor keys forming the Redis Cluster hash tag.
    pub hash_tag: Option<At<Vec<String>>>,
    /// tollgate extension: the body Envoy sends with this domain's 429s.
    pub raw_body: Option<At<RawBodyYaml>>,
    /// tollgate extension: allow | deny | error | local while the store is away.
    pub failure_mode: Option<At<String>>,
}

/// The 429 body: text (with `{limit}` and `{retry_after}` filled in) and its type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBodyYaml {
    pub body: Option<String>,
    pub content_type: Option<String>,
}

/// Holding OVER_LIMIT answers back, so an attacker's connection waits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TarpitYaml {
    pub delay: Option<At<String>>,
    pub max_concurrent: Option<At<u32>>,
}

/// One node of the descriptor tree.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorYaml {
    pub key: Option<At<String>>,
    pub value: Option<At<String>>,
    pub rate_limit: Option<At<RateLimitYaml>>,
    /// tollgate extension: several limits on one descriptor, all of which must pass.
    pub rate_limits: Option<At<Vec<At<RateLimitYaml>>>>,
    pub descriptors: Option<Vec<At<DescriptorYaml>>>,
    pub shadow_mode: Option<bool>,
    /// envoyproxy/ratelimit: an over-limit quota-mode descriptor denies the request
    /// only when every quota-mode descriptor of it is over.
    pub quota_mode: Option<bool>,
    /// tollgate extension: charges always consume and admit while the counter is
    /// below its limit, so one charge may overdraw the budget (token budgets).
    pub overdraft: Option<bool>,
    pub detailed_metric: Option<bool>,
    pub share_threshold: Option<At<bool>>,
    pub value_to_metric: Option<bool>,
    /// envoyproxy/ratelimit: any mapping, returned in the answer's `dynamic_metadata`
    /// when this node's limit applies and passes (`RESPONSE_DYNAMIC_METADATA`).
    pub metadata: Option<At<serde_json::Map<String, serde_json::Value>>>,
    /// tollgate extension: overrides the domain's `hash_tag` for this subtree.
    pub hash_tag: Option<At<Vec<String>>>,
    /// tollgate extension: delay this rule's OVER_LIMIT answers.
    pub tarpit: Option<At<TarpitYaml>>,
    /// tollgate extension: one limit across regions, divided by a ledger
    /// (`--global-ledger`); each region decides against its share.
    pub global: Option<At<bool>>,
}

/// The limit attached to a descriptor node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitYaml {
    pub requests_per_unit: Option<At<u32>>,
    pub unit: Option<At<String>>,
    pub unlimited: Option<bool>,
    pub name: Option<At<String>>,
    pub replaces: Option<Vec<At<ReplacesYaml>>>,
    /// tollgate extensions: how to count, the window multiplier, the burst.
    pub algorithm: Option<At<String>>,
    pub unit_multiplier: Option<At<u32>>,
    pub burst: Option<At<u32>>,
    pub leaky_bucket: Option<At<LeakyBucketYaml>>,
    /// tollgate extension: an IANA zone (or UTC) whose calendar days, weeks, months
    /// and years the windows follow.
    pub time_zone: Option<At<String>>,
    /// tollgate extension: how long an acquisition of a concurrency rule counts
    /// unless released first (a duration such as `90s` or `5m`).
    pub lease: Option<At<String>>,
    /// tollgate extension: the descriptor entry naming the request (its id) on a
    /// concurrency rule, so a release frees exactly its own lease; the rule's own
    /// (last) key, which then is the lease's identity and not part of the counter.
    pub lease_key: Option<At<String>>,
}

/// Options of the leaky-bucket shaper.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakyBucketYaml {
    /// A duration such as `250ms`, `2s` or `1m`.
    pub max_delay: Option<At<String>>,
}

/// One entry of `replaces`: the name of a limit this one supersedes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplacesYaml {
    pub name: Option<String>,
}
