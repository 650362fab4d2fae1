//! `tollgate simulate`: replays a traffic pattern through the pure algorithm models
//! (`crate::algorithm::decide`, the same code the memory store runs, mirrored by the
//! Lua scripts), with no Redis and no server. This file owns the simulation itself:
//! the limit being simulated ([`Setup`]), one replay per algorithm ([`Run`]) and the
//! figures the table and the chart report. [`patterns`] makes arrivals (built-in
//! patterns and CSV files), [`series`] computes windowed counts, [`table`] prints the
//! summary and [`svg`] (with `axes`) draws the chart; `error.rs` says why a simulation
//! cannot run.
//!
//! Time: arrivals are milliseconds since the Unix epoch, like the models' clock, so
//! time 0 of a built-in pattern is a window boundary of every window length.

mod axes;
mod error;
pub mod patterns;
pub mod series;
pub mod svg;
pub mod table;

use crate::algorithm::{self, Algorithm, Params};

pub use self::error::SimulateError;
use self::error::invalid;

pub use patterns::Pattern;
pub use series::max_in_window;

/// The most requests one simulation replays (per algorithm).
pub const MAX_ARRIVALS: usize = 10_000_000;
/// The longest window or simulated span: ten years.
pub const MAX_SPAN_MS: u64 = 10 * 365 * 86_400_000;

/// One request offered to the limit: when, and how many hits it adds (0 checks only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at_ms: u64,
    pub cost: u64,
}

/// The limit every chosen algorithm is run with: L per W, plus the bucket options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setup {
    /// L: requests per window.
    pub limit: u64,
    /// W in milliseconds: whole seconds, as in the config.
    pub window_ms: u64,
    /// B for token_bucket, gcra and leaky_bucket; `None`: the limit.
    pub burst: Option<u64>,
    /// Leaky bucket: the longest an admitted request may wait for its turn.
    pub max_delay_ms: Option<u64>,
    pub algorithms: Vec<Algorithm>,
}

impl Setup {
    /// L per W for every algorithm, no burst or max_delay of its own.
    pub fn new(limit: u64, window_ms: u64) -> Self {
        Setup {
            limit,
            window_ms,
            burst: None,
            max_delay_ms: None,
            algorithms: Algorithm::rate_limits(),
        }
    }

    /// The same bounds the config loader enforces, so a simulated limit is one that a
    /// rule could have.
    pub fn validate(&self) -> Result<(), SimulateError> {
        if self.limit == 0 || self.limit > u64::from(u32::MAX) {
            return invalid(format!(
                "limit must be between 1 and {} (got {})",
                u32::MAX,
                self.limit
            ));
        }
        if self.window_ms < 1000
            || !self.window_ms.is_multiple_of(1000)
            || self.window_ms > MAX_SPAN_MS
        {
            return invalid(format!(
                "window must be a whole number of seconds, from 1 s to 10 years (got {} ms)",
                self.window_ms
            ));
        }
        if let Some(burst) = self.burst
            && (burst == 0 || burst > u64::from(u32::MAX))
        {
            return invalid(format!(
                "burst must be between 1 and {} (got {burst})",
                u32::MAX
            ));
        }
        if self.algorithms.is_empty() {
            return invalid("no algorithm to simulate");
        }
        let too_large = self.algorithms.iter().find_map(|a| {
            a.max_limit()
                .filter(|max| self.limit > *max)
                .map(|max| (a.name(), max))
        });
        if let Some((name, max)) = too_large {
            // Only sliding_log has a maximum: the message gives its reason.
            return invalid(format!(
                "{name} keeps one entry per hit, so it is limited to {max} per window (got {}); leave it out with --algorithm",
                self.limit
            ));
        }
        Ok(())
    }

    /// What `Limit::params()` would give a rule with this limit and `algorithm`.
    pub fn params(&self, algorithm: Algorithm) -> Params {
        let burst = if algorithm.uses_burst() {
            self.burst
        } else {
            None
        };
        Params {
            algorithm,
            limit: self.limit,
            window_ms: self.window_ms,
            burst: burst.unwrap_or(self.limit),
            max_delay_ms: algorithm
                .takes_max_delay()
                .then_some(self.max_delay_ms)
                .flatten(),
            calendar: None,
        }
    }

