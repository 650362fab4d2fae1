//! A Redis that goes away is noticed at once: after its connection is reset or
//! refused, each request is answered by its domain's `failure_mode` within
//! microseconds of the failure, not after the store's timeout (Envoy's own filter
//! timeout is 20 ms by default), and requests go to Redis again once it is back.
//! The store here is the bare `RedisStore` (no circuit breaker in front), so what is
//! measured is the store's own fail-fast, not the breaker's.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{TestServer, config, descriptor, request};
use tollgate::limiter::LimiterOptions;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget};

/// What a request would wait without failing fast: 8x the default `REDIS_TIMEOUT`,
/// so that waiting for it and failing fast stay far apart on a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Envoy's default filter timeout: an answer later than this is no answer to Envoy.
const ENVOY_TIMEOUT: Duration = Duration::from_millis(20);
/// Per answer, whatever the machine's load: far below [`TIMEOUT`], so a request that
/// waited for it cannot pass.
const BOUND: Duration = Duration::from_millis(500);

const CONFIG: &str = "domain: ff\nfailure_mode: error\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n";

/// A redis-server on `port` that this test starts again after killing the first.
fn restart_redis(port: u16) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts")
}

#[tokio::test]
async fn a_killed_redis_is_answered_by_failure_mode_at_once_and_then_found_again() {
    let redis = common::redis::custom::private_standalone("fail-fast").expect("private redis");
    let port = redis.port();
    let options = RedisOptions {
        target: RedisTarget::Standalone(redis.url()),
        auth: None,
        key_prefix: common::redis::unique_prefix("fail-fast"),
        timeout: TIMEOUT,
        connect_timeout: Duration::from_secs(2),
        tls: Default::default(),
        state_layout: Default::default(),
    };
    let store = RedisStore::connect(&options).await.expect("connect");
    let server = TestServer::start(
        config(CONFIG),
        std::sync::Arc::new(store),
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    let req = request("ff", vec![descriptor(&[("k", "v")])]);
    client
        .should_rate_limit(req.clone())
        .await
        .expect("a healthy Redis answers");

    common::redis::custom::kill_server(port).expect("kill redis");
    let mut took = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        let status = client
            .should_rate_limit(req.clone())
            .await
            .expect_err("failure_mode error answers UNAVAILABLE");
        took.push(started.elapsed());
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    let slowest = took.iter().max().copied().unwrap_or_default();
    let late = took.iter().filter(|t| **t >= ENVOY_TIMEOUT).count();
    eprintln!(
        "the 30 answers after the kill: slowest {slowest:?}, {late} at or over 20 ms: {took:?}"
    );
    assert!(
        slowest < BOUND,
        "an answer waited {slowest:?} (the timeout is {TIMEOUT:?}): {took:?}"
    );
    // The typical answer is under Envoy's 20 ms: well under a millisecond on a quiet
    // machine, several milliseconds for a debug build beside other builds, so the
    // bound on the median is Envoy's 20 ms itself, not a fraction of it.
    let mut sorted = took.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(
        median < ENVOY_TIMEOUT,
        "the median answer took {median:?}: {took:?}"
    );

    // Back on the same port: requests reach it again, without a restart of ours.
    let mut again = restart_redis(port);
    let deadline = Instant::now() + Duration::from_secs(15);
    let found = loop {
        match client.should_rate_limit(req.clone()).await {
            Ok(_) => break true,
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable),
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = again.kill();
    let _ = again.wait();
    assert!(found, "requests did not reach the restarted Redis");
    server.stop().await;
}
