//! Graceful shutdown: health turns NOT_SERVING the moment shutdown begins, both ports
//! keep answering through the drain period, then new connections are refused while
//! the calls in flight still finish.
//!
//! The in-process test drives `server::run_with` under continuous load. The process
//! test holds calls in flight for seconds with Redis' `CLIENT PAUSE WRITE` (every
//! counter script waits), sends `tollgate serve` SIGTERM while they are parked, and
//! checks, in order: health NOT_SERVING at once, connections refused once the drain
//! is over while the calls are still parked, then every one of them answered OK and
//! a clean exit.

use crate::common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use common::process::{Server, free_ports, tollgate, wait_for_exit};
use common::server::{config, descriptor, refused_soon, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;
use tollgate::server::{self, Listeners, ServeOptions};
use tollgate::store::memory::MemoryStore;

const YAML: &str = "domain: sd\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
const DEADLINE: Duration = Duration::from_secs(20);

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"))
}

async fn health_of(channel: Channel) -> i32 {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(response) => response.into_inner().status,
        Err(status) => panic!("health check failed: {status}"),
    }
}

async fn one_call(channel: Channel, value: &str) -> Result<Code, tonic::Status> {
    let response = RateLimitServiceClient::new(channel)
        .should_rate_limit(request("sd", vec![descriptor(&[("k", value)])]))
        .await?;
    Ok(Code::try_from(response.into_inner().overall_code).unwrap_or(Code::Unknown))
}

/// `GET /healthcheck`: (status code, body).
fn healthcheck(addr: SocketAddr) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect HTTP");
    stream
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        raw.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default(),
    )
}