    /// `10 per 1 min, burst 20, max_delay 5 s` (the options only when set).
    pub fn describe(&self) -> String {
        let mut text = format!("{} per {}", self.limit, format_span(self.window_ms));
        if let Some(burst) = self.burst {
            text.push_str(&format!(", burst {burst}"));
        }
        if let Some(delay) = self.max_delay_ms {
            text.push_str(&format!(", max_delay {}", format_span(delay)));
        }
        text
    }
}

/// What happened to one arrival under one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub arrival: Arrival,
    pub allowed: bool,
    /// Leaky bucket shaping: how long the admitted request is held (microseconds).
    pub delay_us: u64,
}

impl Outcome {
    /// When the request reaches what the limit protects: arrival plus its wait.
    pub fn release_us(&self) -> u64 {
        self.arrival
            .at_ms
            .saturating_mul(1000)
            .saturating_add(self.delay_us)
    }
}

/// One algorithm's replay of the arrivals.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub algorithm: Algorithm,
    pub params: Params,
    pub outcomes: Vec<Outcome>,
}

impl Run {
    /// Admitted requests (check-only ones included).
    pub fn admitted(&self) -> u64 {
        self.outcomes.iter().filter(|o| o.allowed).count() as u64
    }

    /// Hits of the admitted requests.
    pub fn admitted_hits(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|o| o.allowed)
            .map(|o| o.arrival.cost)
            .sum()
    }

    pub fn denied(&self) -> u64 {
        self.outcomes.iter().filter(|o| !o.allowed).count() as u64
    }

    /// The longest shaping wait of an admitted request (leaky bucket only), in µs.
    pub fn longest_wait_us(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|o| o.allowed)
            .map(|o| o.delay_us)
            .max()
            .unwrap_or(0)
    }

    /// Admitted hits as (release time µs, hits), in time order.
    pub fn passed(&self) -> Vec<(u64, u64)> {
        let mut passed: Vec<(u64, u64)> = self
            .outcomes
            .iter()
            .filter(|o| o.allowed)
            .map(|o| (o.release_us(), o.arrival.cost))
            .collect();
        passed.sort_by_key(|&(t, _)| t);
        passed
    }

    /// The most hits released in any interval `[t, t + W)`.
    pub fn max_in_window(&self) -> u64 {
        max_in_window(&self.passed(), self.params.window_ms.saturating_mul(1000))
    }
}

/// Runs `arrivals` (in time order) through one algorithm, one counter, from no state.
pub fn replay(params: &Params, arrivals: &[Arrival]) -> Run {
    let mut state: Option<algorithm::State> = None;
    let mut outcomes = Vec::with_capacity(arrivals.len());
    for &arrival in arrivals {
        let (next, decision) =
            algorithm::decide(state.as_ref(), params, arrival.at_ms, arrival.cost);
        state = Some(next);
        outcomes.push(Outcome {
            arrival,
            allowed: decision.allowed,
            delay_us: u64::try_from(decision.delay.as_micros()).unwrap_or(u64::MAX),
        });
    }
    Run {
        algorithm: params.algorithm,
        params: *params,
        outcomes,
    }
}

/// Every chosen algorithm's replay of one traffic pattern, and the span to chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// Pattern name (`boundary`, `csv`).
    pub pattern: String,
    /// One line saying what the traffic is.
    pub description: String,
    pub setup: Setup,
    pub arrivals: Vec<Arrival>,
    /// The charted span: a window boundary at or before the first arrival ...
    pub start_ms: u64,
    /// ... to here; arrivals at or after it were left out.
    pub end_ms: u64,
    /// Arrivals left out because they fall after `end_ms`.
    pub ignored: usize,
    pub runs: Vec<Run>,
}

