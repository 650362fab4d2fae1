//! What an answer tells the client beyond OK / OVER_LIMIT, in the response fields
//! Envoy applies: rate-limit headers (envoyproxy/ratelimit's `RateLimit-*` or the
//! IETF `RateLimit` / `RateLimit-Policy` fields), `Retry-After` on denial (with
//! optional full jitter, so rejected clients do not return in lockstep), the 429
//! body and its content type, and the shadow-mode request header.

use std::time::Duration;

use crate::config::RawBody;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::rate_limit_response::{Code, DescriptorStatus};

/// Which rate-limit headers to add to responses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HeaderStyle {
    /// None (envoyproxy/ratelimit's default; Envoy can still add its own X-RateLimit-*).
    #[default]
    None,
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`, names overridable.
    RateLimit {
        limit: String,
        remaining: String,
        reset: String,
    },
    /// draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` and `RateLimit`.
    Ietf,
}

impl HeaderStyle {
    pub fn envoy_ratelimit_defaults() -> Self {
        HeaderStyle::RateLimit {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Request header Envoy adds upstream when a shadow-mode limit was exceeded.
pub const SHADOW_HEADER: &str = "x-ratelimit-shadow-exceeded";

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

/// The status the headers describe, as envoyproxy/ratelimit picks it: the limited
/// status with the least remaining (first on ties), unless one is over the limit
/// (then the last such).
fn reported(statuses: &[DescriptorStatus]) -> Option<&DescriptorStatus> {
    let over = statuses
        .iter()
        .rev()
        .find(|s| s.code == Code::OverLimit as i32 && s.current_limit.is_some());
    over.or_else(|| {
        statuses
            .iter()
            .filter(|s| s.current_limit.is_some())
            .reduce(|best, s| {
                if s.limit_remaining < best.limit_remaining {
                    s
                } else {
                    best
                }
            })
    })
}

/// Rate-limit headers for `statuses`, in the configured style.
pub fn rate_limit_headers(
    style: &HeaderStyle,
    statuses: &[DescriptorStatus],
    windows: &[Option<u64>],
) -> Vec<HeaderValue> {
    let Some(status) = reported(statuses) else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .expect("reported statuses have a limit");
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds.max(0));
    match style {
        HeaderStyle::None => Vec::new(),
        HeaderStyle::RateLimit {
            limit: l,
            remaining: r,
            reset: t,
        } => vec![
            header(l, limit.requests_per_unit.to_string()),
            header(r, status.limit_remaining.to_string()),
            header(t, reset.to_string()),
        ],
        HeaderStyle::Ietf => {
            let index = statuses
                .iter()
                .position(|s| std::ptr::eq(s, status))
                .unwrap_or(0);
            let window = windows.get(index).copied().flatten().unwrap_or(0);
            let name = sf_string(if limit.name.is_empty() {
                "default"
            } else {
                &limit.name
            });
            vec![
                header(
                    "RateLimit-Policy",
                    format!("{name};q={};w={window}", limit.requests_per_unit),
                ),
                header(
                    "RateLimit",
                    format!("{name};r={};t={reset}", status.limit_remaining),
                ),
            ]
        }
    }
}

/// A structured-field string (RFC 8941): quoted, with `\` and `"` escaped and only
/// printable ASCII kept.
fn sf_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `Retry-After` in whole seconds, rounded up, plus up to `jitter` at random.
pub fn retry_after_header(retry_after: Duration, jitter: Duration) -> HeaderValue {
    let jitter_ms = u64::try_from(jitter.as_millis()).unwrap_or(u64::MAX);
    let extra = if jitter_ms == 0 {
        0
    } else {
        fastrand::u64(0..=jitter_ms)
    };
    let total_ms = u64::try_from(retry_after.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(extra);
    header("Retry-After", total_ms.div_ceil(1000).max(1).to_string())
}

/// The 429 body with `{limit}` and `{retry_after}` filled in, and its content type.
pub fn denied_body(
    body: &RawBody,
    limit: &str,
    retry_after: Option<Duration>,
) -> (Vec<u8>, HeaderValue) {
    let retry = retry_after.map_or_else(
        || "null".to_owned(),
        |d| d.as_millis().div_ceil(1000).to_string(),
    );
    let limit = limit.replace(['"', '\\'], "");
    let text = body
        .body
        .replace("{limit}", &limit)
        .replace("{retry_after}", &retry);
    (
        text.into_bytes(),
        header("content-type", body.content_type.clone()),
    )
}

pub fn shadow_header() -> HeaderValue {
    header(SHADOW_HEADER, "true".into())
}
