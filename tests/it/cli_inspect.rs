//! `tollgate inspect` against the harness's real Redis (standalone and cluster): after
//! a server consumed 3 of a limit of 10, inspect shows the stored count, remaining 7
//! and a TTL, and a second inspect shows the same (reading consumed nothing); the
//! keys it names are the keys the server wrote. Unknown domains, unmatched descriptors
//! and a missing Redis are reported plainly.

use crate::common;

use std::process::Output;
use std::sync::Arc;

use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;

use common::process::{run, text, tollgate};
use common::server::{TestServer, config, descriptor, request};

const YAML: &str = "domain: peek\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}\n";

async fn inspect(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || run(tollgate().arg("inspect").args(&args)))
        .await
        .expect("inspect ran")
}

/// The value after `label` on its line in the block of `key=value`'s descriptor.
fn field(stdout: &str, descriptor: &str, label: &str) -> String {
    stdout
        .split("descriptor ")
        .find(|block| block.starts_with(descriptor))
        .and_then(|block| {
            block
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix(label))
        })
        .unwrap_or_else(|| panic!("no {label} for {descriptor}:\n{stdout}"))
        .trim()
        .to_owned()
}

async fn consume_three_then_inspect(cluster: bool) {
    let (target, redis_flag, redis_value) = if cluster {
        let nodes = common::redis::cluster().nodes().join(",");
        (common::stores::cluster_target(), "--redis-cluster", nodes)
    } else {
        let url = common::redis::standalone().url();
        (common::stores::standalone_target(), "--redis-url", url)
    };
    let options = common::stores::options(target, "cli_inspect");
    let prefix = options.key_prefix.clone();
    let store = Arc::new(common::stores::connect(&options).await);
    let server = TestServer::start(config(YAML), store, LimiterOptions::default()).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        let answer = client
            .should_rate_limit(request(
                "peek",
                vec![descriptor(&[("k", "a")]), descriptor(&[("t", "a")])],
            ))
            .await
            .expect("answer")
            .into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    }
    server.stop().await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("peek.yaml"), YAML).unwrap();
    let args: Vec<String> = [
        "--config",
        &dir.path().display().to_string(),
        redis_flag,
        &redis_value,
        "--key-prefix",
        &prefix,
        "--domain",
        "peek",
        "--descriptor",
        "k=a",
        "--descriptor",
        "t=a",
        "--descriptor",
        "other=a",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();

    let first = inspect(args.clone()).await;
    let stdout = text(&first.stdout);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{stdout}{}",
        text(&first.stderr)
    );
    assert!(
        field(&stdout, "k=a", "state").starts_with("count 3 in the window"),
        "{stdout}"
    );
    assert_eq!(field(&stdout, "k=a", "remaining"), "7", "{stdout}");
    assert_eq!(
        field(&stdout, "k=a", "algorithm"),
        "fixed_window",
        "{stdout}"
    );
    assert!(
        field(&stdout, "t=a", "state").starts_with("tokens 7"),
        "{stdout}"
    );
    assert_eq!(field(&stdout, "t=a", "remaining"), "7", "{stdout}");
    for d in ["k=a", "t=a"] {
        let ttl = field(&stdout, d, "ttl");
        let value = ttl.split_whitespace().next().unwrap_or_default();
        let secs: f64 = value.trim_end_matches('s').parse().unwrap_or(-1.0);
        assert!(secs > 0.0 && secs <= 3600.0, "{d} ttl {ttl}:\n{stdout}");
    }
    assert!(
        stdout.contains("no limit: no rule of domain 'peek' matches"),
        "{stdout}"
    );

    // The key inspect names is the key the server wrote.
    let key = field(&stdout, "k=a", "counter");
    let pattern = format!("{prefix}*");
    let written = if cluster {
        common::redis::scan_keys(common::redis::cluster(), &pattern)
    } else {
        common::redis::scan_keys(common::redis::standalone(), &pattern)
    };
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(written.contains(&key), "{key} not among {written:?}");

    // Nothing was consumed: the same count and remaining again.
    let second = inspect(args).await;
    let again = text(&second.stdout);
    assert_eq!(second.status.code(), Some(0), "{again}");
    for d in ["k=a", "t=a"] {
        assert_eq!(field(&again, d, "remaining"), "7", "{again}");
    }
    assert_eq!(
        field(&again, "k=a", "state"),
        field(&stdout, "k=a", "state")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_standalone_counters_without_consuming() {
    consume_three_then_inspect(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_cluster_counters_without_consuming() {
    consume_three_then_inspect(true).await;
}

#[test]
fn inspect_reports_what_it_cannot_read() {
    // No Redis given: counters of a memory store live inside the server process.
    let out = run(tollgate().args(["inspect", "--domain", "example", "--descriptor", "k=v"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--redis-url"),
        "{}",
        text(&out.stderr)
    );

    // An unknown domain: no counter, said so, exit 0.
    let url = common::redis::standalone().url();
    let out = run(tollgate().args([
        "inspect",
        "--redis-url",
        &url,
        "--domain",
        "nosuch",
        "--descriptor",
        "k=v",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("domain 'nosuch' is not in config"),
        "{}",
        text(&out.stdout)
    );
}
