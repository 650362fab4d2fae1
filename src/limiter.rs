//! The decision for one `ShouldRateLimit` request: validate it, find each descriptor's
//! limit (config rule, Envoy's override, or none), apply `replaces`, hand the counters
//! to the store as one batch, and build the per-descriptor statuses in request order.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{Config, Domain, Limit, Rule, RuleKind, Unit};
use crate::error::Error;
use crate::matcher;
use crate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use crate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use crate::store::{CounterKey, CounterOp, Store};

/// Bounds on what one request may carry; beyond them it is refused with
/// `INVALID_ARGUMENT` rather than costing memory and Redis work.
pub mod bounds {
    pub const MAX_DOMAIN_BYTES: usize = 256;
    pub const MAX_DESCRIPTORS: usize = 64;
    pub const MAX_ENTRIES: usize = 32;
    pub const MAX_KEY_BYTES: usize = 256;
    pub const MAX_VALUE_BYTES: usize = 8 * 1024;
}

/// Counter name used for limits that come from Envoy's per-descriptor override.
const OVERRIDE_RULE: &str = "(override)";

/// Process-wide options of the limiter.
#[derive(Debug, Clone, Default)]
pub struct LimiterOptions {
    /// `SHADOW_MODE`: decide and report, but answer OK overall.
    pub global_shadow_mode: bool,
}

/// Holds the live config snapshot and the store; shared by the gRPC and HTTP fronts.
pub struct Limiter {
    config: ArcSwap<Config>,
    store: Arc<dyn Store>,
    options: LimiterOptions,
}

/// What one request descriptor resolved to.
enum Plan<'a> {
    /// Unknown domain, no matching rule, or a rule dropped by `replaces`.
    NoLimit,
    Unlimited,
    Limited {
        limit: Limit,
        rule: Option<&'a Rule>,
        op: usize,
    },
}

impl Limiter {
    pub fn new(config: Config, store: Arc<dyn Store>, options: LimiterOptions) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            options,
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Replaces the whole rule set at once; requests in flight keep the old snapshot.
    pub fn swap_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Error> {
        validate(request)?;
        let snapshot = self.config.load();
        let domain = snapshot.domain(&request.domain);
        // Envoy sends 0 when the route sets no hits_addend: that means one hit.
        let default_cost = u64::from(request.hits_addend.max(1));

        let mut resolved = Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            resolved.push(match domain {
                Some(domain) => resolve(domain, index, descriptor)?,
                None => Resolved::NoLimit,
            });
        }
        // Replaced limits are dropped before any counter is touched: they are neither
        // counted nor able to deny the request.
        apply_replaces(&mut resolved);

        let mut plans = Vec::with_capacity(resolved.len());
        let mut ops = Vec::new();
        for (descriptor, resolved) in request.descriptors.iter().zip(resolved) {
            let (limit, rule, shared) = match resolved {
                Resolved::NoLimit => {
                    plans.push(Plan::NoLimit);
                    continue;
                }
                Resolved::Unlimited => {
                    plans.push(Plan::Unlimited);
                    continue;
                }
                Resolved::Limited {
                    limit,
                    rule,
                    shared,
                } => (limit, rule, shared),
            };
            let domain_name = domain
                .map(|d| &d.name)
                .expect("limits come only from a known domain");
            let cost = descriptor.hits_addend.unwrap_or(default_cost);
            let shadow = rule.is_some_and(|r| r.shadow_mode) || self.options.global_shadow_mode;
            ops.push(CounterOp {
                key: counter_key(domain_name, rule, descriptor, shared, limit.unit),
                limit: u64::from(limit.requests_per_unit),
                cost,
                vetoes: !shadow,
            });
            plans.push(Plan::Limited {
                limit,
                rule,
                op: ops.len() - 1,
            });
        }

        let decisions = if ops.is_empty() {
            Vec::new()
        } else {
            self.store.decide(&ops).await?
        };

