//! Budgets that hold (issue 25): charges after the response, check-only calls and
//! releases, through the limiter on the memory store, standalone Redis and the
//! cluster, for every algorithm each case is defined on.
//!
//! - `overdraft: true`: 50 rounds of "check (descriptor hits_addend 0), then charge
//!   300" on a budget of 1000 spend 1200: the budget and less than one charge more
//!   (today's limit mode spent 15,000); the charge that overdraws is counted,
//!   `remaining` is 0 while overdrawn and the next check is denied.
//! - A descriptor's own hits_addend 0 consumes nothing; the request's 0 means 1.
//! - `is_negative_hits` gives hits back, never below zero, never OVER_LIMIT, and is
//!   counted in its own metric; where an algorithm gives nothing back it is ignored
//!   and counted as such.
//! - `overdraft` and `quota_mode` are refused at load where a charge has no meaning.

use crate::common;

use std::sync::Arc;

use common::server::{config, descriptor, request};
use tollgate::algorithm::Algorithm;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitResponse};
use tollgate::settings::{ServeFlags, ServeSettings};
use tollgate::store::Store;
use tollgate::store::memory::MemoryStore;

/// The algorithms a charge is defined on.
fn charging() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| a.charge_refusal().is_none())
}

/// A budget of `limit` per hour on `tenant`, with `extra` descriptor keys.
fn budget(algorithm: Algorithm, limit: u64, extra: &str) -> String {
    budget_per("hour", algorithm, limit, extra)
}

/// [`budget`] per `unit`.
fn budget_per(unit: &str, algorithm: Algorithm, limit: u64, extra: &str) -> String {
    format!(
        "domain: budget
descriptors:
  - key: tenant
{extra}    rate_limit: {{unit: {unit}, requests_per_unit: {limit}, algorithm: {}}}
",
        algorithm.name()
    )
}

fn tenant(hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: hits,
        ..descriptor(&[("tenant", "acme")])
    }
}

fn release(hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..tenant(Some(hits))
    }
}

async fn ask(limiter: &Limiter, d: RateLimitDescriptor) -> RateLimitResponse {
    limiter
        .should_rate_limit(&request("budget", vec![d]))
        .await
        .expect("answered")
}

fn ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

fn remaining(response: &RateLimitResponse) -> u32 {
    response.statuses[0].limit_remaining
}

/// The store under test, fresh per algorithm (a prefix of its own on Redis).
async fn store(kind: &str, test: &str) -> Arc<dyn Store> {
    match kind {
        "memory" => Arc::new(MemoryStore::new()),
        "standalone" => Arc::new(common::stores::standalone(test).await),
        _ => Arc::new(common::stores::cluster(test).await),
    }
}

const STORES: [&str; 3] = ["memory", "standalone", "cluster"];

/// 50 rounds of "check, then charge N" on a budget of 1000: what was spent.
async fn spend(limiter: &Limiter, charge: u64) -> u64 {
    let mut spent = 0;
    for _ in 0..50 {
        if !ok(&ask(limiter, tenant(Some(0))).await) {
            continue;
        }
        // The response's cost, charged after it: its answer is not enforced.
        ask(limiter, tenant(Some(charge))).await;
        spent += charge;
    }
    spent
}

#[tokio::test]
async fn an_overdraft_budget_spends_its_limit_plus_one_charge() {
    for kind in STORES {
        for algorithm in charging() {
            for charge in [300, 600, 1001] {
                let test = format!("overdraft_{kind}_{}_{charge}", algorithm.name());
                // A year: no window ends and no bucket refills (1000 a year is 0.00003
                // a second) while the rounds run, so what was spent is exact.
                let yaml = budget_per("year", algorithm, 1000, "    overdraft: true\n");
                let limiter = Limiter::new(
                    config(&yaml),
                    store(kind, &test).await,
                    LimiterOptions::default(),
                );
                let spent = spend(&limiter, charge).await;
                eprintln!("{test}: {spent} tokens spent in 50 rounds");
                // Checks pass while something remains, so the budget is spent, and
                // the last charge's check saw less than the budget: one charge past
                // it, never two (1001 twice is 2002, and 2002 - 1001 is not below
                // 1000).
                assert!(
                    spent >= 1000 && spent - charge < 1000,
                    "{test}: {spent} spent in charges of {charge}: expected the budget \
                     of 1000 spent and overdrawn by less than one charge"
                );
                assert_eq!(spent, 1000_u64.div_ceil(charge) * charge, "{test}");
                // Overdrawn: remaining 0, the next check denied, its reset in the future.
                let check = ask(&limiter, tenant(Some(0))).await;
                assert!(!ok(&check), "{test}: {check:?}");
                assert_eq!(remaining(&check), 0, "{test}");
                let reset = check.statuses[0].duration_until_reset.expect("a reset");
                assert!(reset.seconds > 0, "{test}: {reset:?}");
            }
        }
    }
}

