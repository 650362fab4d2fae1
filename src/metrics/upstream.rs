//! envoyproxy/ratelimit's Prometheus names, exported beside tollgate's own when
//! `--upstream-metric-names` asks for them (or `PROMETHEUS_ADDR` is set, as Envoy
//! Gateway sets it), so dashboards and alerts written for it (Envoy Gateway's read
//! `ratelimit_service_rate_limit_*`) keep working unchanged.
//!
//! Upstream emits statsd names and maps them with its `default_mapper.yaml`: the
//! per-limit stat `ratelimit.service.rate_limit.<domain>.<key1>[.<key2>...].<stat>`
//! becomes `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`, where the
//! segments are the limit's stats key split on dots (levels beyond the second are
//! dropped by the mapper, so their series add up). The values are tollgate's own
//! counts of the same events; nothing here decides anything.
//!
//! The names are written by hand after the registry's text: the registry appends
//! `_total` to every counter, and upstream's names have no such suffix.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The per-limit stats upstream's mapper names, in the order they are written.
const STATS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// One upstream series set: `domain`, `key1` and, for keys of two levels or more, `key2`.
type Labels = (String, String, Option<String>);

/// The five counts of one upstream series set, in [`STATS`] order.
#[derive(Debug, Default)]
pub(super) struct UpstreamCounters([AtomicU64; 5]);

impl UpstreamCounters {
    /// Adds one descriptor's counts: hits, over, near, within, shadow.
    pub(super) fn add(&self, counts: [u64; 5]) {
        for (counter, n) in self.0.iter().zip(counts) {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// The upstream series, by labels; created on a limit's first hit.
#[derive(Debug, Default)]
pub(super) struct UpstreamNames {
    series: Mutex<BTreeMap<Labels, Arc<UpstreamCounters>>>,
}

impl UpstreamNames {
    /// The counters of the limit whose upstream stats key is `key`
    /// (`domain.key_value.key2`).
    pub(super) fn counters(&self, key: &str) -> Arc<UpstreamCounters> {
        let labels = labels(key);
        self.series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(labels)
            .or_default()
            .clone()
    }

    /// Forgets the series no rule counts on any more (after a reload removed rules).
    pub(super) fn prune(&self) {
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.retain(|_, counters| Arc::strong_count(counters) > 1);
    }

    /// Writes the per-limit families and the service ones (given as plain numbers:
    /// the service counts live in tollgate's own handles).
    pub(super) fn encode(&self, text: &mut String, service: &ServiceCounts) -> std::fmt::Result {
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, stat) in STATS.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            writeln!(
                text,
                "# HELP {name} envoyproxy/ratelimit's {stat}, per limit"
            )?;
            writeln!(text, "# TYPE {name} counter")?;
            for ((domain, key1, key2), counters) in series.iter() {
                write!(
                    text,
                    "{name}{{domain=\"{}\",key1=\"{}\"",
                    escape(domain),
                    escape(key1)
                )?;
                if let Some(key2) = key2 {
                    write!(text, ",key2=\"{}\"", escape(key2))?;
                }
                writeln!(text, "}} {}", counters.0[i].load(Ordering::Relaxed))?;
            }
        }
        let name = "ratelimit_service_should_rate_limit_error";
        writeln!(
            text,
            "# HELP {name} Requests that failed, by upstream's error type"
        )?;
        writeln!(text, "# TYPE {name} counter")?;
        writeln!(
            text,
            "{name}{{err_type=\"redis_error\"}} {}",
            service.redis_errors
        )?;
        writeln!(
            text,
            "{name}{{err_type=\"service_error\"}} {}",
            service.service_errors
        )?;
        let name = "ratelimit_service_total_requests";
        writeln!(text, "# HELP {name} ShouldRateLimit requests")?;
        writeln!(text, "# TYPE {name} counter")?;
        writeln!(
            text,
            "{name}{{grpc_method=\"ShouldRateLimit\"}} {}",
            service.requests
        )?;
        for (stat, value) in [
            ("config_load_success", service.config_load_success),
            ("config_load_error", service.config_load_error),
        ] {
            let name = format!("ratelimit_service_{stat}");
            writeln!(text, "# HELP {name} envoyproxy/ratelimit's {stat}")?;
            writeln!(text, "# TYPE {name} counter")?;
            writeln!(text, "{name} {value}")?;
        }
        Ok(())
    }
}

/// The service-wide numbers upstream exports, read from tollgate's handles at scrape.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ServiceCounts {
    pub requests: u64,
    /// Requests the store could not decide (upstream: a Redis error).
    pub redis_errors: u64,
    /// Requests refused as invalid or failed inside (upstream: a service error).
    pub service_errors: u64,
    /// Config sets loaded, the start-up one included (as upstream counts).
    pub config_load_success: u64,
    pub config_load_error: u64,
}

/// Upstream's statsd key of a limit (`domain.key_value.key2`), as its mapper splits
/// it: the first segment is the domain, the next two the keys. Upstream sanitizes
/// `:` and `|` to `_` before emitting (statsd's separators); so do we.
fn labels(key: &str) -> Labels {
    let sanitized: String = key
        .chars()
        .map(|c| if c == ':' || c == '|' { '_' } else { c })
        .collect();
    let mut segments = sanitized.split('.');
    let domain = segments.next().unwrap_or_default().to_owned();
    let key1 = segments.next().unwrap_or_default().to_owned();
    let key2 = segments.next().map(str::to_owned);
    (domain, key1, key2)
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

/// Upstream's stats key of a limit matched in the config: the domain, then the rule's
/// path (`key_value.key2`, wildcards as written).
pub(super) fn rule_key(domain: &str, path: &str) -> String {
    format!("{domain}.{path}")
}

/// Upstream's stats key built from the request's entries (`detailed_metric`, Envoy's
/// per-descriptor override, `value_to_metric`): `domain.key_value.key2` (a key without
/// value alone).
pub(super) fn entries_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = String::from(domain);
    for (k, v) in entries {
        key.push('.');
        key.push_str(k);
        if !v.is_empty() {
            key.push('_');
            key.push_str(v);
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_key_splits_into_domain_and_two_keys_as_upstreams_mapper_does() {
        assert_eq!(labels("rl.foo_bar"), ("rl".into(), "foo_bar".into(), None));
        assert_eq!(
            labels("rl.a_1.b.c_3"),
            ("rl".into(), "a_1".into(), Some("b".into())),
            "levels past the second are dropped by the mapper"
        );
        assert_eq!(
            labels("rl.ip_1:2|3"),
            ("rl".into(), "ip_1_2_3".into(), None)
        );
    }

    #[test]
    fn an_entries_key_writes_values_only_where_the_request_has_one() {
        let entries = [("a", "1"), ("b", "")];
        assert_eq!(entries_key("d", &entries), "d.a_1.b");
    }

    #[test]
    fn series_of_one_key_pair_add_up_and_render_without_a_total_suffix() {
        let names = UpstreamNames::default();
        names.counters("d.k_v.x.y").add([2, 1, 1, 1, 0]);
        names.counters("d.k_v.x.z").add([3, 0, 0, 3, 0]);
        let mut text = String::new();
        names.encode(&mut text, &ServiceCounts::default()).unwrap();
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"k_v\",key2=\"x\"} 5\n"
            ),
            "{text}"
        );
        assert!(!text.contains("_total_hits_total"), "{text}");
        assert!(text.contains("# TYPE ratelimit_service_rate_limit_within_limit counter"));
    }
}
