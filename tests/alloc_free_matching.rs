//! Matching allocates nothing: a counting global allocator watches
//! `tollgate::config::matcher::find` (and the domain lookup and `plan::resolve` around it)
//! walk a realistic config (`benches/config/bench.yaml`: exact values, wildcards,
//! key-only nodes, nested descriptors, a shared wildcard, no match at all) and
//! counts zero heap allocations.
//!
//! Counting is per thread (a thread-local switch), so the test harness's other
//! threads cannot disturb it.
//!
//! Its own test binary: a `#[global_allocator]` is process-wide, and in the shared
//! binary (`tests/it`) it would sit under every other suite's allocations.

// A counting global allocator is unsafe by nature (GlobalAlloc is an unsafe trait).
#![allow(unsafe_code)]

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::path::Path;

use tollgate::config::matcher;
use tollgate::limiter::plan::{self, Plan};
use tollgate::proto::RateLimitDescriptor;
use tollgate::proto::rate_limit_descriptor::Entry;

use counting_alloc::{Counting, allocations};

#[global_allocator]
static GLOBAL: Counting = Counting;

const CONFIG: &str = include_str!("../benches/config/bench.yaml");

/// A request descriptor's entries, and the rule path it must land on (None: no limit).
type Case = (
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

const CASES: &[Case] = &[
    (&[("key", "v12345")], Some("key")),
    (&[("key", "hot")], Some("key_hot")),
    (
        &[("remote_address", "10.0.0.1")],
        Some("remote_address_10.0.0.1"),
    ),
    (
        &[("remote_address", "192.168.4.2")],
        Some("remote_address_192.168.*"),
    ),
    (&[("remote_address", "172.16.0.9")], Some("remote_address")),
    (&[("path", "/static/app.js")], Some("path_/static/*")),
    (&[("path", "/api/users/v2")], Some("path_/api/*/v*")),
    (&[("path", "/other")], None),
    (&[("tenant_id", "acme")], Some("tenant_id")),
    (
        &[("tenant_id", "acme"), ("api_key", "k-42")],
        Some("tenant_id.api_key"),
    ),
    (
        &[("tenant_id", "acme"), ("route", "/admin/users")],
        Some("tenant_id.route_/admin*"),
    ),
    (&[("tenant_id", "acme"), ("route", "/public")], None),
    (
        &[("tenant_id", "bigcorp"), ("api_key", "k-1")],
        Some("tenant_id_bigcorp.api_key"),
    ),
    (
        &[("tenant_id", "acme"), ("api_key", "k"), ("deeper", "x")],
        None,
    ),
    (&[("unknown", "x")], None),
];

#[test]
fn matching_allocates_nothing() {
    let config = tollgate::config::load_sources(&[(Path::new("bench.yaml"), CONFIG)])
        .unwrap_or_else(|errors| panic!("bench.yaml does not load: {errors}"));
    const ROUNDS: usize = 100;
    // Room for every result up front, so the only possible allocations are matching's.
    let mut found: Vec<Option<&str>> = Vec::with_capacity(ROUNDS * CASES.len());
    let (_, n) = allocations(|| {
        for _ in 0..ROUNDS {
            for (entries, _) in CASES {
                let domain = config.domain("bench").expect("domain bench");
                let m = matcher::find(domain, entries.iter().copied());
                found.push(m.map(|m| &*m.rule.path));
            }
        }
    });
    assert_eq!(
        n,
        0,
        "matching allocated {n} time(s) in {} lookups",
        found.len()
    );
    for ((entries, expected), got) in CASES.iter().zip(&found) {
        assert_eq!(got, expected, "{entries:?}");
    }
    let shared = config
        .domain("bench")
        .and_then(|domain| matcher::find(domain, [("path", "/api/orders/v1")]));
    assert_eq!(
        shared.map(|m| m.shared),
        Some(1),
        "the shared wildcard is marked"
    );
}

#[test]
fn resolving_a_configured_descriptor_allocates_nothing() {
    let config = tollgate::config::load_sources(&[(Path::new("bench.yaml"), CONFIG)])
        .unwrap_or_else(|errors| panic!("bench.yaml does not load: {errors}"));
    let descriptors: Vec<RateLimitDescriptor> = CASES
        .iter()
        .map(|(entries, _)| RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let domain = config.domain("bench").expect("domain bench");
    let (limited, n) = allocations(|| {
        let mut limited = 0;
        for (i, d) in descriptors.iter().enumerate() {
            if let Ok(Plan::Limited { .. }) = plan::resolve(domain, i, d) {
                limited += 1;
            }
        }
        limited
    });
    assert_eq!(n, 0, "plan::resolve allocated {n} time(s)");
    assert!(limited >= 8, "only {limited} descriptors were limited");
}

#[test]
fn the_counter_proves_it_counts() {
    let (_, n) = allocations(|| std::hint::black_box(vec![1u8; 16]));
    assert!(n >= 1, "the counting allocator saw no allocation");
}
