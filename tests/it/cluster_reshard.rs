//! Slots moving between masters while tollgate decides, at the store, on clusters of
//! their own: what the per-master batch calls (one any-slot script call per master,
//! `src/store/redis/misroute.rs`) do when a key is not where the slot map said.
//!
//! - One slot, step by step: a counter whose slot is being migrated is decided where
//!   its key still is; once the key has left, the master's call fails ("non local
//!   key") and the request is decided again by slot, through ASK, on the node that
//!   now holds the count: never read as empty.
//! - A live reshard under load: 2 x 1000 slots move there and back while requests of
//!   1 to 3 counters on every master's slots fill cold counters, and every other
//!   request asks for a hot counter, one of 30 whose slots are among those that move,
//!   held at its limit throughout (a moved key read as empty would admit it again).
//!   Every counter's admissions are counted and none may pass its limit; each hot
//!   counter must have been asked for while its slot moved, and Redis must hold what
//!   was admitted (each hot counter exactly its limit); the only errors are the
//!   store's own (which the domain's failure_mode answers).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster_faults::reshard;
use common::redis::custom::private_cluster;
use common::redis::{RedisCluster, cluster_nodes, redis_cli};
use tollgate::store::redis::connect::RedisTarget;
use tollgate::store::redis::{RedisStore, keys, slot_of};
use tollgate::store::{CounterOp, Store};

fn port(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// A fixed-window counter `value` of limit `limit` per year (no window ends during a
/// test).
fn op(value: &str, limit: u64) -> CounterOp {
    common::stores::yearly("reshard", value, limit)
}

async fn store_on(cluster: &RedisCluster, test: &str) -> (RedisStore, String) {
    let options = common::stores::options(RedisTarget::Cluster(cluster.seed_urls()), test);
    let prefix = options.key_prefix.clone();
    (common::stores::connect(&options).await, prefix)
}

/// The node id of each master, by address.
fn ids(cluster: &RedisCluster) -> BTreeMap<String, String> {
    cluster_nodes(port(&cluster.masters()[0]))
        .into_iter()
        .filter(|n| n.is_master())
        .map(|n| (n.addr, n.id))
        .collect()
}

/// The count a fixed-window counter holds on the node at `port` (0 when absent).
fn count_at(port: u16, key: &str) -> u64 {
    common::redis::fixed_window_count(&redis_cli(port, &["GET", key]))
}

/// [`count_at`] on a node importing the key's slot (ASKING first, as a client sent
/// there by ASK does).
fn count_asking(port: u16, key: &str) -> u64 {
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("connect");
    let (stored,): (Option<String>,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("GET")
        .arg(key)
        .query(&mut connection)
        .expect("ASKING GET");
    common::redis::fixed_window_count(&stored.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_in_a_migrating_slot_is_decided_where_its_key_is() {
    let cluster = blocking(|| private_cluster().expect("private cluster")).await;
    let (store, prefix) = store_on(&cluster, "reshard_ask").await;
    let counter = op("migrating", 5);
    let key = keys::encode(&prefix, &counter.key);
    let slot = slot_of(&key).to_string();
    let from = cluster.master_for_key(&key);
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| *m != from)
        .expect("another master");
    let ids = ids(&cluster);
    let (a, b) = (port(&from), port(&to));
    let ops = [counter];
    for _ in 0..3 {
        assert!(store.decide(&ops).await.expect("decided")[0].allowed);
    }
    assert_eq!(count_at(a, &key), 3);

    // The slot starts moving; the key is still on its old master, which serves it.
    redis_cli(b, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &ids[&from]]);
    redis_cli(a, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &ids[&to]]);
    assert!(store.decide(&ops).await.expect("decided")[0].allowed);
    assert_eq!(count_at(a, &key), 4);
    assert_eq!(store.cross_slot_paths().misrouted, 0);

    // The key moves; the slot is still the old master's. Its call meets a key that
    // left ("non local key"), and the request goes by slot: ASK to the new node,
    // which holds the count of 4, so the fifth is admitted and the sixth denied.
    let moved = redis_cli(
        a,
        &["MIGRATE", "127.0.0.1", &b.to_string(), &key, "0", "5000"],
    );
    assert_eq!(moved.trim(), "OK", "MIGRATE");
    let fifth = store.decide(&ops).await.expect("decided")[0];
    assert!(fifth.allowed && fifth.remaining == 0, "{fifth:?}");
    assert!(store.cross_slot_paths().misrouted >= 1);
    assert_eq!(count_asking(b, &key), 5);
    let sixth = store.decide(&ops).await.expect("decided")[0];
    assert!(!sixth.allowed, "read as empty on the old master: {sixth:?}");

    // The move completes; until the store's map learns it, its calls to the old
    // master fail the same way and go by slot (MOVED): still denied, still 5.
    for port in [a, b] {
        redis_cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &ids[&to]]);
    }
    for _ in 0..3 {
        assert!(!store.decide(&ops).await.expect("decided")[0].allowed);
    }
    assert_eq!(count_at(b, &key), 5);
}

