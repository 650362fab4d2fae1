//! Fixed window counting, envoyproxy/ratelimit's only algorithm: windows of W aligned
//! to the Unix epoch (so every replica and every restart agrees on the boundaries),
//! admit iff `count + cost <= L`. Times are whole seconds, as envoyproxy/ratelimit
//! reports them. With a `time_zone` the windows are that zone's calendar periods
//! (`calendar.rs`) instead.

use super::{Division, mode, Decision, Layout, Model, Params, Stored};

/// The count within one window, identified by its start (seconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub window_start: u64,
    pub count: u64,
}

fn window_secs(params: &Params) -> u64 {
    (params.window_ms / 1000).max(1)
}

/// The window holding `now_ms`: its start (s) and the time until its end (whole
/// seconds, in ms).
fn window(params: &Params, now_ms: u64) -> (u64, u64) {
    let now = now_ms / 1000;
    if let Some(calendar) = params.calendar {
        let period = calendar.period_at(now_ms);
        // Past year 9999 the clock reads as the period's last instant (`calendar.rs`).
        return (period.start / 1000, (period.end / 1000).saturating_sub(now) * 1000);
    }
    let window = window_secs(params);
    // envoyproxy/ratelimit's `window - now % window`: a full window on a boundary.
    (now - now % window, (window - now % window) * 1000)
}

pub fn decide(state: Option<State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let (start, reset_ms) = window(params, now_ms);
    let count = match state {
        Some(s) if s.window_start == start => s.count,
        _ => 0,
    };
    let after = count.saturating_add(cost);
    if after <= params.limit {
        let state = State {
            window_start: start,
            count: after,
        };
        (state, Decision::allow(params.limit - after, reset_ms))
    } else {
        let state = State {
            window_start: start,
            count,
        };
        // A cost above the limit fails in every window; otherwise the next window
        // starts empty and admits it.
        let retry = (cost <= params.limit).then_some(reset_ms);
        (state, Decision::deny(reset_ms, retry))
    }
}

pub fn expires_at_ms(state: &State, params: &Params) -> u64 {
    match params.calendar {
        Some(calendar) => calendar.period_at(state.window_start * 1000).end,
        None => (state.window_start + window_secs(params)) * 1000,
    }
}

/// How many low bits of the stored value hold the window's start (`lua/fixed_window.lua`).
pub const VALUE_SHIFT: u32 = 20;

