//! What one stream knows: its buckets, what each was last sent, and the steps of one
//! reports message between observing it and answering it. Read and written under the
//! stream's lock by `stream.rs` (observing) and `answer.rs` (answering), which both
//! depend on it and not on each other's internals.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Rlqs;
use super::bucket::{self, BucketKey, Target};
use super::budget::bucket_bytes;
use super::error::RlqsError;
use super::share;
use super::view::BucketView;
use crate::proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

/// What a bucket was last sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sent {
    /// Tokens per window; 0: denied.
    pub tokens: u64,
    pub window_secs: u64,
    /// When the grant was made: the ledger holds it for the TTL (and a margin) from
    /// about then.
    pub at: Instant,
}

/// What one stream knows of one of its buckets.
pub(super) struct BucketState {
    /// The labels it is counted under (the rule can change with a reload).
    pub domain: Arc<str>,
    pub rule: Arc<str>,
    pub ledger_key: Option<Box<str>>,
    last_report: Instant,
    /// Requests reported since `last_report` (reports under a second apart add up).
    pending: u64,
    pub demand: Option<f64>,
    last_active: Instant,
    /// Its first report covered time before this stream: Envoy holds an assignment.
    pub resumed: bool,
    pub first_seen: Instant,
    /// What it was last sent, while that can be resent.
    pub sent: Option<Sent>,
    pub ledger_streams: usize,
    /// Requests per second assigned (what the metrics' gauge holds for it).
    pub rate: f64,
    /// Bytes it is charged in the RLQS budget.
    charge: u64,
}

/// One bucket of a message, between observing its report and answering it.
pub(super) struct Step {
    pub key: BucketKey,
    pub target: Target,
    /// This report made the bucket, and it was resumed.
    pub first_resumed: bool,
    pub abandon: bool,
    /// The ledger's part, when the bucket is shared: its key, the weight, whether
    /// the bucket was resumed.
    pub claim: Option<(Box<str>, Option<u64>, bool)>,
}

pub(super) struct StreamState {
    /// The claim it asks for: its client id's, or its own.
    pub name: String,
    /// Its own claim name, unique per stream: the owner of its claims.
    pub own: String,
    pub domain: Option<String>,
    pub buckets: BTreeMap<BucketKey, BucketState>,
    /// Bytes its buckets are charged.
    pub charged: u64,
    pub last_message: Instant,
}

impl StreamState {
    pub fn new(name: String, own: String) -> Self {
        Self {
            name,
            own,
            domain: None,
            buckets: BTreeMap::new(),
            charged: 0,
            last_message: Instant::now(),
        }
    }

    /// Validates a message and records its reports: one step per bucket.
    pub(super) fn observe_all(
        &mut self,
        rlqs: &Rlqs,
        message: RateLimitQuotaUsageReports,
        now: Instant,
    ) -> Result<Vec<Step>, RlqsError> {
        let options = &rlqs.options;
        self.last_message = now;
        let got = message.bucket_quota_usages.len();
        if got > options.max_reports_per_message {
            return Err(RlqsError::ReportTooLarge {
                got,
                max: options.max_reports_per_message,
            });
        }
        self.check_domain(&message.domain)?;
        let domain = self.domain.clone().unwrap_or_default();
        let config = rlqs.limiter.config();
        let mut steps = Vec::with_capacity(got);
        for (index, usage) in (0u64..).zip(message.bucket_quota_usages) {
            let key =
                bucket::validate(index, usage.bucket_id.as_ref(), options.max_bucket_id_bytes)?;
            let entries: BTreeMap<String, String> = key
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let target = bucket::resolve(
                &config,
                &domain,
                &entries,
                &rlqs.prefix,
                options.global_shadow_mode,
            );
            let (first_resumed, abandon) = self.observe(rlqs, &key, &target, &usage, now)?;
            let claim = match &target.kind {
                Ok(shared) if !abandon => {
                    let state = &self.buckets[&key];
                    let weight = state
                        .demand
                        .map(|d| share::weight(d, shared.tokens, shared.window_secs));
                    Some((shared.ledger_key.clone().into(), weight, state.resumed))
                }
                _ => None,
            };
            steps.push(Step {
                key,
                target,
                first_resumed,
                abandon,
                claim,
            });
        }
        Ok(steps)
    }