/// Without overdraft a charge above what remains is refused and consumes nothing, so
/// checks keep passing: the behaviour the issue measured, kept as the default.
#[tokio::test]
async fn without_overdraft_a_refused_charge_consumes_nothing() {
    let limiter = Limiter::new(
        config(&budget(Algorithm::FixedWindow, 1000, "")),
        Arc::new(MemoryStore::new()),
        LimiterOptions::default(),
    );
    assert_eq!(spend(&limiter, 300).await, 15_000);
}

#[tokio::test]
async fn the_deployment_wide_setting_makes_a_domain_overdraft() {
    let options = LimiterOptions {
        overdraft_domains: vec!["other".into(), "budget".into()],
        ..Default::default()
    };
    let limiter = Limiter::new(
        config(&budget(Algorithm::FixedWindow, 1000, "")),
        Arc::new(MemoryStore::new()),
        options,
    );
    assert_eq!(spend(&limiter, 300).await, 1200);

    let env = |name: &str| (name == "OVERDRAFT_DOMAINS").then(|| "a, budget".to_owned());
    let settings = ServeSettings::resolve(&ServeFlags::default(), &env).expect("resolves");
    assert_eq!(settings.overdraft_domains, ["a", "budget"]);
    let none = ServeSettings::resolve(&ServeFlags::default(), &|_| None).expect("resolves");
    assert!(none.overdraft_domains.is_empty());
}

/// An overdraft charge is admitted while something remained before it: 10 of 8
/// passes (and is counted), the next check of 0 is denied, a charge too.
#[tokio::test]
async fn an_overdraft_charge_overdraws_once_then_waits() {
    for kind in STORES {
        for algorithm in charging() {
            let test = format!("overdraw_once_{kind}_{}", algorithm.name());
            let limiter = Limiter::new(
                config(&budget(algorithm, 10, "    overdraft: true\n")),
                store(kind, &test).await,
                LimiterOptions::default(),
            );
            let first = ask(&limiter, tenant(Some(8))).await;
            assert!(ok(&first), "{test}: {first:?}");
            assert_eq!(remaining(&first), 2, "{test}");
            let over = ask(&limiter, tenant(Some(10))).await;
            assert!(ok(&over), "{test}: 2 remained before it: {over:?}");
            assert_eq!(remaining(&over), 0, "{test}: overdrawn");
            let next = ask(&limiter, tenant(Some(1))).await;
            assert!(!ok(&next), "{test}: {next:?}");
            // The denied charge was counted too: a release of 9 leaves 0 of the debt
            // of 9 only if the denied hit is there (18 + 1 - 9 = 10: still 0 left).
            let back = ask(&limiter, release(9)).await;
            assert!(ok(&back), "{test}: {back:?}");
            assert_eq!(remaining(&back), 0, "{test}: 19 - 9 = 10 of 10 used");
            let freed = ask(&limiter, release(3)).await;
            assert!(
                (2..=3).contains(&remaining(&freed)),
                "{test}: 7 of 10 used: {freed:?}"
            );
        }
    }
}

/// upstream's minimal quota case: hits 1, 1, 1, 0 on a limit of 2 answer OK, OK,
/// OVER_LIMIT, OVER_LIMIT (the third debit is counted although it is over).
#[tokio::test]
async fn a_quota_mode_descriptor_counts_a_debit_past_its_limit_as_upstream() {
    for kind in STORES {
        for algorithm in charging() {
            let test = format!("quota_{kind}_{}", algorithm.name());
            let limiter = Limiter::new(
                config(&budget(algorithm, 2, "    quota_mode: true\n")),
                store(kind, &test).await,
                LimiterOptions::default(),
            );
            let mut codes = Vec::new();
            for hits in [1, 1, 1, 0] {
                codes.push(ok(&ask(&limiter, tenant(Some(hits))).await));
            }
            assert_eq!(codes, [true, true, false, false], "{test}");
        }
    }
}

