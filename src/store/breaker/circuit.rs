//! The breaker of one node: the state machine (closed, open until an instant, half
//! open with one probe out), its gauge and its log lines. How calls that share one
//! deadline are judged is in `fair.rs`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::BreakerOptions;
use crate::metrics::{BreakerGauge, BreakerState, Metrics};
use crate::store::StoreError;
use crate::telemetry::ratelimited;

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

impl State {
    fn reported(self) -> BreakerState {
        match self {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen => BreakerState::HalfOpen,
        }
    }
}

/// The breaker of one node (or of the whole store, as `node="all"`).
pub struct CircuitBreaker {
    /// What it protects, as its logs and its gauge name it (`host:port`, or `all`).
    node: String,
    pub(super) options: BreakerOptions,
    state: Mutex<State>,
    /// `tollgate_breaker_state{node}`, when the server has metrics.
    gauge: Option<BreakerGauge>,
}

impl CircuitBreaker {
    /// A closed breaker for `node`; with `metrics`, its state is published from now.
    pub fn new(node: &str, options: BreakerOptions, metrics: Option<&Arc<Metrics>>) -> Self {
        let gauge = metrics.map(|m| m.breaker_state(node));
        if let Some(gauge) = &gauge {
            gauge.set(BreakerState::Closed);
        }
        Self {
            node: node.to_owned(),
            options,
            state: Mutex::new(State::Closed { failures: 0 }),
            gauge,
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Moves to `next`, publishing the state when its kind changes (a failure counted
    /// while closed is no transition).
    fn transition(&self, state: &mut State, next: State) {
        if let Some(gauge) = &self.gauge
            && state.reported() != next.reported()
        {
            gauge.set(next.reported());
        }
        *state = next;
    }

    /// Whether calls currently fail fast (for health and metrics).
    pub fn is_open(&self) -> bool {
        !matches!(*self.lock(), State::Closed { .. })
    }

    /// Whether a call now would be refused: open and not yet due to probe, or half
    /// open with its probe out.
    pub fn refusing(&self) -> bool {
        match *self.lock() {
            State::Closed { .. } => false,
            State::Open { until } => Instant::now() < until,
            State::HalfOpen => true,
        }
    }

    /// An open breaker lets its next call probe at once instead of waiting out
    /// `open_for`: the evidence that opened it is stale (a cluster's slot map changed
    /// after a failover, so the masters that stayed were failing only because the
    /// cluster as a whole was down). A closed or half-open breaker is left alone.
    pub fn probe_now(&self) {
        let mut state = self.lock();
        if matches!(*state, State::Open { .. }) {
            // Still reported open until the probe goes out: no gauge change.
            *state = State::Open {
                until: Instant::now(),
            };
        }
    }

    /// The node answered readiness on the connection the calls take (a PING there,
    /// and on a cluster its `cluster_state:ok`): an open breaker closes. The half-open
    /// probe asks the same question with a request's call; waiting for it kept
    /// requests failing fast after health said SERVING (one probe out, everyone
    /// else refused) and a probe that met a dead connection opened the breaker for
    /// another `open_for`. If Redis answers PING but not calls (slow, or refusing
    /// scripts), `failures_to_open` calls fail and the breaker opens again, until the
    /// next readiness probe. A half-open breaker is left to its probe; a closed one
    /// keeps its count of failures (a PING is not a call that succeeded).
    pub fn answered(&self) {
        let mut state = self.lock();
        let before = *state;
        if !matches!(before, State::Open { .. }) {
            return;
        }
        let next = State::Closed { failures: 0 };
        self.transition(&mut state, next);
        drop(state);
        self.log_change(before, next);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// May this call go through? Open past its time turns half-open for one probe;
    /// `Ok(true)` says this call is that probe.
    fn admit(&self) -> Result<bool, StoreError> {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Ok(false),
            State::Open { until } => {
                let now = Instant::now();
                if now >= until {
                    self.transition(&mut state, State::HalfOpen);
                    Ok(true)
                } else {
                    Err(StoreError::CircuitOpen(until - now))
                }
            }
            State::HalfOpen => Err(StoreError::CircuitOpen(Duration::ZERO)),
        }
    }

    /// Runs `call` under the breaker, or fails at once while it is open. A probe whose
    /// caller goes away before it ends (Envoy's own timeout drops the request) would
    /// leave the breaker half-open for good, refusing everything; the guard hands the
    /// probe to the next caller instead.
    pub async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.call_judged(call, |_| true).await
    }

    /// Runs `call` under the breaker; its result is recorded when `counts` says so (an
    /// uncounted probe hands the probe on, as a cancelled one does).
    pub(super) async fn call_judged<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
        counts: impl FnOnce(&Result<T, StoreError>) -> bool,
    ) -> Result<T, StoreError> {
        let probe = self.admit()?;
        let mut guard = ProbeGuard {
            breaker: self,
            armed: probe,
        };
        let result = call.await;
        if counts(&result) {
            guard.armed = false;
            self.record(result.is_ok());
        }
        result
    }

    fn record(&self, ok: bool) {
        let mut state = self.lock();
        let before = *state;
        let next = match (before, ok) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.options.failures_to_open => {
                State::Closed {
                    failures: failures + 1,
                }
            }
            (_, false) => State::Open {
                until: Instant::now() + self.options.open_for,
            },
        };
        self.transition(&mut state, next);
        drop(state);
        self.log_change(before, next);
    }

