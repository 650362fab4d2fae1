//! When a cross-slot request may acquire its slot groups all at once: the margin rule,
//! and the per-counter hints (what the last replies this process saw said a counter
//! still admits) that let a request skip its check when its counters are far from
//! their limits.
//!
//! The rule: every vetoing operation must leave, after its cost, at least
//! [`margin`] = max([`ABSOLUTE`] x cost, capacity / [`RELATIVE`]). The absolute part
//! covers a burst: [`ABSOLUTE`] more requests of the same size landing on the counter
//! between the reading and the acquisition (a hot counter's reading is one round trip
//! old, about 1 ms; at 25k requests/s on one key that is ~25 requests per replica,
//! so 64 covers two or three replicas at full speed on a single key). The relative
//! part covers a fast rate on a large limit over the reading's age, at most [`TTL`]:
//! an eighth of a limit is spent in 50 ms only at a rate of 2.5 limits per second.
//! A counter within the margin keeps the ordered walk; a margin that is beaten anyway
//! costs the request a refund and the ordered walk (`cluster/mod.rs`), never a wrong
//! admission.
//!
//! Hints live in a direct-mapped table of [`HINTS`] cells (a hash of the key picks the
//! cell; a newer counter evicts an older one): 4096 x 40 bytes, bounded whatever the
//! traffic. A cell whose hash differs, or older than [`TTL`], is no hint: the request
//! asks Redis first (the dry run), as it always did.

use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::scripts::Reply;
use crate::store::CounterOp;

/// Requests of the same cost that may land between a reading and the acquisition.
pub const ABSOLUTE: u64 = 64;
/// The fraction of a counter's capacity (limit or burst) kept as margin, inverted.
pub const RELATIVE: u64 = 8;
/// How long a reading stands in for a dry run. A hot counter is re-read by every
/// reply (its hint is about one round trip old); a cold one is asked again.
pub const TTL: Duration = Duration::from_millis(50);
/// Cells in the hint table.
pub const HINTS: usize = 4096;

/// What `op` must still admit after its cost for the groups to be taken in parallel.
pub fn margin(op: &CounterOp) -> u64 {
    let capacity = op.params.limit.max(op.params.burst);
    op.cost
        .max(1)
        .saturating_mul(ABSOLUTE)
        .max(capacity / RELATIVE)
}

/// Whether every vetoing operation's reply (a dry run: remaining after its cost)
/// leaves at least its margin. Non-vetoing (shadow) operations cannot deny the
/// request, so they do not count.
pub fn ample(ops: &[CounterOp], replies: &[Option<Reply>]) -> bool {
    ops.iter().zip(replies).all(|(op, reply)| {
        !op.vetoes
            || reply.is_some_and(|r| r.decision.allowed && r.decision.remaining >= margin(op))
    })
}

#[derive(Clone, Copy)]
struct Hint {
    key: u64,
    remaining: u64,
    at: Instant,
}

/// The last readings of the counters this process decided on the cross-slot path.
pub struct Headroom {
    cells: Box<[Mutex<Option<Hint>>]>,
    hasher: RandomState,
}

