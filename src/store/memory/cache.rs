//! The memory store's cache: what it holds per counter (an entry behind a lock of its
//! own), what an entry weighs against the byte budget, when an entry expires, and the
//! moka cache built from them (LRU, evictions counted and logged).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use super::super::CounterKey;
use crate::algorithm::State;
use crate::clock::Clock;
use crate::hash::FastState;
use crate::metrics::EvictionCounter;
use crate::telemetry::ratelimited;

/// The counters, by key.
pub(super) type Counters = Cache<CounterKey, Slot, FastState>;

/// What an entry costs beyond its key's and state's own bytes: moka's entry (its
/// `Arc`s, the LRU deque node, the hash table slot, the timer wheel node) and the
/// allocator's rounding. Measured, not derived: with 320 here, 800k distinct
/// counters under a 32 MiB budget kept 60k counters at a 67 MiB RSS peak; with 512
/// (about 750 bytes a typical counter) 45k counters at 54 MiB, most of the rest being
/// the test process itself (`tests/it/memory_store.rs` prints it).
const ENTRY_OVERHEAD: usize = 512;

/// A counter's state with the instant (ms, by the store's clock) after which it
/// equals no state at all.
#[derive(Clone)]
pub(super) struct Entry {
    pub state: State,
    pub expires_ms: u64,
}

/// What the cache holds per counter: the entry behind a lock of its own, so a counter
/// already in the cache is updated in place (a lookup) instead of inserted again (an
/// insert allocates several of moka's nodes, each request). Every write happens under
/// the batch lock; this lock only makes the write visible to the cache's callbacks.
pub(super) type Slot = Arc<Mutex<Entry>>;

pub(super) fn read(slot: &Slot) -> std::sync::MutexGuard<'_, Entry> {
    // Nothing panics while holding it (a plain assignment), so poison says nothing.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops an entry when its state has expired by the store's clock, so idle counters
/// leave without waiting for eviction. Only with the system clock: an injected test
/// clock does not move with the cache's real time.
pub(super) struct UntilExpired {
    clock: Arc<dyn Clock>,
}

impl UntilExpired {
    fn left(&self, slot: &Slot) -> Option<Duration> {
        Some(Duration::from_millis(
            read(slot)
                .expires_ms
                .saturating_sub(self.clock.now_millis()),
        ))
    }
}

impl Expiry<CounterKey, Slot> for UntilExpired {
    fn expire_after_create(&self, _: &CounterKey, slot: &Slot, _: Instant) -> Option<Duration> {
        self.left(slot)
    }

    fn expire_after_update(
        &self,
        _: &CounterKey,
        slot: &Slot,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.left(slot)
    }

    /// An entry updated in place to a new expiry is read right after (see `write`),
    /// so its new expiry reaches the cache this way.
    fn expire_after_read(
        &self,
        _: &CounterKey,
        slot: &Slot,
        _: Instant,
        _: Option<Duration>,
        _: Instant,
    ) -> Option<Duration> {
        self.left(slot)
    }
}

/// The estimated bytes one counter holds: the fixed parts (a typical key's entries
/// among them, inline), what longer entries spill to the heap, the state's heap (a
/// sliding log's timestamps) and [`ENTRY_OVERHEAD`].
fn weigh(key: &CounterKey, slot: &Slot) -> u32 {
    let spilled = key.entries_heap_bytes();
    let state = read(slot).state.heap_bytes();
    let fixed = std::mem::size_of::<CounterKey>() + std::mem::size_of::<Entry>();
    u32::try_from(ENTRY_OVERHEAD + fixed + spilled + state).unwrap_or(u32::MAX)
}

/// The cache of at most `max_bytes` (estimated); `expire` drops entries past their
/// expiry on the system clock (see [`UntilExpired`]).
pub(super) fn build(
    clock: Arc<dyn Clock>,
    max_bytes: u64,
    name: &'static str,
    evictions: Option<EvictionCounter>,
    expire: bool,
) -> Counters {
    let mut builder = Cache::builder()
        .max_capacity(max_bytes.max(1))
        .weigher(weigh)
        // LRU rather than moka's default TinyLFU: TinyLFU may refuse to admit a
        // new key, and a counter that is not kept would admit without bound.
        .eviction_policy(EvictionPolicy::lru())
        .eviction_listener(move |_, _, cause| {
            if cause != RemovalCause::Size {
                return;
            }
            if let Some(evictions) = &evictions {
                evictions.inc();
            }
            if let Some(suppressed) = ratelimited::admit(&["memory_store_eviction", name]) {
                tracing::warn!(
                    event = "memory_store_eviction",
                    store = name,
                    max_bytes,
                    suppressed,
                    "memory store full: evicting the least recently used counters \
                     (they start again from zero)"
                );
            }
        });
    if expire {
        builder = builder.expire_after(UntilExpired {
            clock: clock.clone(),
        });
    }
    builder.build_with_hasher(FastState::default())
}
