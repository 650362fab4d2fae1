//! Batching on a Redis Cluster, proven by Redis itself (`INFO commandstats` on every
//! node of a cluster of its own, every kind of script call counted): concurrent
//! requests on one master share its script calls, as many as the batcher's rules
//! allow and no more, and every request is still decided exactly (a limit of 3
//! admits 3, whatever shares a call).
//!
//! The bound, from how a master's queue works (`store/redis/batcher/`, the queue
//! `slot_batch.rs` keeps per master): a fresh queue sends at most 2 calls before one
//! is answered (`depth.rs`: `START`, and a third only while a full call's worth, 256
//! operations, waits), each carrying whatever had queued by then; the first answer
//! frees a place, and the next call carries everything still queued, up to 256
//! operations (`MAX_OPS_PER_CALL`). So a burst of up to 258 one-operation requests
//! that all queue while the first calls are out takes at most 3 calls per master. The
//! burst is made to queue so on any machine: Redis holds the first calls
//! (`common::burst`) until every request waits. Without the sharing, every request is
//! a call of its own (200 and 256).

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::burst::queued_behind_redis;
use common::redis::custom::private_cluster;
use common::redis::{RedisCluster, script_calls};
use common::server::{descriptor, request};
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::redis::connect::RedisTarget;

/// 3 a day: a window no test run straddles in practice.
const EXACT: &str = "
domain: batch
descriptors:
  - key: k
    rate_limit: { unit: day, requests_per_unit: 3 }
";

/// Calls a fresh master queue sends for a burst of at most 258 one-operation requests
/// that all queue behind its first calls (see the module docs).
const CALLS_PER_MASTER: u64 = 3;

fn port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

/// A limiter on a store of its own (so its master queues are fresh), with a timeout
/// that outlasts the burst's queueing.
async fn limiter(cluster: &RedisCluster, test: &str) -> Arc<Limiter> {
    let mut options = common::stores::options(RedisTarget::Cluster(cluster.seed_urls()), test);
    options.timeout = Duration::from_secs(60);
    let store = common::stores::connect(&options).await;
    let config =
        tollgate::config::load_sources(&[(Path::new("batch.yaml"), EXACT)]).expect("config loads");
    Arc::new(Limiter::new(
        config,
        Arc::new(store),
        LimiterOptions::default(),
    ))
}

/// One single-descriptor request per value, all queued behind the masters' held
/// calls; the number admitted and the script calls Redis counted for them.
async fn burst(cluster: &RedisCluster, limiter: &Arc<Limiter>, values: &[String]) -> (usize, u64) {
    let masters: Vec<u16> = cluster.masters().iter().map(|m| port(m)).collect();
    let requests = values
        .iter()
        .map(|value| {
            let limiter = limiter.clone();
            let r = request("batch", vec![descriptor(&[("k", value)])]);
            async move { limiter.should_rate_limit(&r).await.expect("decides") }
        })
        .collect();
    let before = script_calls(&cluster.ports());
    let answers = queued_behind_redis(&masters, requests).await;
    let calls = script_calls(&cluster.ports()) - before;
    assert_eq!(calls.eval, 0, "the code went over the wire: {calls:?}");
    let admitted = answers
        .iter()
        .filter(|a| a.overall_code == Code::Ok as i32)
        .count();
    (admitted, calls.total())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_a_master_share_its_calls_and_stay_exact() {
    let cluster = tokio::task::spawn_blocking(|| private_cluster().expect("private cluster"))
        .await
        .unwrap();

    // One hot key: 200 requests at once on a limit of 3, one master's queue.
    let hot = limiter(&cluster, "cluster_batching_hot").await;
    let (admitted, calls) = burst(&cluster, &hot, &vec!["hot".to_owned(); 200]).await;
    assert_eq!(admitted, 3, "a limit of 3 admits exactly 3 of 200");
    assert!(
        (1..=CALLS_PER_MASTER).contains(&calls),
        "200 queued requests on one key made {calls} script calls (at most {CALLS_PER_MASTER})"
    );

    // 64 keys over many slots (every master's), each hit 4 times at once: 3 of every
    // 4 pass, and each master's requests share its calls whatever their slots.
    let spread = limiter(&cluster, "cluster_batching_spread").await;
    let values: Vec<String> = (0..256).map(|i| format!("spread{}", i % 64)).collect();
    let (admitted, calls) = burst(&cluster, &spread, &values).await;
    assert_eq!(admitted, 64 * 3, "3 of every 4 hits on each key");
    let masters = cluster.masters().len() as u64;
    assert!(
        (1..=CALLS_PER_MASTER * masters).contains(&calls),
        "256 queued requests over {masters} masters made {calls} script calls \
         (at most {CALLS_PER_MASTER} per master)"
    );
}
