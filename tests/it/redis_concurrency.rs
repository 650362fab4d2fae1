//! Exactness under concurrency on real Redis, through the real gRPC server: exact
//! admitted counts on standalone and cluster, three servers (separate clients) sharing
//! one cluster, multi-slot requests whose counters end exactly where the admitted
//! requests put them, hash tags checked with CLUSTER KEYSLOT, a TTL on every key.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use common::server::{TestServer, config, descriptor, request};
use futures_util::future::join_all;
use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::RedisTarget;

fn cluster_target() -> RedisTarget {
    common::stores::cluster_target()
}

fn standalone_target() -> RedisTarget {
    common::stores::standalone_target()
}

async fn store(target: RedisTarget, prefix: &str) -> Arc<RedisStore> {
    let mut options = common::stores::options(target, "unused");
    options.key_prefix = prefix.to_owned();
    Arc::new(common::stores::connect(&options).await)
}

const TEN_PER_DAY: &str = "
domain: conc
descriptors:
  - key: client
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: shared
    rate_limit: {unit: year, requests_per_unit: 100}
";

/// Fires `n` requests at once, spread over `servers`, and counts the codes.
async fn fire(servers: &[&TestServer], n: usize, entries: &[(&str, &str)]) -> (usize, usize) {
    let mut clients = Vec::new();
    for server in servers {
        clients.push(server.client().await);
    }
    let calls = (0..n).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        let req = request("conc", vec![descriptor(entries)]);
        async move {
            client
                .should_rate_limit(req)
                .await
                .expect("no call fails")
                .into_inner()
        }
    });
    let responses = join_all(calls).await;
    let ok = responses
        .iter()
        .filter(|r| r.overall_code == Code::Ok as i32)
        .count();
    let over = responses
        .iter()
        .filter(|r| r.overall_code == Code::OverLimit as i32)
        .count();
    (ok, over)
}

