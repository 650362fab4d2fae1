//! The configuration extensions for algorithms: `algorithm`, `unit_multiplier`,
//! `burst`, `leaky_bucket.max_delay` and `rate_limits` lists. Each mistake is one
//! error naming the file, the line and the field; valid settings compile to the
//! limits the models will run.

use std::path::Path;
use std::time::Duration;

use tollgate::algorithm::Algorithm;
use tollgate::config::{Config, RuleKind, load_sources};

fn load(yaml: &str) -> Result<Config, Vec<String>> {
    load_sources(&[(Path::new("algo.yaml"), yaml)])
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

fn assert_one_error(yaml: &str, line: u64, needles: &[&str]) {
    let errors = load(yaml).expect_err("config must be refused");
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    let prefix = format!("algo.yaml:{line}: ");
    assert!(
        errors[0].starts_with(&prefix),
        "expected '{prefix}...', got '{}'",
        errors[0]
    );
    for needle in needles {
        assert!(
            errors[0].contains(needle),
            "'{}' should mention '{needle}'",
            errors[0]
        );
    }
}

fn descriptor(body: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n{body}")
}

#[test]
fn every_algorithm_and_its_options_compile() {
    let yaml = descriptor(
        "    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20, name: per_second}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: sliding_window}
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
      - {unit: day, requests_per_unit: 10000, algorithm: gcra, burst: 50}
      - unit: second
        requests_per_unit: 2
        algorithm: leaky_bucket
        burst: 4
        leaky_bucket: {max_delay: 1500ms}
      - {unit: week, requests_per_unit: 1}
",
    );
    let config = load(&yaml).expect("valid");
    let domain = config.domain("d").unwrap();
    let RuleKind::Limited(limits) = &domain.rules[0].kind else {
        panic!("limited")
    };
    let algorithms: Vec<Algorithm> = limits.iter().map(|l| l.algorithm).collect();
    assert_eq!(
        algorithms,
        [
            Algorithm::TokenBucket,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
            Algorithm::FixedWindow
        ]
    );
    assert_eq!(limits[0].burst, Some(20));
    assert_eq!(limits[1].window_secs(), 300, "5 minutes");
    assert_eq!(limits[4].max_delay, Some(Duration::from_millis(1500)));
    assert_eq!(limits[4].params().burst, 4);
    assert_eq!(
        limits[2].params().burst,
        1000,
        "burst defaults to the limit"
    );
    assert_eq!(domain.rules[0].name.as_deref(), Some("per_second"));
}

#[test]
fn unknown_algorithm_lists_the_valid_ones() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: slidng_window\n",
    );
    assert_one_error(
        &yaml,
        7,
        &[
            "descriptor 'k'",
            "algorithm",
            "slidng_window",
            "sliding_window",
            "gcra",
        ],
    );
}

#[test]
fn burst_only_where_it_means_something() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 5\n",
    );
    assert_one_error(&yaml, 7, &["burst", "fixed_window"]);
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: 0\n",
    );
    assert_one_error(&yaml, 8, &["burst", "at least 1"]);
}

#[test]
fn unit_multiplier_must_be_positive() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: minute\n      unit_multiplier: 0\n      requests_per_unit: 1\n",
    );
    assert_one_error(&yaml, 6, &["unit_multiplier", "at least 1"]);
}

#[test]
fn leaky_bucket_options_need_the_leaky_bucket() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      leaky_bucket:\n        max_delay: 1s\n",
    );
    assert_one_error(&yaml, 8, &["leaky_bucket", "gcra"]);
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky_bucket\n      leaky_bucket:\n        max_delay: soon\n",
    );
    assert_one_error(&yaml, 9, &["max_delay", "soon", "duration"]);
}

#[test]
fn rate_based_algorithms_need_a_rate() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 0\n      algorithm: token_bucket\n",
    );
    assert_one_error(
        &yaml,
        6,
        &["requests_per_unit", "token_bucket", "at least 1"],
    );
    // A fixed window of 0 stays legal: envoyproxy/ratelimit uses it to deny everything.
    load(&descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 0\n",
    ))
    .expect("valid");
}

#[test]
fn sliding_log_refuses_limits_above_its_memory_bound() {
    let yaml = descriptor(
        "    rate_limit:\n      unit: hour\n      requests_per_unit: 10001\n      algorithm: sliding_log\n",
    );
    assert_one_error(
        &yaml,
        6,
        &["sliding_log", "10000", "10001", "sliding_window"],
    );
    load(&descriptor("    rate_limit:\n      unit: hour\n      requests_per_unit: 10000\n      algorithm: sliding_log\n"))
        .expect("the bound itself is allowed");
}

#[test]
fn rate_limit_and_rate_limits_exclude_each_other() {
    let yaml = descriptor(
        "    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: day, requests_per_unit: 10}\n",
    );
    assert_one_error(&yaml, 5, &["rate_limit", "rate_limits", "not both"]);
    assert_one_error(
        &descriptor("    rate_limits: []\n"),
        4,
        &["rate_limits", "empty"],
    );
}

#[test]
fn errors_inside_a_list_name_the_entry() {
    let yaml = descriptor(
        "    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: fortnight, requests_per_unit: 1}\n",
    );
    assert_one_error(&yaml, 6, &["rate_limits[1].unit", "fortnight"]);
    let yaml = descriptor(
        "    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unlimited: true}\n",
    );
    assert_one_error(&yaml, 3, &["unlimited"]);
}

#[test]
fn replaces_may_not_name_any_limit_of_the_same_descriptor() {
    let yaml = descriptor(
        "    rate_limits:\n      - {unit: second, requests_per_unit: 1, name: a}\n      - unit: day\n        requests_per_unit: 10\n        replaces:\n          - name: a\n",
    );
    assert_one_error(&yaml, 9, &["replaces", "'a'"]);
}
