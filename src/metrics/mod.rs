//! Prometheus metrics: the registry of one server (no global state) and the handles
//! the request path updates, each created once at start-up (per rule: on first use,
//! see [`rules`]), so recording is a few atomic adds. `GET /metrics` encodes the
//! registry in the Prometheus text format (version 0.0.4).
//!
//! Crate: `prometheus-client`, the Prometheus project's own: typed metric families,
//! an explicit registry instead of a global recorder, bounded histograms.
//!
//! Beside the request path: `tollgate_build_info`, the backend's health per node
//! ([`backend`]), reload timestamps, and the process figures read at scrape time
//! ([`process`]).

mod backend;
mod lifecycle;
mod memory;
mod process;
mod rules;
pub mod source;
mod upstream;

use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use self::backend::{BreakerGauge, BreakerState};
pub use self::lifecycle::{BUILD_COMMIT, BUILD_VERSION};
pub use self::memory::EvictionCounter;
pub use self::rules::{RuleLabels, RuleOutcome};
use crate::config::FailureMode;

/// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` default.
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// The `Content-Type` of `GET /metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Latency buckets, in seconds: a decision takes from tens of microseconds (memory)
/// to tens of milliseconds (a Redis burst); tarpits hold answers for seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    5.0,
];
/// Descriptors per request (at most 64 are accepted).
const DESCRIPTOR_BUCKETS: [f64; 8] = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 64.0];

type One = [(&'static str, &'static str); 1];
type Two = [(&'static str, &'static str); 2];

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// A backend operation, as the store seam names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendOp {
    Decide,
    DryRun,
}

impl BackendOp {
    fn index(self) -> usize {
        match self {
            BackendOp::Decide => 0,
            BackendOp::DryRun => 1,
        }
    }
}

/// Why a backend call failed, as the metrics label it. The store maps its own error
/// type onto this (metrics know no store type, so they sit below the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    Timeout,
    Unavailable,
    /// Refused by the circuit breaker at once: no call was made.
    CircuitOpen,
}

/// Why a request was answered with an error, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestErrorKind {
    InvalidArgument,
    Store(BackendErrorKind),
    Internal,
}

impl RequestErrorKind {
    fn index(self) -> usize {
        match self {
            RequestErrorKind::InvalidArgument => 0,
            RequestErrorKind::Store(kind) => 1 + kind as usize,
            RequestErrorKind::Internal => 4,
        }
    }
}

const BACKEND_OPS: [&str; 2] = ["decide", "dry_run"];
/// In `BackendErrorKind` order.
const BACKEND_ERRORS: [&str; 3] = ["timeout", "unavailable", "circuit_open"];
const REQUEST_RESULTS: [&str; 3] = ["ok", "over_limit", "error"];
/// In `RequestErrorKind::index` order.
const REQUEST_ERRORS: [&str; 5] = [
    "invalid_argument",
    "store_timeout",
    "store_unavailable",
    "store_circuit_open",
    "internal",
];

/// How one request ended, for the service metrics.
#[derive(Debug, Clone, Copy)]
pub enum RequestResult {
    Ok,
    OverLimit,
    Error(RequestErrorKind),
}

