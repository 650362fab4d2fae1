//! The per-rule counters (`tollgate_rule_*_total`), labelled by domain and rule path,
//! plus the descriptor's entries only for rules with `detailed_metric: true`. The six
//! handles of a rule are looked up once and kept in a map by domain and path, so a
//! request costs one read lock and a few atomic adds, no allocation; detailed rules
//! carry request values, so their labels are built for every request (unavoidable),
//! and their series are bounded ([`super::series`]): values past the bound are
//! counted on the rule's `descriptor="(overflow)"` series, and
//! `tollgate_rule_series_folded_total` counts them. A reload that removes a rule or
//! its domain removes its series ([`RuleMetrics::retain`]).
//! With `--upstream-metric-names`, each handle set also holds its upstream series
//! ([`super::upstream`]), found once with it. What the series are labelled with is
//! `rule_labels.rs`.

use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::rule_labels::{OVERFLOW, RuleLabels, SeriesLabels, descriptor_text, series_labels};
use super::series::{SeriesBounds, Slot, Valued};
use super::upstream::{self, UpstreamCounters, UpstreamNames};
use crate::hash::FastMap;

/// What one descriptor's hits did to one rule, in hits (`hits_addend`), as
/// envoyproxy/ratelimit counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleOutcome {
    pub hits: u64,
    /// A limit of the rule was over (whether or not shadow mode let it through).
    pub over_limit: bool,
    /// Hits that landed above floor(limit x `NEAR_LIMIT_RATIO`) within the limit,
    /// counted hit by hit as envoyproxy/ratelimit does (see `limiter/observe.rs`).
    pub near_limit: u64,
    /// Over the limit, let through by shadow mode (the rule's or the global one).
    pub shadowed: bool,
    /// Over the limit as the local over-limit cache answered, without the backend.
    pub from_local_cache: bool,
    /// A release (`is_negative_hits`): its hits, given back (never counted as hits).
    pub released: u64,
    /// A release on an algorithm that gives nothing back: its hits, ignored.
    pub release_ignored: u64,
}

/// One rule's counters.
struct RuleCounters {
    released: Counter,
    release_ignored: Counter,
    hits: Counter,
    within_limit: Counter,
    over_limit: Counter,
    near_limit: Counter,
    shadow_mode: Counter,
    over_limit_with_local_cache: Counter,
    /// The upstream series this rule also counts on (`--upstream-metric-names`).
    upstream: Option<Arc<UpstreamCounters>>,
}

impl RuleCounters {
    fn record(&self, outcome: &RuleOutcome) {
        if outcome.released > 0 {
            self.released.inc_by(outcome.released);
        }
        if outcome.release_ignored > 0 {
            self.release_ignored.inc_by(outcome.release_ignored);
        }
        let hits = outcome.hits;
        if hits == 0 {
            return; // a check-only call counts nothing
        }
        self.hits.inc_by(hits);
        let (over, within) = if outcome.over_limit {
            (hits, 0)
        } else {
            (0, hits)
        };
        let shadow = if outcome.shadowed { hits } else { 0 };
        // A zero is not added: each add is an atomic write to a line the other
        // workers also write, and most requests are within the limit, not near it.
        for (counter, n) in [
            (&self.over_limit, over),
            (&self.within_limit, within),
            (&self.near_limit, outcome.near_limit),
            (&self.shadow_mode, shadow),
        ] {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        if outcome.from_local_cache {
            self.over_limit_with_local_cache.inc_by(hits);
        }
        if let Some(upstream) = &self.upstream {
            upstream.add([hits, over, outcome.near_limit, within, shadow]);
        }
    }
}

type ByPath = FastMap<Arc<str>, Arc<RuleCounters>>;

pub(super) struct RuleMetrics {
    hits: Family<SeriesLabels, Counter>,
    within_limit: Family<SeriesLabels, Counter>,
    over_limit: Family<SeriesLabels, Counter>,
    near_limit: Family<SeriesLabels, Counter>,
    shadow_mode: Family<SeriesLabels, Counter>,
    over_limit_with_local_cache: Family<SeriesLabels, Counter>,
    released: Family<SeriesLabels, Counter>,
    release_ignored: Family<SeriesLabels, Counter>,
    /// Handles of the rules without `detailed_metric`, by domain then rule path.
    handles: RwLock<FastMap<Arc<str>, ByPath>>,
    /// Handles of the series made from request values, bounded.
    valued: Valued<RuleCounters>,
    /// Descriptor outcomes counted on a rule's overflow series, by domain and rule.
    folded: Family<SeriesLabels, Counter>,
    /// envoyproxy/ratelimit's names too (`--upstream-metric-names`).
    upstream: Option<UpstreamNames>,
}

impl RuleMetrics {
    pub(super) fn register(
        registry: &mut Registry,
        upstream_names: bool,
        bounds: SeriesBounds,
    ) -> Self {
        let metrics = Self {
            hits: Family::default(),
            within_limit: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            shadow_mode: Family::default(),
            over_limit_with_local_cache: Family::default(),
            released: Family::default(),
            release_ignored: Family::default(),
            handles: RwLock::default(),
            valued: Valued::new(bounds),
            folded: Family::default(),
            upstream: upstream_names.then(UpstreamNames::default),
        };
        let families = [
            ("hits", "Hits on a rule (hits_addend)", &metrics.hits),
            (
                "within_limit",
                "Hits on a rule that were within its limit",
                &metrics.within_limit,
            ),
            (
                "over_limit",
                "Hits on a rule that were over its limit (shadow mode included)",
                &metrics.over_limit,
            ),
            (
                "near_limit",
                "Hits within the limit that landed above floor(limit x NEAR_LIMIT_RATIO), hit by hit",
                &metrics.near_limit,
            ),
            (
                "shadow_mode",
                "Hits over the limit that shadow mode let through",
                &metrics.shadow_mode,
            ),
            (
                "over_limit_with_local_cache",
                "Hits over the limit answered by the local over-limit cache, without the backend",
                &metrics.over_limit_with_local_cache,
            ),
            (
                "released",
                "Hits given back by releases (is_negative_hits); never counted as hits",
                &metrics.released,
            ),
            (
                "release_ignored",
                "Hits of releases on an algorithm that gives nothing back (sliding_log, leaky_bucket)",
                &metrics.release_ignored,
            ),
        ];
        for (name, help, family) in families {
            registry.register(format!("tollgate_rule_{name}"), help, family.clone());
        }
        registry.register(
            "tollgate_rule_series_folded",
            "Descriptors of a detailed_metric, value_to_metric or override series counted on the rule's descriptor=\"(overflow)\" series: its value series were at their bound",
            metrics.folded.clone(),
        );
        metrics
    }

