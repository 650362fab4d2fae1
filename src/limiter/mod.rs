//! The decision for one `ShouldRateLimit` request, read top-down in
//! [`Limiter::decide`]: validate it ([`bounds`]), resolve each descriptor to its
//! limits and counters ([`plan`]), have the store decide every counter as one batch
//! (or the domain's [`fallback`] when it cannot), build the answer ([`answer`]), and
//! hold it back when a tarpit or a shaping queue says so ([`tarpit`]). At debug, the
//! `decision` target explains each answer ([`explain`]).

pub mod answer;
pub mod bounds;
mod explain;
pub mod fallback;
pub mod global;
mod observe;
pub mod plan;
pub mod tarpit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use self::answer::{HeaderStyle, Hold};
use crate::algorithm::Decision;
use crate::config::{Config, Domain, FailureMode};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::{CounterOp, Store};

/// The store's decisions, the operations the local cache answered, and the failure
/// mode that answered instead of the store.
type Counted = (Vec<Decision>, Vec<usize>, Option<FailureMode>);

/// Process-wide options of the limiter.
#[derive(Debug, Clone, Default)]
pub struct LimiterOptions {
    /// `SHADOW_MODE`: decide and report, but answer OK overall.
    pub global_shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is quota-mode (the request is denied only when
    /// all of them are over).
    pub global_quota_mode: bool,
    /// `--overdraft-domains`: every rule of these domains charges with `overdraft`
    /// (for configs a control plane writes, such as Envoy Gateway's).
    pub overdraft_domains: Vec<String>,
    /// `RESPONSE_DYNAMIC_METADATA`: the answer's `dynamic_metadata` describes the
    /// request and carries the passed descriptors' YAML `metadata`, as upstream's does.
    pub response_dynamic_metadata: bool,
    /// Rate-limit headers added to responses.
    pub headers: HeaderStyle,
    /// Up to this much is added at random to `Retry-After` (full jitter).
    pub retry_after_jitter: Duration,
    /// Replicas sharing the limits; `failure_mode: local` admits 1/N of each.
    pub replicas: u32,
    /// `--memory-store-bytes`: bounds the `failure_mode: local` counts (`None`: default).
    pub memory_store_bytes: Option<u64>,
    /// With a global ledger (`--global-ledger`): the region's shares of global rules.
    /// Without one a global rule is decided as a local one.
    pub global: Option<Arc<crate::global::table::Table>>,
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
        // The configured limits' gauges start with the first set.
        metrics.config_swapped(&config);
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            tarpits: tarpit::Tarpits::default(),
            fallback: fallback::Fallback::new(
                options.replicas,
                options.memory_store_bytes,
                Some(metrics.memory_store_evictions("fallback")),
            ),
            options,
            metrics,
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Replaces the whole rule set at once; requests in flight keep the old snapshot.
    pub fn swap_config(&self, config: Config) {
        // Series of rules the new set no longer has go with it: a removed rule's
        // values must not stay in /metrics for good.
        self.metrics.config_swapped(&config);
        self.config.store(Arc::new(config));
    }

    /// Decides one `ShouldRateLimit` request (gRPC and `/json` alike), and records it.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, Error> {
        let start = Instant::now();
        let result = self.decide(request).await;
        observe::request(&self.metrics, start.elapsed(), request, &result);
        result
    }

    /// The metrics this limiter records into (what `GET /metrics` serves).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Fallback decisions taken so far, per failure mode.
    pub fn fallback_counts(&self) -> Vec<(FailureMode, u64)> {
        self.fallback.counts()
    }

