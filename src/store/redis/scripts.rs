//! The Lua scripts (from `lua/`, compiled in with `include_str!`) and the packing of
//! their arguments and replies. A script body is the algorithm modules followed by the
//! entry point, so one invocation can decide any mix of algorithms atomically.
//!
//! Invocation goes through `redis::Script`, which sends EVALSHA and falls back to
//! loading the script on NOSCRIPT (script caches vanish on restart and failover), so
//! the body crosses the network only when a server lacks it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::algorithm::Decision;
use crate::store::CounterOp;

const ALGORITHMS: &str = include_str!("../../../lua/fixed_window.lua");

pub static BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{ALGORITHMS}\n{}",
        include_str!("../../../lua/batch.lua")
    ))
});
pub static REFUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{ALGORITHMS}\n{}",
        include_str!("../../../lua/refund.lua")
    ))
});

/// Values per operation in the batch script's reply.
const REPLY_STRIDE: usize = 5;

/// The id batch.lua dispatches on. Only fixed windows exist so far.
const FIXED_WINDOW: u8 = 1;

/// Lua numbers are doubles: costs above the limit are all equally impossible, so they
/// are clamped to `limit + 1` to stay exact.
fn wire_cost(op: &CounterOp) -> u64 {
    op.cost.min(op.limit.saturating_add(1))
}

/// One batch invocation for the operations of one slot group.
pub fn batch_invocation<'a>(keys: &[String], ops: &[&CounterOp]) -> ScriptInvocation<'a> {
    let mut invocation = BATCH.prepare_invoke();
    for (key, op) in keys.iter().zip(ops) {
        invocation
            .key(key.as_str())
            .arg(FIXED_WINDOW)
            .arg(op.limit)
            .arg(op.key.window_secs.max(1))
            .arg(wire_cost(op))
            .arg(u8::from(op.vetoes));
    }
    invocation
}

/// A consumed operation to give back: key, refund token, cost.
pub struct Refund {
    pub key: String,
    pub token: i64,
    pub cost: u64,
}

pub fn refund_invocation<'a>(refunds: &[Refund]) -> ScriptInvocation<'a> {
    let mut invocation = REFUND.prepare_invoke();
    for refund in refunds {
        invocation
            .key(refund.key.as_str())
            .arg(FIXED_WINDOW)
            .arg(refund.token)
            .arg(refund.cost);
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
                },
                token: chunk[4],
            }
        })
        .collect())
}
