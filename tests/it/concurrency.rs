//! The concurrency rule (issue 25): requests in flight, each acquisition a lease of
//! one window unless released (`is_negative_hits`) first, through the limiter on the
//! memory store, standalone Redis and the cluster: C of N admitted, the next as soon
//! as one is released; a denied request's release frees no admitted request's slot
//! (Envoy 1.40 sends it for 429s too); leases nobody releases expire on their own,
//! named ones (`lease_key`) a lease after they were taken whatever the retries,
//! anonymous ones a lease after the last acquisition.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{config, descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::RateLimitDescriptor;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

fn rule(limit: u32, unit: &str) -> String {
    format!(
        "domain: inflight
descriptors:
  - key: backend
    rate_limit: {{unit: {unit}, requests_per_unit: {limit}, algorithm: concurrency}}
"
    )
}

fn acquire() -> RateLimitDescriptor {
    descriptor(&[("backend", "slow")])
}

fn release() -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..acquire()
    }
}

async fn ok(limiter: &Limiter, d: RateLimitDescriptor) -> bool {
    let answer = limiter
        .should_rate_limit(&request("inflight", vec![d]))
        .await
        .expect("answered");
    answer.overall_code == Code::Ok as i32
}

async fn store(kind: &str, test: &str) -> Arc<dyn Store> {
    match kind {
        "memory" => Arc::new(MemoryStore::new()),
        "standalone" => Arc::new(common::stores::standalone(test).await),
        _ => Arc::new(common::stores::cluster(test).await),
    }
}

const STORES: [&str; 3] = ["memory", "standalone", "cluster"];

#[tokio::test]
async fn c_of_n_are_admitted_and_a_release_admits_the_next() {
    for kind in STORES {
        let test = format!("inflight_{kind}");
        let limiter = Limiter::new(
            config(&rule(3, "hour")),
            store(kind, &test).await,
            LimiterOptions::default(),
        );
        let mut admitted = Vec::new();
        for _ in 0..5 {
            admitted.push(ok(&limiter, acquire()).await);
        }
        assert_eq!(admitted, [true, true, true, false, false], "{test}");
        // The two denied requests' releases (Envoy sends them for 429s too): the
        // three admitted still hold their slots.
        for _ in 0..2 {
            assert!(ok(&limiter, release()).await, "{test}: never denied");
        }
        assert!(
            !ok(&limiter, acquire()).await,
            "{test}: still three in flight"
        );
        // That denied one's release, then one admitted request finishes.
        assert!(ok(&limiter, release()).await);
        assert!(ok(&limiter, release()).await);
        assert!(ok(&limiter, acquire()).await, "{test}: a slot was free");
        assert!(!ok(&limiter, acquire()).await, "{test}: and only one");
        // Releases past zero change nothing.
        for _ in 0..10 {
            assert!(ok(&limiter, release()).await);
        }
        for _ in 0..3 {
            assert!(ok(&limiter, acquire()).await, "{test}");
        }
        assert!(!ok(&limiter, acquire()).await, "{test}");
    }
}

/// The same limit with named leases (`lease_key`): the request's id is the last
/// entry, out of the counter.
fn named_rule(limit: u32, lease: &str) -> String {
    format!(
        "domain: inflight
descriptors:
  - key: backend
    descriptors:
      - key: request_id
        rate_limit: {{lease: {lease}, requests_per_unit: {limit}, algorithm: concurrency, lease_key: request_id}}
"
    )
}

fn named(id: &str, release: bool) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: release,
        ..descriptor(&[("backend", "slow"), ("request_id", id)])
    }
}

fn check() -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(0),
        ..acquire()
    }
}

/// What a slot's return may take past its lease's end here: the 100 ms poll and a
/// loaded 2-core machine's scheduling.
const SLACK: Duration = Duration::from_secs(1);

