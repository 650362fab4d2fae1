//! A resource compiles to what the same limits in YAML compile to.

use std::path::Path;

use prost::Message;
use prost_types::{Any, Struct, Value, value::Kind};

use super::*;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;

fn any(resource: &RateLimitConfig) -> Any {
    Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: resource.encode_to_vec(),
    }
}

fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..RateLimitPolicy::default()
    })
}

fn leaf(key: &str, value: &str, limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: limit,
        ..RateLimitDescriptor::default()
    }
}

fn yaml(text: &str) -> Config {
    config::load_sources(&[(Path::new("file.yaml"), text)]).unwrap()
}

fn strings(pairs: &[(&str, Kind)]) -> Struct {
    Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value {
                        kind: Some(v.clone()),
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn an_envoy_gateway_resource_compiles_like_its_yaml() {
    let mut named = policy(RateLimitUnit::Minute, 5).unwrap();
    named.name = "per-user".into();
    named.replaces = vec![RateLimitReplace {
        name: "other".into(),
    }];
    let resource = RateLimitConfig {
        name: "envoy-gateway/gateway-1/http".into(),
        domain: "envoy-gateway/gateway-1/http".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "rule-0-match-0".into(),
            value: "rule-0-match-0".into(),
            descriptors: vec![
                leaf("rule-0-match-1", "", policy(RateLimitUnit::Second, 3)),
                RateLimitDescriptor {
                    shadow_mode: true,
                    ..leaf("user", "alice", Some(named))
                },
            ],
            ..RateLimitDescriptor::default()
        }],
    };
    let served = compile(&[any(&resource)]).unwrap();
    let expected = yaml(
        "domain: envoy-gateway/gateway-1/http
descriptors:
  - key: rule-0-match-0
    value: rule-0-match-0
    descriptors:
      - key: rule-0-match-1
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: user
        value: alice
        shadow_mode: true
        rate_limit:
          unit: minute
          requests_per_unit: 5
          name: per-user
          replaces: [{name: other}]
",
    );
    assert_eq!(served, expected);
}

#[test]
fn tollgate_metadata_keys_reach_the_extensions_and_the_rest_is_echoed() {
    let resource = RateLimitConfig {
        name: "r".into(),
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            metadata: Some(strings(&[
                ("tollgate.algorithm", Kind::StringValue("gcra".into())),
                ("tollgate.burst", Kind::NumberValue(10.0)),
                (
                    "tollgate.domain.failure_mode",
                    Kind::StringValue("deny".into()),
                ),
                ("team", Kind::StringValue("payments".into())),
            ])),
            ..leaf("k", "", policy(RateLimitUnit::Second, 5))
        }],
    };
    let served = compile(&[any(&resource)]).unwrap();
    let expected = yaml(
        "domain: d
failure_mode: deny
descriptors:
  - key: k
    metadata: {team: payments}
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, burst: 10}
",
    );
    assert_eq!(served, expected);
}

#[test]
fn a_bad_resource_is_refused_under_its_name() {
    let resource = RateLimitConfig {
        name: "broken".into(),
        domain: "d".into(),
        descriptors: vec![leaf("k", "", policy(RateLimitUnit::Unknown, 5))],
    };
    let errors = compile(&[any(&resource)]).unwrap_err();
    let text = errors.to_string();
    assert!(text.contains("broken: "), "{text}");
    assert!(text.contains("invalid rate limit unit"), "{text}");
    assert_eq!(errors.0[0].line, None);
}

#[test]
fn the_host_part_of_a_type_url_is_not_compared() {
    let resource = RateLimitConfig {
        name: "elsewhere".into(),
        domain: "d".into(),
        descriptors: vec![leaf("k", "", policy(RateLimitUnit::Second, 5))],
    };
    let mut other_host = any(&resource);
    other_host.type_url = "example.com/types/ratelimit.config.ratelimit.v3.RateLimitConfig".into();
    let config = compile(&[other_host]).unwrap();
    assert!(config.domain("d").is_some());
    let mut near_miss = any(&resource);
    near_miss.type_url =
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfigs".into();
    assert!(compile(&[near_miss]).is_err());
}

#[test]
fn undecodable_bytes_and_foreign_types_are_errors() {
    let garbage = Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    let foreign = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    let errors = compile(&[garbage, foreign]).unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
    assert!(errors.0[0].message.contains("cannot decode"), "{errors}");
    assert!(
        errors.0[1].message.contains("unexpected resource type"),
        "{errors}"
    );
}

