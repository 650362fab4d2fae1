//! What the batch script does inside Redis for one call, counted by Redis itself
//! (`INFO commandstats` of a private server): a counter that many requests of one call
//! touch is read once and written once, its TTL set only when its window starts, its
//! state stored as one plain decimal; and a call with a malformed operation or run
//! length fails whole, writing nothing. Script time itself
//! is measured by `examples/lua_cost.rs` (BENCHMARKS.md), not asserted here: timings
//! on a shared machine are not a test.

use crate::common;
use crate::differential::loaded_connection;

use std::sync::Arc;

use tollgate::algorithm::{Algorithm, Params};
use tollgate::store::redis::scripts::{self, Refund, Segment, WireOp};
use tollgate::store::{CounterKey, CounterOp};

use common::redis::command_calls as calls;

pub(crate) fn fixed_window_op(limit: u64) -> CounterOp {
    let params = Params {
        algorithm: Algorithm::FixedWindow,
        limit,
        // A day: no test run straddles two windows in practice, and the test below
        // still holds if one does (it reads the window from the replies).
        window_ms: 86_400_000,
        burst: limit,
        max_delay_ms: None,
        calendar: None,
    };
    CounterOp {
        key: CounterKey {
            domain: Arc::from("script_work"),
            rule: Arc::from("r"),
            entries: Default::default(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 86_400,
            time_zone: None,
            hash_tag: None,
        },
        params,
        cost: 1,
        vetoes: true,
        mode: tollgate::algorithm::Mode::Limit,
        lease: None,
    }
}

/// Sends `bad`, which the engine must refuse as malformed naming `why`, and checks that none of `keys`
/// was written (a malformed call fails whole, its valid requests too).
async fn refused_unwritten(
    conn: &mut redis::aio::MultiplexedConnection,
    bad: &redis::Cmd,
    why: &str,
    keys: &[String],
) {
    let err = bad
        .query_async::<Vec<u8>>(conn)
        .await
        .expect_err("a malformed call is refused");
    assert_eq!(
        err.code(),
        Some(scripts::contract::code::MALFORMED),
        "{err}"
    );
    assert_eq!(err.detail(), Some(why), "{err}");
    let exists: u64 = redis::cmd("EXISTS")
        .arg(keys)
        .query_async(conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "{why}: nothing written");
}

/// A command's arguments, every one plain bytes.
fn plain_args(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|arg| {
            let redis::Arg::Simple(bytes) = arg else {
                panic!("only plain arguments")
            };
            bytes.to_vec()
        })
        .collect()
}

/// `n` alike requests, each the operations `ops` on `keys`, as one call's segments.
fn alike<'a>(keys: &'a [String], ops: &'a [WireOp], n: usize) -> Vec<Segment<'a, String>> {
    (0..n)
        .map(|_| Segment {
            keys,
            ops,
            dry_run: false,
        })
        .collect()
}

#[tokio::test]
async fn a_hot_counter_is_read_and_written_once_per_call() {
    let redis = common::redis::custom::private_standalone("script_work").expect("private redis");
    let port = redis.port();
    let mut conn = loaded_connection(&redis).await;
    let wire = [WireOp::new(&fixed_window_op(1000))];
    let keys = [String::from("script_work:hot")];
    // 13 one-operation requests on one counter, as the batcher sends them under load.
    let segments = alike(&keys, &wire, 13);
    let mut windows = Vec::new();
    for call in 1..=2u64 {
        let reply: Vec<u8> = scripts::batch_cmd(&segments, None)
            .query_async(&mut conn)
            .await
            .expect("batch script runs");
        let replies = scripts::parse_batch_reply(&reply, 13).expect("well-formed reply");
        let remaining: Vec<u64> = replies.iter().map(|r| r.decision.remaining).collect();
        let expected: Vec<u64> = (0..13).map(|i| 1000 - 13 * (call - 1) - i - 1).collect();
        assert_eq!(
            remaining, expected,
            "call {call}: each request sees the ones before"
        );
        windows.push(replies[0].token);
        assert_eq!(calls(port, "get"), call, "one read per call");
        assert_eq!(
            calls(port, "set") + calls(port, "incrby"),
            call,
            "one write per call"
        );
    }
    // The TTL is the window's end: set (in the SET that writes the value) by the call
    // that starts a window, kept by the INCRBY of a later one.
    let expected_sets = if windows[0] == windows[1] { 1 } else { 2 };
    assert_eq!(calls(port, "set"), expected_sets, "windows {windows:?}");
    assert_eq!(calls(port, "pexpire"), 0, "no TTL command of its own");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(ttl > 0 && ttl <= 86_400_000, "PTTL {ttl}");
    // Stored as one decimal: the hits, then the window's start in the low bits.
    let stored: String = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .expect("GET");
    let hits = if windows[0] == windows[1] { 26 } else { 13 };
    let window_bits = windows[1] % (1 << 20);
    assert_eq!(
        stored,
        ((hits << tollgate::algorithm::fixed_window::VALUE_SHIFT) + window_bits).to_string()
    );
}

