//! From a request descriptor to what must be counted: the config rule the matcher
//! finds, or Envoy's per-descriptor override; `replaces` applied across the request;
//! and the counter each limit counts in.

use std::sync::Arc;

use crate::config::matcher;
use crate::config::{Domain, Limit, Rule, RuleKind, Unit};
use crate::error::Error;
use crate::proto::RateLimitDescriptor;
use crate::store::CounterKey;

/// Counter name used for limits that come from Envoy's per-descriptor override.
const OVERRIDE_RULE: &str = "(override)";

/// The limits of one descriptor: borrowed from the config, or Envoy's override.
pub enum Limits<'a> {
    Config(&'a [Limit]),
    Override(Limit),
}

impl Limits<'_> {
    pub fn as_slice(&self) -> &[Limit] {
        match self {
            Limits::Config(limits) => limits,
            Limits::Override(limit) => std::slice::from_ref(limit),
        }
    }
}

/// What one request descriptor resolved to.
pub enum Resolved<'a> {
    /// Unknown domain, no matching rule, or a rule dropped by `replaces`.
    NoLimit,
    Unlimited,
    Limited {
        limits: Limits<'a>,
        rule: Option<&'a Rule>,
        /// Entries counted per wildcard rather than per value (`share_threshold`).
        shared: u64,
    },
}

/// Envoy's per-descriptor `limit` wins over the config (the domain must still be
/// known); otherwise the matcher decides.
pub fn resolve<'a>(
    domain: &'a Domain,
    index: usize,
    descriptor: &RateLimitDescriptor,
) -> Result<Resolved<'a>, Error> {
    if let Some(limit) = &descriptor.limit {
        let unit = Unit::from_proto(limit.unit).ok_or_else(|| {
            Error::InvalidRequest(format!(
                "descriptor {index}: limit override has unknown unit {}",
                limit.unit
            ))
        })?;
        return Ok(Resolved::Limited {
            limits: Limits::Override(Limit::fixed(limit.requests_per_unit, unit)),
            rule: None,
            shared: 0,
        });
    }
    let entries = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()));
    Ok(match matcher::find(domain, entries) {
        None => Resolved::NoLimit,
        Some(m) => match &m.rule.kind {
            RuleKind::Unlimited => Resolved::Unlimited,
            RuleKind::Limited(limits) => Resolved::Limited {
                limits: Limits::Config(limits),
                rule: Some(m.rule),
                shared: m.shared,
            },
        },
    })
}

/// `replaces`: a named limit is dropped when another matched limit in the same
/// request names it. The dropped descriptor is then answered like an unmatched one,
/// before any counter is touched, so it is neither counted nor able to deny.
pub fn apply_replaces(resolved: &mut [Resolved<'_>]) {
    let replaced: Vec<&str> = resolved
        .iter()
        .filter_map(|r| match r {
            Resolved::Limited {
                rule: Some(rule), ..
            } => Some(rule.replaces.iter().map(|r| &**r)),
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for r in resolved.iter_mut() {
        if let Resolved::Limited {
            rule: Some(rule), ..
        } = r
            && rule.names().any(|name| replaced.contains(&name))
        {
            *r = Resolved::NoLimit;
        }
    }
}

pub fn counter_key(
    domain: &Arc<str>,
    rule: Option<&Rule>,
    descriptor: &RateLimitDescriptor,
    shared: u64,
    limit: &Limit,
) -> CounterKey {
    let entries = descriptor
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            // All values of a share_threshold wildcard count against one counter; the
            // rule path (which contains the pattern) keeps it apart from other nodes.
            let value = if i < 64 && shared & (1 << i) != 0 {
                "*"
            } else {
                e.value.as_str()
            };
            (e.key.clone(), value.to_owned())
        })
        .collect();
    CounterKey {
        domain: domain.clone(),
        rule: rule.map_or_else(|| Arc::from(OVERRIDE_RULE), |r| r.path.clone()),
        entries,
        algorithm: limit.algorithm,
        window_secs: limit.window_secs(),
        hash_tag: rule.and_then(|r| r.hash_tag.clone()),
    }
}
