//! Prometheus metrics: the registry of one server (no global state) and the handles
//! the request path updates, each created once at start-up (per rule: on first use,
//! see [`rules`]), so recording is a few atomic adds. `GET /metrics` encodes the
//! registry in the Prometheus text format (version 0.0.4).
//!
//! Crate: `prometheus-client`, the Prometheus project's own: typed metric families,
//! an explicit registry instead of a global recorder, bounded histograms.
//!
//! Beside the request path: the configured limits ([`limits`]),
//! `tollgate_build_info`, the backend's health per node
//! ([`backend`]), the ports' connections ([`connections`]), reload timestamps, and the
//! process figures read at scrape time ([`process`]).

mod backend;
mod connections;
mod global;
mod lifecycle;
mod limits;
mod memory;
mod process;
mod rlqs;
mod rule_labels;
mod rules;
mod series;
mod service;
pub mod source;
mod upstream;

use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;

pub use self::backend::{BreakerGauge, BreakerState};
pub use self::connections::{ClosedBy, PortMetrics};
pub use self::global::{GlobalMetrics, GlobalRuleFigures};
pub use self::lifecycle::{BUILD_COMMIT, BUILD_VERSION};
pub use self::memory::EvictionCounter;
pub use self::rlqs::RlqsMetrics;
pub use self::rule_labels::{OVERFLOW, RuleLabels};
pub use self::rules::RuleOutcome;
pub use self::series::SeriesBounds;
pub use self::service::{BackendErrorKind, BackendOp, RequestErrorKind, RequestResult};
use crate::config::{Config, FailureMode};

/// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` default.
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Registry and handles of one server; shared by the limiter, the store wrapper, the
/// reloader and `GET /metrics`.
pub struct Metrics {
    registry: Registry,
    near_limit_ratio: f64,
    /// Whether `GET /metrics` answers (`USE_PROMETHEUS=false` turns it off).
    exposed: bool,
    rules: rules::RuleMetrics,
    limits: limits::LimitGauges,
    service: service::ServiceMetrics,
    lifecycle: lifecycle::Lifecycle,
    backend_health: backend::BackendMetrics,
    memory: memory::MemoryMetrics,
    source: source::SourceMetrics,
    rlqs: rlqs::RlqsMetrics,
    global: global::GlobalMetrics,
    connections: connections::ConnectionMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(DEFAULT_NEAR_LIMIT_RATIO, true)
    }
}

/// How `GET /metrics` names things beside tollgate's own names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MetricNames {
    /// tollgate's names only.
    #[default]
    Tollgate,
    /// Also envoyproxy/ratelimit's Prometheus names and labels
    /// (`--upstream-metric-names`), with the same values.
    AlsoUpstream,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("near_limit_ratio", &self.near_limit_ratio)
            .field("exposed", &self.exposed)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// `near_limit_ratio` in (0, 1] (the settings check it); `exposed`: serve them.
    pub fn new(near_limit_ratio: f64, exposed: bool) -> Self {
        Self::with_names(near_limit_ratio, exposed, MetricNames::Tollgate)
    }

    /// As [`Metrics::new`], choosing whether upstream's names are exported too.
    pub fn with_names(near_limit_ratio: f64, exposed: bool, names: MetricNames) -> Self {
        Self::with_bounds(near_limit_ratio, exposed, names, SeriesBounds::default())
    }

    /// As [`Metrics::with_names`], with the bound on series made from request values.
    pub fn with_bounds(
        near_limit_ratio: f64,
        exposed: bool,
        names: MetricNames,
        bounds: SeriesBounds,
    ) -> Self {
        let mut registry = Registry::default();
        let upstream_names = names == MetricNames::AlsoUpstream;
        Self {
            near_limit_ratio,
            exposed,
            rules: rules::RuleMetrics::register(&mut registry, upstream_names, bounds),
            limits: limits::LimitGauges::register(&mut registry),
            backend_health: backend::BackendMetrics::register(&mut registry),
            memory: memory::MemoryMetrics::register(&mut registry),
            lifecycle: lifecycle::Lifecycle::register(&mut registry),
            source: source::SourceMetrics::register(&mut registry),
            rlqs: rlqs::RlqsMetrics::register(&mut registry),
            global: global::GlobalMetrics::register(&mut registry),
            connections: connections::ConnectionMetrics::register(&mut registry),
            service: {
                registry.register_collector(Box::new(process::ProcessCollector::new()));
                service::ServiceMetrics::register(&mut registry)
            },
            registry,
        }
    }

    pub fn near_limit_ratio(&self) -> f64 {
        self.near_limit_ratio
    }

    pub fn exposed(&self) -> bool {
        self.exposed
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry)?;
        if let Some(upstream) = self.rules.upstream() {
            upstream.encode(&mut text, &self.service.upstream_counts())?;
        }
        Ok(text)
    }

    /// One descriptor's outcome on its rule (see [`RuleOutcome`]).
    pub fn rule(&self, rule: RuleLabels<'_>, outcome: &RuleOutcome) {
        self.rules.record(rule, outcome);
    }

    /// The gauge of one breaker's state, labelled with the node it protects.
    pub fn breaker_state(&self, node: &str) -> BreakerGauge {
        self.backend_health.breaker(node)
    }

    /// One readiness probe's findings, node by node (`true`: it answered). Nodes
    /// missing from it that an earlier probe reported lose their series.
    pub fn backend_probed<'a>(&self, nodes: impl IntoIterator<Item = (&'a str, bool)>) {
        self.backend_health.probed(nodes);
    }

    /// Where the served set came from, and the xDS stream's state.
    pub fn source(&self) -> &source::SourceMetrics {
        &self.source
    }

    /// One finished request.
    pub fn request(&self, elapsed: Duration, descriptors: usize, result: RequestResult) {
        self.service.request(elapsed, descriptors, result);
    }

    /// One call that reached the store, and how long it took.
    pub fn backend_call(&self, op: BackendOp, elapsed: Duration, error: Option<BackendErrorKind>) {
        self.service.backend_call(op, elapsed, error);
    }

    /// One request decided by its failure mode.
    pub fn fallback(&self, mode: FailureMode) {
        self.service.fallback(mode);
    }

    /// One reload that swapped (`true`) or was refused (`false`).
    pub fn reload(&self, success: bool) {
        self.service.reload(success);
        self.lifecycle.reload(success);
    }

    /// The served set: its generation and, when it came from disk, its hash.
    pub fn config_served(&self, generation: u64, hash: Option<&str>) {
        self.service.config_served(generation, hash);
    }

    /// A new config is served (or the first): the series of rules and domains it no
    /// longer has are removed (an override's series stay while their domain does),
    /// and the configured limits' gauges follow it.
    pub fn config_swapped(&self, config: &Config) {
        self.limits.set(config);
        self.rules.retain(|domain, rule| {
            config.domain(domain).is_some_and(|d| {
                rule == OVERRIDE_SERIES || d.rules.iter().any(|r| &*r.path == rule)
            })
        });
    }
}

