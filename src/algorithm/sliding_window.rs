//! Sliding window counter: two epoch-aligned fixed windows, the previous one weighted
//! by how much of it still overlaps the sliding window:
//! `estimate = prev x (W - elapsed) / W + curr`, admit iff `estimate + cost <= L`.
//! Two numbers of state; it smooths the boundary burst of fixed windows but assumes
//! the previous window's hits were spread evenly, so in the worst case (all of them
//! at its very end) it admits up to 2L in one interval of length W. With a
//! `time_zone` the windows are that zone's calendar periods (`calendar.rs`): W is the
//! current period's length, and the previous count is the period before's.
//!
//! Stored (`lua/sliding_window_value.lua`) as one integer below 2^53, so a hit is one
//! INCRBY: the window's identity (which of three consecutive windows, 1 to 3; 0 is a
//! key INCRBY just made) in the low [`ID_STEPS`], this window's count above it (up to
//! [`CURR_CAP`]), and the previous window's count in the 18 bits left: exactly below
//! [`PREV_EXACT`], and above it rounded up to 13 significant bits ([`round_up_prev`]),
//! at most 1/4096 more. Rounding up can only make the estimate larger: a window may
//! admit a few less after a previous window of more than 131,071 hits, never more.

use super::{Division, mode, Decision, Layout, Model, Params, Stored, ceil_ms, floor_u64};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    /// Start of the current window (ms since the epoch).
    pub start: u64,
    pub prev: u64,
    pub curr: u64,
}

/// The values a window's identity takes, kept in the low part of the value.
pub const ID_STEPS: u64 = 4;
/// The largest count of a window the value keeps (past it every answer is the same,
/// as the fixed window's `CAP`).
pub const CURR_CAP: u64 = (1 << 33) - 1;
/// Previous counts below this are kept exactly.
pub const PREV_EXACT: u64 = 1 << 17;
/// Above [`PREV_EXACT`], a previous count is kept as `(MANTISSA + m) x 2^(e + 5)`
/// (12 bits of m, 5 of e).
pub const MANTISSA: u64 = 1 << 12;

/// The previous count the value can hold for `prev`: `prev` itself below
/// [`PREV_EXACT`], else the smallest `(MANTISSA + m) x 2^(e + 5)` at least `prev`.
pub fn round_up_prev(prev: u64) -> u64 {
    if prev < PREV_EXACT {
        return prev;
    }
    let mut scale = 32u64;
    loop {
        let mantissa = prev.div_ceil(scale);
        if mantissa < 2 * MANTISSA {
            return mantissa * scale;
        }
        scale *= 2;
    }
}

/// What a stored previous-count code stands for (the inverse of the Lua's encoding,
/// for `inspect`).
fn prev_of_code(code: u64) -> u64 {
    if code < PREV_EXACT {
        return code;
    }
    let m = code - PREV_EXACT;
    (MANTISSA + m % MANTISSA) << (m / MANTISSA + 5)
}

/// The window holding an instant: where it and the one before start, and the
/// lengths of it and of the next (all ms).
struct Frame {
    /// `None` without a calendar: the window before starts `window` earlier.
    prev_start: Option<u64>,
    start: u64,
    window: u64,
    next_window: u64,
}

fn frame(params: &Params, now_ms: u64) -> Frame {
    if let Some(calendar) = params.calendar {
        let p = calendar.period_at(now_ms);
        return Frame {
            prev_start: Some(p.prev_start),
            start: p.start,
            window: p.end - p.start,
            next_window: p.next_end - p.end,
        };
    }
    let window = params.window_ms.max(1);
    Frame {
        prev_start: None,
        start: now_ms - now_ms % window,
        window,
        next_window: window,
    }
}

