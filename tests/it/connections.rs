//! The ports' connections are bounded (docs/operations.md, "Connections"), checked
//! against the real binary with real HTTP/2 clients: hand-written frames for a flood
//! that ignores the server's stream limit (`connections/raw.rs`), the `h2` crate for
//! a client that stops reading and for idle connections, plain TCP for connections
//! that never speak. Memory is the server's RSS from /proc.

mod raw;
mod served;
mod timeouts;

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;

use self::served::{FINISH_WITHIN, PATH, answers, metric, serve, serve_draining, status_kib, stop};

/// 100,000 streams opened on one connection without a body (the server's stream
/// limit ignored): the server refuses what passes its limit and closes the connection,
/// its memory grows by at most 64 MiB, another client is still answered, and with
/// 1,000 such streams opened (the stream limit held, the rest refused) SIGTERM still
/// ends the process within its drain and the shutdown's bounded wait.
#[test]
fn a_flood_of_header_only_streams_costs_little_and_serve_still_stops() {
    let served = serve_draining("1");
    let pid = served.server.child.id();
    let before = status_kib(pid, "VmRSS:");
    let flood = raw::Flood::open(served.grpc, 100_000);
    let opened = flood.opened;
    let answered = flood.answered_within(Duration::from_secs(30));
    let peak = status_kib(pid, "VmHWM:");
    let grown_mib = peak.saturating_sub(before) as f64 / 1024.0;
    eprintln!(
        "flood: {opened} HEADERS sent, {} streams reset, GOAWAY {}, closed {}; RSS {before} KiB \
         before, peak {peak} KiB: +{grown_mib:.1} MiB",
        answered.resets, answered.goaway, answered.closed
    );
    assert!(
        answered.goaway && answered.closed,
        "the server ends a connection that keeps opening streams past its limit: {answered:?}"
    );
    assert!(grown_mib <= 64.0, "the flood cost {grown_mib:.1} MiB");
    assert!(
        answers(&served),
        "another client is answered after the flood"
    );

    // Held open (as many as the connection takes), never sent a body, until SIGTERM.
    let held = raw::Flood::open(served.grpc, 1000);
    assert_eq!(held.opened, 1000);
    let (took, log) = stop(served.server);
    held.close();
    let bound = Duration::from_secs(1) + FINISH_WITHIN + Duration::from_secs(3);
    assert!(
        took <= bound,
        "serve took {took:?} to stop (drain 1 s, bound {bound:?}):\n{log}"
    );
    assert!(
        log.contains("connections_closed_at_shutdown"),
        "the held streams' connection was closed at the end of the wait:\n{log}"
    );
}

/// 100,000 streams without a body again, now spread over 100 connections of 1,000:
/// each connection takes its `--max-concurrent-streams`, the port holds at most
/// `--max-calls` of those and resets the rest at once (REFUSED_STREAM), so memory
/// still grows by at most 64 MiB; once the connections close, calls are answered
/// again.
#[test]
fn header_only_streams_over_many_connections_are_bounded_by_the_port() {
    let served = serve(&[]);
    let pid = served.server.child.id();
    let before = status_kib(pid, "VmRSS:");
    let floods: Vec<raw::Flood> = (0..100)
        .map(|_| raw::Flood::open(served.grpc, 1000))
        .collect();
    let answered = || -> usize {
        floods
            .iter()
            .map(|f| f.resets.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    };
    // Every stream but the held ones reset: by its connection past the stream limit,
    // or by the port past --max-calls.
    let limits = tollgate::settings::connections::ConnectionLimits::default();
    let refused = 100_000 - limits.max_calls;
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered() < refused {
        assert!(
            Instant::now() < deadline,
            "{} of the {refused} streams not held were reset",
            answered()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let peak = status_kib(pid, "VmHWM:");
    let grown_mib = peak.saturating_sub(before) as f64 / 1024.0;
    let refusals = metric(&served, r#"tollgate_calls_refused_total{port="grpc"}"#);
    eprintln!(
        "100 x 1,000 streams: {} reset at once, {refusals} refused by the port; RSS {before} \
         KiB before, peak {peak} KiB: +{grown_mib:.1} MiB",
        answered()
    );
    let accepted = 100 * (limits.max_concurrent_streams as usize).min(1000);
    assert_eq!(
        refusals,
        (accepted - limits.max_calls) as f64,
        "exactly the streams past the bound refused"
    );
    for flood in floods {
        flood.close();
    }
    assert!(grown_mib <= 64.0, "{grown_mib:.1} MiB for the held streams");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(&served) {
        assert!(
            Instant::now() < deadline,
            "never answered after the floods closed"
        );
    }
}

/// gRPC framing of one ShouldRateLimit request.
fn grpc_message() -> Bytes {
    let request = common::server::request("conn", vec![common::server::descriptor(&[("k", "v")])]);
    let body = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend(u32::try_from(body.len()).expect("small").to_be_bytes());
    framed.extend(body);
    Bytes::from(framed)
}

fn grpc_request(port: u16) -> http::Request<()> {
    http::Request::post(format!("http://127.0.0.1:{port}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request")
}

async fn h2_connect(
    port: u16,
    window: u32,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake(tcp)
        .await
        .expect("HTTP/2 handshake");
    (client, tokio::spawn(connection))
}

/// A call whose body never comes is answered DEADLINE_EXCEEDED at the request
/// timeout; a client that stops reading (no flow-control credit for the answers)
/// loses its connection soon after the request timeout, not before.
#[tokio::test(flavor = "multi_thread")]
async fn calls_and_unread_answers_are_bounded_by_the_request_timeout() {
    let served = tokio::task::spawn_blocking(|| serve(&["--request-timeout-ms", "400"]))
        .await
        .expect("serve");
    let (client, _connection) = h2_connect(served.grpc, 65_535).await;
    let mut client = client.ready().await.expect("ready");
    let asked = Instant::now();
    let (response, _body) = client
        .send_request(grpc_request(served.grpc), false)
        .expect("a stream");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("answered")
        .expect("a response");
    let status = response.headers().get("grpc-status").map(|v| v.as_bytes());
    assert_eq!(status, Some(&b"4"[..]), "DEADLINE_EXCEEDED: {response:?}");
    assert!(
        asked.elapsed() >= Duration::from_millis(400),
        "{:?}",
        asked.elapsed()
    );

    // No credit at all for the server's DATA: every answer is held. (The responses
    // are kept: a dropped one resets its stream, which frees the server.)
    let (client, connection) = h2_connect(served.grpc, 0).await;
    let mut client = client.ready().await.expect("ready");
    let asked = Instant::now();
    let mut responses = Vec::new();
    for _ in 0..10 {
        let (response, mut body) = client
            .send_request(grpc_request(served.grpc), false)
            .expect("a stream");
        body.send_data(grpc_message(), true)
            .expect("the request's body");
        responses.push(response);
    }
    let ended = tokio::time::timeout(Duration::from_secs(15), connection).await;
    let took = asked.elapsed();
    assert!(ended.is_ok(), "the connection was never closed");
    assert!(took >= Duration::from_millis(400), "closed after {took:?}");
    drop(responses);
    let served = tokio::task::spawn_blocking(move || {
        let stalled = metric(
            &served,
            r#"tollgate_connections_closed_total{port="grpc",reason="stalled"}"#,
        );
        assert_eq!(stalled, 1.0, "closed as stalled");
        served
    })
    .await
    .expect("metrics");
    drop(served);
}