impl Simulation {
    /// Replays a built-in pattern; `duration_ms` defaults per pattern.
    pub fn from_pattern(
        setup: &Setup,
        pattern: &Pattern,
        duration_ms: Option<u64>,
        cost: u64,
    ) -> Result<Simulation, SimulateError> {
        setup.validate()?;
        let duration = duration_ms.unwrap_or_else(|| pattern.default_duration_ms(setup.window_ms));
        let arrivals = pattern.arrivals(setup.window_ms, duration, cost)?;
        Self::run(
            setup,
            pattern.name(),
            pattern.describe(setup.window_ms),
            arrivals,
            Some(duration),
        )
    }

    /// Replays given arrivals (a CSV); without `duration_ms` the span runs to at least
    /// one window after the last arrival.
    pub fn from_arrivals(
        setup: &Setup,
        description: String,
        arrivals: Vec<Arrival>,
        duration_ms: Option<u64>,
    ) -> Result<Simulation, SimulateError> {
        setup.validate()?;
        Self::run(setup, "csv", description, arrivals, duration_ms)
    }

    fn run(
        setup: &Setup,
        pattern: &str,
        description: String,
        mut arrivals: Vec<Arrival>,
        duration_ms: Option<u64>,
    ) -> Result<Simulation, SimulateError> {
        if arrivals.is_empty() {
            return invalid("no requests to simulate");
        }
        if arrivals.len() > MAX_ARRIVALS {
            return invalid(format!(
                "{} requests: more than the {MAX_ARRIVALS} a simulation replays",
                arrivals.len()
            ));
        }
        if duration_ms.is_some_and(|d| d == 0 || d > MAX_SPAN_MS) {
            return invalid("duration must be more than 0 and at most 10 years");
        }
        arrivals.sort_by_key(|a| a.at_ms);
        let window = setup.window_ms;
        let first = arrivals[0].at_ms;
        let last = arrivals[arrivals.len() - 1].at_ms;
        let start_ms = first - first % window;
        let end_ms = match duration_ms {
            Some(d) => start_ms.saturating_add(d),
            None => (last / window).saturating_add(2).saturating_mul(window),
        };
        let kept = arrivals.partition_point(|a| a.at_ms < end_ms);
        let ignored = arrivals.len() - kept;
        arrivals.truncate(kept);
        let runs = setup
            .algorithms
            .iter()
            .map(|&a| replay(&setup.params(a), &arrivals))
            .collect();
        Ok(Simulation {
            pattern: pattern.to_owned(),
            description,
            setup: setup.clone(),
            arrivals,
            start_ms,
            end_ms,
            ignored,
            runs,
        })
    }

    /// Offered hits as (time µs, hits), in time order.
    pub fn offered(&self) -> Vec<(u64, u64)> {
        self.arrivals
            .iter()
            .map(|a| (a.at_ms.saturating_mul(1000), a.cost))
            .collect()
    }

    pub fn offered_hits(&self) -> u64 {
        self.arrivals.iter().map(|a| a.cost).sum()
    }

    /// The run of `algorithm`, if it was simulated.
    pub fn run_of(&self, algorithm: Algorithm) -> Option<&Run> {
        self.runs.iter().find(|r| r.algorithm == algorithm)
    }
}

/// A span of milliseconds in the largest unit that divides it: `1 min`, `90 s`,
/// `1.5 s`, `250 ms`, `2 d`.
pub fn format_span(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1000, "s"),
    ];
    if ms == 0 {
        return "0".to_owned();
    }
    for (size, name) in UNITS {
        if ms.is_multiple_of(size) {
            return format!("{} {name}", ms / size);
        }
    }
    if ms >= 1000 {
        format!("{} s", ms as f64 / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

/// A wait in microseconds, to a tenth of its unit: `54.0 s`, `250.0 ms`, `0`.
pub fn format_wait(us: u64) -> String {
    match us {
        0 => "0".to_owned(),
        1..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1000.0),
        _ => format!("{:.1} s", us as f64 / 1_000_000.0),
    }
}