/// The `rule` label of the series of Envoy's per-descriptor override (the limiter's
/// name for it).
pub const OVERRIDE_SERIES: &str = "(override)";

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;

    fn config(yaml: &str) -> Config {
        crate::config::load_sources(&[(Path::new("m.yaml"), yaml)]).unwrap()
    }

    fn hit(metrics: &Metrics, domain: &Arc<str>, rule: &Arc<str>, value: &str) {
        let entries = [("user".into(), value.into())];
        let labels = RuleLabels {
            domain,
            rule,
            entries: &entries,
            detailed: true,
            metric_levels: None,
        };
        let outcome = RuleOutcome {
            hits: 1,
            ..RuleOutcome::default()
        };
        metrics.rule(labels, &outcome);
    }

    /// Past the bound, values share the overflow series and the fold is counted; a
    /// reload without the rule removes every series it had, the upstream ones too.
    #[test]
    fn value_series_are_bounded_and_go_with_their_rule() {
        let bounds = SeriesBounds {
            per_rule: 3,
            total: 100,
        };
        let metrics = Metrics::with_bounds(0.8, true, MetricNames::AlsoUpstream, bounds);
        let (domain, rule) = (Arc::from("d"), Arc::from("user"));
        for i in 0..10 {
            hit(&metrics, &domain, &rule, &format!("v{i}"));
        }
        let text = metrics.encode().unwrap();
        let own = |v: &str| {
            format!(
                "tollgate_rule_hits_total{{domain=\"d\",rule=\"user\",descriptor=\"user={v}\"}} 1"
            )
        };
        assert!(
            text.contains(&own("v2")) && !text.contains("user=v3"),
            "{text}"
        );
        assert!(
            text.contains(
                "tollgate_rule_hits_total{domain=\"d\",rule=\"user\",descriptor=\"(overflow)\"} 7"
            ),
            "{text}"
        );
        assert!(
            text.contains("tollgate_rule_series_folded_total{domain=\"d\",rule=\"user\"} 7"),
            "{text}"
        );
        assert!(text.contains("key1=\"user_v0\""), "{text}");

        metrics.config_swapped(&config("domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"));
        assert!(
            metrics.encode().unwrap().contains(&own("v0")),
            "the rule stays"
        );
        metrics.config_swapped(&config("domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"));
        let text = metrics.encode().unwrap();
        assert!(
            !text.contains("rule=\"user\"") && !text.contains("key1=\"user"),
            "{text}"
        );
        // Room again: a new value gets a series of its own.
        hit(&metrics, &domain, &rule, "new");
        assert!(metrics.encode().unwrap().contains(&own("new")));
    }
}
