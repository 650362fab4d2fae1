//! The answer to one request, from its plan and the store's decisions: each
//! descriptor's status in request order (with the limit it reports), the overall
//! code, the headers, 429 body and shadow header ([`headers`]), and how long to hold
//! the answer back (a denying rule's tarpit, or a shaped request's turn).

mod headers;
mod metadata;

use std::time::Duration;

pub use self::headers::{
    HeaderStyle, SHADOW_HEADER, denied_body, rate_limit_headers, retry_after_header, shadow_header,
};
use super::LimiterOptions;
use super::plan::{Plan, RequestPlan, is_quota, rule_name};
use crate::algorithm::Decision;
use crate::config::{Domain, FailureMode, Limit, Rule, Tarpit};
use crate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use crate::proto::{RateLimitRequest, RateLimitResponse};
use crate::store::{CounterKey, CounterOp};
use crate::telemetry::ratelimited;

/// The response, and what must happen before it goes out.
pub(super) struct Answer<'a> {
    pub response: RateLimitResponse,
    pub hold: Hold<'a>,
}

/// Waiting before the answer goes out.
pub(super) enum Hold<'a> {
    None,
    /// A denying rule's tarpit (the longest of them).
    Tarpit(&'a Rule, Tarpit),
    /// An admitted leaky-bucket request is answered when its turn in the queue comes.
    Shaping(Duration),
}

/// Why a descriptor denies the request.
#[derive(Debug, Clone, Copy)]
struct Denial<'a> {
    retry_after: Option<Duration>,
    limit_name: &'a str,
}

/// One descriptor's outcome beyond its status: what the rest of the answer needs.
#[derive(Default)]
struct Report<'a> {
    rule: Option<&'a Rule>,
    /// The reported limit's window, for the IETF policy header.
    window_secs: Option<u64>,
    /// Set when an enforced limit of this descriptor denied.
    denial: Option<Denial<'a>>,
    /// A shadow-mode rule of this descriptor was over its limit.
    shadow_exceeded: bool,
    /// Quota-mode (`quota_mode` or `QUOTA_MODE`): its denial counts only when every
    /// quota-mode descriptor of the request denies.
    quota: bool,
    /// The counter key whose entries the shadow-mode log event shows; formatted only
    /// when a line is written, not for the requests whose event is never logged.
    key: Option<&'a CounterKey>,
}

/// A counter key's entries as `k=v,k=v`, written straight into the log line.
struct Entries<'a>(Option<&'a CounterKey>);

impl std::fmt::Display for Entries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.0.map_or(&[][..], |k| &k.entries);
        for (i, (key, value)) in entries.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            write!(f, "{comma}{key}={value}")?;
        }
        Ok(())
    }
}

