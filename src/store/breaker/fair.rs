//! Calls that share one deadline (a cluster request's slot groups, each on its own
//! master): which of their failures count against a breaker.

use std::time::Duration;

use super::MIN_TRIAL;
use super::circuit::CircuitBreaker;
use crate::store::StoreError;

impl CircuitBreaker {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::breaker::BreakerOptions;

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
