//! The Lua scripts (from `lua/`, compiled in with `include_str!`) and the packing of
//! their arguments and replies. A script body is the shared helpers and every
//! algorithm module followed by the entry point, so one invocation can decide any mix
//! of algorithms atomically.
//!
//! The hot path sends [`batch_cmd`]: EVALSHA written straight into one command
//! buffer; the store loads the script with SCRIPT LOAD and retries on NOSCRIPT
//! (script caches vanish on restart and failover), so the body crosses the network
//! only when a server lacks it, and never with EVAL. [`batch_invocation`] builds the
//! same call as a `redis::ScriptInvocation` (tests inject time through it).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script, ScriptInvocation};

use crate::algorithm::Decision;
use crate::store::CounterOp;

const MODULES: [&str; 7] = [
    include_str!("../../../lua/common.lua"),
    include_str!("../../../lua/fixed_window.lua"),
    include_str!("../../../lua/sliding_window.lua"),
    include_str!("../../../lua/sliding_log.lua"),
    include_str!("../../../lua/token_bucket.lua"),
    include_str!("../../../lua/gcra.lua"),
    include_str!("../../../lua/leaky_bucket.lua"),
];

fn with_modules(entry: &str) -> Script {
    Script::new(&format!("{}\n{entry}", MODULES.join("\n")))
}

pub static BATCH: LazyLock<Script> =
    LazyLock::new(|| with_modules(include_str!("../../../lua/batch.lua")));
pub static REFUND: LazyLock<Script> =
    LazyLock::new(|| with_modules(include_str!("../../../lua/refund.lua")));

/// Values per operation in the batch script's reply.
const REPLY_STRIDE: usize = 6;

/// Lua numbers are doubles: costs above the burst or limit are all equally
/// impossible, so they are clamped to stay exact.
fn wire_cost(op: &CounterOp) -> u64 {
    op.cost
        .min(op.params.limit.max(op.params.burst).saturating_add(1))
}

/// One operation as the batch script reads it (its 7 arguments), owned and `Copy` so
/// a request can wait in the batcher's queue without borrowing from its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireOp {
    algorithm: u8,
    limit: u64,
    window_ms: u64,
    burst: u64,
    max_delay_ms: i64,
    cost: u64,
    vetoes: bool,
}

impl WireOp {
    pub fn new(op: &CounterOp) -> Self {
        let p = &op.params;
        Self {
            algorithm: p.algorithm.id(),
            limit: p.limit,
            window_ms: p.window_ms.max(1000),
            burst: p.burst,
            max_delay_ms: p
                .max_delay_ms
                .map_or(-1, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            cost: wire_cost(op),
            vetoes: op.vetoes,
        }
    }
}

/// One request's operations in a batch call: decided all or nothing, independently
/// of the other segments of the same call.
pub struct Segment<'a, K: AsRef<str>> {
    pub keys: &'a [K],
    pub ops: &'a [WireOp],
    pub dry_run: bool,
}

/// One batch invocation for the operations of one slot group. `now_ms` is for tests
/// only: production passes `None` and the script reads the shard's clock. A dry run
/// decides and writes nothing.
pub fn batch_invocation<'a>(
    keys: &[String],
    ops: &[&CounterOp],
    now_ms: Option<u64>,
    dry_run: bool,
) -> ScriptInvocation<'a> {
    let mut invocation = BATCH.prepare_invoke();
    invocation.arg(now_ms.map_or_else(String::new, |ms| ms.to_string()));
    invocation.arg(1).arg(ops.len()).arg(u8::from(dry_run));
    for (key, op) in keys.iter().zip(ops) {
        let w = WireOp::new(op);
        invocation
            .key(key.as_str())
            .arg(w.algorithm)
            .arg(w.limit)
            .arg(w.window_ms)
            .arg(w.burst)
            .arg(w.max_delay_ms)
            .arg(w.cost)
            .arg(u8::from(w.vetoes));
    }
    invocation
}