/// A fixed window's key holding 0.1's hash {w, c} keeps its count of this window (read,
/// and written back as a value with the window's TTL: tests/it/upgrade.rs has the
/// rolling upgrade); a value INCRBY cannot add to is no count, the window starting
/// over; a refund on a hash gives back into the hash.
#[tokio::test]
async fn a_fixed_window_key_of_0_1_or_another_value_is_read_or_started_over() {
    let redis =
        common::redis::custom::private_standalone("script_work_legacy").expect("private redis");
    let mut conn = loaded_connection(&redis).await;
    let _: String = scripts::REFUND
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD refund");
    let (secs, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let today = secs - secs % 86_400;
    let wire = [WireOp::new(&fixed_window_op(1000))];
    let decide = async |conn: &mut redis::aio::MultiplexedConnection, key: &str| {
        let keys = [key.to_string()];
        let reply: Vec<u8> = scripts::batch_cmd(&alike(&keys, &wire, 1), None)
            .query_async(conn)
            .await
            .expect("batch script runs");
        scripts::parse_batch_reply(&reply, 1).expect("well-formed reply")[0]
            .decision
            .remaining
    };
    let cli = |args: &[&str]| common::redis::redis_cli(redis.port(), args);
    let today_text = today.to_string();
    cli(&["HSET", "old:hash", "w", &today_text, "c", "5"]);
    cli(&["SET", "old:text", "not a number"]);
    for (key, before) in [("old:hash", 5), ("old:text", 0)] {
        assert_eq!(decide(&mut conn, key).await, 999 - before, "{key}");
        assert_eq!(cli(&["TYPE", key]), "string", "{key}: rewritten as a value");
        let stored = cli(&["GET", key]);
        assert_eq!(
            common::redis::fixed_window_count(&stored),
            before + 1,
            "{key}"
        );
        let ttl: i64 = cli(&["PTTL", key]).parse().expect("PTTL");
        assert!(
            ttl > 0 && ttl <= 86_400_000,
            "{key}: the window's TTL, PTTL {ttl}"
        );
        assert_eq!(
            decide(&mut conn, key).await,
            998 - before,
            "{key}: then as a value"
        );
    }

    cli(&["HSET", "old:refund", "w", &today_text, "c", "5"]);
    let refund = Refund {
        key: "old:refund".to_string(),
        op: wire[0].clone(),
        token: i64::try_from(today).expect("a start in range"),
    };
    let _: i64 = scripts::refund_cmd(&[&refund], None)
        .query_async(&mut conn)
        .await
        .expect("refund runs");
    assert_eq!(
        cli(&["HGET", "old:refund", "c"]),
        "4",
        "given back into the hash"
    );
}

/// A hot counter's requests travel as one pair with a run length (the last
/// argument); a run length that does not fit its call fails it whole, unwritten.
#[tokio::test]
async fn a_malformed_run_fails_the_whole_call() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix("script_work_runs");
    let wire = [WireOp::new(&fixed_window_op(10))];
    let keys = [format!("{prefix}hot")];
    let segments = alike(&keys, &wire, 3);
    let good = scripts::batch_cmd(&segments, None);
    let args = plain_args(&good);
    // FCALL|EVALSHA, the function or script, 1 key, the key, the clock, the call's
    // flags, the index, then the run lengths.
    assert_eq!(args[7], vec![3u8], "one pair, a run of 3");
    for runs in [&[0u8][..], &[3, 1][..]] {
        let mut bad = redis::Cmd::new();
        for (i, arg) in args.iter().enumerate() {
            bad.arg(if i == 7 { runs } else { &arg[..] });
        }
        refused_unwritten(&mut conn, &bad, "runs", &keys).await;
    }
}

