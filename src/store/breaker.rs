//! A circuit breaker around a store: after `failures_to_open` consecutive failures
//! it stops calling the store for `open_for` and fails at once (well under a
//! millisecond), then lets one probe through (half-open); a success closes it, a
//! failure opens it again. An outage then costs each request nothing but the
//! failure-mode decision, instead of a timeout each.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{CounterOp, Store, StoreError, StoreFuture};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerOptions {
    pub failures_to_open: u32,
    pub open_for: Duration,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        BreakerOptions {
            failures_to_open: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; everyone else fails fast until it returns.
    HalfOpen,
}

pub struct Breaker<S> {
    inner: S,
    options: BreakerOptions,
    state: Mutex<State>,
}

impl<S: Store> Breaker<S> {
    pub fn new(inner: S, options: BreakerOptions) -> Self {
        Self {
            inner,
            options,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Whether calls currently fail fast (for health and metrics).
    pub fn is_open(&self) -> bool {
        !matches!(*self.lock(), State::Closed { .. })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// May this call go through? Open past its time turns half-open for one probe.
    fn admit(&self) -> Result<(), StoreError> {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { until } => {
                let now = Instant::now();
                if now >= until {
                    *state = State::HalfOpen;
                    Ok(())
                } else {
                    Err(StoreError::CircuitOpen(until - now))
                }
            }
            State::HalfOpen => Err(StoreError::CircuitOpen(Duration::ZERO)),
        }
    }

    fn record(&self, ok: bool) {
        let mut state = self.lock();
        *state = match (*state, ok) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.options.failures_to_open => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            (_, false) => {
                tracing::warn!(
                    open_for = ?self.options.open_for,
                    "counter store failing: circuit open, requests answered by their failure mode"
                );
                State::Open {
                    until: Instant::now() + self.options.open_for,
                }
            }
        };
    }
}

impl<S: Store> Store for Breaker<S> {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async move {
            self.admit()?;
            let result = self.inner.decide(ops).await;
            self.record(result.is_ok());
            result
        })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async move {
            self.admit()?;
            let result = self.inner.dry_run(ops).await;
            self.record(result.is_ok());
            result
        })
    }
}