/// Registry and handles of one server; shared by the limiter, the store wrapper, the
/// reloader and `GET /metrics`.
pub struct Metrics {
    registry: Registry,
    near_limit_ratio: f64,
    /// Whether `GET /metrics` answers (`USE_PROMETHEUS=false` turns it off).
    exposed: bool,
    rules: rules::RuleMetrics,
    request_duration: [Histogram; 3],
    requests: [Counter; 3],
    request_errors: [Counter; 5],
    descriptors: Histogram,
    backend_duration: [Histogram; 2],
    /// By operation, then by kind.
    backend_errors: [[Counter; 3]; 2],
    /// In `FailureMode::ALL` order.
    fallbacks: Vec<Counter>,
    reloads: [Counter; 2],
    lifecycle: lifecycle::Lifecycle,
    backend_health: backend::BackendMetrics,
    memory: memory::MemoryMetrics,
    generation: Gauge,
    config_info: Family<[(&'static str, String); 1], Gauge>,
    source: source::SourceMetrics,
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
        let mut registry = Registry::default();
        let upstream_names = names == MetricNames::AlsoUpstream;
        let rules = rules::RuleMetrics::register(&mut registry, upstream_names);
        let backend_health = backend::BackendMetrics::register(&mut registry);
        let memory = memory::MemoryMetrics::register(&mut registry);
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        let lifecycle = lifecycle::Lifecycle::register(&mut registry);
        let source = source::SourceMetrics::register(&mut registry);

        let duration = Family::<One, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        registry.register_with_unit(
            "tollgate_request_duration",
            "ShouldRateLimit latency as the caller sees it (shaping and tarpit waits included), by result",
            Unit::Seconds,
            duration.clone(),
        );
        let requests = Family::<One, Counter>::default();
        registry.register(
            "tollgate_requests",
            "ShouldRateLimit requests (gRPC and /json), by result",
            requests.clone(),
        );
        let errors = Family::<One, Counter>::default();
        registry.register(
            "tollgate_request_errors",
            "Requests answered with an error, by kind",
            errors.clone(),
        );
        let descriptors = Histogram::new(DESCRIPTOR_BUCKETS);
        registry.register(
            "tollgate_request_descriptors",
            "Descriptors per request",
            descriptors.clone(),
        );
        let backend = Family::<One, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        registry.register_with_unit(
            "tollgate_backend_duration",
            "Latency of the calls that reach the counter store, by operation",
            Unit::Seconds,
            backend.clone(),
        );
        let backend_errors = Family::<Two, Counter>::default();
        registry.register(
            "tollgate_backend_errors",
            "Counter store calls that failed, by operation and kind",
            backend_errors.clone(),
        );
        let fallbacks = Family::<One, Counter>::default();
        registry.register(
            "tollgate_fallback_decisions",
            "Requests decided by their domain's failure_mode because the store could not",
            fallbacks.clone(),
        );
        let reloads = Family::<One, Counter>::default();
        registry.register(
            "tollgate_config_reloads",
            "Config reloads that swapped a new set in (success) or kept the old one (failure)",
            reloads.clone(),
        );
        let generation = Gauge::default();
        registry.register(
            "tollgate_config_generation",
            "Generation of the served config: 1 at start-up, one more per reload",
            generation.clone(),
        );
        let config_info = Family::default();
        registry.register(
            "tollgate_config_info",
            "The served config set; the hash label is the hash of its files (as /config.json)",
            config_info.clone(),
        );
        generation.set(1);

        let one = |family: &Family<One, Counter>, label: &'static str, value: &'static str| {
            family.get_or_create_owned(&[(label, value)])
        };
        Self {
            near_limit_ratio,
            exposed,
            rules,
            request_duration: REQUEST_RESULTS
                .map(|r| duration.get_or_create_owned(&[("result", r)])),
            requests: REQUEST_RESULTS.map(|r| one(&requests, "result", r)),
            request_errors: REQUEST_ERRORS.map(|k| one(&errors, "kind", k)),
            descriptors,
            backend_duration: BACKEND_OPS
                .map(|op| backend.get_or_create_owned(&[("operation", op)])),
            backend_errors: BACKEND_OPS.map(|op| {
                BACKEND_ERRORS.map(|kind| {
                    backend_errors.get_or_create_owned(&[("operation", op), ("kind", kind)])
                })
            }),
            fallbacks: FailureMode::ALL
                .iter()
                .map(|(_, name)| one(&fallbacks, "failure_mode", name))
                .collect(),
            reloads: ["success", "failure"].map(|r| one(&reloads, "result", r)),
            lifecycle,
            backend_health,
            memory,
            generation,
            config_info,
            source,
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
            upstream.encode(&mut text, &self.upstream_service_counts())?;
        }
        Ok(text)
    }

    /// The service-wide numbers upstream exports, from tollgate's own handles.
    fn upstream_service_counts(&self) -> upstream::ServiceCounts {
        let errors = |kinds: &[RequestErrorKind]| -> u64 {
            kinds
                .iter()
                .map(|k| self.request_errors[k.index()].get())
                .sum()
        };
        upstream::ServiceCounts {
            requests: self.requests.iter().map(Counter::get).sum(),
            // Every request the store could not decide went through a failure mode.
            redis_errors: self.fallbacks.iter().map(Counter::get).sum(),
            service_errors: errors(&[
                RequestErrorKind::InvalidArgument,
                RequestErrorKind::Internal,
            ]),
            // The generation counts the start-up load and every swap since.
            config_load_success: u64::try_from(self.generation.get()).unwrap_or_default(),
            config_load_error: self.reloads[1].get(),
        }
    }

    /// One descriptor's outcome on its rule (see [`RuleOutcome`]).
    pub fn rule(&self, rule: RuleLabels<'_>, outcome: &RuleOutcome) {
        self.rules.record(rule, outcome);
    }

    /// One finished request.
    pub fn request(&self, elapsed: Duration, descriptors: usize, result: RequestResult) {
        let index = match result {
            RequestResult::Ok => 0,
            RequestResult::OverLimit => 1,
            RequestResult::Error(kind) => {
                self.request_errors[kind.index()].inc();
                2
            }
        };
        self.requests[index].inc();
        self.request_duration[index].observe(elapsed.as_secs_f64());
        self.descriptors.observe(descriptors as f64);
    }

    /// One call that reached the store, and how long it took.
    pub fn backend_call(&self, op: BackendOp, elapsed: Duration, error: Option<BackendErrorKind>) {
        match error {
            // Refused by the breaker at once: no call was made, nothing to time.
            Some(kind @ BackendErrorKind::CircuitOpen) => {
                self.backend_errors[op.index()][kind as usize].inc();
            }
            Some(kind) => {
                self.backend_errors[op.index()][kind as usize].inc();
                self.backend_duration[op.index()].observe(elapsed.as_secs_f64());
            }
            None => self.backend_duration[op.index()].observe(elapsed.as_secs_f64()),
        }
    }

    /// One request decided by its failure mode.
    pub fn fallback(&self, mode: FailureMode) {
        if let Some(i) = FailureMode::ALL.iter().position(|(m, _)| *m == mode) {
            self.fallbacks[i].inc();
        }
    }

    /// One reload that swapped (`true`) or was refused (`false`).
    pub fn reload(&self, success: bool) {
        self.reloads[usize::from(!success)].inc();
        self.lifecycle.reload(success);
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

    /// A probe that reached no node at all: every node known so far reads 0.
    pub fn backend_unreachable(&self) {
        self.backend_health.all_down();
    }

    /// Where the served set came from, and the xDS stream's state.
    pub fn source(&self) -> &source::SourceMetrics {
        &self.source
    }

    /// The served set: its generation and, when it came from disk, its hash.
    pub fn config_served(&self, generation: u64, hash: Option<&str>) {
        self.generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.config_info.clear();
        self.config_info
            .get_or_create(&[("hash", hash.unwrap_or_default().to_owned())])
            .set(1);
    }
}
