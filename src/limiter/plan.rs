//! From a request to what must be counted: each descriptor resolved to its limits
//! (the config rule the matcher finds, or Envoy's per-descriptor override), `replaces`
//! applied across the request, and the batch of counter operations for the store.
//!
//! An override counts on the counter the configured limit of the same descriptor
//! values would use, when the window is the same (a fixed window of the same unit),
//! as envoyproxy/ratelimit does: its cache key is the domain, the request's entries and
//! the window start, whatever the limit (`GenerateCacheKey`). So a client cannot get a
//! fresh counter by having a route override the limit, and a route that lowers the
//! limit for some requests sees the hits the others already spent. Without a matching
//! rule, or with another window or algorithm, the override has a counter of its own.

use std::ops::Range;
use std::sync::{Arc, LazyLock};

use compact_str::CompactString;

use crate::algorithm::Mode;
use crate::config::matcher;
use crate::config::{Domain, Limit, Rule, RuleKind, Unit};
use crate::error::Error;
use crate::global::table::Table;
use crate::proto::{RateLimitDescriptor, RateLimitRequest};
use crate::store::{CounterKey, CounterOp};

/// Rule name of limits that come from Envoy's per-descriptor override: their counter
/// name, and what logs and spans show for them.
pub const OVERRIDE_RULE: &str = crate::metrics::OVERRIDE_SERIES;

/// [`OVERRIDE_RULE`] as counter keys hold it: made once, so an override's key, built
/// per request, shares it instead of allocating its own.
static OVERRIDE_RULE_ARC: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(OVERRIDE_RULE));

/// The name a limit's rule goes by in counters, logs and spans.
pub fn rule_name(rule: Option<&Rule>) -> &str {
    rule.map_or(OVERRIDE_RULE, |r| &r.path)
}

/// [`rule_name`] as a shared string (the metrics' `rule` label).
pub fn rule_label(rule: Option<&Rule>) -> &Arc<str> {
    rule.map_or(&OVERRIDE_RULE_ARC, |r| &r.path)
}

/// The limits of one descriptor: borrowed from the config, or Envoy's override.
pub enum Limits<'a> {
    Config(&'a [Limit]),
    Override {
        limit: Limit,
        /// The rule the descriptor's values match, whose counter the override shares
        /// when the window agrees (see the module's note); otherwise its own.
        counts_with: Option<&'a Rule>,
    },
}

impl Limits<'_> {
    pub fn as_slice(&self) -> &[Limit] {
        match self {
            Limits::Config(limits) => limits,
            Limits::Override { limit, .. } => std::slice::from_ref(limit),
        }
    }
}

/// What one request descriptor asks of the store.
pub enum Plan<'a> {
    /// Unknown domain, no matching rule, or a rule dropped by `replaces`.
    NoLimit,
    Unlimited,
    Limited {
        limits: Limits<'a>,
        /// `None` for Envoy's override.
        rule: Option<&'a Rule>,
        /// Entries counted per wildcard rather than per value (`share_threshold`).
        shared: u64,
        /// This descriptor's operations in [`RequestPlan::ops`], one per limit in
        /// order; empty until [`build`] makes them.
        ops: Range<usize>,
    },
}

/// The whole request's plan: one [`Plan`] per descriptor, in request order, and the
/// counter operations the store decides as one batch.
pub struct RequestPlan<'a> {
    pub descriptors: Vec<Plan<'a>>,
    pub ops: Vec<CounterOp>,
    /// The operations on global rules' counters (`global.rs`), with the region's
    /// share as their limit; empty without a ledger.
    pub global: Vec<super::global::GlobalOp>,
}

/// Every descriptor resolved (an unknown domain limits nothing), `replaces` applied.
pub fn resolve_all<'a>(
    domain: Option<&'a Domain>,
    request: &RateLimitRequest,
) -> Result<Vec<Plan<'a>>, Error> {
    let mut plans = Vec::with_capacity(request.descriptors.len());
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        plans.push(match domain {
            Some(domain) => resolve(domain, index, descriptor)?,
            None => Plan::NoLimit,
        });
    }
    apply_replaces(&mut plans);
    Ok(plans)
}

