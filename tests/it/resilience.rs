//! When the counter store fails: each `failure_mode` answers as configured, the
//! circuit breaker fails fast once open and recovers through a probe, and the local
//! over-limit cache changes no decision while sparing Redis most of a flood (counted
//! with `INFO commandstats` on a real server).
//!
//! The failure-mode and breaker tests use `Unreliable`, a store that fails on
//! command: they test tollgate's reaction to a failing store, not Redis. The cache
//! tests use a real Redis: the harness's shared one, and for the count of script
//! calls (`INFO commandstats` counts every client's) a server of the test's own.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::server::{TestServer, config, descriptor, request};
use tollgate::algorithm::{Algorithm, Decision, Params};
use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::breaker::{Breaker, BreakerOptions};
use tollgate::store::cache::OverLimitCache;
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::RedisTarget;
use tollgate::store::{CounterKey, CounterOp, Store, StoreError, StoreFuture};

/// A store that works (in memory) or fails after a delay, on command.
struct Unreliable {
    working: AtomicBool,
    delay: Duration,
    calls: AtomicU64,
    memory: MemoryStore,
}

impl Unreliable {
    fn new(working: bool, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            working: AtomicBool::new(working),
            delay,
            calls: AtomicU64::new(0),
            memory: MemoryStore::new(),
        })
    }
}

impl Store for Unreliable {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.working.load(Ordering::SeqCst) {
                return self.memory.decide(ops).await;
            }
            tokio::time::sleep(self.delay).await;
            Err(StoreError::Timeout(self.delay))
        })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.working.load(Ordering::SeqCst) {
                return self.memory.dry_run(ops).await;
            }
            Err(StoreError::Timeout(self.delay))
        })
    }
}

const MODES: &str = "
domain: {MODE}
failure_mode: {MODE}
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 4}
";

#[tokio::test]
async fn each_failure_mode_answers_as_configured() {
    for (mode, expected) in [
        ("allow", Some(Code::Ok)),
        ("deny", Some(Code::OverLimit)),
        ("error", None),
    ] {
        let options = LimiterOptions::default();
        let server = TestServer::start(
            config(&MODES.replace("{MODE}", mode)),
            Unreliable::new(false, Duration::ZERO),
            options,
        )
        .await;
        let answer = server
            .client()
            .await
            .should_rate_limit(request(mode, vec![descriptor(&[("k", "v")])]))
            .await;
        match expected {
            Some(code) => assert_eq!(
                answer.expect("answered").into_inner().overall_code,
                code as i32,
                "{mode}"
            ),
            None => assert_eq!(
                answer.expect_err("error mode").code(),
                tonic::Code::Unavailable,
                "{mode}"
            ),
        }
        server.stop().await;
    }
}

#[tokio::test]
async fn local_mode_admits_this_replicas_share() {
    let options = LimiterOptions {
        replicas: 2,
        ..Default::default()
    };
    let server = TestServer::start(
        config(&MODES.replace("{MODE}", "local")),
        Unreliable::new(false, Duration::ZERO),
        options,
    )
    .await;
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let req = request("local", vec![descriptor(&[("k", "v")])]);
        codes.push(
            client
                .should_rate_limit(req)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        codes,
        [ok, ok, over, over],
        "4 per year over 2 replicas: 2 here"
    );
    let counts = server.limiter.fallback_counts();
    assert!(
        counts.iter().any(|(m, n)| m.name() == "local" && *n == 4),
        "{counts:?}"
    );
    server.stop().await;
}

