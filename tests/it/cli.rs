//! The built `tollgate` binary: `validate` (summary on success, `file:line:` errors on
//! failure), `serve --exit-on-invalid-config` refusing a broken config before binding, `serve` + `check` +
//! SIGTERM (exit 0), and envoyproxy/ratelimit's environment variables (RUNTIME_ROOT,
//! RUNTIME_SUBDIRECTORY, GRPC_HOST/GRPC_PORT, HOST/PORT). Every wait is bounded.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;

use common::process::{
    DEADLINE, Server, check, free_ports, row, run, text, tollgate, wait_for_exit,
};

/// A directory with two broken files: an unknown unit at a.yaml:5, an unknown key at
/// b.yaml:2.
fn broken_dir() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    fs::write(
        &a,
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
    )
    .unwrap();
    fs::write(&b, "domain: b\nbogus: true\n").unwrap();
    (dir, a, b)
}

#[test]
fn validate_prints_the_domain_summary() {
    let out = run(tollgate().args(["validate", "config"]));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for expected in [
        "config: OK, 5 domain(s)",
        "domain 'endpoints'",
        "domain 'example'",
        "domain 'login'",
        "domain 'tenants'",
        "remote_address: 100/second",
        "remote_address_10.0.0.1: unlimited",
        "plan_premium: 1000/hour name=premium",
        "experiment: 10/minute shadow_mode",
    ] {
        assert!(
            stdout.contains(expected),
            "missing '{expected}' in:\n{stdout}"
        );
    }
}

#[test]
fn validate_lists_every_error_with_file_and_line() {
    let (dir, a, b) = broken_dir();
    let out = run(tollgate().arg("validate").arg(dir.path()));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "broken config validated:\n{stderr}");
    let a_line = format!("{}:5: ", a.display());
    let b_line = format!("{}:2: ", b.display());
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with(&a_line) && l.contains("fortnight")),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with(&b_line) && l.contains("bogus")),
        "{stderr}"
    );
    assert!(stderr.contains("2 error(s)"), "{stderr}");
}

#[test]
fn serve_exits_on_a_broken_config_before_binding_when_asked() {
    // Without --exit-on-invalid-config a broken set serves NOT_SERVING instead, as
    // envoyproxy/ratelimit does (startup_health.rs); this is the opt-in fail-fast path.
    let (dir, a, _) = broken_dir();
    // Both addresses are taken: had serve bound first, it would fail on them instead.
    let grpc = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut command = tollgate();
    command
        .args(["serve", "--exit-on-invalid-config", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &grpc.local_addr().unwrap().to_string()])
        .args(["--http-addr", &http.local_addr().unwrap().to_string()]);
    let mut server = Server::spawn(command);
    let status = wait_for_exit(&mut server.child, DEADLINE)
        .unwrap_or_else(|| panic!("serve kept running with a broken config:\n{}", server.log()));
    let log = server.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains(&format!("{}:5:", a.display())), "{log}");
    assert!(!log.contains("cannot bind"), "{log}");
}

#[test]
fn serve_answers_check_and_exits_cleanly_on_sigterm() {
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command.args([
        "serve",
        "--config",
        "tests/fixtures/interop",
        "--grpc-addr",
        &format!("127.0.0.1:{grpc}"),
        "--http-addr",
        &format!("127.0.0.1:{http}"),
    ]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);

    let table = check(&server, grpc, "interop", "client=x");
    let cells = row(&table, "client=x");
    assert_eq!(cells[1..4], ["OK", "3/day", "2"], "{table}");
    assert!(table.contains("overall: OK"), "{table}");
    let table = check(&server, grpc, "interop", "client=x");
    assert_eq!(row(&table, "client=x")[3], "1", "{table}");

    let log = server.log();
    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn serve_reads_envoyproxy_ratelimit_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("root/current/config");
    fs::create_dir_all(&config).unwrap();
    fs::write(
        config.join("x.yaml"),
        "domain: envtest\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
    )
    .unwrap();
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .current_dir(dir.path())
        .env("RUNTIME_ROOT", dir.path().join("root"))
        .env("RUNTIME_SUBDIRECTORY", "current")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string());
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);

    let table = check(&server, grpc, "envtest", "k=v");
    assert_eq!(row(&table, "k=v")[1..4], ["OK", "7/minute", "6"], "{table}");

    let mut stream = TcpStream::connect(("127.0.0.1", http)).expect("HTTP port from PORT");
    stream
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("\r\n\r\nOK"), "{response}");

    let log = server.log();
    assert_eq!(server.terminate().code(), Some(0), "{log}");
}
