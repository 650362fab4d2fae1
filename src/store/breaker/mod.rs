//! Circuit breakers: after `failures_to_open` consecutive failures a breaker stops
//! calls for `open_for` and fails them at once (well under a millisecond), then lets
//! one probe through (half-open); a success closes it, a failure opens it again. An
//! outage then costs each request nothing but the failure-mode decision, instead of
//! a timeout each.
//!
//! [`CircuitBreaker`] is the state machine for one node, usable around any call
//! ([`CircuitBreaker::call`]; `circuit.rs`), with the rules for calls sharing one
//! deadline in `fair.rs`; [`Breaker`] wraps a whole [`Store`] in one, labelled
//! `node="all"` (standalone Redis and Sentinel, where there is one node). A cluster
//! keeps one [`CircuitBreaker`] per master instead (`redis/nodes.rs`), so a stalled
//! master fails only the calls meant for it. Each breaker's state is published as
//! `tollgate_breaker_state{node}` on each transition (never per call).

mod circuit;
mod fair;

use std::sync::Arc;
use std::time::Duration;

pub use self::circuit::CircuitBreaker;
use super::{CounterOp, PingFuture, Store, StoreFuture};
use crate::metrics::Metrics;

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

    /// A node that answers readiness on the connection the calls take (the Redis
    /// store's `ping` asks there too) closes an open breaker
    /// ([`CircuitBreaker::answered`]), so SERVING means calls go to the store.
    fn ping(&self) -> PingFuture<'_> {
        Box::pin(async {
            let pings = self.inner.ping().await;
            if pings.iter().any(|p| p.result.is_ok()) {
                self.breaker.answered();
            }
            pings
        })
    }

    /// Refusing calls (open, or half-open with its probe out) is not ready.
    fn ready(&self) -> bool {
        !self.breaker.refusing() && self.inner.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
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
}