/// Cold counters: requests of 1 to 3 counters drawn from `COUNTERS`, each of limit
/// `LIMIT`: far enough above the race margin (64) that requests on fresh counters race
/// all at once, few enough that the counters fill during the move and walk near the
/// limit.
const COUNTERS: usize = 100;
const LIMIT: u64 = 100;
/// Hot counters: `HOT` counters whose slots are among those that move, each filled to
/// `LIMIT` before the move and asked for by every other request throughout it, alone
/// or with a cold counter. A moved key read as empty would admit again: any admission
/// of a hot counter is one over its limit.
const HOT: usize = 30;
const WORKERS: usize = 16;
/// Slots moved there and back: the first master's lowest (redis-cli moves a source's
/// slots in order).
const MOVED: usize = 1000;

/// What the workers saw: admissions per counter, hot counters' decisions while their
/// slots moved, errors by message.
#[derive(Default)]
struct Seen {
    admitted: Vec<u64>,
    decided_while_moving: Vec<u64>,
    errors: BTreeMap<String, u64>,
}

/// The counters of request `i` (indices into the cold counters, then the hot ones at
/// `COUNTERS..`): every other request names a hot counter (every fourth with a cold
/// one too); the others 1 to 3 cold counters, spread (the strides are prime to
/// `COUNTERS` only in part, so counters meet in many combinations).
fn request(i: u64) -> Vec<usize> {
    let (n, j) = (COUNTERS as u64, i / 2);
    let mut picked: Vec<usize> = if i % 2 == 1 {
        let hot = COUNTERS + (j % HOT as u64) as usize;
        if i % 4 == 3 {
            vec![hot, (j * 11 % n) as usize]
        } else {
            vec![hot]
        }
    } else {
        [j * 7, j * 13 + 1, j * 31 + 2][..(j % 3 + 1) as usize]
            .iter()
            .map(|x| (x % n) as usize)
            .collect()
    };
    picked.sort_unstable();
    picked.dedup();
    picked
}

async fn worker(
    store: Arc<RedisStore>,
    ops: Arc<Vec<CounterOp>>,
    seen: Arc<Mutex<Seen>>,
    next: Arc<AtomicU64>,
    (moving, stop): (Arc<AtomicBool>, Arc<AtomicBool>),
) {
    while !stop.load(Ordering::Relaxed) {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let picked = request(i);
        let mine: Vec<CounterOp> = picked.iter().map(|&c| ops[c].clone()).collect();
        let began_moving = moving.load(Ordering::SeqCst);
        let result = store.decide(&mine).await;
        let while_moving = began_moving && moving.load(Ordering::SeqCst);
        let mut seen = seen.lock().expect("seen");
        match result {
            Ok(decisions) => {
                if decisions.iter().all(|d| d.allowed) {
                    for &c in &picked {
                        seen.admitted[c] += 1;
                    }
                }
                for &c in picked.iter().filter(|&&c| c >= COUNTERS) {
                    seen.decided_while_moving[c - COUNTERS] += u64::from(while_moving);
                }
            }
            Err(e) => *seen.errors.entry(e.to_string()).or_default() += 1,
        }
    }
}

/// Cold counters admitted up to their limit so far.
fn full(seen: &Mutex<Seen>) -> usize {
    let seen = seen.lock().expect("seen");
    seen.admitted[..COUNTERS]
        .iter()
        .filter(|&&a| a == LIMIT)
        .count()
}

/// The `count` lowest slots the master at `addr` serves.
fn lowest_slots(addr: &str, count: usize) -> BTreeSet<u16> {
    cluster_nodes(port(addr))
        .into_iter()
        .find(|n| n.addr == addr)
        .expect("the master")
        .slots
        .into_iter()
        .flatten()
        .take(count)
        .collect()
}

/// Whether the master at `addr` serves every slot of `slots` (asking it).
fn serves(addr: &str, slots: &BTreeSet<u16>) -> bool {
    let node = cluster_nodes(port(addr))
        .into_iter()
        .find(|n| n.addr == addr)
        .expect("the master");
    slots.iter().all(|&slot| node.owns_slot(slot))
}

/// Moves the [`MOVED`] lowest slots of the master at `from` to the one at `to` with
/// redis-cli (asking `seed`): how many moved, and whether `to` now serves all of
/// `slots`.
fn leg(
    seed: &str,
    (from, to): (&str, &str),
    ids: &BTreeMap<String, String>,
    slots: &BTreeSet<u16>,
) -> (usize, bool) {
    let moved = reshard(seed, &ids[from], &ids[to], MOVED);
    (moved, serves(to, slots))
}