async fn twenty_on_ten(target: RedisTarget, prefix: &str) {
    let server = TestServer::start(
        config(TEN_PER_DAY),
        store(target, prefix).await,
        LimiterOptions::default(),
    )
    .await;
    assert_eq!(fire(&[&server], 20, &[("client", "c1")]).await, (10, 10));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_on_a_limit_of_ten_standalone() {
    twenty_on_ten(
        standalone_target(),
        &common::redis::unique_prefix("twenty_standalone"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_on_a_limit_of_ten_cluster() {
    twenty_on_ten(
        cluster_target(),
        &common::redis::unique_prefix("twenty_cluster"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_share_one_cluster_exactly() {
    let prefix = common::redis::unique_prefix("three_servers");
    let mut servers = Vec::new();
    for _ in 0..3 {
        // Each server has its own store, so its own cluster connections.
        let store = store(cluster_target(), &prefix).await;
        servers
            .push(TestServer::start(config(TEN_PER_DAY), store, LimiterOptions::default()).await);
    }
    let refs: Vec<&TestServer> = servers.iter().collect();
    assert_eq!(fire(&refs, 300, &[("shared", "s1")]).await, (100, 200));
    for server in servers {
        server.stop().await;
    }
}

const TENANTS: &str = "
domain: conc
hash_tag: [tenant_id]
descriptors:
  - key: tenant_id
    rate_limit: {unit: year, requests_per_unit: 30}
    descriptors:
      - key: user
        rate_limit: {unit: year, requests_per_unit: 8}
  - key: route
    hash_tag: [route]
    rate_limit: {unit: year, requests_per_unit: 25}
";

/// Requests carrying three counters in different slots (tenant, tenant+user share the
/// tenant's slot; route is its own), fired concurrently. Afterwards every counter must
/// hold exactly the hits of the admitted requests, and none may exceed its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_slot_requests_leave_exact_counts() {
    let prefix = common::redis::unique_prefix("multi_slot");
    let server = TestServer::start(
        config(TENANTS),
        store(cluster_target(), &prefix).await,
        LimiterOptions::default(),
    )
    .await;
    let client = server.client().await;
    let plans: Vec<(String, String, String)> = (0..120)
        .map(|i| {
            (
                format!("t{}", i % 3),
                format!("u{}", i % 7),
                format!("r{}", i % 2),
            )
        })
        .collect();
    let calls = plans.iter().map(|(t, u, r)| {
        let mut client = client.clone();
        let req = request(
            "conc",
            vec![
                descriptor(&[("tenant_id", t)]),
                descriptor(&[("tenant_id", t), ("user", u)]),
                descriptor(&[("route", r)]),
            ],
        );
        async move {
            client
                .should_rate_limit(req)
                .await
                .expect("no call fails")
                .into_inner()
        }
    });
    let responses = join_all(calls).await;

    let mut expected: HashMap<String, u64> = HashMap::new();
    for ((t, u, r), response) in plans.iter().zip(&responses) {
        if response.overall_code == Code::Ok as i32 {
            *expected.entry(format!("tenant_id={t}")).or_default() += 1;
            *expected
                .entry(format!("tenant_id={t}|user={u}"))
                .or_default() += 1;
            *expected.entry(format!("route={r}")).or_default() += 1;
        }
    }
    assert!(
        expected.values().any(|v| *v > 0),
        "some requests were admitted"
    );

    let cluster = common::redis::cluster();
    let keys = common::redis::scan_keys(&cluster.nodes(), &format!("{prefix}*"));
    assert!(!keys.is_empty());
    for key in &keys {
        let rest = key.rsplit_once("}:").expect("tagged key").1;
        let entries = rest.split(':').nth(1).expect("entries part");
        let count = common::redis::fixed_window_count(&common::redis::redis_cli_cluster(
            cluster,
            &["GET", key],
        ));
        let limit = if entries.contains("user=") {
            8
        } else if entries.starts_with("route=") {
            25
        } else {
            30
        };
        assert!(
            count <= limit,
            "{key} holds {count}, over its limit {limit}"
        );
        assert_eq!(
            count,
            expected.get(entries).copied().unwrap_or(0),
            "{key}: count differs from admitted requests"
        );
        assert!(
            common::redis::pttl(&cluster.nodes(), key) > 0,
            "{key} has no TTL"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_counters_share_one_slot_and_every_key_has_a_ttl() {
    let prefix = common::redis::unique_prefix("hash_tag");
    let server = TestServer::start(
        config(TENANTS),
        store(cluster_target(), &prefix).await,
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    for user in ["alice", "bob", "{weird}|user=x"] {
        let req = request(
            "conc",
            vec![
                descriptor(&[("tenant_id", "acme{1}")]),
                descriptor(&[("tenant_id", "acme{1}"), ("user", user)]),
            ],
        );
        let response = client
            .should_rate_limit(req)
            .await
            .expect("call succeeds")
            .into_inner();
        assert_eq!(response.overall_code, Code::Ok as i32);
    }
    let cluster = common::redis::cluster();
    let keys = common::redis::scan_keys(&cluster.nodes(), &format!("{prefix}*"));
    assert_eq!(
        keys.len(),
        4,
        "one tenant counter and three user counters: {keys:?}"
    );
    let slots: Vec<u16> = keys
        .iter()
        .map(|k| common::redis::keyslot(cluster, k))
        .collect();
    assert!(
        slots.iter().all(|s| *s == slots[0]),
        "one tenant, one slot: {keys:?} -> {slots:?}"
    );
    for key in &keys {
        assert!(
            key.contains("{conc|tenant_id=acme%7B1%7D}"),
            "hash tag present and escaped: {key}"
        );
        let ttl = common::redis::pttl(&cluster.nodes(), key);
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
    server.stop().await;
}

/// After a mixed workload (every unit, Envoy overrides, denials, check-only calls),
/// every key in the whole cluster keyspace, whichever test wrote it, has a TTL: each
/// write sets one in the same script, so there is no moment without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_in_the_keyspace_has_a_ttl() {
    let prefix = common::redis::unique_prefix("ttl_all");
    let server = TestServer::start(
        config(TENANTS),
        store(cluster_target(), &prefix).await,
        LimiterOptions::default(),
    )
    .await;
    let mut client = server.client().await;
    for (i, unit) in [1, 2, 3, 4, 5, 6, 7].into_iter().enumerate() {
        let mut overridden = descriptor(&[("tenant_id", &format!("o{i}"))]);
        overridden.limit = Some(tollgate::proto::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 2,
            unit,
        });
        let mut check_only = descriptor(&[("route", &format!("r{i}"))]);
        check_only.hits_addend = Some(0);
        for _ in 0..3 {
            let req = request(
                "conc",
                vec![
                    overridden.clone(),
                    check_only.clone(),
                    descriptor(&[("tenant_id", "t"), ("user", "u")]),
                ],
            );
            client.should_rate_limit(req).await.expect("call succeeds");
        }
    }
    let cluster = common::redis::cluster();
    let mine = common::redis::scan_keys(&cluster.nodes(), &format!("{prefix}*"));
    // A check (hits_addend 0) writes nothing, and a request denied at t|u's limit of 8
    // consumes nothing elsewhere: the overridden tenants admitted before that remain.
    assert!(mine.len() >= 5, "the workload wrote keys: {mine:?}");
    let all = common::redis::scan_keys(&cluster.nodes(), "*");
    for key in &all {
        // -1 would mean no TTL; -2 means it expired between SCAN and PTTL (1 s windows).
        let ttl = common::redis::pttl(&cluster.nodes(), key);
        assert!(ttl > 0 || ttl == -2, "{key} has no TTL ({ttl})");
    }
    server.stop().await;
}
