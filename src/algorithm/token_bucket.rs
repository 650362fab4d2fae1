//! Token bucket: a bucket of B tokens (default L) refilled continuously at L per W;
//! a request of cost n takes n tokens, admitted iff at least n are there. Allows a
//! burst of B, then the sustained rate. Two numbers of state: tokens and when.

use super::{Division, mode, Decision, EPSILON, Layout, Model, Params, Stored, ceil_ms, floor_u64};

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    pub tokens: f64,
    /// When `tokens` was computed (ms since the epoch).
    pub at: u64,
}

pub fn decide(state: Option<State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let rate = params.limit as f64 / params.window_ms as f64;
    let burst = params.burst as f64;
    let (tokens, at) = state.map_or((burst, now_ms), |s| (s.tokens, s.at));
    // A clock that stepped back refills nothing rather than draining the bucket.
    let elapsed = now_ms.saturating_sub(at) as f64;
    // Past the instant the bucket is due full (the key's TTL), it is exactly full:
    // refill sums that round a hair below `burst` must not outlive the key in Redis.
    let full_at = at + ceil_ms((burst - tokens) / rate);
    let available = if now_ms >= full_at {
        burst
    } else {
        burst.min(tokens + elapsed * rate)
    };
    let n = cost as f64;
    if cost <= params.burst && n <= available + EPSILON {
        let left = available - n;
        let state = State {
            tokens: left,
            at: now_ms,
        };
        let reset = ceil_ms((burst - left) / rate);
        return (state, Decision::allow(floor_u64(left + EPSILON), reset));
    }
    let state = State {
        tokens: available,
        at: now_ms,
    };
    let reset = ceil_ms((burst - available) / rate);
    let retry = (cost <= params.burst).then(|| ceil_ms((n - available) / rate));
    (state, Decision::deny(reset, retry))
}

/// Once full again the bucket equals no state at all.
pub fn expires_at_ms(state: &State, params: &Params) -> u64 {
    let rate = params.limit as f64 / params.window_ms as f64;
    state.at + ceil_ms((params.burst as f64 - state.tokens) / rate).max(1)
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/token_bucket.lua`.
pub struct TokenBucket;

impl Model for TokenBucket {
    const NAME: &'static str = "token_bucket";
    const KEY_NAME: &'static str = "tb";
    const LUA: &'static str = include_str!("../../lua/token_bucket.lua");
    const USES_BURST: bool = true;
    const MAX_LIMIT: Option<u64> = None;
    const ALLOWS_ZERO_RATE: bool = false;
    const TAKES_MAX_DELAY: bool = false;
    const TAKES_TIME_ZONE: bool = false;
    const TAKES_LEASE: bool = false;
    const LAYOUT: Layout = Layout::Value;
    const CHARGE_REFUSAL: Option<&'static str> = None;
    const RELEASES: bool = true;
    const COUNTS_DENIALS: bool = false;
    const DIVISION: Division = Division::Rate;
    /// Tokens and when (doubles), then the key's expiry in grid steps (`lua/timed.lua`).
    const PACKED: Option<&'static str> = Some("<ddI");
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state.copied(), params, now_ms, cost)
    }

    /// Tokens may go negative: the debt the refill pays back at L per W.
    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        need: u64,
    ) -> (State, Decision) {
        let add = |s: &State| State {
            tokens: s.tokens - cost as f64,
            ..*s
        };
        mode::charge(|s, c| decide(s.copied(), params, now_ms, c), add, state, need)
    }

    /// Tokens back, never more than the bucket holds.
    fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        let burst = params.burst as f64;
        let sub = |s: &State| State {
            tokens: (s.tokens + cost as f64).min(burst),
            ..*s
        };
        mode::release(|s, c| decide(s.copied(), params, now_ms, c), sub, state)
    }

    fn expires_at_ms(state: &State, params: &Params, _now_ms: u64) -> u64 {
        expires_at_ms(state, params)
    }

    // token_bucket.lua: {t = tokens, a = when t was computed (unix ms)}
    // token_bucket.lua: tokens, when (unix ms) and the expiry's grid step, packed; 0.1
    // kept a hash {t, a} until its next write replaces it.
    /// The tokens back, never more than the bucket holds.
    fn refund(state: &State, params: &Params, _now_ms: u64, _token: i64, cost: u64) -> State {
        State {
            tokens: (state.tokens + cost as f64).min(params.burst as f64),
            ..*state
        }
    }

    fn describe(stored: &Stored) -> String {
        if let Stored::Hash(_) = stored {
            return format!(
                "tokens {} as of {} (unix ms; 0.1's hash, replaced at its next write)",
                stored.field("t"),
                stored.field("a")
            );
        }
        match stored.unpacked(Self::PACKED.unwrap_or_default()).as_deref() {
            Some([t, a, _]) => format!("tokens {t} as of {a} (unix ms)"),
            _ => format!("an unreadable value {:?}", stored.value()),
        }
    }

    fn heap_bytes(_: &State) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use proptest::prelude::*;

    fn params(limit: u64, window_ms: u64, burst: u64) -> Params {
        Params {
            algorithm: Algorithm::TokenBucket,
            limit,
            window_ms,
            burst,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn burst_then_sustained_rate() {
        let p = params(10, 1000, 5);
        let mut s = None;
        for left in (0..5).rev() {
            let (next, d) = decide(s, &p, 0, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
            s = Some(next);
        }
        let (_, d) = decide(s, &p, 0, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(100)));
        let (_, d) = decide(s, &p, 100, 1);
        assert!(d.allowed, "one token back after W/L");
        let (_, d) = decide(None, &p, 0, 6);
        assert_eq!(
            d.retry_after, None,
            "more than the bucket holds never passes"
        );
    }

    proptest! {
        /// Never more than B + rate x t in any interval of length t.
        #[test]
        fn never_more_than_burst_plus_rate(
            limit in 1u64..20,
            burst in 1u64..20,
            ops in proptest::collection::vec((0u64..4, 0u64..200), 1..300),
        ) {
            let p = params(limit, 1000, burst);
            let admitted = crate::algorithm::testing::replay(&p, 0, &ops);
            let violation = crate::algorithm::testing::burst_plus_rate_violation(&admitted, burst, limit, 1000);
            prop_assert!(violation.is_none(), "{:?}", violation);
        }
    }
}
