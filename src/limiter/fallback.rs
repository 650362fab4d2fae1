//! Deciding without the counter store, by the domain's `failure_mode`: fail open,
//! fail closed, report UNAVAILABLE, or count in this process with each replica
//! admitting its share of every limit. Every fallback decision is counted, and logged
//! at most once a second per domain ([`ratelimited`]) with the number not logged since.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::algorithm::Decision;
use crate::config::FailureMode;
use crate::error::Error;
use crate::store::memory::MemoryStore;
use crate::store::{CounterOp, StoreError};
use crate::telemetry::ratelimited;

pub struct Fallback {
    local: MemoryStore,
    /// How many replicas share the limits (`--replicas`): the local share is 1/N.
    replicas: u64,
    /// Decisions taken per mode, in `FailureMode::ALL` order.
    counts: [AtomicU64; 4],
}

impl Fallback {
    pub fn new(replicas: u32) -> Self {
        Self {
            local: MemoryStore::new(),
            replicas: u64::from(replicas.max(1)),
            counts: Default::default(),
        }
    }

    /// Fallback decisions taken so far, per mode.
    pub fn counts(&self) -> Vec<(FailureMode, u64)> {
        FailureMode::ALL
            .iter()
            .zip(&self.counts)
            .map(|((mode, _), n)| (*mode, n.load(Ordering::Relaxed)))
            .collect()
    }

    pub fn decide(
        &self,
        mode: FailureMode,
        ops: &[CounterOp],
        error: StoreError,
        domain: &str,
    ) -> Result<Vec<Decision>, Error> {
        let index = FailureMode::ALL
            .iter()
            .position(|(m, _)| *m == mode)
            .unwrap_or(0);
        self.counts[index].fetch_add(1, Ordering::Relaxed);
        self.log(mode, &error, domain);
        let synthetic = |allowed: bool| -> Vec<Decision> {
            ops.iter()
                .map(|op| Decision {
                    allowed,
                    remaining: if allowed { op.params.limit } else { 0 },
                    reset_after: Duration::ZERO,
                    retry_after: None,
                    delay: Duration::ZERO,
                })
                .collect()
        };
        match mode {
            FailureMode::Allow => Ok(synthetic(true)),
            FailureMode::Deny => Ok(synthetic(false)),
            FailureMode::Error => Err(Error::Store(error)),
            FailureMode::Local => {
                let share: Vec<CounterOp> = ops
                    .iter()
                    .map(|op| {
                        let mut op = op.clone();
                        op.params.limit = op.params.limit.div_ceil(self.replicas);
                        op.params.burst = op.params.burst.div_ceil(self.replicas).max(1);
                        op
                    })
                    .collect();
                Ok(self.local.decide_now(&share))
            }
        }
    }

    /// At most one line a second per domain, with how many were not logged since.
    fn log(&self, mode: FailureMode, error: &StoreError, domain: &str) {
        let Some(suppressed) = ratelimited::admit(&["store_fallback", domain]) else {
            return;
        };
        tracing::warn!(
            event = "store_fallback",
            domain,
            failure_mode = mode.name(),
            error = %error,
            suppressed,
            "counter store cannot decide; answering by failure_mode"
        );
    }
}
