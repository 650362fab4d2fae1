//! What an RLQS bucket is under the served config: the report's domain is the YAML
//! domain, and the `BucketId`'s entries select a rule as a descriptor's entries do
//! (`config::matcher::find_unordered` walks the tree, taking at each level the entry
//! whose key the level names). A bucket that matches no rule, or matches an
//! `unlimited` or shadow-mode rule, is allowed in full; a limited rule's bucket is
//! shared by demand under the ledger key its counter would have. Also what makes a
//! `BucketId` usable ([`validate`]) and its key within a stream.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::error::RlqsError;
use crate::config::{Config, Limit, RuleKind};
use crate::limiter::plan;
use crate::proto::RateLimitDescriptor;
use crate::proto::envoy::service::rate_limit_quota::v3::BucketId;
use crate::proto::rate_limit_descriptor::Entry;
use crate::store::redis::keys;

/// A bucket's entries in key order: its identity within a stream.
pub(super) type BucketKey = Box<[(Box<str>, Box<str>)]>;

/// Label of the `rule` of buckets no rule matched (and of unknown domains' `domain`).
pub const NO_RULE: &str = "(none)";
pub const UNKNOWN_DOMAIN: &str = "(unknown)";

/// Why a bucket is allowed in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Free {
    /// The domain is not served.
    UnknownDomain,
    /// No rule matches the bucket's entries.
    NoRule,
    /// The rule is `unlimited`.
    Unlimited,
    /// The rule (or the whole server) is in shadow mode: decided by nobody, counted.
    Shadow,
}

impl Free {
    pub fn name(self) -> &'static str {
        match self {
            Free::UnknownDomain => "unknown_domain",
            Free::NoRule => "no_rule",
            Free::Unlimited => "unlimited",
            Free::Shadow => "shadow",
        }
    }
}

/// A limited bucket: which limit it shares, and where its ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    /// The ledger key: the counter key the descriptor would have, plus `:rlqs`, so it
    /// shares the counter's hash tag (one slot per bucket, every stream's claim in it).
    pub ledger_key: String,
    /// L: tokens per window to divide.
    pub tokens: u64,
    pub window_secs: u64,
    /// The rule's `burst`, for the algorithms where it means a bucket's capacity.
    pub burst: Option<u64>,
}

/// The bucket under the served config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Metric labels: the domain (or [`UNKNOWN_DOMAIN`]) and the rule's path (or
    /// [`NO_RULE`]); both come from the config, never from the client.
    pub domain: Arc<str>,
    pub rule: Arc<str>,
    pub kind: Result<Shared, Free>,
}

/// Resolves `bucket` of `domain`; `prefix` is the Redis key prefix.
pub fn resolve(
    config: &Config,
    domain: &str,
    bucket: &BTreeMap<String, String>,
    prefix: &str,
    global_shadow: bool,
) -> Target {
    let free = |domain: Arc<str>, rule: Arc<str>, why| Target {
        domain,
        rule,
        kind: Err(why),
    };
    let Some(served) = config.domain(domain) else {
        return free(UNKNOWN_DOMAIN.into(), NO_RULE.into(), Free::UnknownDomain);
    };
    let entries = bucket.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let Some((found, walked)) = crate::config::matcher::find_unordered(served, entries) else {
        return free(served.name.clone(), NO_RULE.into(), Free::NoRule);
    };
    let rule = found.rule;
    let limits = match &rule.kind {
        RuleKind::Unlimited => {
            return free(served.name.clone(), rule.path.clone(), Free::Unlimited);
        }
        RuleKind::Limited(limits) => limits,
    };
    if rule.shadow_mode || global_shadow {
        return free(served.name.clone(), rule.path.clone(), Free::Shadow);
    }
    let limit = strictest(limits);
    let descriptor = RateLimitDescriptor {
        entries: walked
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    };
    let counter = plan::counter_key(&served.name, Some(rule), &descriptor, found.shared, limit);
    let mut ledger_key = keys::encode(prefix, &counter);
    ledger_key.push_str(":rlqs");
    let params = limit.params();
    let burst = matches!(
        limit.algorithm,
        crate::algorithm::Algorithm::TokenBucket | crate::algorithm::Algorithm::Gcra
    )
    .then_some(params.burst);
    Target {
        domain: served.name.clone(),
        rule: rule.path.clone(),
        kind: Ok(Shared {
            ledger_key,
            tokens: params.limit,
            window_secs: limit.window_secs().max(1),
            burst,
        }),
    }
}

