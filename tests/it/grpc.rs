//! The real gRPC server on port 0: ShouldRateLimit statuses (order, code, current
//! limit, remaining, reset), unknown domains, the overall code, INVALID_ARGUMENT for
//! every malformed request and UNAVAILABLE (never UNKNOWN) when the store is down,
//! grpc.health.v1, reflection, concurrency against one limit, and graceful shutdown.

use crate::common;

use std::sync::Arc;

use common::server::{TestServer, config, descriptor, request};
use tollgate::clock::ManualClock;
use tollgate::limiter::LimiterOptions;
use tollgate::limiter::bounds::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_VALUE_BYTES};
use tollgate::proto::rate_limit_response::rate_limit::Unit;
use tollgate::proto::rate_limit_response::{Code, RateLimit};
use tollgate::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::store::memory::MemoryStore;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const YAML: &str = "domain: g
descriptors:
  - key: client
    rate_limit: {name: per_client, unit: minute, requests_per_unit: 2}
  - key: route
    value: search
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 10}
";

/// 1_700_000_000 s is 20 s into a minute and 800 s into an hour.
const NOW_MILLIS: u64 = 1_700_000_000_000;

async fn server() -> TestServer {
    let clock = Arc::new(ManualClock::new(NOW_MILLIS));
    let store = Arc::new(MemoryStore::with_clock(clock));
    TestServer::start(config(YAML), store, LimiterOptions::default()).await
}

async fn call(server: &TestServer, request: RateLimitRequest) -> RateLimitResponse {
    let mut client = server.client().await;
    match client.should_rate_limit(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("ShouldRateLimit failed: {status:?}"),
    }
}

