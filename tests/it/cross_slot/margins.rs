//! Which counters may race at all, on the real cluster: a limit that denies on a wait
//! (a leaky bucket with `max_delay`) always walks, whatever room its queue shows; a
//! hint read under one limit is not used for a request deciding the same counter
//! under another (Envoy's per-descriptor override); a request of shadow operations
//! only is not counted as hinted.

use super::{count, replicas, spread_ops};

use tollgate::algorithm::Algorithm;
use tollgate::store::Store;
use tollgate::store::redis::CrossSlotPaths;

/// The queue's room (`remaining`) is huge, but a request that
/// would wait longer than `max_delay` is denied, so no margin on room protects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaping_limit_never_races_however_much_room_its_queue_shows() {
    let (stores, prefix) = replicas(1, "cross_slot_shaped").await;
    let store = &stores[0];
    let mut ops = spread_ops("shaped", 2, 1_000_000);
    ops[0].key.algorithm = Algorithm::LeakyBucket;
    ops[0].params.algorithm = Algorithm::LeakyBucket;
    ops[0].params.max_delay_ms = Some(60_000);
    // An hour's window: a million per hour are 3.6 ms apart, so four never wait a
    // minute (in a year's they would be 31.5 s apart).
    ops[0].params.window_ms = 3_600_000;
    ops[0].key.window_secs = 3600;
    for _ in 0..4 {
        let decisions = store.decide(&ops).await.expect("decided");
        assert!(decisions.iter().all(|d| d.allowed), "{decisions:?}");
    }
    let seen = store.cross_slot_paths();
    assert_eq!(
        (seen.ordered, seen.checked, seen.hinted, seen.fell_back),
        (4, 0, 0, 0),
        "{seen:?}"
    );
    assert_eq!(count(&prefix, &format!("k={}", ops[1].key.entries[0].1)), 4);
}

/// The same counter key decided under limit 1 000 000 and then
/// under an override of 10. The first requests leave fresh hints far above the
/// margin; the override request must not take them for its own limit, and walks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_read_under_one_limit_is_not_used_under_an_override() {
    let (stores, prefix) = replicas(1, "cross_slot_override").await;
    let store = &stores[0];
    let wide = spread_ops("override", 2, 1_000_000);
    for _ in 0..3 {
        assert!(store.decide(&wide).await.expect("decided")[0].allowed);
    }
    let before = store.cross_slot_paths();
    assert_eq!(before.cold + before.hinted, 3, "{before:?}");
    let mut narrow = wide.clone();
    for op in &mut narrow {
        op.params.limit = 10;
        op.params.burst = 10;
    }
    let decisions = store.decide(&narrow).await.expect("decided");
    assert!(
        decisions.iter().all(|d| d.allowed),
        "4 of 10: {decisions:?}"
    );
    let after = store.cross_slot_paths();
    assert_eq!(
        (after.hinted, after.cold),
        (before.hinted, before.cold),
        "{after:?}"
    );
    assert_eq!(after.ordered, before.ordered + 1, "{after:?}");
    for op in &wide {
        assert_eq!(count(&prefix, &format!("k={}", op.key.entries[0].1)), 4);
    }
}

/// Shadow operations cannot deny a request: it is acquired at once, and not counted
/// as a request that hints let skip its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_shadow_operations_only_is_not_counted_as_hinted() {
    let (stores, prefix) = replicas(1, "cross_slot_shadow").await;
    let store = &stores[0];
    let mut ops = spread_ops("shadow", 2, 1_000_000);
    for op in &mut ops {
        op.vetoes = false;
    }
    for _ in 0..3 {
        assert!(store.decide(&ops).await.expect("decided")[0].allowed);
    }
    assert_eq!(store.cross_slot_paths(), CrossSlotPaths::default());
    for op in &ops {
        assert_eq!(count(&prefix, &format!("k={}", op.key.entries[0].1)), 3);
    }
}
