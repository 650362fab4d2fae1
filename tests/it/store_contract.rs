//! The store contract, one scenario list run against every store: memory, Redis
//! standalone and Redis Cluster (real servers from `common::redis`), each scenario
//! once per algorithm. Each scenario
//! talks to the `Store` trait directly, so all three are held to the same semantics:
//! ordered decisions, all-or-nothing batches, check-only, shadow (non-vetoing)
//! operations, impossible costs, and refunds across hash slots.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Params};
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::RedisStore;
use tollgate::store::{CounterKey, CounterOp, Entries, Store};

/// A year-long window: no scenario straddles a boundary by accident.
const WINDOW: u64 = 365 * 86_400;

/// Every algorithm whose denials consume nothing: a concurrency rule counts every
/// acquisition by design (its release comes anyway), so its contract is
/// `tests/it/concurrency.rs`.
fn limiting() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL.into_iter().filter(|a| !a.counts_denials())
}

thread_local! {
    /// The algorithm the running scenario exercises (each test runs all of them).
    static ALGORITHM: std::cell::Cell<Algorithm> = const { std::cell::Cell::new(Algorithm::FixedWindow) };
}

fn op(entries: &[(&str, &str)], limit: u64, cost: u64) -> CounterOp {
    let algorithm = ALGORITHM.with(|a| a.get());
    let mut entries: Entries = entries.iter().map(|&(k, v)| (k.into(), v.into())).collect();
    entries.push(("algorithm".into(), algorithm.name().into()));
    CounterOp {
        key: CounterKey {
            domain: Arc::from("contract"),
            rule: Arc::from("rule"),
            entries,
            algorithm,
            window_secs: WINDOW,
            time_zone: None,
            hash_tag: None,
        },
        params: Params {
            algorithm,
            limit,
            window_ms: WINDOW * 1000,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        },
        cost,
        vetoes: true,
        mode: tollgate::algorithm::Mode::Limit,
        lease: None,
    }
}

async fn decide(store: &dyn Store, ops: &[CounterOp]) -> Vec<(bool, u64)> {
    store
        .decide(ops)
        .await
        .expect("store decides")
        .iter()
        .map(|d| (d.allowed, d.remaining))
        .collect()
}

async fn admits_up_to_the_limit(store: &dyn Store) {
    let a = op(&[("user", "a")], 3, 1);
    for remaining in [2, 1, 0] {
        assert_eq!(
            decide(store, std::slice::from_ref(&a)).await,
            vec![(true, remaining)]
        );
    }
    let denied = store.decide(std::slice::from_ref(&a)).await.unwrap()[0];
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    let retry = denied
        .retry_after
        .expect("a cost within the limit can pass later");
    assert!(retry <= Duration::from_secs(WINDOW) && retry > Duration::ZERO);
    assert!(denied.reset_after <= Duration::from_secs(WINDOW));
}

async fn denied_batch_consumes_nothing(store: &dyn Store) {
    let small = op(&[("k", "small")], 1, 1);
    let big = op(&[("k", "big")], 10, 1);
    assert_eq!(
        decide(store, std::slice::from_ref(&small)).await,
        vec![(true, 0)]
    );
    // `small` is full, so the pair is denied and `big` must not be consumed.
    let result = decide(store, &[big.clone(), small.clone()]).await;
    assert_eq!(
        result,
        vec![(true, 10), (false, 0)],
        "allowed ops report the unconsumed state"
    );
    assert_eq!(decide(store, &[big]).await, vec![(true, 9)]);
}

async fn duplicate_counters_add_up(store: &dyn Store) {
    let a = op(&[("dup", "x")], 5, 2);
    assert_eq!(
        decide(store, &[a.clone(), a.clone()]).await,
        vec![(true, 3), (true, 1)]
    );
    let mut three = a.clone();
    three.cost = 3;
    // 4 used: 1 + 3 would pass alone, but not after another 1 in the same batch.
    let mut one = a.clone();
    one.cost = 1;
    assert_eq!(
        decide(store, &[one.clone(), three]).await,
        vec![(true, 1), (false, 0)]
    );
    assert_eq!(
        decide(store, &[one]).await,
        vec![(true, 0)],
        "the denied batch consumed nothing"
    );
}