    /// Counts `outcome` for `rule`; a detailed rule adds its entries as the
    /// `descriptor` label.
    pub(super) fn record(&self, rule: RuleLabels<'_>, outcome: &RuleOutcome) {
        if let Some(entries) = rule.labelled_entries() {
            self.record_valued(&rule, &entries, outcome);
            return;
        }
        {
            // Counted under the read lock rather than through a clone of the handle:
            // the clone's reference count is one cache line every worker thread
            // writes twice a request.
            let handles = self.handles.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(counters) = handles
                .get(&**rule.domain)
                .and_then(|paths| paths.get(&**rule.rule))
            {
                counters.record(outcome);
                return;
            }
        }
        self.cache(rule).record(outcome);
    }

    /// A series with request values: its own while the bound allows, else the rule's
    /// overflow series (the fold counted).
    fn record_valued(
        &self,
        rule: &RuleLabels<'_>,
        entries: &[(&str, &str)],
        outcome: &RuleOutcome,
    ) {
        let text = descriptor_text(entries);
        let make = |value: Option<&str>| {
            let labels = series_labels(rule, Some(value.unwrap_or(OVERFLOW)));
            self.counters_for(&labels, || match value {
                Some(_) => upstream::entries_key(rule.domain, entries),
                // Folded values count on the rule's own upstream series.
                None => upstream::rule_key(rule.domain, rule.rule),
            })
        };
        match self.valued.slot(rule.domain, rule.rule, &text, make) {
            Slot::Own(counters) => counters.record(outcome),
            Slot::Folded(counters) => {
                counters.record(outcome);
                self.folded.get_or_create(&series_labels(rule, None)).inc();
            }
        }
    }

    /// First sight of a rule: its handles, created once and kept.
    fn cache(&self, rule: RuleLabels<'_>) -> Arc<RuleCounters> {
        let labels = series_labels(&rule, None);
        let key = || upstream::rule_key(rule.domain, rule.rule);
        let counters = Arc::new(self.counters_for(&labels, key));
        let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
        handles
            .entry(rule.domain.clone())
            .or_default()
            .entry(rule.rule.clone())
            .or_insert(counters)
            .clone()
    }

    /// The upstream series set, when exported.
    pub(super) fn upstream(&self) -> Option<&UpstreamNames> {
        self.upstream.as_ref()
    }

    /// Keeps the series of the rules `live` says are still configured (by domain and
    /// rule path); removes the others', the upstream series only they counted on too.
    pub(super) fn retain(&self, live: impl Fn(&str, &str) -> bool) {
        let mut gone: Vec<SeriesLabels> = Vec::new();
        {
            let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
            for (domain, paths) in handles.iter_mut() {
                paths.retain(|rule, _| {
                    let keep = live(domain, rule);
                    if !keep {
                        gone.push(SeriesLabels {
                            domain: domain.clone(),
                            rule: rule.clone(),
                            descriptor: None,
                        });
                    }
                    keep
                });
            }
            handles.retain(|_, paths| !paths.is_empty());
        }
        for removed in self.valued.retain(&live) {
            let labelled = |descriptor: Option<&str>| SeriesLabels {
                domain: removed.domain.clone(),
                rule: removed.rule.clone(),
                descriptor: descriptor.map(Into::into),
            };
            self.folded.remove(&labelled(None));
            gone.extend(removed.values.iter().map(|v| labelled(Some(v))));
            if removed.overflow {
                gone.push(labelled(Some(OVERFLOW)));
            }
        }
        for labels in &gone {
            for family in self.families() {
                family.remove(labels);
            }
        }
        if let Some(upstream) = &self.upstream {
            upstream.prune();
        }
    }

    fn families(&self) -> [&Family<SeriesLabels, Counter>; 8] {
        [
            &self.released,
            &self.release_ignored,
            &self.hits,
            &self.within_limit,
            &self.over_limit,
            &self.near_limit,
            &self.shadow_mode,
            &self.over_limit_with_local_cache,
        ]
    }

    fn counters_for(&self, labels: &SeriesLabels, key: impl FnOnce() -> String) -> RuleCounters {
        RuleCounters {
            upstream: self.upstream.as_ref().map(|names| names.counters(&key())),
            hits: self.hits.get_or_create_owned(labels),
            within_limit: self.within_limit.get_or_create_owned(labels),
            over_limit: self.over_limit.get_or_create_owned(labels),
            near_limit: self.near_limit.get_or_create_owned(labels),
            shadow_mode: self.shadow_mode.get_or_create_owned(labels),
            over_limit_with_local_cache: self
                .over_limit_with_local_cache
                .get_or_create_owned(labels),
            released: self.released.get_or_create_owned(labels),
            release_ignored: self.release_ignored.get_or_create_owned(labels),
        }
    }
}
