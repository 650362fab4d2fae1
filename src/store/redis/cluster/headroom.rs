//! When a cross-slot request may acquire its slot groups all at once: the margin rule,
//! the per-counter hints (what the last replies this process saw said a counter
//! still admits) that let a request skip its check when its counters are far from
//! their limits, and the reservations of the acquisitions in flight.
//!
//! The rule: every vetoing operation must leave, after its cost and after what this
//! process's other parallel acquisitions of the same counter have in flight, at least
//! [`margin`] = max([`ABSOLUTE`] x cost, capacity / [`RELATIVE`]). The absolute part
//! covers a burst: [`ABSOLUTE`] more requests of the same size landing on the counter
//! between the reading and the acquisition (a hot counter's reading is one round trip
//! old, about 1 ms; at 25k requests/s on one key that is ~25 requests per replica,
//! so 64 covers two or three replicas at full speed on a single key). The relative
//! part covers a fast rate on a large limit over the reading's age, at most [`TTL`]:
//! an eighth of a limit is spent in 50 ms only at a rate of 2.5 limits per second.
//! A counter within the margin keeps the ordered walk; a margin that is beaten anyway
//! costs the request a refund and the ordered walk (`cluster/acquire.rs`), never a
//! wrong admission.
//!
//! The reservations make the rule hold within one process whatever its own burst: a
//! request reserves its cost on each counter before it races ([`Reservation`], given
//! back when its acquisition completes or is dropped), and reads the others' in-flight
//! reservations into its own margin; so this replica's racers together never take a
//! counter below its margin. Other replicas' racers are what the margin is for.
//!
//! A limit whose algorithm denies on a wait (a leaky bucket with `max_delay`) has no
//! margin at all: `remaining` is room in its queue, not how many more requests its
//! patience admits, so such an operation always walks.
//!
//! Hints are keyed by the counter's key and its limit's parameters (algorithm, limit,
//! window, burst, max delay): Envoy's per-descriptor override decides one counter
//! under several limits, and a reload may change a limit without its key; a reading
//! made under one limit says nothing about another. They live in a direct-mapped
//! table of [`HINTS`] cells (a hash picks the cell; a newer reading evicts an older
//! one): bounded whatever the traffic. A cell whose hash differs, or older than
//! [`TTL`], is no hint: the request asks Redis first (the dry run), as it always did.
//! In-flight reservations are counted per key in a table of [`HINTS`] atomics; two
//! counters sharing a cell only make each other's margin larger.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
/// Cells in the hint table (and in the table of in-flight reservations).
pub const HINTS: usize = 4096;

/// What `op` must still admit after its cost for the groups to be taken in parallel;
/// `None` when no margin can be argued (the limit denies on a wait, not on a count).
pub fn margin(op: &CounterOp) -> Option<u64> {
    if op.params.max_delay_ms.is_some() {
        return None;
    }
    let capacity = op.params.limit.max(op.params.burst);
    Some(
        op.cost
            .max(1)
            .saturating_mul(ABSOLUTE)
            .max(capacity / RELATIVE),
    )
}

/// Where one operation's readings and reservations are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    /// The hint's identity: the key and the limit's parameters.
    hint: u64,
    /// The counter's identity (its key alone): what is in flight on it.
    counter: u64,
}

#[derive(Clone, Copy)]
struct Hint {
    id: u64,
    remaining: u64,
    at: Instant,
}

/// The last readings of the counters this process decided on the cross-slot path,
/// and what its parallel acquisitions have in flight on them.
pub struct Headroom {
    cells: Box<[Mutex<Option<Hint>>]>,
    in_flight: Arc<[AtomicU64]>,
    hasher: RandomState,
}

impl Default for Headroom {
    fn default() -> Self {
        Self {
            cells: (0..HINTS).map(|_| Mutex::new(None)).collect(),
            in_flight: (0..HINTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }
}

/// Costs reserved on counters by one parallel acquisition, given back on drop.
pub struct Reservation {
    in_flight: Arc<[AtomicU64]>,
    held: Vec<(usize, u64)>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        for &(cell, cost) in &self.held {
            self.in_flight[cell].fetch_sub(cost, Ordering::AcqRel);
        }
    }
}

/// The cell of a hash: HINTS is a power of two far below u64::MAX, so the cast and
/// mask are exact.
fn cell_of(hash: u64) -> usize {
    const { assert!(HINTS.is_power_of_two()) };
    (hash as usize) & (HINTS - 1)
}

impl Headroom {
    /// Where each operation's readings and reservations live (`keys` are theirs).
    pub fn ids(&self, keys: &[String], ops: &[CounterOp]) -> Vec<Ids> {
        keys.iter()
            .zip(ops)
            .map(|(key, op)| {
                let p = &op.params;
                let limit = (p.algorithm, p.limit, p.window_ms, p.burst, p.max_delay_ms);
                Ids {
                    hint: self.hasher.hash_one((key, limit)),
                    counter: self.hasher.hash_one(key),
                }
            })
            .collect()
    }

