//! Per-rule metrics with envoyproxy/ratelimit's meaning, scraped from a real server
//! after known traffic: near_limit hit by hit past floor(limit x ratio), one series per
//! overridden descriptor, shadow rules answered by the local over-limit cache on real
//! Redis (and still never denying), `value_to_metric` keys carrying the request's
//! values, and `--upstream-metric-names` on a real `serve` process exporting
//! upstream's Prometheus names (absent without it).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use crate::common::prometheus::value;
use crate::metrics::rule;
use common::process::{Server, check, free_ports, tollgate};
use common::server::{TestServer, config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::metrics::{MetricNames, Metrics};
use tollgate::proto::envoy::r#type::v3::RateLimitUnit;
use tollgate::proto::rate_limit_descriptor::RateLimitOverride;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::Store;
use tollgate::store::cache::OverLimitCache;
use tollgate::store::memory::MemoryStore;

/// `GET /metrics` (blocking: also used against a child process); the body.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the HTTP port");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    body.to_owned()
}

async fn scrape_async(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || scrape(addr))
        .await
        .expect("scrape")
}

/// Sends one request of `hits` hits on `key=value`; whether it was OVER_LIMIT.
async fn send(server: &TestServer, domain: &str, key: &str, value: &str, hits: u32) -> bool {
    let mut req = request(domain, vec![descriptor(&[(key, value)])]);
    req.hits_addend = hits;
    let mut client = server.client().await;
    let response = client.should_rate_limit(req).await.unwrap().into_inner();
    response.overall_code == Code::OverLimit as i32
}

const NEAR: &str = "domain: n
descriptors:
  - key: eight
    rate_limit: {unit: year, requests_per_unit: 8}
  - key: fifteen
    rate_limit: {unit: year, requests_per_unit: 15}
";

