//! Redis memory per tracked key, for each algorithm, measured on real keys: counters
//! are written through `RedisStore` (the production scripts, the production key
//! encoding `store::redis::keys::encode`, the shard's own clock) on the test harness's
//! standalone Redis, then `MEMORY USAGE key SAMPLES 0` (every element counted, not
//! sampled) is read for each. sliding_log is measured with full logs at limits 10,
//! 100, 1000 and 10,000 (its `MAX_LIMIT`). The table prints with `--nocapture`:
//!
//! `cargo test --test it memory_usage -- --nocapture`

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Params, sliding_log};
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget};
use tollgate::store::redis::keys;
use tollgate::store::{CounterKey, CounterOp, Store};

/// One hour: nothing expires while a log fills.
const WINDOW_SECS: u64 = 3600;
/// Hits per script call while filling a log (each call is one atomic batch).
const FILL_BATCH: u64 = 50;

/// A counter as the limiter builds it for `tenant_id=acme-corp, remote_address=...`
/// in domain `api`: the shape (and length) of a real key.
fn op(algorithm: Algorithm, limit: u64, cost: u64) -> CounterOp {
    let entries = [
        ("tenant_id".into(), "acme-corp".into()),
        ("remote_address".into(), "203.0.113.42".into()),
    ]
    .into_iter()
    .collect();
    CounterOp {
        key: CounterKey {
            domain: Arc::from("api"),
            rule: Arc::from(format!("tenant_id.remote_address.{limit}").as_str()),
            entries,
            algorithm,
            window_secs: WINDOW_SECS,
            time_zone: None,
            hash_tag: None,
        },
        params: Params {
            algorithm,
            limit,
            window_ms: WINDOW_SECS * 1000,
            burst: limit,
            max_delay_ms: None,
            calendar: None,
        },
        cost,
        vetoes: true,
        mode: tollgate::algorithm::Mode::Limit,
        lease: None,
    }
}

async fn store() -> RedisStore {
    let options = RedisOptions {
        target: RedisTarget::Standalone(common::redis::standalone().url()),
        auth: None,
        // The default CACHE_KEY_PREFIX: empty, so the key is what production writes.
        key_prefix: String::new(),
        timeout: Duration::from_secs(60),
        connect_timeout: Duration::from_secs(10),
        tls: Default::default(),
        state_layout: Default::default(),
    };
    RedisStore::connect(&options)
        .await
        .expect("connect to the test Redis")
}

/// `MEMORY USAGE key SAMPLES 0`, in bytes.
fn memory_usage(key: &str) -> u64 {
    let reply = common::redis::cli(
        common::redis::standalone(),
        &["MEMORY", "USAGE", key, "SAMPLES", "0"],
    );
    reply
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("MEMORY USAGE {key}: {reply:?}"))
}

fn encoding(key: &str) -> String {
    common::redis::cli(common::redis::standalone(), &["OBJECT", "ENCODING", key])
}