#[tokio::test]
async fn a_malformed_operation_fails_the_whole_call() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix("script_work_malformed");
    // Two limits: two distinct operations, each sent once.
    let wire = [
        WireOp::new(&fixed_window_op(10)),
        WireOp::new(&fixed_window_op(20)),
    ];
    let keys = [format!("{prefix}a"), format!("{prefix}b")];
    let segments = [
        Segment {
            keys: &keys[..1],
            ops: &wire[..1],
            dry_run: false,
        },
        Segment {
            keys: &keys[1..],
            ops: &wire[1..],
            dry_run: false,
        },
    ];
    // The second request names an algorithm id no list has (byte 1 of an
    // operation), is cut short, or carries a negative limit.
    let good = scripts::batch_cmd(&segments, None);
    let corruptions: [fn(&mut Vec<u8>); 3] = [
        |op| op[1] = 99,
        |op| op.truncate(42),
        |op| op[2..10].copy_from_slice(&(-10.0f64).to_le_bytes()),
    ];
    for corrupt in corruptions {
        let mut bad = redis::Cmd::new();
        let mut ops_seen = 0;
        for arg in good.args_iter() {
            let redis::Arg::Simple(bytes) = arg else {
                panic!("only plain arguments")
            };
            if bytes.len() == 43 && bytes[0] == b'+' {
                ops_seen += 1;
                if ops_seen == 2 {
                    let mut op = bytes.to_vec();
                    corrupt(&mut op);
                    bad.arg(op);
                    continue;
                }
            }
            bad.arg(bytes);
        }
        assert_eq!(ops_seen, 2);
        refused_unwritten(&mut conn, &bad, "operation", &keys).await;
    }
}

/// A call's operations travel once each, every key naming its own by an index byte;
/// an index that names none, or does not fit the call, fails it whole, unwritten.
#[tokio::test]
async fn a_malformed_index_fails_the_whole_call() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix("script_work_index");
    let wire = [
        WireOp::new(&fixed_window_op(10)),
        WireOp::new(&fixed_window_op(20)),
    ];
    let keys = [
        format!("{prefix}a"),
        format!("{prefix}b"),
        format!("{prefix}c"),
    ];
    // Three requests, the first and last with the same operation: two are sent.
    let segments: Vec<Segment<'_, String>> = [0, 1, 0]
        .iter()
        .zip(&keys)
        .map(|(&op, key)| Segment {
            keys: std::slice::from_ref(key),
            ops: &wire[op..=op],
            dry_run: false,
        })
        .collect();
    let good = scripts::batch_cmd(&segments, None);
    let args = plain_args(&good);
    // FCALL|EVALSHA, the function or script, 3 keys, the keys, the clock, the call's
    // flags, the index, the run lengths (none), the two operations.
    assert_eq!(args.len(), 12, "each distinct operation once");
    assert_eq!(args[8], vec![1u8, 2, 1]);
    for index in [
        &[1u8, 3, 1][..],
        &[0, 1, 1][..],
        &[1, 2][..],
        &[1, 2, 1, 1][..],
    ] {
        let mut bad = redis::Cmd::new();
        for (i, arg) in args.iter().enumerate() {
            bad.arg(if i == 8 { index } else { &arg[..] });
        }
        refused_unwritten(&mut conn, &bad, "index", &keys).await;
    }
    let reply: Vec<u8> = good.query_async(&mut conn).await.expect("the good call");
    let remaining: Vec<u64> = scripts::parse_batch_reply(&reply, 3)
        .expect("reply")
        .iter()
        .map(|r| r.decision.remaining)
        .collect();
    assert_eq!(remaining, [9, 19, 9]);
}

/// A call whose reply outgrows one packing chunk of the script (200 numbers): 70
/// requests of 3 counters each (210 decisions), every one in its place.
#[tokio::test]
async fn a_long_reply_arrives_whole_and_in_order() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix("script_work_long");
    let limits = [100u64, 200, 300];
    let wire: Vec<WireOp> = limits
        .iter()
        .map(|&limit| WireOp::new(&fixed_window_op(limit)))
        .collect();
    let keys: Vec<String> = limits.iter().map(|l| format!("{prefix}{l}")).collect();
    let segments = alike(&keys, &wire, 70);
    let reply: Vec<u8> = scripts::batch_cmd(&segments, None)
        .query_async(&mut conn)
        .await
        .expect("batch script runs");
    // 210 decisions, at least one double each (the short form where the last three
    // values repeat): past one chunk of 200.
    assert!(reply.len() > 200 * 8, "{} bytes", reply.len());
    let replies = scripts::parse_batch_reply(&reply, 210).expect("well-formed reply");
    for (i, request) in replies.chunks(3).enumerate() {
        let remaining: Vec<u64> = request.iter().map(|r| r.decision.remaining).collect();
        let expected: Vec<u64> = limits.iter().map(|l| l - i as u64 - 1).collect();
        assert_eq!(remaining, expected, "request {i}");
    }
}
