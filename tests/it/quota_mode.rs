//! envoyproxy/ratelimit's `quota_mode` (per descriptor) and `QUOTA_MODE` (global) at
//! the limiter: a request is denied only when every one of its quota-mode descriptors
//! is over (any other descriptor over still denies); statuses keep saying which are
//! over; under `QUOTA_MODE` an unmatched descriptor counts as a passing quota one;
//! global shadow mode still answers OK; a request's only quota descriptor vetoes, so
//! the denied request consumes nothing. Memory store, and one case on real Redis.

use crate::common;

use std::sync::Arc;

use common::server::{config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::RateLimitResponse;
use tollgate::proto::rate_limit_response::Code;
use tollgate::settings::{ServeFlags, ServeSettings};
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

const QUOTAS: &str = "domain: q
descriptors:
  - key: service
    value: alpha
    quota_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: service
    value: beta
    quota_mode: true
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: route
    rate_limit: {unit: year, requests_per_unit: 5}
";

fn limiter(store: Arc<dyn Store>, options: LimiterOptions) -> Limiter {
    Limiter::new(config(QUOTAS), store, options)
}

async fn call(limiter: &Limiter, entries: &[&[(&str, &str)]]) -> RateLimitResponse {
    let descriptors = entries.iter().map(|e| descriptor(e)).collect();
    limiter
        .should_rate_limit(&request("q", descriptors))
        .await
        .expect("answered")
}

/// (overall, statuses) as OK/OVER letters, e.g. ("O", "XO").
fn codes(response: &RateLimitResponse) -> (String, String) {
    let letter = |c: i32| {
        if c == Code::OverLimit as i32 {
            'X'
        } else {
            'O'
        }
    };
    (
        letter(response.overall_code).to_string(),
        response.statuses.iter().map(|s| letter(s.code)).collect(),
    )
}

const ALPHA: &[(&str, &str)] = &[("service", "alpha")];
const BETA: &[(&str, &str)] = &[("service", "beta")];

async fn passes_until_every_quota_descriptor_is_over(store: Arc<dyn Store>) {
    let limiter = limiter(store, LimiterOptions::default());
    let both = [ALPHA, BETA];
    assert_eq!(
        codes(&call(&limiter, &both).await),
        ("O".into(), "OO".into())
    );
    // alpha is over, beta is not: still allowed; alpha's status says it is over.
    assert_eq!(
        codes(&call(&limiter, &both).await),
        ("O".into(), "XO".into())
    );
    // beta took its second hit above; now both are over.
    assert_eq!(
        codes(&call(&limiter, &both).await),
        ("X".into(), "XX".into())
    );
}

#[tokio::test]
async fn a_request_passes_until_every_quota_descriptor_is_over() {
    passes_until_every_quota_descriptor_is_over(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn quota_mode_on_redis_answers_as_on_memory() {
    let store = common::stores::standalone("quota_mode").await;
    passes_until_every_quota_descriptor_is_over(Arc::new(store)).await;
}

#[tokio::test]
async fn a_rate_limit_descriptor_over_its_limit_denies_whatever_the_quotas_say() {
    let limiter = limiter(Arc::new(MemoryStore::new()), LimiterOptions::default());
    let user = &[("user", "u")][..];
    assert_eq!(codes(&call(&limiter, &[user]).await).0, "O");
    let answer = call(&limiter, &[user, BETA]).await;
    assert_eq!(codes(&answer), ("X".into(), "XO".into()));
}

#[tokio::test]
async fn a_sole_quota_descriptor_over_its_limit_denies_and_consumes_nothing() {
    let limiter = limiter(Arc::new(MemoryStore::new()), LimiterOptions::default());
    let route = &[("route", "r")][..];
    assert_eq!(codes(&call(&limiter, &[ALPHA]).await).0, "O");
    for _ in 0..3 {
        let answer = call(&limiter, &[ALPHA, route]).await;
        assert_eq!(codes(&answer), ("X".into(), "XO".into()));
    }
    // The three denied requests left route's counter untouched: 5 - 1 remain.
    let alone = call(&limiter, &[route]).await;
    assert_eq!(alone.statuses[0].limit_remaining, 4, "{alone:?}");
}

fn global_quota() -> LimiterOptions {
    LimiterOptions {
        global_quota_mode: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn global_quota_mode_makes_every_descriptor_quota() {
    let limiter = limiter(Arc::new(MemoryStore::new()), global_quota());
    let user = &[("user", "u")][..];
    let route = &[("route", "r")][..];
    assert_eq!(codes(&call(&limiter, &[user]).await).0, "O");
    // user is over, route is not: allowed under QUOTA_MODE (denied without it).
    assert_eq!(
        codes(&call(&limiter, &[user, route]).await),
        ("O".into(), "XO".into())
    );
    assert_eq!(
        codes(&call(&limiter, &[user]).await),
        ("X".into(), "X".into())
    );
}

#[tokio::test]
async fn global_quota_mode_counts_an_unmatched_descriptor_as_passing() {
    let limiter = limiter(Arc::new(MemoryStore::new()), global_quota());
    let user = &[("user", "u")][..];
    let nothing = &[("unknown", "x")][..];
    call(&limiter, &[user]).await;
    assert_eq!(
        codes(&call(&limiter, &[user, nothing]).await),
        ("O".into(), "XO".into())
    );
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_when_every_quota_is_over() {
    let options = LimiterOptions {
        global_shadow_mode: true,
        ..Default::default()
    };
    let limiter = limiter(Arc::new(MemoryStore::new()), options);
    call(&limiter, &[ALPHA]).await;
    assert_eq!(
        codes(&call(&limiter, &[ALPHA]).await),
        ("O".into(), "X".into())
    );
}

#[test]
fn quota_mode_and_response_dynamic_metadata_are_read_from_upstreams_variables() {
    let env = |name: &str| match name {
        "QUOTA_MODE" => Some("true".to_owned()),
        "RESPONSE_DYNAMIC_METADATA" => Some("true".to_owned()),
        _ => None,
    };
    let settings = ServeSettings::resolve(&ServeFlags::default(), &env).expect("resolves");
    assert!(settings.quota_mode && settings.response_dynamic_metadata);
    let none = ServeSettings::resolve(&ServeFlags::default(), &|_| None).expect("resolves");
    assert!(!none.quota_mode && !none.response_dynamic_metadata);
    let bad = |name: &str| (name == "QUOTA_MODE").then(|| "sometimes".to_owned());
    let error = ServeSettings::resolve(&ServeFlags::default(), &bad).unwrap_err();
    assert!(error.to_string().contains("QUOTA_MODE"), "{error}");
}
