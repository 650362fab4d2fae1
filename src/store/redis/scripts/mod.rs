//! The Lua scripts and the packing of their arguments and replies. A script body is
//! assembled from `lua/` (compiled in with `include_str!`): the shared helpers, every
//! algorithm's Lua twin, the dispatch table generated from the Rust list of
//! algorithms, then the entry point, so one invocation can decide any mix of
//! algorithms atomically.
//!
//! Both scripts are sent as EVALSHA written straight into one command buffer
//! ([`batch_cmd`], [`refund_cmd`]), with their operations encoded by one encoder
//! ([`WireOp`]). [`evalsha`] loads a script with SCRIPT LOAD and retries on NOSCRIPT
//! (script caches vanish on restart and failover), so a body crosses the network only
//! when a server lacks it, and never with EVAL.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

use crate::algorithm::Algorithm;

mod command;
mod library;
mod reply;
mod runs;
mod wire;

pub use command::{
    Layout, Refund, Segment, Via, batch_call, batch_cmd, batch_cmd_around, batch_cmd_in,
    batch_cmd_via, refund_cmd, sends_fcall,
};
pub use library::{Functions, LIBRARY, fcall};
pub use reply::{Reply, parse_batch_reply};
use wire::Flag;
pub use wire::{WireOp, learn_redis_clock, redis_clock_estimate};

const COMMON: &str = include_str!("../../../../lua/common.lua");

/// `lua/common.lua`, the generated dispatch, then `entry`.
///
/// The dispatch is a function `algorithm(id)` (an algorithm's position in
/// [`Algorithm::ALL`], from 1), generated from the Rust list so the ids cannot drift
/// from the enum. Each algorithm's module (`lua/<name>.lua`) sits in one branch of a
/// generated `algorithm(id)`, which builds a module on its first use in a call. Why
/// lazily: Redis keeps the compiled script, but its top level runs on every call, and
/// defining every module (their functions and tables) cost more per call than
/// deciding a dozen operations; a call now builds only the modules it uses.
fn assemble(entry: &str) -> String {
    let mut body = String::from(COMMON);
    body.push_str(
        "\n-- Generated from the Rust list (src/algorithm/mod.rs): the module of algorithm\n\
         -- `id`, built on its first use in a call; nil for an unknown id.\n\
         local algorithms = {}\n\
         local function algorithm(id)\n\
         \x20 local module = algorithms[id]\n\
         \x20 if module ~= nil or id == nil then return module end\n",
    );
    for algorithm in Algorithm::ALL {
        body.push_str(&format!("if id == {} then\n", algorithm.id()));
        body.push_str(algorithm.lua());
        body.push_str(&format!("\nmodule = {}\nend\n", algorithm.name()));
    }
    body.push_str(
        "\x20 algorithms[id] = module\n\
         \x20 return module\n\
         end\n",
    );
    body.push_str(entry);
    body
}

/// lua/batch.lua (with its lean path, lua/batch_lean.lua, and its entry point,
/// lua/batch_call.lua: one chunk in three files) with the shared code before it, for
/// one layout: `ANY_SLOT` tells it whether its keys come in ARGV (see
/// [`BATCH_ANY_SLOT`]); its entry point is the function `batch`, which `tail` calls (a
/// script) or returns (to a library).
pub(crate) fn batch_code(any_slot: bool, tail: &str) -> String {
    let body = assemble(concat!(
        include_str!("../../../../lua/batch.lua"),
        "\n",
        include_str!("../../../../lua/batch_lean.lua"),
        "\n",
        include_str!("../../../../lua/batch_call.lua"),
    ));
    format!("local ANY_SLOT = {any_slot}\n{body}\n{tail}\n")
}

/// The batch script for a call whose keys are declared (standalone, or one slot).
pub static BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&batch_code(false, "return batch(KEYS, ARGV)")));
/// The batch script for every slot one cluster master owns: declares no key (so the
/// call goes to the master it is sent to, by address, never redirected) and may touch
/// keys of any slot that node owns (Redis 7's `allow-cross-slot-keys`); a key the
/// node does not own, or one of a slot it is migrating away that it no longer holds,
/// fails the call before anything is written (see [`Layout::AnySlot`]). The keys
/// come first in ARGV, after their count; the prelude gives `lua/batch.lua` the
/// `KEYS` and `ARGV` it reads.
pub static BATCH_ANY_SLOT: LazyLock<Script> = LazyLock::new(|| {
    // The shebang must be the script's first line.
    Script::new(&format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        batch_code(true, "return batch(KEYS, ARGV)")
    ))
});
pub static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(&assemble(include_str!("../../../../lua/refund.lua"))));

/// Sends `cmd` (an EVALSHA of `script`); on NOSCRIPT loads the script with SCRIPT LOAD
/// and sends it once more. The body never travels with EVAL.
pub async fn evalsha<C: ConnectionLike, T: FromRedisValue>(
    con: &mut C,
    cmd: &Cmd,
    script: &Script,
) -> RedisResult<T> {
    let result = match cmd.query_async(con).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    };
    if let Err(e) = &result {
        learn_from(e);
    }
    result
}

/// The batch script fails a call whose calendar periods (chosen around tollgate's
/// clock) do not hold Redis's clock, naming that clock (`CLOCK` in lua/batch.lua):
/// the next calls choose their periods around it.
fn learn_from(error: &redis::RedisError) {
    // redis-rs reads the reply's first word as its code: `"tollgate:": calendar ...`.
    const CLOCK: &str = "calendar clock ";
    let text = error.to_string();
    if let Some(at) = text.find(CLOCK) {
        let digits: String = text[at + CLOCK.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(redis_ms) = digits.parse() {
            tracing::warn!(
                redis_ms,
                "Redis's clock is more than a calendar period away from tollgate's: periods follow Redis's from now on"
            );
            wire::learn_redis_clock(redis_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatch comes from the Rust list, in id order, before the entry point
    /// that indexes it.
    #[test]
    fn scripts_carry_the_generated_dispatch() {
        for entry in [
            include_str!("../../../../lua/batch.lua"),
            include_str!("../../../../lua/refund.lua"),
        ] {
            let body = assemble(entry);
            let mut at = 0;
            for algorithm in Algorithm::ALL {
                let branch = format!("if id == {} then\n{}", algorithm.id(), algorithm.lua());
                let found = body[at..]
                    .find(&branch)
                    .expect("a branch per algorithm, in order");
                at += found + branch.len();
                let ret = format!("\nmodule = {}\nend\n", algorithm.name());
                assert!(body[at..].starts_with(&ret), "{}", algorithm.name());
            }
            assert!(
                body.find("local algorithms").expect("the table")
                    < body.find(entry).expect("entry")
            );
            assert!(!entry.contains("local algorithms"), "ids have one source");
        }
    }
}
