//! `global: true` at load and in one request, on the memory store: which rules can be
//! global (and the reason where not), a global rule without a ledger (local), and a
//! request whose region holds no share (denied without asking the store, and, when
//! it vetoes, nothing of the request consumed), a shadow rule's missing share
//! (vetoes nothing), a release on a global rule (a check), and the share as the
//! limit once granted.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Division};
use tollgate::clock::ManualClock;
use tollgate::global::table::Table;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};
use tollgate::store::memory::MemoryStore;

use crate::common::server::{config, descriptor, request};

fn global_rule(algorithm: Algorithm, extra: &str, limit_extra: &str) -> String {
    format!(
        "domain: g
descriptors:
  - key: tenant
    global: true
{extra}    rate_limit: {{unit: minute, requests_per_unit: 10, algorithm: {}{limit_extra}}}
",
        algorithm.name()
    )
}

fn load(yaml: &str) -> Result<tollgate::config::Config, String> {
    tollgate::config::load_sources(&[(Path::new("g.yaml"), yaml)]).map_err(|e| e.to_string())
}

#[test]
fn global_is_taken_where_a_division_keeps_the_limit_and_refused_with_the_reason_elsewhere() {
    for algorithm in Algorithm::ALL {
        let loaded = load(&global_rule(algorithm, "", ""));
        match (algorithm.division(), loaded) {
            (Division::Window | Division::Rate, Ok(config)) => {
                assert!(config.has_global_rules(), "{}", algorithm.name());
            }
            (Division::Refused(reason), Err(text)) => assert!(
                text.contains("g.yaml:4:")
                    && text.contains("global: not defined for algorithm")
                    && text.contains(reason)
                    && text.contains("global rules take fixed_window, token_bucket and gcra"),
                "{text}"
            ),
            (division, loaded) => panic!("{}: {division:?}, {loaded:?}", algorithm.name()),
        }
    }
}

#[test]
fn global_is_refused_with_calendar_periods_and_charges() {
    let zone = "domain: g\ndescriptors:\n  - key: tenant\n    global: true\n    rate_limit: {unit: day, requests_per_unit: 10, time_zone: Europe/Paris}\n";
    let text = load(zone).unwrap_err();
    assert!(
        text.contains("global: not with time_zone 'Europe/Paris'"),
        "{text}"
    );
    for key in ["overdraft", "quota_mode"] {
        let text = load(&global_rule(
            Algorithm::FixedWindow,
            &format!("    {key}: true\n"),
            "",
        ))
        .unwrap_err();
        assert!(text.contains(&format!("global: not with {key}")), "{text}");
    }
    let text = load("domain: g\ndescriptors:\n  - key: t\n    global: maybe\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").unwrap_err();
    assert!(
        text.contains("g.yaml:4:") && text.contains("global"),
        "{text}"
    );
}

const YAML: &str = "domain: g
descriptors:
  - key: tenant
    global: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: quiet
    global: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
";

fn limiter(store: Arc<MemoryStore>, table: Option<Arc<Table>>) -> Limiter {
    Limiter::new(
        config(YAML),
        store,
        LimiterOptions {
            global: table,
            ..LimiterOptions::default()
        },
    )
}

fn ask(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    request("g", descriptors)
}

/// What `user=u`'s counter holds: the limit less what a check finds remaining.
async fn user_count(limiter: &Limiter) -> u64 {
    let check = RateLimitDescriptor {
        hits_addend: Some(0),
        ..descriptor(&[("user", "u")])
    };
    let answer = limiter.should_rate_limit(&ask(vec![check])).await.unwrap();
    100 - u64::from(answer.statuses[0].limit_remaining)
}

#[tokio::test]
async fn without_a_ledger_a_global_rule_is_a_local_one() {
    let limiter = limiter(Arc::new(MemoryStore::new()), None);
    let answer = limiter
        .should_rate_limit(&ask(vec![descriptor(&[("tenant", "t")])]))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 99);
}

#[tokio::test]
async fn no_share_denies_without_the_store_and_consumes_nothing_of_the_request() {
    let clock = Arc::new(ManualClock::new(10 * 60_000 + 1_000));
    let table = Arc::new(Table::new(100, Duration::from_millis(250), clock));
    let store = Arc::new(MemoryStore::new());
    let limiter = limiter(store.clone(), Some(table.clone()));
    let both = vec![descriptor(&[("tenant", "t")]), descriptor(&[("user", "u")])];
    let answer = limiter.should_rate_limit(&ask(both)).await.unwrap();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    assert_eq!(answer.statuses[0].code, Code::OverLimit as i32);
    // Denied until the window ends (59 s), as far as anyone can promise.
    assert_eq!(answer.statuses[0].duration_until_reset.unwrap().seconds, 59);
    assert_eq!(answer.statuses[1].code, Code::Ok as i32, "{answer:?}");
    assert_eq!(
        user_count(&limiter).await,
        0,
        "a denied request consumes nothing"
    );
    // The global counter never reached the store: its only counter is the user's,
    // which the check above made.
    assert_eq!(store.len(), 1);

    // A shadow rule without a share vetoes nothing: the request passes, consumed.
    let shadowed = vec![descriptor(&[("quiet", "q")]), descriptor(&[("user", "u")])];
    let answer = limiter.should_rate_limit(&ask(shadowed)).await.unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    assert_eq!(user_count(&limiter).await, 1);

    // Granted 3 of the window in progress: the share is the limit.
    let entry = table
        .entries()
        .into_iter()
        .find(|e| e.id.contains("tenant=t"))
        .expect("the counter is in the table");
    entry.set_grants(vec![(10, 3)]);
    let one = || ask(vec![descriptor(&[("tenant", "t")])]);
    for remaining in [2, 1, 0] {
        let answer = limiter.should_rate_limit(&one()).await.unwrap();
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
    let answer = limiter.should_rate_limit(&one()).await.unwrap();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);

    // A grant above the limit (share released, then granted back: the counter holds
    // the releases) is the limit requests decide with.
    let other = || ask(vec![descriptor(&[("tenant", "t2")])]);
    limiter.should_rate_limit(&other()).await.unwrap();
    let entry = table
        .entries()
        .into_iter()
        .find(|e| e.id.contains("tenant=t2"))
        .expect("the counter is in the table");
    entry.set_grants(vec![(10, 150)]);
    let answer = limiter.should_rate_limit(&other()).await.unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 149, "{answer:?}");

    // A release on a global rule gives nothing back: a check.
    let release = RateLimitDescriptor {
        is_negative_hits: true,
        hits_addend: Some(2),
        ..descriptor(&[("tenant", "t")])
    };
    let answer = limiter
        .should_rate_limit(&ask(vec![release]))
        .await
        .unwrap();
    assert_eq!(answer.statuses[0].limit_remaining, 0, "{answer:?}");
    let answer = limiter.should_rate_limit(&one()).await.unwrap();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
}