/// Of several limits on one rule (`rate_limits`), the one with the lowest rate: every
/// limit must pass, and a token bucket enforces one rate.
fn strictest(limits: &[Limit]) -> &Limit {
    limits
        .iter()
        .min_by(|a, b| {
            let rate = |l: &Limit| f64::from(l.requests_per_unit) / l.window_secs().max(1) as f64;
            rate(a).total_cmp(&rate(b))
        })
        .expect("a limited rule has a limit")
}

/// A bucket id that can be used: present, non-empty keys and values, within the size
/// bound. Returns its entries in key order.
pub(super) fn validate(
    index: u64,
    id: Option<&BucketId>,
    max_bytes: usize,
) -> Result<BucketKey, RlqsError> {
    let bad = |why: String| RlqsError::BadBucket { index, why };
    let id = id.ok_or_else(|| bad("no bucket_id".into()))?;
    if id.bucket.is_empty() {
        return Err(bad("the bucket_id has no entries".into()));
    }
    let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > max_bytes {
        return Err(bad(format!(
            "the bucket_id has {bytes} bytes; at most {max_bytes} (--rlqs-max-bucket-id-bytes)"
        )));
    }
    if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(bad("a bucket_id key or value is empty".into()));
    }
    let mut entries: Vec<(Box<str>, Box<str>)> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.as_str().into(), v.as_str().into()))
        .collect();
    entries.sort_unstable();
    Ok(entries.into_boxed_slice())
}

/// The `BucketId` Envoy sent, from its entries.
pub(super) fn bucket_id(key: &BucketKey) -> BucketId {
    BucketId {
        bucket: key
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config() -> Config {
        crate::config::load_sources(&[(
            Path::new("q.yaml"),
            "domain: q\ndescriptors:\n  - key: name\n    value: api\n    rate_limit: {unit: minute, requests_per_unit: 600}\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 5}\n  - key: name\n    value: free\n    rate_limit: {unlimited: true}\n  - key: name\n    value: shadow\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        )])
        .unwrap()
    }

    fn bucket(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn entries_select_the_rule_a_descriptor_would() {
        let config = config();
        let t = resolve(
            &config,
            "q",
            &bucket(&[("name", "api"), ("env", "x")]),
            "",
            false,
        );
        let shared = t.kind.unwrap();
        assert_eq!((shared.tokens, shared.window_secs), (600, 60));
        assert!(shared.ledger_key.ends_with(":rlqs"));
        // The unnamed entry does not take part: the same ledger.
        let again = resolve(&config, "q", &bucket(&[("name", "api")]), "", false);
        assert_eq!(again.kind.unwrap().ledger_key, shared.ledger_key);
        let deeper = resolve(
            &config,
            "q",
            &bucket(&[("user", "u1"), ("name", "api")]),
            "",
            false,
        );
        assert_eq!(deeper.kind.unwrap().tokens, 5);
    }

    #[test]
    fn free_buckets_say_why() {
        let config = config();
        let why = |d: &str, e: &[(&str, &str)], shadow| {
            resolve(&config, d, &bucket(e), "", shadow).kind.err()
        };
        assert_eq!(
            why("nope", &[("name", "api")], false),
            Some(Free::UnknownDomain)
        );
        assert_eq!(why("q", &[("name", "other")], false), Some(Free::NoRule));
        assert_eq!(why("q", &[("name", "free")], false), Some(Free::Unlimited));
        assert_eq!(why("q", &[("name", "shadow")], false), Some(Free::Shadow));
        assert_eq!(why("q", &[("name", "api")], true), Some(Free::Shadow));
    }
}
