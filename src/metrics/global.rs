//! Global rules' metrics (`src/global/`, docs/global.md): per rule, the share this
//! region holds and what it used in the window in progress, summed over the rule's
//! counters; the link to the ledger; releases and requests denied for want of a
//! share. Labelled by domain, rule and region as the config and `--region` name
//! them, never by request values, so the series are bounded by the config.

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct RuleLabel {
    domain: String,
    rule: String,
    region: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegionLabel {
    region: String,
}

/// One rule's figures for the window in progress, summed over its counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GlobalRuleFigures {
    pub domain: String,
    pub rule: String,
    /// Granted less released: what the region may admit in the window.
    pub share: u64,
    /// What the region admitted in it, as last read.
    pub used: u64,
    /// The configured limits, summed (the whole the shares divide).
    pub limit: u64,
}

/// Handles of the global rules' metrics.
pub struct GlobalMetrics {
    share: Family<RuleLabel, Gauge>,
    used: Family<RuleLabel, Gauge>,
    limit: Family<RuleLabel, Gauge>,
    released: Family<RuleLabel, Counter>,
    unshared: Family<RuleLabel, Counter>,
    counters: Family<RegionLabel, Gauge>,
    ledger_up: Family<RegionLabel, Gauge>,
    ledger_errors: Family<RegionLabel, Counter>,
    overcommitted: Family<RegionLabel, Counter>,
    forgotten: Family<RegionLabel, Counter>,
    /// The rules with gauges, so a rule that goes loses its series.
    shown: Mutex<BTreeSet<RuleLabel>>,
}

impl GlobalMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            share: Family::default(),
            used: Family::default(),
            limit: Family::default(),
            released: Family::default(),
            unshared: Family::default(),
            counters: Family::default(),
            ledger_up: Family::default(),
            ledger_errors: Family::default(),
            overcommitted: Family::default(),
            forgotten: Family::default(),
            shown: Mutex::default(),
        };
        registry.register(
            "tollgate_global_share",
            "Share of a global rule's limit this region holds in the window in progress (granted less released), summed over the rule's counters",
            this.share.clone(),
        );
        registry.register(
            "tollgate_global_used",
            "What this region admitted on a global rule in the window in progress, as last read from its Redis, summed over the rule's counters",
            this.used.clone(),
        );
        registry.register(
            "tollgate_global_limit",
            "A global rule's limit, summed over the counters this region holds shares of (the whole the shares divide)",
            this.limit.clone(),
        );
        registry.register(
            "tollgate_global_released",
            "Share this region gave back to the others (consumed on its own counter first)",
            this.released.clone(),
        );
        registry.register(
            "tollgate_global_unshared_denials",
            "Requests on a global rule denied because this region held no share of the window",
            this.unshared.clone(),
        );
        registry.register(
            "tollgate_global_counters",
            "Global counters this replica keeps shares of",
            this.counters.clone(),
        );
        registry.register(
            "tollgate_global_ledger_up",
            "1 while the global ledger answers this replica, 0 while it is cut off",
            this.ledger_up.clone(),
        );
        registry.register(
            "tollgate_global_ledger_errors",
            "Exchanges with the global ledger that failed",
            this.ledger_errors.clone(),
        );
        registry.register(
            "tollgate_global_overcommitted",
            "Ledger records that held more grants than their limit (a ledger that lost records, or regions whose configs disagree): nothing more was granted",
            this.overcommitted.clone(),
        );
        registry.register(
            "tollgate_global_counters_forgotten",
            "Global counters dropped because the table was full (--global-max-counters)",
            this.forgotten.clone(),
        );
        this
    }

    /// The figures of every global rule this region holds shares of, after a sync:
    /// the gauges of rules not in `rules` go.
    pub fn rules(&self, region: &str, rules: &[GlobalRuleFigures]) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeSet::new();
        for f in rules {
            let label = RuleLabel {
                domain: f.domain.clone(),
                rule: f.rule.clone(),
                region: region.to_owned(),
            };
            let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.share.get_or_create(&label).set(gauge(f.share));
            self.used.get_or_create(&label).set(gauge(f.used));
            self.limit.get_or_create(&label).set(gauge(f.limit));
            now.insert(label);
        }
        for gone in shown.difference(&now) {
            self.share.remove(gone);
            self.used.remove(gone);
            self.limit.remove(gone);
        }
        *shown = now;
    }

    fn rule(domain: &str, rule: &str, region: &str) -> RuleLabel {
        RuleLabel {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            region: region.to_owned(),
        }
    }

    pub fn released(&self, domain: &str, rule: &str, region: &str, amount: u64) {
        self.released
            .get_or_create(&Self::rule(domain, rule, region))
            .inc_by(amount);
    }

    pub fn unshared(&self, domain: &str, rule: &str, region: &str, requests: u64) {
        if requests > 0 {
            self.unshared
                .get_or_create(&Self::rule(domain, rule, region))
                .inc_by(requests);
        }
    }

    /// After each sync: the counters kept, and whether the ledger answers (its last
    /// exchange succeeded).
    pub fn link(&self, region: &str, counters: usize, up: bool) {
        let label = RegionLabel {
            region: region.to_owned(),
        };
        self.counters
            .get_or_create(&label)
            .set(i64::try_from(counters).unwrap_or(i64::MAX));
        self.ledger_up.get_or_create(&label).set(i64::from(up));
    }

    /// An exchange with the ledger failed.
    pub fn ledger_error(&self, region: &str) {
        let label = RegionLabel {
            region: region.to_owned(),
        };
        self.ledger_errors.get_or_create(&label).inc();
    }

    pub fn overcommitted(&self, region: &str) {
        let label = RegionLabel {
            region: region.to_owned(),
        };
        self.overcommitted.get_or_create(&label).inc();
    }

    pub fn forgotten(&self, region: &str, counters: u64) {
        let label = RegionLabel {
            region: region.to_owned(),
        };
        self.forgotten.get_or_create(&label).inc_by(counters);
    }
}

impl Metrics {
    /// The global rules' handles.
    pub fn global(&self) -> &GlobalMetrics {
        &self.global
    }
}
