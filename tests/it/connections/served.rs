//! `tollgate serve` for the connection tests: the real binary on the memory store,
//! its memory and CPU from /proc, its metrics and one call through `tollgate check`.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{Server, serve_config, wait_for_exit};

pub const CONFIG: &str = "domain: conn\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1000000}\n";
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The shutdown's wait for calls in flight (`server::conn::FINISH_WITHIN`).
pub const FINISH_WITHIN: Duration = tollgate::server::conn::FINISH_WITHIN;

pub struct Served {
    pub server: Server,
    /// Kept for the server's life: its config is there.
    pub _dir: tempfile::TempDir,
    pub grpc: u16,
    pub http: u16,
}

/// `serve` on the memory store with `args` (no drain), answering.
pub fn serve(args: &[&str]) -> Served {
    let (server, dir, grpc, http) = serve_config("conn.yaml", CONFIG, args, &[]);
    Served {
        server,
        _dir: dir,
        grpc,
        http,
    }
}

/// `serve` on the memory store with a drain of `drain` seconds, answering.
pub fn serve_draining(drain: &str) -> Served {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("conn.yaml"), CONFIG).expect("the config");
    let (grpc, http) = common::process::free_ports();
    let mut command = common::process::tollgate();
    command
        .args(["serve", "--no-watch", "--drain-seconds", drain, "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    Served {
        server,
        _dir: dir,
        grpc,
        http,
    }
}

/// A field of /proc/<pid>/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// `GET path` on `port` (HTTP/1.0, one connection); the body.
pub fn get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

pub fn metric(served: &Served, series: &str) -> f64 {
    common::prometheus::value(&get(served.http, "/metrics"), series)
}

/// One ShouldRateLimit answered on a fresh connection.
pub fn answers(served: &Served) -> bool {
    let out = common::process::run(
        common::process::tollgate()
            .args(["check", "--addr", &format!("127.0.0.1:{}", served.grpc)])
            .args([
                "--domain",
                "conn",
                "--descriptor",
                "k=v",
                "--timeout-ms",
                "5000",
            ]),
    );
    out.status.success()
}

/// SIGTERM; how long until the process exited.
pub fn stop(mut server: Server) -> (Duration, String) {
    let pid = server.child.id().to_string();
    let began = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(kill.expect("kill").success());
    let exited = wait_for_exit(&mut server.child, Duration::from_secs(30));
    let took = began.elapsed();
    assert!(
        exited.is_some(),
        "no exit within 30 s of SIGTERM:\n{}",
        server.log()
    );
    (took, server.log())
}

/// CPU time the process has used, in clock ticks (utime + stime of /proc/<pid>/stat).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The fields after the command's closing parenthesis; utime and stime are the
    // 12th and 13th of them.
    let rest = stat.rsplit_once(')').expect("a stat line").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}