/// A descriptor's hits_addend 0 checks without consuming, on every algorithm and
/// store; a request-level hits_addend 0 means 1.
#[tokio::test]
async fn a_descriptor_hits_addend_of_zero_only_checks() {
    for kind in STORES {
        for algorithm in Algorithm::ALL {
            let test = format!("check_only_{kind}_{}", algorithm.name());
            let limiter = Limiter::new(
                config(&budget(algorithm, 5, "")),
                store(kind, &test).await,
                LimiterOptions::default(),
            );
            for _ in 0..20 {
                let check = ask(&limiter, tenant(Some(0))).await;
                assert!(ok(&check), "{test}: {check:?}");
                assert_eq!(remaining(&check), 5, "{test}: nothing consumed");
            }
            // No hits_addend anywhere (Envoy's 0): one hit.
            let one = ask(&limiter, tenant(None)).await;
            assert_eq!(remaining(&one), 4, "{test}: {one:?}");
        }
    }
}

/// Releases give back on the algorithms that define them, never below zero and
/// never OVER_LIMIT; elsewhere they change nothing. Both are counted.
#[tokio::test]
async fn releases_give_hits_back_and_are_counted() {
    for kind in STORES {
        for algorithm in Algorithm::ALL {
            let test = format!("release_{kind}_{}", algorithm.name());
            let limiter = Limiter::new(
                config(&budget(algorithm, 5, "")),
                store(kind, &test).await,
                LimiterOptions::default(),
            );
            // One charge of 5: a leaky bucket's first request waits for nothing (5 of
            // 1 would be held 12 minutes each, shaped to 5 per hour).
            assert!(ok(&ask(&limiter, tenant(Some(5))).await), "{test}");
            assert!(!ok(&ask(&limiter, tenant(Some(1))).await), "{test}: full");
            let back = ask(&limiter, release(2)).await;
            assert!(ok(&back), "{test}: a release is never denied: {back:?}");
            if algorithm.releases() {
                // A concurrency rule counted the denied acquisition too (its release
                // comes as well): 6 leases held, 4 after the release.
                let expected = if algorithm.counts_denials() { 1 } else { 2 };
                assert_eq!(remaining(&back), expected, "{test}");
                let far = ask(&limiter, release(100)).await;
                assert!(ok(&far), "{test}");
                assert_eq!(remaining(&far), 5, "{test}: never below zero");
                let again = ask(&limiter, tenant(Some(5))).await;
                assert!(ok(&again), "{test}: five fit again: {again:?}");
            } else {
                assert_eq!(remaining(&back), 0, "{test}: ignored");
                assert!(!ok(&ask(&limiter, tenant(Some(1))).await), "{test}");
            }
            let text = limiter.metrics().encode().expect("metrics encode");
            let family = if algorithm.releases() {
                "tollgate_rule_released_total"
            } else {
                "tollgate_rule_release_ignored_total"
            };
            let expected = if algorithm.releases() { 102 } else { 2 };
            let line = format!("{family}{{domain=\"budget\",rule=\"tenant\"}} {expected}");
            assert!(text.contains(&line), "{test}: no `{line}` in\n{text}");
        }
    }
}

#[test]
fn overdraft_and_quota_mode_are_refused_where_a_charge_has_no_meaning() {
    for algorithm in Algorithm::ALL {
        for key in ["overdraft", "quota_mode"] {
            let yaml = budget(algorithm, 10, &format!("    {key}: true\n"));
            let loaded =
                tollgate::config::load_sources(&[(std::path::Path::new("b.yaml"), yaml.as_str())]);
            match (algorithm.charge_refusal(), loaded) {
                (None, Ok(_)) => {}
                (Some(reason), Err(errors)) => {
                    let text = errors.to_string();
                    assert!(
                        text.contains("b.yaml:3:")
                            && text.contains(&format!("{key}: not defined for algorithm"))
                            && text.contains(reason),
                        "{text}"
                    );
                }
                (refusal, loaded) => panic!(
                    "{} {key}: refusal {refusal:?}, loaded {:?}",
                    algorithm.name(),
                    loaded.err().map(|e| e.to_string())
                ),
            }
        }
    }
}
