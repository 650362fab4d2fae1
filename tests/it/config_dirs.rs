//! Config directories are input too, and bounded: symlink loops are refused naming the
//! link, in `validate`, at `serve` start-up (NOT_SERVING until fixed, as any invalid
//! set) and on reload (the old set keeps serving, the failure is recorded); a set over
//! the file-count bound is refused naming the bound. Real binary and real watcher;
//! every wait is bounded.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{DEADLINE, Server, check, free_ports, row, run, text, tollgate};
use common::server::{descriptor, request};
use tollgate::config::walk::MAX_FILES;
use tollgate::config::watch::WatchOptions;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::server::reload::{self, ReloadStatus, Reloader};
use tollgate::store::memory::MemoryStore;

const LIMITED: &str =
    "domain: dirs\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1}\n";

/// A config directory with a valid file, a `self -> .` link and a pair of directories
/// linking to each other: each alone once sent the walk round forever.
fn looping_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("dirs.yaml"), LIMITED).unwrap();
    symlink(".", dir.path().join("self")).unwrap();
    fs::create_dir(dir.path().join("a")).unwrap();
    fs::create_dir(dir.path().join("b")).unwrap();
    symlink("../b", dir.path().join("a/to_b")).unwrap();
    symlink("../a", dir.path().join("b/to_a")).unwrap();
    dir
}

#[test]
fn validate_refuses_symlink_loops_at_once_naming_the_link() {
    let dir = looping_dir();
    let began = Instant::now();
    let out = run(tollgate().arg("validate").arg(dir.path()));
    let took = began.elapsed();
    // The walk is bounded: it was minutes and a gigabyte before.
    assert!(took < Duration::from_secs(10), "validate took {took:?}");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("symlink loop"), "{stderr}");
    let named = [dir.path().join("a/to_b/to_a"), dir.path().join("self")];
    assert!(
        named
            .iter()
            .any(|p| stderr.contains(&p.display().to_string())),
        "the loop's link is named: {stderr}"
    );
}

#[test]
fn validate_refuses_more_files_than_the_bound_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..=MAX_FILES {
        fs::write(dir.path().join(format!("d{i:05}.yaml")), "").unwrap();
    }
    let out = run(tollgate().arg("validate").arg(dir.path()));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("more than {MAX_FILES} config files")),
        "{stderr}"
    );
    // The bound stops the walk: one error, not ten thousand empty-file complaints.
    assert!(stderr.contains(": 1 error(s)"), "{stderr}");
}

/// `GET path`'s status code and body, or `None` while the port does not answer.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let code = reply.split(' ').nth(1)?.parse().ok()?;
    Some((code, reply.split_once("\r\n\r\n")?.1.to_owned()))
}

#[test]
fn serve_with_a_looping_directory_binds_and_is_not_serving_until_fixed() {
    let dir = looping_dir();
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .args(["serve", "--drain-seconds", "0", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .env("LOG_FORMAT", "json");
    let mut server = Server::spawn(command);
    let until_health = |server: &mut Server, code: u16| {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("serve exited with {status}:\n{}", server.log());
            }
            if http_get(http, "/healthcheck").is_some_and(|(c, _)| c == code) {
                return;
            }
            assert!(Instant::now() < deadline, "never {code}:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    until_health(&mut server, 500);
    let log = server.log();
    assert!(log.contains("config_invalid_at_start"), "{log}");
    assert!(log.contains("symlink loop"), "{log}");

    // Fixed on disk: the watcher loads it and the limit counts.
    fs::remove_file(dir.path().join("self")).unwrap();
    fs::remove_file(dir.path().join("a/to_b")).unwrap();
    fs::remove_file(dir.path().join("b/to_a")).unwrap();
    until_health(&mut server, 200);
    check(&server, grpc, "dirs", "k=v");
    let over = check(&server, grpc, "dirs", "k=v");
    assert_eq!(row(&over, "k=v")[1], "OVER_LIMIT", "{over}");
    assert!(server.terminate().success());
}

#[tokio::test]
async fn a_loop_added_to_a_live_directory_fails_the_reload_and_the_old_set_serves() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("dirs.yaml"), LIMITED).unwrap();
    let loaded = reload::load_set(dir.path()).expect("initial set loads");
    let limiter = Arc::new(Limiter::new(
        loaded.config,
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    ));
    let status = Arc::new(ReloadStatus::new(Some(loaded.hash)));
    let reloader = Arc::new(Reloader::new(
        limiter.clone(),
        dir.path().to_path_buf(),
        status,
    ));
    let _watch = reload::spawn_watch(reloader.clone(), WatchOptions::new(dir.path().into()));

    symlink(".", dir.path().join("self")).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let state = loop {
        let state = reloader.status().snapshot();
        if state.failures >= 1 {
            break state;
        }
        assert!(Instant::now() < deadline, "no failed reload: {state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let errors = state.last_error.clone().unwrap();
    let link = dir.path().join("self").display().to_string();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("symlink loop") && e.contains(&link)),
        "{errors:?}"
    );
    assert_eq!(state.generation, 1, "{state:?}");
    // The old set still limits: its one request a year is taken, the next denied.
    let probe = || request("dirs", vec![descriptor(&[("k", "v")])]);
    let first = limiter.should_rate_limit(&probe()).await.unwrap();
    let second = limiter.should_rate_limit(&probe()).await.unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32, "{first:?}");
    assert_eq!(second.overall_code, Code::OverLimit as i32, "{second:?}");
}
