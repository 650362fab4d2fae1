//! The byte budget of all RLQS state in this process (`--rlqs-max-bytes`): every
//! stream, every bucket a stream holds and every claim of the memory ledger is charged
//! what it costs, estimated from its size (the figures below are measured, see
//! docs/rlqs.md), and what would pass the budget is refused: a new stream or a new
//! bucket ends its stream with RESOURCE_EXHAUSTED, the others never notice.

use std::sync::atomic::{AtomicU64, Ordering};

/// What one open stream costs beyond its buckets: its task, channels, registration
/// and the HTTP/2 stream state the server keeps for it.
pub const STREAM_BYTES: u64 = 16 * 1024;

/// What one bucket of a stream costs beyond its id's and ledger key's bytes: its
/// state, its place in the stream's map, its share of the allocator's overhead.
/// Measured: 825-863 bytes of RSS per bucket, id and key included, where this
/// charges about 970 (docs/rlqs.md, `scripts/rlqs-measure memory`).
pub const BUCKET_BYTES: u64 = 900;

/// What one claim of the memory ledger costs, its names (kept twice: in the claims and
/// in the deadlines) included: measured about 200 bytes of RSS.
pub const CLAIM_BYTES: u64 = 320;

/// What a bucket of the memory ledger costs beyond its claims and key.
pub const LEDGER_BUCKET_BYTES: u64 = 256;

/// Bytes charged and the most that may be.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// Charges `bytes` if they fit.
    pub fn take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= self.limit)
            })
            .is_ok()
    }

    /// Charges `bytes` whether or not they fit: growth of what is already admitted
    /// (a claim the memory ledger must keep), which the next new thing pays for.
    pub fn force(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives `bytes` back.
    pub fn give(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// A bucket's charge: its fixed cost, its id's bytes and its ledger key's.
pub fn bucket_bytes(id_bytes: usize, ledger_key_bytes: usize) -> u64 {
    BUCKET_BYTES + id_bytes as u64 + ledger_key_bytes as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_does_not_fit_is_refused_and_given_back_bytes_fit_again() {
        let budget = Budget::new(100);
        assert!(budget.take(60));
        assert!(!budget.take(41));
        assert!(budget.take(40));
        budget.give(50);
        assert_eq!(budget.used(), 50);
        budget.force(80);
        assert!(!budget.take(1), "forced past the limit: nothing new fits");
        budget.give(1_000);
        assert_eq!(budget.used(), 0);
    }
}
