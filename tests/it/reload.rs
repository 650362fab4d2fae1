//! Hot reload: a watched config directory is reloaded after plain edits, new and
//! deleted files, a Kubernetes ConfigMap `..data` symlink swap and a swap of the
//! `RUNTIME_ROOT` symlink; a broken set keeps the old one serving and shows in the
//! reload state; counters of unchanged rules survive a reload; `tollgate serve`
//! reloads on SIGHUP. Every wait polls a condition with a bounded deadline.

use crate::common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{Server, check, free_ports, row, tollgate};
use common::server::{descriptor, request};
use tollgate::background::Background;
use tollgate::config::watch::WatchOptions;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::server::reload::{self, ReloadStatus, Reloader, Trigger};
use tollgate::store::memory::MemoryStore;

const DEADLINE: Duration = Duration::from_secs(15);

fn domain_yaml(domain: &str, key: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

/// A limiter serving the set at `path`, reloaded by a watcher on it.
struct Fixture {
    limiter: Arc<Limiter>,
    reloader: Arc<Reloader>,
    _watch: Background,
}

fn watch(path: &Path, anchors: Vec<PathBuf>) -> Fixture {
    let loaded = reload::load_set(path).expect("initial set loads");
    let store = Arc::new(MemoryStore::new());
    let limiter = Arc::new(Limiter::new(
        loaded.config,
        store,
        LimiterOptions::default(),
    ));
    let status = Arc::new(ReloadStatus::new(Some(loaded.hash)));
    let reloader = Arc::new(Reloader::new(limiter.clone(), path.to_path_buf(), status));
    let mut options = WatchOptions::new(path.to_path_buf());
    options.anchors = anchors;
    let watch = reload::spawn_watch(reloader.clone(), options);
    Fixture {
        limiter,
        reloader,
        _watch: watch,
    }
}

/// The limit (requests per unit) a one-entry request meets, `None` without a limit.
async fn limit_of(limiter: &Limiter, domain: &str, key: &str) -> Option<u32> {
    let response = limiter
        .should_rate_limit(&request(domain, vec![descriptor(&[(key, "probe")])]))
        .await
        .expect("decision");
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// Polls `limit_of` until it is `want`.
async fn until_limit(fixture: &Fixture, domain: &str, key: &str, want: Option<u32>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = limit_of(&fixture.limiter, domain, key).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{domain}/{key}: limit {got:?}, want {want:?} within {DEADLINE:?}; reload state {:?}",
            fixture.reloader.status().snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_edited_file_is_served() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 1)).unwrap();
    let fixture = watch(dir.path(), vec![]);
    assert_eq!(limit_of(&fixture.limiter, "a", "k").await, Some(1));
    let hash = fixture.reloader.status().snapshot().hash;

    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 7)).unwrap();
    until_limit(&fixture, "a", "k", Some(7)).await;
    let state = fixture.reloader.status().snapshot();
    assert_eq!(state.generation, 2);
    assert_eq!(state.successes, 1);
    assert_ne!(state.hash, hash);
    assert_eq!(state.failures, 0);
}

/// Kubernetes' atomic writer: files in a timestamped directory, `..data` pointing at
/// it, and the visible names pointing through `..data`.
fn configmap_version(root: &Path, version: &str, limit: u32) {
    let dir = root.join(version);
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("x.yaml"), domain_yaml("x", "k", limit)).unwrap();
}

fn configmap_swap(root: &Path, version: &str) {
    let tmp = root.join("..data_tmp");
    symlink(version, &tmp).unwrap();
    fs::rename(&tmp, root.join("..data")).unwrap();
}

#[tokio::test]
async fn a_single_config_file_saved_by_rename_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("only.yaml");
    fs::write(&file, domain_yaml("f", "k", 1)).unwrap();
    let fixture = watch(&file, vec![]);
    // Editors write a new file and rename it over the old one: a watch on the file's
    // inode would die here; the directory watch does not.
    for limit in [2, 3] {
        let tmp = dir.path().join(".only.yaml.swp");
        fs::write(&tmp, domain_yaml("f", "k", limit)).unwrap();
        fs::rename(&tmp, &file).unwrap();
        until_limit(&fixture, "f", "k", Some(limit)).await;
    }
}

