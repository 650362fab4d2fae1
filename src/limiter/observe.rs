//! What a request leaves behind besides its answer: the service metrics (latency,
//! result, descriptors per request), each descriptor's outcome on its rule
//! (`tollgate_rule_*_total`, see [`RuleOutcome`]), and the `match` trace span.

use std::time::Duration;

use tracing::field::Empty;

use super::plan::{Plan, RequestPlan, rule_name};
use crate::algorithm::Decision;
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
        let outcome = RuleOutcome {
            hits: first.cost,
            over_limit,
            near_limit: !over_limit && own_ops.iter().zip(own).any(|(op, d)| near(op, d, ratio)),
            shadowed: over_limit && shadow,
            from_local_cache: local.iter().any(|i| range.contains(i)),
        };
        let labels = RuleLabels {
            domain: &first.key.domain,
            rule: &first.key.rule,
            entries: &first.key.entries,
            detailed: rule.is_some_and(|r| r.detailed_metric),
        };
        metrics.rule(labels, &outcome);
    }
}

/// Whether an admitted operation left its counter at or above `ratio` of what it
/// admits (the bucket size for the bucket algorithms, else the limit).
fn near(op: &CounterOp, decision: &Decision, ratio: f64) -> bool {
    let capacity = if op.params.algorithm.uses_burst() {
        op.params.burst
    } else {
        op.params.limit
    };
    capacity > 0 && capacity.saturating_sub(decision.remaining) as f64 >= ratio * capacity as f64
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

/// Records the matched rules on the current (`match`) span, when it is recorded.
pub(super) fn matched(plans: &[Plan<'_>]) {
    let span = tracing::Span::current();
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