/// The batch script's EVALSHA for `segments` (one per request; keys and operations in
/// the same order), as one command. Same arguments as [`batch_invocation`], but
/// written into the command's single buffer: a `ScriptInvocation` keeps every key and
/// argument in a `Vec` of its own, then copies them all into a command again, two
/// allocations per argument and nine arguments per operation.
pub fn batch_cmd<K: AsRef<str>>(segments: &[Segment<'_, K>], now_ms: Option<u64>) -> Cmd {
    let n: usize = segments.iter().map(|s| s.ops.len()).sum();
    let key_bytes: usize = segments
        .iter()
        .flat_map(|s| s.keys)
        .map(|k| k.as_ref().len())
        .sum();
    let mut cmd = Cmd::with_capacity(
        5 + 2 * segments.len() + n * 8,
        64 + key_bytes + n * 48 + segments.len() * 8,
    );
    cmd.arg("EVALSHA").arg(BATCH.get_hash()).arg(n);
    for key in segments.iter().flat_map(|s| s.keys) {
        cmd.arg(key.as_ref());
    }
    match now_ms {
        Some(ms) => cmd.arg(ms),
        None => cmd.arg(""),
    };
    cmd.arg(segments.len());
    for segment in segments {
        cmd.arg(segment.ops.len()).arg(u8::from(segment.dry_run));
    }
    for w in segments.iter().flat_map(|s| s.ops) {
        cmd.arg(w.algorithm)
            .arg(w.limit)
            .arg(w.window_ms)
            .arg(w.burst)
            .arg(w.max_delay_ms)
            .arg(w.cost)
            .arg(u8::from(w.vetoes));
    }
    cmd
}

/// A consumed operation to give back.
pub struct Refund<'a> {
    pub key: String,
    pub op: &'a CounterOp,
    pub token: i64,
}

pub fn refund_invocation<'a>(refunds: &[Refund<'_>]) -> ScriptInvocation<'a> {
    let mut invocation = REFUND.prepare_invoke();
    for refund in refunds {
        let p = &refund.op.params;
        invocation
            .key(refund.key.as_str())
            .arg(p.algorithm.id())
            .arg(p.limit)
            .arg(p.window_ms.max(1000))
            .arg(p.burst)
            .arg(refund.token)
            .arg(wire_cost(refund.op));
    }
    invocation
}

/// One operation's reply: the decision and the refund token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub decision: Decision,
    pub token: i64,
}

/// Parses the batch reply for `n` operations.
pub fn parse_batch_reply(values: &[i64], n: usize) -> Result<Vec<Reply>, String> {
    if values.len() != n * REPLY_STRIDE {
        return Err(format!(
            "batch script returned {} values for {n} operations (expected {})",
            values.len(),
            n * REPLY_STRIDE
        ));
    }
    let non_negative = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(values
        .chunks_exact(REPLY_STRIDE)
        .map(|chunk| {
            let allowed = chunk[0] == 1;
            Reply {
                decision: Decision {
                    allowed,
                    remaining: non_negative(chunk[1]),
                    reset_after: Duration::from_millis(non_negative(chunk[2])),
                    retry_after: (!allowed && chunk[3] >= 0)
                        .then(|| Duration::from_millis(non_negative(chunk[3]))),
                    delay: Duration::from_micros(non_negative(chunk[4])),
                },
                token: chunk[5],
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Limit, Unit};
    use crate::store::CounterKey;
    use std::sync::Arc;

    fn op(limit: u32, cost: u64, vetoes: bool) -> CounterOp {
        let limit = Limit::fixed(limit, Unit::Minute);
        CounterOp {
            key: CounterKey {
                domain: Arc::from("d"),
                rule: Arc::from("k"),
                entries: vec![("k".into(), "v".into())],
                algorithm: limit.algorithm,
                window_secs: limit.window_secs(),
                hash_tag: None,
            },
            params: limit.params(),
            cost,
            vetoes,
        }
    }

    #[test]
    fn batch_cmd_is_evalsha_with_keys_then_segments_then_arguments() {
        let ops = [op(10, 1, true), op(5, 2, false), op(7, 1, true)];
        let wire: Vec<WireOp> = ops.iter().map(WireOp::new).collect();
        let keys = ["a{x}", "b{x}", "c{y}"];
        let segments = [
            Segment {
                keys: &keys[..2],
                ops: &wire[..2],
                dry_run: true,
            },
            Segment {
                keys: &keys[2..],
                ops: &wire[2..],
                dry_run: false,
            },
        ];
        let cmd = batch_cmd(&segments, None);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<other>".into(),
            })
            .collect();
        let mut expected: Vec<String> = [
            "EVALSHA",
            BATCH.get_hash(),
            "3",
            "a{x}",
            "b{x}",
            "c{y}",
            "",
            "2",
            "2",
            "1",
            "1",
            "0",
        ]
        .map(String::from)
        .to_vec();
        for (limit, cost, vetoes) in [(10, 1, 1), (5, 2, 0), (7, 1, 1)] {
            let burst = limit;
            expected.extend(
                ["1", &limit.to_string(), "60000", &burst.to_string(), "-1"].map(String::from),
            );
            expected.push(cost.to_string());
            expected.push(vetoes.to_string());
        }
        assert_eq!(args, expected);
        let one = [Segment {
            keys: &keys[..1],
            ops: &wire[..1],
            dry_run: false,
        }];
        let injected = batch_cmd(&one, Some(1234));
        let args: Vec<_> = injected.args_iter().collect();
        assert!(matches!(args[4], redis::Arg::Simple(b"1234")));
        assert!(matches!(args[5], redis::Arg::Simple(b"1")));
    }
}