/// Envoy's per-descriptor `limit` wins over the config (the domain must still be
/// known); otherwise the matcher decides.
pub fn resolve<'a>(
    domain: &'a Domain,
    index: usize,
    descriptor: &RateLimitDescriptor,
) -> Result<Plan<'a>, Error> {
    let entries = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()));
    let found = matcher::find(domain, entries);
    if let Some(limit) = &descriptor.limit {
        let unit = Unit::from_proto(limit.unit).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "descriptor {index}: limit override has unknown unit {}",
                limit.unit
            ))
        })?;
        let limit = Limit::fixed(limit.requests_per_unit, unit);
        return Ok(Plan::Limited {
            limits: Limits::Override {
                limit,
                counts_with: found.map(|m| m.rule),
            },
            rule: None,
            // upstream's override keys on the request's values (no share_threshold).
            shared: 0,
            ops: 0..0,
        });
    }
    Ok(match found {
        None => Plan::NoLimit,
        Some(m) => match &m.rule.kind {
            RuleKind::Unlimited => Plan::Unlimited,
            RuleKind::Limited(limits) => Plan::Limited {
                limits: Limits::Config(limits),
                rule: Some(m.rule),
                shared: m.shared,
                ops: 0..0,
            },
        },
    })
}

/// `replaces`: a named limit is dropped when another matched limit in the same
/// request names it. The dropped descriptor is then answered like an unmatched one,
/// before any counter is touched, so it is neither counted nor able to deny.
pub fn apply_replaces(plans: &mut [Plan<'_>]) {
    let replaced: Vec<&str> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Limited {
                rule: Some(rule), ..
            } => Some(rule.replaces.iter().map(|r| &**r)),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for p in plans.iter_mut() {
        if let Plan::Limited {
            rule: Some(rule), ..
        } = p
            && rule.names().any(|name| replaced.contains(&name))
        {
            *p = Plan::NoLimit;
        }
    }
}

/// Whether a descriptor counts as quota-mode (envoyproxy/ratelimit's `isQuotaMode`):
/// its rule says `quota_mode`, or `QUOTA_MODE` is on. Under `QUOTA_MODE` a descriptor
/// without a limit counts too, as a quota descriptor that passed; an `unlimited` one
/// never does.
pub fn is_quota(plan: &Plan<'_>, global_quota: bool) -> bool {
    match plan {
        Plan::Unlimited => false,
        Plan::NoLimit => global_quota,
        Plan::Limited { rule, .. } => global_quota || rule.is_some_and(|r| r.quota_mode),
    }
}

/// One counter operation per limit of every limited descriptor, in request order;
/// each descriptor's plan learns where its operations are. With `global` (a ledger's
/// table), an operation on a global rule's counter decides against the region's
/// share (`global.rs`).
pub fn build<'a>(
    domain: Option<&Domain>,
    request: &RateLimitRequest,
    mut descriptors: Vec<Plan<'a>>,
    (global_shadow, global_quota, domain_overdraft): (bool, bool, bool),
    global: Option<&Table>,
) -> RequestPlan<'a> {
    // A quota-mode descriptor over its limit denies only when every quota-mode
    // descriptor of the request is over, so its counters cannot veto the batch, unless
    // it is the request's only one: then its denial is the request's, and vetoing keeps
    // "a denied request consumes nothing". (With several, a request denied because all
    // of them are over still counts its other descriptors' hits, as upstream does.)
    let quota_descriptors = descriptors
        .iter()
        .filter(|p| is_quota(p, global_quota))
        .count();
    // Envoy sends 0 when the route sets no hits_addend: that means one hit. A
    // descriptor's own hits_addend wins, and its 0 means "check only".
    let default_cost = u64::from(request.hits_addend.max(1));
    // Sized once: grown from empty it reallocated twice more by 10 descriptors.
    let planned = descriptors
        .iter()
        .map(|p| match p {
            Plan::Limited { limits, .. } => limits.as_slice().len(),
            _ => 0,
        })
        .sum();
    let mut ops = Vec::with_capacity(planned);
    let mut global_ops = Vec::new();
    for (descriptor, plan) in request.descriptors.iter().zip(&mut descriptors) {
        let Plan::Limited {
            limits,
            rule,
            shared,
            ops: range,
        } = plan
        else {
            continue;
        };
        let domain_name = domain
            .map(|d| &d.name)
            .expect("limits come only from a known domain");
        let cost = descriptor.hits_addend.unwrap_or(default_cost);
        // A shadow-mode counter counts but cannot veto the batch.
        let shadow = rule.is_some_and(|r| r.shadow_mode) || global_shadow;
        let quota = global_quota || rule.is_some_and(|r| r.quota_mode);
        let vetoes = !shadow && (!quota || quota_descriptors == 1);
        let overdraft = domain_overdraft || rule.is_some_and(|r| r.overdraft);
        let first = ops.len();
        // Whose counter: the rule's, or for an override the rule it shares with.
        let counter_rule = match limits {
            Limits::Override { counts_with, .. } => *counts_with,
            Limits::Config(_) => *rule,
        };
        for limit in limits.as_slice() {
            let mode = mode(descriptor, limit, overdraft, quota);
            let mut op = CounterOp {
                key: counter_key(domain_name, counter_rule, descriptor, *shared, limit),
                params: limit.params(),
                cost,
                // A release is never denied, so it has nothing to veto with.
                vetoes: vetoes && mode != Mode::Release,
                mode,
                lease: lease(descriptor, limit).map(CompactString::new),
            };
            if let Some(table) = global
                && let Some(g) = super::global::share(table, counter_rule, ops.len(), &mut op)
            {
                op.vetoes = vetoes;
                global_ops.push(g);
            }
            ops.push(op);
        }
        *range = first..ops.len();
    }
    RequestPlan {
        descriptors,
        ops,
        global: global_ops,
    }
}

