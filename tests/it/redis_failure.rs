//! Redis that is unreachable, slow or refuses our credentials: start-up fails with a
//! clear message that never shows the password, and a request whose Redis work
//! exceeds the timeout gets UNAVAILABLE promptly (never UNKNOWN, never a hang).
//! The pausing test runs on a standalone Redis of its own, so the pause disturbs no
//! other test.

use crate::common;

use std::time::{Duration, Instant};

use common::server::{TestServer, descriptor, request};
use tollgate::limiter::LimiterOptions;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget};

fn options(target: RedisTarget, auth: Option<&str>, timeout: Duration) -> RedisOptions {
    RedisOptions {
        target,
        auth: auth.map(str::to_owned),
        key_prefix: common::redis::unique_prefix("failure"),
        timeout,
        connect_timeout: Duration::from_secs(2),
        tls: Default::default(),
        state_layout: Default::default(),
    }
}

#[tokio::test]
async fn unreachable_redis_fails_start_up_clearly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let started = Instant::now();
    let error = match RedisStore::connect(&options(
        RedisTarget::Standalone(url),
        None,
        Duration::from_millis(50),
    ))
    .await
    {
        Ok(_) => panic!("nothing listens on {port}"),
        Err(e) => e.to_string(),
    };
    assert!(
        error.contains(&format!("127.0.0.1:{port}")),
        "names the target: {error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "fails within the connect timeout"
    );
}

#[tokio::test]
async fn wrong_password_is_reported_without_the_password() {
    let port = common::redis::standalone().port();
    common::redis::redis_cli(
        port,
        &[
            "ACL",
            "SETUSER",
            "tollgate_test",
            "on",
            ">right-secret",
            "~*",
            "+@all",
        ],
    );
    let url = format!("redis://127.0.0.1:{port}");
    let attempt = options(
        RedisTarget::Standalone(url.clone()),
        Some("tollgate_test:wrong-secret"),
        Duration::from_secs(1),
    );
    let error = match RedisStore::connect(&attempt).await {
        Ok(_) => panic!("a wrong password must not connect"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("authentication failed"), "{error}");
    assert!(
        !error.contains("wrong-secret"),
        "the password leaked: {error}"
    );
    // The right one works, as user:password in REDIS_AUTH form and in the URL.
    let ok = options(
        RedisTarget::Standalone(url),
        Some("tollgate_test:right-secret"),
        Duration::from_secs(1),
    );
    RedisStore::connect(&ok)
        .await
        .expect("right credentials connect");
    let in_url = format!("redis://tollgate_test:right-secret@127.0.0.1:{port}");
    RedisStore::connect(&options(
        RedisTarget::Standalone(in_url),
        None,
        Duration::from_secs(1),
    ))
    .await
    .expect("credentials in the URL connect");
}

#[tokio::test]
async fn slow_redis_is_answered_by_failure_mode_within_the_timeout() {
    let redis = common::redis::custom::private_standalone("failure").expect("private redis");
    let timeout = Duration::from_millis(50);
    let store = RedisStore::connect(&options(
        RedisTarget::Standalone(redis.url()),
        None,
        timeout,
    ))
    .await
    .expect("connect");
    let slow = "domain: slow\nfailure_mode: error\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let open = "domain: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let set = tollgate::config::load_sources(&[
        (std::path::Path::new("slow.yaml"), slow),
        (std::path::Path::new("open.yaml"), open),
    ])
    .expect("valid");
    let server =
        TestServer::start(set, std::sync::Arc::new(store), LimiterOptions::default()).await;
    let mut client = server.client().await;
    let req = request("slow", vec![descriptor(&[("k", "v")])]);
    client
        .should_rate_limit(req.clone())
        .await
        .expect("a healthy Redis answers");

    // Every client of this server is paused for 1.5 s: our call must not wait for it.
    common::redis::redis_cli(redis.port(), &["CLIENT", "PAUSE", "1500", "ALL"]);
    let started = Instant::now();
    let status = client
        .should_rate_limit(req.clone())
        .await
        .expect_err("a paused Redis cannot decide");
    let elapsed = started.elapsed();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("timed out"),
        "{}",
        status.message()
    );
    assert!(
        elapsed < Duration::from_millis(1000),
        "answered in {elapsed:?}, not after the pause"
    );
    // The default failure mode fails open, just as fast.
    let started = Instant::now();
    let open_answer = client
        .should_rate_limit(request("open", vec![descriptor(&[("k", "v")])]))
        .await
        .expect("allow mode answers")
        .into_inner();
    assert_eq!(
        open_answer.overall_code,
        tollgate::proto::rate_limit_response::Code::Ok as i32
    );
    assert!(started.elapsed() < Duration::from_millis(1000));

    common::redis::redis_cli(redis.port(), &["CLIENT", "UNPAUSE"]);
    // And it recovers once Redis answers again (bounded retry: the paused reply may
    // still be in flight on the multiplexed connection).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.should_rate_limit(req.clone()).await {
            Ok(_) => break,
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable)
            }
            Err(status) => panic!("no recovery after the pause: {status:?}"),
        }
    }
    server.stop().await;
}
