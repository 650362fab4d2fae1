//! The local over-limit cache: once a counter has denied a request of cost 1 until a
//! known instant (its retry-after), every replica-local request of cost 1 or more on
//! it is denied until then without asking the store, so a flood of 429s does not
//! become a flood of Redis calls.
//!
//! What may be kept: only a denial that no refund can undo, because the cache assumes
//! a counter never admits earlier than its retry-after (counts only grow until then).
//! Refunds break that: on a Redis Cluster a request that consumed slot group 1 and is
//! denied at group 2 gives group 1 back, so a denial seen at group 1 meanwhile may
//! have counted a hit that is about to vanish (cached, it would leave replicas
//! answering OVER_LIMIT until its retry-after, the rest of the window, while Redis
//! holds nothing).
//! Which denials on a cluster are final cannot be told from the reply (the count does
//! not say which of its hits are still refundable, and the refunding request may run
//! on another replica), and "only requests with one slot group" is not enough (the
//! transient hit belongs to another request). So the rule is the simplest correct
//! one: the cache is used only in front of stores that never refund (memory,
//! standalone and Sentinel, where one script call decides a whole request);
//! `store/stack.rs` leaves it out on a cluster. Check-only calls (cost 0) always go
//! to the store: a full counter still passes them. Shadow-mode counters are answered from the cache
//! too (as envoyproxy/ratelimit's are); they still cannot deny the request. Memory is
//! bounded by a byte budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::sync::Cache;

use super::{CounterKey, CounterOp, PingFuture, Store, StoreFuture};
use crate::algorithm::{Decision, Mode};
use crate::hash::FastState;

/// Identity of a cached denial: the counter and the limit it was denied under (a
/// reload that raises the limit must not keep old denials).
type Key = (CounterKey, u64, u64);

#[derive(Clone, Copy)]
struct DeniedUntil {
    until: Instant,
}

struct UntilExpiry;

impl Expiry<Key, DeniedUntil> for UntilExpiry {
    fn expire_after_create(&self, _: &Key, value: &DeniedUntil, now: Instant) -> Option<Duration> {
        Some(value.until.saturating_duration_since(now))
    }
}

pub struct OverLimitCache<S> {
    inner: S,
    denied: Cache<Key, DeniedUntil, FastState>,
    /// The latest instant any remembered denial lasts until, in ms after `epoch`:
    /// past it nothing cached can answer, so a request skips the lookups (each one
    /// clones and hashes a whole counter key), which is every request while nothing
    /// is being denied.
    latest: AtomicU64,
    epoch: Instant,
    /// Operations answered from the cache (for metrics and tests).
    hits: AtomicU64,
}

fn key(op: &CounterOp) -> Key {
    (op.key.clone(), op.params.limit, op.params.burst)
}

