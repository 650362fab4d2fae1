//! Zipkin B3 propagation, as envoyproxy/ratelimit reads it (#1110): `tollgate serve`
//! exports over OTLP to a collector inside this test; a gRPC call carrying the single
//! `b3` header and a `POST /json` carrying the multi `X-B3-*` headers must each come
//! back as a request span of the caller's trace, child of the caller's span.

use crate::common;

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tracing_otlp::{grpc_collector, hex};

use common::process::{self, Server};
use tollgate::proto::RateLimitServiceClient;

/// The gRPC call's trace (single `b3` header) and the `/json` call's (multi headers,
/// a 64-bit trace id, which is the low half of the 128-bit one).
const GRPC_TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
const JSON_TRACE_64: &str = "a3ce929d0e0e4736";
const CALLER_SPAN: &str = "e457b5a2e4d86bd1";

async fn post_json_with_multi_b3(port: u16) {
    let body = r#"{"domain":"traced","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         X-B3-TraceId: {JSON_TRACE_64}\r\nX-B3-SpanId: {CALLER_SPAN}\r\n\
         X-B3-ParentSpanId: 05e3ac9a4f6e3b90\r\nX-B3-Sampled: 1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_single_and_multi_headers_put_the_request_span_under_the_callers_trace() {
    let (collector, mut exports) = grpc_collector().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.yaml"),
        "domain: traced\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap();
    let (grpc, http) = process::free_ports();
    let mut command = process::tollgate();
    command
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--drain-seconds", "0"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}"))
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);

    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let mut request = tonic::Request::new(common::server::request(
        "traced",
        vec![common::server::descriptor(&[("user", "alice")])],
    ));
    let b3 = format!("{GRPC_TRACE}-{CALLER_SPAN}-1");
    request.metadata_mut().insert("b3", b3.parse().unwrap());
    client.should_rate_limit(request).await.unwrap();
    post_json_with_multi_b3(http).await;

    let json_trace = format!("{:0>32}", JSON_TRACE_64);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut grpc_span, mut json_span): (Option<Span>, Option<Span>) = (None, None);
    while grpc_span.is_none() || json_span.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(export)) = tokio::time::timeout(left, exports.recv()).await else {
            panic!(
                "the b3 traces' request spans did not arrive:\n{}",
                server.log()
            );
        };
        let spans = export
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        for span in spans {
            let trace = hex(&span.trace_id);
            if span.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
                && trace == GRPC_TRACE
            {
                grpc_span = Some(span);
            } else if span.name == "POST /json" && trace == json_trace {
                json_span = Some(span);
            }
        }
    }
    for span in [grpc_span.unwrap(), json_span.unwrap()] {
        assert_eq!(
            hex(&span.parent_span_id),
            CALLER_SPAN,
            "{}: child of the caller's span",
            span.name
        );
    }
    assert!(server.terminate().success());
}
