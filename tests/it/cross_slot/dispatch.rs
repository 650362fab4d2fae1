//! The dispatch of the cluster path (`store/redis/cluster/strategy/`) picks each
//! strategy for the shape that should pick it, seen through the store's path counters
//! (`cross_slot_paths`) and what Redis holds afterwards: a request on one master is
//! one call and counts no path; a dry run of several groups counts none and writes
//! nothing; far from the limits a request races (cold, then on hints); near one it
//! walks; a request a used-up counter denies is denied by the check with nothing
//! taken; a lost race falls back to the walk, and its denial gets a second look.

use super::{count, replicas, spread_ops};

use std::time::Instant;

use tollgate::store::redis::{CrossSlotPaths, RACE_SHADOW, slot_of};
use tollgate::store::{CounterOp, Store};

use crate::common;

/// Two operations of limit `limit` on counters in different slots that one master
/// serves: one group by master.
fn on_one_master(round: &str, limit: u64) -> Vec<CounterOp> {
    let cluster = common::redis::cluster();
    let tag = |v: &str| format!("{{xsp|k={v}}}");
    let first = format!("{round}0");
    let master = cluster.master_for_key(&tag(&first));
    let second = (1..)
        .map(|i| format!("{round}{i}"))
        .find(|v| {
            slot_of(&tag(v)) != slot_of(&tag(&first)) && cluster.master_for_key(&tag(v)) == master
        })
        .expect("a master serves more than one slot");
    [first, second]
        .iter()
        .map(|v| common::stores::yearly("xsp", v, limit))
        .collect()
}

/// What moved between `before` and `after`.
fn moved(before: CrossSlotPaths, after: CrossSlotPaths) -> CrossSlotPaths {
    CrossSlotPaths {
        hinted: after.hinted - before.hinted,
        cold: after.cold - before.cold,
        checked: after.checked - before.checked,
        fell_back: after.fell_back - before.fell_back,
        ordered: after.ordered - before.ordered,
        denied: after.denied - before.denied,
        second_looks: after.second_looks - before.second_looks,
        misrouted: after.misrouted - before.misrouted,
    }
}

fn value(op: &CounterOp) -> &str {
    &op.key.entries[0].1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatch_picks_each_strategy_for_its_shape() {
    let (stores, prefix) = replicas(1, "cross_slot_dispatch").await;
    let store = &stores[0];
    let none = CrossSlotPaths::default();
    let held = |op: &CounterOp| count(&prefix, &format!("k={}", value(op)));
    let untouched = |op: &CounterOp| {
        let pattern = format!("{prefix}*:k={}:*", value(op));
        common::redis::scan_keys(&common::redis::cluster().nodes(), &pattern).is_empty()
    };

    // Single group: two slots of one master are one call, whatever their limits.
    let single = on_one_master("single", 10);
    assert!(store.decide(&single).await.expect("decided")[0].allowed);
    assert_eq!(store.cross_slot_paths(), none, "one group counts no path");
    assert!(single.iter().all(|op| held(op) == 1));

    // Dry run: several groups at once, nothing counted, nothing written.
    let dry = spread_ops("dry", 2, 10);
    assert!(store.dry_run(&dry).await.expect("decided")[0].allowed);
    assert_eq!(store.cross_slot_paths(), none, "a dry run counts no path");
    assert!(dry.iter().all(untouched), "a dry run writes nothing");

    // The race: far from the limits, cold counters race without a check.
    let far = spread_ops("far", 2, 1_000_000);
    let before = store.cross_slot_paths();
    assert!(store.decide(&far).await.expect("decided")[0].allowed);
    let cold = CrossSlotPaths { cold: 1, ..none };
    assert_eq!(moved(before, store.cross_slot_paths()), cold);
    assert!(far.iter().all(|op| held(op) == 1));

    // The ordered walk: near a limit (10, within the margin of 64).
    let near = spread_ops("near", 2, 10);
    let before = store.cross_slot_paths();
    assert!(store.decide(&near).await.expect("decided")[0].allowed);
    let ordered = CrossSlotPaths { ordered: 1, ..none };
    assert_eq!(moved(before, store.cross_slot_paths()), ordered);
    assert!(near.iter().all(|op| held(op) == 1));

    // Denied by the check: the second counter (limit 1) is used up by a request of
    // its own (one group); the request naming both takes nothing from the first.
    let mut deny = spread_ops("deny", 2, 10);
    deny[1].params.limit = 1;
    deny[1].params.burst = 1;
    assert!(store.decide(&deny[1..]).await.expect("decided")[0].allowed);
    let before = store.cross_slot_paths();
    let decisions = store.decide(&deny).await.expect("decided");
    assert!(!decisions[1].allowed, "{decisions:?}");
    let denied = CrossSlotPaths { denied: 1, ..none };
    assert_eq!(moved(before, store.cross_slot_paths()), denied);
    assert!(untouched(&deny[0]), "the check took nothing");
    assert_eq!(held(&deny[1]), 1);

    // A lost race, then the walk, then the second look. Limit 100: a first request
    // races (99 left, above the margin) and leaves a hint of 99; a request of its
    // own (one group) then takes the other 99, so the next race loses on the first
    // counter, gives back what it took on the second, and walks: denied by its check.
    // Denied within RACE_SHADOW of the loss, it is decided once more.
    let lost = spread_ops("lost", 2, 100);
    assert!(store.decide(&lost).await.expect("decided")[0].allowed);
    let mut rest = lost[0].clone();
    rest.cost = 99;
    assert!(store.decide(&[rest]).await.expect("decided")[0].allowed);
    let before = store.cross_slot_paths();
    let started = Instant::now();
    let decisions = store.decide(&lost).await.expect("decided");
    let took = started.elapsed();
    assert!(!decisions[0].allowed, "{decisions:?}");
    let seen = moved(before, store.cross_slot_paths());
    // Raced on the hint, or cold if the machine stalled past the hint's age.
    assert_eq!(seen.hinted + seen.cold, 1, "{seen:?}");
    assert_eq!(
        (seen.fell_back, seen.checked, seen.ordered, seen.denied),
        (1, 0, 0, 0),
        "{seen:?}"
    );
    // The whole call took less than the shadow, so its denial fell within it; a
    // call slower than that may have come out of the shadow before its denial.
    if took < RACE_SHADOW {
        assert_eq!(seen.second_looks, 1, "{seen:?} in {took:?}");
    } else {
        assert!(seen.second_looks <= 1, "{seen:?} in {took:?}");
    }
    assert_eq!(held(&lost[0]), 100);
    assert_eq!(held(&lost[1]), 1, "the lost race's hit was given back");
}
