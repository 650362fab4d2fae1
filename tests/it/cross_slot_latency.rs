//! What acquiring slot groups costs: p50/p99 of sequential decisions on the harness
//! cluster for requests spanning 1, 2 and 4 slot groups, three ways interleaved:
//! "floor" (one call per group, all at once, nothing ordered or checked), "far"
//! (`RedisStore::decide` on counters far from their limits: the groups at once, on
//! the hints of the last replies) and "near" (`RedisStore::decide` on counters filled
//! past 7/8 of their limit, inside the margin: a check, then the groups one after
//! another). Ignored by default (it measures, it does not check); run with
//! `cargo test --release --test it cross_slot_latency -- --ignored --nocapture`.

use crate::common;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tollgate::store::{CounterOp, Store};

const CALLS: usize = 2000;

/// One op per value, each in a slot of its own, the values starting with `name`.
fn ops(name: &str, groups: usize) -> Vec<CounterOp> {
    common::stores::ops_in_distinct_slots("lat", name, groups, 1_000_000_000)
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(at(0.50)), us(at(0.99)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measures latency; run with --ignored --nocapture"]
async fn acquisition_latency_for_1_2_and_4_groups() {
    let store = common::stores::cluster("cross_slot_latency").await;
    for groups in [1, 2, 4] {
        let floor = ops(&format!("f{groups}-"), groups);
        let singles: Vec<[CounterOp; 1]> = floor.iter().map(|op| [op.clone()]).collect();
        let far = ops(&format!("a{groups}-"), groups);
        let near = ops(&format!("n{groups}-"), groups);
        // Fill the near counters past 7/8 of their limit, inside the relative margin.
        let mut fill = near.clone();
        for op in &mut fill {
            op.cost = op.params.limit / 8 * 7 + 1;
        }
        assert!(
            store
                .decide(&fill)
                .await
                .expect("filled")
                .iter()
                .all(|d| d.allowed)
        );
        // Warm the connections and the script caches of every master.
        for _ in 0..50 {
            store.decide(&far).await.expect("decided");
            store.decide(&near).await.expect("decided");
        }
        let mut samples = [const { Vec::new() }; 3];
        let before = store.cross_slot_paths();
        // Interleaved, so all three see the same machine load.
        for _ in 0..CALLS {
            let t = Instant::now();
            for result in join_all(singles.iter().map(|one| store.decide(one))).await {
                assert!(result.expect("decided")[0].allowed);
            }
            samples[0].push(t.elapsed());
            for (ops, sample) in [(&far, 1), (&near, 2)] {
                let t = Instant::now();
                let decisions = store.decide(ops).await.expect("decided");
                samples[sample].push(t.elapsed());
                assert!(decisions.iter().all(|d| d.allowed));
            }
        }
        let paths = store.cross_slot_paths();
        if groups > 1 {
            // Every far request went at once (on its hints unless a stall aged them),
            // every near one in order.
            let at_once = paths.hinted + paths.checked - before.hinted - before.checked;
            assert_eq!(at_once, CALLS as u64);
            assert_eq!(paths.ordered - before.ordered, CALLS as u64);
        }
        let [(f50, f99), (a50, a99), (n50, n99)] = samples.map(percentiles);
        eprintln!(
            "{groups} group(s): floor p50 {f50:.0} us p99 {f99:.0} us | far p50 {a50:.0} us p99 {a99:.0} us | near p50 {n50:.0} us p99 {n99:.0} us"
        );
    }
}
