//! Leaky-bucket shaping through the real gRPC server, on the memory store and on a
//! real Redis: admitted requests are answered one emission interval (W / L) apart,
//! never earlier than their turn, and a request that finds the queue full is answered
//! OVER_LIMIT at once. Also several limits on one descriptor (`rate_limits`): all must
//! pass, and the status reports the one that decided.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{TestServer, config, descriptor, request};
use futures_util::future::join_all;
use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

/// 10 per second: one every 100 ms; a queue of 5.
const SHAPER: &str = "
domain: shape
descriptors:
  - key: upstream
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: leaky_bucket
      burst: 5
  - key: tiered
    rate_limits:
      - {unit: minute, requests_per_unit: 3, name: per_minute}
      - {unit: day, requests_per_unit: 4, name: per_day, algorithm: sliding_log}
";

const INTERVAL: Duration = Duration::from_millis(100);

async fn redis_store(test: &str) -> Arc<dyn Store> {
    Arc::new(common::stores::standalone(test).await)
}

async fn shapes(store: Arc<dyn Store>) {
    let server = TestServer::start(config(SHAPER), store, LimiterOptions::default()).await;
    let client = server.client().await;
    let started = Instant::now();
    let calls = (0..6).map(|_| {
        let mut client = client.clone();
        let req = request(
            "shape",
            vec![descriptor(&[("upstream", "api.example.com")])],
        );
        async move {
            let code = client
                .should_rate_limit(req)
                .await
                .expect("call succeeds")
                .into_inner()
                .overall_code;
            (code, started.elapsed())
        }
    });
    let results = join_all(calls).await;
    let mut admitted: Vec<Duration> = results
        .iter()
        .filter(|(c, _)| *c == Code::Ok as i32)
        .map(|(_, t)| *t)
        .collect();
    let denied: Vec<Duration> = results
        .iter()
        .filter(|(c, _)| *c == Code::OverLimit as i32)
        .map(|(_, t)| *t)
        .collect();
    admitted.sort();
    assert_eq!(
        (admitted.len(), denied.len()),
        (5, 1),
        "a queue of 5: {results:?}"
    );
    assert!(
        denied[0] < Duration::from_millis(90),
        "a full queue answers at once, not after waiting: {denied:?}"
    );
    for (turn, at) in admitted.iter().enumerate() {
        let slot = INTERVAL * turn as u32;
        // Never before its turn (the decision is made after the call starts, so a
        // turn can only come later); generously bounded above on a busy machine.
        assert!(
            *at + Duration::from_millis(5) >= slot,
            "turn {turn} answered at {at:?}, before {slot:?}"
        );
        assert!(
            *at < slot + Duration::from_millis(250),
            "turn {turn} answered at {at:?}, long after {slot:?}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_spaces_answers_on_the_memory_store() {
    shapes(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_spaces_answers_on_redis() {
    shapes(redis_store("shaping").await).await;
}

async fn all_limits_must_pass(store: Arc<dyn Store>) {
    let server = TestServer::start(config(SHAPER), store, LimiterOptions::default()).await;
    let mut client = server.client().await;
    // The five calls must share one minute window (epoch-aligned, read from the same
    // clock Redis's TIME reads): start them well clear of a minute boundary.
    while !(1..=50).contains(&(epoch_secs() % 60)) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut seen = Vec::new();
    for _ in 0..5 {
        let req = request("shape", vec![descriptor(&[("tiered", "t1")])]);
        let status = client
            .should_rate_limit(req)
            .await
            .expect("call succeeds")
            .into_inner()
            .statuses
            .remove(0);
        let limit = status.current_limit.expect("a limit applies");
        seen.push((status.code, limit.name, status.limit_remaining));
    }
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    // per_minute (3) runs out first and is the one reported; the denied calls do not
    // consume the day's log (4), so the total admitted is exactly 3.
    let expected = [
        (ok, "per_minute", 2),
        (ok, "per_minute", 1),
        (ok, "per_minute", 0),
        (over, "per_minute", 0),
        (over, "per_minute", 0),
    ];
    let got: Vec<_> = seen.iter().map(|(c, n, r)| (*c, n.as_str(), *r)).collect();
    assert_eq!(got, expected, "{seen:?}");
    server.stop().await;
}

fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

#[tokio::test]
async fn several_limits_on_one_descriptor_on_the_memory_store() {
    all_limits_must_pass(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn several_limits_on_one_descriptor_on_redis() {
    all_limits_must_pass(redis_store("tiered").await).await;
}
