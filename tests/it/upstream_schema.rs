//! envoyproxy/ratelimit's current YAML schema in tollgate: configs shaped like its
//! `examples/ratelimit/config` pass `tollgate validate` and behave as upstream's do
//! (replaces, shadow mode, unlimited, quota mode); descriptor `metadata` comes back in
//! `dynamic_metadata` as upstream builds it (only with `RESPONSE_DYNAMIC_METADATA`,
//! merged with tollgate's fallback mark); `value_to_metric` reaches the compiled rule;
//! and `validate` lists every mistake of every file with its line.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::process::{run, text, tollgate};
use common::server::{descriptor, request};
use prost_types::value::Kind;
use prost_types::{Struct, Value};
use tollgate::config::rule::MetricLevel;
use tollgate::config::{Config, RuleKind, load_path, load_sources};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitResponse};
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream_examples")
}

fn examples() -> Config {
    load_path(&fixtures()).unwrap_or_else(|e| panic!("upstream-shaped examples refused: {e}"))
}

fn limiter(store: Arc<dyn Store>, response_dynamic_metadata: bool) -> Limiter {
    let options = LimiterOptions {
        response_dynamic_metadata,
        ..Default::default()
    };
    Limiter::new(examples(), store, options)
}

async fn call(limiter: &Limiter, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
    limiter
        .should_rate_limit(&request("gateway", descriptors))
        .await
        .expect("answered")
}

#[test]
fn upstream_example_shapes_pass_tollgate_validate() {
    let out = run(tollgate().arg("validate").arg(fixtures()));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("OK, 2 domain(s)"), "{stdout}");
}

#[tokio::test]
async fn upstream_example_limits_behave_as_upstreams() {
    let limiter = limiter(common::stores::still_memory_store(), false);
    // `category: account` replaces the limit named vip: foo/bar=vip is not counted.
    let account = || descriptor(&[("category", "account")]);
    let vip = || descriptor(&[("foo", "x"), ("bar", "vip")]);
    for _ in 0..3 {
        let answer = call(&limiter, vec![account(), vip()]).await;
        assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
        assert!(answer.statuses[1].current_limit.is_none(), "{answer:?}");
    }
    // Alone, vip's limit of 1 applies.
    assert_eq!(
        call(&limiter, vec![vip()]).await.overall_code,
        Code::Ok as i32
    );
    let second = call(&limiter, vec![vip()]).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32, "{second:?}");
    // Shadow mode: over its limit of 3, still OK.
    let shady = || descriptor(&[("foo", "x"), ("baz", "shady")]);
    for _ in 0..5 {
        let answer = call(&limiter, vec![shady()]).await;
        assert_eq!(answer.statuses[0].code, Code::Ok as i32, "{answer:?}");
    }
    // Unlimited: OK with all the room there is.
    let bay = call(&limiter, vec![descriptor(&[("foo", "x"), ("bay", "y")])]).await;
    assert_eq!(bay.statuses[0].limit_remaining, u32::MAX);
    // Quota mode: alpha (1/min) over while beta (2/min) is not still passes.
    let services = || {
        vec![
            descriptor(&[("service", "alpha")]),
            descriptor(&[("service", "beta")]),
        ]
    };
    call(&limiter, services()).await;
    let second = call(&limiter, services()).await;
    assert_eq!(second.overall_code, Code::Ok as i32, "{second:?}");
    assert_eq!(second.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(
        call(&limiter, services()).await.overall_code,
        Code::OverLimit as i32
    );
}

fn field<'a>(s: &'a Struct, name: &str) -> &'a Kind {
    s.fields
        .get(name)
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("no field '{name}' in {s:?}"))
}

fn as_struct(kind: &Kind) -> &Struct {
    match kind {
        Kind::StructValue(s) => s,
        other => panic!("not a struct: {other:?}"),
    }
}

fn text_value(kind: &Kind) -> &str {
    match kind {
        Kind::StringValue(s) => s,
        other => panic!("not text: {other:?}"),
    }
}

/// `metadata.service_with_quota.name` of an answer.
fn service_name(answer: &RateLimitResponse) -> &str {
    let metadata = answer.dynamic_metadata.as_ref().expect("dynamic_metadata");
    let passed = as_struct(field(metadata, "metadata"));
    text_value(field(
        as_struct(field(passed, "service_with_quota")),
        "name",
    ))
}

