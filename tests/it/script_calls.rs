//! One script round trip per slot group, proven by Redis itself: `INFO commandstats`
//! before and after N requests through a `Limiter` on a `RedisStore`, every kind of
//! script call counted (`common::redis::script_calls`).
//!
//! - Standalone: N sequential single-descriptor requests are exactly N script calls
//!   (`FCALL` of the function library, or `EVALSHA` where Redis has no functions:
//!   counted together; 1.0 per request); a 10-descriptor request is still one call;
//!   concurrent requests share calls as the batcher's rules say, and no more
//!   ([`QUEUED_BURST_CALLS`]), every request still decided exactly; `EVAL` is never
//!   used (the code crosses the network only through `FUNCTION LOAD` or `SCRIPT
//!   LOAD`, at start-up or after the server lost it).
//! - Cluster: a request whose counters all live on one master is one call, whatever
//!   their slots; one spanning k masters, its counters cold (no reading yet) and far
//!   from their limits, is k (the groups raced at once, no check), and a `hash_tag`
//!   that puts a tenant's counters in one slot makes them one call.
//!
//! Each test runs on a standalone server or a cluster of its own
//! (`common::redis::custom`), not the shared ones, and works serially there, so the
//! deltas are exact.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::burst::queued_behind_redis;
use common::redis::{command_calls, script_calls};
use common::server::{descriptor, request};
use tollgate::config::Config;
use tollgate::limiter::{Limiter, LimiterOptions, plan};
use tollgate::proto::RateLimitRequest;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::redis::connect::RedisTarget;
use tollgate::store::redis::keys;

const BENCH: &str = include_str!("../../benches/config/bench.yaml");

/// Script calls a fresh standalone batcher makes for a burst of at most 258
/// one-operation requests that all queue while its first calls are held in Redis:
/// at most 2 calls go before one is answered (`batcher/depth.rs`: `START`; a third
/// only while a full call's worth, 256 operations, waits), each carrying what had
/// queued by then; the first answer frees a place, and the next call carries every
/// request still queued, up to 256 operations (`MAX_OPS_PER_CALL` in
/// `batcher/mod.rs`). Without the sharing, each request is a call of its own.
const QUEUED_BURST_CALLS: u64 = 3;

fn config(yaml: &str) -> Config {
    tollgate::config::load_sources(&[(Path::new("test.yaml"), yaml)])
        .unwrap_or_else(|errors| panic!("config does not load: {errors}"))
}

/// Script loads (`FUNCTION LOAD`, `SCRIPT LOAD`) the server at `port` served.
fn loads(port: u16) -> u64 {
    command_calls(port, "function|load") + command_calls(port, "script|load")
}

/// 3 a day: a window no test run straddles in practice.
const EXACT: &str = "
domain: exact
descriptors:
  - key: key
    rate_limit: { unit: day, requests_per_unit: 3 }
";

/// A request with one descriptor per value, `key=<value>` each.
fn values_request(values: &[String]) -> RateLimitRequest {
    request(
        "bench",
        values
            .iter()
            .map(|v| descriptor(&[("key", v.as_str())]))
            .collect(),
    )
}