#[tokio::test]
async fn a_configmap_data_symlink_swap_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("config");
    fs::create_dir(&root).unwrap();
    configmap_version(&root, "..2026_a", 1);
    symlink("..2026_a", root.join("..data")).unwrap();
    symlink("..data/x.yaml", root.join("x.yaml")).unwrap();
    let fixture = watch(&root, vec![]);
    assert_eq!(limit_of(&fixture.limiter, "x", "k").await, Some(1));

    // Twice: a watch on the file (or on the first target) would miss the second.
    for (old, new, limit) in [("..2026_a", "..2026_b", 2), ("..2026_b", "..2026_c", 3)] {
        configmap_version(&root, new, limit);
        configmap_swap(&root, new);
        fs::remove_dir_all(root.join(old)).unwrap();
        until_limit(&fixture, "x", "k", Some(limit)).await;
    }
    assert_eq!(fixture.reloader.status().snapshot().failures, 0);
}

#[tokio::test]
async fn a_runtime_root_symlink_swap_is_served_and_then_watched() {
    let tmp = tempfile::tempdir().unwrap();
    for (version, limit) in [("v1", 1), ("v2", 2)] {
        let config = tmp.path().join(version).join("ratelimit/config");
        fs::create_dir_all(&config).unwrap();
        fs::write(config.join("r.yaml"), domain_yaml("r", "k", limit)).unwrap();
    }
    let current = tmp.path().join("current");
    symlink("v1", &current).unwrap();
    let config = current.join("ratelimit/config");
    // RUNTIME_ROOT=<tmp>/current with RUNTIME_WATCH_ROOT=true.
    let fixture = watch(&config, vec![current.clone()]);
    assert_eq!(limit_of(&fixture.limiter, "r", "k").await, Some(1));

    let next = tmp.path().join("current.tmp");
    symlink("v2", &next).unwrap();
    fs::rename(&next, &current).unwrap();
    until_limit(&fixture, "r", "k", Some(2)).await;

    // The watch followed the swap: an edit in the new target is seen too.
    fs::write(config.join("r.yaml"), domain_yaml("r", "k", 9)).unwrap();
    until_limit(&fixture, "r", "k", Some(9)).await;
}

#[tokio::test]
async fn a_broken_set_keeps_the_old_one_serving_and_shows_in_the_state() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 3)).unwrap();
    fs::write(dir.path().join("b.yaml"), domain_yaml("b", "k", 4)).unwrap();
    let fixture = watch(dir.path(), vec![]);

    // Two mistakes in two files: both are reported, neither file is taken.
    fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("b.yaml"),
        domain_yaml("b", "k", 40) + "oops: 1\n",
    )
    .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let state = loop {
        let state = fixture.reloader.status().snapshot();
        let errors = state.last_error.as_ref().map_or(0, Vec::len);
        if state.failures >= 1 && errors == 2 {
            break state;
        }
        assert!(
            Instant::now() < deadline,
            "no failed reload with both errors: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let errors = state.last_error.clone().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("a.yaml:4") && e.contains("fortnight")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("b.yaml:5") && e.contains("oops")),
        "{errors:?}"
    );
    assert_eq!(state.generation, 1);
    assert!(state.last_failure.is_some());
    assert_eq!(limit_of(&fixture.limiter, "a", "k").await, Some(3));
    assert_eq!(limit_of(&fixture.limiter, "b", "k").await, Some(4));

    // Fixed: served, and the success is newer than the failure.
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 5)).unwrap();
    fs::write(dir.path().join("b.yaml"), domain_yaml("b", "k", 6)).unwrap();
    until_limit(&fixture, "b", "k", Some(6)).await;
    until_limit(&fixture, "a", "k", Some(5)).await;
    let state = fixture.reloader.status().snapshot();
    assert!(state.last_success > state.last_failure, "{state:?}");
}