    /// Fresh hints say every vetoing operation leaves its margin after its cost and
    /// what is in flight: the check can be skipped, the costs are reserved.
    pub fn hinted(&self, ids: &[Ids], ops: &[CounterOp]) -> Option<Reservation> {
        let now = Instant::now();
        self.reserve(ids, ops, |i| {
            let hint = *self.cells[cell_of(ids[i].hint)]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let hint =
                hint.filter(|h| h.id == ids[i].hint && now.saturating_duration_since(h.at) < TTL)?;
            Some(hint.remaining.saturating_sub(ops[i].cost))
        })
    }

    /// The check (`replies`, dry runs: remaining after each cost) says every vetoing
    /// operation leaves its margin after what is in flight: the costs are reserved.
    pub fn checked(
        &self,
        ids: &[Ids],
        ops: &[CounterOp],
        replies: &[Option<Reply>],
    ) -> Option<Reservation> {
        self.reserve(ids, ops, |i| {
            replies[i]
                .filter(|r| r.decision.allowed)
                .map(|r| r.decision.remaining)
        })
    }

    /// Reserves every vetoing operation's cost if `room(i)` (what operation i leaves
    /// after its cost, if known) covers its margin plus what was reserved before it.
    /// Reserving before comparing makes concurrent callers see each other.
    fn reserve(
        &self,
        ids: &[Ids],
        ops: &[CounterOp],
        room: impl Fn(usize) -> Option<u64>,
    ) -> Option<Reservation> {
        let mut reservation = Reservation {
            in_flight: Arc::clone(&self.in_flight),
            held: Vec::new(),
        };
        for (i, op) in ops.iter().enumerate() {
            if !op.vetoes {
                continue;
            }
            let margin = margin(op)?;
            let room = room(i)?;
            let cell = cell_of(ids[i].counter);
            let before = self.in_flight[cell].fetch_add(op.cost, Ordering::AcqRel);
            reservation.held.push((cell, op.cost));
            if room < before.saturating_add(margin) {
                return None;
            }
        }
        Some(reservation)
    }

    /// Remembers what the replies `indices` (of `replies`) say their counters admit:
    /// nothing after a denial.
    pub fn record(&self, ids: &[Ids], indices: &[usize], replies: &[Option<Reply>]) {
        for &i in indices {
            if let Some(reply) = replies[i] {
                self.remember(ids[i], reply);
            }
        }
    }

    /// Remembers what `reply` says the counter of `ids` admits.
    pub fn remember(&self, ids: Ids, reply: Reply) {
        let remaining = if reply.decision.allowed {
            reply.decision.remaining
        } else {
            0
        };
        *self.cells[cell_of(ids.hint)]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Hint {
            id: ids.hint,
            remaining,
            at: Instant::now(),
        });
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Decision, Params};
    use crate::store::CounterKey;

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

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[test]
    fn the_margin_is_the_larger_of_a_burst_of_requests_and_an_eighth_of_the_limit() {
        assert_eq!(margin(&op(100, 1)), Some(64));
        assert_eq!(margin(&op(100, 3)), Some(192));
        assert_eq!(margin(&op(1_000_000, 1)), Some(125_000));
        assert_eq!(margin(&op(10, 0)), Some(64));
    }

    /// Finding 2: a leaky bucket's `remaining` is room in its queue; a request that
    /// would wait past `max_delay` is denied whatever the room. No reading of it
    /// shows a margin, so it never races.
    #[test]
    fn a_limit_that_denies_on_a_wait_never_shows_a_margin() {
        let headroom = Headroom::default();
        let mut shaped = op(1_000_000, 1);
        shaped.params.algorithm = Algorithm::LeakyBucket;
        shaped.params.max_delay_ms = Some(10);
        assert_eq!(margin(&shaped), None);
        let ops = [shaped, op(1_000_000, 1)];
        let ids = headroom.ids(&keys(&["a", "b"]), &ops);
        let roomy = [reply(true, 999_999), reply(true, 999_999)];
        assert!(headroom.checked(&ids, &ops, &roomy).is_none());
        headroom.record(&ids, &[0, 1], &roomy);
        assert!(headroom.hinted(&ids, &ops).is_none());
        // Without the patience limit the same bucket is counted as any other.
        let mut queue = ops;
        queue[0].params.max_delay_ms = None;
        let ids = headroom.ids(&keys(&["a", "b"]), &queue);
        assert!(headroom.checked(&ids, &queue, &roomy).is_some());
    }