/// An Envoy killed mid-request never releases: its named leases (one second here)
/// expire a lease after they were taken, however the tenant keeps retrying meanwhile
/// (each retry its own id, refused, and released at once as Envoy does).
#[tokio::test]
async fn named_leases_nobody_releases_expire_at_the_lease_whatever_the_retries() {
    for kind in STORES {
        let test = format!("named_leases_expire_{kind}");
        let limiter = Limiter::new(
            config(&named_rule(2, "1s")),
            store(kind, &test).await,
            LimiterOptions::default(),
        );
        let before = Instant::now();
        assert!(ok(&limiter, named("dead1", false)).await);
        assert!(ok(&limiter, named("dead2", false)).await);
        let taken = Instant::now();
        let mut retry = 0;
        let back = loop {
            retry += 1;
            let id = format!("retry{retry}");
            if ok(&limiter, named(&id, false)).await {
                break Instant::now();
            }
            assert!(ok(&limiter, named(&id, true)).await);
            assert!(
                taken.elapsed() < Duration::from_secs(1) + SLACK,
                "{test}: not back {:?} after the leases were taken",
                taken.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            back >= before + Duration::from_secs(1),
            "{test}: back {:?} after, before the lease",
            back - before
        );
        assert!(retry > 3, "{test}: retried while held ({retry})");
    }
}

/// Anonymous leases (no `lease_key`) keep the limit by giving back the earliest lease
/// on a release, and pay for it as docs/budgets.md states: a dead Envoy's leases are
/// renewed by a tenant's retries (each leaves its own newer lease behind), and come
/// back a lease after the last acquisition (a second, rounded up to the next whole
/// second, here).
#[tokio::test]
async fn anonymous_leases_expire_a_lease_after_the_last_acquisition() {
    for kind in STORES {
        let test = format!("leases_expire_{kind}");
        let limiter = Limiter::new(
            config(&rule(2, "second")),
            store(kind, &test).await,
            LimiterOptions::default(),
        );
        assert!(ok(&limiter, acquire()).await && ok(&limiter, acquire()).await);
        // Retries for three leases: each refused, released at once.
        let retrying = Instant::now();
        while retrying.elapsed() < Duration::from_secs(3) {
            assert!(
                !ok(&limiter, acquire()).await,
                "{test}: still held while retried"
            );
            assert!(ok(&limiter, release()).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Then nothing but checks, which take no lease.
        let last = Instant::now();
        let back = loop {
            if ok(&limiter, check()).await {
                break Instant::now();
            }
            assert!(
                last.elapsed() < Duration::from_secs(2) + SLACK,
                "{test}: not back {:?} after the last acquisition",
                last.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(ok(&limiter, acquire()).await, "{test}: a slot is free");
        assert!(back >= last, "{test}");
    }
}

#[test]
fn overdraft_is_refused_on_a_concurrency_rule() {
    let yaml = rule(3, "minute").replace(
        "  - key: backend\n",
        "  - key: backend\n    overdraft: true\n",
    );
    let errors = tollgate::config::load_sources(&[(std::path::Path::new("c.yaml"), yaml.as_str())])
        .expect_err("refused");
    assert!(
        errors
            .to_string()
            .contains("overdraft: not defined for algorithm 'concurrency'"),
        "{errors}"
    );
}

/// The window of a concurrency rule, as the config compiles it.
fn lease_of(rate_limit: &str) -> Result<std::time::Duration, String> {
    let yaml =
        format!("domain: inflight\ndescriptors:\n  - key: backend\n    rate_limit: {rate_limit}\n");
    let config = tollgate::config::load_sources(&[(std::path::Path::new("c.yaml"), yaml.as_str())])
        .map_err(|e| e.to_string())?;
    let domain = config.domain("inflight").expect("the domain");
    let tollgate::config::RuleKind::Limited(limits) = &domain.rules[0].kind else {
        panic!("a limited rule");
    };
    Ok(std::time::Duration::from_secs(limits[0].window_secs()))
}

/// `lease` is a concurrency rule's window: a duration, five minutes when none is
/// given, `unit` x `unit_multiplier` still accepted; a lease on any other algorithm,
/// a lease beside a unit, or a lease that is not whole seconds is one clear error.
#[test]
fn the_lease_is_the_window_five_minutes_unless_given() {
    let secs = std::time::Duration::from_secs;
    let c = "algorithm: concurrency, requests_per_unit: 8";
    assert_eq!(lease_of(&format!("{{{c}}}")), Ok(secs(300)));
    assert_eq!(lease_of(&format!("{{{c}, lease: 90s}}")), Ok(secs(90)));
    assert_eq!(lease_of(&format!("{{{c}, lease: 2m}}")), Ok(secs(120)));
    assert_eq!(
        lease_of(&format!("{{{c}, unit: minute, unit_multiplier: 5}}")),
        Ok(secs(300))
    );
    for (rate_limit, needle) in [
        (
            format!("{{{c}, lease: 90s, unit: minute}}"),
            "c.yaml:4: descriptor 'backend': rate_limit.lease: the lease is a concurrency rule's window: give a lease or a unit, not both",
        ),
        (
            format!("{{{c}, lease: 1500ms}}"),
            "rate_limit.lease: '1500ms' is not a whole number of seconds",
        ),
        (
            "{unit: minute, requests_per_unit: 8, lease: 90s}".to_string(),
            "rate_limit.lease: only concurrency take a lease",
        ),
    ] {
        let error = lease_of(&rate_limit).expect_err("refused");
        assert!(error.contains(needle), "{rate_limit}: {error}");
    }
}

/// `lease_key` names the rule's own key, a node without a value, on a rule that takes
/// a lease: anything else is one clear error at its line. A rule that keeps it counts
/// every id on one counter: one slot each, one counter.
#[test]
fn lease_key_is_the_rules_own_key_only_node() {
    let load = |yaml: &str| {
        tollgate::config::load_sources(&[(std::path::Path::new("c.yaml"), yaml)])
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(load(&named_rule(3, "30s")), Ok(()));
    let c = "algorithm: concurrency, requests_per_unit: 3";
    for (yaml, needle) in [
        (
            format!("domain: d\ndescriptors:\n  - key: backend\n    descriptors:\n      - key: request_id\n        value: fixed\n        rate_limit: {{{c}, lease_key: request_id}}\n"),
            "c.yaml:7: descriptor 'backend.request_id_fixed': rate_limit.lease_key: 'request_id' must be this descriptor's own key, with no value (this descriptor has a value)",
        ),
        (
            format!("domain: d\ndescriptors:\n  - key: backend\n    rate_limit: {{{c}, lease_key: request_id}}\n"),
            "c.yaml:4: descriptor 'backend': rate_limit.lease_key: 'request_id' must be this descriptor's own key, with no value (this descriptor's key is 'backend')",
        ),
        (
            "domain: d\ndescriptors:\n  - key: id\n    rate_limit: {unit: minute, requests_per_unit: 3, lease_key: id}\n".to_owned(),
            "rate_limit.lease_key: only concurrency take a lease",
        ),
    ] {
        let error = load(&yaml).expect_err("refused");
        assert!(error.contains(needle), "{yaml}\n{error}");
    }
}

/// Every request of a tenant counts on one counter, each id its own lease in it.
#[tokio::test]
async fn named_leases_share_the_tenants_counter() {
    let limiter = Limiter::new(
        config(&named_rule(2, "1h")),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    );
    assert!(ok(&limiter, named("a", false)).await);
    assert!(ok(&limiter, named("b", false)).await);
    assert!(!ok(&limiter, named("c", false)).await, "one counter: full");
    assert!(ok(&limiter, named("a", true)).await);
    assert!(
        ok(&limiter, named("d", false)).await,
        "a's slot, freed by a"
    );
    let other = RateLimitDescriptor {
        ..descriptor(&[("backend", "other"), ("request_id", "e")])
    };
    assert!(
        ok(&limiter, other).await,
        "another backend, another counter"
    );
}
