//! What `tollgate serve` writes to stderr, read as an operator's log shipper reads it
//! (stderr to a file): plain text off a terminal, JSON fields that are values (lists
//! as arrays), per-request events rate-limited with their suppressed counts, the
//! `decision` debug event without library frames, and a recovered config reload.

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tollgate::proto::RateLimitServiceClient;

use crate::common::process::{DEADLINE, Server, serve_config, tollgate};
use crate::common::server::{descriptor, request};
use crate::reload::http_get;

const SHADOW: &str = "domain: logs\ndescriptors:\n  - key: user\n    shadow_mode: true\n    rate_limit: {name: trial, unit: year, requests_per_unit: 1}\n  - key: ip\n    rate_limit: {name: per_ip, unit: year, requests_per_unit: 1}\n";

/// `serve` with `config` and `env`; ready to answer.
fn serve(config: &str, env: &[(&str, &str)]) -> (Server, tempfile::TempDir, u16, u16) {
    serve_config("logs.yaml", config, &[], env)
}

/// `n` ShouldRateLimit calls for `key=value` on domain `logs`; their overall codes.
/// On a runtime of their own, dropped at the end: the connection closes with it, so
/// the server's shutdown does not wait for an idle client that no runtime drives.
fn calls(grpc: u16, key: &str, value: &str, n: usize) -> Vec<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(calls_on(grpc, key, value, n))
}

async fn calls_on(grpc: u16, key: &str, value: &str, n: usize) -> Vec<i32> {
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("connect");
    let mut codes = Vec::with_capacity(n);
    for _ in 0..n {
        let call = request("logs", vec![descriptor(&[(key, value)])]);
        let response = client.should_rate_limit(call).await.expect("answer");
        codes.push(response.into_inner().overall_code);
    }
    codes
}

/// Every whole line of a JSON log, parsed (a line that is not JSON fails the test).
/// A running server may be inside a line when the log is read: text after the last
/// newline is not a line yet.
fn json_lines(log: &str) -> Vec<Value> {
    let whole = log.rfind('\n').map_or("", |end| &log[..=end]);
    whole
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn events<'a>(lines: &'a [Value], event: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["event"] == event).collect()
}

#[test]
fn text_logs_into_a_file_carry_no_colour_unless_asked() {
    for (color, coloured) in [
        (None, false),
        (Some("never"), false),
        (Some("always"), true),
    ] {
        let mut env = vec![("LOG_LEVEL", "debug")];
        env.extend(color.map(|c| ("LOG_COLOR", c)));
        let (server, _dir, grpc, _) = serve(SHADOW, &env);
        calls(grpc, "ip", "10.0.0.1", 2);
        let (status, log) = server.stop();
        assert_eq!(status.code(), Some(0), "{log}");
        assert!(log.contains("config loaded"), "{log}");
        assert_eq!(
            log.contains("\x1b["),
            coloured,
            "LOG_COLOR={color:?}:\n{log}"
        );
    }
}

#[test]
fn an_unknown_log_color_is_refused_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("logs.yaml"), SHADOW).unwrap();
    let out = tollgate()
        .args(["serve", "--config"])
        .arg(dir.path())
        .env("LOG_COLOR", "sometimes")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("LOG_COLOR") && stderr.contains("sometimes"),
        "{stderr}"
    );
}