pub(super) fn build<'a>(
    request: &RateLimitRequest,
    domain: Option<&Domain>,
    plan: &'a RequestPlan<'a>,
    decisions: &[Decision],
    options: &LimiterOptions,
) -> Answer<'a> {
    let global_shadow = options.global_shadow_mode;
    let mut statuses = Vec::with_capacity(plan.descriptors.len());
    let mut reports = Vec::with_capacity(plan.descriptors.len());
    for descriptor in &plan.descriptors {
        let (status, mut report) = report(descriptor, &plan.ops, decisions, global_shadow);
        report.quota = is_quota(descriptor, options.global_quota_mode);
        statuses.push(status);
        reports.push(report);
    }
    // envoyproxy/ratelimit: OVER_LIMIT when any other descriptor is over, or when
    // there are quota-mode descriptors and all of them are; the statuses keep saying
    // which are over either way.
    let quotas = reports.iter().filter(|r| r.quota);
    let all_quota_over = quotas.clone().count() > 0 && quotas.clone().all(|r| r.denial.is_some());
    if !all_quota_over {
        for r in reports.iter_mut().filter(|r| r.quota) {
            r.denial = None;
        }
    }
    let enforced_denial = reports.iter().any(|r| r.denial.is_some());
    let windows: Vec<Option<u64>> = reports.iter().map(|r| r.window_secs).collect();
    let mut response = RateLimitResponse {
        // Global shadow mode changes only the overall answer: the statuses still say
        // which descriptors were over, as envoyproxy/ratelimit reports them.
        overall_code: if enforced_denial && !global_shadow {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        response_headers_to_add: rate_limit_headers(&options.headers, &statuses, &windows),
        statuses,
        ..Default::default()
    };
    if options.response_dynamic_metadata {
        // upstream: the metadata of descriptors that answered OK (not unlimited).
        let passed = plan
            .descriptors
            .iter()
            .zip(&response.statuses)
            .filter(|(_, s)| s.code == Code::Ok as i32)
            .filter_map(|(p, _)| match p {
                Plan::Limited { rule, .. } => *rule,
                _ => None,
            });
        response.dynamic_metadata = Some(metadata::build(request, passed));
    }
    if log_shadowed(&request.domain, &reports, global_shadow) {
        // Shadow mode: the request goes through, marked for the upstream.
        response.request_headers_to_add.push(shadow_header());
    }

    let hold = if enforced_denial && !global_shadow {
        denied(&mut response, domain, &reports, options);
        tarpit(&reports)
    } else if !enforced_denial {
        shaping(&plan.ops, decisions)
    } else {
        Hold::None
    };
    Answer { response, hold }
}

/// What a denied answer carries: Retry-After, and the domain's 429 body.
fn denied(
    response: &mut RateLimitResponse,
    domain: Option<&Domain>,
    reports: &[Report<'_>],
    options: &LimiterOptions,
) {
    let retry_after = retry_after(reports);
    if let Some(retry) = retry_after {
        let header = retry_after_header(retry, options.retry_after_jitter);
        response.response_headers_to_add.push(header);
    }
    if let Some(domain) = domain {
        let limit = reports
            .iter()
            .find_map(|r| r.denial.map(|d| d.limit_name))
            .unwrap_or_default();
        let (body, content_type) = denied_body(&domain.raw_body, limit, retry_after);
        response.raw_body = body;
        response.response_headers_to_add.push(content_type);
    }
}

/// One descriptor's status and report. With several limits, the one reported is the
/// first that denied, else the one closest to its limit (least remaining, the first
/// of equals).
fn report<'a>(
    plan: &'a Plan<'a>,
    ops: &'a [CounterOp],
    decisions: &[Decision],
    global_shadow: bool,
) -> (DescriptorStatus, Report<'a>) {
    let (limits, rule, range) = match plan {
        Plan::NoLimit => return (ok_status(0), Report::default()),
        // `unlimited: true`: OK, with all the room there is.
        Plan::Unlimited => return (ok_status(u32::MAX), Report::default()),
        Plan::Limited {
            limits, rule, ops, ..
        } => (limits.as_slice(), *rule, ops.clone()),
    };
    let own = &decisions[range.clone()];
    let denied = own.iter().position(|d| !d.allowed);
    let reported = denied.unwrap_or_else(|| {
        own.iter()
            .enumerate()
            .min_by_key(|(_, d)| d.remaining)
            .map_or(0, |(i, _)| i)
    });
    // A shadow-mode rule is counted and reported, never enforced.
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    let status = status(&own[reported], &limits[reported], shadow);
    let logged = denied.is_some() && (shadow || global_shadow);
    let key = logged.then(|| &ops[range.start].key);
    let report = Report {
        rule,
        window_secs: Some(limits[reported].window_secs()),
        denial: denied.filter(|_| !shadow).map(|i| Denial {
            retry_after: own[i].retry_after,
            limit_name: limits[i]
                .name
                .as_deref()
                .or(rule.map(|r| &*r.path))
                .unwrap_or_default(),
        }),
        shadow_exceeded: shadow && denied.is_some(),
        // Set by the caller, which knows the global setting.
        quota: false,
        key,
    };
    (status, report)
}

