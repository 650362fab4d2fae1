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
pub mod contract;
mod library;
mod reply;
mod runs;
mod wire;

pub use command::{
    Layout, Refund, Segment, Via, batch_call, batch_cmd, batch_cmd_around, batch_cmd_in,
    batch_cmd_via, batch_cmd_writing, refund_cmd, sends_fcall,
};
pub use contract::StateLayout;
pub use library::{Engine, LIBRARY, fcall};
pub use reply::{Reply, parse_batch_reply};
use wire::Flag;
pub use wire::{WireOp, learn_redis_clock, redis_clock_estimate};

const COMMON: &str = include_str!("../../../../lua/common.lua");
const SPEC: &str = include_str!("../../../../lua/spec.lua");
const TIMED: &str = include_str!("../../../../lua/timed.lua");

/// The contract's definitions ([`contract::prelude`]), `lua/common.lua`, the generated
/// dispatch, `lua/spec.lua` (the operation parser), then `entry`.
///
/// The dispatch is a function `algorithm(id)` (an algorithm's position in
/// [`Algorithm::ALL`], from 1), generated from the Rust list so the ids cannot drift
/// from the enum. Each algorithm's module (`lua/<name>.lua`, between its model's
/// constants and flags: [`contract::module_header`], [`contract::module_footer`])
/// sits in one branch of it, which builds a module on its first use in a call. Why
/// lazily: a script's top level runs on every call, and defining every module (their
/// functions and tables) cost more per call than deciding a dozen operations; a call
/// builds only the modules it uses.
fn assemble(entry: &str) -> String {
    let mut body = contract::prelude();
    body.push_str(COMMON);
    body.push_str(TIMED);
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
        body.push_str(&contract::module_header(algorithm));
        body.push_str(algorithm.lua());
        body.push_str(&contract::module_footer(algorithm));
        body.push_str(&format!("module = {}\nend\n", algorithm.name()));
    }
    body.push_str(
        "\x20 algorithms[id] = module\n\
         \x20 return module\n\
         end\n",
    );
    body.push_str(SPEC);
    body.push_str(entry);
    body
}

/// The engine (`lua/call.lua`, `reply.lua`, `segment.lua`, `batch.lua`: one chunk)
/// with the shared code before it, for one layout: `ANY_SLOT` tells it whether its keys
/// come in ARGV (see [`BATCH_ANY_SLOT`]); its entry point is the function `batch`,
/// which `tail` calls (a script) or returns (to a library).
pub(crate) fn batch_code(any_slot: bool, tail: &str) -> String {
    let body = assemble(concat!(
        include_str!("../../../../lua/call.lua"),
        "\n",
        include_str!("../../../../lua/reply.lua"),
        "\n",
        include_str!("../../../../lua/segment.lua"),
        "\n",
        include_str!("../../../../lua/batch.lua"),
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
/// fails the call, which gives back what it took and answers [`contract::code::ABORTED`]
/// (see [`Layout::AnySlot`]). The keys come first in ARGV, after their count.
pub static BATCH_ANY_SLOT: LazyLock<Script> = LazyLock::new(|| {
    // The shebang must be the script's first line.
    Script::new(&format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        batch_code(true, "return batch(KEYS, ARGV)")
    ))
});
/// The refund script (`lua/refund.lua`), on the same parser as the batch's.
pub static REFUND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&assemble(concat!(
        include_str!("../../../../lua/refund.lua"),
        "\nreturn refund(KEYS, ARGV)\n"
    )))
});

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

/// Sends the batch call for `segments` (FCALL once the library loaded, else EVALSHA).
/// A call refused for a calendar's clock ([`contract::code::CLOCK`]: nothing was
/// decided) is built again around the clock it named and sent once more, so its
/// requests are decided, not answered by the failure mode while tollgate learns.
pub async fn send_batch<C: ConnectionLike, K: AsRef<str>>(
    con: &mut C,
    layout: Layout,
    segments: &[Segment<'_, K>],
    functions: &Engine,
) -> RedisResult<Vec<u8>> {
    let mut tries = 0;
    loop {
        let cmd = batch_call(layout, segments, functions);
        let sent = if sends_fcall(&cmd) {
            fcall(con, &cmd, layout.script(), functions).await
        } else {
            evalsha(con, &cmd, layout.script()).await
        };
        tries += 1;
        match sent {
            Err(e) if tries == 1 && e.code() == Some(contract::code::CLOCK) => continue,
            other => return other,
        }
    }
}

/// The batch script refuses a call whose calendar periods (chosen around tollgate's
/// clock) do not hold Redis's clock, answering [`contract::code::CLOCK`] and that
/// clock: the next calls choose their periods around it. True when `error` was that.
pub fn learn_from(error: &redis::RedisError) -> bool {
    if error.code() != Some(contract::code::CLOCK) {
        return false;
    }
    let Some(redis_ms) = error
        .detail()
        .and_then(|d| d.split_whitespace().next())
        .and_then(|ms| ms.parse().ok())
    else {
        return false;
    };
    tracing::warn!(
        redis_ms,
        "Redis's clock is more than a calendar period away from tollgate's: periods follow Redis's from now on"
    );
    wire::learn_redis_clock(redis_ms);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatch comes from the Rust list, in id order, each module between its
    /// model's constants and flags, after the contract and before the entry point.
    #[test]
    fn scripts_carry_the_generated_dispatch() {
        let entry = "return refund(KEYS, ARGV)";
        let body = assemble(entry);
        assert!(body.starts_with(&contract::prelude()));
        let mut at = 0;
        for algorithm in Algorithm::ALL {
            let branch = format!(
                "if id == {} then\n{}{}{}module = {}\nend\n",
                algorithm.id(),
                contract::module_header(algorithm),
                algorithm.lua(),
                contract::module_footer(algorithm),
                algorithm.name()
            );
            let found = body[at..]
                .find(&branch)
                .expect("a branch per algorithm, in order");
            at += found + branch.len();
        }
        assert!(body[at..].contains(SPEC) && body.ends_with(entry));
        for source in [COMMON, SPEC] {
            assert!(!source.contains("local algorithms"), "ids have one source");
        }
    }

    /// No Lua file writes the contract's numbers or an algorithm's flags itself.
    #[test]
    fn lua_files_take_the_contract_from_rust() {
        for algorithm in Algorithm::ALL {
            let lua = algorithm.lua();
            for (name, _) in algorithm.lua_constants() {
                assert!(
                    !lua.contains(&format!("local {name} =")),
                    "{} defines {name}",
                    algorithm.name()
                );
            }
            assert!(!lua.contains(".charges ="), "{}", algorithm.name());
        }
    }
}
