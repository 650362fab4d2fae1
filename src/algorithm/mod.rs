//! The pure algorithm models: state in, decision and new state out, no I/O and no
//! clock of their own. The memory store runs them directly; the Lua scripts in `lua/`
//! mirror them operation for operation (same float expressions in the same order, so
//! a differential test can demand exact agreement).

pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

#[cfg(test)]
pub(crate) mod testing;

use std::time::Duration;

/// How a limit counts. The number is the id the Lua batch script dispatches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow = 1,
    SlidingWindow = 2,
    SlidingLog = 3,
    TokenBucket = 4,
    Gcra = 5,
    LeakyBucket = 6,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    pub fn parse(text: &str) -> Option<Algorithm> {
        Self::ALL.into_iter().find(|a| a.name() == text)
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    /// Whether `burst` means something for this algorithm.
    pub fn uses_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
        )
    }
}

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
    fn allow(remaining: u64, reset_ms: u64) -> Self {
        Decision {
            allowed: true,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    fn deny(reset_ms: u64, retry_ms: Option<u64>) -> Self {
        Decision {
            allowed: false,
            remaining: 0,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
            delay: Duration::ZERO,
        }
    }
}

/// One counter's state, whatever its algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    SlidingLog(sliding_log::State),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    LeakyBucket(leaky_bucket::State),
}

/// Decides `cost` hits at `now_ms` against `state` (None: never seen, or state of
/// another algorithm). A denied operation returns the state unchanged.
pub fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    match params.algorithm {
        Algorithm::FixedWindow => {
            let s = match state {
                Some(State::FixedWindow(s)) => Some(*s),
                _ => None,
            };
            let (s, d) = fixed_window::decide(s, params, now_ms, cost);
            (State::FixedWindow(s), d)
        }
        Algorithm::SlidingWindow => {
            let s = match state {
                Some(State::SlidingWindow(s)) => Some(*s),
                _ => None,
            };
            let (s, d) = sliding_window::decide(s, params, now_ms, cost);
            (State::SlidingWindow(s), d)
        }
        Algorithm::SlidingLog => {
            let s = match state {
                Some(State::SlidingLog(s)) => Some(s),
                _ => None,
            };
            let (s, d) = sliding_log::decide(s, params, now_ms, cost);
            (State::SlidingLog(s), d)
        }
        Algorithm::TokenBucket => {
            let s = match state {
                Some(State::TokenBucket(s)) => Some(*s),
                _ => None,
            };
            let (s, d) = token_bucket::decide(s, params, now_ms, cost);
            (State::TokenBucket(s), d)
        }
        Algorithm::Gcra => {
            let s = match state {
                Some(State::Gcra(s)) => Some(*s),
                _ => None,
            };
            let (s, d) = gcra::decide(s, params, now_ms, cost);
            (State::Gcra(s), d)
        }
        Algorithm::LeakyBucket => {
            let s = match state {
                Some(State::LeakyBucket(s)) => Some(*s),
                _ => None,
            };
            let (s, d) = leaky_bucket::decide(s, params, now_ms, cost);
            (State::LeakyBucket(s), d)
        }
    }
}

/// When a state stops mattering (the Redis TTL of its key): after this instant it is
/// equivalent to no state at all.
pub fn expires_at_ms(state: &State, params: &Params, now_ms: u64) -> u64 {
    match state {
        State::FixedWindow(s) => fixed_window::expires_at_ms(s, params),
        State::SlidingWindow(s) => sliding_window::expires_at_ms(s, params),
        State::SlidingLog(s) => sliding_log::expires_at_ms(s, params, now_ms),
        State::TokenBucket(s) => token_bucket::expires_at_ms(s, params),
        State::Gcra(s) => gcra::expires_at_ms(s, now_ms),
        State::LeakyBucket(s) => leaky_bucket::expires_at_ms(s, now_ms),
    }
}

/// Slack for float comparisons, so that B requests at one instant fill a bucket of B
/// exactly despite rounding in `n x T` sums. The Lua scripts use the same value.
pub const EPSILON: f64 = 1e-9;

/// `ceil(x)` of a non-negative float as whole milliseconds (negative -> 0).
fn ceil_ms(x: f64) -> u64 {
    if x > 0.0 { x.ceil() as u64 } else { 0 }
}

/// `floor(x)` of a non-negative float (negative -> 0).
fn floor_u64(x: f64) -> u64 {
    if x > 0.0 { x.floor() as u64 } else { 0 }
}
