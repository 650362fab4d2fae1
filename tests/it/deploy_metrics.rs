//! The deployment kit names only metrics tollgate exports: a real `tollgate serve` on
//! the harness's Redis Cluster gets traffic (admitted, over the limit, shadowed), its
//! `/metrics` is scraped, and every metric name in the Grafana dashboard's PromQL
//! (`deploy/grafana/tollgate.json`) and in the alert rules
//! (`deploy/prometheus/alerts.yaml`) must be a series of that scrape. The same scrape
//! shows `tollgate_backend_up` and a closed breaker for every cluster master, the build
//! and the process figures. The server is a region on a global ledger with a global
//! rule, so the global rules' panels have series too.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::envoy::render::load_yaml;
use common::process::{DEADLINE, Server, free_ports, root, run, tollgate};

const CONFIG: &str = "\
domain: deploy
descriptors:
  - key: client
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: tenant
    global: true
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// PromQL words that are not metric names.
const KEYWORDS: [&str; 11] = [
    "by",
    "offset",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
];

/// PromQL's aggregation operators: `sum by (le) (...)` puts a list between the
/// operator and its parenthesis.
const AGGREGATIONS: [&str; 12] = [
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// The metric names of one PromQL expression: label matchers, grouping lists,
/// ranges and strings removed, then every identifier that is not a function call
/// (followed by `(`), a keyword or a number.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_string = false;
    for c in expr.chars() {
        match c {
            '"' if depth_brace == 0 => in_string = !in_string,
            _ if in_string => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            c => plain.push(c),
        }
    }
    let chars: Vec<char> = plain.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // After a grouping keyword, the parenthesised list holds label names.
    let mut skip_list = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            // A duration's unit (`5m`) or an exponent (`1e-9`) follows a digit.
            let after_digit = start > 0 && chars[start - 1].is_ascii_digit();
            let grouping = matches!(
                word.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            );
            if !(KEYWORDS.contains(&word.as_str())
                || AGGREGATIONS.contains(&word.as_str())
                || next == Some(&'(')
                || after_digit)
            {
                names.insert(word);
            }
            skip_list = grouping;
        } else if c == '(' && skip_list {
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            skip_list = false;
            i += 1;
        } else {
            if !c.is_whitespace() {
                skip_list = false;
            }
            i += 1;
        }
    }
    names
}

