//! The region's own counters, as the sync uses them: what a window's counter holds,
//! read without consuming (a dry run, nothing written), and a release, which
//! consumes the released amount on the counter before the ledger hears of it.
//!
//! Why a release consumes: a region's replicas decide with the grant they last
//! learnt, and one of them may not have heard yet that the share shrank. Lowering
//! the limit would leave it admitting up to the old grant. Consuming the amount
//! instead makes it unavailable to every replica at once, whatever limit each
//! decides with (all of them at most the grant): the counter admits iff
//! `count + cost <= limit <= grant`, so after a release of `r` the region admits at
//! most `grant - r` in the window. The release goes through only if it fits
//! (`count + r <= grant`), and the ledger counts it only once it has (`divide.rs`).
//!
//! Both happen only well inside the window, by at least the clock skew allowed from
//! either boundary, from before the call to after its answer: then the region's
//! Redis counted in the same window as this host, and the reading or the release
//! belongs to it.

use std::sync::Arc;

use super::divide::Released;
use super::record::Pending;
use super::table::Entry;
use super::window;
use crate::algorithm::{Division, Mode};
use crate::clock::Clock;
use crate::store::{CounterOp, Store};

/// Operations per store call.
const CHUNK: usize = 256;

/// The limit a reading decides under: above any count (a region's counter holds its
/// admissions and releases, up to its grant, which may pass the configured limit),
/// so the count is this less what remains.
const READ_LIMIT: u64 = u32::MAX as u64;

/// Whether `[before, after]` lies in one window, at least `guard` from its ends.
fn inside(before: u64, after: u64, window_ms: u64, guard_ms: u64) -> Option<u64> {
    let w = window::index(before, window_ms);
    let clear = before >= window::start(w, window_ms) + guard_ms
        && after.saturating_add(guard_ms) < window::end(w, window_ms);
    clear.then_some(w)
}

fn op(entry: &Entry, limit: u64, cost: u64) -> CounterOp {
    CounterOp {
        key: entry.key.clone(),
        params: entry.base.shared(Division::Window, limit),
        cost,
        // Each on its own: one refused does not stop the others.
        vetoes: false,
        mode: Mode::Limit,
        lease: None,
    }
}

/// What each counter holds in the window in progress (admitted plus released), for
/// the entries that count per window; `None` for the others, when the store did not
/// answer, or when the reading was too near a boundary to name its window.
pub async fn counts(
    store: &dyn Store,
    clock: &dyn Clock,
    skew_ms: u64,
    entries: &[Arc<Entry>],
) -> Vec<Option<(u64, u64)>> {
    let mut out = vec![None; entries.len()];
    let window_entries: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].division == Division::Window)
        .collect();
    for chunk in window_entries.chunks(CHUNK) {
        let ops: Vec<CounterOp> = chunk
            .iter()
            .map(|&i| op(&entries[i], READ_LIMIT, 0))
            .collect();
        let before = clock.now_millis();
        let Ok(decisions) = store.dry_run(&ops).await else {
            continue;
        };
        let after = clock.now_millis();
        for (&i, decision) in chunk.iter().zip(decisions) {
            let e = &entries[i];
            let guard = window::guard(e.base.window_ms, skew_ms);
            if let Some(w) = inside(before, after, e.base.window_ms, guard) {
                out[i] = Some((w, READ_LIMIT.saturating_sub(decision.remaining)));
            }
        }
    }
    out
}

/// Carries out the releases the ledger asked for: each consumed on its counter (or
/// refused by it), as the ledger will be told.
pub async fn release(
    store: &dyn Store,
    clock: &dyn Clock,
    skew_ms: u64,
    asked: &[(Arc<Entry>, u64, Pending)],
) -> Vec<Released> {
    let refused = |w: u64, p: &Pending| Released {
        window: w,
        id: p.id.clone(),
        amount: 0,
    };
    let mut out: Vec<Released> = asked.iter().map(|(_, w, p)| refused(*w, p)).collect();
    let before = clock.now_millis();
    let mut ops = Vec::new();
    let mut which = Vec::new();
    for (i, (entry, w, pending)) in asked.iter().enumerate() {
        let guard = window::guard(entry.base.window_ms, skew_ms);
        let grant = entry.grant(*w);
        if inside(before, before, entry.base.window_ms, guard) == Some(*w) && grant > 0 {
            ops.push(op(entry, grant, pending.amount));
            which.push(i);
        }
    }
    for (ops, which) in ops.chunks(CHUNK).zip(which.chunks(CHUNK)) {
        let Ok(decisions) = store.decide(ops).await else {
            continue;
        };
        let after = clock.now_millis();
        for ((op, &i), decision) in ops.iter().zip(which).zip(decisions) {
            let (entry, w, _) = &asked[i];
            let guard = window::guard(entry.base.window_ms, skew_ms);
            // Consumed in another window than the one asked: not reported (that
            // window's counter only admits less for it).
            if decision.allowed && inside(before, after, entry.base.window_ms, guard) == Some(*w) {
                out[i].amount = op.cost;
            }
        }
    }
    out
}