/// `HOT` counters whose keys (under `prefix`) fall in `slots`.
fn hot_counters(prefix: &str, slots: &BTreeSet<u16>) -> Vec<CounterOp> {
    (0..)
        .map(|i| op(&format!("hot{i}"), LIMIT))
        .filter(|o| slots.contains(&slot_of(&keys::encode(prefix, &o.key))))
        .take(HOT)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_moving_between_masters_mid_run_are_never_over_admitted() {
    let cluster = Arc::new(blocking(|| private_cluster().expect("private cluster")).await);
    let (store, prefix) = store_on(&cluster, "reshard_live").await;
    let store = Arc::new(store);
    let masters = cluster.masters();
    let ids = ids(&cluster);
    let moving_slots = lowest_slots(&masters[0], MOVED);
    let hot = hot_counters(&prefix, &moving_slots);
    // The hot counters start at their limit (one charge of LIMIT hits each).
    for counter in &hot {
        let fill = CounterOp {
            cost: LIMIT,
            ..counter.clone()
        };
        assert!(store.decide(&[fill]).await.expect("filled")[0].allowed);
    }
    let ops: Arc<Vec<CounterOp>> = Arc::new(
        (0..COUNTERS)
            .map(|c| op(&format!("c{c}"), LIMIT))
            .chain(hot.iter().cloned())
            .collect(),
    );
    let mut admitted = vec![0; COUNTERS];
    admitted.extend([LIMIT; HOT]);
    let seen = Arc::new(Mutex::new(Seen {
        admitted,
        decided_while_moving: vec![0; HOT],
        ..Seen::default()
    }));
    let (next, moving, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            tokio::spawn(worker(
                store.clone(),
                ops.clone(),
                seen.clone(),
                next.clone(),
                (moving.clone(), stop.clone()),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = Instant::now();
    moving.store(true, Ordering::SeqCst);
    let plan = Arc::new((masters.clone(), ids, moving_slots.clone()));
    let p = plan.clone();
    let (moved_there, arrived) = blocking(move || {
        let (m, ids, slots) = &*p;
        leg(&m[2], (&m[0], &m[1]), ids, slots)
    })
    .await;
    let p = plan.clone();
    let (moved_back, returned) = blocking(move || {
        let (m, ids, slots) = &*p;
        leg(&m[2], (&m[1], &m[0]), ids, slots)
    })
    .await;
    moving.store(false, Ordering::SeqCst);
    let resharding = began.elapsed();
    // Traffic goes on past the move until most cold counters are full (so they are
    // asked for at their limit too), and at least 2 s, so counters filled during the
    // move are asked again.
    let after = Instant::now();
    while after.elapsed() < Duration::from_secs(2)
        || (full(&seen) <= COUNTERS / 2 && after.elapsed() < Duration::from_secs(60))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!((moved_there, moved_back), (MOVED, MOVED), "slots moved");
    assert!(
        arrived && returned,
        "the hot counters' slots moved there and back"
    );

    let seen = seen.lock().expect("seen");
    let requests = next.load(Ordering::Relaxed);
    let paths = store.cross_slot_paths();
    let full = seen.admitted[..COUNTERS]
        .iter()
        .filter(|&&a| a >= LIMIT)
        .count();
    eprintln!(
        "FIGURES live reshard: 2 x {MOVED} slots in {:.1} s under {requests} requests; \
         {full} of {COUNTERS} cold counters reached their limit; hot counters decided \
         while moving {:?}; errors {:?}; paths {paths:?}",
        resharding.as_secs_f64(),
        seen.decided_while_moving,
        seen.errors,
    );
    let over: Vec<(usize, u64)> = (0..COUNTERS + HOT)
        .map(|c| (c, seen.admitted[c]))
        .filter(|&(_, a)| a > LIMIT)
        .collect();
    assert!(over.is_empty(), "over-admitted counters: {over:?}");
    let idle: Vec<usize> = (0..HOT)
        .filter(|&h| seen.decided_while_moving[h] < 3)
        .collect();
    assert!(
        idle.is_empty(),
        "hot counters hardly asked for while their slots moved: {idle:?} ({:?})",
        seen.decided_while_moving
    );
    assert!(full > COUNTERS / 2, "too few counters reached their limit");
    assert!(paths.misrouted > 0, "no call met a moved key: {paths:?}");
    let errors: u64 = seen.errors.values().sum();
    assert!(
        errors * 100 <= requests,
        "more than 1% of requests failed: {:?}",
        seen.errors
    );
    // Redis holds what was admitted: no refund lost, nothing consumed twice (an
    // errored request may have consumed: at most that much more), and every hot
    // counter exactly its limit.
    let held: Vec<u64> = ops
        .iter()
        .map(|o| {
            let key = keys::encode(&prefix, &o.key);
            common::redis::fixed_window_count(&common::redis::redis_cli_cluster(
                &cluster,
                &["GET", &key],
            ))
        })
        .collect();
    assert_eq!(
        &held[COUNTERS..],
        &[LIMIT; HOT],
        "the hot counters hold their limit"
    );
    let (held, admitted): (u64, u64) = (held.iter().sum(), seen.admitted.iter().sum());
    assert!(
        held >= admitted && held <= admitted + 3 * errors,
        "Redis holds {held}, admitted {admitted}, errors {errors}"
    );
}
