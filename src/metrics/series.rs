//! The bound on series made from request values (`detailed_metric`, `value_to_metric`,
//! Envoy's per-descriptor override): each carries the descriptor's values in a label,
//! and clients choose the values, so without a bound every new value is a series more,
//! in the scrape and in memory, for good. Each rule may have [`SeriesBounds::per_rule`] value series, all rules
//! together [`SeriesBounds::total`]; a value past either bound is counted on the
//! rule's one overflow series instead (and the fold itself is counted, by the caller).
//! A rule's series go when a reload removes the rule or its domain ([`Valued::retain`]).
//!
//! Generic over what a series holds (the per-rule counter handles), so this knows no
//! metric type: it only decides which handle a value is counted on.

use std::sync::{Arc, PoisonError, RwLock};

use crate::hash::FastMap;

/// How many series made from request values are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesBounds {
    /// Value series per rule (the overflow series not counted).
    pub per_rule: usize,
    /// Value series of all rules together.
    pub total: usize,
}

impl SeriesBounds {
    /// Per rule: a dashboard's worth of tenants, routes or clients.
    pub const DEFAULT_PER_RULE: usize = 1000;
    /// All rules: with every series at the bound and upstream's names on, the scrape
    /// stays under 5 MB for values of 16 characters (tests/it/metric_cardinality.rs
    /// asserts it); a value's bytes repeat on each line of its series, so longer values
    /// make it larger (docs/metrics-and-logs.md).
    pub const DEFAULT_TOTAL: usize = 4000;
}

impl Default for SeriesBounds {
    fn default() -> Self {
        SeriesBounds {
            per_rule: Self::DEFAULT_PER_RULE,
            total: Self::DEFAULT_TOTAL,
        }
    }
}

/// Which series a value is counted on.
pub(super) enum Slot<T> {
    /// Its own (found, or made now).
    Own(Arc<T>),
    /// The rule's overflow series: the value was folded.
    Folded(Arc<T>),
}

/// One rule's value series and its overflow series.
struct RuleSeries<T> {
    values: FastMap<Box<str>, Arc<T>>,
    overflow: Option<Arc<T>>,
}

impl<T> Default for RuleSeries<T> {
    fn default() -> Self {
        Self {
            values: FastMap::default(),
            overflow: None,
        }
    }
}

struct Inner<T> {
    /// By domain, then rule.
    rules: FastMap<Arc<str>, FastMap<Arc<str>, RuleSeries<T>>>,
    /// Value series of all rules (overflow series not counted).
    total: usize,
}

/// Every rule's value series, bounded.
pub(super) struct Valued<T> {
    bounds: SeriesBounds,
    inner: RwLock<Inner<T>>,
}

/// A rule's series removed by [`Valued::retain`]: its value texts, and whether it had
/// an overflow series, for the caller to remove from its families.
pub(super) struct Removed {
    pub domain: Arc<str>,
    pub rule: Arc<str>,
    pub values: Vec<Box<str>>,
    pub overflow: bool,
}

impl<T> Valued<T> {
    pub(super) fn new(bounds: SeriesBounds) -> Self {
        Self {
            bounds,
            inner: RwLock::new(Inner {
                rules: FastMap::default(),
                total: 0,
            }),
        }
    }

    /// The series `value` of `rule` is counted on: its own when it has one or there
    /// is room for one (`make` makes it, given the value's text, `None` for overflow),
    /// else the rule's overflow series.
    pub(super) fn slot(
        &self,
        domain: &Arc<str>,
        rule: &Arc<str>,
        value: &str,
        make: impl Fn(Option<&str>) -> T,
    ) -> Slot<T> {
        {
            let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = inner.rules.get(&**domain).and_then(|d| d.get(&**rule)) {
                if let Some(own) = series.values.get(value) {
                    return Slot::Own(own.clone());
                }
                if let Some(overflow) = &series.overflow
                    && !self.room(series.values.len(), inner.total)
                {
                    return Slot::Folded(overflow.clone());
                }
            }
        }
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *inner;
        let series = inner
            .rules
            .entry(domain.clone())
            .or_default()
            .entry(rule.clone())
            .or_default();
        if let Some(own) = series.values.get(value) {
            return Slot::Own(own.clone());
        }
        if self.room(series.values.len(), inner.total) {
            let own = Arc::new(make(Some(value)));
            series.values.insert(value.into(), own.clone());
            inner.total += 1;
            return Slot::Own(own);
        }
        let overflow = series
            .overflow
            .get_or_insert_with(|| Arc::new(make(None)))
            .clone();
        Slot::Folded(overflow)
    }

    /// Whether a rule holding `values` series may make one more, with `total` in all.
    fn room(&self, values: usize, total: usize) -> bool {
        values < self.bounds.per_rule && total < self.bounds.total
    }

    /// Keeps the series of the rules `live` says still exist; returns the others'.
    pub(super) fn retain(&self, live: impl Fn(&str, &str) -> bool) -> Vec<Removed> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let mut removed = Vec::new();
        for (domain, rules) in &mut inner.rules {
            rules.retain(|rule, series| {
                if live(domain, rule) {
                    return true;
                }
                removed.push(Removed {
                    domain: domain.clone(),
                    rule: rule.clone(),
                    values: series.values.drain().map(|(value, _)| value).collect(),
                    overflow: series.overflow.is_some(),
                });
                false
            });
        }
        inner.rules.retain(|_, rules| !rules.is_empty());
        inner.total -= removed.iter().map(|r| r.values.len()).sum::<usize>();
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(slot: &Slot<String>) -> (&str, bool) {
        match slot {
            Slot::Own(s) => (s.as_str(), false),
            Slot::Folded(s) => (s.as_str(), true),
        }
    }

    #[test]
    fn values_past_a_bound_fold_into_the_overflow_series() {
        let valued = Valued::new(SeriesBounds {
            per_rule: 2,
            total: 3,
        });
        let (d, a, b) = (Arc::from("d"), Arc::from("a"), Arc::from("b"));
        let make = |v: Option<&str>| v.unwrap_or("overflow").to_owned();
        assert_eq!(name(&valued.slot(&d, &a, "1", make)), ("1", false));
        assert_eq!(name(&valued.slot(&d, &a, "2", make)), ("2", false));
        assert_eq!(name(&valued.slot(&d, &a, "3", make)), ("overflow", true));
        assert_eq!(name(&valued.slot(&d, &a, "1", make)), ("1", false));
        assert_eq!(name(&valued.slot(&d, &b, "1", make)), ("1", false));
        assert_eq!(
            name(&valued.slot(&d, &b, "2", make)),
            ("overflow", true),
            "the total bound"
        );
        let removed = valued.retain(|_, rule| rule != "a");
        assert_eq!(removed.len(), 1);
        assert_eq!((&*removed[0].rule, removed[0].overflow), ("a", true));
        assert_eq!(removed[0].values.len(), 2);
        assert_eq!(
            name(&valued.slot(&d, &b, "2", make)),
            ("2", false),
            "room again once a rule went"
        );
    }
}