#[tokio::test]
async fn statuses_come_back_in_request_order_fully_filled() {
    let server = server().await;
    let r = call(
        &server,
        request(
            "g",
            vec![
                descriptor(&[("route", "search")]),
                descriptor(&[("nothing", "here")]),
                descriptor(&[("client", "c1")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 3);

    let route = &r.statuses[0];
    assert_eq!(route.code, Code::Ok as i32);
    let expected = RateLimit {
        name: String::new(),
        requests_per_unit: 5,
        unit: Unit::Hour as i32,
    };
    assert_eq!(route.current_limit.as_ref(), Some(&expected));
    assert_eq!(route.limit_remaining, 4);
    assert_eq!(route.duration_until_reset.unwrap().seconds, 3600 - 800);

    let unmatched = &r.statuses[1];
    assert_eq!(unmatched.code, Code::Ok as i32);
    assert_eq!(unmatched.current_limit, None);

    let client = &r.statuses[2];
    assert_eq!(client.code, Code::Ok as i32);
    let expected = RateLimit {
        name: "per_client".into(),
        requests_per_unit: 2,
        unit: Unit::Minute as i32,
    };
    assert_eq!(client.current_limit.as_ref(), Some(&expected));
    assert_eq!(client.limit_remaining, 1);
    assert_eq!(client.duration_until_reset.unwrap().seconds, 40);
    server.stop().await;
}

#[tokio::test]
async fn unknown_domain_is_ok_without_a_limit() {
    let server = server().await;
    let r = call(
        &server,
        request("nope", vec![descriptor(&[("client", "c")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].current_limit, None);
    server.stop().await;
}

#[tokio::test]
async fn overall_is_over_limit_iff_a_descriptor_is_over() {
    let server = server().await;
    let pair = || {
        request(
            "g",
            vec![
                descriptor(&[("route", "search")]),
                descriptor(&[("client", "o")]),
            ],
        )
    };
    for _ in 0..2 {
        assert_eq!(call(&server, pair()).await.overall_code, Code::Ok as i32);
    }
    let r = call(&server, pair()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    // The route counter alone is still fine: the denied request consumed nothing.
    let r = call(
        &server,
        request("g", vec![descriptor(&[("route", "search")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    server.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_never_unknown() {
    let server = server().await;
    let ok = || descriptor(&[("client", "v")]);
    let long_value = "v".repeat(MAX_VALUE_BYTES + 1);
    let many_entries: Vec<(String, String)> = (0..=MAX_ENTRIES)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let many_entries: Vec<(&str, &str)> = many_entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (max_d, max_e, max_v) = (
        MAX_DESCRIPTORS.to_string(),
        MAX_ENTRIES.to_string(),
        MAX_VALUE_BYTES.to_string(),
    );
    let cases: Vec<(&str, RateLimitRequest, Vec<&str>)> = vec![
        (
            "empty domain",
            request("", vec![ok()]),
            vec!["domain", "empty"],
        ),
        (
            "no descriptors",
            request("g", vec![]),
            vec!["descriptor", "empty"],
        ),
        (
            "empty entry key",
            request("g", vec![ok(), descriptor(&[("a", "b"), ("", "v")])]),
            vec!["descriptor 1 entry 1", "key", "empty"],
        ),
        (
            "too many descriptors",
            request("g", vec![ok(); MAX_DESCRIPTORS + 1]),
            vec!["descriptors", &max_d],
        ),
        (
            "too many entries",
            request("g", vec![descriptor(&many_entries)]),
            vec!["descriptor 0", "entries", &max_e],
        ),
        (
            "over-long value",
            request("g", vec![descriptor(&[("client", &long_value)])]),
            vec!["descriptor 0 entry 0", "value", &max_v],
        ),
    ];
    let mut client = server.client().await;
    for (what, req, needles) in cases {
        let status = client
            .should_rate_limit(req)
            .await
            .expect_err(&format!("{what}: must be refused"));
        assert_ne!(status.code(), tonic::Code::Unknown, "{what}: {status:?}");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        for needle in needles {
            assert!(
                status.message().contains(needle),
                "{what}: message '{}' should mention '{needle}'",
                status.message()
            );
        }
    }
    // Exactly at the bounds is fine.
    let at_bounds = request("g", vec![ok(); MAX_DESCRIPTORS]);
    assert!(client.should_rate_limit(at_bounds).await.is_ok());
    server.stop().await;
}

#[tokio::test]
async fn health_reports_serving() {
    let server = server().await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("health check '{service}': {s:?}"))
            .into_inner();
        assert_eq!(
            response.status,
            ServingStatus::Serving as i32,
            "'{service}'"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_rate_limit_service() {
    let server = server().await;
    let mut reflection = ServerReflectionClient::new(server.channel().await);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![ask]))
        .await
        .expect("reflection call")
        .into_inner();
    let answer = stream
        .message()
        .await
        .expect("reflection stream")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("expected a service list, got {answer:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_exceed_the_limit() {
    let server = server().await;
    let client = server.client().await;
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                client
                    .should_rate_limit(request("g", vec![descriptor(&[("burst", "b")])]))
                    .await
                    .expect("ShouldRateLimit")
                    .into_inner()
                    .overall_code
            })
        })
        .collect();
    let mut ok = 0;
    let mut over = 0;
    for call in calls {
        match Code::try_from(call.await.unwrap()) {
            Ok(Code::Ok) => ok += 1,
            Ok(Code::OverLimit) => over += 1,
            other => panic!("unexpected code {other:?}"),
        }
    }
    assert_eq!((ok, over), (10, 10));
    server.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_returns_with_a_client_still_connected() {
    let server = server().await;
    let addr = server.grpc_addr;
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("g", vec![descriptor(&[("client", "s")])]))
        .await
        .expect("call before shutdown");
    assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
    server.stop().await;
    // The port is closed afterwards.
    assert!(common::server::refused_soon(addr), "the port still accepts");
    drop(client);
}

#[tokio::test]
async fn a_store_outage_is_never_unknown() {
    let server = TestServer::start(config(YAML), common::stores::down(), Default::default()).await;
    let mut client = server.client().await;
    let result = client
        .should_rate_limit(request("g", vec![descriptor(&[("client", "x")])]))
        .await;
    // Envoy treats UNKNOWN as OK; an outage must say UNAVAILABLE (or be answered by a
    // failure mode).
    if let Err(status) = result {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    // Requests that touch no counter do not need the store.
    let r = call(&server, request("g", vec![descriptor(&[("none", "x")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    server.stop().await;
}