        let mut overall = Code::Ok;
        let statuses = plans
            .iter()
            .map(|plan| match plan {
                Plan::NoLimit => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Plan::Limited { limit, rule, op } => {
                    let decision = &decisions[*op];
                    let shadow = rule.is_some_and(|r| r.shadow_mode);
                    // A shadow-mode rule is counted and reported, never enforced.
                    let code = if decision.allowed || shadow {
                        Code::Ok
                    } else {
                        overall = Code::OverLimit;
                        Code::OverLimit
                    };
                    DescriptorStatus {
                        code: code as i32,
                        current_limit: Some(RateLimit {
                            name: rule
                                .and_then(|r| r.name.as_deref())
                                .unwrap_or_default()
                                .to_owned(),
                            requests_per_unit: limit.requests_per_unit,
                            unit: limit.unit.to_proto() as i32,
                        }),
                        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
                        duration_until_reset: Some(prost_types::Duration {
                            seconds: i64::try_from(decision.reset_after.as_secs())
                                .unwrap_or(i64::MAX),
                            nanos: 0,
                        }),
                        quota: None,
                    }
                }
            })
            .collect();
        // Global shadow mode changes only the overall answer: the statuses still say
        // which descriptors were over, as envoyproxy/ratelimit reports them.
        if self.options.global_shadow_mode {
            overall = Code::Ok;
        }
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            ..Default::default()
        })
    }
}

enum Resolved<'a> {
    NoLimit,
    Unlimited,
    Limited {
        limit: Limit,
        rule: Option<&'a Rule>,
        shared: u64,
    },
}

/// Envoy's per-descriptor `limit` wins over the config (the domain must still be
/// known); otherwise the matcher decides.
fn resolve<'a>(
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
            limit: Limit {
                requests_per_unit: limit.requests_per_unit,
                unit,
            },
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
            RuleKind::Limited(limit) => Resolved::Limited {
                limit: limit.clone(),
                rule: Some(m.rule),
                shared: m.shared,
            },
        },
    })
}

/// `replaces`: a named limit is dropped when another matched limit in the same
/// request names it. The dropped descriptor is then answered like an unmatched one.
fn apply_replaces(resolved: &mut [Resolved<'_>]) {
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
            && rule
                .name
                .as_deref()
                .is_some_and(|name| replaced.contains(&name))
        {
            *r = Resolved::NoLimit;
        }
    }
}

fn counter_key(
    domain: &Arc<str>,
    rule: Option<&Rule>,
    descriptor: &RateLimitDescriptor,
    shared: u64,
    unit: Unit,
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
        window_secs: unit.seconds(),
        hash_tag: rule.and_then(|r| r.hash_tag.clone()),
    }
}

fn validate(request: &RateLimitRequest) -> Result<(), Error> {
    use bounds::*;
    let invalid = |msg: String| Err(Error::InvalidRequest(msg));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > MAX_DOMAIN_BYTES {
        return invalid(format!(
            "domain is {} bytes; at most {MAX_DOMAIN_BYTES} are allowed",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are allowed per request",
            request.descriptors.len()
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptor {i}: {} entries; at most {MAX_ENTRIES} are allowed",
                descriptor.entries.len()
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return invalid(format!("descriptor {i} entry {j}: key must not be empty"));
            }
            if entry.key.len() > MAX_KEY_BYTES {
                return invalid(format!(
                    "descriptor {i} entry {j}: key is {} bytes; at most {MAX_KEY_BYTES} are allowed",
                    entry.key.len()
                ));
            }
            if entry.value.len() > MAX_VALUE_BYTES {
                return invalid(format!(
                    "descriptor {i} entry {j} ('{}'): value is {} bytes; at most {MAX_VALUE_BYTES} are allowed",
                    entry.key,
                    entry.value.len()
                ));
            }
        }
    }
    Ok(())
}
