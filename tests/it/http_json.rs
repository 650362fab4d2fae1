//! The HTTP admin port: `POST /json` with protobuf-JSON bodies (both field spellings)
//! answers 200 or 429 with camelCase protojson, 400 on malformed JSON or an invalid
//! request (but not when the store is down); `GET /healthcheck` answers 200 "OK".
//! The HTTP client is a few lines over a TcpStream (HTTP/1.1, `Connection: close`),
//! so no dependency is added.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::server::{TestServer, config};
use tollgate::clock::ManualClock;
use tollgate::limiter::LimiterOptions;
use tollgate::store::memory::MemoryStore;

const YAML: &str = "domain: web
descriptors:
  - key: client
    rate_limit: {name: per_client, unit: hour, requests_per_unit: 5}
";

/// 3477 s into an hour, so an hour window resets in 123 s.
const NOW_MILLIS: u64 = (1_699_999_200 + 3477) * 1000;

struct HttpResponse {
    status: u16,
    head: String,
    body: String,
}

/// One HTTP/1.1 request; reads until the server closes the connection.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("header/body separator");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "this client does not decode chunked bodies: {head}"
    );
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    HttpResponse {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

async fn post_json(server: &TestServer, body: &str) -> HttpResponse {
    http(server.http_addr, "POST", "/json", body).await
}

fn json(response: &HttpResponse) -> Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", response.body))
}

async fn server() -> TestServer {
    let clock = Arc::new(ManualClock::new(NOW_MILLIS));
    let store = Arc::new(MemoryStore::with_clock(clock));
    TestServer::start(config(YAML), store, LimiterOptions::default()).await
}

fn body(client: &str, hits_field: &str, hits: u32) -> String {
    format!(
        r#"{{"domain":"web","descriptors":[{{"entries":[{{"key":"client","value":"{client}"}}]}}],"{hits_field}":{hits}}}"#
    )
}

#[tokio::test]
async fn json_check_answers_camel_case_protojson() {
    let server = server().await;
    let r = post_json(&server, &body("a", "hits_addend", 2)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{}",
        r.head
    );
    let v = json(&r);
    assert_eq!(v["overallCode"], "OK", "{v}");
    let statuses = v["statuses"].as_array().expect("statuses array");
    assert_eq!(statuses.len(), 1);
    let s = &statuses[0];
    assert_eq!(s["code"], "OK");
    assert_eq!(s["currentLimit"]["name"], "per_client");
    assert_eq!(s["currentLimit"]["requestsPerUnit"], 5);
    assert_eq!(s["currentLimit"]["unit"], "HOUR");
    assert_eq!(s["limitRemaining"], 3);
    assert_eq!(s["durationUntilReset"], "123s");
    assert!(v.get("overall_code").is_none() && s.get("limit_remaining").is_none());

    // The camelCase spelling of the request field counts the same.
    let v = json(&post_json(&server, &body("a", "hitsAddend", 2)).await);
    assert_eq!(v["statuses"][0]["limitRemaining"], 1, "{v}");
    server.stop().await;
}

#[tokio::test]
async fn json_descriptor_hits_addend_in_both_spellings() {
    let server = server().await;
    let body = |field: &str| {
        format!(
            r#"{{"domain":"web","descriptors":[{{"entries":[{{"key":"client","value":"d"}}],"{field}":"3"}}]}}"#
        )
    };
    let r = post_json(&server, &body("hits_addend")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["statuses"][0]["limitRemaining"], 2, "{}", r.body);
    // 3 + 3 > 5: only refused if `hitsAddend` was read as 3 (one hit would pass).
    let r = post_json(&server, &body("hitsAddend")).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(json(&r)["statuses"][0]["code"], "OVER_LIMIT", "{}", r.body);
    server.stop().await;
}

#[tokio::test]
async fn json_over_limit_is_429() {
    let server = server().await;
    for _ in 0..5 {
        assert_eq!(
            post_json(&server, &body("o", "hits_addend", 1))
                .await
                .status,
            200
        );
    }
    let r = post_json(&server, &body("o", "hits_addend", 1)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    let v = json(&r);
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["durationUntilReset"], "123s");
    server.stop().await;
}

#[tokio::test]
async fn json_bad_requests_are_400() {
    let server = server().await;
    for (what, body) in [
        ("not JSON", "{\"domain\": \"web\", "),
        ("wrong type", r#"{"domain": 5}"#),
        ("unknown field", r#"{"domain":"web","bogus":1}"#),
        (
            "empty domain",
            r#"{"domain":"","descriptors":[{"entries":[{"key":"client","value":"x"}]}]}"#,
        ),
        ("no descriptors", r#"{"domain":"web"}"#),
    ] {
        let r = post_json(&server, body).await;
        assert_eq!(r.status, 400, "{what}: {} {}", r.status, r.body);
        assert!(!r.body.trim().is_empty(), "{what}: 400 without a reason");
    }
    let r = post_json(
        &server,
        r#"{"domain":"","descriptors":[{"entries":[{"key":"client","value":"x"}]}]}"#,
    )
    .await;
    assert!(r.body.contains("domain"), "{}", r.body);
    server.stop().await;
}

#[tokio::test]
async fn healthcheck_is_ok() {
    let server = server().await;
    let r = http(server.http_addr, "GET", "/healthcheck", "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "OK");
    let r = http(server.http_addr, "GET", "/no-such-page", "").await;
    assert_eq!(r.status, 404);
    server.stop().await;
}

#[tokio::test]
async fn json_store_outage_is_not_blamed_on_the_client() {
    let server = TestServer::start(config(YAML), common::stores::down(), Default::default()).await;
    let r = post_json(&server, &body("x", "hits_addend", 1)).await;
    // Either answered (a failure mode) or a server-side error; never 400 Bad Request,
    // which says the request was malformed.
    assert!(
        r.status == 200 || r.status == 429 || (500..600).contains(&r.status),
        "store outage answered {}: {}",
        r.status,
        r.body
    );
    server.stop().await;
}