#[tokio::test]
async fn passed_descriptors_metadata_is_returned_with_the_request_as_upstream_sends_it() {
    let limiter = limiter(common::stores::still_memory_store(), true);
    let services = || {
        let mut beta = descriptor(&[("service", "beta")]);
        beta.hits_addend = Some(1);
        vec![descriptor(&[("service", "alpha")]), beta]
    };
    let first = call(&limiter, services()).await;
    let metadata = first.dynamic_metadata.as_ref().expect("dynamic_metadata");
    assert_eq!(text_value(field(metadata, "domain")), "gateway");
    let Kind::ListValue(descriptors) = field(metadata, "descriptors") else {
        panic!("descriptors is not a list: {metadata:?}");
    };
    let beta = as_struct(descriptors.values[1].kind.as_ref().expect("kind"));
    let Kind::ListValue(entries) = field(beta, "entries") else {
        panic!("entries is not a list");
    };
    assert_eq!(
        entries.values,
        [Value {
            kind: Some(Kind::StringValue("service=beta".into()))
        }]
    );
    assert_eq!(field(beta, "hitsAddend"), &Kind::NumberValue(1.0));
    // Both passed: both mappings merge, the first value of `name` wins.
    assert_eq!(service_name(&first), "alpha");
    // alpha is over now: only beta's metadata is returned.
    let second = call(&limiter, services()).await;
    assert_eq!(service_name(&second), "beta");
    // Both over: no descriptor passed, no `metadata` field at all.
    let third = call(&limiter, services()).await;
    let metadata = third.dynamic_metadata.as_ref().expect("dynamic_metadata");
    assert!(!metadata.fields.contains_key("metadata"), "{metadata:?}");
}

#[tokio::test]
async fn dynamic_metadata_is_sent_only_when_response_dynamic_metadata_is_on() {
    let limiter = limiter(Arc::new(MemoryStore::new()), false);
    let answer = call(&limiter, vec![descriptor(&[("service", "beta")])]).await;
    assert_eq!(answer.dynamic_metadata, None);
}

#[tokio::test]
async fn the_fallback_mark_joins_the_metadata_instead_of_replacing_it() {
    let limiter = limiter(common::stores::down(), true);
    let answer = call(&limiter, vec![descriptor(&[("service", "beta")])]).await;
    let metadata = answer.dynamic_metadata.as_ref().expect("dynamic_metadata");
    assert_eq!(service_name(&answer), "beta");
    let mark = as_struct(field(metadata, "tollgate"));
    assert_eq!(text_value(field(mark, "fallback")), "allow");
}

#[test]
fn value_to_metric_levels_reach_the_compiled_rule() {
    let yaml = "domain: route_draw
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let config = load_sources(&[(Path::new("v.yaml"), yaml)]).expect("loads");
    let rules = &config.domain("route_draw").expect("domain").rules;
    let deep = rules
        .iter()
        .find(|r| r.path.ends_with("subject_id"))
        .unwrap();
    assert_eq!(
        deep.metric_levels.as_deref(),
        Some(
            &[
                MetricLevel::RequestValue,
                MetricLevel::KeyOnly,
                MetricLevel::KeyOnly
            ][..]
        )
    );
    assert!(deep.value_to_metric());
    let plain = rules.iter().find(|r| &*r.path == "plain").unwrap();
    assert_eq!(plain.metric_levels, None);
    assert!(!plain.value_to_metric());
    assert!(matches!(plain.kind, RuleKind::Limited(_)));
}

#[test]
fn validate_lists_three_mistakes_of_one_file_and_the_errors_of_a_second() {
    let three = "domain: one
descriptorz: []
descriptors:
  - key: a
    quota_mod: true
    rate_limit:
      unit: second
      requests_per_unit: ten
";
    let other = "domain: two\ndescriptors:\n  - key: b\n    metadata: [not, a, mapping]\n";
    let errors = load_sources(&[
        (Path::new("one.yaml"), three),
        (Path::new("two.yaml"), other),
    ])
    .expect_err("two broken files")
    .0;
    let places: Vec<(String, Option<u64>)> = errors
        .iter()
        .map(|e| (e.file.display().to_string(), e.line))
        .collect();
    assert_eq!(
        places,
        [
            ("one.yaml".into(), Some(2)),
            ("one.yaml".into(), Some(5)),
            ("one.yaml".into(), Some(8)),
            ("two.yaml".into(), Some(4)),
        ],
        "{errors:#?}"
    );
    assert!(errors[1].message.contains("unknown key 'quota_mod'"));
    assert!(errors[2].message.starts_with("requests_per_unit:"));
    assert!(
        errors[3]
            .message
            .starts_with("metadata: expected a mapping")
    );
}

#[test]
fn validate_prints_every_error_of_every_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\nbogus: 1\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b.yaml"), "domain: b\nalso_bogus: 2\n").unwrap();
    let out = run(tollgate().arg("validate").arg(dir.path()));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for expected in [
        "a.yaml:2: unknown key 'bogus'",
        "a.yaml:5: shadow_mode:",
        "b.yaml:2: unknown key 'also_bogus'",
    ] {
        assert!(
            stderr.contains(expected),
            "missing '{expected}' in:\n{stderr}"
        );
    }
}