/// Every PromQL expression of the dashboard (each panel's `targets[].expr`, rows
/// included) and of the alert rules (`spec.groups[].rules[].expr`).
fn deploy_expressions() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(root().join("deploy/grafana/tollgate.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            exprs.push((
                format!("dashboard panel '{title}'"),
                target["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    let alerts = load_yaml(&root().join("deploy/prometheus/alerts.yaml"));
    for group in alerts["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            exprs.push((
                format!("alert {name}"),
                rule["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    exprs
}

/// The series names of a scrape (what PromQL selects), with their families' names.
fn exported(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// What the kit uses that the scrape lacks, each with where it is used.
fn missing(exprs: &[(String, String)], exported: &BTreeSet<String>) -> Vec<String> {
    let mut missing = Vec::new();
    for (place, expr) in exprs {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                missing.push(format!("{name} (in {place})"));
            }
        }
    }
    missing
}

#[test]
fn the_extractor_finds_names_and_reports_a_made_up_one() {
    let names = metric_names(
        r#"sum by (le, node) (rate(tollgate_a_bucket{kind!="x",le="1e3"}[$__rate_interval])) / on (job) group_left clamp_min(tollgate_b_total offset 5m, 1e-9) > bool 0.01 or vector(0)"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["tollgate_a_bucket".into(), "tollgate_b_total".into()])
    );
    let scrape = "# TYPE tollgate_real counter\ntollgate_real_total{a=\"b\"} 1\n";
    let exprs = [(
        "here".to_owned(),
        "rate(tollgate_real_total[5m]) + tollgate_made_up_total".to_owned(),
    )];
    assert_eq!(
        missing(&exprs, &exported(scrape)),
        ["tollgate_made_up_total (in here)"]
    );
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect the HTTP port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the answer");
    response
}

fn sample<'a>(scrape: &'a str, series: &str) -> Option<&'a str> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
}

#[test]
fn every_metric_of_the_dashboard_and_the_alerts_is_exported_after_traffic() {
    let cluster = common::redis::cluster();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("root/rl/config");
    fs::create_dir_all(&config).unwrap();
    fs::write(config.join("deploy.yaml"), CONFIG).unwrap();
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .arg("serve")
        .env("RUNTIME_ROOT", dir.path().join("root"))
        .env("RUNTIME_SUBDIRECTORY", "rl")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("REDIS_TYPE", "cluster")
        .env("REDIS_URL", cluster.nodes().join(","))
        .env(
            "CACHE_KEY_PREFIX",
            common::redis::unique_prefix("deploy_metrics"),
        )
        // Global rules' panels: a region on a ledger (the harness's standalone Redis).
        .env("TOLLGATE_REGION", "deploy")
        .env("TOLLGATE_GLOBAL_LEDGER", common::redis::standalone().url())
        .env(
            "TOLLGATE_GLOBAL_LEDGER_PREFIX",
            common::redis::unique_prefix("deploy_metrics_ledger"),
        );
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);

    let addr = format!("127.0.0.1:{grpc}");
    // Admitted, admitted, over the limit (Redis), over the limit (Redis again: a
    // cluster keeps no over-limit cache, store/cache.rs);
    // shadowed: one admitted, then over the limit and let through.
    for descriptor in [
        "client=c",
        "client=c",
        "client=c",
        "client=c",
        "shadowed=s",
        "shadowed=s",
        // Denied for want of a share (the first), which wakes the sync.
        "tenant=t",
    ] {
        run(tollgate().args([
            "check",
            "--addr",
            &addr,
            "--domain",
            "deploy",
            "--descriptor",
            descriptor,
        ]));
    }

    // The readiness probe runs every second: wait for it to report every master, and
    // for the ledger client's first sync.
    let masters = 3;
    let deadline = Instant::now() + DEADLINE;
    let scrape = loop {
        let scrape = http_get(http, "/metrics");
        let up = scrape
            .lines()
            .filter(|l| l.starts_with("tollgate_backend_up{"))
            .count();
        if up >= masters && scrape.contains("tollgate_global_unshared_denials_total{") {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "no backend_up for {masters} masters:\n{scrape}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let exprs = deploy_expressions();
    assert!(
        exprs.len() > 20,
        "the kit's expressions were found: {}",
        exprs.len()
    );
    let used: BTreeSet<String> = exprs.iter().flat_map(|(_, e)| metric_names(e)).collect();
    for name in [
        "tollgate_backend_up",
        "tollgate_breaker_state",
        "tollgate_fallback_decisions_total",
        "tollgate_request_duration_seconds_bucket",
        "process_cpu_seconds_total",
    ] {
        assert!(used.contains(name), "the kit uses {name}: {used:?}");
    }
    let missing = missing(&exprs, &exported(&scrape));
    assert!(
        missing.is_empty(),
        "used by deploy/ but not exported:\n  {}\n--- scrape ---\n{scrape}",
        missing.join("\n  ")
    );

    let up: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("tollgate_backend_up{"))
        .collect();
    assert_eq!(up.len(), masters, "one series per master: {up:?}");
    assert!(
        up.iter().all(|l| l.ends_with(" 1")),
        "every master answers: {up:?}"
    );
    // A cluster: one breaker per master, all closed.
    let breakers: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("tollgate_breaker_state{"))
        .collect();
    assert_eq!(
        breakers.len(),
        masters,
        "one breaker per master: {breakers:?}"
    );
    assert!(breakers.iter().all(|l| l.ends_with(" 0")), "{breakers:?}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        scrape.lines().any(|l| l.starts_with(&format!(
            "tollgate_build_info{{version=\"{version}\",commit=\""
        )) && l.ends_with(" 1")),
        "build_info names version {version}:\n{scrape}"
    );
    assert_eq!(
        sample(
            &scrape,
            r#"tollgate_rule_over_limit_with_local_cache_total{domain="deploy",rule="client"}"#
        ),
        Some("0")
    );
    assert_eq!(
        sample(
            &scrape,
            r#"tollgate_rule_shadow_mode_total{domain="deploy",rule="shadowed"}"#
        ),
        Some("1")
    );
    let rss: f64 = sample(&scrape, "process_resident_memory_bytes")
        .expect("rss")
        .parse()
        .unwrap();
    assert!(rss > 1e6, "a server holds more than a megabyte: {rss}");
    let started: f64 = sample(&scrape, "process_start_time_seconds")
        .expect("start")
        .parse()
        .unwrap();
    let success: f64 = sample(
        &scrape,
        "tollgate_config_last_reload_success_timestamp_seconds",
    )
    .expect("ts")
    .parse()
    .unwrap();
    assert!(
        success >= started.floor() - 1.0,
        "the start-up load counts as a success"
    );
    assert_eq!(server.terminate().code(), Some(0));
}