/// Sends `hits` hits of cost 1, `FILL_BATCH` per call, all of which must be admitted.
async fn hit(store: &RedisStore, template: &CounterOp, hits: u64) {
    let mut left = hits;
    while left > 0 {
        let n = left.min(FILL_BATCH);
        let one = CounterOp {
            cost: 1,
            ..template.clone()
        };
        let ops = vec![one; n as usize];
        let decisions = store.decide(&ops).await.expect("the store decides");
        assert!(
            decisions.iter().all(|d| d.allowed),
            "every hit of the fill is admitted"
        );
        left -= n;
        // A pause between calls gives the buckets fractional state, as real traffic does.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

struct Row {
    algorithm: Algorithm,
    limit: u64,
    hits: u64,
    key_len: usize,
    bytes: u64,
    /// The same value under a 1-byte key name: what the state itself costs.
    short_key_bytes: u64,
    encoding: String,
}

/// Measures `key`, then the same value renamed to a 1-byte key (deleted after).
fn measure(algorithm: Algorithm, limit: u64, hits: u64, key: &str) -> Row {
    let redis = common::redis::standalone();
    let bytes = memory_usage(key);
    let encoding = encoding(key);
    common::redis::cli(redis, &["RENAME", key, "m"]);
    let short_key_bytes = memory_usage("m");
    common::redis::cli(redis, &["DEL", "m"]);
    Row {
        algorithm,
        limit,
        hits,
        key_len: key.len(),
        bytes,
        short_key_bytes,
        encoding,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_per_tracked_key() {
    let store = store().await;
    let mut rows = Vec::new();
    // The counters with constant state, after a few hits. 70 per hour makes W / L a
    // fraction (51428.57 ms), so GCRA and leaky-bucket times are stored as floats, the
    // usual case, not as integers.
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let template = op(algorithm, 70, 1);
        hit(&store, &template, 3).await;
        rows.push(measure(algorithm, 70, 3, &keys::encode("", &template.key)));
    }
    // sliding_log: one member per hit, so full logs at growing limits.
    for limit in [10, 100, 1000, sliding_log::MAX_LIMIT] {
        let template = op(Algorithm::SlidingLog, limit, 1);
        hit(&store, &template, limit).await;
        let key = keys::encode("", &template.key);
        let members = common::redis::cli(common::redis::standalone(), &["ZCARD", &key]);
        assert_eq!(
            members,
            limit.to_string(),
            "a full log holds one member per hit"
        );
        let full = CounterOp {
            cost: 1,
            ..template.clone()
        };
        let denied = store.decide(std::slice::from_ref(&full)).await.unwrap();
        assert!(!denied[0].allowed, "the log is full");
        rows.push(measure(Algorithm::SlidingLog, limit, limit, &key));
    }

    println!(
        "\nRedis {}: MEMORY USAGE key SAMPLES 0 after the hits shown",
        redis_version()
    );
    println!(
        "{:<15} {:>6} {:>6} {:>9} {:>13} {:>15} {:>8}  ENCODING",
        "ALGORITHM", "LIMIT", "HITS", "KEY BYTES", "MEMORY USAGE", "WITH 1-BYTE KEY", "PER HIT"
    );
    for r in &rows {
        let per_hit = if r.algorithm == Algorithm::SlidingLog {
            format!("{:.1}", r.bytes as f64 / r.hits as f64)
        } else {
            "-".to_owned()
        };
        println!(
            "{:<15} {:>6} {:>6} {:>9} {:>13} {:>15} {:>8}  {}",
            r.algorithm.name(),
            r.limit,
            r.hits,
            r.key_len,
            r.bytes,
            r.short_key_bytes,
            per_hit,
            r.encoding
        );
    }

    // Sane bounds. Constant-state counters: the key name plus under 100 bytes.
    for r in rows.iter().filter(|r| r.algorithm != Algorithm::SlidingLog) {
        assert!(
            r.short_key_bytes < 100,
            "{}: {} bytes",
            r.algorithm.name(),
            r.short_key_bytes
        );
        assert!(
            r.bytes < r.key_len as u64 + 100,
            "{}: {} bytes for a {}-byte key",
            r.algorithm.name(),
            r.bytes,
            r.key_len
        );
        assert!(r.bytes < 250, "{}: {} bytes", r.algorithm.name(), r.bytes);
    }
    let fixed = rows
        .iter()
        .find(|r| r.algorithm == Algorithm::FixedWindow)
        .unwrap();
    assert!(fixed.bytes < 250, "fixed_window: {} bytes", fixed.bytes);
    // sliding_log grows linearly: 20 to 150 bytes per hit at every size (a compact
    // listpack up to zset-max-listpack-entries, 128 by default, then a skiplist plus
    // a dict), and within the skiplist the cost per hit stays put (1000 vs 10,000).
    let logs: Vec<&Row> = rows
        .iter()
        .filter(|r| r.algorithm == Algorithm::SlidingLog)
        .collect();
    let per_hit = |r: &Row| r.bytes as f64 / r.hits as f64;
    for r in &logs {
        assert!(
            (20.0..150.0).contains(&per_hit(r)),
            "limit {}: {:.1} bytes per hit",
            r.limit,
            per_hit(r)
        );
    }
    let (thousand, largest) = (logs[2], logs[3]);
    let drift = per_hit(largest) / per_hit(thousand);
    assert!(
        (0.85..1.15).contains(&drift),
        "per hit at 1000 vs 10,000: x{drift:.2}"
    );
    assert!(
        largest.bytes < 1_500_000,
        "a full log at MAX_LIMIT: {} bytes",
        largest.bytes
    );
}

fn redis_version() -> String {
    let info = common::redis::cli(common::redis::standalone(), &["INFO", "server"]);
    common::redis::info_field(&info, "redis_version")
        .unwrap_or("?")
        .to_owned()
}
