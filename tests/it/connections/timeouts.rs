//! Connections closed by time: those that never speak (handshake timeout), those
//! that make no call (idle timeout) and those that answer no PING (keepalive), on the
//! gRPC and HTTP ports; and accepts that fail for want of file descriptors.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::raw;
use super::served::{CONFIG, Served, answers, cpu_ticks, get, metric, serve, status_kib};
use crate::common;
use common::process::Server;

/// How many connections of each kind the test opens: 5,000, or fewer when this
/// process may not open that many descriptors (two kinds at once, and room to spare).
fn how_many() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1024);
    5000.min(soft.saturating_sub(500) / 2)
}

/// A connection that never sends a byte: how long after it was opened the server
/// closed it (a read returned 0 or failed); `None` when still open after `within`.
async fn silent(port: u16, within: Duration) -> tokio::task::JoinHandle<Option<Duration>> {
    use tokio::io::AsyncReadExt;
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let opened = Instant::now();
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let closed = async {
            // Whatever the server sends (an HTTP/1 error page) until it closes.
            while let Ok(n) = tcp.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        let closed = tokio::time::timeout(within, closed).await;
        closed.ok().map(|()| opened.elapsed())
    })
}

/// An HTTP/2 connection that makes its handshake and no call: how long after it was
/// opened the server closed it; `None` when still open after `within`.
async fn idle(port: u16, within: Duration) -> tokio::task::JoinHandle<Option<Duration>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let opened = Instant::now();
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let closed = tokio::time::timeout(within, connection).await;
        drop(client);
        closed.ok().map(|_| opened.elapsed())
    })
}