    fn check_domain(&mut self, domain: &str) -> Result<(), RlqsError> {
        match &self.domain {
            None if domain.is_empty() => Err(RlqsError::NoDomain),
            None => {
                self.domain = Some(domain.to_owned());
                Ok(())
            }
            // Later messages may leave it out (the proto says it is sent once).
            Some(first) if !domain.is_empty() && first != domain => Err(RlqsError::DomainChanged {
                first: first.clone(),
                now: domain.to_owned(),
            }),
            Some(_) => Ok(()),
        }
    }

    /// Records a report's counts, making the bucket (within the bounds) when it is
    /// new; whether it was made now and resumed, and whether it has been idle long
    /// enough to abandon.
    fn observe(
        &mut self,
        rlqs: &Rlqs,
        key: &BucketKey,
        target: &Target,
        usage: &BucketQuotaUsage,
        now: Instant,
    ) -> Result<(bool, bool), RlqsError> {
        let count = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        let metrics = rlqs.metrics.rlqs();
        metrics.reported(
            &target.domain,
            &target.rule,
            usage.num_requests_allowed,
            usage.num_requests_denied,
        );
        let ledger_key: Option<Box<str>> = target
            .kind
            .as_ref()
            .ok()
            .map(|s| s.ledger_key.as_str().into());
        let Some(state) = self.buckets.get_mut(key) else {
            let max = rlqs.options.max_buckets_per_stream;
            if self.buckets.len() >= max {
                return Err(RlqsError::TooManyBuckets { max });
            }
            let id_bytes: usize = key.iter().map(|(k, v)| k.len() + v.len()).sum();
            let charge = bucket_bytes(id_bytes, ledger_key.as_ref().map_or(0, |k| k.len()));
            if !rlqs.budget.take(charge) {
                return Err(RlqsError::OverBudget {
                    max: rlqs.budget.limit(),
                });
            }
            self.charged += charge;
            let elapsed = usage.time_elapsed.map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let resumed = elapsed > 0.0;
            metrics.bucket_added(&target.domain, &target.rule);
            self.buckets.insert(
                key.clone(),
                BucketState {
                    domain: target.domain.clone(),
                    rule: target.rule.clone(),
                    ledger_key,
                    last_report: now,
                    pending: 0,
                    demand: (elapsed >= 1.0).then(|| count as f64 / elapsed),
                    last_active: now,
                    resumed,
                    first_seen: now,
                    sent: None,
                    ledger_streams: 0,
                    rate: 0.0,
                    charge,
                },
            );
            return Ok((resumed, false));
        };
        if state.domain != target.domain || state.rule != target.rule {
            metrics.bucket_removed(&state.domain, &state.rule, state.rate);
            metrics.bucket_added(&target.domain, &target.rule);
            metrics.rate_changed(&target.domain, &target.rule, 0.0, state.rate);
            state.domain = target.domain.clone();
            state.rule = target.rule.clone();
        }
        if state.ledger_key != ledger_key {
            state.ledger_key = ledger_key;
        }
        state.pending = state.pending.saturating_add(count);
        let elapsed = now.saturating_duration_since(state.last_report);
        if elapsed >= Duration::from_secs(1) {
            state.demand = Some(state.pending as f64 / elapsed.as_secs_f64());
            state.pending = 0;
            state.last_report = now;
        }
        if count > 0 {
            state.last_active = now;
        }
        let abandon = now.saturating_duration_since(state.last_active) > rlqs.options.abandon_after;
        Ok((false, abandon))
    }

    /// Drops a bucket (abandoned): its charge and gauges go with it.
    pub fn remove(&mut self, rlqs: &Rlqs, key: &BucketKey) -> Option<BucketState> {
        let state = self.buckets.remove(key)?;
        rlqs.budget.give(state.charge);
        self.charged -= state.charge;
        rlqs.metrics
            .rlqs()
            .bucket_removed(&state.domain, &state.rule, state.rate);
        Some(state)
    }

    /// What `/rlqs` shows of this stream's buckets.
    pub fn views(&self) -> Vec<BucketView> {
        self.buckets
            .iter()
            .map(|(key, b)| BucketView {
                bucket: key
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                domain: b.domain.to_string(),
                rule: b.rule.to_string(),
                demand_per_second: b.demand,
                share_tokens: b.sent.map(|s| s.tokens),
                window_seconds: b.sent.map(|s| s.window_secs),
                rate_per_second: b.rate.is_finite().then_some(b.rate),
                ledger_streams: b.ledger_streams,
            })
            .collect()
    }
}
