//! Concurrency limits under churn on real Redis: 16 clients on two replicas (two
//! stores on one Redis, standalone and the cluster), each request holding its slot
//! for a random 20-800 ms and releasing (as Envoy's stream-done call does, a refused
//! request's too, at once, its client retrying 50-250 ms later), for 5 s. The admitted requests in flight, counted by the test
//! itself, never pass the limit, with anonymous leases and with named ones (three of
//! the clients sending one id, the same for all three, over and over, as clients
//! forging `x-request-id` would). The model's property tests (`src/algorithm/concurrency_tests.rs`) prove
//! the policy on every schedule; the differential test proves the Lua equal to the
//! model; this proves the path between them under real parallel calls.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::server::{config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::RateLimitDescriptor;
use tollgate::proto::rate_limit_response::Code;

const LIMIT: i64 = 5;
const CLIENTS: u64 = 16;
const RUN: Duration = Duration::from_secs(5);

fn rules() -> String {
    format!(
        "domain: churn
descriptors:
  - key: anonymous
    rate_limit: {{algorithm: concurrency, lease: 3s, requests_per_unit: {LIMIT}}}
  - key: named
    descriptors:
      - key: request_id
        rate_limit: {{algorithm: concurrency, lease: 3s, lease_key: request_id, requests_per_unit: {LIMIT}}}
"
    )
}

/// What one request sends, acquiring or (`release`) releasing.
fn call(named: bool, id: &str, release: bool) -> RateLimitDescriptor {
    let mut d = if named {
        descriptor(&[("named", "t"), ("request_id", id)])
    } else {
        descriptor(&[("anonymous", "t")])
    };
    d.is_negative_hits = release;
    d
}

async fn ok(limiter: &Limiter, d: RateLimitDescriptor) -> bool {
    let answer = limiter
        .should_rate_limit(&request("churn", vec![d]))
        .await
        .expect("answered");
    answer.overall_code == Code::Ok as i32
}

/// The most admitted requests in flight at once, and how many were admitted.
async fn churn(replicas: [Arc<Limiter>; 2], named: bool) -> (i64, u64) {
    let in_flight = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + RUN;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let limiter = replicas[(client % 2) as usize].clone();
        let (in_flight, most, admitted) = (in_flight.clone(), most.clone(), admitted.clone());
        clients.push(tokio::spawn(async move {
            let mut seed = client.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut random = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let mut request = 0;
            while Instant::now() < end {
                request += 1;
                // Clients 0-2 forge one id, all three, for every request.
                let id = if client < 3 {
                    "forged".to_owned()
                } else {
                    format!("c{client}r{request}")
                };
                if ok(&limiter, call(named, &id, false)).await {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    admitted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20 + random(780))).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    assert!(ok(&limiter, call(named, &id, true)).await, "never denied");
                } else {
                    // A 429's release comes as its stream ends, at once; the client
                    // backs off before it tries again. (Without the pause, refused
                    // retries on anonymous leases hold the slots they are counted on:
                    // docs/configuration.md, "Concurrency limits".)
                    assert!(ok(&limiter, call(named, &id, true)).await, "never denied");
                    tokio::time::sleep(Duration::from_millis(50 + random(200))).await;
                }
            }
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    (most.load(Ordering::SeqCst), admitted.load(Ordering::SeqCst))
}

async fn never_over_the_limit(target: fn() -> tollgate::store::redis::connect::RedisTarget) {
    for named in [false, true] {
        let test = format!("lease_churn_{named}");
        let options = common::stores::options(target(), &test);
        let replica = |store: tollgate::store::redis::RedisStore| {
            Arc::new(Limiter::new(
                config(&rules()),
                Arc::new(store),
                LimiterOptions::default(),
            ))
        };
        let replicas = [
            replica(common::stores::connect(&options).await),
            replica(common::stores::connect(&options).await),
        ];
        let (most, admitted) = churn(replicas, named).await;
        assert!(
            most <= LIMIT,
            "named {named}: {most} in flight on a limit of {LIMIT}"
        );
        // The slots were contended and came back: far more admissions than slots.
        assert_eq!(most, LIMIT, "named {named}: the limit was reached");
        assert!(
            admitted >= 20,
            "named {named}: {admitted} admitted in {RUN:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_on_two_replicas_never_pass_the_limit_standalone() {
    never_over_the_limit(common::stores::standalone_target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_on_two_replicas_never_pass_the_limit_cluster() {
    never_over_the_limit(common::stores::cluster_target).await;
}
