//! The ports' connections (`server/conn/`): `tollgate_connections_open{port}`, the
//! connections closed by a bound (`tollgate_connections_closed_total{port,reason}`:
//! `handshake_timeout`, `idle_timeout`, `stalled`, `shutdown`) and the accepts that
//! failed (`tollgate_accept_errors_total{port}`, EMFILE and the like). Touched when a
//! connection opens or closes, never per request; and the calls refused because the
//! port had `--max-calls` in progress (`tollgate_calls_refused_total{port}`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

type PortLabel = [(&'static str, &'static str); 1];
type PortReasonLabels = [(&'static str, &'static str); 2];

/// Why a bound closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// No request bytes (nor a TLS handshake) within the handshake timeout.
    HandshakeTimeout,
    /// No call in progress for the idle timeout.
    IdleTimeout,
    /// A call's answer held past the request timeout: its client stopped reading.
    Stalled,
    /// Still open when the shutdown's wait for calls in flight ended.
    Shutdown,
}

impl ClosedBy {
    pub fn label(self) -> &'static str {
        match self {
            ClosedBy::HandshakeTimeout => "handshake_timeout",
            ClosedBy::IdleTimeout => "idle_timeout",
            ClosedBy::Stalled => "stalled",
            ClosedBy::Shutdown => "shutdown",
        }
    }
}

pub(super) struct ConnectionMetrics {
    open: Family<PortLabel, Gauge>,
    closed: Family<PortReasonLabels, Counter>,
    accept_errors: Family<PortLabel, Counter>,
    calls_refused: Family<PortLabel, Counter>,
}

impl ConnectionMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            open: Family::default(),
            closed: Family::default(),
            accept_errors: Family::default(),
            calls_refused: Family::default(),
        };
        registry.register(
            "tollgate_connections_open",
            "Connections open on the port (grpc, http, debug, prometheus)",
            metrics.open.clone(),
        );
        registry.register(
            "tollgate_connections_closed",
            "Connections the server closed because a bound was reached (handshake_timeout, \
             idle_timeout, stalled: a call's answer left unread past the request timeout, \
             shutdown: still open when the shutdown stopped waiting)",
            metrics.closed.clone(),
        );
        registry.register(
            "tollgate_accept_errors",
            "Failed accepts on the port (out of file descriptors, and the like); each is \
             followed by a pause before the next accept",
            metrics.accept_errors.clone(),
        );
        registry.register(
            "tollgate_calls_refused",
            "Calls refused at once because the port had --max-calls in progress (an \
             HTTP/2 stream reset with REFUSED_STREAM, 503 on HTTP/1)",
            metrics.calls_refused.clone(),
        );
        metrics
    }
}

/// One port's handles, kept by its accept loop.
#[derive(Debug, Clone, Default)]
pub struct PortMetrics {
    port: &'static str,
    open: Gauge,
    accept_errors: Counter,
    calls_refused: Counter,
    closed: Option<Family<PortReasonLabels, Counter>>,
}

impl PortMetrics {
    pub fn opened(&self) {
        self.open.inc();
    }

    pub fn closed(&self, by: Option<ClosedBy>) {
        self.open.dec();
        if let (Some(by), Some(closed)) = (by, &self.closed) {
            closed
                .get_or_create(&[("port", self.port), ("reason", by.label())])
                .inc();
        }
    }

    pub fn accept_failed(&self) {
        self.accept_errors.inc();
    }

    /// The port's counter of refused calls, for its connections to add to.
    pub fn calls_refused(&self) -> Counter {
        self.calls_refused.clone()
    }
}

impl Metrics {
    /// The handles of the port named `port`.
    pub fn port(&self, port: &'static str) -> PortMetrics {
        let label = [("port", port)];
        PortMetrics {
            port,
            open: self.connections.open.get_or_create_owned(&label),
            accept_errors: self.connections.accept_errors.get_or_create_owned(&label),
            calls_refused: self.connections.calls_refused.get_or_create_owned(&label),
            closed: Some(self.connections.closed.clone()),
        }
    }
}
