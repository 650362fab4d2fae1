//! Batching on a Redis Cluster, proven by Redis itself (`INFO commandstats` on every
//! node of a cluster of its own): concurrent requests whose groups fall in the same
//! slot share script calls, so there are fewer EVALSHA calls than groups, and every
//! request is still decided exactly (a limit of 3 admits 3, whatever shares a call).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use futures_util::future::join_all;

use common::redis::custom::private_cluster;
use common::redis::info_field;
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

/// EVALSHA calls so far, summed over `ports`.
fn evalsha(ports: &[u16]) -> u64 {
    ports
        .iter()
        .map(|&port| {
            let info = common::redis::redis_cli(port, &["INFO", "commandstats"]);
            info_field(&info, "cmdstat_evalsha")
                .and_then(|stats| stats.split(',').find_map(|kv| kv.strip_prefix("calls=")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Sends one single-descriptor request per value, all at once; the number admitted.
async fn fire(limiter: &Arc<Limiter>, values: &[String]) -> usize {
    let answers = join_all(values.iter().map(|value| {
        let limiter = limiter.clone();
        let r = request("batch", vec![descriptor(&[("k", value)])]);
        async move { limiter.should_rate_limit(&r).await.expect("decides") }
    }))
    .await;
    answers
        .iter()
        .filter(|a| a.overall_code == Code::Ok as i32)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_groups_in_one_slot_share_calls_and_stay_exact() {
    let cluster = tokio::task::spawn_blocking(|| private_cluster().expect("private cluster"))
        .await
        .unwrap();
    let ports = cluster.ports();
    let options = common::stores::options(
        RedisTarget::Cluster(cluster.seed_urls()),
        "cluster_batching",
    );
    let store = common::stores::connect(&options).await;
    let config =
        tollgate::config::load_sources(&[(Path::new("batch.yaml"), EXACT)]).expect("config loads");
    let limiter = Arc::new(Limiter::new(
        config,
        Arc::new(store),
        LimiterOptions::default(),
    ));
    // Warm: the connections to every master are open before counting.
    fire(&limiter, &["warm".to_owned()]).await;

    // One hot key: 200 requests at once on a limit of 3.
    let hot: Vec<String> = vec!["hot".to_owned(); 200];
    let before = evalsha(&ports);
    let admitted = fire(&limiter, &hot).await;
    let hot_calls = evalsha(&ports) - before;
    assert_eq!(admitted, 3, "a limit of 3 admits exactly 3 of 200");
    assert!(
        hot_calls < 200,
        "200 concurrent requests in one slot made {hot_calls} calls"
    );

    // 64 keys over many slots, each hit 4 times at once: 3 of every 4 pass.
    let spread: Vec<String> = (0..256).map(|i| format!("spread{}", i % 64)).collect();
    let before = evalsha(&ports);
    let admitted = fire(&limiter, &spread).await;
    let spread_calls = evalsha(&ports) - before;
    assert_eq!(admitted, 64 * 3, "3 of every 4 hits on each key");
    assert!(
        spread_calls < 256,
        "256 concurrent requests, 4 per slot, made {spread_calls} calls"
    );
    eprintln!(
        "FIGURES cluster batching: 200 concurrent requests on one key: {hot_calls} EVALSHA ({:.2} per request); 256 on 64 keys: {spread_calls} ({:.2} per request)",
        hot_calls as f64 / 200.0,
        spread_calls as f64 / 256.0
    );
}
