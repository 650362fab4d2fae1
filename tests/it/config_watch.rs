//! The watcher as `serve` runs it: what counts as a change to the config, and what
//! does not (a log written beside a config that does not exist yet).

use std::fs;
use std::time::{Duration, Instant};

use crate::common::process::{free_ports, tollgate};

const DEADLINE: Duration = Duration::from_secs(15);

fn domain_yaml(domain: &str, key: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

/// `serve` without a config, its log in the directory it watches for one (the
/// parent of the missing `config`): its own lines, and a line appended by hand, are
/// no change to the config (they reloaded it, and logged `config_reload_failed`,
/// once per burst); the config's creation is, and loads it.
#[test]
fn a_log_beside_a_missing_config_is_no_change_and_the_config_arriving_is() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("serve.log");
    let log = fs::File::create(&log_path).unwrap();
    let (grpc, http) = free_ports();
    let mut child = tollgate()
        .current_dir(dir.path())
        .arg("serve")
        .args(["--drain-seconds", "0"])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let read = || fs::read_to_string(&log_path).unwrap_or_default();
    let until = |what: &str, child: &mut std::process::Child| {
        let deadline = Instant::now() + DEADLINE;
        while !read().contains(what) {
            assert!(
                child.try_wait().unwrap().is_none(),
                "serve ended:\n{}",
                read()
            );
            assert!(Instant::now() < deadline, "no {what}:\n{}", read());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until("tollgate serving", &mut child);
    fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"a line of our own\n"))
        .unwrap();
    // Not a wait for a condition: what is tested is that nothing happens, and the
    // watcher reports a burst 200 ms after its last event; then the config arrives,
    // whose load (awaited) is processed after the log's events.
    std::thread::sleep(Duration::from_secs(1));
    fs::create_dir(dir.path().join("config")).unwrap();
    fs::write(dir.path().join("config/a.yaml"), domain_yaml("a", "k", 1)).unwrap();
    until("config_reloaded", &mut child);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let log = read();
    assert!(!log.contains("config_reload_failed"), "{log}");
    assert!(log.contains("config_invalid_at_start"), "{log}");
}
