//! `tollgate serve` started while Redis is away (an HPA scale-up during an outage):
//! it binds anyway, is NOT_SERVING with `tollgate_backend_up` 0, answers by the
//! domain's `failure_mode` at once, and once a `redis-server` appears on the
//! configured port it connects by itself (no restart) and counts in Redis. Settings
//! no retry can fix still stop the start. The real binary, a real `redis-server`;
//! every wait is bounded.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::process::{DEADLINE, Server, check, free_ports, row, run, text, tollgate};
use common::redis::custom::free_port;

/// `deny`, so a fallback answer (OVER_LIMIT) cannot be mistaken for a counted one.
const CONFIG: &str = "domain: boot\nfailure_mode: deny\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 100}\n";

fn serve(dir: &Path, redis_url: &str) -> (Server, u16, u16) {
    let (grpc, http) = free_ports();
    let mut command: Command = tollgate();
    command
        .args(["serve", "--config"])
        .arg(dir)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .env("LOG_FORMAT", "json")
        .env("REDIS_URL", redis_url)
        .env("CACHE_KEY_PREFIX", "boot_");
    (Server::spawn(command), grpc, http)
}

/// `GET path` on the HTTP port: (status, body), or `None` while it does not answer.
fn get(http: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let code = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// Waits (bounded by `within`) until `/healthcheck` answers `code`; the time it took.
fn wait_for_health(server: &mut Server, http: u16, code: u16, within: Duration) -> Duration {
    let began = Instant::now();
    let mut last = None;
    while began.elapsed() < within {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("serve exited with {status}:\n{}", server.log());
        }
        last = get(http, "/healthcheck").map(|(c, _)| c);
        if last == Some(code) {
            return began.elapsed();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "/healthcheck never answered {code} within {within:?} (last {last:?}):\n{}",
        server.log()
    );
}

/// A `redis-server` of this test's own on `port`, killed when dropped.
struct Redis(Child);

impl Redis {
    fn start(port: u16) -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.keep())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (run scripts/bootstrap)");
        Redis(child)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_keys(port: u16) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--scan", "--pattern", "boot_*"])
        .output()
        .expect("redis-cli");
    text(&out.stdout)
}

#[test]
fn serve_starts_without_redis_and_connects_when_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("boot.yaml"), CONFIG).unwrap();
    let port = free_port();
    let (mut server, grpc, http) = serve(dir.path(), &format!("redis://127.0.0.1:{port}"));
    server.wait_until_serving(grpc);
    wait_for_health(&mut server, http, 500, DEADLINE);
    // NOT_SERVING before the first probe ran; the probe then publishes the node down.
    let down = |metrics: &str| {
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_backend_up{") && l.ends_with(" 0"))
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (_, metrics) = get(http, "/metrics").expect("/metrics answers");
        if down(&metrics) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "backend down in the metrics:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Answered by failure_mode, and fast: no connect timeout per request.
    let began = Instant::now();
    let denied = check(&server, grpc, "boot", "k=v");
    assert_eq!(row(&denied, "k=v")[1], "OVER_LIMIT", "{denied}");
    assert!(denied.contains("failure_mode: deny"), "{denied}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );

    let _redis = Redis::start(port);
    let took = wait_for_health(&mut server, http, 200, Duration::from_secs(15));
    assert!(took < Duration::from_secs(10), "connected after {took:?}");
    // The breaker may still be open for a moment after the outage; the counted answer
    // arrives within its open period.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = check(&server, grpc, "boot", "k=v");
        if row(&table, "k=v")[1] == "OK" {
            break;
        }
        assert!(Instant::now() < deadline, "never counted:\n{table}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let keys = redis_keys(port);
    assert!(keys.contains("boot_"), "a counter in Redis: {keys:?}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("redis_unreachable_at_start"), "{log}");
}

/// `/healthcheck` polled every 50 ms from the moment the port answers: never 200
/// before Redis has been reached, and once it is 200 the very next request is
/// counted in Redis, not answered by the failure mode; the same after Redis restarts.
#[test]
fn health_is_serving_only_while_the_store_can_decide() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("boot.yaml"), CONFIG).unwrap();
    let port = free_port();
    let (mut server, grpc, http) = serve(dir.path(), &format!("redis://127.0.0.1:{port}"));
    let began = Instant::now();
    let first = loop {
        if let Some((code, _)) = get(http, "/healthcheck") {
            break code;
        }
        assert!(began.elapsed() < DEADLINE, "the HTTP port never answered");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(first, 500, "SERVING before Redis was ever reached");
    // Four probe intervals of polling: still not serving (not merely for the moment
    // before the first probe).
    for _ in 0..80 {
        assert_eq!(get(http, "/healthcheck").map(|(c, _)| c), Some(500));
        std::thread::sleep(Duration::from_millis(50));
    }
    server.wait_until_serving(grpc);
    // The breaker opens on the failures, as it would under traffic.
    for _ in 0..6 {
        check(&server, grpc, "boot", "k=fallback");
    }
    let redis = Redis::start(port);
    wait_for_health(&mut server, http, 200, Duration::from_secs(20));
    let counted = check(&server, grpc, "boot", "k=first");
    assert_eq!(
        row(&counted, "k=first")[1],
        "OK",
        "right after SERVING:\n{counted}"
    );

    drop(redis);
    wait_for_health(&mut server, http, 500, Duration::from_secs(20));
    for _ in 0..6 {
        check(&server, grpc, "boot", "k=fallback");
    }
    let _redis = Redis::start(port);
    wait_for_health(&mut server, http, 200, Duration::from_secs(20));
    let counted = check(&server, grpc, "boot", "k=again");
    assert_eq!(
        row(&counted, "k=again")[1],
        "OK",
        "right after SERVING again:\n{counted}"
    );
    assert!(redis_keys(port).contains("k=again"), "counted in Redis");
    assert!(server.terminate().success());
}

#[test]
fn a_malformed_redis_url_still_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("boot.yaml"), CONFIG).unwrap();
    let (grpc, http) = free_ports();
    let out = run(tollgate()
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .env("REDIS_URL", "redis://127.0.0.1:notaport"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
