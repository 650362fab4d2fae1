//! What one bucket of a report is answered, from the ledger's grant:
//! - a grant of tokens: a token bucket of them per window, for the assignment TTL;
//! - a grant of zero: a denying assignment (`DENY_ALL`) until the next division;
//! - a resumed bucket nothing has been sent for on this stream: nothing, until the
//!   grant is the stream's whole share (its Envoy still enforces its old assignment,
//!   which the ledger still counts on the old claim), or until just before that old
//!   assignment can run out (then whatever is granted, zero included);
//! - a resumed bucket of a ledger younger than a report period (a memory ledger after
//!   a restart: it has not heard every Envoy yet): nothing, for that report;
//! - no grant (the ledger did not answer): the last assignment again, with a TTL
//!   shortened to what remains of the ledger's hold on it, so no Envoy enforces a
//!   share longer than the ledger counts it; nothing once that has run out;
//! - a bucket no rule limits: `ALLOW_ALL`; an idle one: abandoned.

use std::time::{Duration, Instant};

use super::assign;
use super::bucket::bucket_id;
use super::ledger::{Granted, LedgerError};
use super::options::DELIVERY_MARGIN;
use super::state::{BucketState, Sent, Step, StreamState};
use super::{Rlqs, bucket::Shared};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::r#type::v3::rate_limit_strategy::Strategy;

/// The action for one bucket, if any, with the bookkeeping it implies.
pub(super) fn answer(
    state: &mut StreamState,
    rlqs: &Rlqs,
    step: Step,
    granted: Option<Result<Granted, LedgerError>>,
    now: Instant,
) -> Option<BucketAction> {
    let ttl = rlqs.options.assignment_ttl;
    if step.abandon {
        state.remove(rlqs, &step.key)?;
        return Some(assign::abandon(&bucket_id(&step.key)));
    }
    let bucket = state.buckets.get_mut(&step.key)?;
    let id = bucket_id(&step.key);
    let shared: &Shared = match &step.target.kind {
        Err(why) => {
            let metrics = rlqs.metrics.rlqs();
            metrics.allowed_in_full(&bucket.domain, &bucket.rule, why.name());
            set_rate(rlqs, bucket, f64::INFINITY);
            bucket.sent = None;
            return Some(assign::assign(&id, assign::allow_all(), ttl));
        }
        Ok(shared) => shared,
    };
    let granted = match granted {
        Some(Ok(granted)) => granted,
        _ => {
            // The ledger did not answer: the last assignment holds while the ledger
            // still counts it.
            let sent = bucket.sent?;
            let left = (sent.at + ttl).saturating_duration_since(now);
            let left = Duration::from_secs(left.as_secs());
            if left.is_zero() {
                return None;
            }
            return Some(assign::assign(&id, strategy(sent, shared), left));
        }
    };
    bucket.ledger_streams = granted.streams;
    if step.first_resumed && granted.age < rlqs.options.report_period {
        return None;
    }
    // A resumed bucket's Envoy enforces its old assignment, which the ledger counts
    // on its old claim until its TTL runs out: rather than cut it to what is free
    // now, wait for the stream's whole share. Not past the old assignment's end,
    // though (its last renewal came at most a report period before this stream):
    // then Envoy would fall to its no_assignment_behavior, often ALLOW_ALL.
    // Only on a claim of the stream's own, though: a claim taken over holds the
    // Envoy's old assignment itself, so what it is granted must reach the Envoy.
    let wait = ttl.saturating_sub(rlqs.options.report_period + DELIVERY_MARGIN);
    let waiting = bucket.resumed && bucket.sent.is_none() && now < bucket.first_seen + wait;
    let own_claim = granted.on_alias || state.name == state.own;
    if waiting && own_claim && (granted.partial || granted.tokens == 0) {
        return None;
    }
    let sent = Sent {
        tokens: granted.tokens,
        window_secs: shared.window_secs,
        at: now,
    };
    bucket.sent = Some(sent);
    set_rate(
        rlqs,
        bucket,
        granted.tokens as f64 / shared.window_secs as f64,
    );
    Some(assign::assign(&id, strategy(sent, shared), ttl))
}

/// A share as Envoy takes it: a token bucket, or a denial for none.
fn strategy(sent: Sent, shared: &Shared) -> Strategy {
    if sent.tokens == 0 {
        return assign::deny_all();
    }
    Strategy::TokenBucket(assign::token_bucket(
        sent.tokens,
        shared.tokens,
        sent.window_secs,
        shared.burst,
    ))
}

/// Records `bucket`'s new assigned rate (infinite: allowed in full) in it and the gauge.
fn set_rate(rlqs: &Rlqs, bucket: &mut BucketState, rate: f64) {
    rlqs.metrics
        .rlqs()
        .rate_changed(&bucket.domain, &bucket.rule, bucket.rate, rate);
    bucket.rate = rate;
}