async fn check_only_consumes_nothing(store: &dyn Store) {
    let check = op(&[("check", "x")], 2, 0);
    let hit = op(&[("check", "x")], 2, 1);
    assert_eq!(
        decide(store, std::slice::from_ref(&check)).await,
        vec![(true, 2)]
    );
    assert_eq!(
        decide(store, std::slice::from_ref(&hit)).await,
        vec![(true, 1)]
    );
    assert_eq!(
        decide(store, std::slice::from_ref(&check)).await,
        vec![(true, 1)]
    );
    assert_eq!(
        decide(store, std::slice::from_ref(&hit)).await,
        vec![(true, 0)]
    );
    assert_eq!(
        decide(store, &[check]).await,
        vec![(true, 0)],
        "a full counter passes a check"
    );
}

async fn impossible_costs_never_pass(store: &dyn Store) {
    for cost in [4, u64::from(u32::MAX) + 7, u64::MAX] {
        let d = store
            .decide(&[op(&[("huge", "x")], 3, cost)])
            .await
            .unwrap()[0];
        assert!(!d.allowed, "cost {cost}");
        assert_eq!(d.retry_after, None, "cost {cost} can never pass");
    }
    assert_eq!(
        decide(store, &[op(&[("huge", "x")], 3, 3)]).await,
        vec![(true, 0)]
    );
}

async fn shadow_ops_do_not_veto(store: &dyn Store) {
    let mut shadow = op(&[("shadow", "s")], 1, 1);
    assert_eq!(
        decide(store, std::slice::from_ref(&shadow)).await,
        vec![(true, 0)]
    );
    shadow.vetoes = false;
    let normal = op(&[("shadow", "n")], 5, 1);
    assert_eq!(
        decide(store, &[shadow, normal.clone()]).await,
        vec![(false, 0), (true, 4)]
    );
    assert_eq!(
        decide(store, &[normal]).await,
        vec![(true, 3)],
        "the request went through"
    );
}

/// Many counters with distinct tags: on the cluster they land on different shards, so
/// a denial in one group must refund the groups that already consumed.
async fn refunds_across_slots(store: &dyn Store) {
    let spread: Vec<CounterOp> = (0..12)
        .map(|i| op(&[("spread", &format!("v{i}"))], 5, 1))
        .collect();
    let full = op(&[("spread", "full")], 1, 1);
    assert_eq!(
        decide(store, std::slice::from_ref(&full)).await,
        vec![(true, 0)]
    );
    let mut batch = spread.clone();
    batch.push(full);
    let result = decide(store, &batch).await;
    assert!(!result.last().unwrap().0);
    for (allowed, remaining) in &result[..12] {
        assert_eq!(
            (*allowed, *remaining),
            (true, 5),
            "unconsumed state reported"
        );
    }
    let after = decide(store, &spread).await;
    assert!(
        after.iter().all(|r| *r == (true, 4)),
        "every counter was refunded: {after:?}"
    );
}

fn memory() -> MemoryStore {
    MemoryStore::new()
}

async fn standalone(test: &str) -> RedisStore {
    common::stores::standalone(test).await
}

async fn cluster(test: &str) -> RedisStore {
    common::stores::cluster(test).await
}

macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {
        mod memory_store {
            $(#[tokio::test]
            async fn $scenario() {
                let store = super::memory();
                for algorithm in super::limiting() {
                    super::ALGORITHM.with(|a| a.set(algorithm));
                    super::$scenario(&store).await
                }
            })*
        }
        mod redis_standalone {
            $(#[tokio::test]
            async fn $scenario() {
                let store = super::standalone(stringify!($scenario)).await;
                for algorithm in super::limiting() {
                    super::ALGORITHM.with(|a| a.set(algorithm));
                    super::$scenario(&store).await
                }
            })*
        }
        mod redis_cluster {
            $(#[tokio::test]
            async fn $scenario() {
                let store = super::cluster(stringify!($scenario)).await;
                for algorithm in super::limiting() {
                    super::ALGORITHM.with(|a| a.set(algorithm));
                    super::$scenario(&store).await
                }
            })*
        }
    };
}

contract!(
    admits_up_to_the_limit,
    denied_batch_consumes_nothing,
    duplicate_counters_add_up,
    check_only_consumes_nothing,
    impossible_costs_never_pass,
    shadow_ops_do_not_veto,
    refunds_across_slots,
);
