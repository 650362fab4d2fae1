//! The table one replica decides global requests from: per global counter it has
//! met, the grants its region holds by window (kept up to date by the sync,
//! `sync.rs`) and the demand seen since the last report. A request reads it, never
//! waits on it: [`Table::lookup`] is a hash lookup and an atomic load.
//!
//! The limit a request takes is the smallest grant among the windows its Redis may
//! count it in (`window::candidates`): near a boundary this host and Redis may
//! disagree on the window, by at most the clock skew allowed. A window with no grant
//! is a share of zero: the request is denied here, without asking Redis (a rate of
//! zero has no meaning for a bucket), and the sync is woken to ask for a share.
//!
//! The table is bounded (`--global-max-counters`): past the bound the least recently
//! used counter is forgotten (counted); met again, it decides on nothing until the
//! next sync brings its grants back from the ledger.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use tokio::sync::Notify;

use super::window;
use crate::algorithm::{Decision, Division, Params};
use crate::clock::Clock;
use crate::hash::FastState;
use crate::store::CounterKey;

/// What a request on a global counter decides with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lookup {
    /// The region's share: decide in Redis with these parameters.
    Shared(Params),
    /// No share for the window: denied, with this decision, without asking Redis.
    Unshared(Decision),
}

/// One global counter as this replica knows it.
pub struct Entry {
    pub key: CounterKey,
    /// Its name in the ledger (`id.rs`).
    pub id: String,
    /// The configured limit the shares divide.
    pub base: Params,
    pub division: Division,
    /// The region's grant per window, in window order.
    grants: ArcSwap<Vec<(u64, u64)>>,
    /// Hits requested (admitted or not) since the last report.
    hits: AtomicU64,
    /// Requests denied for want of a share since the last sync (for the metrics).
    unshared: AtomicU64,
    last_used_ms: AtomicU64,
    /// What only the sync touches.
    pub(super) sync: Mutex<super::entry_sync::EntrySync>,
}

impl Entry {
    fn new(key: CounterKey, base: Params, division: Division, now_ms: u64) -> Self {
        Self {
            id: super::id::of(&key),
            key,
            base,
            division,
            grants: ArcSwap::from_pointee(Vec::new()),
            hits: AtomicU64::new(0),
            unshared: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(now_ms),
            sync: Mutex::new(super::entry_sync::EntrySync::new(now_ms)),
        }
    }

    /// The grants by window.
    pub fn grants(&self) -> Vec<(u64, u64)> {
        self.grants.load().to_vec()
    }

    /// The grant of window `w` (0: none).
    pub fn grant(&self, w: u64) -> u64 {
        self.grants
            .load()
            .iter()
            .find(|(at, _)| *at == w)
            .map_or(0, |(_, g)| *g)
    }

    /// Replaces the grants: the sync's, after the ledger answered (and a test's).
    pub fn set_grants(&self, grants: Vec<(u64, u64)>) {
        self.grants.store(Arc::new(grants));
    }

    /// One request's cost against this counter (its demand, admitted or not).
    pub fn note(&self, cost: u64) {
        self.hits.fetch_add(cost, Ordering::Relaxed);
    }

    /// Hits since the last call (the sync's report).
    pub(super) fn take_hits(&self) -> u64 {
        self.hits.swap(0, Ordering::Relaxed)
    }

    /// Requests denied for want of a share since the last call.
    pub(super) fn take_unshared(&self) -> u64 {
        self.unshared.swap(0, Ordering::Relaxed)
    }

    pub fn last_used_ms(&self) -> u64 {
        self.last_used_ms.load(Ordering::Relaxed)
    }

    /// The limit for a request at `now_ms`: the smallest grant of the windows Redis
    /// may count it in.
    fn share_at(&self, now_ms: u64, guard_ms: u64) -> u64 {
        let grants = self.grants.load();
        window::candidates(now_ms, self.base.window_ms, guard_ms)
            .map(|w| {
                grants
                    .iter()
                    .find(|(at, _)| *at == w)
                    .map_or(0, |(_, g)| *g)
            })
            .min()
            .unwrap_or(0)
    }
}

/// Every global counter this replica has met, bounded.
pub struct Table {
    entries: Cache<CounterKey, Arc<Entry>, FastState>,
    clock: Arc<dyn Clock>,
    /// The clock skew allowed between this host and its Redis.
    skew_ms: u64,
    /// Wakes the sync: a request was denied, or met a counter without a share.
    wake: Notify,
    evicted: Arc<AtomicU64>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("counters", &self.entries.entry_count())
            .field("skew_ms", &self.skew_ms)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// At most `max_counters` counters; `skew`: the clock skew allowed.
    pub fn new(max_counters: u64, skew: Duration, clock: Arc<dyn Clock>) -> Self {
        let evicted = Arc::new(AtomicU64::new(0));
        let counted = evicted.clone();
        let entries = Cache::builder()
            .max_capacity(max_counters.max(1))
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |_, _, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build_with_hasher(FastState::default());
        Self {
            entries,
            clock,
            skew_ms: u64::try_from(skew.as_millis()).unwrap_or(u64::MAX),
            wake: Notify::new(),
            evicted,
        }
    }

