//! The request span and its parent: Envoy sends the W3C `traceparent` (and
//! `tracestate`) of the HTTP request it is limiting in the gRPC call's metadata; the
//! request span continues that trace, so tollgate's spans appear under Envoy's. The
//! same works for `POST /json` with HTTP headers. Nothing is read when spans are off.
//!
//! Zipkin's B3 is read too, as envoyproxy/ratelimit does (its #1110): the single
//! `b3` header (`{trace}-{span}[-{sampled}[-{parent}]]`) and the multi headers
//! `X-B3-TraceId`, `X-B3-SpanId`, `X-B3-Sampled` (`X-B3-ParentSpanId` names the
//! caller's parent, which a child span does not need). `traceparent` wins when both
//! are sent. The parse is ours, a few lines: the crates that carry a B3 propagator
//! (`opentelemetry-zipkin`) bring a whole exporter with them.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
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
        let parent = extract_parent(carrier);
        // Fails only for a span that is not recorded, which was just ruled out.
        let _ = span.set_parent(parent);
    }
    span
}

/// The caller's span: from `traceparent`, else from B3 (single, then multi header);
/// an empty context when neither names a valid span.
pub fn extract_parent(carrier: &dyn Extractor) -> Context {
    let w3c = TraceContextPropagator::new().extract(carrier);
    if w3c.span().span_context().is_valid() {
        return w3c;
    }
    let b3 = carrier.get("b3").and_then(parse_b3_single).or_else(|| {
        b3_context(
            carrier.get("x-b3-traceid")?,
            carrier.get("x-b3-spanid")?,
            carrier.get("x-b3-sampled").or(carrier.get("x-b3-flags")),
        )
    });
    match b3 {
        Some(span) => Context::new().with_remote_span_context(span),
        None => w3c,
    }
}

/// `{trace}-{span}[-{sampled}[-{parent}]]`; a lone sampling state (`0`, `1`, `d`)
/// names no span.
fn parse_b3_single(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let trace = parts.next()?;
    let span = parts.next()?;
    b3_context(trace, span, parts.next())
}

/// A remote span context from B3's fields: a 64- or 128-bit trace id, a 64-bit span
/// id, lower-case hex, neither all zeros. Sampling `1`, `true` or `d` (debug) is
/// sampled, `0`/`false` is not; absent ("deferred": the receiver decides) is sampled,
/// so a B3 caller that leaves the choice to us still sees tollgate's spans.
fn b3_context(trace: &str, span: &str, sampled: Option<&str>) -> Option<SpanContext> {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let trace = trace.trim();
    let trace_id = if hex(trace, 32) {
        TraceId::from_hex(trace).ok()?
    } else if hex(trace, 16) {
        // A 64-bit trace id is the low half of a 128-bit one.
        TraceId::from(u64::from_str_radix(trace, 16).ok()? as u128)
    } else {
        return None;
    };
    let span = span.trim();
    if !hex(span, 16) {
        return None;
    }
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = match sampled.map(str::trim) {
        None | Some("1" | "d" | "true") => TraceFlags::SAMPLED,
        Some("0" | "false") => TraceFlags::default(),
        Some(_) => return None,
    };
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    context.is_valid().then_some(context)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Headers(HashMap<&'static str, &'static str>);

    impl Extractor for Headers {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).copied()
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().copied().collect()
        }
    }

    fn parent(pairs: &[(&'static str, &'static str)]) -> SpanContext {
        let headers = Headers(pairs.iter().copied().collect());
        extract_parent(&headers).span().span_context().clone()
    }

    const TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
    const SPAN: &str = "e457b5a2e4d86bd1";

    #[test]
    fn b3_single_header_names_the_parent() {
        let value = "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90";
        let span = parent(&[("b3", value)]);
        assert_eq!(span.trace_id().to_string(), TRACE);
        assert_eq!(span.span_id().to_string(), SPAN);
        assert!(span.is_sampled() && span.is_remote());
        let unsampled = parent(&[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-0")]);
        assert!(unsampled.is_valid() && !unsampled.is_sampled());
    }

    #[test]
    fn b3_multi_headers_name_the_parent_and_64_bit_ids_are_widened() {
        let span = parent(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
            ("x-b3-parentspanid", "05e3ac9a4f6e3b90"),
        ]);
        assert_eq!(
            span.trace_id().to_string(),
            "000000000000000064fe8b2a57d3eff7"
        );
        assert_eq!(span.span_id().to_string(), SPAN);
        assert!(span.is_sampled());
    }

    #[test]
    fn traceparent_wins_and_bad_b3_names_nothing() {
        let w3c = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let both = parent(&[
            ("traceparent", w3c),
            ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1"),
        ]);
        assert_eq!(
            both.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        for bad in [
            "1",
            "d",
            "xyz-e457b5a2e4d86bd1",
            "80f198ee56343ba864fe8b2a57d3eff7-e457",
            "00000000000000000000000000000000-e457b5a2e4d86bd1",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-7",
        ] {
            assert!(!parent(&[("b3", bad)]).is_valid(), "{bad}");
        }
        assert!(!parent(&[("x-b3-traceid", TRACE)]).is_valid(), "no span id");
    }
}
