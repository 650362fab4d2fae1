//! One Envoy's stream: the buckets it reported and the handling of one reports message
//! (validate, resolve, observe demand, claim, answer). The stream's task and its end
//! are in `service.rs`; what a bucket is answered is in `answer.rs`; what the stream
//! knows between messages is in `state.rs`.
//!
//! Demand is measured on tollgate's clock between two reports of a bucket (Envoy's
//! `time_elapsed` is whole seconds, and 0 for a new bucket), over at least a second:
//! a report sooner than that (Envoy reports at once when it creates a bucket) adds
//! its counts to the next. A bucket first seen on this stream with `time_elapsed` > 0
//! is resumed: Envoy reconnected and still holds its old assignment.
//!
//! The state lives behind its registration's lock (so `/rlqs` can read it), taken
//! twice per message and never across the ledger calls between.

use std::time::Instant;

use futures_util::future::join_all;

use super::error::RlqsError;
use super::ledger::{ClaimRequest, Granted, LedgerError, Report};
use super::state::Step;
use super::{Rlqs, StreamEntry};
use crate::proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::telemetry::ratelimited;

/// Handles one reports message on `entry`'s stream: the actions to send, if any.
pub(super) async fn handle(
    entry: &StreamEntry,
    rlqs: &Rlqs,
    message: RateLimitQuotaUsageReports,
) -> Result<Option<RateLimitQuotaResponse>, RlqsError> {
    let now = Instant::now();
    let (steps, name, own) = {
        let mut state = entry.lock();
        let steps = state.observe_all(rlqs, message, now)?;
        (steps, state.name.clone(), state.own.clone())
    };
    let grants = claim_all(rlqs, &steps, &name, &own).await;
    let mut state = entry.lock();
    let mut actions = Vec::new();
    for (step, granted) in steps.into_iter().zip(grants) {
        if let Some(action) = super::answer::answer(&mut state, rlqs, step, granted, now) {
            actions.push(action);
        }
    }
    Ok((!actions.is_empty()).then_some(RateLimitQuotaResponse {
        bucket_action: actions,
    }))
}

/// The ledger's answer for every shared bucket of the message, at once; abandoned
/// buckets' claims are released.
async fn claim_all(
    rlqs: &Rlqs,
    steps: &[Step],
    name: &str,
    own: &str,
) -> Vec<Option<Result<Granted, LedgerError>>> {
    let timing = rlqs.options.timing();
    let calls = steps.iter().map(|step| async move {
        if step.abandon {
            if let Ok(shared) = &step.target.kind {
                let released = rlqs
                    .ledger
                    .release(&shared.ledger_key, name, own, own, timing);
                let _ = metered(rlqs, released).await;
            }
            return None;
        }
        let (key, weight, resumed) = step.claim.as_ref()?;
        let tokens = step.target.kind.as_ref().ok()?.tokens;
        let request = ClaimRequest {
            key,
            report: Report {
                name,
                alias: own,
                owner: own,
                weight: *weight,
                resumed: *resumed,
                tokens,
            },
            timing,
        };
        Some(metered(rlqs, rlqs.ledger.claim(request)).await)
    });
    join_all(calls).await
}

/// A ledger call, timed and counted; an error is logged at most once a second.
pub(super) async fn metered<T>(
    rlqs: &Rlqs,
    call: impl Future<Output = Result<T, LedgerError>>,
) -> Result<T, LedgerError> {
    let start = Instant::now();
    let result = call.await;
    let metrics = rlqs.metrics.rlqs();
    match &result {
        Ok(_) => metrics.ledger_call(start.elapsed(), None),
        Err(error) => {
            metrics.ledger_call(start.elapsed(), Some(error.kind()));
            if let Some(suppressed) = ratelimited::admit(&["rlqs_ledger_error", error.kind()]) {
                tracing::warn!(
                    event = "rlqs_ledger_error",
                    ledger = rlqs.ledger.kind(),
                    %error,
                    suppressed,
                    "the RLQS ledger did not answer: buckets keep their last assignment while its hold lasts"
                );
            }
        }
    }
    result
}
