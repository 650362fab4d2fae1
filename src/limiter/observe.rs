//! What a request leaves behind besides its answer: the service metrics (latency,
//! result, descriptors per request), each descriptor's outcome on its rule
//! (`tollgate_rule_*_total`, see [`RuleOutcome`]), and the `match` trace span.

use std::time::Duration;

use tracing::field::Empty;

use super::plan::{Plan, RequestPlan, rule_label, rule_name};
use crate::algorithm::{Decision, Mode};
use crate::config::Rule;
use crate::error::Error;
use crate::metrics::{Metrics, RequestResult, RuleLabels, RuleOutcome};
use crate::proto::rate_limit_response::Code;
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::CounterOp;
use crate::telemetry::SPAN_TARGET;

/// One request's latency, size and result (OK, OVER_LIMIT, or the error's kind).
pub(super) fn request(
    metrics: &Metrics,
    elapsed: Duration,
    request: &RateLimitRequest,
    result: &Result<RateLimitResponse, Error>,
) {
    let outcome = match result {
        Ok(response) if response.overall_code == Code::OverLimit as i32 => RequestResult::OverLimit,
        Ok(_) => RequestResult::Ok,
        Err(error) => RequestResult::Error(error.metric_kind()),
    };
    metrics.request(elapsed, request.descriptors.len(), outcome);
}

/// Each limited descriptor's outcome, counted on its rule. `local`: indices of the
/// operations the over-limit cache answered.
pub(super) fn count_rules(
    metrics: &Metrics,
    plan: &RequestPlan<'_>,
    decisions: &[Decision],
    local: &[usize],
    global_shadow: bool,
) {
    let ratio = metrics.near_limit_ratio();
    for descriptor in &plan.descriptors {
        let Plan::Limited {
            rule, ops: range, ..
        } = descriptor
        else {
            continue;
        };
        let (Some(own_ops), Some(own)) =
            (plan.ops.get(range.clone()), decisions.get(range.clone()))
        else {
            continue;
        };
        let Some(first) = own_ops.first() else {
            continue;
        };
        let over_limit = own.iter().any(|d| !d.allowed);
        let shadow = rule.is_some_and(|r| r.shadow_mode) || global_shadow;
        // Of several limits on one descriptor, the one its hits came nearest to.
        let near_limit = if over_limit {
            0
        } else {
            own_ops
                .iter()
                .zip(own)
                .map(|(op, d)| near_limit_hits(op, d, ratio))
                .max()
                .unwrap_or(0)
        };
        if first.mode == Mode::Release {
            // A release is no hit: counted apart, given back or ignored.
            let gives_back = first.params.algorithm.releases();
            let outcome = RuleOutcome {
                released: if gives_back { first.cost } else { 0 },
                release_ignored: if gives_back { 0 } else { first.cost },
                ..RuleOutcome::default()
            };
            metrics.rule(labels(first, *rule), &outcome);
            continue;
        }
        let outcome = RuleOutcome {
            hits: first.cost,
            over_limit,
            near_limit,
            shadowed: over_limit && shadow,
            from_local_cache: local.iter().any(|i| range.contains(i)),
            ..RuleOutcome::default()
        };
        metrics.rule(labels(first, *rule), &outcome);
    }
}

/// The series a descriptor's outcome is counted on.
fn labels<'a>(first: &'a CounterOp, rule: Option<&'a Rule>) -> RuleLabels<'a> {
    RuleLabels {
        domain: &first.key.domain,
        // The rule's own name, also for an override that shares its counter.
        rule: rule_label(rule),
        entries: &first.key.entries,
        // Envoy's per-descriptor override has no rule to name its series: the
        // descriptor does, one series per overridden descriptor as upstream keeps.
        detailed: rule.is_none_or(|r| r.detailed_metric),
        metric_levels: rule.and_then(|r| r.metric_levels.as_deref()),
    }
}