#[tokio::test]
async fn near_limit_counts_only_the_hits_past_floor_of_limit_times_ratio() {
    let server = TestServer::start(
        config(NEAR),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    // Limit 8, threshold floor(6.4) = 6: five single hits, then one request from 5 to 7.
    for _ in 0..5 {
        assert!(!send(&server, "n", "eight", "a", 1).await);
    }
    assert!(!send(&server, "n", "eight", "a", 2).await);
    // Limit 15, threshold 12: twelve hits land at most on it, none is near the limit.
    for _ in 0..12 {
        assert!(!send(&server, "n", "fifteen", "a", 1).await);
    }
    let text = scrape_async(server.http_addr).await;
    assert_eq!(value(&text, &rule("near_limit", "n", "eight")), 1.0);
    assert_eq!(value(&text, &rule("within_limit", "n", "eight")), 7.0);
    assert_eq!(value(&text, &rule("near_limit", "n", "fifteen")), 0.0);

    // The 13th is past 12; a denied request consumed nothing and lands nowhere.
    assert!(!send(&server, "n", "fifteen", "a", 1).await);
    assert!(send(&server, "n", "fifteen", "a", 5).await);
    let text = scrape_async(server.http_addr).await;
    assert_eq!(value(&text, &rule("near_limit", "n", "fifteen")), 1.0);
    assert_eq!(value(&text, &rule("over_limit", "n", "fifteen")), 5.0);
    server.stop().await;
}

#[tokio::test]
async fn each_overridden_descriptor_has_its_own_series() {
    let yaml = "domain: o\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    let server = TestServer::start(
        config(yaml),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    for (value, times) in [("a", 3), ("b", 1)] {
        for _ in 0..times {
            let mut d = descriptor(&[("k", value)]);
            d.limit = Some(RateLimitOverride {
                requests_per_unit: 2,
                unit: RateLimitUnit::Year as i32,
            });
            client
                .should_rate_limit(request("o", vec![d]))
                .await
                .unwrap();
        }
    }
    let text = scrape_async(server.http_addr).await;
    let series = |name: &str, v: &str| {
        format!(
            "tollgate_rule_{name}_total{{domain=\"o\",rule=\"(override)\",descriptor=\"k={v}\"}}"
        )
    };
    assert_eq!(value(&text, &series("hits", "a")), 3.0);
    assert_eq!(value(&text, &series("over_limit", "a")), 1.0);
    assert_eq!(value(&text, &series("hits", "b")), 1.0);
    assert_eq!(value(&text, &series("over_limit", "b")), 0.0);
    assert!(
        !text.contains("rule=\"(override)\"} "),
        "overrides are pooled into one series:\n{text}"
    );
    server.stop().await;
}

const SHADOW: &str = "domain: s
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: real
    rate_limit: {unit: year, requests_per_unit: 10}
";

#[tokio::test]
async fn shadow_rules_are_answered_by_the_local_cache_on_redis_and_never_deny() {
    let redis = common::stores::standalone("shadow_local_cache").await;
    let store = Arc::new(OverLimitCache::new(redis, 1 << 20));
    let server = TestServer::start(
        config(SHADOW),
        store.clone() as Arc<dyn Store>,
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    for _ in 0..4 {
        let req = request(
            "s",
            vec![descriptor(&[("shadow", "x")]), descriptor(&[("real", "x")])],
        );
        let response = client.should_rate_limit(req).await.unwrap().into_inner();
        assert_eq!(
            response.overall_code,
            Code::Ok as i32,
            "a shadow rule never denies: {response:?}"
        );
    }
    // 1 admitted, 1 denied by Redis (and remembered), 2 answered by the cache.
    assert_eq!(store.hits(), 2);
    let text = scrape_async(server.http_addr).await;
    assert_eq!(value(&text, &rule("over_limit", "s", "shadow")), 3.0);
    assert_eq!(value(&text, &rule("shadow_mode", "s", "shadow")), 3.0);
    assert_eq!(
        value(&text, &rule("over_limit_with_local_cache", "s", "shadow")),
        2.0
    );
    // The other descriptor of those requests was still counted in Redis, every time.
    assert_eq!(value(&text, &rule("within_limit", "s", "real")), 4.0);
    let mut req = request("s", vec![descriptor(&[("real", "x")])]);
    req.hits_addend = 6;
    let response = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(
        response.overall_code,
        Code::Ok as i32,
        "4 + 6 hits fit in 10"
    );
    assert_eq!(response.statuses[0].limit_remaining, 0);
    server.stop().await;
}

const FLAGGED: &str = "domain: up
descriptors:
  - key: plain
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: outer
    value: o
    descriptors:
      - key: inner
        rate_limit: {unit: year, requests_per_unit: 100}
";

/// A `serve` process on the memory store with `args`, traffic sent with `check`; the
/// scrape after it.
fn serve_and_scrape(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("up.yaml"), FLAGGED).unwrap();
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(args);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    for _ in 0..7 {
        check(&server, grpc, "up", "plain=10.0.0.1");
    }
    for _ in 0..2 {
        check(&server, grpc, "up", "outer=o,inner=i");
    }
    let text = scrape(SocketAddr::from(([127, 0, 0, 1], http)));
    assert!(server.terminate().success());
    text
}

#[test]
fn the_flag_also_exports_upstreams_prometheus_names_with_the_same_values() {
    let text = serve_and_scrape(&["--upstream-metric-names"]);
    let plain = |stat: &str| {
        value(
            &text,
            &format!("ratelimit_service_rate_limit_{stat}{{domain=\"up\",key1=\"plain\"}}"),
        )
    };
    // 5 per year, 7 hits: 5 within, 2 over, only the 5th past floor(4.0).
    assert_eq!(plain("total_hits"), 7.0, "{text}");
    assert_eq!(plain("within_limit"), 5.0);
    assert_eq!(plain("over_limit"), 2.0);
    assert_eq!(plain("near_limit"), 1.0);
    assert_eq!(plain("shadow_mode"), 0.0);
    assert_eq!(
        value(
            &text,
            "ratelimit_service_rate_limit_total_hits{domain=\"up\",key1=\"outer_o\",key2=\"inner\"}"
        ),
        2.0
    );
    assert!(text.contains("# TYPE ratelimit_service_rate_limit_total_hits counter"));
    // `check`'s readiness probes and the traffic: every ShouldRateLimit call.
    assert!(
        value(
            &text,
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"
        ) >= 9.0
    );
    assert_eq!(value(&text, "ratelimit_service_config_load_success"), 1.0);
    assert_eq!(value(&text, "ratelimit_service_config_load_error"), 0.0);
    // tollgate's own names are still there, with the same values.
    assert_eq!(value(&text, &rule("hits", "up", "plain")), 7.0);
}

#[test]
fn without_the_flag_no_upstream_name_is_exported() {
    let text = serve_and_scrape(&[]);
    assert_eq!(value(&text, &rule("hits", "up", "plain")), 7.0, "{text}");
    assert!(
        !text.contains("ratelimit_service_"),
        "an upstream name without the flag:\n{text}"
    );
}

const VALUES: &str = "domain: v
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    value: \"team-*\"
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 100}
";

