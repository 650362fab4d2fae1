//! envoyproxy/ratelimit's matching semantics (docs/configuration.md) at the limiter, in process (`Limiter` over a `MemoryStore` with
//! a `ManualClock`): replaces, unlimited, Envoy's limit override, request- and
//! descriptor-level hits_addend, a denied request consuming nothing, two descriptors
//! on one counter, per-rule and global shadow mode, epoch-aligned fixed windows, and
//! wildcard counters (distinct per value unless share_threshold). The matcher rules
//! themselves are in `matching.rs`.

use crate::common;

use std::sync::Arc;

use common::server::{config, descriptor, request};
use tollgate::clock::ManualClock;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::envoy::r#type::v3::RateLimitUnit;
use tollgate::proto::rate_limit_descriptor::RateLimitOverride;
use tollgate::proto::rate_limit_response::rate_limit::Unit as ProtoUnit;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tollgate::store::memory::MemoryStore;

/// 2023-11-14T22:13:20Z; its offset in the current minute and hour are asserted where
/// they matter.
const T0_SECS: u64 = 1_700_000_000;

struct Harness {
    clock: Arc<ManualClock>,
    limiter: Limiter,
}

fn harness(yaml: &str, options: LimiterOptions) -> Harness {
    let clock = Arc::new(ManualClock::new(T0_SECS * 1000));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    Harness {
        clock,
        limiter: Limiter::new(config(yaml), store, options),
    }
}

impl Harness {
    async fn call(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.limiter
            .should_rate_limit(&request)
            .await
            .unwrap_or_else(|e| panic!("request refused: {e}"))
    }

    /// One request of the given descriptors in domain `l`.
    async fn check(&self, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
        self.call(request("l", descriptors)).await
    }

    /// One single-descriptor request; returns its status.
    async fn one(&self, entries: &[(&str, &str)]) -> DescriptorStatus {
        self.check(vec![descriptor(entries)]).await.statuses[0].clone()
    }
}

fn ok(s: &DescriptorStatus) -> bool {
    s.code == Code::Ok as i32
}

fn over(s: &DescriptorStatus) -> bool {
    s.code == Code::OverLimit as i32
}

fn reset(s: &DescriptorStatus) -> i64 {
    s.duration_until_reset
        .expect("duration_until_reset")
        .seconds
}

fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(hits),
        ..descriptor(entries)
    }
}

const LIMITS: &str = "domain: l
descriptors:
  - key: plan
    value: standard
    rate_limit: {name: standard, unit: hour, requests_per_unit: 1}
  - key: plan
    value: premium
    rate_limit:
      name: premium
      unit: hour
      requests_per_unit: 1000
      replaces: [{name: standard}]
  - key: tier
    value: basic
    rate_limit: {name: basic, unit: hour, requests_per_unit: 1}
  - key: tier
    value: pro
    rate_limit: {name: pro, unit: hour, requests_per_unit: 3, replaces: [{name: basic}]}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: unl
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {name: shadowed, unit: hour, requests_per_unit: 1}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /shared/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";

#[tokio::test]
async fn replaces_drops_the_named_rule_and_leaves_others_alone() {
    let h = harness(LIMITS, LimiterOptions::default());
    let descriptors = || {
        vec![
            descriptor(&[("plan", "standard")]),
            descriptor(&[("plan", "premium")]),
            descriptor(&[("other", "x")]),
        ]
    };
    for round in 1..=3u32 {
        let r = h.check(descriptors()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "round {round}: {r:?}");
        let [standard, premium, other] = &r.statuses[..] else {
            panic!("three statuses: {r:?}");
        };
        // The replaced rule is answered as if unmatched: it neither counts nor vetoes,
        // so its 1/hour never refuses the request.
        assert!(
            ok(standard) && standard.current_limit.is_none(),
            "{standard:?}"
        );
        assert_eq!(premium.current_limit.as_ref().unwrap().name, "premium");
        assert_eq!(premium.limit_remaining, 1000 - round, "round {round}");
        assert!(ok(other) && other.current_limit.is_some());
        assert_eq!(other.limit_remaining, 10 - round, "round {round}");
    }
    // Alone, `standard` is still a limit of its own.
    assert_eq!(h.one(&[("plan", "standard")]).await.limit_remaining, 0);
}

#[tokio::test]
async fn the_replacing_limit_is_still_enforced() {
    let h = harness(LIMITS, LimiterOptions::default());
    let mut overall = Vec::new();
    for _ in 0..5 {
        let d = vec![
            descriptor(&[("tier", "basic")]),
            descriptor(&[("tier", "pro")]),
        ];
        overall.push(Code::try_from(h.check(d).await.overall_code).unwrap());
    }
    // `pro` is 3/hour: exactly three requests pass, whatever `basic` (replaced) says.
    use Code::{Ok as OK, OverLimit as OVER};
    assert_eq!(overall, [OK, OK, OK, OVER, OVER]);
}