/// How many of an admitted operation's hits landed above the near-limit threshold,
/// envoyproxy/ratelimit's `checkNearLimitThreshold`: the threshold is
/// floor(capacity x ratio) in single precision as upstream computes it, and only the
/// hits past it count (capacity 8, count from 5 to 7: 1). The count before and after
/// comes from what remains (the bucket size for the bucket algorithms, else the
/// limit). A denied operation consumed nothing in tollgate, so none of its hits landed.
fn near_limit_hits(op: &CounterOp, decision: &Decision, ratio: f64) -> u64 {
    if !decision.allowed {
        return 0;
    }
    let capacity = if op.params.algorithm.uses_burst() {
        op.params.burst
    } else {
        op.params.limit
    };
    near_hits(capacity, decision.remaining, op.cost, ratio)
}

/// The arithmetic of [`near_limit_hits`] on plain numbers.
fn near_hits(capacity: u64, remaining: u64, hits: u64, ratio: f64) -> u64 {
    let threshold = ((capacity as f32) * (ratio as f32)).floor() as u64;
    let after = capacity.saturating_sub(remaining);
    if after <= threshold {
        return 0;
    }
    let before = after.saturating_sub(hits);
    if before >= threshold {
        hits
    } else {
        after - threshold
    }
}

/// The `match` span: resolving the descriptors to rules.
pub(super) fn match_span(request: &RateLimitRequest) -> tracing::Span {
    tracing::info_span!(
        target: SPAN_TARGET,
        "match",
        domain = %request.domain,
        descriptors = request.descriptors.len(),
        rules = Empty,
    )
}

/// Records the matched rules on the `match` span, when it is recorded (asked of the
/// span itself: `Span::current()` would cost a subscriber lookup on every request).
pub(super) fn matched(span: &tracing::Span, plans: &[Plan<'_>]) {
    if span.is_disabled() {
        return;
    }
    let rules: Vec<&str> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Limited { rule, .. } => Some(rule_name(*rule)),
            Plan::Unlimited | Plan::NoLimit => None,
        })
        .collect();
    span.record("rules", rules.join(",").as_str());
}

#[cfg(test)]
mod tests {
    use super::near_hits;

    #[test]
    fn near_limit_counts_only_the_hits_past_floor_of_limit_times_ratio() {
        // Limit 8: threshold floor(6.4) = 6. One request of 2 from 5 to 7: one hit past 6.
        assert_eq!(near_hits(8, 1, 2, 0.8), 1);
        // Single hits from 5 to 7: the 6th lands on the threshold, only the 7th counts.
        assert_eq!(near_hits(8, 2, 1, 0.8), 0);
        assert_eq!(near_hits(8, 1, 1, 0.8), 1);
    }

    #[test]
    fn landing_exactly_on_the_threshold_is_not_near_limit() {
        // Limit 15: threshold 12; the 12th hit is not near, the 13th is.
        assert_eq!(near_hits(15, 3, 1, 0.8), 0);
        assert_eq!(near_hits(15, 2, 1, 0.8), 1);
    }

    #[test]
    fn a_request_starting_past_the_threshold_counts_all_its_hits() {
        assert_eq!(near_hits(10, 0, 2, 0.8), 2, "from 8 to 10, threshold 8");
        assert_eq!(near_hits(10, 0, 5, 0.8), 2, "from 5 to 10: only 9 and 10");
        assert_eq!(near_hits(10, 5, 5, 0.8), 0, "from 0 to 5");
    }

    #[test]
    fn the_threshold_uses_single_precision_as_upstream() {
        // 100 x 0.57 is 56.99999999999999 in double precision but 57 in single, as
        // upstream computes it: the 57th hit is not near the limit, the 58th is.
        assert_eq!(near_hits(100, 43, 1, 0.57), 0);
        assert_eq!(near_hits(100, 42, 1, 0.57), 1);
        // Limit 0 never admits: nothing to count.
        assert_eq!(near_hits(0, 0, 1, 0.8), 0);
    }
}
