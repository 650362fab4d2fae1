//! Shared checks for the models' property tests: replay random traffic through
//! [`super::decide`] and measure what was admitted against each algorithm's promise.

use super::{Params, State, decide};

/// Replays `(cost, time step)` pairs from `start`; returns admitted `(time, cost)`.
pub fn replay(params: &Params, start: u64, ops: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut state: Option<State> = None;
    let mut now = start;
    let mut admitted = Vec::new();
    for &(cost, step) in ops {
        now += step;
        let (next, decision) = decide(state.as_ref(), params, now, cost);
        state = Some(next);
        if decision.allowed {
            admitted.push((now, cost));
        }
    }
    admitted
}

/// The most hits admitted in any half-open interval `[t, t + len)`.
pub fn max_in_any_interval(admitted: &[(u64, u64)], len: u64) -> u64 {
    admitted
        .iter()
        .map(|&(t, _)| {
            admitted
                .iter()
                .filter(|(u, _)| *u >= t && *u < t + len)
                .map(|(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// A violation of "at most B + L x t / W in any interval of length t", if any.
pub fn burst_plus_rate_violation(
    admitted: &[(u64, u64)],
    burst: u64,
    limit: u64,
    window_ms: u64,
) -> Option<String> {
    for (i, &(t0, _)) in admitted.iter().enumerate() {
        let mut total = 0u64;
        for &(t1, c) in &admitted[i..] {
            total += c;
            let bound = burst as f64 + limit as f64 * (t1 - t0) as f64 / window_ms as f64;
            if total as f64 > bound + 1e-6 {
                return Some(format!("{total} admitted in [{t0}, {t1}], bound {bound}"));
            }
        }
    }
    None
}
