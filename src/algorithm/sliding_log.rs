//! Sliding log: the timestamp of every admitted hit within the last W, trimmed before
//! counting; admit iff `count + cost <= L`. Exact in every interval of length W, at the
//! price of memory proportional to L per key, which is why configs are refused above
//! [`MAX_LIMIT`].

use std::collections::VecDeque;

use super::{Division, mode, Decision, Layout, Model, Params, Stored};

/// The largest `requests_per_unit` a sliding_log rule may have. Redis stores each hit
/// as a sorted-set member: measured with `MEMORY USAGE` (tests/it/memory_usage.rs), a full
/// log costs about 120 bytes per hit, 1.2 MB at 10,000; beyond that one busy client
/// could cost many megabytes, and every decision reads the whole log.
pub const MAX_LIMIT: u64 = 10_000;

/// Hit timestamps (ms), oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub hits: VecDeque<u64>,
}

pub fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let window = params.window_ms;
    let mut s = state.cloned().unwrap_or_default();
    // A hit at exactly now - W has left the window (Redis trims scores <= now - W).
    while s.hits.front().is_some_and(|&t| t + window <= now_ms) {
        s.hits.pop_front();
    }
    let count = s.hits.len() as u64;
    if cost > params.limit {
        let reset = reset_ms(&s, window, now_ms);
        return (s, Decision::deny(reset, None));
    }
    if count + cost <= params.limit {
        s.hits.extend(std::iter::repeat_n(now_ms, cost as usize));
        let reset = reset_ms(&s, window, now_ms);
        return (s, Decision::allow(params.limit - count - cost, reset));
    }
    // The (count + cost - L)-th oldest hit must leave first.
    let must_leave = (count + cost - params.limit) as usize;
    let retry = s.hits[must_leave - 1] + window - now_ms;
    let reset = reset_ms(&s, window, now_ms);
    (s, Decision::deny(reset, Some(retry)))
}

/// Until the oldest hit leaves the window (0 for an empty log).
fn reset_ms(state: &State, window: u64, now_ms: u64) -> u64 {
    state.hits.front().map_or(0, |&t| t + window - now_ms)
}

/// Gives back `cost` hits of the group `token` names (its base, in microseconds: the
/// group's instant, made unique per key in Redis): hits of one millisecond decide
/// alike, so any of that instant's go.
pub fn refund(state: &State, token: i64, cost: u64) -> State {
    let at = u64::try_from(token.div_euclid(1000)).unwrap_or(0);
    let mut s = state.clone();
    let mut left = cost;
    s.hits.retain(|&t| {
        if left > 0 && t == at {
            left -= 1;
            return false;
        }
        true
    });
    s
}

pub fn expires_at_ms(state: &State, params: &Params, now_ms: u64) -> u64 {
    state.hits.back().map_or(now_ms, |&t| t + params.window_ms)
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/sliding_log.lua`.
pub struct SlidingLog;

impl Model for SlidingLog {
    const NAME: &'static str = "sliding_log";
    const KEY_NAME: &'static str = "sl";
    const LUA: &'static str = include_str!("../../lua/sliding_log.lua");
    const USES_BURST: bool = false;
    const MAX_LIMIT: Option<u64> = Some(MAX_LIMIT);
    const ALLOWS_ZERO_RATE: bool = false;
    const TAKES_MAX_DELAY: bool = false;
    const TAKES_TIME_ZONE: bool = false;
    const TAKES_LEASE: bool = false;
    const LAYOUT: Layout = Layout::SortedSet;
    const CHARGE_REFUSAL: Option<&'static str> = Some(
        "sliding_log keeps one sorted-set entry per hit, so a charge past the limit \
         would store one entry per token without bound (a charge of a million tokens is a \
         million members); its memory bound (requests_per_unit at most 10000) is what \
         makes it safe: use fixed_window, sliding_window, token_bucket or gcra",
    );
    /// A release cannot say which hit it gives back, and a hit's place in the log is
    /// when it leaves the window: releases are ignored (answered, counted).
    const RELEASES: bool = false;
    const COUNTS_DENIALS: bool = false;
    const DIVISION: Division = Division::Refused(
        "it limits every span of W, not epoch-aligned windows, so per-window shares do not bound it; use fixed_window",
    );
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state, params, now_ms, cost)
    }

    /// Never called: [`Self::CHARGE_REFUSAL`] refuses charges at load.
    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        _need: u64,
    ) -> (State, Decision) {
        decide(state, params, now_ms, cost)
    }

    fn release(state: Option<&State>, params: &Params, now_ms: u64, _cost: u64) -> (State, Decision) {
        mode::release(|s, c| decide(s, params, now_ms, c), State::clone, state)
    }

    fn expires_at_ms(state: &State, params: &Params, now_ms: u64) -> u64 {
        expires_at_ms(state, params, now_ms)
    }

    fn refund(state: &State, _params: &Params, _now_ms: u64, token: i64, cost: u64) -> State {
        refund(state, token, cost)
    }

    // sliding_log.lua: a sorted set, one member per hit still in the window
    fn describe(stored: &Stored) -> String {
        format!("{} hit(s) in the window", stored.members())
    }

    /// One timestamp per hit in the window.
    fn heap_bytes(state: &State) -> usize {
        state.hits.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use proptest::prelude::*;

    fn params(limit: u64, window_ms: u64) -> Params {
        Params {
            algorithm: Algorithm::SlidingLog,
            limit,
            window_ms,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn hits_leave_exactly_one_window_later() {
        let p = params(2, 1000);
        let (s, _) = decide(None, &p, 100, 1);
        let (s, _) = decide(Some(&s), &p, 600, 1);
        let (s, d) = decide(Some(&s), &p, 1099, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(1)));
        let (_, d) = decide(Some(&s), &p, 1100, 1);
        assert!(d.allowed);
        assert_eq!(d.reset_after, std::time::Duration::from_millis(500));
    }

    proptest! {
        #[test]
        fn never_more_than_the_limit_in_any_window(
            limit in 1u64..15,
            ops in proptest::collection::vec((0u64..4, 0u64..300), 1..300),
        ) {
            let p = params(limit, 1000);
            let mut now = 10_000u64;
            let mut state = State::default();
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (cost, step) in ops {
                now += step;
                let (s, d) = decide(Some(&state), &p, now, cost);
                state = s;
                if d.allowed {
                    admitted.push((now, cost));
                    prop_assert!(d.remaining <= limit);
                }
            }
            let most = crate::algorithm::testing::max_in_any_interval(&admitted, 1000);
            prop_assert!(most <= limit, "{} in one window", most);
        }
    }
}
