//! The compose healthcheck, run for real: the `bash -c` script of
//! `docker-compose.yml`'s tollgate replicas, aimed at a `tollgate serve` child on free
//! ports, passes while it is SERVING and fails once it is NOT_SERVING (draining after
//! SIGTERM, while the HTTP port still answers 500), which a `check` on an unknown
//! domain would not notice.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{compose, http_port, service, strings};
use crate::common::process::{DEADLINE, Server, free_ports, tollgate, wait_for_exit};

/// The script the replica's healthcheck gives `bash -c`.
pub(super) fn healthcheck_script(replica: &Value) -> String {
    let test = strings(&replica["healthcheck"]["test"]);
    assert_eq!(test[..3], ["CMD", "bash", "-c"], "{test:?}");
    assert_eq!(test.len(), 4, "{test:?}");
    test[3].to_owned()
}

/// Runs the script with the default HTTP port replaced by `port`; true on exit 0.
fn probe(script: &str, port: u16) -> bool {
    let script = script.replace(
        &format!("/dev/tcp/127.0.0.1/{}", http_port()),
        &format!("/dev/tcp/127.0.0.1/{port}"),
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("run bash");
    out.status.success()
}

/// The status code of `GET /healthcheck`.
fn healthcheck_status(port: u16) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(b"GET /healthcheck HTTP/1.0\r\n\r\n")
        .expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {raw}"))
}

#[test]
fn compose_healthcheck_follows_readiness() {
    let script = healthcheck_script(service(&compose(), "tollgate-1"));
    let (grpc, http) = free_ports();
    assert!(!probe(&script, http), "healthy with nothing listening");

    let mut command = tollgate();
    command.args(["serve", "--config", "config/", "--drain-seconds", "20"]);
    command.args(["--grpc-addr", &format!("127.0.0.1:{grpc}")]);
    command.args(["--http-addr", &format!("127.0.0.1:{http}")]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    assert!(
        probe(&script, http),
        "unhealthy while SERVING:\n{}",
        server.log()
    );

    // SIGTERM: NOT_SERVING at once, both ports answering through the drain.
    let pid = server.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(kill.expect("run kill").success());
    let deadline = Instant::now() + DEADLINE;
    while healthcheck_status(http) != 500 {
        assert!(Instant::now() < deadline, "still 200:\n{}", server.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !probe(&script, http),
        "healthy while NOT_SERVING:\n{}",
        server.log()
    );
    assert_eq!(
        healthcheck_status(http),
        500,
        "the port answered throughout"
    );
    let _ = server.child.kill();
    wait_for_exit(&mut server.child, DEADLINE);
}