async fn decide_all(limiter: &Limiter, requests: &[RateLimitRequest]) {
    for r in requests {
        let response = limiter.should_rate_limit(r).await.expect("decides");
        assert_eq!(response.overall_code, Code::Ok as i32);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_at_most_one_script_call_per_request_and_never_eval() {
    let redis = common::redis::custom::private_standalone("script_calls").expect("private redis");
    let ports = [redis.port()];
    let target = RedisTarget::Standalone(redis.url());
    let store: Arc<dyn tollgate::store::Store> = Arc::new(
        common::stores::connect(&common::stores::options(target.clone(), "script_calls")).await,
    );
    let limiter = Arc::new(Limiter::new(
        config(BENCH),
        store.clone(),
        LimiterOptions::default(),
    ));
    const N: u64 = 200;

    // Sequential single-descriptor requests.
    let requests: Vec<_> = (0..N)
        .map(|i| values_request(&[format!("seq{i}")]))
        .collect();
    let (before, loaded) = (script_calls(&ports), loads(redis.port()));
    decide_all(&limiter, &requests).await;
    let delta = script_calls(&ports) - before;
    assert_eq!(delta.total(), N, "script calls for {N} requests: {delta:?}");
    assert_eq!(
        delta.eval, 0,
        "the script body was sent with EVAL: {delta:?}"
    );
    assert_eq!(loads(redis.port()), loaded, "a script was reloaded");

    // 200 at once, on a store of their own (a fresh batcher) whose first calls Redis
    // holds until all 200 are queued: they share calls as the batcher's rules allow,
    // and each is still decided on its own. Every key here is limited to 3 per day
    // (`EXACT`), hit 4 times at once: exactly 3 OK per key, whatever the batching.
    let mut options = common::stores::options(target, "script_calls_burst");
    options.timeout = Duration::from_secs(60);
    let exact = Arc::new(Limiter::new(
        config(EXACT),
        Arc::new(common::stores::connect(&options).await),
        LimiterOptions::default(),
    ));
    let burst = (0..N)
        .map(|i| {
            let limiter = exact.clone();
            let r = request(
                "exact",
                vec![descriptor(&[("key", &format!("par{}", i / 4))])],
            );
            async move { limiter.should_rate_limit(&r).await.expect("decides") }
        })
        .collect();
    let before = script_calls(&ports);
    let answers = queued_behind_redis(&ports, burst).await;
    let delta = script_calls(&ports) - before;
    let ok = answers
        .iter()
        .filter(|a| a.overall_code == Code::Ok as i32)
        .count();
    assert_eq!(ok as u64, N / 4 * 3, "3 of every 4 hits on a key pass");
    assert!(
        (1..=QUEUED_BURST_CALLS).contains(&delta.total()),
        "{N} queued requests made {delta:?} (at most {QUEUED_BURST_CALLS} script calls)"
    );
    assert_eq!(delta.eval, 0);

    // Ten descriptors, one server: one script decides them all.
    let requests: Vec<_> = (0..20)
        .map(|i| values_request(&(0..10).map(|d| format!("multi{i}-{d}")).collect::<Vec<_>>()))
        .collect();
    let before = script_calls(&ports);
    decide_all(&limiter, &requests).await;
    let delta = script_calls(&ports) - before;
    assert_eq!(delta.total(), 20, "10-descriptor requests: {delta:?}");

    // A server that lost its library (restart, failover) answers "Function not found":
    // the library goes over once with FUNCTION LOAD, never with EVAL.
    redis.cli(&["FUNCTION", "FLUSH"]);
    let (before, loaded) = (script_calls(&ports), loads(redis.port()));
    decide_all(&limiter, &[values_request(&["after-flush".into()])]).await;
    decide_all(&limiter, &[values_request(&["after-flush-2".into()])]).await;
    let delta = script_calls(&ports) - before;
    assert_eq!(delta.eval, 0, "after FUNCTION FLUSH: {delta:?}");
    assert_eq!(loads(redis.port()) - loaded, 1, "after FUNCTION FLUSH");
    // The failed attempt, its retry, then the second request.
    assert_eq!(delta.total(), 3, "after FUNCTION FLUSH: {delta:?}");
}

const TENANTS: &str = "
domain: tenants
hash_tag: [tenant_id]
descriptors:
  - key: tenant_id
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
    descriptors:
      - key: user
        rate_limit: { unit: second, requests_per_unit: 1000000000 }
      - key: route
        rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

/// The master of every slot of a cluster whose topology does not change, by asking
/// the node on `port`.
fn masters_by_slot(port: u16) -> HashMap<u16, String> {
    common::redis::cluster_nodes(port)
        .into_iter()
        .filter(|n| n.is_master())
        .flat_map(|n| {
            let addr = n.addr;
            n.slots
                .into_iter()
                .flatten()
                .map(move |slot| (slot, addr.clone()))
        })
        .collect()
}

/// The hash slots of the counters `request` touches, from tollgate's own keys.
fn slots(config: &Config, prefix: &str, request: &RateLimitRequest) -> Vec<u16> {
    let domain = config.domain(&request.domain).expect("known domain");
    let mut slots = Vec::new();
    for (i, d) in request.descriptors.iter().enumerate() {
        if let plan::Plan::Limited {
            limits,
            rule,
            shared,
            ..
        } = plan::resolve(domain, i, d).expect("resolves")
        {
            for limit in limits.as_slice() {
                let key = plan::counter_key(&domain.name, rule, d, shared, limit);
                slots.push(tollgate::store::redis::slot_of(&keys::encode(prefix, &key)));
            }
        }
    }
    slots
}

/// Distinct masters serving the counters `request` touches (`owners`:
/// [`masters_by_slot`]).
fn master_groups(
    config: &Config,
    prefix: &str,
    request: &RateLimitRequest,
    owners: &HashMap<u16, String>,
) -> usize {
    let masters: HashSet<&String> = slots(config, prefix, request)
        .iter()
        .map(|slot| owners.get(slot).expect("a master per slot"))
        .collect();
    masters.len()
}

/// Distinct hash slots of the counters `request` touches.
fn slot_groups(config: &Config, prefix: &str, request: &RateLimitRequest) -> usize {
    slots(config, prefix, request)
        .into_iter()
        .collect::<HashSet<u16>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_script_call_per_master_group() {
    let cluster = common::redis::custom::private_cluster().expect("private cluster");
    let ports = cluster.ports();
    let options =
        common::stores::options(RedisTarget::Cluster(cluster.seed_urls()), "script_calls");
    let prefix = options.key_prefix.clone();
    let store = common::stores::connect(&options).await;
    let owners = masters_by_slot(ports[0]);
    let bench = config(BENCH);
    let tenants = config(TENANTS);
    let limiter = Limiter::new(
        tollgate::config::load_sources(&[
            (Path::new("bench.yaml"), BENCH),
            (Path::new("tenants.yaml"), TENANTS),
        ])
        .expect("configs load"),
        Arc::new(store),
        LimiterOptions::default(),
    );

    for descriptors in [1usize, 3, 10] {
        let requests: Vec<_> = (0..30)
            .map(|i| {
                values_request(
                    &(0..descriptors)
                        .map(|d| format!("c{descriptors}-{i}-{d}"))
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        // One call per master group: cold counters far from their limits (10^9) are
        // raced at once without a check.
        let expected: usize = requests
            .iter()
            .map(|r| master_groups(&bench, &prefix, r, &owners))
            .sum();
        let slots: usize = requests
            .iter()
            .map(|r| slot_groups(&bench, &prefix, r))
            .sum();
        let before = script_calls(&ports);
        decide_all(&limiter, &requests).await;
        let delta = script_calls(&ports) - before;
        assert_eq!(
            delta.total(),
            expected as u64,
            "{descriptors} descriptor(s): one script call per master group ({delta:?})"
        );
        assert_eq!(delta.eval, 0);
        if descriptors == 1 {
            assert_eq!(expected, 30, "one descriptor is one group");
        } else {
            assert!(
                slots > expected,
                "{descriptors} descriptors spread over slots"
            );
        }
    }

    // hash_tag: a tenant's three counters share a slot, so one call decides them.
    let requests: Vec<_> = (0..30)
        .map(|i| {
            let tenant = format!("t{i}");
            request(
                "tenants",
                vec![
                    descriptor(&[("tenant_id", &tenant)]),
                    descriptor(&[("tenant_id", &tenant), ("user", "u1")]),
                    descriptor(&[("tenant_id", &tenant), ("route", "/a")]),
                ],
            )
        })
        .collect();
    for r in &requests {
        assert_eq!(slot_groups(&tenants, &prefix, r), 1);
    }
    let before = script_calls(&ports);
    decide_all(&limiter, &requests).await;
    let delta = script_calls(&ports) - before;
    assert_eq!(delta.total(), 30, "hash-tagged tenant requests: {delta:?}");
    assert_eq!(delta.eval, 0);
}
