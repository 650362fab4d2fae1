//! The quota service's metrics (RLQS). Labels are the domain and the rule's path as
//! the config names them (a bucket of an unknown domain is counted under
//! `domain="(unknown)"`, one matching no rule under `rule="(none)"`), never values a
//! client chose, so the series are bounded by the config, as `series.rs` bounds the
//! value series of the rate-limit service.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    domain: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    domain: String,
    rule: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhyLabel {
    domain: String,
    rule: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// Ledger calls take from tens of microseconds (memory) to the store's timeout.
const LEDGER_BUCKETS: [f64; 10] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.25,
];

/// Handles of the RLQS metrics; the stream tasks record through them.
pub struct RlqsMetrics {
    streams: Gauge,
    buckets: Family<RuleLabel, Gauge>,
    assigned: Family<RuleLabel, Gauge<f64, AtomicU64>>,
    reported: Family<OutcomeLabel, Counter>,
    allowed_in_full: Family<WhyLabel, Counter>,
    stream_errors: Family<ReasonLabel, Counter>,
    ledger_errors: Family<KindLabel, Counter>,
    ledger_duration: Histogram,
    state_bytes: Gauge,
}

fn rule(domain: &str, rule: &str) -> RuleLabel {
    RuleLabel {
        domain: domain.to_owned(),
        rule: rule.to_owned(),
    }
}

impl RlqsMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            streams: Gauge::default(),
            buckets: Family::default(),
            assigned: Family::default(),
            reported: Family::default(),
            allowed_in_full: Family::default(),
            stream_errors: Family::default(),
            ledger_errors: Family::default(),
            ledger_duration: Histogram::new(LEDGER_BUCKETS),
            state_bytes: Gauge::default(),
        };
        registry.register(
            "tollgate_rlqs_streams",
            "Open RLQS streams (one per Envoy and domain) on this replica",
            this.streams.clone(),
        );
        registry.register(
            "tollgate_rlqs_buckets",
            "Buckets the RLQS streams of this replica hold, by domain and rule",
            this.buckets.clone(),
        );
        registry.register(
            "tollgate_rlqs_assigned_rate",
            "Requests per second this replica's RLQS streams are assigned, by domain and rule (buckets allowed in full not included)",
            this.assigned.clone(),
        );
        registry.register(
            "tollgate_rlqs_reported_requests",
            "Requests Envoy reported over RLQS, by domain, rule and outcome (allowed, denied)",
            this.reported.clone(),
        );
        registry.register(
            "tollgate_rlqs_allowed_in_full",
            "RLQS answers of ALLOW_ALL, by domain, rule and why (unknown_domain, no_rule, unlimited, shadow)",
            this.allowed_in_full.clone(),
        );
        registry.register(
            "tollgate_rlqs_stream_errors",
            "RLQS streams refused or ended for a fault of theirs, by reason",
            this.stream_errors.clone(),
        );
        registry.register(
            "tollgate_rlqs_ledger_errors",
            "RLQS ledger calls that failed, by kind (timeout, unavailable, circuit_open, full); the bucket kept its last assignment while its hold lasted",
            this.ledger_errors.clone(),
        );
        registry.register_with_unit(
            "tollgate_rlqs_ledger_duration",
            "Time of the RLQS ledger calls that reached the ledger (one per bucket report)",
            Unit::Seconds,
            this.ledger_duration.clone(),
        );
        registry.register(
            "tollgate_rlqs_state_bytes",
            "Bytes of RLQS state (streams, buckets, memory ledger) charged to --rlqs-max-bytes",
            this.state_bytes.clone(),
        );
        this
    }

    pub fn stream_opened(&self) {
        self.streams.inc();
    }

    pub fn stream_closed(&self) {
        self.streams.dec();
    }

    pub fn reported(&self, domain: &str, rule: &str, allowed: u64, denied: u64) {
        for (outcome, n) in [("allowed", allowed), ("denied", denied)] {
            if n > 0 {
                let label = OutcomeLabel {
                    domain: domain.to_owned(),
                    rule: rule.to_owned(),
                    outcome,
                };
                self.reported.get_or_create(&label).inc_by(n);
            }
        }
    }

    pub fn bucket_added(&self, domain: &str, rule_path: &str) {
        self.buckets.get_or_create(&rule(domain, rule_path)).inc();
    }

    /// A bucket gone, with the rate it was assigned (taken off the gauge).
    pub fn bucket_removed(&self, domain: &str, rule_path: &str, rate: f64) {
        let label = rule(domain, rule_path);
        self.buckets.get_or_create(&label).dec();
        self.rate_changed(domain, rule_path, rate, 0.0);
    }

    /// A bucket's assigned rate moved from `old` to `new` (non-finite: allowed in full).
    pub fn rate_changed(&self, domain: &str, rule_path: &str, old: f64, new: f64) {
        let finite = |r: f64| if r.is_finite() { r } else { 0.0 };
        let delta = finite(new) - finite(old);
        if delta != 0.0 {
            self.assigned
                .get_or_create(&rule(domain, rule_path))
                .inc_by(delta);
        }
    }

    pub fn allowed_in_full(&self, domain: &str, rule_path: &str, reason: &'static str) {
        let label = WhyLabel {
            domain: domain.to_owned(),
            rule: rule_path.to_owned(),
            reason,
        };
        self.allowed_in_full.get_or_create(&label).inc();
    }

    pub fn stream_error(&self, reason: &'static str) {
        self.stream_errors
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// One ledger call: how long it took, and its error's kind if it failed.
    pub fn ledger_call(&self, elapsed: Duration, error: Option<&'static str>) {
        match error {
            Some(kind) => {
                self.ledger_errors.get_or_create(&KindLabel { kind }).inc();
            }
            None => self.ledger_duration.observe(elapsed.as_secs_f64()),
        }
    }

    /// The RLQS state's bytes charged to its budget now.
    pub fn state_bytes(&self, bytes: u64) {
        self.state_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

impl Metrics {
    /// The quota service's handles.
    pub fn rlqs(&self) -> &RlqsMetrics {
        &self.rlqs
    }
}
