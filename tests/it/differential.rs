//! The Lua scripts against the Rust models: for every algorithm, at least 10,000
//! random operations (costs including check-only and impossible ones, batches with
//! repeated counters and shadow operations, overdraft and quota charges and releases
//! (`algorithm::Mode`), time standing still, creeping and jumping) go through
//! `lua/batch.lua` on a real Redis (by FCALL of the function library or by EVALSHA,
//! its declared-keys or any-slot entry, at random), with the time injected, and
//! through the memory store (the Rust models) on a manual clock. Each script call
//! carries 1 to 4 requests as segments (some of them dry runs), or a hot counter's
//! 2 to 21 alike requests (sent as runs), as the standalone batcher sends them; a
//! concurrency rule's leases anonymous on one counter and named on the other; the
//! model decides them one after the other. Now and then some limits a call admitted
//! are refunded (`lua/refund.lua` against the models' refunds), as the cluster store
//! gives them back when another slot group denied the request. Every decision
//! must agree exactly: allowed, remaining, reset, retry-after and shaping delay.

use crate::common;

use std::sync::Arc;

use tollgate::algorithm::{Algorithm, Decision, Mode, Params};
use tollgate::clock::ManualClock;
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::scripts::{self, Layout, Refund, Segment, Via, WireOp};
use tollgate::store::{CounterKey, CounterOp};

const OPERATIONS_PER_ALGORITHM: usize = 10_000;

/// SplitMix64: deterministic, so a failure names a seed that reproduces it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn params(algorithm: Algorithm, rng: &mut Rng) -> Params {
    let limit = [1, 3, 7, 20][rng.below(4) as usize];
    let window_ms = [1_000, 60_000, 3_600_000][rng.below(3) as usize];
    let burst = if algorithm.uses_burst() {
        [1, limit, 2 * limit + 1][rng.below(3) as usize]
    } else {
        limit
    };
    let max_delay_ms =
        (algorithm == Algorithm::LeakyBucket && rng.below(2) == 0).then_some(window_ms / 3);
    Params {
        algorithm,
        limit,
        window_ms,
        burst,
        max_delay_ms,
        calendar: None,
    }
}

fn counter(algorithm: Algorithm, name: String, p: &Params) -> CounterKey {
    CounterKey {
        domain: Arc::from("differential"),
        rule: Arc::from(name.as_str()),
        entries: Default::default(),
        algorithm,
        window_secs: p.window_ms / 1000,
        time_zone: None,
        hash_tag: None,
    }
}

fn cost(rng: &mut Rng, p: &Params) -> u64 {
    match rng.below(20) {
        0..=1 => 0,
        2..=4 => 2 + rng.below(3),
        5 => p.burst.max(p.limit) + 1,
        6 if rng.below(10) == 0 => u64::MAX,
        _ => 1,
    }
}

/// What an operation does: mostly a limit, now and then an overdraft or upstream
/// quota charge (where the algorithm defines charges; elsewhere they arrive as
/// limits, as the plan sends them) or a release (which never vetoes, as planned).
fn op(rng: &mut Rng, key: &CounterKey, p: &Params) -> CounterOp {
    let mode = match rng.below(10) {
        0 | 1 if p.algorithm.charge_refusal().is_none() => Mode::Overdraft,
        2 if p.algorithm.charge_refusal().is_none() => Mode::Quota,
        3 => Mode::Release,
        _ => Mode::Limit,
    };
    let mut cost = cost(rng, p);
    if (mode != Mode::Limit || p.algorithm.counts_denials()) && cost == u64::MAX {
        // Charges count in full up to 2^53 on the wire; a charge of 2^64 is no test.
        cost = p.limit * 3 + rng.below(100);
    }
    CounterOp {
        key: key.clone(),
        params: *p,
        cost,
        vetoes: mode != Mode::Release && rng.below(5) != 0,
        mode,
        // A concurrency rule's second counter names its leases (`lease_key`): ids
        // from a few, so a release meets its own lease, another's, a marker, an id
        // acquired twice; or from many.
        lease: (p.algorithm.takes_lease() && key.rule.ends_with("c1")).then(|| {
            let pool = if rng.below(2) == 0 { 6 } else { 1_000 };
            format!("id{}", rng.below(pool)).into()
        }),
    }
}