fn refused(addr: SocketAddr) -> bool {
    matches!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flips_at_once_calls_go_on_through_the_drain_then_connections_are_refused() {
    let drain = Duration::from_millis(1500);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let listeners = Listeners::bind(any, any).await.unwrap();
    let (grpc, http) = (listeners.grpc_addr(), listeners.http_addr());
    let limiter = Arc::new(Limiter::new(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let options = ServeOptions {
        drain,
        ..ServeOptions::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server::run_with(listeners, limiter, options, async move {
        let _ = stopped.await;
    }));
    let main = channel(grpc).await;
    assert_eq!(health_of(main.clone()).await, ServingStatus::Serving as i32);

    // Continuous load from four clients; each stops at its first failure, which may
    // only come once the drain is over.
    let began = Instant::now();
    let mut clients = Vec::new();
    for n in 0..4 {
        let channel = channel(grpc).await;
        clients.push(tokio::spawn(async move {
            let mut answered = 0u32;
            loop {
                let started = began.elapsed();
                match one_call(channel.clone(), &format!("c{n}")).await {
                    Ok(code) => {
                        assert_eq!(code, Code::Ok);
                        answered += 1;
                    }
                    Err(status) => return (answered, started, status),
                }
                if started > Duration::from_secs(20) {
                    panic!("the server never stopped answering");
                }
            }
        }));
    }

    let shutdown_at = began.elapsed();
    let _ = stop.send(());
    let deadline = Instant::now() + DEADLINE;
    while health_of(main.clone()).await != ServingStatus::NotServing as i32 {
        assert!(Instant::now() < deadline, "health never said NOT_SERVING");
    }
    let flipped = began.elapsed() - shutdown_at;
    assert!(flipped < drain / 2, "NOT_SERVING took {flipped:?}");

    // Still answering during the drain, on new connections too.
    let (status, body) = tokio::task::spawn_blocking(move || healthcheck(http))
        .await
        .unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    assert_eq!(
        one_call(channel(grpc).await, "late").await.unwrap(),
        Code::Ok
    );

    tokio::time::timeout(DEADLINE, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let drain_end = shutdown_at + drain;
    for client in clients {
        let (answered, started, status) = client.await.unwrap();
        assert!(answered > 0);
        // Only calls sent as the listeners close (or after) may fail.
        assert!(
            started + Duration::from_millis(200) >= drain_end,
            "a call sent {:?} before the drain ended failed: {status}",
            drain_end.saturating_sub(started)
        );
    }
    // In-process listeners: closed, though a moment may pass (see `refused_soon`).
    assert!(refused_soon(grpc), "gRPC port still accepts");
    assert!(refused_soon(http), "HTTP port still accepts");
}

/// Lifts the pause even when the test fails half-way, so no other test waits on it.
struct Unpause(u16);

impl Drop for Unpause {
    fn drop(&mut self) {
        let _ = common::redis::try_redis_cli(self.0, &["CLIENT", "UNPAUSE"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_at_sigterm_all_complete() {
    const CLIENTS: usize = 8;
    let drain = Duration::from_secs(2);
    let pause = Duration::from_secs(6);
    // A server of this test's own: the pause below stops every writer on it.
    let redis = common::redis::custom::private_standalone("shutdown").expect("private redis");
    let prefix = common::redis::unique_prefix("shutdown");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sd.yaml"), YAML).unwrap();
    let (grpc_port, http_port) = free_ports();
    let grpc: SocketAddr = ([127, 0, 0, 1], grpc_port).into();
    let http: SocketAddr = ([127, 0, 0, 1], http_port).into();
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(dir.path())
        .args(["--redis-url", &redis.url(), "--key-prefix", &prefix])
        // Parked calls must outlive the pause, not time out.
        .args(["--redis-timeout-ms", "30000", "--drain-seconds", "2"])
        .args([
            "--grpc-addr",
            &grpc.to_string(),
            "--http-addr",
            &http.to_string(),
        ]);
    let mut server = Server::spawn(command);
    tokio::task::block_in_place(|| server.wait_until_serving(grpc_port));
    let mut channels = Vec::new();
    for n in 0..CLIENTS {
        let channel = channel(grpc).await;
        assert_eq!(
            one_call(channel.clone(), &format!("c{n}")).await.unwrap(),
            Code::Ok
        );
        channels.push(channel);
    }

    // From here every counter script waits in Redis: a call sent now cannot be
    // answered before the pause ends, long after SIGTERM and the drain.
    let pause_ms = pause.as_millis().to_string();
    redis.cli(&["CLIENT", "PAUSE", &pause_ms, "WRITE"]);
    let _unpause = Unpause(redis.port());
    let paused = Instant::now();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for (n, channel) in channels.into_iter().enumerate() {
        let answered = answered.clone();
        calls.push(tokio::spawn(async move {
            let result = one_call(channel, &format!("c{n}")).await;
            answered.fetch_add(1, Ordering::SeqCst);
            result
        }));
    }
    // They have reached Redis (the first script of the batch is parked).
    let deadline = Instant::now() + DEADLINE;
    while common::redis::info_field(&redis.cli(&["INFO", "clients"]), "blocked_clients")
        .is_none_or(|n| n == "0")
    {
        assert!(
            Instant::now() < deadline,
            "no call reached Redis:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let pid = server.child.id().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(kill.unwrap().success());
    let sigterm = Instant::now();

    // NOT_SERVING at once (on a new connection: the ports still accept).
    while health_of(channel(grpc).await).await != ServingStatus::NotServing as i32 {
        assert!(sigterm.elapsed() < drain, "health still SERVING");
    }
    let (status, _) = tokio::task::spawn_blocking(move || healthcheck(http))
        .await
        .unwrap();
    assert_eq!(status, 500);

    // After the drain: refused, while every call is still parked.
    while !tokio::task::spawn_blocking(move || refused(grpc))
        .await
        .unwrap()
    {
        assert!(
            paused.elapsed() < pause,
            "still accepting connections:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sigterm.elapsed() >= drain,
        "refused before the drain was over"
    );
    assert!(refused(http), "HTTP port still accepts");
    assert_eq!(
        answered.load(Ordering::SeqCst),
        0,
        "a parked call returned early"
    );

    // The pause ends; every parked call is answered OK, then the process exits.
    for call in calls {
        let result = tokio::time::timeout(DEADLINE, call).await.unwrap().unwrap();
        assert_eq!(
            result.map_err(|s| s.to_string()),
            Ok(Code::Ok),
            "{}",
            server.log()
        );
    }
    let status = tokio::task::block_in_place(|| wait_for_exit(&mut server.child, DEADLINE));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", server.log());
}