/// The state as seen in window `f`: rolled forward when windows have passed.
fn roll(state: Option<State>, f: &Frame) -> State {
    let (start, window) = (f.start, f.window);
    let follows = |s: &State| match f.prev_start {
        Some(prev) => s.start == prev,
        None => s.start + window == start,
    };
    match state {
        Some(s) if s.start == start => s,
        Some(s) if follows(&s) => State {
            start,
            prev: round_up_prev(s.curr),
            curr: 0,
        },
        _ => State {
            start,
            prev: 0,
            curr: 0,
        },
    }
}

pub fn decide(state: Option<State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let f = frame(params, now_ms);
    let (window, next_window) = (f.window, f.next_window);
    // Always inside the frame, but for a calendar's clock past year 9999.
    let now_ms = now_ms.min(f.start + window.saturating_sub(1));
    let s = roll(state, &f);
    let elapsed = now_ms - s.start;
    let weight = (window - elapsed) as f64 / window as f64;
    let estimate = s.prev as f64 * weight + s.curr as f64;
    let limit = params.limit as f64;
    let reset_ms = window - elapsed;
    if cost <= params.limit && estimate + cost as f64 <= limit {
        let after = State {
            curr: s.curr + cost,
            ..s
        };
        let remaining = floor_u64(limit - (estimate + cost as f64));
        return (after, Decision::allow(remaining, reset_ms));
    }
    if cost > params.limit {
        return (s, Decision::deny(reset_ms, None));
    }
    let need = limit - cost as f64;
    let retry_ms = if s.curr as f64 <= need && s.prev > 0 {
        // Later in this window the previous window's weight has shrunk enough.
        let at = window as f64 * (1.0 - (need - s.curr as f64) / s.prev as f64);
        ceil_ms(at - elapsed as f64)
    } else {
        // Only in the next window, once this window's hits weigh less.
        let at = if s.curr as f64 > need {
            next_window as f64 * (1.0 - need / s.curr as f64)
        } else {
            0.0
        };
        reset_ms + ceil_ms(at)
    };
    (s, Decision::deny(reset_ms, Some(retry_ms)))
}

