//! Stores for tests: `RedisStore`s on the harness's real servers, each under a key
//! prefix of its own (tests isolate by prefix, never by restarting Redis), with a
//! generous timeout (tests assert counts, not latency, on a busy 2-core machine); and
//! `DownStore`, which fails every call, for what a Redis outage looks like from above.

use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Params};
use tollgate::clock::ManualClock;
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget};
use tollgate::store::{CounterKey, CounterOp, Store, StoreError, StoreFuture};

pub fn standalone_target() -> RedisTarget {
    RedisTarget::Standalone(super::redis::standalone().url())
}

pub fn cluster_target() -> RedisTarget {
    RedisTarget::Cluster(super::redis::cluster().seed_urls())
}

/// Options for `target` with a fresh prefix made from `test`.
pub fn options(target: RedisTarget, test: &str) -> RedisOptions {
    RedisOptions {
        target,
        auth: None,
        key_prefix: super::redis::unique_prefix(test),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        tls: Default::default(),
        state_layout: Default::default(),
    }
}

pub async fn connect(options: &RedisOptions) -> RedisStore {
    RedisStore::connect(options)
        .await
        .expect("connect to the test Redis")
}

pub async fn standalone(test: &str) -> RedisStore {
    connect(&options(standalone_target(), test)).await
}

pub async fn cluster(test: &str) -> RedisStore {
    connect(&options(cluster_target(), test)).await
}

/// A store that is always down, as Redis is during an outage.
pub struct DownStore;

impl Store for DownStore {
    fn decide<'a>(&'a self, _ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async { Err(StoreError::Unavailable("test store is down".into())) })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        self.decide(ops)
    }
}

/// A memory store on a clock that stands still at Tuesday 2026-12-01 12:00:30 UTC:
/// no minute, hour, day or week ends between the calls a test counts across.
pub fn still_memory_store() -> Arc<MemoryStore> {
    let clock = Arc::new(ManualClock::new(1_796_126_430_000));
    Arc::new(MemoryStore::with_clock(clock))
}

pub fn down() -> Arc<DownStore> {
    Arc::new(DownStore)
}

/// `groups` fixed-window operations of limit `limit` (cost 1, vetoing) in domain
/// `domain`, rule `k`, each counter in a slot of its own on the harness cluster (the
/// default hash tag is the domain and the entries), the values named `{prefix}N`; the
/// first ones each on a master of its own (the cluster path groups by master, so
/// counters sharing one would be one group), as many as there are masters.
pub fn ops_in_distinct_slots(
    domain: &str,
    prefix: &str,
    groups: usize,
    limit: u64,
) -> Vec<CounterOp> {
    let cluster = super::redis::cluster();
    let mut slots = Vec::new();
    let all = cluster.masters();
    let mut masters = Vec::new();
    let mut ops = Vec::new();
    for i in 0.. {
        if ops.len() == groups {
            break;
        }
        let value = format!("{prefix}{i}");
        let key = format!("{{{domain}|k={value}}}");
        let slot = super::redis::keyslot(cluster, &key);
        let master = cluster.master_for_key(&key);
        if slots.contains(&slot) || (masters.len() < all.len() && masters.contains(&master)) {
            continue;
        }
        slots.push(slot);
        masters.push(master);
        ops.push(yearly(domain, &value, limit));
    }
    ops
}

/// What `unit: year` counts in: 365 days.
const YEAR_SECS: u64 = 365 * 86_400;

/// A fixed-window operation of limit `limit` per year (cost 1, vetoing) in domain
/// `domain`, rule `k`, on the counter of entry `k` = `value`. A year, so no window
/// ends during a test: a counter's TTL is what is left of its window, and one written
/// just before an hour's end vanished before the test read it.
pub fn yearly(domain: &str, value: &str, limit: u64) -> CounterOp {
    CounterOp {
        key: CounterKey {
            domain: Arc::from(domain),
            rule: Arc::from("k"),
            entries: [("k".into(), value.into())].into_iter().collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: YEAR_SECS,
            time_zone: None,
            hash_tag: None,
        },
        params: Params {
            algorithm: Algorithm::FixedWindow,
            limit,
            window_ms: YEAR_SECS * 1000,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        },
        cost: 1,
        vetoes: true,
        mode: tollgate::algorithm::Mode::Limit,
        lease: None,
    }
}
