//! Leaky bucket as a shaper: a queue of B slots (default L) drained at L per W. An
//! admitted request is given the next free slot and answered when its turn comes (the
//! decision carries the wait), so requests leave at most one per W / L; a request
//! that finds no room, or would wait longer than `max_delay`, is OVER_LIMIT at once.
//! For outbound traffic to a third party that enforces its own rate.

use std::time::Duration;

use super::{Division, mode, Decision, EPSILON, Layout, Model, Params, Stored, ceil_ms, floor_u64};

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    /// When the queue is drained: the next free slot (ms since the epoch).
    pub tat: f64,
}

pub fn decide(state: Option<State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let t = params.emission_interval();
    let now = now_ms as f64;
    let slot = state.map_or(now, |s| s.tat).max(now);
    let wait = slot - now;
    let room = params.burst as f64 - wait / t;
    let n = cost as f64;
    let patient = params
        .max_delay_ms
        .is_none_or(|max| wait <= max as f64 + EPSILON);
    if cost <= params.burst && n <= room + EPSILON && patient {
        let tat = slot + n * t;
        let mut decision = Decision::allow(floor_u64(room - n + EPSILON), ceil_ms(tat - now));
        // A check-only call takes no slot and so waits for nothing.
        if cost > 0 {
            decision.delay = Duration::from_micros(ceil_ms(wait * 1000.0));
        }
        return (State { tat }, decision);
    }
    let retry = (cost <= params.burst).then(|| {
        let for_room = (n - room) * t;
        let for_patience = params.max_delay_ms.map_or(0.0, |max| wait - max as f64);
        ceil_ms(for_room.max(for_patience))
    });
    (State { tat: slot }, Decision::deny(ceil_ms(wait), retry))
}

pub fn expires_at_ms(state: &State, now_ms: u64) -> u64 {
    now_ms + ceil_ms(state.tat - now_ms as f64).max(1)
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/leaky_bucket.lua`.
pub struct LeakyBucket;

impl Model for LeakyBucket {
    const NAME: &'static str = "leaky_bucket";
    const KEY_NAME: &'static str = "lb";
    const LUA: &'static str = include_str!("../../lua/leaky_bucket.lua");
    const USES_BURST: bool = true;
    const MAX_LIMIT: Option<u64> = None;
    const ALLOWS_ZERO_RATE: bool = false;
    const TAKES_MAX_DELAY: bool = true;
    const TAKES_TIME_ZONE: bool = false;
    const TAKES_LEASE: bool = false;
    const LAYOUT: Layout = Layout::Value;
    const CHARGE_REFUSAL: Option<&'static str> = Some(
        "leaky_bucket shapes: an admitted request waits for its slot in the queue, and a \
         charge counted after the response cannot take a slot; an overdrawn queue would \
         hold later requests past max_delay: use gcra or token_bucket",
    );
    /// Later requests were already given slots spaced after the released ones, and
    /// moving the queue forward under them would release two closer than W / L:
    /// releases are ignored (answered, counted).
    const RELEASES: bool = false;
    const COUNTS_DENIALS: bool = false;
    const DIVISION: Division = Division::Refused("it shapes one queue, which cannot be split between regions");
    /// As gcra's: the drain time, then the key's expiry in grid steps.
    const PACKED: Option<&'static str> = Some("<dI");
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state.copied(), params, now_ms, cost)
    }

    /// Never called: [`Self::CHARGE_REFUSAL`] refuses charges at load.
    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        _need: u64,
    ) -> (State, Decision) {
        decide(state.copied(), params, now_ms, cost)
    }

    fn release(state: Option<&State>, params: &Params, now_ms: u64, _cost: u64) -> (State, Decision) {
        mode::release(|s, c| decide(s.copied(), params, now_ms, c), |s| *s, state)
    }

    fn expires_at_ms(state: &State, _params: &Params, now_ms: u64) -> u64 {
        expires_at_ms(state, now_ms)
    }

    // leaky_bucket.lua: when the queue drains, one number
    /// A slot is taken back only if no request queued behind it since (the token is the
    /// drain time this operation left, in microseconds): later requests were already
    /// spaced after it, and moving the queue forward under them could release two
    /// closer than W / L.
    fn refund(state: &State, params: &Params, _now_ms: u64, token: i64, cost: u64) -> State {
        if (state.tat * 1000.0).floor() as i64 != token {
            return *state;
        }
        State {
            tat: state.tat - cost as f64 * params.emission_interval(),
        }
    }

    fn describe(stored: &Stored) -> String {
        match stored.unpacked(Self::PACKED.unwrap_or_default()).as_deref() {
            Some([tat, _]) => format!("queue drains at {tat} (unix ms)"),
            _ => format!(
                "queue drains at {} (unix ms; 0.1's decimal, replaced at its next write)",
                stored.value()
            ),
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

    fn params(limit: u64, burst: u64, max_delay_ms: Option<u64>) -> Params {
        Params {
            algorithm: Algorithm::LeakyBucket,
            limit,
            window_ms: 1000,
            burst,
            max_delay_ms,
            calendar: None,
        }
    }

    #[test]
    fn requests_are_spaced_and_a_full_queue_refuses() {
        let p = params(4, 3, None);
        let mut s = None;
        let mut delays = Vec::new();
        for _ in 0..3 {
            let (next, d) = decide(s, &p, 0, 1);
            assert!(d.allowed);
            delays.push(d.delay.as_millis());
            s = Some(next);
        }
        assert_eq!(delays, [0, 250, 500]);
        let (_, d) = decide(s, &p, 0, 1);
        assert!(!d.allowed, "three queued: full");
        assert_eq!(d.retry_after, Some(Duration::from_millis(250)));
        let (_, d) = decide(s, &p, 0, 0);
        assert_eq!(d.delay, Duration::ZERO);
        let strict = params(4, 10, Some(300));
        let (s, _) = decide(None, &strict, 0, 2);
        let (_, d) = decide(Some(s), &strict, 0, 1);
        assert!(!d.allowed, "would wait 500 ms, more than max_delay");
    }

    proptest! {
        /// Release times (arrival + delay) are never closer than W / L.
        #[test]
        fn releases_are_spaced_by_the_emission_interval(
            limit in 1u64..20,
            burst in 1u64..10,
            ops in proptest::collection::vec(0u64..300, 1..200),
        ) {
            let p = params(limit, burst, None);
            let t = 1000.0 / limit as f64;
            let (mut state, mut now) = (None, 0u64);
            let mut releases: Vec<f64> = Vec::new();
            for step in ops {
                now += step;
                let (s, d) = decide(state, &p, now, 1);
                state = Some(s);
                if d.allowed {
                    releases.push(now as f64 + d.delay.as_secs_f64() * 1000.0);
                }
            }
            for pair in releases.windows(2) {
                // Delays are rounded up to whole microseconds.
                prop_assert!(pair[1] - pair[0] >= t - 0.001, "{:?} closer than {}", pair, t);
            }
        }
    }
}