pub fn expires_at_ms(state: &State, params: &Params) -> u64 {
    match params.calendar {
        Some(calendar) => calendar.period_at(state.start).next_end,
        None => state.start + 2 * params.window_ms,
    }
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/sliding_window.lua`.
pub struct SlidingWindow;

impl Model for SlidingWindow {
    const NAME: &'static str = "sliding_window";
    const KEY_NAME: &'static str = "sw";
    // The value's layout in a file of its own, before the module that reads it.
    const LUA: &'static str = concat!(
        include_str!("../../lua/sliding_window_value.lua"),
        "\n",
        include_str!("../../lua/sliding_window.lua")
    );
    const USES_BURST: bool = false;
    const MAX_LIMIT: Option<u64> = None;
    const ALLOWS_ZERO_RATE: bool = false;
    const TAKES_MAX_DELAY: bool = false;
    const LAYOUT: Layout = Layout::Value;
    const TAKES_TIME_ZONE: bool = true;
    const TAKES_LEASE: bool = false;
    const CHARGE_REFUSAL: Option<&'static str> = None;
    const RELEASES: bool = true;
    const COUNTS_DENIALS: bool = false;
    const LUA_CONSTANTS: &'static [(&'static str, u64)] = &[
        ("ID_STEPS", ID_STEPS),
        ("CURR_CAP", CURR_CAP),
        ("PREV_EXACT", PREV_EXACT),
        ("MANTISSA", MANTISSA),
    ];
    const DIVISION: Division = Division::Refused(
        "its estimate weighs the previous window's count, so a share that moved between the two windows does not bound what a region admits; use fixed_window",
    );
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
            curr: s.curr.saturating_add(cost),
            ..*s
        };
        mode::charge(|s, c| decide(s.copied(), params, now_ms, c), add, state, need)
    }

    /// Gives back this window's hits first, then the previous window's (whose weight
    /// still counts): never below zero in either.
    fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        let sub = |s: &State| {
            let from_curr = s.curr.min(cost);
            let from_prev = s.prev.min(cost - from_curr);
            State {
                curr: s.curr - from_curr,
                prev: round_up_prev(s.prev - from_prev),
                ..*s
            }
        };
        mode::release(|s, c| decide(s.copied(), params, now_ms, c), sub, state)
    }

    fn expires_at_ms(state: &State, params: &Params, _now_ms: u64) -> u64 {
        expires_at_ms(state, params)
    }

    /// The token is the window the hits went into: still the stored window's count, or,
    /// the stored state being this window's, the previous one's (kept as the value
    /// holds it).
    fn refund(state: &State, params: &Params, now_ms: u64, token: i64, cost: u64) -> State {
        let f = frame(params, now_ms);
        let previous = f.prev_start.unwrap_or(f.start.saturating_sub(f.window));
        if i64::try_from(state.start) == Ok(token) {
            State {
                curr: state.curr - state.curr.min(cost),
                ..*state
            }
        } else if state.start == f.start && i64::try_from(previous) == Ok(token) {
            State {
                prev: round_up_prev(state.prev - state.prev.min(cost)),
                ..*state
            }
        } else {
            *state
        }
    }

    // sliding_window.lua: one integer, the previous count's code, this window's count
    // and its identity (see the module's note); 0.1 kept a hash {s = window start
    // (unix ms), p = previous, c = current} until its next write replaces it.
    fn describe(stored: &Stored) -> String {
        if let Stored::Hash(_) = stored {
            return format!(
                "count {} in the window from {} (unix ms), {} in the one before (0.1's hash, replaced at its next write)",
                stored.field("c"),
                stored.field("s"),
                stored.field("p")
            );
        }
        let Ok(v) = stored.value().parse::<u64>() else {
            return format!("an unreadable value {:?}", stored.value());
        };
        let id = v % ID_STEPS;
        let curr = (v / ID_STEPS) % (CURR_CAP + 1);
        let code = v / ID_STEPS / (CURR_CAP + 1);
        format!(
            "count {curr} in this window (identity {id} of 1 to 3), {} in the one before",
            prev_of_code(code)
        )
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

    fn params(limit: u64, window_ms: u64) -> Params {
        Params {
            algorithm: Algorithm::SlidingWindow,
            limit,
            window_ms,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn the_previous_window_weighs_in_linearly() {
        let p = params(10, 1000);
        let mut s = None;
        for _ in 0..10 {
            let (next, d) = decide(s, &p, 999, 1);
            assert!(d.allowed);
            s = Some(next);
        }
        // Half way through the next window the previous 10 weigh 5.
        let (_, d) = decide(s, &p, 1500, 5);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        let (_, d) = decide(s, &p, 1500, 6);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(100)));
    }

    #[test]
    fn a_previous_count_is_exact_below_2_17_and_rounded_up_above() {
        assert_eq!(round_up_prev(0), 0);
        assert_eq!(round_up_prev(PREV_EXACT - 1), PREV_EXACT - 1);
        assert_eq!(round_up_prev(PREV_EXACT), PREV_EXACT);
        assert_eq!(round_up_prev(PREV_EXACT + 1), PREV_EXACT + 32);
        for prev in [200_000u64, 1_000_000, 999_999_999, CURR_CAP] {
            let up = round_up_prev(prev);
            assert!(up >= prev && up - prev <= prev / MANTISSA, "{prev} -> {up}");
            assert_eq!(round_up_prev(up), up, "idempotent");
        }
    }

    proptest! {
        /// The bound the README states: at most 2L in any interval of length W.
        #[test]
        fn admits_at_most_twice_the_limit_in_any_window(
            limit in 1u64..20,
            ops in proptest::collection::vec((0u64..4, 0u64..400), 1..300),
        ) {
            let p = params(limit, 1000);
            let admitted = crate::algorithm::testing::replay(&p, 10_000, &ops);
            let most = crate::algorithm::testing::max_in_any_interval(&admitted, 1000);
            prop_assert!(most <= 2 * limit, "{} in one window", most);
        }
    }
}