    #[test]
    fn replies_within_the_margin_or_denied_are_not_ample_and_shadow_ops_do_not_count() {
        let headroom = Headroom::default();
        let ops = [op(1000, 1), op(1000, 1)];
        let ids = headroom.ids(&keys(&["a", "b"]), &ops);
        let ample = |replies: &[Option<Reply>; 2], ops: &[CounterOp]| {
            headroom.checked(&ids, ops, replies).is_some()
        };
        assert!(ample(&[reply(true, 125), reply(true, 900)], &ops));
        assert!(!ample(&[reply(true, 124), reply(true, 900)], &ops));
        assert!(!ample(&[reply(false, 0), reply(true, 900)], &ops));
        let mut shadow = ops;
        shadow[0].vetoes = false;
        assert!(ample(&[reply(false, 0), reply(true, 900)], &shadow));
    }

    #[test]
    fn hints_stand_in_for_a_check_only_when_known_fresh_and_ample() {
        let headroom = Headroom::default();
        let ops = [op(1000, 1), op(1000, 1)];
        let ids = headroom.ids(&keys(&["a", "b"]), &ops);
        let ample = || headroom.hinted(&ids, &ops).is_some();
        assert!(!ample(), "no hint yet");
        headroom.record(&ids, &[0, 1], &[reply(true, 900), reply(true, 500)]);
        assert!(ample());
        // One counter near its limit (or denied) is enough to ask Redis first.
        headroom.record(&ids, &[1], &[None, reply(true, 125)]);
        assert!(!ample(), "125 - 1 is within the margin");
        headroom.record(&ids, &[1], &[None, reply(false, 0)]);
        assert!(!ample());
        headroom.record(&ids, &[1], &[None, reply(true, 900)]);
        assert!(ample());
        let unknown = headroom.ids(&keys(&["c", "b"]), &ops);
        assert!(headroom.hinted(&unknown, &ops).is_none(), "an unknown key");
    }

    /// Finding 3: Envoy's per-descriptor override decides one counter under another
    /// limit. A reading made under limit 1000 is no hint for a limit-10 request.
    #[test]
    fn a_hint_is_for_the_limit_it_was_read_under() {
        let headroom = Headroom::default();
        let names = keys(&["a", "b"]);
        let wide = [op(1000, 1), op(1000, 1)];
        let wide_ids = headroom.ids(&names, &wide);
        headroom.record(&wide_ids, &[0, 1], &[reply(true, 900), reply(true, 900)]);
        assert!(headroom.hinted(&wide_ids, &wide).is_some());
        let narrow = [op(10, 1), op(1000, 1)];
        let narrow_ids = headroom.ids(&names, &narrow);
        assert!(headroom.hinted(&narrow_ids, &narrow).is_none());
        // Nor for the same limit under another burst or algorithm.
        let mut bucket = wide;
        bucket[0].params.burst = 2000;
        assert!(
            headroom
                .hinted(&headroom.ids(&names, &bucket), &bucket)
                .is_none()
        );
        bucket[0].params.algorithm = Algorithm::TokenBucket;
        bucket[0].params.burst = 1000;
        assert!(
            headroom
                .hinted(&headroom.ids(&names, &bucket), &bucket)
                .is_none()
        );
    }

    /// Finding 1: this process's racers read each other's costs in flight, so
    /// together they never take a counter below its margin; a reservation given back
    /// (its acquisition done or dropped) frees its share.
    #[test]
    fn acquisitions_in_flight_count_against_the_margin_until_released() {
        let headroom = Headroom::default();
        let ops = [op(1_000_000, 1), op(1_000_000, 1)];
        let ids = headroom.ids(&keys(&["a", "b"]), &ops);
        // 10 above the margin of 125 000 after the request's cost: 11 racers fit.
        let replies = [reply(true, 125_010), reply(true, 900_000)];
        let mut held: Vec<Reservation> = (0..11)
            .map(|_| headroom.checked(&ids, &ops, &replies).expect("room for 11"))
            .collect();
        assert!(headroom.checked(&ids, &ops, &replies).is_none(), "the 12th");
        headroom.record(&ids, &[0, 1], &[reply(true, 125_011), reply(true, 900_000)]);
        assert!(headroom.hinted(&ids, &ops).is_none(), "hinted alike");
        // The refused attempts gave back what they reserved; a finished racer too.
        held.pop();
        assert!(headroom.checked(&ids, &ops, &replies).is_some());
        held.clear();
        assert!(
            headroom
                .in_flight
                .iter()
                .all(|c| c.load(Ordering::Relaxed) == 0)
        );
    }
}
