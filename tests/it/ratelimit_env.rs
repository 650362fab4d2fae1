//! `tollgate serve` configured only with envoyproxy/ratelimit's environment variables,
//! the way an Istio-style Kubernetes deployment sets them (no flag at all): the config
//! is a ConfigMap mount under `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config`, counters are
//! in Redis, logs are JSON, variables tollgate does not act on are named at start-up,
//! a ConfigMap update is served, and SIGTERM ends it cleanly. A variable that cannot be
//! honoured (counters in memcached) stops the start with a message instead.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use common::process::{Server, check, free_ports, row, run, text, tollgate};

fn configmap(root: &Path, version: &str, limit: u32) {
    let dir = root.join(version);
    fs::create_dir(&dir).unwrap();
    let yaml = format!(
        "domain: mesh\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    );
    fs::write(dir.join("config.yaml"), yaml).unwrap();
    let tmp = root.join("..data_tmp");
    symlink(version, &tmp).unwrap();
    fs::rename(&tmp, root.join("..data")).unwrap();
}

#[test]
fn serve_runs_on_envoyproxy_ratelimit_variables_alone() {
    let redis = common::redis::standalone();
    let prefix = common::redis::unique_prefix("ratelimit_env");
    let data = tempfile::tempdir().unwrap();
    let mount = data.path().join("ratelimit/config");
    fs::create_dir_all(&mount).unwrap();
    configmap(&mount, "..2026_01", 2);
    symlink("..data/config.yaml", mount.join("config.yaml")).unwrap();

    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .env("USE_STATSD", "false")
        .env("LOG_LEVEL", "debug")
        .env("LOG_FORMAT", "json")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", redis.addr())
        .env("CACHE_KEY_PREFIX", &prefix)
        .env("RUNTIME_ROOT", data.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("RUNTIME_IGNOREDOTFILES", "true")
        .env("CONFIG_TYPE", "FILE")
        .env("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
        // envoyproxy/ratelimit's debug port: honoured (the config views move there);
        // port 0 so parallel tests never collide.
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string());
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);

    let codes: Vec<String> = (0..3)
        .map(|_| {
            row(
                &check(&server, grpc, "mesh", "remote_address=10.0.0.1"),
                "remote_address",
            )[1]
            .clone()
        })
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);

    let mut stream = std::net::TcpStream::connect(("127.0.0.1", http)).unwrap();
    stream
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200") && response.ends_with("OK"),
        "{response}"
    );

    // A ConfigMap update, as the kubelet makes it.
    configmap(&mount, "..2026_02", 5);
    fs::remove_dir_all(mount.join("..2026_01")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let table = check(&server, grpc, "mesh", "remote_address=10.0.0.2");
        if row(&table, "remote_address")[2] == "5/day" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "update not served:\n{table}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let log = server.log();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "LOG_FORMAT=json, yet: {line}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains("tollgate serving") && l.contains("\"debug\":\"127.0.0.1:")),
        "DEBUG_HOST/DEBUG_PORT bind the debug port:\n{log}"
    );
    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is read now (startup_health.rs).
    assert!(
        log.lines()
            .any(|l| l.contains("setting_ignored") && l.contains("USE_STATSD")),
        "USE_STATSD not reported as ignored:\n{log}"
    );
    assert!(log.contains("config_reloaded"), "{log}");
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn a_setting_that_cannot_be_honoured_stops_the_start() {
    let out = run(tollgate()
        .arg("serve")
        .env("MEMCACHE_HOST_PORT", "127.0.0.1:11211"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("MEMCACHE_HOST_PORT=127.0.0.1:11211"),
        "{stderr}"
    );
}

/// Every refused setting is named in the one start, a line each.
#[test]
fn every_refused_setting_is_named_at_once() {
    let out = run(tollgate()
        .arg("serve")
        .env("GRPC_UDS", "/run/rl.sock")
        .env("CONFIG_TYPE", "GRPC_XDS_DELTA")
        .env("SHADOW_MODE", "maybe"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "tollgate: GRPC_UDS=/run/rl.sock: gRPC on a Unix socket is not supported",
            "tollgate: SHADOW_MODE: 'maybe' is not a boolean",
            "tollgate: CONFIG_TYPE=GRPC_XDS_DELTA: expected FILE or GRPC_XDS_SOTW",
        ],
        "{stderr}"
    );
}
