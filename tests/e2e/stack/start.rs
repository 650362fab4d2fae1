//! Starting the stack's processes on free loopback ports, each waited for by a
//! bounded condition: the upstream answers HTTP, a replica answers a gRPC call, Envoy's
//! admin says `/ready`. A port can be taken between choosing it and the bind; a
//! process that exits saying "Address already in use" is restarted on fresh ports.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::guard::{Guarded, PidRecord};
use super::http;
use super::loopback::{self, Addresses};
use crate::common::envoy::REDIS_TIMEOUT_MS;
use crate::common::process::{Server, root, tollgate};

/// Bound for one process to become ready; generous for a busy 2-core CI.
const READY_DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
/// Starts on fresh ports after a lost race for a port.
const ATTEMPTS: usize = 4;
const IN_USE: &str = "in use";

/// `count` distinct free loopback ports ([`crate::common::ports`]).
pub fn free_ports(count: usize) -> Vec<u16> {
    crate::common::ports::free_ports(count, false)
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The Python for the upstream: `$TOLLGATE_PYTHON`, else `python3` (stdlib only).
fn python() -> PathBuf {
    std::env::var_os("TOLLGATE_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

enum Wait {
    Ready,
    /// Exited because its port was taken: try again elsewhere.
    PortTaken,
}

/// Polls `GET path` on `addr` until 200 while `process` runs.
fn wait_http(process: &mut Guarded, addr: SocketAddr, path: &str) -> Wait {
    let deadline = Instant::now() + READY_DEADLINE;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        if process.exited().is_some() {
            if process.log_contains(IN_USE) {
                return Wait::PortTaken;
            }
            process.assert_running();
        }
        match http::probe(addr, path) {
            Ok(response) if response.status == 200 => return Wait::Ready,
            Ok(response) => last = format!("{} {}", response.status, response.body.trim()),
            Err(error) => last = error,
        }
        std::thread::sleep(POLL);
    }
    panic!(
        "no 200 from GET {path} on {addr} within {READY_DEADLINE:?}: {last}\n{}",
        process.log_tail(40)
    );
}

/// `deploy/upstream/echo.py` on a free port.
pub fn upstream(dir: &Path) -> (Guarded, u16) {
    python_upstream(dir, &root().join("deploy/upstream/echo.py"))
}

/// The Python upstream `script` (it takes `--host` and `--port`, and answers `GET
/// /ready-probe`) on a free port.
pub fn python_upstream(dir: &Path, script: &Path) -> (Guarded, u16) {
    for _ in 0..ATTEMPTS {
        let port = free_ports(1)[0];
        let mut command = Command::new(python());
        command
            .arg(script)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        let mut process = Guarded::spawn("upstream", dir, &script.to_string_lossy(), command);
        if let Wait::Ready = wait_http(&mut process, loopback(port), "/ready-probe") {
            return (process, port);
        }
    }
    panic!("the upstream lost the race for a free port {ATTEMPTS} times");
}

/// One `tollgate serve` replica; the record lets the watchdog kill it.
pub struct Replica {
    pub server: Server,
    pub grpc: u16,
    _record: PidRecord,
}

/// A replica on free ports with the repository's `config/`, the Redis Cluster
/// `nodes`, the key `prefix` and the `extra` arguments, answering gRPC.
pub fn replica(nodes: &str, prefix: &str, extra: &[&str]) -> Replica {
    replica_on(&root().join("config"), nodes, prefix, extra)
}

/// [`replica`] on the limits in `config` (a file or directory).
pub fn replica_on(config: &Path, nodes: &str, prefix: &str, extra: &[&str]) -> Replica {
    for _ in 0..ATTEMPTS {
        let ports = free_ports(2);
        let (grpc, http) = (ports[0], ports[1]);
        let mut command = tollgate();
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--redis-cluster", nodes])
            .args(["--key-prefix", prefix])
            .args(["--redis-timeout-ms", &REDIS_TIMEOUT_MS.to_string()])
            .args(extra);
        let mut server = Server::spawn(command);
        let record = PidRecord::new(server.child.id(), env!("CARGO_BIN_EXE_tollgate"));
        // Both ports bound (or an exit) before the gRPC readiness call.
        let deadline = Instant::now() + READY_DEADLINE;
        let mut exited = false;
        while Instant::now() < deadline {
            if server.child.try_wait().expect("try_wait").is_some() {
                exited = true;
                break;
            }
            let listening = |port| TcpStream::connect(loopback(port)).is_ok();
            if listening(grpc) && listening(http) {
                break;
            }
            std::thread::sleep(POLL);
        }
        if exited && server.log().contains(IN_USE) {
            continue;
        }
        server.wait_until_serving(grpc);
        return Replica {
            server,
            grpc,
            _record: record,
        };
    }
    panic!("a tollgate replica lost the race for free ports {ATTEMPTS} times");
}

/// Envoy on `deploy/envoy/envoy.yaml`, rewritten for loopback ([`loopback::render`]), ready.
pub fn envoy(binary: &Path, dir: &Path, upstream: u16, replicas: Vec<u16>) -> (Guarded, Addresses) {
    let addresses = |admin, listener| Addresses {
        admin,
        listener,
        replicas: replicas.clone(),
        upstream,
    };
    let render = |admin, listener| loopback::render(&addresses(admin, listener));
    let (mut envoy, admin, listener) = envoy_on(binary, dir, "envoy", "info", render);
    wait_replicas_healthy(&mut envoy, loopback(admin), &replicas);
    (envoy, addresses(admin, listener))
}

/// Envoy named `name` on the config `render(admin port, listener port)` gives, on
/// free ports, ready; with those ports.
pub fn envoy_on(
    binary: &Path,
    dir: &Path,
    name: &str,
    log_level: &str,
    render: impl Fn(u16, u16) -> String,
) -> (Guarded, u16, u16) {
    for _ in 0..ATTEMPTS {
        let ports = free_ports(2);
        let (admin, listener) = (ports[0], ports[1]);
        let config = dir.join(format!("{name}.json"));
        std::fs::write(&config, render(admin, listener)).expect("write the Envoy config");
        let mut command = Command::new(binary);
        command
            .arg("-c")
            .arg(&config)
            // Several Envoys run at once: no shared memory for hot restart.
            .args(["--disable-hot-restart", "--concurrency", "2"])
            .args(["--log-level", log_level]);
        let mut envoy = Guarded::spawn(name, dir, &binary.to_string_lossy(), command);
        if let Wait::Ready = wait_http(&mut envoy, loopback(admin), "/ready") {
            return (envoy, admin, listener);
        }
    }
    panic!("Envoy lost the race for free ports {ATTEMPTS} times");
}

/// Waits until Envoy's active health check has passed every replica. `/ready` comes
/// once the first round ended, passed or not: a replica whose first check timed out
/// on a busy machine stays out of the round robin until a later round passes it (2 s
/// on), and a test sending at once saw every call go to the other replica (CI:
/// "both replicas answer: [20, 0]").
fn wait_replicas_healthy(envoy: &mut Guarded, admin: SocketAddr, replicas: &[u16]) {
    let deadline = Instant::now() + READY_DEADLINE;
    let healthy = |port: u16| format!("tollgate::127.0.0.1:{port}::health_flags::healthy");
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        envoy.assert_running();
        if let Ok(response) = http::probe(admin, "/clusters") {
            let lines: Vec<&str> = response.body.lines().collect();
            if replicas
                .iter()
                .all(|&p| lines.contains(&healthy(p).as_str()))
            {
                return;
            }
            last = response
                .body
                .lines()
                .filter(|l| l.contains("health_flags"))
                .collect::<Vec<_>>()
                .join("\n");
        }
        std::thread::sleep(POLL);
    }
    panic!("Envoy never saw every replica healthy within {READY_DEADLINE:?}:\n{last}");
}
