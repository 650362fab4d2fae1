//! `tollgate serve` with stderr on a pipe nobody reads (a stuck log shipper), at
//! `LOG_LEVEL=debug` so every request logs: for 30 s every call is still answered in
//! its usual time and `/healthcheck` answers, the dropped lines are counted in
//! `/metrics`, and once the pipe is drained one line says how many were dropped.
//! (Before the logs went through a bounded queue, every call ran into its deadline
//! after about 6 s of this.)

use std::fs;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;

use crate::common::process::{DEADLINE, free_ports, tollgate};
use crate::common::server::{descriptor, request};
use crate::reload::http_get;

const CONFIG: &str = "domain: stuck\ndescriptors:\n  - key: user\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// How long the pipe stays undrained while calls go on.
const STUCK_FOR: Duration = Duration::from_secs(30);
/// A call answered later than this was held up (they take a few ms here).
const USUAL: Duration = Duration::from_secs(1);
const CLIENTS: usize = 8;

/// Killed when dropped, so a failed assertion leaves no server behind.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Calls from one client until `until`: (calls, the slowest), or the first failure.
async fn client(grpc: u16, id: usize, until: Instant) -> Result<(u64, Duration), String> {
    let address = format!("http://127.0.0.1:{grpc}");
    let mut client = RateLimitServiceClient::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let (mut calls, mut slowest) = (0u64, Duration::ZERO);
    while Instant::now() < until {
        let user = format!("u{id}-{}", calls % 64);
        let call = request("stuck", vec![descriptor(&[("user", &user)])]);
        let began = Instant::now();
        let answer = tokio::time::timeout(USUAL * 10, client.should_rate_limit(call)).await;
        let took = began.elapsed();
        match answer {
            Ok(Ok(response)) => assert_eq!(response.into_inner().overall_code, Code::Ok as i32),
            Ok(Err(status)) => return Err(format!("call {calls} failed: {status}")),
            Err(_) => return Err(format!("call {calls} unanswered after {took:?}")),
        }
        slowest = slowest.max(took);
        calls += 1;
    }
    Ok((calls, slowest))
}

#[test]
fn an_undrained_stderr_pipe_never_holds_up_a_call() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("stuck.yaml"), CONFIG).unwrap();
    let (grpc, http) = free_ports();
    let child = tollgate()
        .args(["serve", "--no-watch", "--drain-seconds", "0", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .env("LOG_LEVEL", "debug")
        .env("LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate serve");
    let mut serve = Serve(child);
    wait_for_port(grpc);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let until = Instant::now() + STUCK_FOR;
    let results = runtime.block_on(async {
        let clients = (0..CLIENTS).map(|id| tokio::spawn(client(grpc, id, until)));
        let mut results = Vec::new();
        for handle in clients {
            results.push(handle.await.expect("client task"));
        }
        results
    });
    drop(runtime);
    let mut calls = 0;
    for result in results {
        let (n, slowest) = result.unwrap_or_else(|e| panic!("{e}"));
        assert!(slowest < USUAL, "a call took {slowest:?}");
        calls += n;
    }
    let health = within(USUAL * 5, move || http_get(http, "/healthcheck"));
    assert_eq!(health.as_deref(), Some("OK"), "/healthcheck held up");
    let metrics = http_get(http, "/metrics");
    let dropped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_log_lines_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no drop count in:\n{metrics}"));
    assert!(
        dropped > 0,
        "{calls} calls never filled the pipe: the test proves nothing"
    );

    // Drained now: the lines that were queued come out, then the one line that
    // reports the drops (the writer sends it after the first line that got through).
    let stderr = serve.0.stderr.take().expect("piped stderr");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + DEADLINE;
    let report = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) if line.contains("\"event\":\"log_lines_dropped\"") => break line,
            Ok(_) => {}
            Err(_) => panic!("no drop report within {DEADLINE:?} of draining"),
        }
    };
    assert!(report.contains("\"dropped\":"), "{report}");
}

/// `f`'s answer if it comes within `bound` (its thread is left behind otherwise).
fn within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(f()));
    answer.recv_timeout(bound).ok()
}

/// Until the gRPC port accepts connections (bounded).
fn wait_for_port(port: u16) {
    let deadline = Instant::now() + DEADLINE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
}
