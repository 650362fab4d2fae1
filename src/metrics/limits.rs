//! The configured limits as gauges, so a dashboard can set a rule's use against its
//! limit: `tollgate_rule_limit` (hits a window admits, `requests_per_unit`) and
//! `tollgate_rule_limit_window_seconds` (the window's length: a calendar period's
//! nominal one), labelled `domain`, `rule` (the rule's path, as the per-rule counters
//! are, so they join on both) and `limit` (the limit's `name`, else its window as
//! `minute`, `5 minute` or `month Europe/Berlin`, so the limits of a `rate_limits`
//! list stay apart).
//!
//! Set from the config at start and on every swap, never from a request: one series
//! per configured finite limit, so the config bounds them (unlimited rules and Envoy's
//! per-descriptor overrides, whose limit comes with each request, have none). A
//! reload removes the series of limits it no longer has.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::{Config, Limit, RuleKind};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LimitLabels {
    domain: Arc<str>,
    rule: Arc<str>,
    limit: String,
}

pub(super) struct LimitGauges {
    limit: Family<LimitLabels, Gauge>,
    window: Family<LimitLabels, Gauge>,
    /// The series set now, so a swap removes exactly the ones it drops.
    current: Mutex<HashSet<LimitLabels>>,
}

impl LimitGauges {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let gauges = Self {
            limit: Family::default(),
            window: Family::default(),
            current: Mutex::default(),
        };
        registry.register(
            "tollgate_rule_limit",
            "A configured limit: the hits one window of it admits (requests_per_unit)",
            gauges.limit.clone(),
        );
        registry.register(
            "tollgate_rule_limit_window_seconds",
            "A configured limit's window in seconds (unit x unit_multiplier; a calendar period's nominal length)",
            gauges.window.clone(),
        );
        gauges
    }

    /// Sets the gauges to `config`'s limits; removes those of limits it lacks.
    pub(super) fn set(&self, config: &Config) {
        let mut now = HashSet::new();
        for domain in config.domains() {
            for rule in &domain.rules {
                let RuleKind::Limited(limits) = &rule.kind else {
                    continue;
                };
                let mut seen = HashSet::new();
                for (i, limit) in limits.iter().enumerate() {
                    let mut name = label(limit);
                    if !seen.insert(name.clone()) {
                        name = format!("{name} #{i}");
                    }
                    let labels = LimitLabels {
                        domain: domain.name.clone(),
                        rule: rule.path.clone(),
                        limit: name,
                    };
                    let window = i64::try_from(limit.window_secs()).unwrap_or(i64::MAX);
                    self.limit
                        .get_or_create(&labels)
                        .set(i64::from(limit.requests_per_unit));
                    self.window.get_or_create(&labels).set(window);
                    now.insert(labels);
                }
            }
        }
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in current.difference(&now) {
            self.limit.remove(gone);
            self.window.remove(gone);
        }
        *current = now;
    }
}

/// A limit's `limit` label: its name, else its window (`minute`, `5 minute`, with
/// its time zone when it has one).
fn label(limit: &Limit) -> String {
    if let Some(name) = &limit.name {
        return name.to_string();
    }
    let mut text = String::new();
    if limit.unit_multiplier > 1 {
        text.push_str(&format!("{} ", limit.unit_multiplier));
    }
    text.push_str(limit.unit.name());
    if let Some(zone) = limit.time_zone {
        text.push(' ');
        text.push_str(zone.name());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use std::path::Path;

    fn config(yaml: &str) -> Config {
        crate::config::load_sources(&[(Path::new("l.yaml"), yaml)]).expect("valid")
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).expect("encodes");
        text
    }

    #[test]
    fn every_configured_limit_has_its_gauges_and_a_reload_drops_the_gone() {
        let mut registry = Registry::default();
        let gauges = LimitGauges::register(&mut registry);
        gauges.set(&config(
            "domain: d
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: month, requests_per_unit: 100000, time_zone: Europe/Berlin}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 300, name: burst}
  - key: free
    rate_limit: {unlimited: true}
",
        ));
        let text = scrape(&registry);
        for line in [
            "tollgate_rule_limit{domain=\"d\",rule=\"tenant\",limit=\"second\"} 5",
            "tollgate_rule_limit{domain=\"d\",rule=\"tenant\",limit=\"month Europe/Berlin\"} 100000",
            "tollgate_rule_limit{domain=\"d\",rule=\"tenant\",limit=\"burst\"} 300",
            "tollgate_rule_limit_window_seconds{domain=\"d\",rule=\"tenant\",limit=\"burst\"} 300",
            "tollgate_rule_limit_window_seconds{domain=\"d\",rule=\"tenant\",limit=\"second\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(
            !text.contains("rule=\"free\""),
            "unlimited: no gauge\n{text}"
        );
        gauges.set(&config(
            "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 7}\n",
        ));
        let text = scrape(&registry);
        assert!(text.contains("limit=\"second\"} 7"), "{text}");
        assert!(
            !text.contains("burst") && !text.contains("Berlin"),
            "{text}"
        );
    }

    #[test]
    fn two_limits_of_one_window_stay_apart() {
        let mut registry = Registry::default();
        let gauges = LimitGauges::register(&mut registry);
        gauges.set(&config(
            "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 20, algorithm: token_bucket}
",
        ));
        let text = scrape(&registry);
        assert!(text.contains("limit=\"minute\"} 10"), "{text}");
        assert!(text.contains("limit=\"minute #1\"} 20"), "{text}");
    }
}
