//! The backend's health, per node: `tollgate_backend_up{node}` (1 when the node
//! answered the last readiness probe, 0 when it did not) and
//! `tollgate_breaker_state{node}` (0 closed, 1 half-open, 2 open), which change only
//! when a probe ends or a breaker changes state, never per request; on a cluster
//! also the failed calls per master (`tollgate_backend_node_errors_total{node,kind}`,
//! touched only when a call fails) and the refunds given up on
//! (`tollgate_refunds_abandoned_total`).

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::service::BACKEND_ERRORS;
use super::{BackendErrorKind, Metrics};

type NodeLabel = [(&'static str, String); 1];
type NodeKindLabels = [(&'static str, String); 2];

/// A circuit breaker's state, as `tollgate_breaker_state` encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    HalfOpen = 1,
    Open = 2,
}

/// One node's breaker gauge: the breaker keeps it and sets it on each transition.
#[derive(Debug, Clone, Default)]
pub struct BreakerGauge(Gauge);

impl BreakerGauge {
    pub fn set(&self, state: BreakerState) {
        self.0.set(state as i64);
    }
}

pub(super) struct BackendMetrics {
    up: Family<NodeLabel, Gauge>,
    breaker: Family<NodeLabel, Gauge>,
    node_errors: Family<NodeKindLabels, Counter>,
    refunds_abandoned: Counter,
    /// The nodes the last probe reported, so a node gone from the topology (a failed
    /// master replaced) loses its series instead of reading 0 for ever.
    known: Mutex<HashSet<String>>,
}

impl BackendMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            up: Family::default(),
            breaker: Family::default(),
            node_errors: Family::default(),
            refunds_abandoned: Counter::default(),
            known: Mutex::default(),
        };
        registry.register(
            "tollgate_backend_up",
            "Whether the Redis node answered the last readiness probe (1) or not (0); \
             on a cluster, one series per master",
            metrics.up.clone(),
        );
        registry.register(
            "tollgate_breaker_state",
            "The circuit breaker in front of the Redis store (node=\"all\"), or of each \
             cluster master: 0 closed, 1 half-open, 2 open",
            metrics.breaker.clone(),
        );
        registry.register(
            "tollgate_backend_node_errors",
            "Redis Cluster calls that failed, by master and kind (circuit_open: refused \
             by that master's breaker, no call made)",
            metrics.node_errors.clone(),
        );
        registry.register(
            "tollgate_refunds_abandoned",
            "Counter operations a denied cross-slot request could not give back (their \
             counters stay high until their windows end: under-admission)",
            metrics.refunds_abandoned.clone(),
        );
        metrics
    }

    pub(super) fn breaker(&self, node: &str) -> BreakerGauge {
        BreakerGauge(
            self.breaker
                .get_or_create_owned(&[("node", node.to_owned())]),
        )
    }

    /// A node gone from the topology: its breaker and its error series go with it.
    fn forget(&self, node: &str) {
        self.breaker.remove(&[("node", node.to_owned())]);
        for kind in BACKEND_ERRORS {
            self.node_errors
                .remove(&[("node", node.to_owned()), ("kind", kind.to_owned())]);
        }
    }

    /// One probe's findings: every node it reached or tried, and whether it answered.
    pub(super) fn probed<'a>(&self, nodes: impl IntoIterator<Item = (&'a str, bool)>) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = HashSet::with_capacity(known.len());
        for (node, up) in nodes {
            self.up
                .get_or_create(&[("node", node.to_owned())])
                .set(i64::from(up));
            seen.insert(node.to_owned());
        }
        for gone in known.difference(&seen) {
            self.up.remove(&[("node", gone.clone())]);
        }
        *known = seen;
    }
}

impl Metrics {
    /// One failed call to cluster master `node` (`tollgate_backend_node_errors_total`).
    pub fn node_error(&self, node: &str, kind: BackendErrorKind) {
        self.backend_health
            .node_errors
            .get_or_create(&[
                ("node", node.to_owned()),
                ("kind", BACKEND_ERRORS[kind as usize].to_owned()),
            ])
            .inc();
    }

    /// `tollgate_refunds_abandoned_total`, as a handle the refund path increments.
    pub fn refunds_abandoned(&self) -> Counter {
        self.backend_health.refunds_abandoned.clone()
    }

    /// A cluster master left the topology: its per-node series are removed, so a
    /// replaced master does not read as an open breaker for ever.
    pub fn node_gone(&self, node: &str) {
        self.backend_health.forget(node);
    }
}
