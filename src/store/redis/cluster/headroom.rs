//! When a cross-slot request may acquire its slot groups all at once: the margin rule and
//! the per-counter hints (what the last replies this process saw said a counter
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
//! costs the request a refund and the ordered walk (`strategy/race.rs`), never a
//! wrong admission.
//!
//! No reservation of what this process has in flight: reserving each racer's cost and
//! counting it against the others' margin (a review's proposal) split a burst into a
//! few racers and many walkers on the same counters at the same moment, which block
//! each other as unordered acquisitions do (300 at once over 3 replicas on limit 100
//! admitted 58 in one round); without it the whole burst races, the losers refund,
//! and the ordered walk sorts them out (25 of 25 rounds admitted exactly 100).
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

use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::scripts::Reply;
use crate::hash::FastState;
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

/// What this process knows of a request's counters, for skipping the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Fresh hints say every vetoing operation leaves its margin.
    Hinted,
    /// Some vetoing operation has no fresh reading (a cold counter: distinct keys are
    /// mostly cold), and would leave its margin even if it were empty; the others
    /// have hints leaving theirs. Racing without a check costs one round trip; a
    /// counter that turns out near its limit denies, and the request refunds and
    /// walks, as after a stale hint. The check would have cost a round trip and a
    /// dry-run segment per group for every such request, and read the same room.
    Cold,
    /// Ask Redis first (the check): some counter is, or may be, within its margin.
    Ask,
}

/// Where one operation's readings are kept: a hash of its key and its limit's
/// parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    hint: u64,
}

#[derive(Clone, Copy)]
struct Hint {
    id: u64,
    remaining: u64,
    at: Instant,
}

/// The last readings of the counters this process decided on the cross-slot path.
pub struct Headroom {
    cells: Box<[Mutex<Option<Hint>>]>,
    hasher: FastState,
}

impl Default for Headroom {
    fn default() -> Self {
        Self {
            cells: (0..HINTS).map(|_| Mutex::new(None)).collect(),
            hasher: FastState::default(),
        }
    }
}

/// Whether every vetoing operation i of `ops` leaves its margin, `room(i)` being what
/// it leaves after its cost, if known.
fn leave_margins(ops: &[CounterOp], mut room: impl FnMut(usize) -> Option<u64>) -> bool {
    ops.iter().enumerate().all(|(i, op)| {
        !op.vetoes
            || margin(op)
                .zip(room(i))
                .is_some_and(|(margin, room)| room >= margin)
    })
}

/// The cell of a hash: HINTS is a power of two far below u64::MAX, so the cast and
/// mask are exact.
fn cell_of(hash: u64) -> usize {
    const { assert!(HINTS.is_power_of_two()) };
    (hash as usize) & (HINTS - 1)
}

impl Headroom {
    /// Where each operation's readings live (`keys` are theirs).
    pub fn ids(&self, keys: &[String], ops: &[CounterOp]) -> Vec<Ids> {
        keys.iter()
            .zip(ops)
            .map(|(key, op)| {
                let p = &op.params;
                let limit = (p.algorithm, p.limit, p.window_ms, p.burst, p.max_delay_ms);
                Ids {
                    hint: self.hasher.hash_one((key, limit)),
                }
            })
            .collect()
    }

    /// Fresh hints say every vetoing operation leaves its margin after its cost: the
    /// check can be skipped.
    #[cfg(test)]
    pub fn hinted(&self, ids: &[Ids], ops: &[CounterOp]) -> bool {
        self.reading(ids, ops) == Reading::Hinted
    }

    /// Whether the request may skip its check ([`Reading`]).
    pub fn reading(&self, ids: &[Ids], ops: &[CounterOp]) -> Reading {
        let now = Instant::now();
        let mut cold = false;
        let race = leave_margins(ops, |i| {
            let hint = *self.cells[cell_of(ids[i].hint)]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match hint.filter(|h| h.id == ids[i].hint && now.saturating_duration_since(h.at) < TTL)
            {
                Some(hint) => Some(hint.remaining.saturating_sub(ops[i].cost)),
                None => {
                    cold = true;
                    let capacity = ops[i].params.limit.max(ops[i].params.burst);
                    Some(capacity.saturating_sub(ops[i].cost))
                }
            }
        });
        match (race, cold) {
            (false, _) => Reading::Ask,
            (true, false) => Reading::Hinted,
            (true, true) => Reading::Cold,
        }
    }

    /// The check (`replies`, dry runs: remaining after each cost) says every vetoing
    /// operation leaves its margin.
    pub fn checked(&self, ops: &[CounterOp], replies: &[Option<Reply>]) -> bool {
        leave_margins(ops, |i| {
            replies[i]
                .filter(|r| r.decision.allowed)
                .map(|r| r.decision.remaining)
        })
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
    use std::sync::Arc;

    fn op(limit: u64, cost: u64) -> CounterOp {
        CounterOp {
            key: CounterKey {
                domain: Arc::from("d"),
                rule: Arc::from("r"),
                entries: [("k".into(), "v".into())].into_iter().collect(),
                algorithm: Algorithm::FixedWindow,
                window_secs: 60,
                time_zone: None,
                hash_tag: None,
            },
            params: Params {
                algorithm: Algorithm::FixedWindow,
                limit,
                window_ms: 60_000,
                burst: limit,
                max_delay_ms: None,
                calendar: None,
            },
            cost,
            vetoes: true,
            mode: crate::algorithm::Mode::Limit,
            lease: None,
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

    /// A leaky bucket's `remaining` is room in its queue; a request that
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
        assert!(!headroom.checked(&ops, &roomy));
        headroom.record(&ids, &[0, 1], &roomy);
        assert!(!headroom.hinted(&ids, &ops));
        // Without the patience limit the same bucket is counted as any other.
        let mut queue = ops;
        queue[0].params.max_delay_ms = None;
        assert!(headroom.checked(&queue, &roomy));
    }

    #[test]
    fn replies_within_the_margin_or_denied_are_not_ample_and_shadow_ops_do_not_count() {
        let headroom = Headroom::default();
        let ops = [op(1000, 1), op(1000, 1)];
        let ample =
            |replies: &[Option<Reply>; 2], ops: &[CounterOp]| headroom.checked(ops, replies);
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
        let ample = || headroom.hinted(&ids, &ops);
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
        assert!(!headroom.hinted(&unknown, &ops), "an unknown key");
    }

    /// Envoy's per-descriptor override decides one counter under another
    /// limit. A reading made under limit 1000 is no hint for a limit-10 request.
    #[test]
    fn a_hint_is_for_the_limit_it_was_read_under() {
        let headroom = Headroom::default();
        let names = keys(&["a", "b"]);
        let wide = [op(1000, 1), op(1000, 1)];
        let wide_ids = headroom.ids(&names, &wide);
        headroom.record(&wide_ids, &[0, 1], &[reply(true, 900), reply(true, 900)]);
        assert!(headroom.hinted(&wide_ids, &wide));
        let narrow = [op(10, 1), op(1000, 1)];
        let narrow_ids = headroom.ids(&names, &narrow);
        assert!(!headroom.hinted(&narrow_ids, &narrow));
        // Nor for the same limit under another burst or algorithm.
        let mut bucket = wide;
        bucket[0].params.burst = 2000;
        assert!(!headroom.hinted(&headroom.ids(&names, &bucket), &bucket));
        bucket[0].params.algorithm = Algorithm::TokenBucket;
        bucket[0].params.burst = 1000;
        assert!(!headroom.hinted(&headroom.ids(&names, &bucket), &bucket));
    }
}
