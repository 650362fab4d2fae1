//! A rolling upgrade from tollgate 0.1 never over-admits: 0.1's batch script (its Lua,
//! kept as it was released in `tests/fixtures/tollgate-0.1/`, assembled and called as
//! 0.1 did) and this release's engine writing 0.1's layouts (`--state-layout 0.1`)
//! decide the same counters on one Redis, on Redis's clock, calls of the two
//! interleaved at random: each algorithm 0.1 had admits exactly its limit, whichever
//! build took each call. Once every replica is new, the engine writes its own layouts
//! and reads 0.1's: the counts carry over. And why the setting exists: without it,
//! 0.1 cannot read what the engine writes.

use crate::common;
use crate::differential::loaded_connection;

use std::sync::Arc;

use tollgate::algorithm::{Algorithm, Mode, Params};
use tollgate::store::redis::scripts::{self, Segment, StateLayout, WireOp};
use tollgate::store::{CounterKey, CounterOp};

const LIMIT: u64 = 20;

/// 0.1's batch script: its helpers, its six modules, the list of their tables (an
/// algorithm's id is its place, as today), then its entry point.
fn script_0_1() -> redis::Script {
    let lua = |name: &str| {
        let path = format!(
            "{}/tests/fixtures/tollgate-0.1/lua/{name}.lua",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let modules = [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
        "leaky_bucket",
    ];
    let mut body = lua("common");
    for module in modules {
        body.push('\n');
        body.push_str(&lua(module));
    }
    body.push_str(&format!(
        "\nlocal algorithms = {{ {} }}\n",
        modules.join(", ")
    ));
    body.push_str(&lua("batch"));
    redis::Script::new(&body)
}

fn params(algorithm: Algorithm) -> Params {
    Params {
        algorithm,
        limit: LIMIT,
        window_ms: 3_600_000,
        burst: LIMIT,
        max_delay_ms: None,
        calendar: None,
    }
}

/// One request of one hit on `key`, by 0.1's script (its arguments: the clock, one
/// segment of one operation, the operation's seven numbers); whether it was admitted.
async fn decide_0_1(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    algorithm: Algorithm,
) -> redis::RedisResult<bool> {
    let p = params(algorithm);
    let reply: Vec<i64> = script
        .key(key)
        .arg("")
        .arg(1)
        .arg(1)
        .arg(0)
        .arg(algorithm.id())
        .arg(p.limit)
        .arg(p.window_ms)
        .arg(p.burst)
        .arg(-1)
        .arg(1)
        .arg(1)
        .invoke_async(conn)
        .await?;
    Ok(reply[0] == 1)
}

/// One request of one hit on `key` by this release's engine, writing `layouts`.
async fn decide_now(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    algorithm: Algorithm,
    layouts: StateLayout,
) -> bool {
    let op = CounterOp {
        key: CounterKey {
            domain: Arc::from("upgrade"),
            rule: Arc::from("r"),
            entries: Default::default(),
            algorithm,
            window_secs: 3600,
            time_zone: None,
            hash_tag: None,
        },
        params: params(algorithm),
        cost: 1,
        vetoes: true,
        mode: Mode::Limit,
        lease: None,
    };
    let keys = [key.to_owned()];
    let wire = [WireOp::new(&op)];
    let segments = [Segment {
        keys: &keys,
        ops: &wire,
        dry_run: false,
    }];
    let reply: Vec<u8> = scripts::batch_cmd_writing(layouts, &segments, None)
        .query_async(conn)
        .await
        .expect("the engine decides");
    scripts::parse_batch_reply(&reply, 1).expect("a reply")[0]
        .decision
        .allowed
}

/// The algorithms 0.1 had whose layouts changed since, with the Redis type 0.1 keeps
/// each in.
const CHANGED: [(Algorithm, &str); 5] = [
    (Algorithm::FixedWindow, "hash"),
    (Algorithm::SlidingWindow, "hash"),
    (Algorithm::TokenBucket, "hash"),
    (Algorithm::Gcra, "string"),
    (Algorithm::LeakyBucket, "string"),
];

#[tokio::test]
async fn old_and_new_builds_on_one_redis_admit_exactly_the_limit() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let old = script_0_1();
    let prefix = common::redis::unique_prefix("upgrade");
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for (algorithm, kind) in CHANGED {
        let key = format!("{prefix}{}", algorithm.name());
        let mut admitted = 0;
        for _ in 0..3 * LIMIT {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let ok = if seed.is_multiple_of(2) {
                decide_0_1(&mut conn, &old, &key, algorithm)
                    .await
                    .expect("0.1 reads what the engine writes for it")
            } else {
                decide_now(&mut conn, &key, algorithm, StateLayout::V0_1).await
            };
            admitted += u64::from(ok);
        }
        assert_eq!(
            admitted,
            LIMIT,
            "{}: whichever build decided",
            algorithm.name()
        );
        let stored: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        assert_eq!(stored, kind, "{}: still 0.1's layout", algorithm.name());
        // Every replica new: the engine's own layouts, 0.1's read, the count carried.
        for _ in 0..5 {
            assert!(
                !decide_now(&mut conn, &key, algorithm, StateLayout::Compact).await,
                "{}: the count carries over the upgrade",
                algorithm.name()
            );
        }
    }
}

/// Why `--state-layout 0.1` exists: 0.1 does not read the engine's own layouts. Its
/// hash reads fail (a fixed window, a sliding window, a token bucket: the call fails,
/// and its failure_mode answers), and its decimal reads find no number (GCRA, the
/// leaky bucket: no state, a full bucket).
#[tokio::test]
async fn without_the_setting_0_1_cannot_read_what_the_engine_writes() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let old = script_0_1();
    let prefix = common::redis::unique_prefix("upgrade_compact");
    for (algorithm, kind) in CHANGED {
        let key = format!("{prefix}{}", algorithm.name());
        for _ in 0..LIMIT {
            assert!(decide_now(&mut conn, &key, algorithm, StateLayout::Compact).await);
        }
        let read = decide_0_1(&mut conn, &old, &key, algorithm).await;
        match kind {
            "hash" => assert!(read.is_err(), "{}: {read:?}", algorithm.name()),
            _ => assert_eq!(read.ok(), Some(true), "{}: no state read", algorithm.name()),
        }
    }
}
