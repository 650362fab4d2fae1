//! envoyproxy/ratelimit's matcher rules (docs/configuration.md), on configs built from YAML through
//! `tollgate::config::matcher::find`: exact over wildcard over key-only, wildcard config
//! order, wildcards anywhere and several, no backtracking, the last-entry rule,
//! unknown keys and empty descriptors, and the share_threshold bit. The limiter-level
//! rules (replaces, unlimited, overrides, hits_addend) are in `limiter.rs`.

use crate::common;

use common::server::config;
use tollgate::config::Config;
use tollgate::config::matcher::{self, Match};

type Entries<'a> = &'a [(&'a str, &'a str)];

fn find<'c>(config: &'c Config, entries: Entries<'_>) -> Option<Match<'c>> {
    let domain = config.domain("m").expect("domain m");
    matcher::find(domain, entries.iter().copied())
}

/// Asserts, for each `(entries, rule name)`, which named rule the entries land on
/// (`None`: no rule applies).
fn expect_rules(config: &Config, cases: &[(Entries<'_>, Option<&str>)]) {
    for (entries, expected) in cases {
        let got = find(config, entries).map(|m| m.rule.name.as_deref().unwrap_or("<unnamed>"));
        assert_eq!(got, *expected, "descriptor {entries:?}");
    }
}

#[test]
fn exact_beats_wildcard_beats_key_only_whatever_the_config_order() {
    let c = config(
        "domain: m
descriptors:
  - key: k
    rate_limit: {name: key_only, unit: second, requests_per_unit: 1}
  - key: k
    value: a*
    rate_limit: {name: wildcard, unit: second, requests_per_unit: 1}
  - key: k
    value: abc
    rate_limit: {name: exact, unit: second, requests_per_unit: 1}
",
    );
    expect_rules(
        &c,
        &[
            (&[("k", "abc")], Some("exact")),
            (&[("k", "abd")], Some("wildcard")),
            (&[("k", "a")], Some("wildcard")),
            (&[("k", "zzz")], Some("key_only")),
            (&[("k", "")], Some("key_only")),
        ],
    );
}

#[test]
fn first_matching_wildcard_in_config_order_wins() {
    let yaml = |first: &str, second: &str| {
        format!(
            "domain: m
descriptors:
  - key: k
    value: \"{first}\"
    rate_limit: {{name: first, unit: second, requests_per_unit: 1}}
  - key: k
    value: \"{second}\"
    rate_limit: {{name: second, unit: second, requests_per_unit: 1}}
"
        )
    };
    expect_rules(
        &config(&yaml("a*", "ab*")),
        &[(&[("k", "abc")], Some("first"))],
    );
    expect_rules(
        &config(&yaml("ab*", "a*")),
        &[
            (&[("k", "abc")], Some("first")),
            (&[("k", "axc")], Some("second")),
        ],
    );
}

#[test]
fn wildcards_in_the_middle_and_several_stars() {
    let c = config(
        "domain: m
descriptors:
  - key: path
    value: /api/*/users
    rate_limit: {name: middle, unit: second, requests_per_unit: 1}
  - key: path
    value: \"api-*-v*\"
    rate_limit: {name: several, unit: second, requests_per_unit: 1}
  - key: host
    value: \"*.example.com\"
    rate_limit: {name: leading, unit: second, requests_per_unit: 1}
",
    );
    expect_rules(
        &c,
        &[
            (&[("path", "/api/v2/users")], Some("middle")),
            (&[("path", "/api//users")], Some("middle")),
            (&[("path", "/api/v2/groups")], None),
            (&[("path", "api-users-v2")], Some("several")),
            (&[("path", "api-users-2")], None),
            (&[("host", "a.b.example.com")], Some("leading")),
            (&[("host", "example.com")], None),
        ],
    );
}

#[test]
fn no_backtracking_to_the_key_only_branch() {
    let c = config(
        "domain: m
descriptors:
  - key: k
    value: a
    descriptors:
      - key: x
        rate_limit: {name: exact_x, unit: second, requests_per_unit: 1}
  - key: k
    value: w*
    descriptors:
      - key: x
        rate_limit: {name: wild_x, unit: second, requests_per_unit: 1}
  - key: k
    descriptors:
      - key: y
        rate_limit: {name: key_only_y, unit: second, requests_per_unit: 1}
",
    );
    expect_rules(
        &c,
        &[
            (&[("k", "a"), ("x", "1")], Some("exact_x")),
            (&[("k", "b"), ("y", "1")], Some("key_only_y")),
            // `k=a` chose the exact node, whose subtree lacks `y`: no fallback.
            (&[("k", "a"), ("y", "1")], None),
            // Likewise after a wildcard choice.
            (&[("k", "wow"), ("y", "1")], None),
            (&[("k", "wow"), ("x", "1")], Some("wild_x")),
        ],
    );
}

#[test]
fn only_the_last_entry_decides() {
    let c = config(
        "domain: m
descriptors:
  - key: k
    value: a
    descriptors:
      - key: x
        rate_limit: {name: leaf, unit: second, requests_per_unit: 1}
  - key: tenant
    rate_limit: {name: tenant, unit: second, requests_per_unit: 1}
    descriptors:
      - key: user
        rate_limit: {name: user, unit: second, requests_per_unit: 1}
",
    );
    expect_rules(
        &c,
        &[
            // Shorter than the config path: the intermediate node has no limit.
            (&[("k", "a")], None),
            (&[("k", "a"), ("x", "1")], Some("leaf")),
            // Longer than the config path.
            (&[("k", "a"), ("x", "1"), ("z", "2")], None),
            // A limit on an intermediate node applies only to a request ending there.
            (&[("tenant", "t1")], Some("tenant")),
            (&[("tenant", "t1"), ("user", "u")], Some("user")),
            (&[("tenant", "t1"), ("user", "u"), ("more", "m")], None),
            (&[("tenant", "t1"), ("other", "o")], None),
        ],
    );
}

#[test]
fn unknown_key_and_empty_entries_match_nothing() {
    let c = config(
        "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {name: k, unit: second, requests_per_unit: 1}\n",
    );
    expect_rules(
        &c,
        &[
            (&[("nope", "v")], None),
            (&[("nope", "v"), ("k", "v")], None),
            (&[], None),
            (&[("k", "v")], Some("k")),
        ],
    );
}

#[test]
fn share_threshold_sets_the_shared_bit_of_its_entry() {
    let c = config(
        "domain: m
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /shared/*
        share_threshold: true
        rate_limit: {name: shared, unit: second, requests_per_unit: 1}
      - key: path
        value: /own/*
        rate_limit: {name: own, unit: second, requests_per_unit: 1}
",
    );
    let m = find(&c, &[("tenant", "t"), ("path", "/shared/x")]).expect("match");
    assert_eq!(m.rule.name.as_deref(), Some("shared"));
    assert_eq!(m.shared, 0b10);
    let m = find(&c, &[("tenant", "t"), ("path", "/own/x")]).expect("match");
    assert_eq!(m.shared, 0);
}
