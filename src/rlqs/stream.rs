//! One Envoy's stream: the buckets it reported, what it was last assigned, and the
//! handling of one reports message (validate, resolve, claim, assign). The stream's
//! task and its end are in `service.rs`; this is the state it keeps.
//!
//! Demand is measured on tollgate's clock between two reports of a bucket (Envoy's
//! `time_elapsed` is whole seconds, and 0 for a new bucket), over at least a second:
//! a report sooner than that (Envoy reports at once when its assignment changes) adds
//! its counts to the next. A bucket first seen on this stream with `time_elapsed` > 0
//! is a stream reopened after a restart or a lost connection: Envoy still holds its
//! old assignment, so while the bucket's ledger is younger than a report period (it
//! has not heard every Envoy yet) no new assignment is sent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::Rlqs;
use super::assign;
use super::bucket::{self, Shared, Target};
use super::error::RlqsError;
use super::ledger::{ClaimRequest, Granted};
use super::view::BucketView;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::proto::envoy::r#type::v3::rate_limit_strategy::Strategy;

/// A change of share smaller than this fraction of the current one is not sent:
/// Envoy rebuilds a changed token bucket (losing the tokens it held), so a share
/// that jitters with the traffic would cost more than the precision it buys.
const HYSTERESIS: f64 = 0.05;

/// What one stream knows of one of its buckets.
pub(super) struct BucketState {
    pub id: BucketId,
    pub entries: BTreeMap<String, String>,
    /// The labels it is counted under (the rule can change with a reload).
    pub domain: Arc<str>,
    pub rule: Arc<str>,
    pub ledger_key: Option<String>,
    last_report: Instant,
    /// Requests reported since `last_report` (reports under a second apart add up).
    pending: u64,
    pub demand: Option<f64>,
    last_active: Instant,
    /// Tokens per window last assigned, and the window.
    pub share: Option<(u64, u64)>,
    pub ledger_streams: usize,
    /// Requests per second assigned (what the metrics' gauge holds for it).
    pub rate: f64,
}

/// One bucket of a message, between observing its report and answering it.
struct Step {
    key: String,
    target: Target,
    resumed: bool,
    abandon: bool,
}

pub(super) struct StreamState {
    pub claimant: String,
    pub domain: Option<String>,
    pub buckets: BTreeMap<String, BucketState>,
}

impl StreamState {
    pub fn new(claimant: String) -> Self {
        Self {
            claimant,
            domain: None,
            buckets: BTreeMap::new(),
        }
    }

    /// Handles one reports message: the actions to send, if any.
    pub async fn handle(
        &mut self,
        rlqs: &Rlqs,
        message: RateLimitQuotaUsageReports,
    ) -> Result<Option<RateLimitQuotaResponse>, RlqsError> {
        let options = &rlqs.options;
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
        let now = Instant::now();
        let mut steps = Vec::with_capacity(message.bucket_quota_usages.len());
        for (index, usage) in (0u64..).zip(message.bucket_quota_usages) {
            let (key, entries, id) =
                validate(index, usage.bucket_id.as_ref(), options.max_bucket_id_bytes)?;
            let target = bucket::resolve(
                &config,
                &domain,
                &entries,
                &rlqs.prefix,
                options.global_shadow_mode,
            );
            if !self.buckets.contains_key(&key)
                && self.buckets.len() >= options.max_buckets_per_stream
            {
                return Err(RlqsError::TooManyBuckets {
                    max: options.max_buckets_per_stream,
                });
            }
            let (resumed, abandon) = self.observe(rlqs, &key, id, entries, &target, &usage, now);
            steps.push(Step {
                key,
                target,
                resumed,
                abandon,
            });
        }
        let grants = self.claim_all(rlqs, &steps).await;
        let mut actions = Vec::new();
        for (step, granted) in steps.into_iter().zip(grants) {
            if let Some(action) = self.answer(rlqs, step, granted) {
                actions.push(action);
            }
        }
        Ok((!actions.is_empty()).then_some(RateLimitQuotaResponse {
            bucket_action: actions,
        }))
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

    /// Records a report's counts; whether the bucket is resumed (see the module
    /// docs) and whether it has been idle long enough to abandon.
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &mut self,
        rlqs: &Rlqs,
        key: &str,
        id: BucketId,
        entries: BTreeMap<String, String>,
        target: &Target,
        usage: &BucketQuotaUsage,
        now: Instant,
    ) -> (bool, bool) {
        let count = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        rlqs.metrics.rlqs().reported(
            &target.domain,
            &target.rule,
            usage.num_requests_allowed,
            usage.num_requests_denied,
        );
        let ledger_key = target.kind.as_ref().ok().map(|s| s.ledger_key.clone());
        let Some(state) = self.buckets.get_mut(key) else {
            let elapsed = usage.time_elapsed.map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let resumed = elapsed > 0.0;
            rlqs.metrics
                .rlqs()
                .bucket_added(&target.domain, &target.rule);
            self.buckets.insert(
                key.to_owned(),
                BucketState {
                    id,
                    entries,
                    domain: target.domain.clone(),
                    rule: target.rule.clone(),
                    ledger_key,
                    last_report: now,
                    pending: 0,
                    demand: (elapsed >= 1.0).then(|| count as f64 / elapsed),
                    last_active: now,
                    share: None,
                    ledger_streams: 0,
                    rate: 0.0,
                },
            );
            return (resumed, false);
        };
        if state.domain != target.domain || state.rule != target.rule {
            let metrics = rlqs.metrics.rlqs();
            metrics.bucket_removed(&state.domain, &state.rule, state.rate);
            metrics.bucket_added(&target.domain, &target.rule);
            metrics.rate_changed(&target.domain, &target.rule, 0.0, state.rate);
            state.domain = target.domain.clone();
            state.rule = target.rule.clone();
        }
        state.ledger_key = ledger_key;
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
        (false, abandon)
    }

