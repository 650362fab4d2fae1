//! Validation of one `rate_limit` mapping (in `rate_limit:` or an entry of
//! `rate_limits:`) into a [`Limit`]: envoyproxy/ratelimit's rules for unit, unlimited
//! and replaces, plus tollgate's algorithm, unit_multiplier, burst and leaky_bucket.

use std::sync::Arc;

use serde_saphyr::Spanned;

use crate::algorithm::{Algorithm, sliding_log};
use crate::config::diagnostics::{Report, key_line, parse_duration};
use crate::config::limit::{Limit, Unit};
use crate::config::schema::RateLimitYaml;

/// One validated mapping.
pub struct Parsed {
    /// `None` for `unlimited: true`.
    pub limit: Option<Limit>,
    /// Names from `replaces`, each with its line (for the self-replacement check).
    pub replaces: Vec<(Arc<str>, u64)>,
}

/// `field` names the mapping in messages (`rate_limit` or `rate_limits[2]`).
pub fn parse(
    source: &str,
    what: &str,
    field: &str,
    spanned: Spanned<RateLimitYaml>,
    report: Report<'_>,
) -> Option<Parsed> {
    let line = spanned.referenced.line();
    let rl = spanned.value;
    let mut ok = true;
    let name = rl
        .name
        .as_ref()
        .map(|n| n.value.clone())
        .filter(|n| !n.is_empty())
        .map(Arc::from);

    let mut replaces = Vec::new();
    for r in rl.replaces.unwrap_or_default() {
        match r.value.name.filter(|n| !n.is_empty()) {
            Some(replaced) => replaces.push((Arc::from(replaced), r.referenced.line())),
            None => {
                report(
                    r.referenced.line(),
                    format!("{what}: {field}.replaces: should not have an empty replaces entry"),
                );
                ok = false;
            }
        }
    }

    if rl.unlimited.unwrap_or(false) {
        if let Some(unit) = &rl.unit {
            report(
                unit.referenced.line(),
                format!("{what}: {field}.unit: should not specify rate limit unit when unlimited"),
            );
            ok = false;
        }
        return ok.then_some(Parsed {
            limit: None,
            replaces,
        });
    }

    let (unit_text, unit_line) = match &rl.unit {
        Some(u) => (u.value.as_str(), u.referenced.line()),
        // A block mapping's span starts at its first key; the mistake is the line
        // that opens it.
        None => (
            "",
            key_line(source, line, field.split('[').next().unwrap_or(field)),
        ),
    };
    let Some(unit) = Unit::parse(unit_text) else {
        let expected: Vec<&str> = Unit::ALL.iter().map(|(_, n)| *n).collect();
        report(
            unit_line,
            format!(
                "{what}: {field}.unit: invalid rate limit unit '{unit_text}' (expected one of {})",
                expected.join(", ")
            ),
        );
        return None;
    };
    let mut limit = Limit::fixed(rl.requests_per_unit.as_ref().map_or(0, |r| r.value), unit);
    limit.name = name;

    if let Some(a) = &rl.algorithm {
        match Algorithm::parse(&a.value) {
            Some(algorithm) => limit.algorithm = algorithm,
            None => {
                let expected: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                report(
                    a.referenced.line(),
                    format!(
                        "{what}: {field}.algorithm: unknown algorithm '{}' (expected one of {})",
                        a.value,
                        expected.join(", ")
                    ),
                );
                return None;
            }
        }
    }
    let algorithm = limit.algorithm;
    if let Some(m) = &rl.unit_multiplier {
        if m.value == 0 {
            report(
                m.referenced.line(),
                format!("{what}: {field}.unit_multiplier: must be at least 1"),
            );
            ok = false;
        }
        limit.unit_multiplier = m.value.max(1);
    }
    if let Some(b) = &rl.burst {
        if !algorithm.uses_burst() {
            report(
                b.referenced.line(),
                format!(
                    "{what}: {field}.burst: only token_bucket, gcra and leaky_bucket have a burst, not {}",
                    algorithm.name()
                ),
            );
            ok = false;
        } else if b.value == 0 {
            report(
                b.referenced.line(),
                format!("{what}: {field}.burst: must be at least 1"),
            );
            ok = false;
        }
        limit.burst = Some(b.value);
    }
    if let Some(lb) = &rl.leaky_bucket {
        if algorithm != Algorithm::LeakyBucket {
            report(
                key_line(source, lb.referenced.line(), "leaky_bucket"),
                format!(
                    "{what}: {field}.leaky_bucket: options given for algorithm {}",
                    algorithm.name()
                ),
            );
            ok = false;
        }
        if let Some(d) = &lb.value.max_delay {
            match parse_duration(&d.value) {
                Some(delay) => limit.max_delay = Some(delay),
                None => {
                    report(
                        d.referenced.line(),
                        format!(
                            "{what}: {field}.leaky_bucket.max_delay: '{}' is not a duration (like 250ms, 2s, 1m)",
                            d.value
                        ),
                    );
                    ok = false;
                }
            }
        }
    }
    let rpu_line = rl
        .requests_per_unit
        .as_ref()
        .map_or(unit_line, |r| r.referenced.line());
    if algorithm != Algorithm::FixedWindow && limit.requests_per_unit == 0 {
        // A rate of zero has no emission interval; a fixed window of 0 denies all.
        report(
            rpu_line,
            format!(
                "{what}: {field}.requests_per_unit: {} needs at least 1",
                algorithm.name()
            ),
        );
        ok = false;
    }
    if algorithm == Algorithm::SlidingLog
        && u64::from(limit.requests_per_unit) > sliding_log::MAX_LIMIT
    {
        report(
            rpu_line,
            format!(
                "{what}: {field}.requests_per_unit: sliding_log keeps one entry per hit, so it is limited to {} per window (got {}); use sliding_window for larger limits",
                sliding_log::MAX_LIMIT,
                limit.requests_per_unit
            ),
        );
        ok = false;
    }
    ok.then_some(Parsed {
        limit: Some(limit),
        replaces,
    })
}
