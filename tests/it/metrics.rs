//! `GET /metrics` on a real server after known traffic: exact per-rule counts (hits,
//! within, over, near-limit at the configured ratio, shadow mode, over the limit by
//! the local over-limit cache), descriptor values only for `detailed_metric` rules,
//! the service metrics (requests by result and error kind, latency, descriptors,
//! backend calls and errors, fallbacks), and reload counters with the generation.

use crate::common;

use std::fs;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::prometheus::value;
use common::server::{TestServer, config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::metrics::Metrics;
use tollgate::server::reload::{self, ReloadStatus, Reloader, Trigger};
use tollgate::store::cache::OverLimitCache;
use tollgate::store::memory::MemoryStore;
use tollgate::store::metered::Metered;
use tollgate::store::{CounterOp, Store, StoreError, StoreFuture};

/// Windows of a year: the counters are exact across calls only within one window,
/// and a minute's end fell inside a run once in every ~60 s of its calls.
const RULES: &str = "domain: m
descriptors:
  - key: plain
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
";

/// GET; (status, content type, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("head and body");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

async fn scrape(server: &TestServer) -> String {
    let (status, content_type, body) = get(server.http_addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    body
}

pub(crate) fn rule(name: &str, domain: &str, rule: &str) -> String {
    format!("tollgate_rule_{name}_total{{domain=\"{domain}\",rule=\"{rule}\"}}")
}

async fn hit(server: &TestServer, domain: &str, key: &str, value: &str, times: usize) -> usize {
    let mut client = server.client().await;
    let mut over = 0;
    for _ in 0..times {
        let req = request(domain, vec![descriptor(&[(key, value)])]);
        let response = client.should_rate_limit(req).await.unwrap().into_inner();
        over += usize::from(response.overall_code == 2);
    }
    over
}

#[tokio::test]
async fn per_rule_and_service_counters_are_exact() {
    let metrics = Arc::new(Metrics::default());
    let store = Arc::new(Metered::new(MemoryStore::new(), metrics.clone()));
    let limiter = Limiter::with_metrics(config(RULES), store, LimiterOptions::default(), metrics);
    let server = TestServer::start_limiter(Arc::new(limiter)).await;

    assert_eq!(hit(&server, "m", "plain", "10.0.0.1", 7).await, 2);
    assert_eq!(hit(&server, "m", "detailed", "x", 3).await, 1);
    assert_eq!(hit(&server, "m", "detailed", "y", 1).await, 0);
    assert_eq!(
        hit(&server, "m", "shadow", "s", 3).await,
        0,
        "shadow mode answers OK"
    );
    let mut client = server.client().await;
    let bad = request("", vec![descriptor(&[("plain", "a")])]);
    assert!(client.should_rate_limit(bad).await.is_err());

    let text = scrape(&server).await;
    // 5 per year, 7 hits: 5 within (only the 5th past floor(5 x 0.8) = 4), 2 over.
    assert_eq!(value(&text, &rule("hits", "m", "plain")), 7.0);
    assert_eq!(value(&text, &rule("within_limit", "m", "plain")), 5.0);
    assert_eq!(value(&text, &rule("over_limit", "m", "plain")), 2.0);
    assert_eq!(value(&text, &rule("near_limit", "m", "plain")), 1.0);
    assert_eq!(value(&text, &rule("shadow_mode", "m", "plain")), 0.0);
    assert!(
        !text.contains("10.0.0.1"),
        "a descriptor value became a label without detailed_metric:\n{text}"
    );
    // detailed_metric: one series per descriptor value.
    let detailed = |name: &str, v: &str| {
        format!(
            "tollgate_rule_{name}_total{{domain=\"m\",rule=\"detailed\",descriptor=\"detailed={v}\"}}"
        )
    };
    assert_eq!(value(&text, &detailed("hits", "x")), 3.0);
    assert_eq!(value(&text, &detailed("within_limit", "x")), 2.0);
    assert_eq!(value(&text, &detailed("over_limit", "x")), 1.0);
    assert_eq!(value(&text, &detailed("hits", "y")), 1.0);
    assert_eq!(value(&text, &rule("hits", "m", "detailed")), 0.0);
    // Shadow mode: 1 per year, 3 hits, 2 over and let through.
    assert_eq!(value(&text, &rule("hits", "m", "shadow")), 3.0);
    assert_eq!(value(&text, &rule("over_limit", "m", "shadow")), 2.0);
    assert_eq!(value(&text, &rule("shadow_mode", "m", "shadow")), 2.0);
    assert_eq!(value(&text, &rule("near_limit", "m", "shadow")), 1.0);

    // 14 decided requests (3 over the limit) and 1 refused.
    assert_eq!(value(&text, "tollgate_requests_total{result=\"ok\"}"), 11.0);
    assert_eq!(
        value(&text, "tollgate_requests_total{result=\"over_limit\"}"),
        3.0
    );
    assert_eq!(
        value(&text, "tollgate_requests_total{result=\"error\"}"),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "tollgate_request_errors_total{kind=\"invalid_argument\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "tollgate_request_duration_seconds_count{result=\"ok\"}"
        ),
        11.0
    );
    assert_eq!(value(&text, "tollgate_request_descriptors_count"), 15.0);
    assert_eq!(value(&text, "tollgate_request_descriptors_sum"), 15.0);
    // Every decided request made one backend call; none failed.
    assert_eq!(
        value(
            &text,
            "tollgate_backend_duration_seconds_count{operation=\"decide\"}"
        ),
        14.0
    );
    assert_eq!(
        value(
            &text,
            "tollgate_backend_errors_total{operation=\"decide\",kind=\"unavailable\"}"
        ),
        0.0
    );
    assert_eq!(value(&text, "tollgate_config_generation"), 1.0);
    server.stop().await;
}

#[tokio::test]
async fn near_limit_follows_the_ratio() {
    let metrics = Arc::new(Metrics::new(0.5, true));
    let yaml =
        "domain: n\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n";
    let limiter = Limiter::with_metrics(
        config(yaml),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
        metrics,
    );
    let server = TestServer::start_limiter(Arc::new(limiter)).await;
    hit(&server, "n", "k", "v", 5).await;
    let text = scrape(&server).await;
    // Used 1, 2, 3, 4 of 4: the 3rd and 4th are past half (2); the 5th is over.
    assert_eq!(value(&text, &rule("near_limit", "n", "k")), 2.0);
    assert_eq!(value(&text, &rule("over_limit", "n", "k")), 1.0);
    server.stop().await;
}

#[tokio::test]
async fn denials_answered_by_the_local_cache_are_counted_apart() {
    let store = Arc::new(OverLimitCache::new(MemoryStore::new(), 1 << 20));
    let yaml =
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let server = TestServer::start(config(yaml), store.clone(), LimiterOptions::default()).await;
    // 1 admitted, 1 denied by the store (and remembered), 2 denied by the cache.
    assert_eq!(hit(&server, "c", "k", "v", 4).await, 3);
    assert_eq!(store.hits(), 2);
    let text = scrape(&server).await;
    assert_eq!(value(&text, &rule("hits", "c", "k")), 4.0);
    assert_eq!(value(&text, &rule("over_limit", "c", "k")), 3.0);
    assert_eq!(
        value(&text, &rule("over_limit_with_local_cache", "c", "k")),
        2.0
    );
    server.stop().await;
}

/// Always down, as Redis is during an outage.
struct Down;

impl Store for Down {
    fn decide<'a>(&'a self, _ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(async { Err(StoreError::Unavailable("down for the test".into())) })
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        self.decide(ops)
    }
}

#[tokio::test]
async fn backend_errors_and_fallbacks_are_counted() {
    let metrics = Arc::new(Metrics::default());
    let yaml = "domain: open\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let closed = "domain: closed\nfailure_mode: error\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let config = tollgate::config::load_sources(&[
        (std::path::Path::new("open.yaml"), yaml),
        (std::path::Path::new("closed.yaml"), closed),
    ])
    .expect("fixture loads");
    let store = Arc::new(Metered::new(Down, metrics.clone()));
    let limiter = Limiter::with_metrics(config, store, LimiterOptions::default(), metrics);
    let server = TestServer::start_limiter(Arc::new(limiter)).await;
    assert_eq!(hit(&server, "open", "k", "v", 3).await, 0, "fail open");
    let mut client = server.client().await;
    let req = request("closed", vec![descriptor(&[("k", "v")])]);
    let status = client.should_rate_limit(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);

    let text = scrape(&server).await;
    let errors = "tollgate_backend_errors_total{operation=\"decide\",kind=\"unavailable\"}";
    assert_eq!(value(&text, errors), 4.0);
    let fallbacks = |mode: &str| {
        value(
            &text,
            &format!("tollgate_fallback_decisions_total{{failure_mode=\"{mode}\"}}"),
        )
    };
    assert_eq!((fallbacks("allow"), fallbacks("error")), (3.0, 1.0));
    assert_eq!(
        value(
            &text,
            "tollgate_request_errors_total{kind=\"store_unavailable\"}"
        ),
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn reloads_are_counted_and_the_generation_follows() {
    let dir = tempfile::tempdir().unwrap();
    let yaml =
        "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    fs::write(dir.path().join("r.yaml"), yaml).unwrap();
    let loaded = reload::load_set(dir.path()).unwrap();
    let first_hash = loaded.hash.clone();
    let limiter = Arc::new(Limiter::new(
        loaded.config,
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let status = Arc::new(ReloadStatus::new(Some(loaded.hash)));
    let reloader = Reloader::new(limiter.clone(), dir.path().into(), status.clone());
    let server = TestServer::start_limiter(limiter).await;
    let text = scrape(&server).await;
    assert_eq!(value(&text, "tollgate_config_generation"), 1.0);
    assert_eq!(
        value(
            &text,
            &format!("tollgate_config_info{{hash=\"{first_hash}\"}}")
        ),
        1.0
    );

    fs::write(dir.path().join("r.yaml"), yaml.replace("1}", "2}")).unwrap();
    reloader
        .reload(Trigger::Manual)
        .await
        .expect("a valid set swaps");
    fs::write(dir.path().join("r.yaml"), "domain: r\nbogus: 1\n").unwrap();
    reloader
        .reload(Trigger::Manual)
        .await
        .expect_err("a broken set is refused");

    let text = scrape(&server).await;
    assert_eq!(
        value(&text, "tollgate_config_reloads_total{result=\"success\"}"),
        1.0
    );
    assert_eq!(
        value(&text, "tollgate_config_reloads_total{result=\"failure\"}"),
        1.0
    );
    assert_eq!(value(&text, "tollgate_config_generation"), 2.0);
    let hash = status.snapshot().hash.expect("served from disk");
    assert_ne!(hash, first_hash);
    assert_eq!(
        value(&text, &format!("tollgate_config_info{{hash=\"{hash}\"}}")),
        1.0
    );
    assert!(!text.contains(&first_hash), "the old hash is gone:\n{text}");
    server.stop().await;
}

#[tokio::test]
async fn metrics_can_be_turned_off() {
    let limiter = Limiter::with_metrics(
        config(RULES),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
        Arc::new(Metrics::new(0.8, false)),
    );
    let server = TestServer::start_limiter(Arc::new(limiter)).await;
    let (status, _, _) = get(server.http_addr, "/metrics").await;
    assert_eq!(status, 404);
    server.stop().await;
}
