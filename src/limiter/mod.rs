//! The decision for one `ShouldRateLimit` request: validate it, resolve each
//! descriptor to its limits ([`plan`]), hand every counter to the store as one batch,
//! build the per-descriptor statuses in request order, and hold a shaped (leaky
//! bucket) request until its turn.

pub mod bounds;
pub mod plan;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use self::plan::{Limits, Resolved};
use crate::algorithm::Decision;
use crate::config::{Config, Limit, Rule};
use crate::error::Error;
use crate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::{CounterOp, Store};

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

/// One descriptor's part of the batch.
enum Plan<'a> {
    NoLimit,
    Unlimited,
    Limited {
        limits: Limits<'a>,
        rule: Option<&'a Rule>,
        ops: Range<usize>,
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

    pub async fn should_rate_limit(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Error> {
        bounds::validate(request)?;
        let snapshot = self.config.load();
        let domain = snapshot.domain(&request.domain);
        // Envoy sends 0 when the route sets no hits_addend: that means one hit.
        let default_cost = u64::from(request.hits_addend.max(1));

        let mut resolved = Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            resolved.push(match domain {
                Some(domain) => plan::resolve(domain, index, descriptor)?,
                None => Resolved::NoLimit,
            });
        }
        plan::apply_replaces(&mut resolved);

        let mut plans = Vec::with_capacity(resolved.len());
        let mut ops = Vec::new();
        for (descriptor, resolved) in request.descriptors.iter().zip(resolved) {
            let (limits, rule, shared) = match resolved {
                Resolved::NoLimit => {
                    plans.push(Plan::NoLimit);
                    continue;
                }
                Resolved::Unlimited => {
                    plans.push(Plan::Unlimited);
                    continue;
                }
                Resolved::Limited { limits, rule, shared } => (limits, rule, shared),
            };
            let domain_name = domain.map(|d| &d.name).expect("limits come only from a known domain");
            let cost = descriptor.hits_addend.unwrap_or(default_cost);
            let shadow = rule.is_some_and(|r| r.shadow_mode) || self.options.global_shadow_mode;
            let first = ops.len();
            for limit in limits.as_slice() {
                ops.push(CounterOp {
                    key: plan::counter_key(domain_name, rule, descriptor, shared, limit),
                    params: limit.params(),
                    cost,
                    vetoes: !shadow,
                });
            }
            plans.push(Plan::Limited {
                limits,
                rule,
                ops: first..ops.len(),
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
            .map(|plan| {
                let status = status(plan, &decisions);
                if status.code == Code::OverLimit as i32 {
                    overall = Code::OverLimit;
                }
                status
            })
            .collect();

        // Shaping: an admitted request is answered when its turn in the queue comes.
        if overall == Code::Ok {
            let wait = ops
                .iter()
                .zip(&decisions)
                .filter(|(op, d)| op.vetoes && d.allowed)
                .map(|(_, d)| d.delay)
                .max()
                .unwrap_or(Duration::ZERO);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
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

/// One descriptor's status. With several limits, the one reported is the first that
/// denied, else the one closest to its limit (least remaining).
fn status(plan: &Plan<'_>, decisions: &[Decision]) -> DescriptorStatus {
    let (limits, rule, ops) = match plan {
        Plan::NoLimit => {
            return DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
        }
        Plan::Unlimited => {
            return DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..Default::default()
            };
        }
        Plan::Limited { limits, rule, ops } => (limits.as_slice(), rule, ops),
    };
    let own = &decisions[ops.clone()];
    let reported = own
        .iter()
        .position(|d| !d.allowed)
        .or_else(|| own.iter().enumerate().min_by_key(|(_, d)| d.remaining).map(|(i, _)| i))
        .unwrap_or(0);
    let (decision, limit): (&Decision, &Limit) = (&own[reported], &limits[reported]);
    // A shadow-mode rule is counted and reported, never enforced.
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    let code = if decision.allowed || shadow { Code::Ok } else { Code::OverLimit };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: limit.name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.to_proto() as i32,
        }),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        // Whole seconds, rounded up: Envoy's X-RateLimit-Reset header is in seconds,
        // and 0 would tell a client to retry before anything changed.
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(decision.reset_after.as_millis().div_ceil(1000)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}
