//! `tollgate check` as scripts use it, against in-process servers: exit 0 on OK, 1 on
//! OVER_LIMIT, 2 on errors (bad argument, nothing listening, the HTTP port); a
//! descriptor that matched no limit is named as such rather than `REMAINING 0`; a
//! fallback answer (the store is down) is marked, in the response's
//! `dynamic_metadata` and in the table, without changing the decision.

use crate::common;

use std::process::Output;
use std::sync::Arc;

use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::memory::MemoryStore;

use common::process::{run, text, tollgate};
use common::server::{TestServer, config, descriptor, request};

const YAML: &str = "domain: exits\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: free\n    rate_limit: {unlimited: true}\n";

/// Runs `tollgate check ARGS` off the runtime's workers (the server lives on them).
async fn check(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run(tollgate().arg("check").args(&args)))
        .await
        .expect("check ran")
}

fn summary(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_follow_the_decision() {
    let server = TestServer::start(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    let addr = server.grpc_addr.to_string();
    let base = ["--addr", &addr, "--domain", "exits", "--descriptor"];

    let out = check(&[&base[..], &["k=a"]].concat()).await;
    assert_eq!(out.status.code(), Some(0), "{}", summary(&out));
    assert!(
        text(&out.stdout).contains("overall: OK"),
        "{}",
        summary(&out)
    );

    let out = check(&[&base[..], &["k=a"]].concat()).await;
    assert_eq!(out.status.code(), Some(1), "{}", summary(&out));
    assert!(
        text(&out.stdout).contains("overall: OVER_LIMIT"),
        "{}",
        summary(&out)
    );

    // A malformed descriptor is refused before any call.
    let out = check(&[&base[..], &["no-equals-sign"]].concat()).await;
    assert_eq!(out.status.code(), Some(2), "{}", summary(&out));
    assert!(
        text(&out.stderr).contains("not key=value"),
        "{}",
        summary(&out)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_limit_and_unlimited_are_named_not_shown_as_zero_remaining() {
    let server = TestServer::start(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    let addr = server.grpc_addr.to_string();

    let out = check(&["--addr", &addr, "--domain", "nosuch", "--descriptor", "k=a"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", summary(&out));
    let row = common::process::row(&stdout, "k=a");
    assert_eq!(row[1..4], ["OK", "no-limit", "-"], "{stdout}");
    assert!(
        stdout.contains("k=a matched no limit: domain 'nosuch' is not configured"),
        "{stdout}"
    );

    let out = check(&[
        "--addr",
        &addr,
        "--domain",
        "exits",
        "--descriptor",
        "free=x",
        "--descriptor",
        "other=y",
    ])
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", summary(&out));
    assert_eq!(
        common::process::row(&stdout, "free=x")[1..4],
        ["OK", "unlimited", "-"],
        "{stdout}"
    );
    assert_eq!(
        common::process::row(&stdout, "other=y")[2],
        "no-limit",
        "{stdout}"
    );
    assert!(!stdout.contains("free=x matched no limit"), "{stdout}");
    assert!(!stdout.contains("4294967295"), "{stdout}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_answers_are_marked_and_keep_their_decision() {
    for (mode, code, exit) in [("allow", Code::Ok, 0), ("deny", Code::OverLimit, 1)] {
        let yaml = format!(
            "domain: down\nfailure_mode: {mode}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        );
        let server = TestServer::start(
            config(&yaml),
            common::stores::down(),
            LimiterOptions::default(),
        )
        .await;

        // On the wire: the decision is the failure mode's, and the mark says so.
        let mut client = server.client().await;
        let response = client
            .should_rate_limit(request("down", vec![descriptor(&[("k", "a")])]))
            .await
            .expect("a fallback answer, not an error")
            .into_inner();
        assert_eq!(response.overall_code, code as i32, "{response:?}");
        assert_eq!(tollgate::cli::check::fallback(&response), Some(mode));

        let out = check(&[
            "--addr",
            &server.grpc_addr.to_string(),
            "--domain",
            "down",
            "--descriptor",
            "k=a",
        ])
        .await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(exit), "{}", summary(&out));
        assert!(
            stdout.contains(&format!("note: fallback answer (failure_mode: {mode})")),
            "{stdout}"
        );
        server.stop().await;
    }

    // A store that decides leaves no mark.
    let server = TestServer::start(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    let response = client
        .should_rate_limit(request("exits", vec![descriptor(&[("k", "b")])]))
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(response.dynamic_metadata, None, "{response:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_2_and_the_http_port_is_recognised() {
    let server = TestServer::start(
        config(YAML),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    )
    .await;
    let http = server.http_addr.to_string();
    let out = check(&["--addr", &http, "--domain", "exits", "--descriptor", "k=a"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", summary(&out));
    assert!(stderr.contains("HTTP admin port"), "{stderr}");
    assert!(stderr.contains("gRPC port (8081 by default)"), "{stderr}");
    server.stop().await;

    // Nothing listening: refused, exit 2 (not 1, which means OVER_LIMIT).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let out = check(&[
        "--addr",
        &addr,
        "--domain",
        "exits",
        "--descriptor",
        "k=a",
        "--timeout-ms",
        "3000",
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", summary(&out));
}