    /// Logs the breaker opening and closing. Calls that were in flight when it opened
    /// fail too, each re-opening it: only a change of state is logged, and at most
    /// once a second per node with the number not logged since.
    fn log_change(&self, before: State, after: State) {
        let was_open = !matches!(before, State::Closed { .. });
        match after {
            State::Open { .. } if !matches!(before, State::Open { .. }) => {
                let Some(suppressed) = ratelimited::admit(&["circuit_open", &self.node]) else {
                    return;
                };
                tracing::warn!(
                    event = "circuit_open",
                    node = %self.node,
                    failures_to_open = self.options.failures_to_open,
                    open_for_ms = self.options.open_for.as_millis() as u64,
                    probe_failed = matches!(before, State::HalfOpen),
                    suppressed,
                    "counter store failing: circuit open, requests answered by their failure mode"
                );
            }
            State::Closed { failures: 0 } if was_open => {
                let Some(suppressed) = ratelimited::admit(&["circuit_closed", &self.node]) else {
                    return;
                };
                tracing::info!(
                    event = "circuit_closed",
                    node = %self.node,
                    suppressed,
                    "counter store answering again: circuit closed"
                );
            }
            _ => {}
        }
    }
}

/// Reopens a cancelled probe's breaker as already expired: the next call probes.
struct ProbeGuard<'a> {
    breaker: &'a CircuitBreaker,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.breaker.lock();
            if matches!(*state, State::HalfOpen) {
                let expired = State::Open {
                    until: Instant::now(),
                };
                self.breaker.transition(&mut state, expired);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probe_now_lets_an_open_breaker_try_at_once() {
        let options = BreakerOptions {
            failures_to_open: 1,
            open_for: Duration::from_secs(60),
        };
        let breaker = CircuitBreaker::new("n", options, None);
        let down = async { Err::<(), _>(StoreError::Unavailable("down".into())) };
        assert!(breaker.call(down).await.is_err());
        let refused = breaker.call(async { Ok::<(), StoreError>(()) }).await;
        assert!(
            matches!(refused, Err(StoreError::CircuitOpen(_))),
            "{refused:?}"
        );
        breaker.probe_now();
        assert!(breaker.is_open(), "open until the probe goes out");
        assert!(
            breaker
                .call(async { Ok::<(), StoreError>(()) })
                .await
                .is_ok()
        );
        assert!(!breaker.is_open());
        // A closed breaker stays closed.
        breaker.probe_now();
        assert!(!breaker.is_open());
    }

    /// Readiness's answer on the calls' connection closes an open breaker at once
    /// (no probe that every other call waits behind); a closed one keeps counting.
    #[tokio::test]
    async fn an_answer_on_the_calls_connection_closes_an_open_breaker() {
        let options = BreakerOptions {
            failures_to_open: 2,
            open_for: Duration::from_secs(60),
        };
        let breaker = CircuitBreaker::new("n", options, None);
        let down = || async { Err::<(), _>(StoreError::Unavailable("down".into())) };
        assert!(breaker.call(down()).await.is_err());
        breaker.answered();
        assert!(breaker.call(down()).await.is_err());
        assert!(
            breaker.refusing(),
            "two failures in a row, the answer between them"
        );
        breaker.answered();
        assert!(!breaker.is_open() && !breaker.refusing());
        let (a, b) = (breaker.call(pending_ok()), breaker.call(pending_ok()));
        let (a, b) = tokio::join!(a, b);
        assert!(
            a.is_ok() && b.is_ok(),
            "every call goes through, not one probe"
        );
    }

    async fn pending_ok() -> Result<(), StoreError> {
        tokio::task::yield_now().await;
        Ok(())
    }
}
