//! The concurrency rule (issue 25): requests in flight, each acquisition a lease of
//! one window unless released (`is_negative_hits`) first, through the limiter on the
//! memory store, standalone Redis and the cluster: C of N admitted, the next as soon
//! as one is released; a denied request's release frees no admitted request's slot
//! (Envoy 1.40 sends it for 429s too); leases nobody releases expire on their own.

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

/// An Envoy killed mid-request never releases: its leases (one second here) expire.
#[tokio::test]
async fn leases_nobody_releases_expire_within_the_lease() {
    for kind in STORES {
        let test = format!("leases_expire_{kind}");
        let limiter = Limiter::new(
            config(&rule(2, "second")),
            store(kind, &test).await,
            LimiterOptions::default(),
        );
        let start = Instant::now();
        assert!(ok(&limiter, acquire()).await && ok(&limiter, acquire()).await);
        assert!(!ok(&limiter, acquire()).await, "{test}: two held");
        // A lease lasts its time rounded up to the second: free within 2 s of the
        // acquisition, awaited as a condition. A denied try takes a lease too, and
        // gives it back at once, as Envoy's stream-done release does.
        let deadline = start + Duration::from_secs(10);
        loop {
            if ok(&limiter, acquire()).await {
                break;
            }
            assert!(ok(&limiter, release()).await);
            assert!(Instant::now() < deadline, "{test}: leases never expired");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(900),
            "{test}: freed after {:?}, before the lease",
            start.elapsed()
        );
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