/// The largest count the value keeps: far above any u32 limit plus a u32 cost (past
/// it every answer is the same), and `CAP << VALUE_SHIFT` stays below 2^53, where a
/// double (Lua's number) stops holding the window's bits exactly.
pub const CAP: u64 = (1 << 33) - 1;

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/fixed_window.lua`.
pub struct FixedWindow;

impl Model for FixedWindow {
    const NAME: &'static str = "fixed_window";
    const KEY_NAME: &'static str = "fw";
    const LUA: &'static str = include_str!("../../lua/fixed_window.lua");
    const USES_BURST: bool = false;
    const MAX_LIMIT: Option<u64> = None;
    const ALLOWS_ZERO_RATE: bool = true;
    const TAKES_MAX_DELAY: bool = false;
    const LAYOUT: Layout = Layout::Value;
    const TAKES_TIME_ZONE: bool = true;
    const TAKES_LEASE: bool = false;
    const CHARGE_REFUSAL: Option<&'static str> = None;
    const RELEASES: bool = true;
    const COUNTS_DENIALS: bool = false;
    const DIVISION: Division = Division::Window;
    const LUA_CONSTANTS: &'static [(&'static str, u64)] = &[("SHIFT", 1 << VALUE_SHIFT), ("CAP", CAP)];
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state.copied(), params, now_ms, cost)
    }

    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        need: u64,
    ) -> (State, Decision) {
        let add = |s: &State| State {
            count: s.count.saturating_add(cost),
            ..*s
        };
        mode::charge(|s, c| decide(s.copied(), params, now_ms, c), add, state, need)
    }

    /// Gives back hits of the current window only: an earlier window's are gone.
    fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        let sub = |s: &State| State {
            count: s.count.saturating_sub(cost),
            ..*s
        };
        mode::release(|s, c| decide(s.copied(), params, now_ms, c), sub, state)
    }

    fn expires_at_ms(state: &State, params: &Params, _now_ms: u64) -> u64 {
        expires_at_ms(state, params)
    }

    /// The token is the window's start: the count goes down while it is that window.
    fn refund(state: &State, _params: &Params, _now_ms: u64, token: i64, cost: u64) -> State {
        if i64::try_from(state.window_start) != Ok(token) {
            return *state;
        }
        State {
            count: state.count - state.count.min(cost),
            ..*state
        }
    }

    // fixed_window.lua: one integer, hits * 2^20 + the window's start (unix s) mod 2^20; a
    // hash {w = window start (unix s), c = hits} from releases before that layout
    // until its next write replaces it.
    fn describe(stored: &Stored) -> String {
        if let Stored::Hash(_) = stored {
            return format!(
                "count {} in the window from {} (unix s; the hash of earlier releases, \
                 replaced by a value at its next hit)",
                stored.field("c"),
                stored.field("w")
            );
        }
        match stored.value().parse::<u64>() {
            Ok(n) => format!(
                "count {} in the window from {} (unix s, mod 2^20)",
                n >> VALUE_SHIFT,
                n & ((1 << VALUE_SHIFT) - 1)
            ),
            Err(_) => format!("an unreadable value {:?}", stored.value()),
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
    use std::time::Duration;

    fn params(limit: u64, window_secs: u64) -> Params {
        Params {
            algorithm: Algorithm::FixedWindow,
            limit,
            window_ms: window_secs * 1000,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn admits_up_to_the_limit_then_denies_without_consuming() {
        let p = params(3, 60);
        let mut state = None;
        for expected in [2, 1, 0] {
            let (s, d) = decide(state, &p, 120_000, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected);
            state = Some(s);
        }
        let (s, d) = decide(state, &p, 130_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(s.count, 3);
        assert_eq!(d.retry_after, Some(Duration::from_secs(50)));
    }

    #[test]
    fn windows_align_to_the_epoch_and_reset() {
        let p = params(3, 60);
        let (s, d) = decide(None, &p, 179_999, 3);
        assert_eq!(s.window_start, 120);
        assert_eq!(d.reset_after, Duration::from_secs(1));
        let (_, d) = decide(Some(s), &p, 180_000, 1);
        assert!(d.allowed, "a new window starts empty");
        assert_eq!(d.reset_after, Duration::from_secs(60));
    }

    #[test]
    fn check_only_and_impossible_costs() {
        let p = params(3, 60);
        let (s, d) = decide(None, &p, 0, 3);
        assert!(d.allowed);
        let (_, d) = decide(Some(s), &p, 0, 0);
        assert!(d.allowed, "a full counter still passes a check-only call");
        assert_eq!(d.remaining, 0);
        let (_, d) = decide(None, &p, 0, 4);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None, "a cost above the limit can never pass");
        let (_, d) = decide(None, &p, 0, u64::MAX);
        assert!(!d.allowed, "huge costs saturate instead of wrapping");
    }

    proptest! {
        #[test]
        fn never_admits_more_than_the_limit_in_a_window(
            limit in 0u64..20,
            ops in proptest::collection::vec((0u64..5, 0u64..3000), 1..200),
        ) {
            let p = params(limit, 10);
            let mut now = 1_000_000u64;
            let mut state = None;
            let mut admitted: std::collections::HashMap<u64, u64> = Default::default();
            for (cost, step) in ops {
                now += step;
                let (s, d) = decide(state, &p, now, cost);
                state = Some(s);
                if d.allowed {
                    *admitted.entry(s.window_start).or_default() += cost;
                    prop_assert_eq!(d.remaining, limit - s.count);
                }
                prop_assert!(d.reset_after.as_secs() >= 1 && d.reset_after.as_secs() <= 10);
            }
            for total in admitted.values() {
                prop_assert!(*total <= limit);
            }
        }
    }
}