fn step(rng: &mut Rng, p: &Params) -> u64 {
    let interval = (p.window_ms / p.limit).max(1);
    match rng.below(10) {
        0..=2 => 0,
        3..=5 => rng.below(interval),
        6..=7 => rng.below(interval * 3),
        8 => rng.below(p.window_ms),
        _ => rng.below(3 * p.window_ms),
    }
}

/// A connection to `redis` with the batch (both entries) and refund scripts and the
/// function library loaded, for calls by EVALSHA or FCALL, as in production.
pub(crate) async fn loaded_connection(
    redis: &common::redis::RedisStandalone,
) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for script in [&scripts::BATCH, &scripts::BATCH_ANY_SLOT, &scripts::REFUND] {
        let _: String = script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
    }
    load_library(&mut conn).await;
    conn
}

/// Loads the function library on `conn`'s server, for calls by FCALL.
pub(crate) async fn load_library(conn: &mut redis::aio::MultiplexedConnection) {
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&scripts::LIBRARY.source)
        .query_async(conn)
        .await
        .expect("FUNCTION LOAD");
}

async fn run(algorithm: Algorithm, seed: u64) {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix(&format!("differential_{}", algorithm.name()));
    let mut rng = Rng(seed);
    let start = 1_764_000_000_000 + rng.below(1_000_000);
    let clock = Arc::new(ManualClock::new(start));
    let model = MemoryStore::with_clock(clock.clone());

    let mut now = start;
    let mut done = 0;
    let mut disagreements = Vec::new();
    let mut round = 0;
    while done < OPERATIONS_PER_ALGORITHM {
        // A fresh pair of counters with fresh parameters every few hundred operations.
        let p = params(algorithm, &mut rng);
        let keys = [0, 1].map(|i| counter(algorithm, format!("r{round}c{i}"), &p));
        round += 1;
        for _ in 0..300 {
            now += step(&mut rng, &p);
            clock.set_millis(now);
            // One script call carrying 1 to 4 requests (segments), as the batcher
            // sends them; the model decides the same requests one after the other.
            // Now and then the call is a hot counter's: 2 to 21 alike one-operation
            // requests, which the call sends as one run (scripts/runs.rs).
            let requests: Vec<Vec<CounterOp>> = if rng.below(6) == 0 {
                let key = &keys[rng.below(2) as usize];
                let op = op(&mut rng, key, &p);
                vec![vec![op]; 2 + rng.below(20) as usize]
            } else {
                (0..1 + rng.below(4))
                    .map(|_| {
                        (0..1 + rng.below(3))
                            .map(|_| {
                                let key = &keys[rng.below(2) as usize];
                                op(&mut rng, key, &p)
                            })
                            .collect()
                    })
                    .collect()
            };
            // Now and then a request is a dry run (decide, write nothing), as the
            // limiter sends when another store call already denied it.
            let dry: Vec<bool> = requests.iter().map(|_| rng.below(8) == 0).collect();
            let expected: Vec<Decision> = requests
                .iter()
                .zip(&dry)
                .flat_map(|(ops, &dry)| {
                    if dry {
                        model.dry_run_now(ops)
                    } else {
                        model.decide_now(ops)
                    }
                })
                .collect();
            let redis_keys: Vec<Vec<String>> = requests
                .iter()
                .map(|ops| {
                    ops.iter()
                        .map(|op| format!("{prefix}{}", op.key.rule))
                        .collect()
                })
                .collect();
            let wire: Vec<Vec<WireOp>> = requests
                .iter()
                .map(|ops| ops.iter().map(WireOp::new).collect())
                .collect();
            let segments: Vec<Segment<'_, String>> = redis_keys
                .iter()
                .zip(&wire)
                .zip(&dry)
                .map(|((keys, ops), &dry_run)| Segment { keys, ops, dry_run })
                .collect();
            let n = expected.len();
            // Half the calls by FCALL of the function library (what tollgate sends a
            // Redis 7), half by EVALSHA (its fallback): the same code, both ways in.
            let via = if rng.below(2) == 0 {
                Via::Function
            } else {
                Via::Eval
            };
            // A third by the any-slot entry (keys in ARGV, what the cluster's ordered
            // walk sends): on one node its keys are all local, so it must decide alike.
            let layout = if rng.below(3) == 0 {
                Layout::AnySlot
            } else {
                Layout::Declared
            };
            let reply: Vec<u8> = scripts::batch_cmd_via((layout, via), &segments, Some(now))
                .query_async(&mut conn)
                .await
                .expect("batch script runs");
            let replies = scripts::parse_batch_reply(&reply, n).expect("well-formed reply");
            let got: Vec<Decision> = replies.iter().map(|r| r.decision).collect();
            if got == expected && rng.below(4) == 0 {
                refund_some(
                    &mut rng,
                    (&requests, &dry),
                    &replies,
                    &model,
                    &prefix,
                    &mut conn,
                    now,
                )
                .await;
            }
            if got != expected && disagreements.len() < 5 {
                let shape: Vec<Vec<_>> = requests
                    .iter()
                    .map(|ops| {
                        ops.iter()
                            .map(|o| (o.key.rule.to_string(), o.cost, o.vetoes, o.mode))
                            .collect()
                    })
                    .collect();
                let shape: Vec<_> = shape.into_iter().zip(&dry).collect();
                disagreements.push(format!(
                    "at {now} (seed {seed}, op {done}) params {p:?} requests {shape:?}:\n  model {expected:?}\n  lua   {got:?}"
                ));
            }
            done += n;
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} disagreed:\n{}",
        algorithm.name(),
        disagreements.join("\n")
    );
}

