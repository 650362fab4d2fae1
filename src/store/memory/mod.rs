//! The in-process store: exact for one process, shared by nothing. Used when no Redis
//! is configured, as the `failure_mode: local` store, and as the reference the
//! contract suite holds the others to.
//!
//! Memory is bounded by a byte budget (`--memory-store-bytes`): counters live in a
//! moka cache weighed by an estimate of each entry's bytes (the cache's own
//! bookkeeping included), and when the budget is reached the least recently used
//! counters are evicted, counted in `tollgate_memory_store_evictions_total` and
//! logged at most once a second. An evicted counter starts again from zero, so
//! eviction can only over-admit, and only for counters idle longer than every
//! counter kept.

mod cache;

use std::sync::{Arc, Mutex};

use self::cache::{Entry, Slot, read};
use super::{CounterKey, CounterOp, Store, StoreFuture};
use crate::algorithm::{self, Decision, State};
use crate::clock::{Clock, SystemClock};
use crate::metrics::EvictionCounter;

/// The budget when none is given: room for about 90k counters of a typical shape
/// (two descriptor entries, about 750 bytes each with the cache's bookkeeping).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Counters in a bounded cache; a request's whole batch is decided and written under
/// one lock, which is what makes the batch atomic (the cache alone is atomic per key
/// only).
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    batch: Mutex<()>,
    counters: cache::Counters,
}

impl MemoryStore {
    /// The default budget, the system clock, evictions not counted.
    pub fn new() -> Self {
        Self::bounded(DEFAULT_MAX_BYTES, "memory", None)
    }

