//! Circuit breakers: after `failures_to_open` consecutive failures a breaker stops
//! calls for `open_for` and fails them at once (well under a millisecond), then lets
//! one probe through (half-open); a success closes it, a failure opens it again. An
//! outage then costs each request nothing but the failure-mode decision, instead of
//! a timeout each.
//!
//! [`CircuitBreaker`] is the state machine for one node, usable around any call
//! ([`CircuitBreaker::call`]); [`Breaker`] wraps a whole [`Store`] in one, labelled
//! `node="all"` (standalone Redis and Sentinel, where there is one node). A cluster
//! keeps one [`CircuitBreaker`] per master instead (`redis/nodes.rs`), so a stalled
//! master fails only the calls meant for it. Each breaker's state is published as
//! `tollgate_breaker_state{node}` on each transition (never per call).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{CounterOp, PingFuture, Store, StoreError, StoreFuture};
use crate::metrics::{BreakerGauge, BreakerState, Metrics};
use crate::telemetry::ratelimited;

/// The `node` label of the one breaker in front of the whole store.
pub const ALL_NODES: &str = "all";

/// A shared budget left below this is not worth a call ([`CircuitBreaker::call_by`]).
pub const MIN_TRIAL: Duration = Duration::from_millis(1);

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
    options: BreakerOptions,
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

    /// [`CircuitBreaker::call`] bounded by `deadline`, one of several calls sharing it
    /// (a cluster request's slot groups). Returns the result and whether it was
    /// charged to this breaker.
    ///
    /// Why not every timeout counts: the calls before this one may have spent the
    /// shared budget on another, slow node. A timeout is evidence against this node
    /// only when the call had a fair trial, at least `fair` of time; a shorter budget
    /// that runs out fails the call (the request follows its failure mode) but
    /// leaves the breaker as it was. A budget under [`MIN_TRIAL`] is not tried at all.
    pub async fn call_by<T>(
        &self,
        deadline: tokio::time::Instant,
        fair: Duration,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> (Result<T, StoreError>, bool) {
        let bounded = async {
            tokio::time::timeout_at(deadline, call)
                .await
                .unwrap_or(Err(StoreError::Timeout(timeout)))
        };
        self.call_within(deadline, fair, timeout, bounded).await
    }

    /// [`CircuitBreaker::call_by`] for a `call` that ends by about `deadline` itself
    /// (a queue that gives up its calls at their deadlines): no timer of its own, so
    /// it ends as late as the call does.
    pub async fn call_within<T>(
        &self,
        deadline: tokio::time::Instant,
        fair: Duration,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> (Result<T, StoreError>, bool) {
        let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
        if budget < MIN_TRIAL {
            return (Err(StoreError::Timeout(timeout)), false);
        }
        let fair_trial = budget >= fair;
        let mut charged = true;
        let result = self
            .call_judged(call, |result| {
                charged = fair_trial || !matches!(result, Err(StoreError::Timeout(_)));
                charged
            })
            .await;
        // Refused while open: counted already, as the failures that opened it.
        (result, charged)
    }

    /// Runs `call` under the breaker; its result is recorded when `counts` says so (an
    /// uncounted probe hands the probe on, as a cancelled one does).
    async fn call_judged<T>(
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

/// A whole store behind one breaker, `node="all"`.
pub struct Breaker<S> {
    inner: S,
    breaker: CircuitBreaker,
}

impl<S: Store> Breaker<S> {
    pub fn new(inner: S, options: BreakerOptions) -> Self {
        Self {
            inner,
            breaker: CircuitBreaker::new(ALL_NODES, options, None),
        }
    }

    /// Publishes the state as `tollgate_breaker_state{node="all"}` (closed from now).
    pub fn with_metrics(mut self, metrics: Option<&Arc<Metrics>>) -> Self {
        self.breaker = CircuitBreaker::new(ALL_NODES, self.breaker.options, metrics);
        self
    }

    /// Whether calls currently fail fast (for health and metrics).
    pub fn is_open(&self) -> bool {
        self.breaker.is_open()
    }
}

impl<S: Store> Store for Breaker<S> {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.breaker.call(self.inner.decide(ops)))
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.breaker.call(self.inner.dry_run(ops)))
    }

    fn ping(&self) -> PingFuture<'_> {
        self.inner.ping()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// A store that fails (0), never answers (1) or answers with nothing (2).
    struct Scripted(AtomicU8);

    impl Store for Scripted {
        fn decide<'a>(&'a self, _ops: &'a [CounterOp]) -> StoreFuture<'a> {
            let mode = self.0.load(Ordering::SeqCst);
            Box::pin(async move {
                match mode {
                    0 => Err(StoreError::Unavailable("down".into())),
                    1 => std::future::pending().await,
                    _ => Ok(Vec::new()),
                }
            })
        }

        fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
            self.decide(ops)
        }
    }

    #[tokio::test]
    async fn a_cancelled_probe_lets_the_next_call_probe() {
        let breaker = Breaker::new(
            Scripted(AtomicU8::new(0)),
            BreakerOptions {
                failures_to_open: 1,
                open_for: Duration::from_millis(1),
            },
        );
        assert!(breaker.decide(&[]).await.is_err());
        assert!(breaker.is_open());
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The probe hangs and its caller gives up.
        breaker.inner.0.store(1, Ordering::SeqCst);
        let probe = tokio::time::timeout(Duration::from_millis(20), breaker.decide(&[])).await;
        assert!(probe.is_err(), "the probe was still waiting");
        // Redis is back: the next call is admitted as the new probe and closes it.
        breaker.inner.0.store(2, Ordering::SeqCst);
        assert!(breaker.decide(&[]).await.is_ok());
        assert!(!breaker.is_open());
    }

    #[tokio::test]
    async fn the_state_gauge_follows_the_transitions() {
        let metrics = std::sync::Arc::new(Metrics::default());
        let breaker = Breaker::new(
            Scripted(AtomicU8::new(0)),
            BreakerOptions {
                failures_to_open: 2,
                open_for: Duration::ZERO,
            },
        )
        .with_metrics(Some(&metrics));
        let state = || {
            let text = metrics.encode().unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix(r#"tollgate_breaker_state{node="all"} "#))
                .map(str::to_owned)
        };
        assert_eq!(state().as_deref(), Some("0"));
        assert!(breaker.decide(&[]).await.is_err());
        assert_eq!(
            state().as_deref(),
            Some("0"),
            "one failure of two: still closed"
        );
        assert!(breaker.decide(&[]).await.is_err());
        assert_eq!(state().as_deref(), Some("2"));
        // The probe hangs: half-open while it is out.
        breaker.inner.0.store(1, Ordering::SeqCst);
        let mut probe = breaker.decide(&[]);
        assert!(futures_util::poll!(&mut probe).is_pending());
        assert_eq!(state().as_deref(), Some("1"));
        // Its caller gives up: open again (expired), so the next call probes.
        drop(probe);
        assert_eq!(state().as_deref(), Some("2"));
        breaker.inner.0.store(2, Ordering::SeqCst);
        assert!(breaker.decide(&[]).await.is_ok());
        assert_eq!(state().as_deref(), Some("0"));
    }
    /// A shared deadline spent elsewhere (an earlier slot group on a slow master) must
    /// not open this breaker: only timeouts after a fair trial count.
    #[tokio::test]
    async fn only_a_fair_trial_charges_a_timeout() {
        let breaker = CircuitBreaker::new(
            "b",
            BreakerOptions {
                failures_to_open: 1,
                open_for: Duration::from_secs(60),
            },
            None,
        );
        let fair = Duration::from_millis(50);
        let timeout = Duration::from_millis(250);
        let hangs = || std::future::pending::<Result<(), StoreError>>();
        let now = tokio::time::Instant::now;
        // Budget already gone: not even tried.
        let (result, charged) = breaker.call_by(now(), fair, timeout, hangs()).await;
        assert!(matches!(result, Err(StoreError::Timeout(_))) && !charged);
        // A little budget, run out: failed, not charged.
        let deadline = now() + Duration::from_millis(5);
        let (result, charged) = breaker.call_by(deadline, fair, timeout, hangs()).await;
        assert!(matches!(result, Err(StoreError::Timeout(_))) && !charged);
        assert!(
            !breaker.is_open(),
            "opened by timeouts without a fair trial"
        );
        // A short budget that is enough is a success as ever.
        let deadline = now() + Duration::from_millis(5);
        let ok = async { Ok::<(), StoreError>(()) };
        assert!(breaker.call_by(deadline, fair, timeout, ok).await.0.is_ok());
        // Any other failure counts whatever the budget.
        let down = async { Err::<(), _>(StoreError::Unavailable("down".into())) };
        let (_, charged) = breaker.call_by(deadline, fair, timeout, down).await;
        assert!(charged && breaker.is_open());
    }

    #[tokio::test]
    async fn a_fair_timeout_opens_and_an_uncharged_probe_is_handed_on() {
        let breaker = CircuitBreaker::new(
            "b",
            BreakerOptions {
                failures_to_open: 1,
                open_for: Duration::ZERO,
            },
            None,
        );
        let fair = Duration::from_millis(5);
        let timeout = Duration::from_millis(250);
        let hangs = || std::future::pending::<Result<(), StoreError>>();
        let now = tokio::time::Instant::now;
        let deadline = now() + Duration::from_millis(10);
        let (result, charged) = breaker.call_by(deadline, fair, timeout, hangs()).await;
        assert!(matches!(result, Err(StoreError::Timeout(_))) && charged);
        assert!(breaker.is_open());
        // The probe gets too little time: not charged, and the next call probes.
        let deadline = now() + Duration::from_millis(2);
        let (_, charged) = breaker.call_by(deadline, fair, timeout, hangs()).await;
        assert!(!charged && breaker.is_open());
        let ok = async { Ok::<(), StoreError>(()) };
        let deadline = now() + Duration::from_millis(100);
        assert!(breaker.call_by(deadline, fair, timeout, ok).await.0.is_ok());
        assert!(!breaker.is_open());
    }
}
