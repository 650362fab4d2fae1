//! What a decision adds to the answer, through the real gRPC server: rate-limit
//! headers in both styles, `Retry-After` (with bounded jitter), the 429 body and its
//! content type (default and per domain), the shadow-mode request header, and
//! tarpits (delayed denials, bounded in concurrency).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{TestServer, config, descriptor, request};
use futures_util::future::join_all;
use tollgate::limiter::LimiterOptions;
use tollgate::limiter::answer::HeaderStyle;
use tollgate::proto::RateLimitResponse;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::memory::MemoryStore;

const CONFIG: &str = "
domain: answers
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_route}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: trial}
  - key: attacker
    rate_limit: {unit: hour, requests_per_unit: 0, name: blocked}
    tarpit: {delay: 400ms, max_concurrent: 2}
";

const CUSTOM_BODY: &str = "
domain: custom
raw_body:
  body: 'slow down: {limit}, retry in {retry_after}s'
  content_type: text/plain; charset=utf-8
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 0, name: none_for_you}
";

async fn server(yaml: &str, options: LimiterOptions) -> TestServer {
    TestServer::start(config(yaml), Arc::new(MemoryStore::new()), options).await
}

async fn call(
    server: &TestServer,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    let req = request(domain, descriptors.iter().map(|d| descriptor(d)).collect());
    server
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("call succeeds")
        .into_inner()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn envoyproxy_ratelimit_headers_describe_the_closest_limit() {
    let options = LimiterOptions {
        headers: HeaderStyle::envoy_ratelimit_defaults(),
        ..Default::default()
    };
    let server = server(CONFIG, options).await;
    let ok = call(&server, "answers", &[&[("route", "r1")], &[("user", "u1")]]).await;
    assert_eq!(ok.overall_code, Code::Ok as i32);
    // user has 1 of 2 left, route 9 of 10: the user limit is the closest.
    assert_eq!(header(&ok, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&ok, "RateLimit-Remaining"), Some("1"));
    let reset: u64 = header(&ok, "RateLimit-Reset").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset), "{reset}");
    assert_eq!(
        header(&ok, "Retry-After"),
        None,
        "only denials say when to retry"
    );
    server.stop().await;
}

#[tokio::test]
async fn ietf_headers_name_the_policy() {
    let options = LimiterOptions {
        headers: HeaderStyle::Ietf,
        ..Default::default()
    };
    let server = server(CONFIG, options).await;
    let ok = call(&server, "answers", &[&[("route", "r2")]]).await;
    assert_eq!(
        header(&ok, "RateLimit-Policy"),
        Some("\"per_route\";q=10;w=60")
    );
    let value = header(&ok, "RateLimit").unwrap();
    assert!(value.starts_with("\"per_route\";r=9;t="), "{value}");
    server.stop().await;
}

#[tokio::test]
async fn denials_carry_retry_after_and_the_default_json_body() {
    let server = server(CONFIG, LimiterOptions::default()).await;
    call(&server, "answers", &[&[("user", "u3")]]).await;
    call(&server, "answers", &[&[("user", "u3")]]).await;
    let denied = call(&server, "answers", &[&[("user", "u3")]]).await;
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    let retry: u64 = header(&denied, "Retry-After")
        .expect("Retry-After on denial")
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry), "{retry}");
    assert_eq!(header(&denied, "content-type"), Some("application/json"));
    let body: serde_json::Value =
        serde_json::from_slice(&denied.raw_body).expect("the default body is JSON");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["limit"], "per_user");
    assert_eq!(body["retry_after_seconds"], retry);
    server.stop().await;
}

#[tokio::test]
async fn retry_after_jitter_stays_within_its_bound() {
    let options = LimiterOptions {
        retry_after_jitter: Duration::from_secs(30),
        ..Default::default()
    };
    let server = server(CONFIG, options).await;
    let base = call(&server, "answers", &[&[("route", "x")], &[("user", "j")]]).await;
    let reset = base.statuses[1]
        .duration_until_reset
        .as_ref()
        .unwrap()
        .seconds as u64;
    call(&server, "answers", &[&[("user", "j")]]).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let denied = call(&server, "answers", &[&[("user", "j")]]).await;
        let retry: u64 = header(&denied, "Retry-After").unwrap().parse().unwrap();
        assert!(
            retry + 2 >= reset && retry <= reset + 31,
            "{retry} outside [{reset}, {reset}+30]"
        );
        seen.insert(retry);
    }
    assert!(seen.len() > 3, "jitter spreads the answers: {seen:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_domain_can_set_its_own_429_body() {
    let server = server(CUSTOM_BODY, LimiterOptions::default()).await;
    let denied = call(&server, "custom", &[&[("user", "u")]]).await;
    assert_eq!(
        header(&denied, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let body = String::from_utf8(denied.raw_body.clone()).unwrap();
    assert!(
        body.starts_with("slow down: none_for_you, retry in "),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn shadow_mode_marks_the_request_for_the_upstream() {
    let server = server(CONFIG, LimiterOptions::default()).await;
    let first = call(&server, "answers", &[&[("trial", "t")]]).await;
    assert!(
        first.request_headers_to_add.is_empty(),
        "within the limit: no mark"
    );
    let over = call(&server, "answers", &[&[("trial", "t")]]).await;
    assert_eq!(
        over.overall_code,
        Code::Ok as i32,
        "shadow mode never denies"
    );
    let mark = over
        .request_headers_to_add
        .iter()
        .find(|h| h.key == "x-ratelimit-shadow-exceeded");
    assert_eq!(mark.map(|h| h.value.as_str()), Some("true"));
    assert!(over.raw_body.is_empty() && header(&over, "Retry-After").is_none());
    server.stop().await;

    let global = server_with_global_shadow().await;
    let over = call(&global, "answers", &[&[("attacker", "a")]]).await;
    assert_eq!(over.overall_code, Code::Ok as i32);
    assert_eq!(
        over.statuses[0].code,
        Code::OverLimit as i32,
        "statuses still tell the truth"
    );
    assert!(
        over.request_headers_to_add
            .iter()
            .any(|h| h.key == "x-ratelimit-shadow-exceeded")
    );
    global.stop().await;
}

async fn server_with_global_shadow() -> TestServer {
    let options = LimiterOptions {
        global_shadow_mode: true,
        ..Default::default()
    };
    server(CONFIG, options).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tarpits_hold_denials_but_only_up_to_their_bound() {
    let server = server(CONFIG, LimiterOptions::default()).await;
    let client = server.client().await;
    let started = Instant::now();
    let calls = (0..3).map(|_| {
        let mut client = client.clone();
        let req = request("answers", vec![descriptor(&[("attacker", "a")])]);
        async move {
            let response = client
                .should_rate_limit(req)
                .await
                .expect("call succeeds")
                .into_inner();
            (response.overall_code, started.elapsed())
        }
    });
    let mut results = join_all(calls).await;
    results.sort_by_key(|(_, t)| *t);
    assert!(results.iter().all(|(c, _)| *c == Code::OverLimit as i32));
    assert!(
        results[0].1 < Duration::from_millis(300),
        "the third is beyond the bound: at once: {results:?}"
    );
    for (_, t) in &results[1..] {
        assert!(
            *t >= Duration::from_millis(390),
            "held for the delay: {results:?}"
        );
    }
    server.stop().await;
}
