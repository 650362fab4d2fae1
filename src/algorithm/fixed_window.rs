//! Fixed window counting, envoyproxy/ratelimit's only algorithm: windows of `window`
//! seconds aligned to the Unix epoch (so every replica and every restart agrees on the
//! boundaries), admit iff `count + cost <= limit`.

use std::time::Duration;

use super::Decision;

/// The count within one window, identified by its start (seconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    pub window_start: u64,
    pub count: u64,
}

/// Parameters of one fixed-window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub limit: u64,
    /// Window length in seconds, at least 1.
    pub window: u64,
}

impl Params {
    pub fn window_start(&self, now_secs: u64) -> u64 {
        now_secs - now_secs % self.window.max(1)
    }

    /// Whole seconds to the next boundary, as envoyproxy/ratelimit reports them
    /// (`window - now % window`: a full window exactly on a boundary).
    pub fn reset_after(&self, now_secs: u64) -> Duration {
        let window = self.window.max(1);
        Duration::from_secs(window - now_secs % window)
    }
}

/// Decides one operation of `cost` hits at `now_secs`. A denied operation leaves the
/// state as it was; `cost == 0` only checks.
pub fn decide(state: Option<State>, params: Params, now_secs: u64, cost: u64) -> (State, Decision) {
    let start = params.window_start(now_secs);
    let count = match state {
        Some(s) if s.window_start == start => s.count,
        _ => 0,
    };
    let reset_after = params.reset_after(now_secs);
    let after = count.saturating_add(cost);
    if after <= params.limit {
        let state = State {
            window_start: start,
            count: after,
        };
        let decision = Decision {
            allowed: true,
            remaining: params.limit - after,
            reset_after,
            retry_after: None,
        };
        (state, decision)
    } else {
        let state = State {
            window_start: start,
            count,
        };
        // A cost above the limit fails in every window; otherwise the next window
        // starts empty and admits it.
        let retry_after = (cost <= params.limit).then_some(reset_after);
        let decision = Decision {
            allowed: false,
            remaining: 0,
            reset_after,
            retry_after,
        };
        (state, decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: Params = Params {
        limit: 3,
        window: 60,
    };

    #[test]
    fn admits_up_to_the_limit_then_denies_without_consuming() {
        let mut state = None;
        for expected in [2, 1, 0] {
            let (s, d) = decide(state, P, 120, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected);
            state = Some(s);
        }
        let (s, d) = decide(state, P, 130, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(s.count, 3);
        assert_eq!(d.retry_after, Some(Duration::from_secs(50)));
    }

    #[test]
    fn windows_align_to_the_epoch_and_reset() {
        let (s, d) = decide(None, P, 179, 3);
        assert_eq!(s.window_start, 120);
        assert_eq!(d.reset_after, Duration::from_secs(1));
        let (_, d) = decide(Some(s), P, 180, 1);
        assert!(d.allowed, "a new window starts empty");
        assert_eq!(d.reset_after, Duration::from_secs(60));
    }

    #[test]
    fn check_only_and_impossible_costs() {
        let (s, d) = decide(None, P, 0, 3);
        assert!(d.allowed);
        let (_, d) = decide(Some(s), P, 0, 0);
        assert!(d.allowed, "a full counter still passes a check-only call");
        assert_eq!(d.remaining, 0);
        let (_, d) = decide(None, P, 0, 4);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None, "a cost above the limit can never pass");
        let (_, d) = decide(None, P, 0, u64::MAX);
        assert!(!d.allowed, "huge costs saturate instead of wrapping");
    }

    proptest! {
        #[test]
        fn never_admits_more_than_the_limit_in_a_window(
            limit in 0u64..20,
            ops in proptest::collection::vec((0u64..5, 0u64..30), 1..200),
        ) {
            let params = Params { limit, window: 10 };
            let mut now = 1_000u64;
            let mut state = None;
            let mut admitted: std::collections::HashMap<u64, u64> = Default::default();
            for (cost, step) in ops {
                now += step / 10;
                let (s, d) = decide(state, params, now, cost);
                state = Some(s);
                if d.allowed {
                    *admitted.entry(params.window_start(now)).or_default() += cost;
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