#[tokio::test]
async fn unlimited_is_ok_with_max_remaining_and_no_limit() {
    let h = harness(LIMITS, LimiterOptions::default());
    for _ in 0..3 {
        let s = h.one(&[("unl", "x")]).await;
        assert!(ok(&s));
        assert_eq!(s.limit_remaining, 4_294_967_295);
        assert_eq!(s.current_limit, None);
    }
}

fn override_limit(requests_per_unit: u32, unit: i32) -> Option<RateLimitOverride> {
    Some(RateLimitOverride {
        requests_per_unit,
        unit,
    })
}

#[tokio::test]
async fn envoy_limit_override_replaces_the_configured_limit() {
    let h = harness(LIMITS, LimiterOptions::default());
    let d = RateLimitDescriptor {
        limit: override_limit(2, RateLimitUnit::Minute as i32),
        ..descriptor(&[("other", "o")])
    };
    let s = h.check(vec![d.clone()]).await.statuses[0].clone();
    let limit = s.current_limit.expect("override is reported");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, ProtoUnit::Minute as i32)
    );
    assert_eq!(s.limit_remaining, 1);
    assert!(ok(&h.check(vec![d.clone()]).await.statuses[0]));
    assert!(over(&h.check(vec![d.clone()]).await.statuses[0]));
    // The override applies even where no rule matches, as long as the domain is known.
    let unmatched = RateLimitDescriptor {
        limit: override_limit(1, RateLimitUnit::Hour as i32),
        ..descriptor(&[("no_such_key", "v")])
    };
    assert_eq!(
        h.check(vec![unmatched]).await.statuses[0].limit_remaining,
        0
    );
    // Unknown domain: still OK, no limit.
    let mut unknown = request("nope", vec![d.clone()]);
    let r = h.call(unknown.clone()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].current_limit, None);
    // Unit 0 (UNKNOWN) is not a limit: INVALID_ARGUMENT, in a known domain.
    unknown.domain = "l".into();
    unknown.descriptors[0].limit = override_limit(5, 0);
    let err = tonic::Status::from(h.limiter.should_rate_limit(&unknown).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
}

/// As envoyproxy/ratelimit keys counters (domain, the request's entries, the window
/// start: not the limit), an override of the configured unit counts on the configured
/// limit's counter; one of another unit has its own.
#[tokio::test]
async fn an_override_of_the_same_unit_shares_the_configured_counter() {
    let h = harness(LIMITS, LimiterOptions::default());
    let configured = || descriptor(&[("other", "shared")]);
    let overridden = |rpu, unit: RateLimitUnit| RateLimitDescriptor {
        limit: override_limit(rpu, unit as i32),
        ..configured()
    };
    for remaining in [9, 8, 7] {
        let s = h.check(vec![configured()]).await.statuses[0].clone();
        assert_eq!(s.limit_remaining, remaining);
    }
    // 3 of the hour's hits are spent: an override of 5 per hour has 2 left.
    let s = h
        .check(vec![overridden(5, RateLimitUnit::Hour)])
        .await
        .statuses[0]
        .clone();
    assert_eq!((ok(&s), s.limit_remaining), (true, 1), "{s:?}");
    assert!(ok(&h
        .check(vec![overridden(5, RateLimitUnit::Hour)])
        .await
        .statuses[0]));
    assert!(over(
        &h.check(vec![overridden(5, RateLimitUnit::Hour)])
            .await
            .statuses[0]
    ));
    // The configured limit sees the override's hits (the denied one consumed nothing).
    assert_eq!(h.one(&[("other", "shared")]).await.limit_remaining, 4);
    // Another unit is another window: a counter of its own, as upstream's key says.
    let s = h
        .check(vec![overridden(5, RateLimitUnit::Minute)])
        .await
        .statuses[0]
        .clone();
    assert_eq!(s.limit_remaining, 4, "{s:?}");
}

#[tokio::test]
async fn request_hits_addend_zero_means_one() {
    let h = harness(LIMITS, LimiterOptions::default());
    let mut r = request("l", vec![descriptor(&[("other", "h")])]);
    r.hits_addend = 0;
    assert_eq!(h.call(r.clone()).await.statuses[0].limit_remaining, 9);
    r.hits_addend = 3;
    assert_eq!(h.call(r.clone()).await.statuses[0].limit_remaining, 6);
    r.hits_addend = 7;
    let resp = h.call(r).await;
    assert_eq!(resp.overall_code, Code::OverLimit as i32);
    assert_eq!(h.one(&[("other", "h")]).await.limit_remaining, 5);
}