/// Connections that never send a byte are closed after the handshake timeout, and
/// HTTP/2 connections that made their handshake and then no call after the idle
/// timeout: 5,000 of each on the gRPC port (the issue's case), 500 on the HTTP port
/// (the same code; fewer, so the other tests of this binary keep their machine):
/// each closed by then (and not before), counted by reason, none left open.
#[tokio::test(flavor = "multi_thread")]
async fn silent_and_idle_connections_are_closed_after_their_timeouts() {
    const HANDSHAKE: Duration = Duration::from_secs(3);
    const IDLE: Duration = Duration::from_secs(4);
    /// Generous: thousands of connections on a loaded machine.
    const SLACK: Duration = Duration::from_secs(20);
    let grpc_n = how_many();
    let http_n = grpc_n / 10;
    let served = tokio::task::spawn_blocking(|| {
        serve(&[
            "--handshake-timeout-ms",
            "3000",
            "--idle-timeout-ms",
            "4000",
        ])
    })
    .await
    .expect("serve");
    for (port, n) in [(served.grpc, grpc_n), (served.http, http_n)] {
        let mut silents = Vec::with_capacity(n);
        let mut idles = Vec::with_capacity(n);
        for _ in 0..n {
            silents.push(silent(port, HANDSHAKE + SLACK).await);
            idles.push(idle(port, IDLE + SLACK).await);
        }
        let rss = status_kib(served.server.child.id(), "VmRSS:");
        eprintln!("port {port}: {n} silent and {n} idle HTTP/2 connections opened, RSS {rss} KiB");
        for (what, waits, bound) in [("silent", silents, HANDSHAKE), ("idle", idles, IDLE)] {
            let mut closed = Vec::with_capacity(n);
            for wait in waits {
                closed.push(wait.await.expect("a connection's wait"));
            }
            let open = closed.iter().filter(|c| c.is_none()).count();
            assert_eq!(
                open, 0,
                "port {port}: {open} of {n} {what} connections never closed"
            );
            let first = closed.iter().flatten().min().copied().unwrap_or_default();
            let last = closed.iter().flatten().max().copied().unwrap_or_default();
            eprintln!("port {port}: {what} connections closed {first:?} to {last:?} after opening");
            // (The server's clock starts at its accept, a moment before the client's
            // connect returns here.)
            let early = bound - Duration::from_millis(100);
            assert!(
                first >= early,
                "port {port}: a {what} connection closed after {first:?}"
            );
        }
    }
    tokio::task::spawn_blocking(move || {
        // The client sees a connection closed as the server closes it; the server
        // counts it right after. Awaited, not read once: on a loaded machine the last
        // few counts can trail the last close the client saw.
        let expected = |text: &str| {
            let open = r#"tollgate_connections_open{port="grpc"}"#;
            let all_counted = [("grpc", grpc_n), ("http", http_n)]
                .iter()
                .all(|&(port, n)| {
                    ["handshake_timeout", "idle_timeout"]
                        .iter()
                        .all(|reason| closes(text, port, reason) >= n as f64)
                });
            all_counted && common::prometheus::value(text, open) == 0.0
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut text = get(served.http, "/metrics");
        while !expected(&text) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            text = get(served.http, "/metrics");
        }
        for (port, n) in [("grpc", grpc_n), ("http", http_n)] {
            for reason in ["handshake_timeout", "idle_timeout"] {
                let counted = closes(&text, port, reason);
                assert_eq!(counted, n as f64, "{port} port, {reason}");
            }
        }
        let open = common::prometheus::value(&text, r#"tollgate_connections_open{port="grpc"}"#);
        assert_eq!(open, 0.0, "every gRPC connection closed");
    })
    .await
    .expect("metrics");
}

/// `tollgate_connections_closed_total` of `port` for `reason`, in `metrics`.
fn closes(metrics: &str, port: &str, reason: &str) -> f64 {
    let series = format!(r#"tollgate_connections_closed_total{{port="{port}",reason="{reason}"}}"#);
    common::prometheus::value(metrics, &series)
}

/// Out of file descriptors (serve run with a limit of 64): the accepts that fail
/// pause the port instead of spinning (the process stays nearly idle), are counted
/// and logged at most once a second, and the port accepts again once descriptors are
/// free.
#[test]
fn failed_accepts_pause_the_port_and_are_counted_and_logged() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("conn.yaml"), CONFIG).expect("the config");
    let (grpc, http) = common::process::free_ports();
    let mut command = Command::new("prlimit");
    command
        .env_clear()
        .arg("--nofile=64:64")
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--no-watch", "--drain-seconds", "0", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        // The connections below stay open, silent, for the whole test.
        .args(["--handshake-timeout-ms", "60000"]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    let served = Served {
        server,
        _dir: dir,
        grpc,
        http,
    };
    let pid = served.server.child.id();
    // More than the process may hold: its accepts fail with EMFILE past the limit.
    let held: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", grpc)).expect("connect (the backlog takes it)"))
        .collect();
    let at_limit = Instant::now();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - before;
    // A spinning accept loop takes a whole core: 300 ticks in 3 s.
    assert!(
        used < 60,
        "{used} ticks of CPU in 3 s at the descriptor limit"
    );
    drop(held);
    // Descriptors free again: the port accepts within its pause (at most 1 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers(&served) {
        assert!(Instant::now() < deadline, "the port never accepted again");
    }
    let failures = metric(&served, r#"tollgate_accept_errors_total{port="grpc"}"#);
    eprintln!("at the limit: {used} ticks in 3 s, {failures} accept errors");
    assert!(failures >= 1.0, "accept errors counted: {failures}");
    let seconds = at_limit.elapsed().as_secs() + 1;
    let Served { server, .. } = served;
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    let lines = log.matches("accept_failed").count() as u64;
    assert!(
        (1..=seconds + 1).contains(&lines),
        "{lines} accept_failed lines in about {seconds} s ({failures} failures):\n{log}"
    );
}

/// A client that made its handshake but answers no PING (a peer gone without a FIN:
/// a crashed host, a dropped route) is closed after the keepalive interval and timeout,
/// long before the idle timeout.
#[test]
fn an_unanswered_ping_closes_the_connection() {
    let served = serve(&[
        "--keepalive-interval-ms",
        "500",
        "--keepalive-timeout-ms",
        "500",
        "--idle-timeout-ms",
        "600000",
    ]);
    let began = Instant::now();
    // The preface and SETTINGS, then silence: raw frames, so nothing answers the PING.
    let quiet = raw::Flood::open(served.grpc, 0);
    let answered = quiet.answered_within(Duration::from_secs(20));
    let took = began.elapsed();
    assert!(
        answered.closed && took < Duration::from_secs(15),
        "still open after {took:?}: {answered:?}"
    );
    assert!(took >= Duration::from_millis(500), "closed after {took:?}");
    eprintln!("an unanswered PING: closed after {took:?}");
}