/// Marks an answer decided by the domain's `failure_mode` because the store could not
/// decide: `dynamic_metadata` gets `{"tollgate": {"fallback": "<mode>"}}`. Envoy only
/// copies that Struct into the request's dynamic metadata (for access logs), so the
/// decision it enforces is unchanged; `tollgate check` prints it. Only fallback answers
/// pay for the allocation.
pub(super) fn mark_fallback(response: &mut RateLimitResponse, mode: FailureMode) {
    use prost_types::{Struct, Value, value::Kind};
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    let inner = Struct {
        fields: [(FALLBACK_FIELD.to_owned(), text(mode.name()))].into(),
    };
    let metadata = response
        .dynamic_metadata
        .get_or_insert_with(Struct::default);
    metadata.fields.insert(
        METADATA_NAMESPACE.to_owned(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
}

/// The `dynamic_metadata` key tollgate's own marks live under.
pub const METADATA_NAMESPACE: &str = "tollgate";
/// Under [`METADATA_NAMESPACE`]: the failure mode that answered instead of the store.
pub const FALLBACK_FIELD: &str = "fallback";

/// An OK status with no `current_limit` (no limit, or `unlimited`).
fn ok_status(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: remaining,
        ..Default::default()
    }
}

/// The status of a limited descriptor, from the decision of the limit it reports.
fn status(decision: &Decision, limit: &Limit, shadow: bool) -> DescriptorStatus {
    let code = if decision.allowed || shadow {
        Code::Ok
    } else {
        Code::OverLimit
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: limit.name.as_deref().unwrap_or_default().to_owned(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.to_proto() as i32,
        }),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        // Whole seconds, rounded up: Envoy's X-RateLimit-Reset header is in seconds,
        // and 0 would tell a client to retry before anything changed.
        duration_until_reset: Some(prost_types::Duration {
            seconds: i64::try_from(decision.reset_after.as_millis().div_ceil(1000))
                .unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// Logs each shadow-mode limit that was exceeded (a shadow rule's, or any under
/// global shadow mode), at most once a second per domain and rule with the count of
/// those not logged since; returns whether there was one.
fn log_shadowed(domain: &str, reports: &[Report<'_>], global_shadow: bool) -> bool {
    let mut shadowed = false;
    for r in reports
        .iter()
        .filter(|r| r.shadow_exceeded || (global_shadow && r.denial.is_some()))
    {
        shadowed = true;
        let rule = rule_name(r.rule);
        let Some(suppressed) = ratelimited::admit(&["shadow_exceeded", domain, rule]) else {
            continue;
        };
        tracing::info!(
            event = "shadow_exceeded",
            domain = %domain,
            rule,
            key = %Entries(r.key),
            suppressed,
            "a shadow-mode limit was exceeded; the request was allowed"
        );
    }
    shadowed
}

/// The request passes only when every denying counter does: wait for the slowest;
/// "never" for any means no Retry-After at all.
fn retry_after(reports: &[Report<'_>]) -> Option<Duration> {
    let mut longest = None;
    for denial in reports.iter().filter_map(|r| r.denial) {
        longest = longest.max(Some(denial.retry_after?));
    }
    longest
}

/// Hold a denial back if a denying rule has a tarpit (the longest wins).
fn tarpit<'a>(reports: &[Report<'a>]) -> Hold<'a> {
    reports
        .iter()
        .filter(|r| r.denial.is_some())
        .filter_map(|r| r.rule.and_then(|rule| rule.tarpit.map(|t| (rule, t))))
        .max_by_key(|(_, t)| t.delay)
        .map_or(Hold::None, |(rule, tarpit)| Hold::Tarpit(rule, tarpit))
}

/// Shaping: an admitted request waits for its turn in the slowest enforced queue.
fn shaping(ops: &[CounterOp], decisions: &[Decision]) -> Hold<'static> {
    let wait = ops
        .iter()
        .zip(decisions)
        .filter(|(op, d)| op.vetoes && d.allowed)
        .map(|(_, d)| d.delay)
        .max()
        .unwrap_or(Duration::ZERO);
    if wait.is_zero() {
        Hold::None
    } else {
        Hold::Shaping(wait)
    }
}