#[tokio::test]
async fn new_files_add_domains_and_deleted_files_remove_them() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 1)).unwrap();
    let fixture = watch(dir.path(), vec![]);
    assert_eq!(limit_of(&fixture.limiter, "b", "k").await, None);

    // In a new subdirectory, even: the watch is recursive.
    fs::create_dir(dir.path().join("team")).unwrap();
    fs::write(dir.path().join("team/b.yml"), domain_yaml("b", "k", 2)).unwrap();
    until_limit(&fixture, "b", "k", Some(2)).await;

    fs::remove_file(dir.path().join("team/b.yml")).unwrap();
    until_limit(&fixture, "b", "k", None).await;
    assert!(fixture.limiter.config().domain("b").is_none());
    assert_eq!(limit_of(&fixture.limiter, "a", "k").await, Some(1));
}

#[tokio::test]
async fn counters_of_unchanged_rules_survive_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 3)).unwrap();
    fs::write(dir.path().join("b.yaml"), domain_yaml("b", "k", 3)).unwrap();
    let fixture = watch(dir.path(), vec![]);
    let hit = |domain: &'static str| {
        let limiter = fixture.limiter.clone();
        async move {
            let r = limiter
                .should_rate_limit(&request(domain, vec![descriptor(&[("k", "v")])]))
                .await
                .expect("decision");
            (
                Code::try_from(r.overall_code).unwrap(),
                r.statuses[0].limit_remaining,
            )
        }
    };
    assert_eq!(hit("a").await, (Code::Ok, 2));
    assert_eq!(hit("a").await, (Code::Ok, 1));
    assert_eq!(hit("b").await, (Code::Ok, 2));

    // a.yaml changes (a new rule beside the unchanged one), b.yaml does not.
    fs::write(
        dir.path().join("a.yaml"),
        domain_yaml("a", "k", 3)
            + "  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .unwrap();
    until_limit(&fixture, "a", "other", Some(1)).await;
    assert_eq!(fixture.reloader.status().snapshot().generation, 2);

    assert_eq!(hit("a").await, (Code::Ok, 0), "a/k kept its count of 2");
    assert_eq!(hit("a").await, (Code::OverLimit, 0));
    assert_eq!(hit("b").await, (Code::Ok, 1), "b/k kept its count of 1");
}

#[tokio::test]
async fn an_unchanged_set_is_not_swapped() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), domain_yaml("a", "k", 1)).unwrap();
    let fixture = watch(dir.path(), vec![]);
    let outcome = fixture.reloader.reload(Trigger::Manual).await.unwrap();
    assert_eq!(outcome, reload::ReloadOutcome::Unchanged);
    // A file the loader ignores changes nothing either.
    fs::write(dir.path().join("README.txt"), "notes").unwrap();
    let outcome = fixture.reloader.reload(Trigger::Manual).await.unwrap();
    assert_eq!(outcome, reload::ReloadOutcome::Unchanged);
    assert_eq!(fixture.reloader.status().snapshot().generation, 1);
}

/// GET over a fresh HTTP/1.1 connection; the body.
pub(crate) fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect HTTP");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

#[test]
fn serve_reloads_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h.yaml");
    fs::write(&file, domain_yaml("h", "k", 1)).unwrap();
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .arg("--config")
        .arg(dir.path())
        // No watcher: only the signal can make this reload.
        .arg("--no-watch")
        .args(["--drain-seconds", "0"])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    assert_eq!(row(&check(&server, grpc, "h", "k=v"), "k=v")[2], "1/hour");

    fs::write(&file, domain_yaml("h", "k", 5)).unwrap();
    let pid = server.child.id().to_string();
    let kill = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    assert!(kill.expect("run kill").success());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let table = check(&server, grpc, "h", "k=w");
        if row(&table, "k=w")[2] == "5/hour" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload:\n{table}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let json: serde_json::Value = serde_json::from_str(&http_get(http, "/config.json")).unwrap();
    assert_eq!(json["generation"], 2, "{json}");
    let (status, log) = server.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("config_reloaded"), "{log}");
}
