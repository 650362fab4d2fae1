//! OpenTelemetry traces end to end: `tollgate serve` (a child process, configured by
//! environment only) exports its spans over OTLP to a collector inside this test, once
//! over gRPC (a tonic `TraceService`) and once over http/protobuf (an axum endpoint
//! decoding `ExportTraceServiceRequest`). A call carrying a W3C `traceparent` in its
//! gRPC metadata must come back as spans of that trace: the request span as a child
//! of the caller's span, with the match and backend spans under it; and a `POST /json`
//! with a `traceparent` header, likewise.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;

use common::process::{self, Server};
use tollgate::proto::RateLimitServiceClient;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// The trace of the `POST /json` call.
const JSON_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// Collected export requests.
type Exports = mpsc::UnboundedSender<ExportTraceServiceRequest>;

struct Collector(Exports);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC collector on a free port, and the export requests it receives (the
/// b3 suite uses it too).
pub(crate) async fn grpc_collector() -> (
    SocketAddr,
    mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (addr, rx)
}

async fn http_collector() -> (
    SocketAddr,
    mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let tx = tx.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("protobuf export");
                let _ = tx.send(request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, rx)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

/// Starts `serve` exporting to `endpoint` with `protocol`, sends one traced call, and
/// returns the spans of that trace once the request, match and backend spans are in,
/// with the service name of the resource they came under.
async fn traced_call(
    protocol: &str,
    endpoint: String,
    mut exports: mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) -> (Vec<Span>, String) {
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
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
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
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    client.should_rate_limit(request).await.unwrap();
    post_json(http).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut spans = Vec::new();
    let mut service = String::new();
    let arrived = |spans: &[Span]| {
        // Each call has its request, match and backend spans.
        let named = |name: &str| spans.iter().filter(|s| s.name == name).count();
        named("match") == 2
            && named("backend decide") == 2
            && named("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit") == 1
            && named("POST /json") == 1
    };
    while !arrived(&spans) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(export)) = tokio::time::timeout(left, exports.recv()).await else {
            panic!(
                "spans of the trace did not arrive: {spans:#?}\n{}",
                server.log()
            );
        };
        for resource_spans in export.resource_spans {
            let name = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                });
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let trace = hex(&span.trace_id);
                    if trace == TRACE_ID || trace == JSON_TRACE_ID {
                        service = name.clone().unwrap_or_default();
                        spans.push(span);
                    }
                }
            }
        }
    }
    let status = server.terminate();
    assert!(status.success(), "serve exited with {status}");
    (spans, service)
}

/// `POST /json` with a `traceparent` header of [`JSON_TRACE_ID`].
async fn post_json(port: u16) {
    let body = r#"{"domain":"traced","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         traceparent: 00-{JSON_TRACE_ID}-{PARENT_ID}-01\r\n\
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

fn check(spans: &[Span], service: &str) {
    assert_eq!(service, "tollgate");
    let json = spans.iter().find(|s| s.name == "POST /json").unwrap();
    assert_eq!(hex(&json.trace_id), JSON_TRACE_ID);
    assert_eq!(hex(&json.parent_span_id), PARENT_ID);
    assert_eq!(attribute(json, "decision"), Some("ok"));
    let spans: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let request = spans
        .iter()
        .find(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .unwrap_or_else(|| panic!("no request span: {spans:#?}"));
    assert_eq!(
        hex(&request.parent_span_id),
        PARENT_ID,
        "child of Envoy's span"
    );
    assert_eq!(attribute(request, "domain"), Some("traced"));
    assert_eq!(attribute(request, "decision"), Some("ok"));
    let matching = spans.iter().find(|s| s.name == "match").unwrap();
    assert_eq!(matching.parent_span_id, request.span_id);
    assert_eq!(attribute(matching, "rules"), Some("user"));
    let backend = spans.iter().find(|s| s.name == "backend decide").unwrap();
    assert_eq!(backend.parent_span_id, request.span_id);
    assert_eq!(attribute(backend, "domain"), Some("traced"));
    assert_eq!(attribute(backend, "rule"), Some("user"));
    assert_eq!(attribute(backend, "decision"), Some("ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_grpc_collector_under_the_incoming_trace() {
    let (addr, exports) = grpc_collector().await;
    let (spans, service) = traced_call("grpc", format!("http://{addr}"), exports).await;
    check(&spans, &service);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_http_protobuf_collector_under_the_incoming_trace() {
    let (addr, exports) = http_collector().await;
    let (spans, service) = traced_call("http/protobuf", format!("http://{addr}"), exports).await;
    check(&spans, &service);
}