impl Default for Headroom {
    fn default() -> Self {
        Self {
            cells: (0..HINTS).map(|_| Mutex::new(None)).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Headroom {
    /// Whether fresh hints say every vetoing operation leaves its margin after its
    /// cost: then the check can be skipped.
    pub fn ample(&self, keys: &[String], ops: &[CounterOp]) -> bool {
        let now = Instant::now();
        keys.iter().zip(ops).all(|(key, op)| {
            if !op.vetoes {
                return true;
            }
            let (cell, hash) = self.cell(key);
            let hint = *cell.lock().unwrap_or_else(|p| p.into_inner());
            hint.is_some_and(|h| {
                h.key == hash
                    && now.saturating_duration_since(h.at) < TTL
                    && h.remaining.saturating_sub(op.cost) >= margin(op)
            })
        })
    }

    /// Remembers what the replies `indices` (of `replies`) say their counters admit:
    /// nothing after a denial.
    pub fn record(&self, keys: &[String], indices: &[usize], replies: &[Option<Reply>]) {
        let now = Instant::now();
        for &i in indices {
            let Some(reply) = replies[i] else { continue };
            let (cell, hash) = self.cell(&keys[i]);
            let remaining = if reply.decision.allowed {
                reply.decision.remaining
            } else {
                0
            };
            *cell.lock().unwrap_or_else(|p| p.into_inner()) = Some(Hint {
                key: hash,
                remaining,
                at: now,
            });
        }
    }

    fn cell(&self, key: &str) -> (&Mutex<Option<Hint>>, u64) {
        let hash = self.hasher.hash_one(key);
        // HINTS is a power of two far below u64::MAX: the cast and mask are exact.
        const { assert!(HINTS.is_power_of_two()) };
        (&self.cells[(hash as usize) & (HINTS - 1)], hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Decision, Params};
    use crate::store::CounterKey;
    use std::sync::Arc;

    fn op(limit: u64, cost: u64) -> CounterOp {
        CounterOp {
            key: CounterKey {
                domain: Arc::from("d"),
                rule: Arc::from("r"),
                entries: vec![("k".into(), "v".into())],
                algorithm: Algorithm::FixedWindow,
                window_secs: 60,
                hash_tag: None,
            },
            params: Params {
                algorithm: Algorithm::FixedWindow,
                limit,
                window_ms: 60_000,
                burst: limit,
                max_delay_ms: None,
            },
            cost,
            vetoes: true,
        }
    }

    fn reply(allowed: bool, remaining: u64) -> Option<Reply> {
        Some(Reply {
            decision: Decision {
                allowed,
                remaining,
                reset_after: Duration::ZERO,
                retry_after: None,
                delay: Duration::ZERO,
            },
            token: 0,
        })
    }

    #[test]
    fn the_margin_is_the_larger_of_a_burst_of_requests_and_an_eighth_of_the_limit() {
        assert_eq!(margin(&op(100, 1)), 64);
        assert_eq!(margin(&op(100, 3)), 192);
        assert_eq!(margin(&op(1_000_000, 1)), 125_000);
        assert_eq!(margin(&op(10, 0)), 64);
    }

    #[test]
    fn replies_within_the_margin_or_denied_are_not_ample_and_shadow_ops_do_not_count() {
        let ops = [op(1000, 1), op(1000, 1)];
        assert!(ample(&ops, &[reply(true, 125), reply(true, 900)]));
        assert!(!ample(&ops, &[reply(true, 124), reply(true, 900)]));
        assert!(!ample(&ops, &[reply(false, 0), reply(true, 900)]));
        let mut shadow = ops;
        shadow[0].vetoes = false;
        assert!(ample(&shadow, &[reply(false, 0), reply(true, 900)]));
    }

    #[test]
    fn hints_stand_in_for_a_check_only_when_known_fresh_and_ample() {
        let headroom = Headroom::default();
        let keys = ["a".to_owned(), "b".to_owned()];
        let ops = [op(1000, 1), op(1000, 1)];
        assert!(!headroom.ample(&keys, &ops), "no hint yet");
        headroom.record(&keys, &[0, 1], &[reply(true, 900), reply(true, 500)]);
        assert!(headroom.ample(&keys, &ops));
        // One counter near its limit (or denied) is enough to ask Redis first.
        headroom.record(&keys, &[1], &[None, reply(true, 125)]);
        assert!(!headroom.ample(&keys, &ops), "125 - 1 is within the margin");
        headroom.record(&keys, &[1], &[None, reply(false, 0)]);
        assert!(!headroom.ample(&keys, &ops));
        headroom.record(&keys, &[1], &[None, reply(true, 900)]);
        assert!(headroom.ample(&keys, &ops));
        assert!(
            !headroom.ample(&["c".to_owned(), "b".to_owned()], &ops),
            "an unknown key"
        );
    }
}
