//! Validation of the settings that shape answers rather than counts: a domain's
//! `raw_body` (the 429 body Envoy sends) and a rule's `tarpit` (delayed denials).

use std::time::Duration;

use crate::config::yaml::At;

use crate::config::diagnostics::{Report, key_line, parse_duration};
use crate::config::rule::Tarpit;
use crate::config::schema::{RawBodyYaml, TarpitYaml};
use crate::config::tree::RawBody;

/// The longest tarpit delay: Envoy's ratelimit `timeout` must exceed it, and holding
/// a connection longer than this only costs memory on both sides.
pub const MAX_TARPIT_DELAY: Duration = Duration::from_secs(30);

pub fn raw_body(spanned: Option<At<RawBodyYaml>>, report: Report<'_>) -> RawBody {
    let mut body = RawBody::default();
    let Some(spanned) = spanned else {
        return body;
    };
    if let Some(text) = spanned.value.body {
        body.body = text;
    }
    match spanned.value.content_type {
        Some(t) if t.trim().is_empty() || t.contains(['\r', '\n']) => {
            report(
                spanned.line,
                "raw_body.content_type: must be one header value".into(),
            );
        }
        Some(t) => body.content_type = t,
        None => {}
    }
    body
}

pub fn tarpit(
    source: &str,
    what: &str,
    spanned: Option<At<TarpitYaml>>,
    report: Report<'_>,
) -> Option<Tarpit> {
    let spanned = spanned?;
    let line = key_line(source, spanned.line, "tarpit");
    let t = spanned.value;
    let delay = match &t.delay {
        None => {
            report(line, format!("{what}: tarpit.delay: missing (like 2s)"));
            return None;
        }
        Some(d) => match parse_duration(&d.value) {
            Some(delay) if delay > Duration::ZERO && delay <= MAX_TARPIT_DELAY => delay,
            _ => {
                report(
                    d.line,
                    format!(
                        "{what}: tarpit.delay: '{}' must be a duration above 0 and at most {}s",
                        d.value,
                        MAX_TARPIT_DELAY.as_secs()
                    ),
                );
                return None;
            }
        },
    };
    let max_concurrent = match &t.max_concurrent {
        Some(m) if m.value == 0 => {
            report(
                m.line,
                format!("{what}: tarpit.max_concurrent: must be at least 1"),
            );
            return None;
        }
        Some(m) => m.value,
        None => 100,
    };
    Some(Tarpit {
        delay,
        max_concurrent,
    })
}
