//! The `decision` debug event: one per request, saying why it got its answer: the
//! domain, the overall code, the counter that denied it (if any), whether the answer
//! came from the domain's `failure_mode` (the store could not decide), and per
//! descriptor its entries, rule, shadow mode and each limit with what remained and
//! whether the local over-limit cache answered it. Shown at `LOG_LEVEL=debug` or with
//! `RUST_LOG=info,decision=debug` (a bare `decision=debug` hides every other line);
//! when that level is off, [`log`] costs one level check
//! and builds nothing.

use serde::Serialize;

use super::plan::{OVERRIDE_RULE, Plan, RequestPlan};
use crate::algorithm::Decision;
use crate::config::FailureMode;
use crate::proto::rate_limit_response::Code;
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::telemetry::{DECISION_TARGET, Json};

/// One descriptor, as the event shows it.
#[derive(Serialize)]
struct Descriptor {
    entries: String,
    /// `none` (no rule matched, or replaced), `unlimited`, a rule path or `(override)`.
    rule: String,
    code: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<Counter>,
}

/// One limit of a descriptor: its counter's decision.
#[derive(Serialize)]
struct Counter {
    limit: String,
    allowed: bool,
    remaining: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    local_cache: bool,
}

/// What the store (or the fallback) answered, beside the plan.
pub(super) struct Counted<'a> {
    pub decisions: &'a [Decision],
    /// Indices of the operations the local over-limit cache answered.
    pub local: &'a [usize],
    /// The `failure_mode` that answered instead of the store.
    pub fallback: Option<FailureMode>,
}

/// Logs the `decision` event, if that target is on at debug.
pub(super) fn log(
    request: &RateLimitRequest,
    plan: &RequestPlan<'_>,
    counted: &Counted<'_>,
    response: &RateLimitResponse,
) {
    if !tracing::enabled!(target: DECISION_TARGET, tracing::Level::DEBUG) {
        return;
    }
    let mut denied_by = None;
    let descriptors: Vec<Descriptor> = plan
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            let described = describe(request, i, descriptor, counted, response);
            if denied_by.is_none() && !described.shadow {
                denied_by = described
                    .limits
                    .iter()
                    .find(|c| !c.allowed)
                    .map(|c| format!("{} {}", described.rule, c.limit));
            }
            described
        })
        .collect();
    let code = code_name(response.overall_code);
    tracing::debug!(
        target: DECISION_TARGET,
        domain = %request.domain,
        code,
        denied_by = denied_by.as_deref().unwrap_or("none"),
        fallback = counted.fallback.map_or("none", FailureMode::name),
        descriptors = %Json(&descriptors),
        "{code}: {}",
        denied_by.as_deref().map_or("no counter denied", |_| "denied by a counter")
    );
}

fn describe(
    request: &RateLimitRequest,
    index: usize,
    plan: &Plan<'_>,
    counted: &Counted<'_>,
    response: &RateLimitResponse,
) -> Descriptor {
    let entries = request.descriptors.get(index).map_or(String::new(), |d| {
        d.entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect::<Vec<_>>()
            .join(",")
    });
    let code = response
        .statuses
        .get(index)
        .map_or("OK", |s| code_name(s.code));
    let (rule, shadow, limits) = match plan {
        Plan::NoLimit => ("none".to_owned(), false, Vec::new()),
        Plan::Unlimited => ("unlimited".to_owned(), false, Vec::new()),
        Plan::Limited {
            limits, rule, ops, ..
        } => {
            let counters = limits
                .as_slice()
                .iter()
                .zip(ops.clone())
                .filter_map(|(limit, op)| {
                    let decision = counted.decisions.get(op)?;
                    Some(Counter {
                        limit: limit.to_string(),
                        allowed: decision.allowed,
                        remaining: decision.remaining,
                        local_cache: counted.local.contains(&op),
                    })
                })
                .collect();
            let name = rule.map_or(OVERRIDE_RULE, |r| &r.path).to_owned();
            (name, rule.is_some_and(|r| r.shadow_mode), counters)
        }
    };
    Descriptor {
        entries,
        rule,
        code,
        shadow,
        limits,
    }
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::OverLimit) => "OVER_LIMIT",
        Ok(Code::Ok) => "OK",
        _ => "UNKNOWN",
    }
}
