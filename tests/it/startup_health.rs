//! `tollgate serve` at start-up and after reloads, health as envoyproxy/ratelimit
//! reports it: a config that does not validate (or, with
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true`, a directory without domains) keeps
//! the process up and NOT_SERVING until a valid set loads; a reload to a set without
//! domains turns it NOT_SERVING under that variable; ignored settings are named at
//! WARN even at `LOG_LEVEL=warn`. The real binary, real ports; every wait is bounded.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::{DEADLINE, Server, check, free_ports, row, tollgate};

const LIMITED: &str = "domain: boot\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n";

fn serve(dir: &Path, env: &[(&str, &str)]) -> (Server, u16, u16) {
    let (grpc, http) = free_ports();
    let mut command: Command = tollgate();
    command
        .args(["serve", "--config"])
        .arg(dir)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .env("LOG_FORMAT", "json");
    for (name, value) in env {
        command.env(name, value);
    }
    (Server::spawn(command), grpc, http)
}

/// `GET /healthcheck`'s status code, or `None` while the port does not answer.
fn healthcheck(http: u16) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", http)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = "GET /healthcheck HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.split(' ').nth(1)?.parse().ok()
}

/// Waits (bounded) until `/healthcheck` answers `code`, failing early if serve exits.
fn wait_for_health(server: &mut Server, http: u16, code: u16) {
    let deadline = Instant::now() + DEADLINE;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("serve exited with {status}:\n{}", server.log());
        }
        last = healthcheck(http);
        if last == Some(code) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "/healthcheck never answered {code} (last {last:?}):\n{}",
        server.log()
    );
}

#[test]
fn a_broken_start_up_config_serves_not_serving_until_it_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("boot.yaml");
    fs::write(&file, "domain: boot\nbogus: 1\n").unwrap();
    let (mut server, grpc, http) = serve(dir.path(), &[]);
    wait_for_health(&mut server, http, 500);
    assert!(
        server.log().contains("config_invalid_at_start"),
        "{}",
        server.log()
    );

    fs::write(&file, LIMITED).unwrap();
    wait_for_health(&mut server, http, 200);
    let first = check(&server, grpc, "boot", "k=v");
    assert_eq!(row(&first, "k=v")[1], "OK", "{first}");
    let second = check(&server, grpc, "boot", "k=v");
    assert_eq!(
        row(&second, "k=v")[1],
        "OVER_LIMIT",
        "the fixed set's limit counts: {second}"
    );
    assert!(server.terminate().success());
}

#[test]
fn an_empty_directory_is_not_serving_with_healthy_with_at_least_one_config_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")];
    let (mut server, grpc, http) = serve(dir.path(), &env);
    wait_for_health(&mut server, http, 500);

    fs::write(dir.path().join("boot.yaml"), LIMITED).unwrap();
    wait_for_health(&mut server, http, 200);
    check(&server, grpc, "boot", "k=v");
    let over = check(&server, grpc, "boot", "k=v");
    assert_eq!(row(&over, "k=v")[1], "OVER_LIMIT", "{over}");

    // A reload to a set without domains: upstream goes NOT_SERVING, and so do we.
    fs::remove_file(dir.path().join("boot.yaml")).unwrap();
    wait_for_health(&mut server, http, 500);
}

#[test]
fn an_empty_directory_serves_no_limits_by_default_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("boot.yaml"), LIMITED).unwrap();
    let (mut server, grpc, http) = serve(dir.path(), &[]);
    wait_for_health(&mut server, http, 200);
    check(&server, grpc, "boot", "k=v");

    fs::remove_file(dir.path().join("boot.yaml")).unwrap();
    // The empty set is swapped in (no limits) and health stays SERVING.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let table = check(&server, grpc, "boot", "k=v");
        if row(&table, "k=v")[1] == "OK" {
            assert!(!table.contains("1/hour"), "no limit is left: {table}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the empty set never loaded:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(healthcheck(http), Some(200), "{}", server.log());
}

#[test]
fn ignored_settings_are_named_at_warn() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("boot.yaml"), LIMITED).unwrap();
    let env = [
        ("LOG_LEVEL", "warn"),
        ("USE_STATSD", "true"),
        ("REDIS_PERSECOND", "true"),
    ];
    let (mut server, _, http) = serve(dir.path(), &env);
    wait_for_health(&mut server, http, 200);
    let log = server.log();
    for name in ["USE_STATSD", "REDIS_PERSECOND"] {
        assert!(log.contains(&format!("{name} is set but ignored")), "{log}");
    }
}
