//! How many extra admissions `failure_mode: local` can cause around a fault, measured:
//! a "Redis" (the memory store behind a switch, so the fault is exact and on command)
//! admits part of a window, fails, then recovers, and every admission of the window
//! is counted across the replicas (limiters sharing that store).
//!
//! The bound docs/operations.md states, per counter and window: with limit L and N
//! replicas, each replica admits at most ceil(L/N) locally per outage, and the local
//! counts are dropped (never merged) when the store answers again, so one outage
//! admits at most L + N x ceil(L/N) in the window (2L for N dividing L), and each
//! further outage in the same window at most N x ceil(L/N) more.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::server::{config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::memory::MemoryStore;
use tollgate::store::{CounterOp, Store, StoreError, StoreFuture};

const LIMIT: u64 = 10;
const CONFIG: &str = "
domain: local
failure_mode: local
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 10}
";

/// The shared store: exact counts while up, an immediate error while down.
struct Switch {
    up: AtomicBool,
    counts: MemoryStore,
}

impl Store for Switch {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        if self.up.load(Ordering::SeqCst) {
            return self.counts.decide(ops);
        }
        Box::pin(async { Err(StoreError::Unavailable("switched off".into())) })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        if self.up.load(Ordering::SeqCst) {
            return self.counts.dry_run(ops);
        }
        Box::pin(async { Err(StoreError::Unavailable("switched off".into())) })
    }
}

struct Cluster {
    store: Arc<Switch>,
    replicas: Vec<Limiter>,
}

impl Cluster {
    fn new(replicas: u32) -> Cluster {
        let store = Arc::new(Switch {
            up: AtomicBool::new(true),
            counts: MemoryStore::new(),
        });
        let replicas = (0..replicas)
            .map(|_| {
                let options = LimiterOptions {
                    replicas,
                    ..Default::default()
                };
                Limiter::new(config(CONFIG), store.clone(), options)
            })
            .collect();
        Cluster { store, replicas }
    }

    fn set_up(&self, up: bool) {
        self.store.up.store(up, Ordering::SeqCst);
    }

    /// `each` requests on every replica, in turn; how many were admitted.
    async fn send(&self, each: usize) -> u64 {
        let mut admitted = 0;
        for _ in 0..each {
            for replica in &self.replicas {
                let req = request("local", vec![descriptor(&[("k", "v")])]);
                let answer = replica.should_rate_limit(&req).await.expect("answered");
                if answer.overall_code == Code::Ok as i32 {
                    admitted += 1;
                }
            }
        }
        admitted
    }
}

/// Admissions in one window with `outages` faults, each after part of the limit was
/// used through the store, with every request sent that the window could admit.
async fn admitted_in_window(replicas: u32, outages: usize) -> u64 {
    let cluster = Cluster::new(replicas);
    let mut admitted = cluster.send(2).await; // some through the store first
    for _ in 0..outages {
        cluster.set_up(false);
        admitted += cluster.send(LIMIT as usize).await; // exhaust the local shares
        cluster.set_up(true);
        admitted += cluster.send(LIMIT as usize).await; // the store's remainder, if any
    }
    admitted
}

#[tokio::test]
async fn one_outage_admits_at_most_each_replicas_local_share_extra() {
    for replicas in [1u32, 2, 3] {
        let share = LIMIT.div_ceil(u64::from(replicas));
        let bound = LIMIT + u64::from(replicas) * share;
        let admitted = admitted_in_window(replicas, 1).await;
        println!("N={replicas}: limit {LIMIT}, one outage: {admitted} admitted (bound {bound})");
        assert!(admitted <= bound, "N={replicas}: {admitted} > {bound}");
        // The bound is reached: the store was not full when the fault began, every
        // replica spent its whole share locally, and the store's count was kept.
        assert_eq!(admitted, bound, "N={replicas}");
    }
}

#[tokio::test]
async fn each_further_outage_in_the_window_adds_at_most_the_shares_again() {
    let admitted = admitted_in_window(2, 2).await;
    let bound = LIMIT + 2 * 2 * LIMIT.div_ceil(2);
    println!("N=2: limit {LIMIT}, two outages: {admitted} admitted (bound {bound})");
    assert_eq!(admitted, bound);
}

#[tokio::test]
async fn local_counts_are_dropped_when_the_store_answers_again() {
    let cluster = Cluster::new(1);
    cluster.set_up(false);
    assert_eq!(
        cluster.send(LIMIT as usize + 5).await,
        LIMIT,
        "the local share"
    );
    cluster.set_up(true);
    // The store had counted nothing: its whole limit, and only it.
    assert_eq!(cluster.send(LIMIT as usize + 5).await, LIMIT);
    // The next outage starts from zero: the first outage's counts were dropped.
    cluster.set_up(false);
    assert_eq!(cluster.send(LIMIT as usize + 5).await, LIMIT);
}
