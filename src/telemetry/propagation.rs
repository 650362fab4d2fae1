//! The request span and its parent: Envoy sends the W3C `traceparent` (and
//! `tracestate`) of the HTTP request it is limiting in the gRPC call's metadata; the
//! request span continues that trace, so tollgate's spans appear under Envoy's. The
//! same works for `POST /json` with HTTP headers. Nothing is read when spans are off.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::SPAN_TARGET;
use crate::proto::RateLimitResponse;
use crate::proto::rate_limit_response::Code;

/// gRPC metadata as a propagation carrier.
pub struct MetadataExtractor<'a>(pub &'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// HTTP headers as a propagation carrier.
pub struct HeaderExtractor<'a>(pub &'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one `ShouldRateLimit` call (`name`: how it came in), child of the
/// trace context in `carrier` when there is one.
pub fn request_span(name: &'static str, domain: &str, carrier: &dyn Extractor) -> tracing::Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "ShouldRateLimit",
        otel.name = name,
        otel.kind = "server",
        otel.status_code = Empty,
        domain,
        decision = Empty,
        error = Empty,
    );
    if !span.is_disabled() {
        let parent = TraceContextPropagator::new().extract(carrier);
        // Fails only for a span that is not recorded, which was just ruled out.
        let _ = span.set_parent(parent);
    }
    span
}

/// Records the answer on the request span: `decision` is ok, over_limit or error.
pub fn record_decision<E: std::fmt::Display>(
    span: &tracing::Span,
    result: &Result<RateLimitResponse, E>,
) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(response) if response.overall_code == Code::OverLimit as i32 => {
            span.record("decision", "over_limit");
        }
        Ok(_) => {
            span.record("decision", "ok");
        }
        Err(error) => {
            span.record("decision", "error");
            span.record("otel.status_code", "ERROR");
            span.record("error", tracing::field::display(error));
        }
    }
}