#[tokio::test]
async fn value_to_metric_puts_the_requests_values_into_the_series_as_upstream_keys_it() {
    let metrics = Arc::new(Metrics::with_names(0.8, true, MetricNames::AlsoUpstream));
    let limiter = Limiter::with_metrics(
        config(VALUES),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
        metrics,
    );
    let server = TestServer::start_limiter(Arc::new(limiter)).await;
    let mut client = server.client().await;
    let requests = [
        vec![
            ("route", "draw"),
            ("http_method", "GET"),
            ("subject_id", "1"),
        ],
        vec![
            ("route", "draw"),
            ("http_method", "GET"),
            ("subject_id", "2"),
        ],
        vec![
            ("route", "draw"),
            ("http_method", "POST"),
            ("subject_id", "1"),
        ],
        vec![("user", "team-a")],
        vec![("plain", "x")],
    ];
    for entries in &requests {
        let req = request("v", vec![descriptor(entries)]);
        client.should_rate_limit(req).await.unwrap();
    }
    let text = scrape_async(server.http_addr).await;
    let series = |rule: &str, descriptor: &str| {
        value(
            &text,
            &format!(
                "tollgate_rule_hits_total{{domain=\"v\",rule=\"{rule}\",descriptor=\"{descriptor}\"}}"
            ),
        )
    };
    // upstream: v.route_draw.http_method_GET.subject_id (the leaf has no value_to_metric).
    let path = "route.http_method.subject_id";
    assert_eq!(
        series(path, "route=draw,http_method=GET,subject_id"),
        2.0,
        "{text}"
    );
    assert_eq!(series(path, "route=draw,http_method=POST,subject_id"), 1.0);
    // A wildcard with value_to_metric: the whole value, not the pattern.
    assert_eq!(series("user_team-*", "user=team-a"), 1.0);
    // No value_to_metric: no values.
    assert_eq!(value(&text, &rule("hits", "v", "plain")), 1.0);
    let upstream = |key1: &str, key2: Option<&str>| {
        let key2 = key2.map_or(String::new(), |k| format!(",key2=\"{k}\""));
        value(
            &text,
            &format!(
                "ratelimit_service_rate_limit_total_hits{{domain=\"v\",key1=\"{key1}\"{key2}}}"
            ),
        )
    };
    assert_eq!(upstream("route_draw", Some("http_method_GET")), 2.0);
    assert_eq!(upstream("route_draw", Some("http_method_POST")), 1.0);
    assert_eq!(upstream("user_team-a", None), 1.0);
    assert_eq!(upstream("plain", None), 1.0);
    server.stop().await;
}
