//! The in-process store: exact for one process, shared by nothing. Used when no Redis
//! is configured and as the reference the contract suite holds the others to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{CounterKey, CounterOp, Store, StoreFuture};
use crate::algorithm::{self, Decision, State};
use crate::clock::{Clock, SystemClock};

/// Counters in a map behind one lock: a request's whole batch is decided under it,
/// which is what makes the batch atomic.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each counter with the instant (ms) after which it equals no state at all.
    counters: HashMap<CounterKey, (State, u64)>,
    /// Next time (ms) to drop expired counters, so memory stays bounded by the keys
    /// that still matter.
    next_sweep: u64,
}

/// How often expired counters are swept, in milliseconds.
const SWEEP_INTERVAL_MS: u64 = 10_000;

impl MemoryStore {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Number of live counters (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied batch (the map is
        // only written after every decision is made), so a poisoned lock is safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides a batch synchronously; see [`Store`] for the contract.
    pub fn decide_now(&self, ops: &[CounterOp]) -> Vec<Decision> {
        self.decide_batch(ops, false)
    }

    /// [`Store::dry_run`] without the future: decides, consumes nothing.
    pub fn dry_run_now(&self, ops: &[CounterOp]) -> Vec<Decision> {
        self.decide_batch(ops, true)
    }

    fn decide_batch(&self, ops: &[CounterOp], dry_run: bool) -> Vec<Decision> {
        let now = self.clock.now_millis();
        let mut inner = self.lock();
        inner.sweep(now);

        // Tentative states, one per op, so later ops on the same counter see earlier ones.
        let mut tentative: Vec<State> = Vec::with_capacity(ops.len());
        let mut decisions = Vec::with_capacity(ops.len());
        let mut vetoed = dry_run;
        for (i, op) in ops.iter().enumerate() {
            let prior = match ops[..i].iter().rposition(|earlier| earlier.key == op.key) {
                Some(j) => Some(&tentative[j]),
                None => inner.current(&op.key, now),
            };
            let (state, decision) = algorithm::decide(prior, &op.params, now, op.cost);
            vetoed |= op.vetoes && !decision.allowed;
            tentative.push(state);
            decisions.push(decision);
        }

        if vetoed {
            // Nothing is consumed: report what the allowed counters hold without us.
            // Same convention as lua/batch.lua: remaining and reset of a check-only call
            // on the untouched state, and no shaping wait for what was not consumed.
            for (op, decision) in ops.iter().zip(decisions.iter_mut()) {
                if decision.allowed {
                    let check =
                        algorithm::decide(inner.current(&op.key, now), &op.params, now, 0).1;
                    decision.remaining = check.remaining;
                    decision.reset_after = check.reset_after;
                    decision.delay = std::time::Duration::ZERO;
                }
            }
        } else {
            // Each counter that admitted something is written once, with the state
            // its last operation left (as lua/batch.lua does: a counter whose
            // operations were all denied keeps its stored state untouched).
            let mut written: Vec<&CounterKey> = Vec::new();
            for (i, op) in ops.iter().enumerate().rev() {
                if !decisions[i].allowed || written.contains(&&op.key) {
                    continue;
                }
                written.push(&op.key);
                let last = ops.iter().rposition(|o| o.key == op.key).unwrap_or(i);
                let state = tentative[last].clone();
                let expires = algorithm::expires_at_ms(&state, &op.params, now);
                inner.counters.insert(op.key.clone(), (state, expires));
            }
        }
        decisions
    }
}

impl Inner {
    fn current(&self, key: &CounterKey, now: u64) -> Option<&State> {
        self.counters
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(state, _)| state)
    }

    fn sweep(&mut self, now: u64) {
        if now < self.next_sweep {
            return;
        }
        self.counters.retain(|_, (_, expires)| *expires > now);
        self.next_sweep = now + SWEEP_INTERVAL_MS;
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
