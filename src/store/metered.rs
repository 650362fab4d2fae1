//! A store wrapper that observes every call reaching the backend: its latency and
//! failures go to [`Metrics`] (`tollgate_backend_*`), and each call is a trace span
//! (`backend`, with the domain, the rules and the decision). It decides nothing.
//! In the server's stack it sits below the over-limit cache, so what the cache
//! answers is not a backend call, and above the breaker, so refused calls count as
//! `circuit_open` errors.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;
use tracing::field::Empty;

use super::{CounterOp, PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::Decision;
use crate::metrics::{BackendOp, Metrics};
use crate::telemetry::SPAN_TARGET;

pub struct Metered<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: Store> Metered<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    async fn observe(
        &self,
        op: BackendOp,
        ops: &[CounterOp],
        call: StoreFuture<'_>,
    ) -> Result<Vec<Decision>, StoreError> {
        let span = span(op, ops);
        let start = Instant::now();
        let result = call.instrument(span.clone()).await;
        self.metrics.backend_call(
            op,
            start.elapsed(),
            result.as_ref().err().map(StoreError::kind),
        );
        if !span.is_disabled() {
            match &result {
                Ok(decisions) if decisions.iter().all(|d| d.allowed) => {
                    span.record("decision", "ok");
                }
                Ok(_) => {
                    span.record("decision", "over_limit");
                }
                Err(error) => {
                    span.record("decision", "error");
                    span.record("otel.status_code", "ERROR");
                    span.record("error", tracing::field::display(error));
                }
            }
        }
        result
    }
}

/// The span of one backend call; attributes are computed only when it is recorded.
fn span(op: BackendOp, ops: &[CounterOp]) -> tracing::Span {
    let name = match op {
        BackendOp::Decide => "backend decide",
        BackendOp::DryRun => "backend dry_run",
    };
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "backend",
        otel.name = name,
        otel.kind = "client",
        otel.status_code = Empty,
        operations = ops.len(),
        domain = Empty,
        rule = Empty,
        decision = Empty,
        error = Empty,
    );
    if !span.is_disabled() {
        if let Some(first) = ops.first() {
            span.record("domain", &*first.key.domain);
        }
        let mut rules: Vec<&str> = ops.iter().map(|op| &*op.key.rule).collect();
        rules.dedup();
        span.record("rule", rules.join(",").as_str());
    }
    span
}

impl<S: Store> Store for Metered<S> {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.observe(BackendOp::Decide, ops, self.inner.decide(ops)))
    }

    fn decide_noting_local<'a>(
        &'a self,
        ops: &'a [CounterOp],
        local: &'a mut Vec<usize>,
    ) -> StoreFuture<'a> {
        let call = self.inner.decide_noting_local(ops, local);
        Box::pin(self.observe(BackendOp::Decide, ops, call))
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.observe(BackendOp::DryRun, ops, self.inner.dry_run(ops)))
    }

    fn ping(&self) -> PingFuture<'_> {
        self.inner.ping()
    }

    fn ready(&self) -> bool {
        self.inner.ready()
    }
}
