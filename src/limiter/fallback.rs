//! Deciding without the counter store, by the domain's `failure_mode`: fail open,
//! fail closed, report UNAVAILABLE, or count in this process with each replica
//! admitting its share of every limit. Every fallback decision is counted, and logged
//! at most once a second per domain ([`ratelimited`]) with the number not logged since.
//!
//! The `local` counts are bounded (the memory store's byte budget, least recently
//! used evicted) and dropped as soon as the store answers again: they are never
//! combined with the store's counts. So around a fault a replica can admit, per
//! counter and window, up to its local share (limit / replicas, rounded up) on top
//! of what the store admitted in the same window; docs/operations.md states the
//! bound and `tests/it/local_fallback.rs` measures it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::algorithm::Decision;
use crate::config::FailureMode;
use crate::error::Error;
use crate::metrics::EvictionCounter;
use crate::store::memory::{DEFAULT_MAX_BYTES, MemoryStore};
use crate::store::{CounterOp, StoreError};
use crate::telemetry::ratelimited;

pub struct Fallback {
    local: MemoryStore,
    /// How many replicas share the limits (`--replicas`): the local share is 1/N.
    replicas: u64,
    /// Decisions taken per mode, in `FailureMode::ALL` order.
    counts: [AtomicU64; 4],
    /// Whether `local` may hold counts, so the store's next answer clears it (one
    /// relaxed load per request otherwise).
    local_used: AtomicBool,
}

impl Fallback {
    /// `max_bytes` bounds the local counts (`None`: the memory store's default).
    pub fn new(replicas: u32, max_bytes: Option<u64>, evictions: Option<EvictionCounter>) -> Self {
        let max_bytes = max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        Self {
            local: MemoryStore::bounded(max_bytes, "fallback", evictions),
            replicas: u64::from(replicas.max(1)),
            counts: Default::default(),
            local_used: AtomicBool::new(false),
        }
    }

    /// The store answered: local counts from an outage are dropped, so the next
    /// outage starts from zero rather than from stale counts.
    pub fn store_answered(&self) {
        if self.local_used.load(Ordering::Relaxed) && self.local_used.swap(false, Ordering::AcqRel)
        {
            self.local.clear();
            tracing::info!(
                event = "local_counts_dropped",
                "the counter store answers again: dropped the failure_mode: local counts"
            );
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
                self.local_used.store(true, Ordering::Relaxed);
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