impl<S: Store> OverLimitCache<S> {
    /// `max_bytes`: the memory budget (`LOCAL_CACHE_SIZE_IN_BYTES`), at least 1.
    pub fn new(inner: S, max_bytes: u64) -> Self {
        let denied = Cache::builder()
            .max_capacity(max_bytes.max(1))
            .weigher(|k: &Key, _: &DeniedUntil| {
                // The key itself (a typical one's entries inline), about 56 bytes of
                // moka's node, and what longer entries spill to the heap.
                let bytes = std::mem::size_of::<Key>() + 56 + k.0.entries_heap_bytes();
                u32::try_from(bytes + k.0.rule.len()).unwrap_or(u32::MAX)
            })
            .expire_after(UntilExpiry)
            .build_with_hasher(FastState::default());
        Self {
            inner,
            denied,
            latest: AtomicU64::new(0),
            epoch: Instant::now(),
            hits: AtomicU64::new(0),
        }
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// `at` in ms after `epoch`, rounded up (so `latest` never ends a denial early).
    fn millis(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        u64::try_from(since.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
    }

    fn cached(&self, op: &CounterOp, now: Instant) -> Option<Duration> {
        if op.cost == 0 || op.mode != Mode::Limit || op.commits() {
            return None;
        }
        self.denied
            .get(&key(op))
            .map(|d| d.until.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    fn remember(&self, ops: &[CounterOp], decisions: &[Decision], now: Instant) {
        for (op, d) in ops.iter().zip(decisions) {
            // Only a denial of the smallest cost says what every costed call will get.
            if op.cost == 1
                && op.mode == Mode::Limit
                && !op.commits()
                && !d.allowed
                && let Some(retry) = d.retry_after.filter(|r| !r.is_zero())
            {
                let until = now + retry;
                self.latest.fetch_max(self.millis(until), Ordering::Relaxed);
                self.denied.insert(key(op), DeniedUntil { until });
            }
        }
    }

    /// Decides `ops`, pushing onto `local` the indices answered from the cache.
    async fn decide_cached(
        &self,
        ops: &[CounterOp],
        local: &mut Vec<usize>,
    ) -> Result<Vec<Decision>, super::StoreError> {
        let now = Instant::now();
        let cached: Vec<Option<Duration>> =
            if self.millis(now) > self.latest.load(Ordering::Relaxed) {
                Vec::new()
            } else {
                ops.iter().map(|op| self.cached(op, now)).collect()
            };
        // A release can make a remembered denial wrong: it is forgotten (on this
        // replica; another replica's copy lasts until its retry-after). A request
        // with a charge or a release always goes to the store whole: they are
        // consumed whatever the answer, never decided in a dry run.
        for op in ops.iter().filter(|op| op.mode == Mode::Release) {
            self.denied.invalidate(&key(op));
        }
        if cached.iter().all(Option::is_none)
            || ops.iter().any(|op| op.mode != Mode::Limit || op.commits())
        {
            let decisions = self.inner.decide(ops).await?;
            self.remember(ops, &decisions, now);
            return Ok(decisions);
        }
        // A known denial of a vetoing counter denies the request: the other counters
        // are decided in a dry run (their true statuses, nothing consumed). Known
        // denials of shadow counters alone veto nothing: they are answered here, as
        // envoyproxy/ratelimit answers its shadow limits from its local cache, and the
        // other counters are decided for real. With no other counter, no store call.
        let vetoed = ops
            .iter()
            .zip(&cached)
            .any(|(op, c)| op.vetoes && c.is_some());
        let rest: Vec<usize> = (0..ops.len()).filter(|&i| cached[i].is_none()).collect();
        let others: Vec<CounterOp> = rest.iter().map(|&i| ops[i].clone()).collect();
        let checked = if others.is_empty() {
            Vec::new()
        } else if vetoed {
            self.inner.dry_run(&others).await?
        } else {
            let decided = self.inner.decide(&others).await?;
            self.remember(&others, &decided, now);
            decided
        };
        let mut decisions: Vec<Option<Decision>> = cached
            .iter()
            .map(|c| {
                c.map(|left| Decision {
                    allowed: false,
                    remaining: 0,
                    reset_after: left,
                    retry_after: Some(left),
                    delay: Duration::ZERO,
                })
            })
            .collect();
        let first = local.len();
        local.extend((0..ops.len()).filter(|&i| cached[i].is_some()));
        self.hits
            .fetch_add((local.len() - first) as u64, Ordering::Relaxed);
        for (&i, d) in rest.iter().zip(checked) {
            decisions[i] = Some(d);
        }
        Ok(decisions
            .into_iter()
            .map(|d| d.expect("every operation decided"))
            .collect())
    }
}

impl<S: Store> Store for OverLimitCache<S> {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async move { self.decide_cached(ops, &mut Vec::new()).await })
    }

    fn decide_noting_local<'a>(
        &'a self,
        ops: &'a [CounterOp],
        local: &'a mut Vec<usize>,
    ) -> StoreFuture<'a> {
        Box::pin(self.decide_cached(ops, local))
    }

    /// A dry run consumes nothing, so there is nothing to spare: straight through.
    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        self.inner.dry_run(ops)
    }

    fn ping(&self) -> PingFuture<'_> {
        self.inner.ping()
    }

    fn ready(&self) -> bool {
        self.inner.ready()
    }
}