    /// A store on an injected clock (tests), with the default budget.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, DEFAULT_MAX_BYTES, "memory", None, false)
    }

    /// At most `max_bytes` (estimated) of counters; `name` labels the eviction metric
    /// and log (`memory` for the server's store, `fallback` for `failure_mode: local`).
    pub fn bounded(max_bytes: u64, name: &'static str, evictions: Option<EvictionCounter>) -> Self {
        Self::build(Arc::new(SystemClock), max_bytes, name, evictions, true)
    }

    fn build(
        clock: Arc<dyn Clock>,
        max_bytes: u64,
        name: &'static str,
        evictions: Option<EvictionCounter>,
        expire: bool,
    ) -> Self {
        let counters = cache::build(clock.clone(), max_bytes, name, evictions, expire);
        Self {
            clock,
            batch: Mutex::new(()),
            counters,
        }
    }

    /// Forgets every counter (the `failure_mode: local` counts once Redis is back).
    pub fn clear(&self) {
        let _batch = self.lock();
        self.counters.invalidate_all();
    }

    /// Number of live counters (for tests and metrics).
    pub fn len(&self) -> usize {
        self.counters.run_pending_tasks();
        usize::try_from(self.counters.entry_count()).unwrap_or(usize::MAX)
    }

    /// The estimated bytes held (what the budget bounds).
    pub fn weighted_bytes(&self) -> u64 {
        self.counters.run_pending_tasks();
        self.counters.weighted_size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic while holding the lock cannot leave a half-applied batch (the cache
        // is only written after every decision is made), so a poisoned lock is safe.
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counter's slot, if the cache holds one, and its state unless expired.
    fn current(&self, key: &CounterKey, now: u64) -> (Option<Slot>, Option<State>) {
        let Some(slot) = self.counters.get(key) else {
            return (None, None);
        };
        let state = {
            let entry = read(&slot);
            (entry.expires_ms > now).then(|| entry.state.clone())
        };
        (Some(slot), state)
    }

    /// Stores a counter's new entry: in place when the cache still holds `slot` and
    /// the entry weighs what it did (the cache weighs on insert only), else inserted.
    fn write(&self, key: &CounterKey, slot: Option<&Slot>, entry: Entry) {
        if let Some(slot) = slot {
            let mut current = read(slot);
            if current.state.heap_bytes() == entry.state.heap_bytes() {
                let same_expiry = current.expires_ms == entry.expires_ms;
                *current = entry;
                drop(current);
                // The lookup in `current` already gave the cache this expiry (a fixed
                // window's, until the window ends: most writes), so a second lookup
                // (a hash of the whole key) would tell it nothing. Were the slot
                // evicted in between, the write is lost just as if the eviction came
                // right after it, which eviction may do any time; were it expired, the
                // unchanged expiry has passed for the new state too.
                if same_expiry {
                    return;
                }
                // The read hands the new expiry to the cache (`expire_after_read`) and
                // proves the slot was not evicted meanwhile.
                if self
                    .counters
                    .get(key)
                    .is_some_and(|held| Arc::ptr_eq(&held, slot))
                {
                    return;
                }
                let entry = read(slot).clone();
                self.counters
                    .insert(key.clone(), Arc::new(Mutex::new(entry)));
                return;
            }
        }
        self.counters
            .insert(key.clone(), Arc::new(Mutex::new(entry)));
    }

    /// Decides a batch synchronously; see [`Store`] for the contract.
    pub fn decide_now(&self, ops: &[CounterOp]) -> Vec<Decision> {
        self.decide_batch(ops, false)
    }

    /// [`Store::dry_run`] without the future: decides, consumes nothing.
    pub fn dry_run_now(&self, ops: &[CounterOp]) -> Vec<Decision> {
        self.decide_batch(ops, true)
    }

    /// Gives back what the admitted limit `op` took, `token` naming the state it took
    /// from (as the Redis store's refund call does when another slot group of the
    /// request denied it: `lua/refund.lua`'s twin, for the differential test). The
    /// counter keeps its expiry, as the script's writes keep their TTL.
    pub fn refund_now(&self, op: &CounterOp, token: i64) {
        let now = self.clock.now_millis();
        let _batch = self.lock();
        let (Some(slot), Some(state)) = self.current(&op.key, now) else {
            return;
        };
        let state = algorithm::refund(&state, &op.params, now, (token, op.cost));
        let expires_ms = read(&slot).expires_ms;
        self.write(&op.key, Some(&slot), Entry { state, expires_ms });
    }

    fn decide_batch(&self, ops: &[CounterOp], dry_run: bool) -> Vec<Decision> {
        let now = self.clock.now_millis();
        let _batch = self.lock();
        // Each counter's slot and stored state, read once (a clone out of the cache).
        let stored: Vec<(Option<Slot>, Option<State>)> =
            ops.iter().map(|op| self.current(&op.key, now)).collect();

        // Tentative states, one per op, so later ops on the same counter see earlier ones.
        let mut tentative: Vec<State> = Vec::with_capacity(ops.len());
        let mut decisions = Vec::with_capacity(ops.len());
        let mut vetoed = dry_run;
        for (i, op) in ops.iter().enumerate() {
            let prior = match ops[..i].iter().rposition(|earlier| earlier.key == op.key) {
                Some(j) => Some(&tentative[j]),
                None => stored[i].1.as_ref(),
            };
            let (state, decision) = algorithm::apply(prior, &op.params, now, op.lease_args());
            vetoed |= op.vetoes && !decision.allowed;
            tentative.push(state);
            decisions.push(decision);
        }

        if vetoed && !dry_run {
            self.unwind(ops, &stored, &mut decisions, now);
            self.commit_charges(ops, &stored, &mut decisions, now);
        } else if vetoed {
            // Nothing is consumed: report what the allowed counters hold without us.
            // Same convention as lua/batch.lua: remaining and reset of a check-only call
            // on the untouched state, and no shaping wait for what was not consumed.
            for (i, (op, decision)) in ops.iter().zip(decisions.iter_mut()).enumerate() {
                if decision.allowed {
                    let check = algorithm::decide(stored[i].1.as_ref(), &op.params, now, 0).1;
                    decision.remaining = check.remaining;
                    decision.reset_after = check.reset_after;
                    decision.delay = std::time::Duration::ZERO;
                }
            }
        } else {
            // Each counter that admitted something is written once, with the state
            // its last operation left (as lua/batch.lua does: a counter whose
            // operations were all denied keeps its stored state untouched).
            for (i, op) in ops.iter().enumerate().rev() {
                let later = || ops[i + 1..].iter().zip(&decisions[i + 1..]);
                // Written already by a later admitted operation on the same counter.
                let writes = |o: &CounterOp, d: &Decision| d.allowed || o.commits();
                if !writes(op, &decisions[i])
                    || later().any(|(o, d)| writes(o, d) && o.key == op.key)
                {
                    continue;
                }
                let last = ops.iter().rposition(|o| o.key == op.key).unwrap_or(i);
                let state = tentative[last].clone();
                let expires_ms = algorithm::expires_at_ms(&state, &op.params, now);
                self.write(&op.key, stored[i].0.as_ref(), Entry { state, expires_ms });
            }
        }
        decisions
    }
}

impl MemoryStore {
    /// A denied request's limits consume nothing: each allowed one reports what a
    /// check of the untouched counter reports (as lua/batch.lua's `unwind`).
    fn unwind(
        &self,
        ops: &[CounterOp],
        stored: &[(Option<Slot>, Option<State>)],
        decisions: &mut [Decision],
        now: u64,
    ) {
        for (i, (op, decision)) in ops.iter().zip(decisions.iter_mut()).enumerate() {
            if decision.allowed && !op.commits() {
                let check = algorithm::decide(stored[i].1.as_ref(), &op.params, now, 0).1;
                decision.remaining = check.remaining;
                decision.reset_after = check.reset_after;
                decision.delay = std::time::Duration::ZERO;
            }
        }
    }

    /// A denied request's charges and releases happen all the same: decided again in
    /// order on the counters without the limits' hits, and written (as lua/batch.lua).
    fn commit_charges(
        &self,
        ops: &[CounterOp],
        stored: &[(Option<Slot>, Option<State>)],
        decisions: &mut [Decision],
        now: u64,
    ) {
        let mut committed: Vec<Option<State>> = vec![None; ops.len()];
        for (i, op) in ops.iter().enumerate() {
            if !op.commits() {
                continue;
            }
            let prior = match ops[..i]
                .iter()
                .rposition(|earlier| earlier.key == op.key && earlier.commits())
            {
                Some(j) => committed[j].as_ref(),
                None => stored[i].1.as_ref(),
            };
            let (state, decision) = algorithm::apply(prior, &op.params, now, op.lease_args());
            decisions[i] = decision;
            committed[i] = Some(state);
        }
        for (i, op) in ops.iter().enumerate() {
            let later = ops[i + 1..].iter().any(|o| o.key == op.key && o.commits());
            if let Some(state) = committed[i].take().filter(|_| !later) {
                let expires_ms = algorithm::expires_at_ms(&state, &op.params, now);
                self.write(&op.key, stored[i].0.as_ref(), Entry { state, expires_ms });
            }
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        let decisions = self.decide_batch(ops, false);
        Box::pin(async move { Ok(decisions) })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        let decisions = self.decide_batch(ops, true);
        Box::pin(async move { Ok(decisions) })
    }
}
