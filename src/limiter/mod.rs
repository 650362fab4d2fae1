//! The decision for one `ShouldRateLimit` request: validate it, resolve each
//! descriptor to its limits ([`plan`]), hand every counter to the store as one batch,
//! build the per-descriptor statuses in request order, and hold a shaped (leaky
//! bucket) request until its turn.

pub mod answer;
pub mod bounds;
pub mod fallback;
mod observe;
pub mod plan;
pub mod tarpit;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use self::answer::HeaderStyle;
use self::plan::{Limits, Resolved};
use crate::algorithm::Decision;
use crate::config::{Config, FailureMode, Limit, Rule};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::{CounterOp, Store};

/// Process-wide options of the limiter.
#[derive(Debug, Clone, Default)]
pub struct LimiterOptions {
    /// `SHADOW_MODE`: decide and report, but answer OK overall.
    pub global_shadow_mode: bool,
    /// Rate-limit headers added to responses.
    pub headers: HeaderStyle,
    /// Up to this much is added at random to `Retry-After` (full jitter).
    pub retry_after_jitter: Duration,
    /// Replicas sharing the limits; `failure_mode: local` admits 1/N of each.
    pub replicas: u32,
}

/// Holds the live config snapshot and the store; shared by the gRPC and HTTP fronts.
pub struct Limiter {
    config: ArcSwap<Config>,
    store: Arc<dyn Store>,
    options: LimiterOptions,
    tarpits: tarpit::Tarpits,
    fallback: fallback::Fallback,
    metrics: Arc<Metrics>,
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
    /// A limiter with metrics of its own (see [`Limiter::with_metrics`]).
    pub fn new(config: Config, store: Arc<dyn Store>, options: LimiterOptions) -> Self {
        Self::with_metrics(config, store, options, Arc::default())
    }

    /// A limiter recording into `metrics` (shared with the store stack and the reloader).
    pub fn with_metrics(
        config: Config,
        store: Arc<dyn Store>,
        options: LimiterOptions,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            tarpits: tarpit::Tarpits::default(),
            fallback: fallback::Fallback::new(options.replicas),
            options,
            metrics,
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Replaces the whole rule set at once; requests in flight keep the old snapshot.
    pub fn swap_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    /// The decision itself; `should_rate_limit` (in `observe.rs`) times and counts it.
    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Error> {
        bounds::validate(request)?;
        let snapshot = self.config.load();
        let domain = snapshot.domain(&request.domain);
        // Envoy sends 0 when the route sets no hits_addend: that means one hit.
        let default_cost = u64::from(request.hits_addend.max(1));

        let resolved = {
            let _matching = observe::match_span(request).entered();
            let mut resolved = Vec::with_capacity(request.descriptors.len());
            for (index, descriptor) in request.descriptors.iter().enumerate() {
                resolved.push(match domain {
                    Some(domain) => plan::resolve(domain, index, descriptor)?,
                    None => Resolved::NoLimit,
                });
            }
            plan::apply_replaces(&mut resolved);
            observe::matched(&resolved);
            resolved
        };

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
                Resolved::Limited {
                    limits,
                    rule,
                    shared,
                } => (limits, rule, shared),
            };
            let domain_name = domain
                .map(|d| &d.name)
                .expect("limits come only from a known domain");
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

        let mut local = Vec::new();
        let decisions = if ops.is_empty() {
            Vec::new()
        } else {
            match self.store.decide_noting_local(&ops, &mut local).await {
                Ok(decisions) => decisions,
                Err(error) => {
                    let mode = domain.map_or(FailureMode::default(), |d| d.failure_mode);
                    self.metrics.fallback(mode);
                    self.fallback.decide(mode, &ops, error, &request.domain)?
                }
            }
        };
        self.count_rules(&plans, &ops, &decisions, &local);

        let reports: Vec<Report<'_>> = plans
            .iter()
            .map(|plan| report(plan, &ops, &decisions, self.options.global_shadow_mode))
            .collect();
        let enforced_denial = reports.iter().any(|r| r.denial.is_some());
        let mut response = RateLimitResponse {
            overall_code: if enforced_denial {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses: reports.iter().map(|r| r.status.clone()).collect(),
            ..Default::default()
        };
        let windows: Vec<Option<u64>> = reports.iter().map(|r| r.window_secs).collect();
        response.response_headers_to_add =
            answer::rate_limit_headers(&self.options.headers, &response.statuses, &windows);

        // Shadow mode: the request goes through, marked for the upstream, and logged.
        let shadowed: Vec<&Report<'_>> = reports
            .iter()
            .filter(|r| {
                r.shadow_exceeded || (self.options.global_shadow_mode && r.denial.is_some())
            })
            .collect();
        for r in &shadowed {
            tracing::info!(
                event = "shadow_exceeded",
                domain = %request.domain,
                rule = r.rule.map_or("(override)", |rule| &rule.path),
                key = %r.key,
                "a shadow-mode limit was exceeded; the request was allowed"
            );
        }
        if !shadowed.is_empty() {
            response
                .request_headers_to_add
                .push(answer::shadow_header());
        }

        if enforced_denial && !self.options.global_shadow_mode {
            // The request passes only when every denying counter does: wait for the
            // slowest; "never" for any means no Retry-After at all.
            let retries: Vec<Option<Duration>> = reports
                .iter()
                .filter_map(|r| r.denial.map(|d| d.retry_after))
                .collect();
            let retry_after = retries
                .iter()
                .copied()
                .collect::<Option<Vec<_>>>()
                .and_then(|r| r.into_iter().max());
            if let Some(retry) = retry_after {
                response
                    .response_headers_to_add
                    .push(answer::retry_after_header(
                        retry,
                        self.options.retry_after_jitter,
                    ));
            }
            if let Some(domain) = domain {
                let limit = reports
                    .iter()
                    .find_map(|r| r.denial.map(|d| d.limit_name))
                    .unwrap_or_default();
                let (body, content_type) =
                    answer::denied_body(&domain.raw_body, limit, retry_after);
                response.raw_body = body;
                response.response_headers_to_add.push(content_type);
            }
            // Hold the answer back if a denying rule has a tarpit (the longest wins).
            let pit = reports
                .iter()
                .filter(|r| r.denial.is_some())
                .filter_map(|r| r.rule.and_then(|rule| rule.tarpit.map(|t| (rule, t))))
                .max_by_key(|(_, t)| t.delay);
            if let Some((rule, tarpit)) = pit {
                self.tarpits.hold(rule, tarpit).await;
            }
        } else if !enforced_denial {
            // Shaping: an admitted request is answered when its turn in the queue comes.
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
            response.overall_code = Code::Ok as i32;
        }
        Ok(response)
    }
}

/// Why a descriptor denies the request.
#[derive(Debug, Clone, Copy)]
struct Denial<'a> {
    retry_after: Option<Duration>,
    limit_name: &'a str,
}

