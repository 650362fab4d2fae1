//! On a private cluster: a request whose caller stops waiting while
//! its groups are being acquired all at once consumes nothing. One master is paused
//! for writes (`CLIENT PAUSE .. WRITE`, scripts included), so the request's group
//! there hangs while its group on another master consumes; the caller drops the
//! request (a timeout far below the store's); once the pause ends, both groups must
//! end where a denied request leaves them, as the walk's refund guard promises.

use super::count_in;

use std::time::Duration;

use common::redis::RedisCluster;
use common::redis::custom::private_cluster;
use tokio::time::{Instant, sleep, timeout};
use tollgate::store::redis::connect::RedisTarget;
use tollgate::store::{CounterOp, Store};

use crate::common;

/// How long the second master holds writes: well past the caller's patience
/// ([`CALLER`]), well within the store's timeout (5 s), so the hung call answers.
const PAUSE_MS: u64 = 1000;
const CALLER: Duration = Duration::from_millis(150);

fn port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

/// Script calls of every kind on the node at `port` (FCALL batches, EVALSHA refunds).
fn script_calls(port: u16) -> u64 {
    common::redis::script_calls(&[port]).total()
}

/// Two far-from-limit operations whose slots are served by different masters, and
/// those masters' ports (first, second).
fn on_two_masters(cluster: &RedisCluster, round: &str) -> (Vec<CounterOp>, u16, u16) {
    let ops = super::spread_ops(round, 8, 1_000_000);
    let master = |op: &CounterOp| {
        port(&cluster.master_for_key(&format!("{{xsp|k={}}}", op.key.entries[0].1)))
    };
    let first = master(&ops[0]);
    let other = ops[1..]
        .iter()
        .find(|op| master(op) != first)
        .expect("8 slots span two masters")
        .clone();
    let second = master(&other);
    (vec![ops[0].clone(), other], first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_mid_flight_on_the_parallel_path_consumes_nothing() {
    let cluster = tokio::task::spawn_blocking(|| private_cluster().expect("private cluster"))
        .await
        .expect("private cluster");
    let options = common::stores::options(
        RedisTarget::Cluster(cluster.seed_urls()),
        "cross_slot_dropped",
    );
    let store = common::stores::connect(&options).await;
    let prefix = options.key_prefix.clone();
    // The request must take the hinted path (a check would hang on the paused master
    // and consume nothing, proving nothing): try a few rounds for a fresh hint.
    for round in 0..5 {
        let (ops, first, second) = on_two_masters(&cluster, &format!("drop{round}"));
        let mut pauser = redis::Client::open(format!("redis://127.0.0.1:{second}"))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the second master");
        // Warm: the connections are open and the replies leave fresh hints.
        for _ in 0..2 {
            assert!(store.decide(&ops).await.expect("decided")[0].allowed);
        }
        let raced = |p: tollgate::store::redis::CrossSlotPaths| p.hinted + p.cold;
        let hinted = raced(store.cross_slot_paths());
        let calls = (script_calls(first), script_calls(second));
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(PAUSE_MS)
            .arg("WRITE")
            .query_async(&mut pauser)
            .await
            .expect("CLIENT PAUSE");
        let dropped = timeout(CALLER, store.decide(&ops)).await;
        assert!(dropped.is_err(), "the paused master answered: {dropped:?}");
        if raced(store.cross_slot_paths()) != hinted + 1 {
            eprintln!("round {round}: the hint went stale before the request; again");
            let _: () = redis::cmd("CLIENT")
                .arg("UNPAUSE")
                .query_async(&mut pauser)
                .await
                .expect("CLIENT UNPAUSE");
            continue;
        }
        // Each master ran the request's group and then its refund; the counters hold
        // the two warm-up admissions only.
        let values: Vec<String> = ops
            .iter()
            .map(|op| op.key.entries[0].1.to_string())
            .collect();
        let settled = || {
            script_calls(first) >= calls.0 + 2
                && script_calls(second) >= calls.1 + 2
                && values
                    .iter()
                    .all(|v| count_in(&cluster, &prefix, &format!("k={v}")) == 2)
        };
        let until = Instant::now() + Duration::from_secs(15);
        while !settled() {
            assert!(
                Instant::now() < until,
                "not refunded: counts {:?}, script calls {:?} -> {:?}",
                values
                    .iter()
                    .map(|v| count_in(&cluster, &prefix, &format!("k={v}")))
                    .collect::<Vec<_>>(),
                calls,
                (script_calls(first), script_calls(second))
            );
            sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.refunds_abandoned(), 0);
        return;
    }
    panic!("no round took the hinted path in time");
}
