//! The service-wide metrics: requests (latency by result, errors by kind, descriptors
//! per request), calls that reach the counter store (latency by operation, errors by
//! kind), failure-mode decisions, and the served config's reloads and generation.
//! Each handle is found once at start-up, so recording is a few atomic adds.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::upstream::ServiceCounts;
use crate::config::FailureMode;

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

/// `metric`, registered as `name`; a handle to it back.
fn registered<M: Clone + prometheus_client::registry::Metric>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// A counter family with one label, and the handle of each of its `values`.
fn counters<const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    (label, values): (&'static str, [&'static str; N]),
) -> [Counter; N] {
    let family = registered(registry, name, help, Family::<One, Counter>::default());
    values.map(|value| family.get_or_create_owned(&[(label, value)]))
}

/// A latency histogram family (seconds) with one label, and each value's handle.
fn histograms<const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    (label, values): (&'static str, [&'static str; N]),
) -> [Histogram; N] {
    let family = Family::<One, Histogram, fn() -> Histogram>::new_with_constructor(latency);
    registry.register_with_unit(name, help, Unit::Seconds, family.clone());
    values.map(|value| family.get_or_create_owned(&[(label, value)]))
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
pub(super) const BACKEND_ERRORS: [&str; 3] = ["timeout", "unavailable", "circuit_open"];
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

/// The service-wide handles.
pub(super) struct ServiceMetrics {
    request_duration: [Histogram; 3],
    requests: [Counter; 3],
    request_errors: [Counter; 5],
    descriptors: Histogram,
    backend_duration: [Histogram; 2],
    /// By operation, then by kind.
    backend_errors: [[Counter; 3]; 2],
    /// In `FailureMode::ALL` order.
    fallbacks: [Counter; 4],
    reloads: [Counter; 2],
    generation: Gauge,
    config_info: Family<[(&'static str, String); 1], Gauge>,
}

impl ServiceMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let descriptors = Histogram::new(DESCRIPTOR_BUCKETS);
        let backend_errors = Family::<Two, Counter>::default();
        let generation = Gauge::default();
        generation.set(1);
        let config_info = Family::default();
        let modes = FailureMode::ALL.map(|(_, name)| name);
        Self {
            request_duration: histograms(
                registry,
                "tollgate_request_duration",
                "ShouldRateLimit latency as the caller sees it (shaping and tarpit waits included), by result",
                ("result", REQUEST_RESULTS),
            ),
            requests: counters(
                registry,
                "tollgate_requests",
                "ShouldRateLimit requests (gRPC and /json), by result",
                ("result", REQUEST_RESULTS),
            ),
            request_errors: counters(
                registry,
                "tollgate_request_errors",
                "Requests answered with an error, by kind",
                ("kind", REQUEST_ERRORS),
            ),
            descriptors: registered(
                registry,
                "tollgate_request_descriptors",
                "Descriptors per request",
                descriptors,
            ),
            backend_duration: histograms(
                registry,
                "tollgate_backend_duration",
                "Latency of the calls that reach the counter store, by operation",
                ("operation", BACKEND_OPS),
            ),
            backend_errors: {
                let family = registered(
                    registry,
                    "tollgate_backend_errors",
                    "Counter store calls that failed, by operation and kind",
                    backend_errors,
                );
                BACKEND_OPS.map(|op| {
                    BACKEND_ERRORS.map(|kind| {
                        family.get_or_create_owned(&[("operation", op), ("kind", kind)])
                    })
                })
            },
            fallbacks: counters(
                registry,
                "tollgate_fallback_decisions",
                "Requests decided by their domain's failure_mode because the store could not",
                ("failure_mode", modes),
            ),
            reloads: counters(
                registry,
                "tollgate_config_reloads",
                "Config reloads that swapped a new set in (success) or kept the old one (failure)",
                ("result", ["success", "failure"]),
            ),
            generation: registered(
                registry,
                "tollgate_config_generation",
                "Generation of the served config: 1 at start-up, one more per reload",
                generation,
            ),
            config_info: registered(
                registry,
                "tollgate_config_info",
                "The served config set; the hash label is the hash of its files (as /config.json)",
                config_info,
            ),
        }
    }

    /// The service-wide numbers upstream exports, from tollgate's own handles.
    pub(super) fn upstream_counts(&self) -> ServiceCounts {
        let errors = |kinds: &[RequestErrorKind]| -> u64 {
            kinds
                .iter()
                .map(|k| self.request_errors[k.index()].get())
                .sum()
        };
        ServiceCounts {
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

    /// One finished request.
    pub(super) fn request(&self, elapsed: Duration, descriptors: usize, result: RequestResult) {
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
    pub(super) fn backend_call(
        &self,
        op: BackendOp,
        elapsed: Duration,
        error: Option<BackendErrorKind>,
    ) {
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
    pub(super) fn fallback(&self, mode: FailureMode) {
        if let Some(i) = FailureMode::ALL.iter().position(|(m, _)| *m == mode) {
            self.fallbacks[i].inc();
        }
    }

    /// One reload that swapped (`true`) or was refused (`false`).
    pub(super) fn reload(&self, success: bool) {
        self.reloads[usize::from(!success)].inc();
    }

    /// The served set: its generation and, when it came from disk, its hash.
    pub(super) fn config_served(&self, generation: u64, hash: Option<&str>) {
        self.generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.config_info.clear();
        self.config_info
            .get_or_create(&[("hash", hash.unwrap_or_default().to_owned())])
            .set(1);
    }
}