#[test]
fn shadow_exceeded_is_logged_once_a_second_with_the_suppressed_count() {
    let (server, _dir, grpc, _) = serve(SHADOW, &[("LOG_FORMAT", "json")]);
    let start = Instant::now();
    // One admitted by the limit of 1, then 299 over it: all answered OK (shadow).
    let codes = calls(grpc, "user", "alice", 300);
    assert!(codes.iter().all(|c| *c == 1), "shadow mode answers OK");
    let mut exceeded = 299;
    // The period passes: the next one over the limit logs what was suppressed.
    let lines = loop {
        let lines = json_lines(&server.log());
        let total: u64 = events(&lines, "shadow_exceeded")
            .iter()
            .map(|l| 1 + l["suppressed"].as_u64().expect("suppressed is a number"))
            .sum();
        if total == exceeded {
            break lines;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{total} of {exceeded} accounted for"
        );
        calls(grpc, "user", "alice", 1);
        exceeded += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    let shadow = events(&lines, "shadow_exceeded");
    let seconds = start.elapsed().as_secs() as usize;
    assert!(
        shadow.len() <= seconds + 2,
        "{} lines in {seconds} s",
        shadow.len()
    );
    let last = shadow.last().unwrap();
    assert!(last["suppressed"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(last["rule"], "user", "{last}");
    assert_eq!(last["key"], "user=alice", "{last}");
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn debug_explains_each_decision_without_library_frames() {
    let env = [("LOG_LEVEL", "debug"), ("LOG_FORMAT", "json")];
    let (server, _dir, grpc, _) = serve(SHADOW, &env);
    let codes = calls(grpc, "ip", "10.0.0.9", 2);
    assert_eq!(codes, [1, 2], "OK, then OVER_LIMIT");
    let (status, log) = server.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let lines = json_lines(&log);
    let decisions: Vec<&Value> = lines.iter().filter(|l| l["target"] == "decision").collect();
    let denied = decisions
        .iter()
        .find(|l| l["code"] == "OVER_LIMIT")
        .unwrap_or_else(|| panic!("no OVER_LIMIT decision:\n{log}"));
    assert_eq!(denied["domain"], "logs");
    assert_eq!(denied["fallback"], "none");
    let denied_by = denied["denied_by"].as_str().unwrap();
    assert!(
        denied_by.contains("ip") && denied_by.contains("per_ip"),
        "{denied}"
    );
    let descriptor = &denied["descriptors"][0];
    assert_eq!(descriptor["entries"], "ip=10.0.0.9", "{denied}");
    assert_eq!(descriptor["limits"][0]["allowed"], false, "{denied}");
    assert_eq!(descriptor["limits"][0]["remaining"], 0, "{denied}");
    for line in &lines {
        let target = line["target"].as_str().unwrap_or_default();
        let library = ["h2", "hyper", "tower", "tonic"]
            .iter()
            .any(|l| target == *l || target.starts_with(&format!("{l}::")));
        assert!(
            !library || line["level"] == "WARN" || line["level"] == "ERROR",
            "{line}"
        );
    }
}

/// SIGHUPs until `/config.json` satisfies `done`; returns it.
fn reload_until(server: &Server, http: u16, done: impl Fn(&Value) -> bool) -> Value {
    let pid = server.child.id().to_string();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = Command::new("kill").args(["-HUP", &pid]).status();
        assert!(status.expect("run kill").success());
        let view: Value = serde_json::from_str(&http_get(http, "/config.json")).unwrap();
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "{view}\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn last_error(view: &Value) -> &Value {
    &view["reload"]["last_error"]
}

#[test]
fn a_fixed_config_clears_last_error_and_is_logged() {
    let (server, dir, _, http) = serve(SHADOW, &[("LOG_FORMAT", "json")]);
    let file = dir.path().join("logs.yaml");
    fs::write(&file, "domain: logs\nbogus: 1\ndescriptors: []\n").unwrap();
    let broken = reload_until(&server, http, |v| last_error(v).is_array());
    assert!(
        last_error(&broken)[0].as_str().unwrap().contains("bogus"),
        "{broken}"
    );
    // Fixed by putting back exactly what is served: no swap, yet the failure is over.
    fs::write(&file, SHADOW).unwrap();
    reload_until(&server, http, |v| last_error(v).is_null());
    // And fixed by a new valid set after another failure.
    fs::write(&file, "domain: logs\nbogus: 2\n").unwrap();
    reload_until(&server, http, |v| last_error(v).is_array());
    fs::write(
        &file,
        SHADOW.replace("requests_per_unit: 1}", "requests_per_unit: 2}"),
    )
    .unwrap();
    let fixed = reload_until(&server, http, |v| last_error(v).is_null());
    assert_eq!(fixed["generation"], 2, "{fixed}");

    let (status, log) = server.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let lines = json_lines(&log);
    let failed = events(&lines, "config_reload_failed");
    assert!(!failed.is_empty(), "{log}");
    for line in &failed {
        let errors = line["errors"]
            .as_array()
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(errors.len() as u64, line["error_count"].as_u64().unwrap());
        assert!(errors[0].as_str().unwrap().contains("bogus"), "{line}");
    }
    let recovered = events(&lines, "config_recovered");
    assert_eq!(recovered.len(), 2, "{log}");
    assert!(
        recovered.iter().all(|l| l["previous_errors"].is_array()),
        "{log}"
    );
}