/// One descriptor's outcome: its status, and what the rest of the answer needs.
struct Report<'a> {
    status: DescriptorStatus,
    rule: Option<&'a Rule>,
    /// The reported limit's window, for the IETF policy header.
    window_secs: Option<u64>,
    /// Set when an enforced limit of this descriptor denied.
    denial: Option<Denial<'a>>,
    /// A shadow-mode rule of this descriptor was over its limit.
    shadow_exceeded: bool,
    /// The counter key's entries for the shadow-mode log event; empty unless that
    /// event will be logged (formatting it for every request cost ~2% of the CPU).
    key: String,
}

fn report<'a>(
    plan: &'a Plan<'a>,
    ops: &[CounterOp],
    decisions: &[Decision],
    global_shadow: bool,
) -> Report<'a> {
    let status = status(plan, decisions);
    let Plan::Limited {
        limits,
        rule,
        ops: range,
    } = plan
    else {
        return Report {
            status,
            rule: None,
            window_secs: None,
            denial: None,
            shadow_exceeded: false,
            key: String::new(),
        };
    };
    let limits = limits.as_slice();
    let own = &decisions[range.clone()];
    let denied = own.iter().position(|d| !d.allowed);
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    let reported = denied.unwrap_or_else(|| {
        own.iter()
            .enumerate()
            .min_by_key(|(_, d)| d.remaining)
            .map_or(0, |(i, _)| i)
    });
    let logged = denied.is_some() && (shadow || global_shadow);
    let key = if logged {
        ops[range.start]
            .key
            .entries
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    } else {
        String::new()
    };
    Report {
        status,
        rule: *rule,
        window_secs: Some(limits[reported].window_secs()),
        denial: denied.filter(|_| !shadow).map(|i| Denial {
            retry_after: own[i].retry_after,
            limit_name: limits[i]
                .name
                .as_deref()
                .or(rule.map(|r| &*r.path))
                .unwrap_or_default(),
        }),
        shadow_exceeded: shadow && denied.is_some(),
        key,
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
        .or_else(|| {
            own.iter()
                .enumerate()
                .min_by_key(|(_, d)| d.remaining)
                .map(|(i, _)| i)
        })
        .unwrap_or(0);
    let (decision, limit): (&Decision, &Limit) = (&own[reported], &limits[reported]);
    // A shadow-mode rule is counted and reported, never enforced.
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    let code = if decision.allowed || shadow {
        Code::Ok
    } else {
        Code::OverLimit
    };
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
            seconds: i64::try_from(decision.reset_after.as_millis().div_ceil(1000))
                .unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}
