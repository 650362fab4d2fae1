//! Recording outcomes: a [`Recorder`] per worker (an HDR histogram of latencies, counts
//! of OK, OVER_LIMIT and errors by gRPC code), merged at the end; and [`Live`], shared
//! atomic counters for the once-a-second progress line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::proto::RateLimitResponse;
use crate::proto::rate_limit_response::Code;

/// Latencies are recorded in nanoseconds, 3 significant digits, up to this.
const MAX_LATENCY_NS: u64 = 120_000_000_000;

/// How one call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered; `over_limit` when its overall code was OVER_LIMIT,
    /// `limited` when any descriptor status carried a `current_limit` (none does for
    /// an unknown domain or a descriptor no rule matches: nothing was measured).
    Answered { over_limit: bool, limited: bool },
    /// A gRPC error (client-side timeouts are `DeadlineExceeded`).
    Failed(tonic::Code),
}

impl Outcome {
    pub fn of(result: &Result<RateLimitResponse, tonic::Status>) -> Self {
        match result {
            Ok(response) => Outcome::Answered {
                over_limit: response.overall_code == Code::OverLimit as i32,
                limited: response.statuses.iter().any(|s| s.current_limit.is_some()),
            },
            Err(status) => Outcome::Failed(status.code()),
        }
    }
}

/// One worker's measurements (only calls that completed inside the measured window).
#[derive(Debug, Clone)]
pub struct Recorder {
    pub latency: Histogram<u64>,
    pub answered: u64,
    pub over_limit: u64,
    /// Answers in which no descriptor carried a limit.
    pub without_limit: u64,
    /// Errors by gRPC code (index = code as i32, 0..=16).
    pub errors: [u64; 17],
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("valid histogram bounds"),
            answered: 0,
            over_limit: 0,
            without_limit: 0,
            errors: [0; 17],
        }
    }
}

impl Recorder {
    /// Records a completed call. Latencies of answered calls go into the histogram;
    /// errors are only counted (a fast refusal must not flatter the percentiles).
    pub fn record(&mut self, outcome: Outcome, latency: Duration) {
        match outcome {
            Outcome::Answered {
                over_limit,
                limited,
            } => {
                self.answered += 1;
                self.over_limit += u64::from(over_limit);
                self.without_limit += u64::from(!limited);
                let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                self.latency.saturating_record(ns.clamp(1, MAX_LATENCY_NS));
            }
            Outcome::Failed(code) => {
                let index = usize::try_from(code as i32).unwrap_or(2).min(16);
                self.errors[index] += 1;
            }
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        self.answered += other.answered;
        self.over_limit += other.over_limit;
        self.without_limit += other.without_limit;
        for (mine, theirs) in self.errors.iter_mut().zip(other.errors) {
            *mine += theirs;
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.iter().sum()
    }
}

/// Counters every worker bumps as calls complete, read by the progress line.
#[derive(Debug, Default)]
pub struct Live {
    pub completed: AtomicU64,
    pub errors: AtomicU64,
    pub over_limit: AtomicU64,
    pub in_flight: AtomicU64,
}

impl Live {
    pub fn sent(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn done(&self, outcome: Outcome) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.completed.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Answered {
                over_limit: true, ..
            } => {
                self.over_limit.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Answered { .. } => {}
            Outcome::Failed(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every call so far, as the report's totals.
    pub fn totals(&self) -> Totals {
        let (completed, errors, over_limit, in_flight) = self.snapshot();
        Totals {
            sent: completed + in_flight,
            answered: completed.saturating_sub(errors),
            over_limit,
            errors,
            in_flight,
        }
    }

    /// `(completed, errors, over_limit, in_flight)` now.
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.completed.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed),
            self.in_flight.load(Ordering::Relaxed),
        )
    }
}

/// A gRPC code's name as tonic spells it (`Unavailable`, `DeadlineExceeded`, ...).
pub fn code_name(index: usize) -> String {
    format!("{:?}", tonic::Code::from(i32::try_from(index).unwrap_or(2)))
}

/// Every call of a run, warm-up and the calls still in flight at the window's end
/// included: what the server's own counts (its metrics, the script calls Redis ran)
/// must agree with, where a report's other figures count the measured window only.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Totals {
    pub sent: u64,
    pub answered: u64,
    pub over_limit: u64,
    /// Calls that failed (client-side timeouts included).
    pub errors: u64,
    /// Calls sent but neither answered nor failed when the run gave up waiting.
    pub in_flight: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_merges() {
        let mut a = Recorder::default();
        a.record(
            Outcome::Answered {
                over_limit: false,
                limited: true,
            },
            Duration::from_micros(100),
        );
        a.record(
            Outcome::Answered {
                over_limit: true,
                limited: false,
            },
            Duration::from_micros(300),
        );
        let mut b = Recorder::default();
        b.record(
            Outcome::Failed(tonic::Code::Unavailable),
            Duration::from_micros(5),
        );
        a.merge(&b);
        assert_eq!(a.answered, 2);
        assert_eq!(a.over_limit, 1);
        assert_eq!(a.without_limit, 1);
        assert_eq!(a.errors[tonic::Code::Unavailable as usize], 1);
        assert_eq!(a.error_count(), 1);
        assert_eq!(a.latency.len(), 2);
        assert!(a.latency.value_at_quantile(1.0) >= 299_000);
        assert_eq!(code_name(14), "Unavailable");
    }
}