/// What an operation does to its counter: Envoy's `is_negative_hits` releases; a
/// rule with `overdraft` (or a domain named by `--overdraft-domains`) charges as an
/// overdraft, a quota-mode one as upstream's INCRBY; otherwise it limits. A charge on
/// an algorithm that refuses charges (refused at load for a rule's own keys, so only
/// under the deployment-wide settings) limits.
fn mode(descriptor: &RateLimitDescriptor, limit: &Limit, overdraft: bool, quota: bool) -> Mode {
    let charges = limit.algorithm.charge_refusal().is_none();
    if descriptor.is_negative_hits {
        Mode::Release
    } else if overdraft && charges {
        Mode::Overdraft
    } else if quota && charges {
        Mode::Quota
    } else {
        Mode::Limit
    }
}

/// The request's own lease when `limit` names one (`lease_key`): the value of the
/// last entry, the rule's own key-only node (the config allows no other). It
/// identifies the request, so it stays out of the counter ([`counter_key`]).
pub fn lease<'d>(descriptor: &'d RateLimitDescriptor, limit: &Limit) -> Option<&'d str> {
    let lease_key = limit.lease_key.as_deref()?;
    let last = descriptor.entries.last()?;
    (last.key == lease_key).then_some(last.value.as_str())
}

/// The counter `limit` counts on for `descriptor`: the request's entries, but for the
/// one naming its lease ([`lease`]).
pub fn counter_key(
    domain: &Arc<str>,
    rule: Option<&Rule>,
    descriptor: &RateLimitDescriptor,
    shared: u64,
    limit: &Limit,
) -> CounterKey {
    let mut entries = &descriptor.entries[..];
    if lease(descriptor, limit).is_some() {
        entries = &entries[..entries.len() - 1];
    }
    let entries = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            // All values of a share_threshold wildcard count against one counter; the
            // rule path (which contains the pattern) keeps it apart from other nodes.
            let value = if i < matcher::MAX_SHARED_ENTRIES && shared & (1 << i) != 0 {
                CompactString::const_new("*")
            } else {
                CompactString::new(&e.value)
            };
            (CompactString::new(&e.key), value)
        })
        .collect();
    CounterKey {
        domain: domain.clone(),
        rule: rule.map_or_else(|| Arc::clone(&OVERRIDE_RULE_ARC), |r| r.path.clone()),
        entries,
        algorithm: limit.algorithm,
        window_secs: limit.window_secs(),
        time_zone: limit.calendar().map(|c| c.zone),
        hash_tag: rule.and_then(|r| r.hash_tag.clone()),
    }
}
