//! What one decision takes and gives: [`Params`] (one limit, as every model reads it)
//! in, [`Decision`] out, and the float helpers the models share with their Lua twins
//! (`lua/common.lua` has the same slack and rounding).

use std::time::Duration;

use super::{Algorithm, calendar};

/// Everything an algorithm needs to know about one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub algorithm: Algorithm,
    /// L: requests per window.
    pub limit: u64,
    /// W in milliseconds (unit x unit_multiplier); at least 1000.
    pub window_ms: u64,
    /// B: bucket capacity, GCRA burst or leaky-bucket queue length (default L).
    pub burst: u64,
    /// Leaky bucket: the longest an admitted request may be held.
    pub max_delay_ms: Option<u64>,
    /// `time_zone`: the windows are these calendar periods instead of `window_ms`
    /// from the epoch (only where [`Algorithm::takes_time_zone`]).
    pub calendar: Option<calendar::Calendar>,
}

impl Params {
    /// Milliseconds between two admissions at the sustained rate (W / L).
    pub fn emission_interval(&self) -> f64 {
        self.window_ms as f64 / self.limit as f64
    }
}

/// The outcome of one counter operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// What the counter still admits after this operation took effect.
    pub remaining: u64,
    /// Until the window ends, or for buckets until the bucket is full again.
    pub reset_after: Duration,
    /// Only meaningful when denied: how long until the same cost could pass, or `None`
    /// when it never can (the cost exceeds what the limit admits at all).
    pub retry_after: Option<Duration>,
    /// Leaky bucket shaping: how long the admitted request waits for its turn.
    pub delay: Duration,
}

impl Decision {
    pub(super) fn allow(remaining: u64, reset_ms: u64) -> Self {
        Decision {
            allowed: true,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    pub(super) fn deny(reset_ms: u64, retry_ms: Option<u64>) -> Self {
        Decision {
            allowed: false,
            remaining: 0,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
            delay: Duration::ZERO,
        }
    }
}

/// Slack for float comparisons, so that B requests at one instant fill a bucket of B
/// exactly despite rounding in `n x T` sums. The Lua scripts use the same value.
pub const EPSILON: f64 = 1e-9;

/// `ceil(x)` of a non-negative float as whole milliseconds (negative -> 0).
pub(super) fn ceil_ms(x: f64) -> u64 {
    if x > 0.0 { x.ceil() as u64 } else { 0 }
}

/// `floor(x)` of a non-negative float (negative -> 0).
pub(super) fn floor_u64(x: f64) -> u64 {
    if x > 0.0 { x.floor() as u64 } else { 0 }
}