#[test]
fn an_unlimited_policy_without_a_unit_loads_and_a_typo_in_an_extension_does_not() {
    let unlimited = RateLimitPolicy {
        unlimited: true,
        ..RateLimitPolicy::default()
    };
    let ok = RateLimitConfig {
        name: "r".into(),
        domain: "d".into(),
        descriptors: vec![leaf("k", "", Some(unlimited))],
    };
    assert!(compile(&[any(&ok)]).is_ok());
    let typo = RateLimitConfig {
        descriptors: vec![RateLimitDescriptor {
            metadata: Some(strings(&[(
                "tollgate.algoritm",
                Kind::StringValue("gcra".into()),
            )])),
            ..leaf("k", "", policy(RateLimitUnit::Second, 1))
        }],
        ..ok
    };
    let text = compile(&[any(&typo)]).unwrap_err().to_string();
    assert!(
        text.contains("r: descriptor 'k': metadata: unknown tollgate extension"),
        "{text}"
    );
}

#[test]
fn two_resources_with_one_domain_are_refused() {
    let one = RateLimitConfig {
        name: "a".into(),
        domain: "d".into(),
        descriptors: Vec::new(),
    };
    let two = RateLimitConfig {
        name: "b".into(),
        ..one.clone()
    };
    let text = compile(&[any(&one), any(&two)]).unwrap_err().to_string();
    assert!(
        text.contains("b: domain: duplicate domain 'd' (first defined in a)"),
        "no line numbers in xDS errors: {text}"
    );
    assert!(!text.contains("a:1"), "{text}");
}

/// A hostile nesting is refused in words, not with the parser's Debug dump.
#[test]
fn descriptors_nested_past_the_parsers_limit_are_refused_in_words() {
    let mut descriptor = leaf("k", "", policy(RateLimitUnit::Second, 1));
    for _ in 0..40 {
        descriptor = RateLimitDescriptor {
            descriptors: vec![descriptor],
            ..leaf("k", "", None)
        };
    }
    let deep = RateLimitConfig {
        name: "deep".into(),
        domain: "d".into(),
        descriptors: vec![descriptor],
    };
    // On a stack as big as the server's threads have (a test thread's 2 MiB is not
    // enough for a debug build's parse of 64 levels).
    let resources = [any(&deep)];
    let text = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(16 << 20)
            .spawn_scoped(s, || compile(&resources).unwrap_err().to_string())
            .unwrap()
            .join()
            .unwrap()
    });
    assert!(
        text.contains("deep: nested too deeply: more than 64 levels"),
        "{text}"
    );
    assert!(!text.contains("Depth {"), "{text}");
}

/// `tollgate.overdraft` (issue 25) is the descriptor's `overdraft` key.
#[test]
fn tollgate_overdraft_reaches_the_descriptor() {
    let resource = RateLimitConfig {
        name: "r".into(),
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            metadata: Some(strings(&[("tollgate.overdraft", Kind::BoolValue(true))])),
            ..leaf("tenant", "", policy(RateLimitUnit::Hour, 1000))
        }],
    };
    let served = compile(&[any(&resource)]).unwrap();
    let expected = yaml(
        "domain: d
descriptors:
  - key: tenant
    overdraft: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
",
    );
    // Rules compare every field, `overdraft` among them.
    assert_eq!(served, expected);
}

/// `tollgate.global` (issue 38) is the descriptor's `global` key.
#[test]
fn tollgate_global_reaches_the_descriptor() {
    let resource = RateLimitConfig {
        name: "r".into(),
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            metadata: Some(strings(&[("tollgate.global", Kind::BoolValue(true))])),
            ..leaf("tenant", "", policy(RateLimitUnit::Minute, 6000))
        }],
    };
    let served = compile(&[any(&resource)]).unwrap();
    let expected = yaml(
        "domain: d
descriptors:
  - key: tenant
    global: true
    rate_limit: {unit: minute, requests_per_unit: 6000}
",
    );
    assert_eq!(served, expected);
    assert!(served.has_global_rules());
}

/// `tollgate.lease` (issue 25) is a concurrency rule's `lease`: over xDS the policy's
/// unit is always there, so the lease replaces it as the window.
#[test]
fn tollgate_lease_reaches_the_rate_limit() {
    let resource = RateLimitConfig {
        name: "r".into(),
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            metadata: Some(strings(&[
                (
                    "tollgate.algorithm",
                    Kind::StringValue("concurrency".into()),
                ),
                ("tollgate.lease", Kind::StringValue("90s".into())),
            ])),
            ..leaf("backend", "", policy(RateLimitUnit::Second, 8))
        }],
    };
    let served = compile(&[any(&resource)]);
    let expected = yaml(
        "domain: d
descriptors:
  - key: backend
    rate_limit: {algorithm: concurrency, requests_per_unit: 8, lease: 90s}
",
    );
    assert_eq!(served.map_err(|e| e.to_string()), Ok(expected));
}