/// Gives back some of the limits a call consumed, as the cluster store does when
/// another slot group of the request denied it: through `lua/refund.lua` with the
/// token each reply carried, and through the model's [`MemoryStore::refund_now`].
/// Only what was consumed is refunded: an admitted limit (a charge or a release
/// commits) of a request neither dry nor denied (a denial consumed nothing).
async fn refund_some(
    rng: &mut Rng,
    (requests, dry): (&[Vec<CounterOp>], &[bool]),
    replies: &[scripts::Reply],
    model: &MemoryStore,
    prefix: &str,
    conn: &mut redis::aio::MultiplexedConnection,
    now: u64,
) {
    let mut refunds = Vec::new();
    let mut at = 0;
    for (ops, &dry) in requests.iter().zip(dry) {
        let mine = &replies[at..at + ops.len()];
        at += ops.len();
        let denied = ops
            .iter()
            .zip(mine)
            .any(|(o, r)| o.vetoes && !r.decision.allowed);
        if dry || denied {
            continue;
        }
        for (op, reply) in ops.iter().zip(mine) {
            let consumed = op.mode == Mode::Limit && op.cost > 0 && reply.decision.allowed;
            if consumed && !op.params.algorithm.counts_denials() && rng.below(2) == 0 {
                model.refund_now(op, reply.token);
                refunds.push(Refund {
                    key: format!("{prefix}{}", op.key.rule),
                    op: WireOp::new(op),
                    token: reply.token,
                });
            }
        }
    }
    if refunds.is_empty() {
        return;
    }
    let refs: Vec<&Refund> = refunds.iter().collect();
    let _: i64 = scripts::refund_cmd(&refs, Some(now))
        .query_async(conn)
        .await
        .expect("refund script runs");
}

/// Every algorithm of the list, each from its own seed (its id), side by side: a new
/// algorithm is proven against its Lua twin without a line here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lua_twin_equals_its_model() {
    let runs = Algorithm::ALL.map(|algorithm| tokio::spawn(run(algorithm, algorithm.id().into())));
    for (algorithm, run) in Algorithm::ALL.into_iter().zip(runs) {
        if let Err(e) = run.await {
            panic!("{}: {e}", algorithm.name());
        }
    }
}