fn op(name: &str, limit: u64, cost: u64, algorithm: Algorithm) -> CounterOp {
    CounterOp {
        key: CounterKey {
            domain: Arc::from("resilience"),
            rule: Arc::from(name),
            entries: Default::default(),
            algorithm,
            window_secs: 3600,
            time_zone: None,
            hash_tag: None,
        },
        params: Params {
            algorithm,
            limit,
            window_ms: 3_600_000,
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

#[tokio::test]
async fn the_breaker_fails_fast_while_open_and_recovers_through_a_probe() {
    let inner = Unreliable::new(false, Duration::from_millis(40));
    let options = BreakerOptions {
        failures_to_open: 3,
        open_for: Duration::from_millis(300),
    };
    let breaker = Breaker::new(inner.clone(), options);
    let ops = [op("b", 5, 1, Algorithm::FixedWindow)];
    for _ in 0..3 {
        let started = Instant::now();
        assert!(breaker.decide(&ops).await.is_err());
        assert!(
            started.elapsed() >= Duration::from_millis(40),
            "closed: the store is asked"
        );
    }
    assert!(breaker.is_open());
    for _ in 0..100 {
        let started = Instant::now();
        let error = breaker.decide(&ops).await.expect_err("open");
        assert!(matches!(error, StoreError::CircuitOpen(_)), "{error}");
        // The store takes 40 ms and counts its calls (checked below); half of that
        // bounds an answer on a loaded machine, where 1 ms was one preemption away.
        assert!(
            started.elapsed() < Duration::from_millis(20),
            "open: answered without the store"
        );
    }
    assert_eq!(
        inner.calls.load(Ordering::SeqCst),
        3,
        "no call reached the store while open"
    );
    inner.working.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while breaker.decide(&ops).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the breaker never let a probe through"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!breaker.is_open(), "a successful probe closes it");
}

async fn redis_store(test: &str) -> RedisStore {
    common::stores::standalone(test).await
}

/// Script calls of every kind the server at `port` has served.
fn script_calls(port: u16) -> u64 {
    common::redis::script_calls(&[port]).total()
}

/// The same deterministic workload through Redis with and without the cache: every
/// decision (and every remaining count of an admitted operation) is the same.
#[tokio::test]
async fn the_over_limit_cache_changes_no_decision() {
    let plain = redis_store("cache_plain").await;
    let cached = OverLimitCache::new(redis_store("cache_cached").await, 1 << 20);
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for step in 0..600 {
        let batch: Vec<CounterOp> = (0..1 + next() % 3)
            .map(|_| {
                let algorithm = if next() % 2 == 0 {
                    Algorithm::FixedWindow
                } else {
                    Algorithm::SlidingLog
                };
                let name = format!("c{}", next() % 4);
                op(&name, 20, [0, 1, 1, 1, 2][(next() % 5) as usize], algorithm)
            })
            .collect();
        let a: Vec<Decision> = plain.decide(&batch).await.unwrap();
        let b: Vec<Decision> = cached.decide(&batch).await.unwrap();
        let view = |d: &[Decision]| {
            d.iter()
                .map(|d| (d.allowed, if d.allowed { d.remaining } else { 0 }))
                .collect::<Vec<_>>()
        };
        assert_eq!(view(&a), view(&b), "step {step}: {batch:?}");
    }
    assert!(cached.hits() > 0, "the workload exercised the cache");
}

/// 1000 requests on a limit of 50: 95% are over the limit, and Redis sees at most
/// 10% of the requests.
#[tokio::test]
async fn a_flood_of_denials_spares_redis() {
    // A server of this test's own: `INFO commandstats` counts every client's calls.
    let redis = common::redis::custom::private_standalone("flood").expect("private redis");
    let target = RedisTarget::Standalone(redis.url());
    let inner = common::stores::connect(&common::stores::options(target, "flood")).await;
    let store = OverLimitCache::new(inner, 1 << 20);
    let flood = [op("flood", 50, 1, Algorithm::FixedWindow)];
    let before = script_calls(redis.port());
    let mut denied = 0;
    for _ in 0..1000 {
        if !store.decide(&flood).await.unwrap()[0].allowed {
            denied += 1;
        }
    }
    let calls = script_calls(redis.port()) - before;
    assert_eq!(denied, 950);
    assert!(calls <= 100, "Redis ran {calls} scripts for 1000 requests");
    assert!(
        calls >= 51,
        "the admitted requests and the first denial did reach Redis ({calls})"
    );
}
