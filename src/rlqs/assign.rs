//! The actions sent to Envoy, shaped for what Envoy 1.40 does with them:
//! - a share is a token bucket (`requests_per_time_unit` is not implemented: Envoy
//!   logs an error and does not limit);
//! - the fill interval is the rule's window in whole seconds (Envoy turns an interval
//!   under 1 s into an unlimited rate) and stays the same for a bucket, because Envoy
//!   judges a token bucket changed by `tokens_per_fill`, `max_tokens` and the
//!   interval's nanoseconds only: the share is `tokens_per_fill`, its tokens per window;
//! - every assignment carries a TTL (without one it expires at once), restarted by
//!   every answer;
//! - a share of nothing is `DENY_ALL` (a token bucket needs a token per fill);
//! - abandoning erases the bucket in Envoy, and its next request subscribes again.

use std::time::Duration;

use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use crate::proto::envoy::service::rate_limit_quota::v3::BucketId;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};

/// Seconds of a stream's own rate a bucket holds when the rule names no `burst`: room
/// for requests that arrive together, small enough that a full bucket is no flood.
pub const BURST_SECONDS: u64 = 2;

/// A stream's token bucket for `share` of `tokens` per `window_secs`: its rate is
/// share / window; its capacity the rule's `burst` in proportion, or
/// [`BURST_SECONDS`] of its rate (at least 2 tokens, at most the share).
pub fn token_bucket(share: u64, tokens: u64, window_secs: u64, burst: Option<u64>) -> TokenBucket {
    let share = share.clamp(1, u64::from(u32::MAX));
    let max_tokens = match burst {
        Some(b) => (b as f64 * share as f64 / tokens.max(1) as f64).round() as u64,
        None => (share * BURST_SECONDS).div_ceil(window_secs.max(1)).max(2),
    }
    .clamp(1, share);
    TokenBucket {
        max_tokens: max_tokens as u32,
        tokens_per_fill: Some(share as u32),
        fill_interval: Some(seconds(window_secs.max(1))),
        name: String::new(),
    }
}

/// The assignment action for `strategy`, held for `ttl`.
pub fn assign(bucket_id: &BucketId, strategy: Strategy, ttl: Duration) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id.clone()),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl.as_secs().max(1))),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

pub fn allow_all() -> Strategy {
    Strategy::BlanketRule(BlanketRule::AllowAll as i32)
}

pub fn deny_all() -> Strategy {
    Strategy::BlanketRule(BlanketRule::DenyAll as i32)
}

pub fn abandon(bucket_id: &BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id.clone()),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn seconds(secs: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_tokens_per_window_in_whole_seconds() {
        let b = token_bucket(485, 600, 60, None);
        assert_eq!(b.tokens_per_fill, Some(485));
        assert_eq!(b.fill_interval.unwrap().seconds, 60);
        assert_eq!(b.fill_interval.unwrap().nanos, 0);
        assert_eq!(b.max_tokens, 17);
        assert_eq!(token_bucket(57, 600, 60, None).max_tokens, 2);
        assert_eq!(token_bucket(1, 600, 60, None).max_tokens, 1);
        assert_eq!(token_bucket(300, 600, 60, Some(100)).max_tokens, 50);
    }
}