    /// What a request on `key` decides with, and the counter's entry (to note the
    /// request's cost on). `base` is the configured limit; `division` its algorithm's.
    pub fn lookup(
        &self,
        key: &CounterKey,
        base: &Params,
        division: Division,
    ) -> (Arc<Entry>, Lookup) {
        let now = self.clock.now_millis();
        let entry = self.entry(key, base, division, now);
        entry.last_used_ms.store(now, Ordering::Relaxed);
        let guard = window::guard(base.window_ms, self.skew_ms);
        let share = entry.share_at(now, guard);
        if share == 0 {
            entry.unshared.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_one();
            return (entry, Lookup::Unshared(unshared(base.window_ms, now)));
        }
        (entry, Lookup::Shared(base.shared(division, share)))
    }

    /// A request on a global counter was denied: the sync may bring more share.
    pub fn denied(&self) {
        self.wake.notify_one();
    }

    /// Resolves when a request asked for the sync.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    fn entry(&self, key: &CounterKey, base: &Params, division: Division, now: u64) -> Arc<Entry> {
        if let Some(entry) = self.entries.get(key) {
            if entry.base == *base {
                return entry;
            }
            // The config changed this counter's limit: a new entry, whose grants the
            // next sync brings back (the ledger keeps them by counter, not by limit).
            let fresh = Arc::new(Entry::new(key.clone(), *base, division, now));
            self.entries.insert(key.clone(), fresh.clone());
            return fresh;
        }
        self.entries
            .entry_by_ref(key)
            .or_insert_with(|| Arc::new(Entry::new(key.clone(), *base, division, now)))
            .into_value()
    }

    /// Every counter, for the sync and `/global`.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.entries.iter().map(|(_, e)| e).collect()
    }

    /// Forgets a counter no request has used for a while.
    pub fn forget(&self, key: &CounterKey) {
        self.entries.invalidate(key);
    }

    /// Counters forgotten because the table was full.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_millis()
    }

    pub fn skew_ms(&self) -> u64 {
        self.skew_ms
    }
}

/// A denial for want of a share: until the window in progress ends (a share may
/// come sooner, at the next sync, but none is promised).
fn unshared(window_ms: u64, now_ms: u64) -> Decision {
    let left = window::end(window::index(now_ms, window_ms), window_ms).saturating_sub(now_ms);
    Decision {
        allowed: false,
        remaining: 0,
        reset_after: Duration::from_millis(left),
        retry_after: Some(Duration::from_millis(left)),
        delay: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::ManualClock;

    const MINUTE: u64 = 60_000;

    fn key() -> CounterKey {
        CounterKey {
            domain: Arc::from("api"),
            rule: Arc::from("tenant"),
            entries: [("tenant".into(), "acme".into())].into_iter().collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 60,
            time_zone: None,
            hash_tag: None,
        }
    }

    fn params() -> Params {
        Params {
            algorithm: Algorithm::FixedWindow,
            limit: 6000,
            window_ms: MINUTE,
            burst: 6000,
            max_delay_ms: None,
            calendar: None,
        }
    }

    #[test]
    fn no_grant_denies_and_a_grant_is_the_limit() {
        let clock = Arc::new(ManualClock::new(10 * MINUTE + 30_000));
        let table = Table::new(10, Duration::from_millis(250), clock.clone());
        let (entry, first) = table.lookup(&key(), &params(), Division::Window);
        let Lookup::Unshared(denied) = first else {
            panic!("{first:?}")
        };
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Some(Duration::from_secs(30)));
        entry.set_grants(vec![(10, 4200), (11, 1000)]);
        let (_, now) = table.lookup(&key(), &params(), Division::Window);
        assert!(matches!(now, Lookup::Shared(p) if p.limit == 4200));
        // Within the guard of the boundary, the smaller of the two windows' grants.
        clock.set_millis(11 * MINUTE - 100);
        let (_, near) = table.lookup(&key(), &params(), Division::Window);
        assert!(
            matches!(near, Lookup::Shared(p) if p.limit == 1000),
            "{near:?}"
        );
        clock.set_millis(11 * MINUTE + 100);
        let (_, after) = table.lookup(&key(), &params(), Division::Window);
        assert!(matches!(after, Lookup::Shared(p) if p.limit == 1000));
        // Past the last window held: nothing.
        clock.set_millis(12 * MINUTE + 1000);
        let (_, gone) = table.lookup(&key(), &params(), Division::Window);
        assert!(matches!(gone, Lookup::Unshared(_)));
    }

    #[test]
    fn the_table_is_bounded_and_counts_what_it_forgets() {
        let clock = Arc::new(ManualClock::new(MINUTE));
        let table = Table::new(2, Duration::ZERO, clock);
        for i in 0..5 {
            let mut k = key();
            k.entries[0].1 = format!("t{i}").into();
            table.lookup(&k, &params(), Division::Window);
        }
        table.entries.run_pending_tasks();
        assert!(table.entries().len() <= 2);
        assert!(table.evicted() >= 3, "{}", table.evicted());
    }
}