    /// Plan, decide, answer, hold.
    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Error> {
        bounds::validate(request)?;
        let snapshot = self.config.load();
        let domain = snapshot.domain(&request.domain);
        let global_shadow = self.options.global_shadow_mode;

        // The `match` span times matching alone, not the building of counter keys.
        let descriptors = {
            let matching = observe::match_span(request).entered();
            let descriptors = plan::resolve_all(domain, request)?;
            observe::matched(&matching, &descriptors);
            descriptors
        };
        let overdraft = domain.is_some_and(|d| {
            self.options
                .overdraft_domains
                .iter()
                .any(|name| **name == *d.name)
        });
        let modes = (global_shadow, self.options.global_quota_mode, overdraft);
        let plan = plan::build(
            domain,
            request,
            descriptors,
            modes,
            self.options.global.as_deref(),
        );

        let (decisions, local, fallback) =
            self.count_planned(domain, &request.domain, &plan).await?;
        if let Some(table) = &self.options.global {
            global::note(table, &plan.ops, &decisions, &plan.global);
        }
        observe::count_rules(&self.metrics, &plan, &decisions, &local, global_shadow);

        let mut answer = answer::build(request, domain, &plan, &decisions, &self.options);
        if let Some(mode) = fallback {
            answer::mark_fallback(&mut answer.response, mode);
        }
        let counted = explain::Counted {
            decisions: &decisions,
            local: &local,
            fallback,
        };
        explain::log(request, &plan, &counted, &answer.response);
        match answer.hold {
            Hold::None => {}
            Hold::Tarpit(rule, tarpit) => {
                self.tarpits.hold(rule, tarpit).await;
            }
            Hold::Shaping(wait) => tokio::time::sleep(wait).await,
        }
        Ok(answer.response)
    }

    /// [`Limiter::count`] for a plan: operations a share of zero denies never reach
    /// the store; if one of them vetoes, the others are decided as for a request
    /// already denied (nothing consumed).
    async fn count_planned(
        &self,
        domain: Option<&Domain>,
        domain_name: &str,
        plan: &plan::RequestPlan<'_>,
    ) -> Result<Counted, Error> {
        let Some((ops, index)) = global::to_decide(&plan.ops, &plan.global) else {
            return self.count(domain, domain_name, &plan.ops).await;
        };
        let (decided, local, fallback) = if ops.is_empty() {
            (Vec::new(), Vec::new(), None)
        } else if global::unshared_vetoes(&plan.ops, &plan.global) {
            match self.store.dry_run(&ops).await {
                Ok(decided) => (decided, Vec::new(), None),
                Err(_) => {
                    // Only statuses are missing: the request is denied either way.
                    let unknown = ops.iter().map(denied_unread).collect();
                    (unknown, Vec::new(), None)
                }
            }
        } else {
            self.count(domain, domain_name, &ops).await?
        };
        let local = local.into_iter().map(|i| index[i]).collect();
        let decisions = global::merge(plan.ops.len(), decided, &index, &plan.global);
        Ok((decisions, local, fallback))
    }

    /// One decision per operation, from the store; when the store cannot decide, from
    /// the domain's `failure_mode`. Also returns the indices of the operations the
    /// local over-limit cache answered, and the failure mode that decided instead of
    /// the store, if one did (the answer says so).
    async fn count(
        &self,
        domain: Option<&Domain>,
        domain_name: &str,
        ops: &[CounterOp],
    ) -> Result<Counted, Error> {
        let mut local = Vec::new();
        if ops.is_empty() {
            return Ok((Vec::new(), local, None));
        }
        match self.store.decide_noting_local(ops, &mut local).await {
            Ok(decisions) => {
                // Only an answer that reached the store says it is back (the
                // over-limit cache answers known denials during an outage too).
                if local.len() < ops.len() {
                    self.fallback.store_answered();
                }
                Ok((decisions, local, None))
            }
            Err(error) => {
                let mode = domain.map_or(FailureMode::default(), |d| d.failure_mode);
                self.metrics.fallback(mode);
                let decisions = self.fallback.decide(mode, ops, error, domain_name)?;
                Ok((decisions, local, Some(mode)))
            }
        }
    }
}

/// The status of an operation of a request denied before the store was asked, when
/// the store could not say what the counter holds: not the cause of the denial,
/// nothing known to remain.
fn denied_unread(op: &CounterOp) -> Decision {
    Decision {
        allowed: true,
        remaining: 0,
        reset_after: Duration::from_millis(op.params.window_ms),
        retry_after: None,
        delay: Duration::ZERO,
    }
}
