//! What the admin endpoints show about the served config: `GET /rlconfig` as text in
//! envoyproxy/ratelimit's style, and `GET /config.json` with the domains, their rules
//! and the reload state (source: file or xds, generation, files' hash or xDS version,
//! last success and failure).
//!
//! `/rlconfig` prints one line per limit, exactly as envoyproxy/ratelimit does for its
//! own features (`<domain>.<path>: unit=MINUTE requests_per_unit=10, shadow_mode:
//! false, quota_mode: false`), with tollgate's extensions appended only when used (`, algorithm: gcra`,
//! `, unit_multiplier: 5`, `, burst: 20`, `, time_zone: Europe/Berlin`), and `unlimited` rules as
//! envoyproxy/ratelimit shows them (`unit=UNKNOWN requests_per_unit=0`) plus
//! `, unlimited: true`. Domains are in name order, rules in config order.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::algorithm::Algorithm;
use crate::config::{Config, Limit, Rule, RuleKind};
use crate::server::reload::ReloadState;

/// The `/rlconfig` text.
pub fn rlconfig(config: &Config) -> String {
    let mut out = String::new();
    for domain in config.domains() {
        for rule in &domain.rules {
            let key = format!("{}.{}", domain.name, rule.path);
            match &rule.kind {
                RuleKind::Unlimited => {
                    let _ = writeln!(
                        out,
                        "{key}: unit=UNKNOWN requests_per_unit=0, shadow_mode: {}, quota_mode: {}, unlimited: true",
                        rule.shadow_mode, rule.quota_mode
                    );
                }
                RuleKind::Limited(limits) => {
                    for limit in limits {
                        let _ = writeln!(
                            out,
                            "{key}: unit={} requests_per_unit={}, shadow_mode: {}, quota_mode: {}{}",
                            limit.unit.name().to_ascii_uppercase(),
                            limit.requests_per_unit,
                            rule.shadow_mode,
                            rule.quota_mode,
                            extensions(limit)
                        );
                    }
                }
            }
        }
    }
    out
}

fn extensions(limit: &Limit) -> String {
    let mut out = String::new();
    if limit.algorithm != Algorithm::FixedWindow {
        let _ = write!(out, ", algorithm: {}", limit.algorithm.name());
    }
    if limit.unit_multiplier > 1 {
        let _ = write!(out, ", unit_multiplier: {}", limit.unit_multiplier);
    }
    if let Some(burst) = limit.burst {
        let _ = write!(out, ", burst: {burst}");
    }
    if let Some(delay) = limit.max_delay {
        let _ = write!(out, ", max_delay: {}ms", delay.as_millis());
    }
    if let Some(zone) = limit.time_zone {
        let _ = write!(out, ", time_zone: {}", zone.name());
    }
    out
}

/// The `/config.json` document.
pub fn config_json(config: &Config, reload: &ReloadState) -> Value {
    let domains: Vec<Value> = config
        .domains()
        .into_iter()
        .map(|domain| {
            json!({
                "domain": &*domain.name,
                "rules": domain.rules.iter().map(|r| rule_json(&domain.name, r)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "source": reload.source.as_str(),
        "generation": reload.generation,
        "hash": reload.hash,
        "version": reload.version,
        "loaded_at": unix(reload.loaded_at),
        "reload": {
            "last_success": unix(reload.last_success),
            "last_failure": unix(reload.last_failure),
            "last_error": reload.last_error,
            "successes": reload.successes,
            "failures": reload.failures,
        },
        "domains": domains,
    })
}

fn rule_json(domain: &str, rule: &Rule) -> Value {
    let (unlimited, limits) = match &rule.kind {
        RuleKind::Unlimited => (true, Vec::new()),
        RuleKind::Limited(limits) => (false, limits.iter().map(limit_json).collect()),
    };
    json!({
        "key": format!("{domain}.{}", rule.path),
        "path": &*rule.path,
        "name": rule.name.as_deref(),
        "unlimited": unlimited,
        "limits": limits,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
        "replaces": rule.replaces.iter().map(|r| &**r).collect::<Vec<_>>(),
        "hash_tag": rule.hash_tag.as_ref().map(|keys| keys.iter().map(|k| &**k).collect::<Vec<_>>()),
    })
}

fn limit_json(limit: &Limit) -> Value {
    json!({
        "name": limit.name.as_deref(),
        "unit": limit.unit.name(),
        "unit_multiplier": limit.unit_multiplier,
        "window_seconds": limit.window_secs(),
        "requests_per_unit": limit.requests_per_unit,
        "algorithm": limit.algorithm.name(),
        "burst": limit.burst,
        "max_delay_ms": limit.max_delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "time_zone": limit.time_zone.map(|z| z.name()),
    })
}

/// Seconds since the epoch (fractional), or null.
fn unix(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
}
