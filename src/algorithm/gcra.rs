//! GCRA (generic cell rate algorithm): one number of state, the theoretical arrival
//! time (TAT) of the next request at the sustained rate. With emission interval
//! T = W / L and tolerance B x T, a request of cost n is admitted iff
//! `max(TAT, now) + n x T - now <= B x T`. Same admissions as a token bucket of
//! capacity B, with a single float per key.

use super::{Division, mode, Decision, EPSILON, Layout, Model, Params, Stored, ceil_ms, floor_u64};

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct State {
    /// Theoretical arrival time, ms since the epoch.
    pub tat: f64,
}

pub fn decide(state: Option<State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let t = params.emission_interval();
    let tau = params.burst as f64 * t;
    let now = now_ms as f64;
    let tat = state.map_or(now, |s| s.tat).max(now);
    let new_tat = tat + cost as f64 * t;
    let diff = new_tat - now;
    if cost <= params.burst && diff <= tau + EPSILON {
        let remaining = floor_u64((tau - diff) / t + EPSILON);
        return (
            State { tat: new_tat },
            Decision::allow(remaining, ceil_ms(diff)),
        );
    }
    let retry = (cost <= params.burst).then(|| ceil_ms(diff - tau));
    (State { tat }, Decision::deny(ceil_ms(tat - now), retry))
}

pub fn expires_at_ms(state: &State, now_ms: u64) -> u64 {
    now_ms + ceil_ms(state.tat - now_ms as f64).max(1)
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/gcra.lua`.
pub struct Gcra;

impl Model for Gcra {
    const NAME: &'static str = "gcra";
    const KEY_NAME: &'static str = "gcra";
    const LUA: &'static str = include_str!("../../lua/gcra.lua");
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
    /// The arrival time (a double), then the key's expiry in grid steps
    /// (`lua/timed.lua`): 12 bytes, which no decimal arrival time of 0.1 is.
    const PACKED: Option<&'static str> = Some("<dI");
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state.copied(), params, now_ms, cost)
    }

    /// The arrival time may move past now + burst x T: the debt.
    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        need: u64,
    ) -> (State, Decision) {
        let t = params.emission_interval();
        let add = |s: &State| State {
            tat: s.tat + cost as f64 * t,
        };
        mode::charge(|s, c| decide(s.copied(), params, now_ms, c), add, state, need)
    }

    /// The arrival time moves back, never before now (an empty bucket).
    fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        let t = params.emission_interval();
        let sub = |s: &State| State {
            tat: (s.tat - cost as f64 * t).max(now_ms as f64),
        };
        mode::release(|s, c| decide(s.copied(), params, now_ms, c), sub, state)
    }

    fn expires_at_ms(state: &State, _params: &Params, now_ms: u64) -> u64 {
        expires_at_ms(state, now_ms)
    }

    // gcra.lua: the theoretical arrival time, one number
    /// The arrival time back by the cost's emission intervals.
    fn refund(state: &State, params: &Params, _now_ms: u64, _token: i64, cost: u64) -> State {
        State {
            tat: state.tat - cost as f64 * params.emission_interval(),
        }
    }

    fn describe(stored: &Stored) -> String {
        match stored.unpacked(Self::PACKED.unwrap_or_default()).as_deref() {
            Some([tat, _]) => format!("theoretical arrival time {tat} (unix ms)"),
            _ => format!(
                "theoretical arrival time {} (unix ms; 0.1's decimal, replaced at its next write)",
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
    use crate::algorithm::{Algorithm, token_bucket};
    use proptest::prelude::*;

    fn params(algorithm: Algorithm, limit: u64, burst: u64) -> Params {
        Params {
            algorithm,
            limit,
            window_ms: 1000,
            burst,
            max_delay_ms: None,
            calendar: None,
        }
    }

    proptest! {
        /// The same admissions as a token bucket with the same L, W and B.
        #[test]
        fn admits_like_a_token_bucket(
            limit in 1u64..20,
            burst in 1u64..20,
            ops in proptest::collection::vec((0u64..4, 0u64..200), 1..300),
        ) {
            let g = params(Algorithm::Gcra, limit, burst);
            let b = params(Algorithm::TokenBucket, limit, burst);
            let (mut gs, mut bs, mut now) = (None, None, 0u64);
            for (cost, step) in ops {
                now += step;
                let (s1, d1) = decide(gs, &g, now, cost);
                let (s2, d2) = token_bucket::decide(bs, &b, now, cost);
                prop_assert_eq!(d1.allowed, d2.allowed, "at {} cost {}", now, cost);
                gs = Some(s1);
                bs = Some(s2);
            }
        }

        /// Never more than B + rate x t in any interval of length t.
        #[test]
        fn never_more_than_burst_plus_rate(
            limit in 1u64..20,
            burst in 1u64..20,
            ops in proptest::collection::vec((0u64..4, 0u64..200), 1..300),
        ) {
            let p = params(Algorithm::Gcra, limit, burst);
            let admitted = crate::algorithm::testing::replay(&p, 0, &ops);
            let violation = crate::algorithm::testing::burst_plus_rate_violation(&admitted, burst, limit, 1000);
            prop_assert!(violation.is_none(), "{:?}", violation);
        }
    }
}