#[tokio::test]
async fn descriptor_hits_addend_wins_and_zero_only_checks() {
    let h = harness(LIMITS, LimiterOptions::default());
    let mut r = request("l", vec![with_hits(&[("other", "d")], 2)]);
    r.hits_addend = 5;
    assert_eq!(h.call(r.clone()).await.statuses[0].limit_remaining, 8);
    r.descriptors[0].hits_addend = Some(0);
    for _ in 0..3 {
        let s = h.call(r.clone()).await.statuses[0].clone();
        assert!(ok(&s));
        assert_eq!(s.limit_remaining, 8);
    }
    assert_eq!(h.one(&[("other", "d")]).await.limit_remaining, 7);
}

#[tokio::test]
async fn a_denied_request_consumes_none_of_its_counters() {
    let h = harness(LIMITS, LimiterOptions::default());
    assert!(ok(&h.one(&[("small", "s")]).await));
    let r = h
        .check(vec![
            descriptor(&[("other", "a")]),
            descriptor(&[("small", "s")]),
        ])
        .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert!(ok(&r.statuses[0]) && over(&r.statuses[1]), "{r:?}");
    // `other=a` was not consumed by the denied request.
    assert_eq!(h.one(&[("other", "a")]).await.limit_remaining, 9);
}

#[tokio::test]
async fn two_descriptors_on_one_counter_add_up() {
    let h = harness(LIMITS, LimiterOptions::default());
    let r = h
        .check(vec![
            descriptor(&[("other", "same")]),
            with_hits(&[("other", "same")], 3),
        ])
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    assert_eq!(r.statuses[1].limit_remaining, 6);
    assert_eq!(h.one(&[("other", "same")]).await.limit_remaining, 5);
}

#[tokio::test]
async fn rule_shadow_mode_reports_ok_and_lets_others_count() {
    let h = harness(LIMITS, LimiterOptions::default());
    assert!(ok(&h.one(&[("shadow", "s")]).await));
    let r = h
        .check(vec![
            descriptor(&[("shadow", "s")]),
            descriptor(&[("other", "b")]),
        ])
        .await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    let shadow = &r.statuses[0];
    assert!(ok(shadow), "{shadow:?}");
    assert_eq!(shadow.limit_remaining, 0);
    assert_eq!(shadow.current_limit.as_ref().unwrap().name, "shadowed");
    assert_eq!(r.statuses[1].limit_remaining, 9);
    assert_eq!(h.one(&[("other", "b")]).await.limit_remaining, 8);
}

#[tokio::test]
async fn global_shadow_mode_keeps_statuses_but_answers_ok() {
    let options = LimiterOptions {
        global_shadow_mode: true,
        ..Default::default()
    };
    let h = harness(LIMITS, options);
    assert!(ok(&h.one(&[("small", "g")]).await));
    let r = h.check(vec![descriptor(&[("small", "g")])]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(over(&r.statuses[0]), "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn fixed_windows_are_aligned_to_the_epoch() {
    let h = harness(LIMITS, LimiterOptions::default());
    // 1_700_000_000 = 28_333_333 minutes + 20 s; 472_222 hours + 800 s.
    assert_eq!(T0_SECS % 60, 20);
    h.clock.advance_millis(999);
    let s = h.one(&[("minute", "w")]).await;
    assert_eq!((s.limit_remaining, reset(&s)), (1, 40));
    let s = h.one(&[("other", "w")]).await;
    assert_eq!(reset(&s), 3600 - 800);
    h.clock.advance_millis(38_000);
    let s = h.one(&[("minute", "w")]).await;
    assert_eq!((s.limit_remaining, reset(&s)), (0, 2));
    // One millisecond before the boundary: same window, denied.
    h.clock.set_millis((T0_SECS + 40) * 1000 - 1);
    let s = h.one(&[("minute", "w")]).await;
    assert!(over(&s));
    assert_eq!(reset(&s), 1);
    // On the boundary: a fresh window, a full window to go.
    h.clock.set_millis((T0_SECS + 40) * 1000);
    let s = h.one(&[("minute", "w")]).await;
    assert!(ok(&s));
    assert_eq!((s.limit_remaining, reset(&s)), (1, 60));
}

#[tokio::test]
async fn wildcard_values_count_apart_unless_shared() {
    let h = harness(LIMITS, LimiterOptions::default());
    assert!(ok(&h.one(&[("path", "/api/a")]).await));
    assert!(ok(&h.one(&[("path", "/api/b")]).await));
    assert!(over(&h.one(&[("path", "/api/a")]).await));
    assert!(ok(&h.one(&[("path", "/shared/a")]).await));
    assert!(over(&h.one(&[("path", "/shared/b")]).await));
    assert!(over(&h.one(&[("path", "/shared/a")]).await));
}