    /// The ledger's answer for every shared bucket of the message, at once.
    async fn claim_all(&self, rlqs: &Rlqs, steps: &[Step]) -> Vec<Option<Result<Granted, ()>>> {
        let calls = steps.iter().map(|step| async move {
            let Ok(shared) = &step.target.kind else {
                return None;
            };
            if step.abandon {
                return None;
            }
            let demand = self.buckets.get(&step.key).and_then(|b| b.demand);
            let request = ClaimRequest {
                key: &shared.ledger_key,
                stream: &self.claimant,
                demand,
                tokens: shared.tokens,
                stale_after: rlqs.options.stale_after,
            };
            Some(rlqs.ledger.claim(request).await.map_err(|error| {
                rlqs.metrics.rlqs().ledger_error();
                tracing::warn!(event = "rlqs_ledger_error", %error, "the RLQS ledger did not answer: the bucket keeps its last share");
            }))
        });
        join_all(calls).await
    }

    /// The action for one bucket, if any, with the bookkeeping it implies.
    fn answer(
        &mut self,
        rlqs: &Rlqs,
        step: Step,
        granted: Option<Result<Granted, ()>>,
    ) -> Option<BucketAction> {
        let ttl = rlqs.options.assignment_ttl;
        let metrics = rlqs.metrics.rlqs();
        if step.abandon {
            let state = self.buckets.remove(&step.key)?;
            metrics.bucket_removed(&state.domain, &state.rule, state.rate);
            return Some(assign::abandon(&state.id));
        }
        let state = self.buckets.get_mut(&step.key)?;
        let shared: &Shared = match &step.target.kind {
            Err(why) => {
                metrics.allowed_in_full(&state.domain, &state.rule, why.name());
                set_rate(rlqs, state, f64::INFINITY);
                state.share = None;
                return Some(assign::assign(&state.id, assign::allow_all(), ttl));
            }
            Ok(shared) => shared,
        };
        let granted = match granted {
            Some(Ok(granted)) => granted,
            // The ledger did not answer: the last share holds (resent, so its TTL
            // does not run out); a bucket never assigned is left to Envoy's
            // no_assignment_behavior until the ledger answers.
            _ => {
                let (tokens, window) = state.share?;
                let bucket = assign::token_bucket(tokens, shared.tokens, window, shared.burst);
                return Some(assign::assign(
                    &state.id,
                    Strategy::TokenBucket(bucket),
                    ttl,
                ));
            }
        };
        state.ledger_streams = granted.streams;
        if step.resumed && granted.age < rlqs.options.report_period {
            return None;
        }
        let tokens = match state.share {
            Some((current, window))
                if window == shared.window_secs
                    && (granted.tokens as f64 - current as f64).abs()
                        <= HYSTERESIS * current as f64 =>
            {
                current
            }
            _ => granted.tokens,
        };
        state.share = Some((tokens, shared.window_secs));
        set_rate(rlqs, state, tokens as f64 / shared.window_secs as f64);
        let bucket = assign::token_bucket(tokens, shared.tokens, shared.window_secs, shared.burst);
        Some(assign::assign(
            &state.id,
            Strategy::TokenBucket(bucket),
            ttl,
        ))
    }

    /// What `/rlqs` shows of this stream's buckets.
    pub fn views(&self) -> Vec<BucketView> {
        self.buckets
            .values()
            .map(|b| BucketView {
                bucket: b.entries.clone(),
                domain: b.domain.to_string(),
                rule: b.rule.to_string(),
                demand_per_second: b.demand,
                share_tokens: b.share.map(|(t, _)| t),
                window_seconds: b.share.map(|(_, w)| w),
                rate_per_second: b.rate.is_finite().then_some(b.rate),
                ledger_streams: b.ledger_streams,
            })
            .collect()
    }
}

/// Records `state`'s new assigned rate (infinite: allowed in full) in it and the gauge.
fn set_rate(rlqs: &Rlqs, state: &mut BucketState, rate: f64) {
    rlqs.metrics
        .rlqs()
        .rate_changed(&state.domain, &state.rule, state.rate, rate);
    state.rate = rate;
}

/// A bucket id that can be used: present, non-empty keys and values, within the size
/// bound. Returns its canonical key (entries in key order), the entries and the id.
fn validate(
    index: u64,
    id: Option<&BucketId>,
    max_bytes: usize,
) -> Result<(String, BTreeMap<String, String>, BucketId), RlqsError> {
    let bad = |why: String| RlqsError::BadBucket { index, why };
    let id = id.ok_or_else(|| bad("no bucket_id".into()))?;
    if id.bucket.is_empty() {
        return Err(bad("the bucket_id has no entries".into()));
    }
    let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > max_bytes {
        return Err(bad(format!(
            "the bucket_id has {bytes} bytes; at most {max_bytes} (--rlqs-max-bucket-id-bytes)"
        )));
    }
    if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(bad("a bucket_id key or value is empty".into()));
    }
    let entries: BTreeMap<String, String> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut key = String::with_capacity(bytes + 2 * entries.len());
    for (k, v) in &entries {
        // Lengths first: no value can make two different ids one key.
        key.push_str(&format!("{}:{}:{}={}|", k.len(), v.len(), k, v));
    }
    Ok((key, entries, id.clone()))
}
