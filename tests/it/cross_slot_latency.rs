//! What acquiring slot groups in order costs: p50/p99 of sequential decisions on the
//! harness cluster for requests spanning 1, 2 and 4 slot groups, "before" (one call
//! per group, all at once, as the parallel path did for an admitted request) against
//! "after" (`RedisStore::decide`: a dry run of every group at once, then the groups
//! one after another). Ignored by default (it measures, it does not check); run with
//! `cargo test --release --test it cross_slot_latency -- --ignored --nocapture`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tollgate::algorithm::{Algorithm, Params};
use tollgate::store::{CounterKey, CounterOp, Store};

const CALLS: usize = 2000;

/// One op per value, each in a slot of its own (the default tag is domain + entries).
fn ops(groups: usize) -> Vec<CounterOp> {
    let cluster = common::redis::cluster();
    let mut seen = Vec::new();
    let mut ops = Vec::new();
    for i in 0.. {
        if ops.len() == groups {
            break;
        }
        let value = format!("g{i}");
        let slot = common::redis::keyslot(cluster, &format!("{{lat|k={value}}}"));
        if seen.contains(&slot) {
            continue;
        }
        seen.push(slot);
        ops.push(CounterOp {
            key: CounterKey {
                domain: Arc::from("lat"),
                rule: Arc::from("k"),
                entries: vec![("k".into(), value)],
                algorithm: Algorithm::FixedWindow,
                window_secs: 3600,
                hash_tag: None,
            },
            params: Params {
                algorithm: Algorithm::FixedWindow,
                limit: 1_000_000_000,
                window_ms: 3_600_000,
                burst: 1_000_000_000,
                max_delay_ms: None,
            },
            cost: 1,
            vetoes: true,
        });
    }
    ops
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(at(0.50)), us(at(0.99)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures latency; run with --ignored --nocapture"]
async fn ordered_acquisition_latency_for_1_2_and_4_groups() {
    let store = common::stores::cluster("cross_slot_latency").await;
    for groups in [1, 2, 4] {
        let ops = ops(groups);
        let singles: Vec<[CounterOp; 1]> = ops.iter().map(|op| [op.clone()]).collect();
        // Warm the connections and the script caches of every master.
        for _ in 0..50 {
            store.decide(&ops).await.expect("decided");
        }
        let mut before = Vec::with_capacity(CALLS);
        let mut after = Vec::with_capacity(CALLS);
        // Interleaved, so both see the same machine load.
        for _ in 0..CALLS {
            let t = Instant::now();
            for result in join_all(singles.iter().map(|one| store.decide(one))).await {
                assert!(result.expect("decided")[0].allowed);
            }
            before.push(t.elapsed());
            let t = Instant::now();
            assert!(
                store
                    .decide(&ops)
                    .await
                    .expect("decided")
                    .iter()
                    .all(|d| d.allowed)
            );
            after.push(t.elapsed());
        }
        let (b50, b99) = percentiles(before);
        let (a50, a99) = percentiles(after);
        eprintln!(
            "{groups} group(s): parallel p50 {b50:.0} us p99 {b99:.0} us | ordered p50 {a50:.0} us p99 {a99:.0} us"
        );
    }
}
