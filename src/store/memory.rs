//! The in-process store: exact for one process, shared by nothing. Used when no Redis
//! is configured and as the reference the contract suite holds the others to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{CounterKey, CounterOp, Store, StoreFuture};
use crate::algorithm::{Decision, fixed_window};
use crate::clock::{Clock, SystemClock};

/// Counters in a map behind one lock: a request's whole batch is decided under it,
/// which is what makes the batch atomic.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    counters: HashMap<CounterKey, fixed_window::State>,
    /// Next time (seconds) to drop counters whose window has ended, so memory stays
    /// bounded by the keys active in their current window.
    next_sweep: u64,
}

/// How often expired counters are swept, in seconds.
const SWEEP_INTERVAL_SECS: u64 = 10;

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
        let now_secs = self.clock.now_millis() / 1000;
        let mut inner = self.lock();
        inner.sweep(now_secs);

        // Tentative states, one per op, so later ops on the same counter see earlier ones.
        let mut tentative: Vec<fixed_window::State> = Vec::with_capacity(ops.len());
        let mut decisions = Vec::with_capacity(ops.len());
        let mut vetoed = false;
        for (i, op) in ops.iter().enumerate() {
            let prior = ops[..i]
                .iter()
                .rposition(|earlier| earlier.key == op.key)
                .map(|j| tentative[j])
                .or_else(|| inner.counters.get(&op.key).copied());
            let (state, decision) = fixed_window::decide(prior, params(op), now_secs, op.cost);
            vetoed |= op.vetoes && !decision.allowed;
            tentative.push(state);
            decisions.push(decision);
        }

        if vetoed {
            // Nothing is consumed: report what the allowed counters hold without us.
            for (op, decision) in ops.iter().zip(decisions.iter_mut()) {
                if decision.allowed {
                    let current = inner.counters.get(&op.key).copied();
                    *decision = fixed_window::decide(current, params(op), now_secs, 0).1;
                }
            }
        } else {
            // The last tentative state of each counter is its final state.
            for (op, state) in ops.iter().zip(tentative) {
                inner.counters.insert(op.key.clone(), state);
            }
        }
        decisions
    }
}

fn params(op: &CounterOp) -> fixed_window::Params {
    fixed_window::Params {
        limit: op.limit,
        window: op.key.window_secs,
    }
}

impl Inner {
    fn sweep(&mut self, now_secs: u64) {
        if now_secs < self.next_sweep {
            return;
        }
        self.counters
            .retain(|key, state| state.window_start + key.window_secs > now_secs);
        self.next_sweep = now_secs + SWEEP_INTERVAL_SECS;
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl Store for MemoryStore {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        let decisions = self.decide_now(ops);
        Box::pin(async move { Ok(decisions) })
    }
}
