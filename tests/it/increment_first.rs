//! The increment-first paths (`take` in lua/fixed_window.lua and
//! lua/sliding_window.lua), counted by Redis itself: a limit's hits on a counter cost
//! one INCRBY when the counter holds this window already and INCRBY + SET (its TTL)
//! when it starts one, never a read first; a request vetoed by one of its counters gives back what the others took;
//! and an any-slot call that meets a key its node does not serve (a slot moved away)
//! fails having kept nothing, so the request decided again by slot counts once.

use crate::common;
use crate::differential::{load_library, loaded_connection};
use crate::script_work::fixed_window_op;

use tollgate::algorithm::Algorithm;
use tollgate::store::redis::scripts::{self, Layout, Segment, Via, WireOp};

use common::redis::command_calls as calls;

/// A fixed window of `limit` a day (`script_work`'s), as the scripts read it.
fn limit_op(limit: u64) -> WireOp {
    WireOp::new(&fixed_window_op(limit))
}

fn count_of(conn_port: u16, key: &str) -> u64 {
    common::redis::fixed_window_count(&common::redis::redis_cli(conn_port, &["GET", key]))
}

/// Sends `segments` as one any-slot call `via` FCALL or EVALSHA to a master that does
/// not serve one of their keys: Redis refuses the call.
async fn refused_for_a_key_elsewhere(
    conn: &mut redis::aio::MultiplexedConnection,
    segments: &[Segment<'_, String>],
    via: Via,
) {
    let err = scripts::batch_cmd_via((Layout::AnySlot, via), segments, None)
        .query_async::<Vec<u8>>(conn)
        .await
        .expect_err("a key of another master is refused");
    assert!(err.to_string().contains("non local key"), "{via:?}: {err}");
}

/// A limit of `limit` a day of `algorithm` (`script_work`'s fixed window, switched).
fn op_of(algorithm: Algorithm, limit: u64) -> WireOp {
    let mut op = fixed_window_op(limit);
    op.params.algorithm = algorithm;
    op.key.algorithm = algorithm;
    WireOp::new(&op)
}

/// On Redis's own clock (no injected time: a new counter's shortcut is taken only
/// there), 10 new counters of `algorithm` (one that increments first) and then the
/// same 10 again: no read first, one INCRBY per decision, one SET per new counter (its
/// value and TTL), the answers a model gives on no state and on one hit.
async fn distinct_counters_of(algorithm: Algorithm, ttl_bound_ms: i64) {
    let redis =
        common::redis::custom::private_standalone("increment_first").expect("private redis");
    let port = redis.port();
    let mut conn = loaded_connection(&redis).await;
    let keys: Vec<[String; 1]> = (0..10).map(|i| [format!("inc:k{i}")]).collect();
    let one = [op_of(algorithm, 1000)];
    let segments: Vec<Segment<'_, String>> = keys
        .iter()
        .map(|k| Segment {
            keys: k,
            ops: &one,
            dry_run: false,
        })
        .collect();
    for call in 1..=2u64 {
        let reply: Vec<u8> = scripts::batch_cmd(&segments, None)
            .query_async(&mut conn)
            .await
            .expect("batch script runs");
        let replies = scripts::parse_batch_reply(&reply, 10).expect("well-formed reply");
        let name = algorithm.name();
        assert!(
            replies.iter().all(|r| r.decision.remaining == 1000 - call),
            "{name}, call {call}: {replies:?}"
        );
        assert_eq!(calls(port, "get"), 0, "{name}, call {call}: no read first");
        assert_eq!(
            calls(port, "incrby"),
            10 * call,
            "{name}, call {call}: one INCRBY each"
        );
        // A new counter's window (and TTL) is one SET, the first call's only.
        assert_eq!(calls(port, "set"), 10, "{name}, call {call}");
    }
    for k in &keys {
        let ttl = common::redis::redis_cli(port, &["PTTL", &k[0]]);
        let ttl: i64 = ttl.trim().parse().expect("PTTL");
        assert!(ttl > 0 && ttl <= ttl_bound_ms, "{}: PTTL {ttl}", k[0]);
    }
}

#[tokio::test]
async fn a_sliding_window_costs_one_command_a_decision_too() {
    // Its TTL: two windows from the window's start.
    distinct_counters_of(Algorithm::SlidingWindow, 2 * 86_400_000).await;
}

#[tokio::test]
async fn distinct_counters_cost_one_command_each_and_a_veto_keeps_nothing() {
    distinct_counters_of(Algorithm::FixedWindow, 86_400_000).await;
    let redis =
        common::redis::custom::private_standalone("increment_first").expect("private redis");
    let port = redis.port();
    let mut conn = loaded_connection(&redis).await;
    let keys: Vec<[String; 1]> = (0..10).map(|i| [format!("inc:k{i}")]).collect();
    let one = [limit_op(1000)];
    let segments: Vec<Segment<'_, String>> = keys
        .iter()
        .map(|k| Segment {
            keys: k,
            ops: &one,
            dry_run: false,
        })
        .collect();
    for _ in 0..2 {
        let _: Vec<u8> = scripts::batch_cmd(&segments, None)
            .query_async(&mut conn)
            .await
            .expect("batch script runs");
    }

    // A request of three counters, the last at its limit: denied whole, and the two
    // others hold what they held (one new, one with 2 hits), answering as without it.
    let three = [limit_op(1000), limit_op(1000), limit_op(1)];
    let req = [
        String::from("inc:new"),
        keys[0][0].clone(),
        String::from("inc:full"),
    ];
    let full = [String::from("inc:full")];
    let fill: Vec<u8> = scripts::batch_cmd(
        &[Segment {
            keys: &full,
            ops: &three[2..],
            dry_run: false,
        }],
        None,
    )
    .query_async(&mut conn)
    .await
    .expect("fills the small counter");
    assert_eq!(
        scripts::parse_batch_reply(&fill, 1).expect("reply")[0]
            .decision
            .remaining,
        0
    );
    let reply: Vec<u8> = scripts::batch_cmd(
        &[Segment {
            keys: &req,
            ops: &three,
            dry_run: false,
        }],
        None,
    )
    .query_async(&mut conn)
    .await
    .expect("batch script runs");
    let replies = scripts::parse_batch_reply(&reply, 3).expect("well-formed reply");
    assert!(!replies[2].decision.allowed, "{:?}", replies[2].decision);
    assert_eq!(
        replies[0].decision.remaining, 1000,
        "{:?}",
        replies[0].decision
    );
    assert_eq!(
        replies[1].decision.remaining, 998,
        "{:?}",
        replies[0].decision
    );
    assert_eq!(count_of(port, "inc:new"), 0);
    assert_eq!(count_of(port, &keys[0][0]), 2);
    assert_eq!(count_of(port, "inc:full"), 1);
}

/// Two keys of one master and a key of another (under `prefix`), and a connection to
/// the first master with the any-slot script loaded: a call that takes two counters
/// and is refused at the third.
async fn two_here_one_away(
    cluster: &common::redis::RedisCluster,
    prefix: &str,
) -> (Vec<String>, String, redis::aio::MultiplexedConnection) {
    let home = cluster.master_for_key(&format!("{prefix}a0"));
    let mut mine = Vec::new();
    let mut away = None;
    for i in 0..1000 {
        let key = format!("{prefix}a{i}");
        if cluster.master_for_key(&key) == home {
            if mine.len() < 2 {
                mine.push(key);
            }
        } else if away.is_none() {
            away = Some(key);
        }
        if mine.len() == 2 && away.is_some() {
            break;
        }
    }
    let away = away.expect("a key of another master");
    let client = redis::Client::open(format!("redis://{home}/")).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the master");
    let _: String = scripts::BATCH_ANY_SLOT
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    (mine, away, conn)
}

/// Two keys of one master and, last, a key of another, sent to the first master as one
/// any-slot call (as after a reshard moved the last key's slot away): Redis refuses
/// the command touching the last key, after the first two were taken. The call fails
/// as a misroute and the first two hold nothing, by EVALSHA and by FCALL; a request of
/// the same call vetoed before that is given back once, not twice.
#[tokio::test]
async fn an_any_slot_call_refused_midway_keeps_nothing() {
    let cluster = common::redis::cluster();
    let prefix = common::redis::unique_prefix("increment_first_any");
    assert!(cluster.masters().len() >= 2, "a cluster of several masters");
    let (mine, away, mut conn) = two_here_one_away(cluster, &prefix).await;
    let keys = [mine[0].clone(), mine[1].clone(), away.clone()];
    load_library(&mut conn).await;
    let ops = [limit_op(1000)];
    let segments: Vec<Segment<'_, String>> = keys
        .chunks(1)
        .map(|k| Segment {
            keys: k,
            ops: &ops,
            dry_run: false,
        })
        .collect();
    for via in [Via::Eval, Via::Function] {
        refused_for_a_key_elsewhere(&mut conn, &segments, via).await;
        for key in &mine {
            let stored = common::redis::redis_cli_cluster(cluster, &["GET", key]);
            assert_eq!(
                common::redis::fixed_window_count(&stored),
                0,
                "{via:?}: {key} keeps nothing: {stored:?}"
            );
        }
    }

    // A request vetoed earlier in the call (its first counter taken, then given back
    // at the veto) is given back once, not again when the call fails.
    let one = [mine[0].clone()];
    let fill = [Segment {
        keys: &one[..],
        ops: &ops,
        dry_run: false,
    }];
    let _: Vec<u8> = scripts::batch_cmd_in(Layout::AnySlot, &fill, None)
        .query_async(&mut conn)
        .await
        .expect("a local key is served");
    let vetoed_ops = [limit_op(1000), limit_op(0)];
    let pair = [mine[0].clone(), mine[1].clone()];
    let last = [away.clone()];
    let segments = [
        Segment {
            keys: &pair[..],
            ops: &vetoed_ops[..],
            dry_run: false,
        },
        Segment {
            keys: &last[..],
            ops: &ops[..],
            dry_run: false,
        },
    ];
    for via in [Via::Eval, Via::Function] {
        refused_for_a_key_elsewhere(&mut conn, &segments, via).await;
        let stored = common::redis::redis_cli_cluster(cluster, &["GET", &mine[0]]);
        assert_eq!(
            common::redis::fixed_window_count(&stored),
            1,
            "{via:?}: {} holds its one hit: {stored:?}",
            mine[0]
        );
    }
}

/// Every module's fast path gives back what it took when an any-slot call is refused
/// midway: a counter that held a state holds it again, byte for byte, and one the call
/// made holds nothing (the fixed window and the sliding window add in place; the
/// buckets write their idle value first: timed.lua).
#[tokio::test]
async fn every_fast_path_gives_back_what_it_took_when_a_call_is_refused() {
    use tollgate::algorithm::{Algorithm, Mode, Params};
    use tollgate::store::{CounterKey, CounterOp};
    let cluster = common::redis::cluster();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let prefix = common::redis::unique_prefix(&format!("fast_back_{}", algorithm.name()));
        let (mine, away, mut conn) = two_here_one_away(cluster, &prefix).await;
        let op = CounterOp {
            key: CounterKey {
                domain: std::sync::Arc::from("fast_back"),
                rule: std::sync::Arc::from("r"),
                entries: Default::default(),
                algorithm,
                window_secs: 3600,
                time_zone: None,
                hash_tag: None,
            },
            params: Params {
                algorithm,
                limit: 1000,
                window_ms: 3_600_000,
                burst: 1000,
                max_delay_ms: None,
                calendar: None,
            },
            cost: 1,
            vetoes: true,
            mode: Mode::Limit,
            lease: None,
        };
        let ops = [WireOp::new(&op)];
        fn one<'a>(keys: &'a [String], ops: &'a [WireOp]) -> Vec<Segment<'a, String>> {
            keys.chunks(1)
                .map(|k| Segment {
                    keys: k,
                    ops,
                    dry_run: false,
                })
                .collect()
        }
        // mine[0] holds a state; mine[1] none.
        let first = [mine[0].clone()];
        let _: Vec<u8> = scripts::batch_cmd_in(Layout::AnySlot, &one(&first, &ops), None)
            .query_async(&mut conn)
            .await
            .expect("a local key is served");
        let get = |key: &str| common::redis::redis_cli_cluster(cluster, &["GET", key]);
        let before = get(&mine[0]);
        assert!(!before.is_empty(), "{}: a state to keep", algorithm.name());
        let keys = [mine[0].clone(), mine[1].clone(), away];
        refused_for_a_key_elsewhere(&mut conn, &one(&keys, &ops), Via::Eval).await;
        assert_eq!(get(&mine[0]), before, "{}: as it was", algorithm.name());
        // A fixed window's new key may stay as its window's value of no hits (the
        // hits went back by INCRBY): no count, as no key.
        let made = get(&mine[1]);
        let nothing = made.is_empty()
            || (algorithm == Algorithm::FixedWindow
                && common::redis::fixed_window_count(&made) == 0);
        assert!(nothing, "{}: nothing kept: {made:?}", algorithm.name());
    }
}
