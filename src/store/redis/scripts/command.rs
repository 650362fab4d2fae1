//! The batch and refund scripts' commands: a request's operations as a [`Segment`],
//! and the call of each script (FCALL of the library or EVALSHA) written straight into
//! one command buffer, with its keys declared ([`Layout::Declared`]: one standalone
//! server, or one hash slot) or passed as arguments to the cluster's any-slot variant
//! ([`Layout::AnySlot`]: every slot of one master). One operation's encoding is
//! [`super::wire`].

use redis::{Cmd, Script};

use super::contract::StateLayout;
use super::library::LIBRARY;
use super::runs;
use super::wire::{Flag, OP_LEN, WireOp, redis_clock_estimate};
use super::{BATCH, BATCH_ANY_SLOT, REFUND};

/// One request's operations in a batch call: decided all or nothing, independently
/// of the other segments of the same call. A segment without operations sends
/// nothing (there is nothing to decide).
pub struct Segment<'a, K: AsRef<str>> {
    pub keys: &'a [K],
    pub ops: &'a [WireOp],
    pub dry_run: bool,
}

/// Where a batch call's keys go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Declared as KEYS, for [`BATCH`]: a standalone server, or one hash slot of a
    /// cluster (the cluster client routes the call by them).
    Declared,
    /// Passed in ARGV after their count, no key declared, for [`BATCH_ANY_SLOT`]:
    /// every slot one cluster master owns, the call sent to that master by address.
    /// Redis checks each key as the script touches it, so a key the node does not
    /// own fails the call ("Script attempted to access a non local key"), and,
    /// no key being declared, the call is never redirected (an ASK would let the
    /// importing node serve, as empty, keys the old master still holds).
    AnySlot,
}

impl Layout {
    /// The script a call of this layout runs.
    pub fn script(self) -> &'static Script {
        match self {
            Layout::Declared => &BATCH,
            Layout::AnySlot => &BATCH_ANY_SLOT,
        }
    }
}

/// The batch script's EVALSHA for `segments` with their keys declared (see
/// [`batch_cmd_in`]).
pub fn batch_cmd<K: AsRef<str>>(segments: &[Segment<'_, K>], now_ms: Option<u64>) -> Cmd {
    batch_cmd_in(Layout::Declared, segments, now_ms)
}

/// The batch script's EVALSHA for `segments` (one per request; keys and operations in
/// the same order), as one command: a key per operation, alike one-operation
/// requests in a row sharing one ([`runs`]), where `layout` puts them; then the clock,
/// the index of each key's operation, the run lengths (empty when none is above one),
/// and the distinct operations (`lua/batch.lua`'s header). `now_ms` is for tests only:
/// production passes `None` and the script reads the shard's clock. Written into the
/// command's single buffer: a `ScriptInvocation` would keep every key and argument in
/// a `Vec` of its own, then copy them all into a command again, two allocations per
/// argument.
pub fn batch_cmd_in<K: AsRef<str>>(
    layout: Layout,
    segments: &[Segment<'_, K>],
    now_ms: Option<u64>,
) -> Cmd {
    batch_cmd_via((layout, Via::Eval), segments, now_ms)
}

/// [`batch_cmd_in`] by `via` (`examples/lua_cost.rs` measures both).
pub fn batch_cmd_via<K: AsRef<str>>(
    (layout, via): (Layout, Via),
    segments: &[Segment<'_, K>],
    now_ms: Option<u64>,
) -> Cmd {
    let around = now_ms.unwrap_or_else(redis_clock_estimate);
    batch_cmd_with(
        (layout, via, StateLayout::Compact),
        segments,
        now_ms,
        around,
    )
}

/// For tests of an upgrade: [`batch_cmd`] asking the engine to write `layouts`.
pub fn batch_cmd_writing<K: AsRef<str>>(
    layouts: StateLayout,
    segments: &[Segment<'_, K>],
    now_ms: Option<u64>,
) -> Cmd {
    let around = now_ms.unwrap_or_else(redis_clock_estimate);
    batch_cmd_with(
        (Layout::Declared, Via::Eval, layouts),
        segments,
        now_ms,
        around,
    )
}

/// How a batch call reaches its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// EVALSHA of [`Layout::script`].
    Eval,
    /// FCALL of the library's function ([`super::library`]).
    Function,
}

/// The server's batch call for `segments` on its clock: FCALL once the library
/// loaded (`functions`), else EVALSHA; send it with [`super::fcall`] or
/// [`super::evalsha`] as [`Cmd`]'s first word says ([`sends_fcall`]).
pub fn batch_call<K: AsRef<str>>(
    layout: Layout,
    segments: &[Segment<'_, K>],
    functions: &super::Engine,
) -> Cmd {
    let via = if functions.enabled() {
        Via::Function
    } else {
        Via::Eval
    };
    let shape = (layout, via, functions.layouts());
    batch_cmd_with(shape, segments, None, redis_clock_estimate())
}

/// Whether `cmd` is an FCALL.
pub fn sends_fcall(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(b"FCALL")))
}

/// For tests of clocks apart: [`batch_cmd`] with Redis's clock injected as `now_ms`
/// and the calendar periods sent chosen around `tollgate_ms`, as if tollgate's own
/// clock read that.
pub fn batch_cmd_around<K: AsRef<str>>(
    segments: &[Segment<'_, K>],
    now_ms: u64,
    tollgate_ms: u64,
) -> Cmd {
    batch_cmd_with(
        (Layout::Declared, Via::Eval, StateLayout::Compact),
        segments,
        Some(now_ms),
        tollgate_ms,
    )
}

/// The command of [`batch_cmd_in`], calendar periods chosen around `around_ms`.
fn batch_cmd_with<K: AsRef<str>>(
    (layout, via, layouts): (Layout, Via, StateLayout),
    segments: &[Segment<'_, K>],
    now_ms: Option<u64>,
    around_ms: u64,
) -> Cmd {
    let entries = runs::entries(segments);
    let n = entries.len();
    let key_bytes: usize = entries.iter().map(|e| e.key.len()).sum();
    let mut cmd = Cmd::with_capacity(6 + 2 * n, 72 + key_bytes + n * (OP_LEN + 1));
    match via {
        Via::Eval => cmd.arg("EVALSHA").arg(layout.script().get_hash()),
        Via::Function => cmd.arg("FCALL").arg(match layout {
            Layout::Declared => LIBRARY.batch.as_str(),
            Layout::AnySlot => LIBRARY.batch_any_slot.as_str(),
        }),
    };
    match layout {
        Layout::Declared => cmd.arg(n),
        Layout::AnySlot => cmd.arg(0).arg(n),
    };
    for entry in &entries {
        cmd.arg(entry.key);
    }
    match now_ms {
        Some(ms) => cmd.arg(ms),
        None => cmd.arg(""),
    };
    cmd.arg(layouts.flag());
    let (index, distinct) = distinct_ops(&entries);
    cmd.arg(index);
    if entries.iter().any(|e| e.run > 1) {
        let runs: Vec<u8> = entries.iter().map(|e| e.run).collect();
        cmd.arg(runs);
    } else {
        cmd.arg("");
    }
    for (flag, op) in distinct {
        op.write(&mut cmd, flag, around_ms);
    }
    cmd
}

/// At most this many distinct operations are indexed; past it every entry sends its
/// own. Why: finding an entry's place is a scan of those seen, and a call of 256
/// requests with a cost each (a token budget's) would make it quadratic, where a call
/// of such costs saves little by the index anyway.
const MAX_DISTINCT: usize = 32;

/// The distinct operations of `entries` (flag and operation) in order of first use,
/// and the index argument: byte i the 1-based place of entry i's among them. Why:
/// a call's operations mostly repeat (same rule, same cost), and each argument costs
/// Redis a string object and the script a Lua string, a share of a decision on
/// distinct counters worth sparing (BENCHMARKS.md counts it). Past
/// [`MAX_DISTINCT`] the index is empty and every entry sends its own.
fn distinct_ops<'a>(entries: &[runs::Entry<'a>]) -> (Vec<u8>, Vec<(Flag, &'a WireOp)>) {
    let mut distinct: Vec<(Flag, &'a WireOp)> = Vec::new();
    let mut index = Vec::with_capacity(entries.len());
    for entry in entries {
        let seen = distinct
            .iter()
            .position(|&(flag, op)| flag == entry.flag && op == entry.op);
        let at = match seen {
            Some(at) => at,
            None if distinct.len() < MAX_DISTINCT => {
                distinct.push((entry.flag, entry.op));
                distinct.len() - 1
            }
            None => {
                let each = entries.iter().map(|e| (e.flag, e.op)).collect();
                return (Vec::new(), each);
            }
        };
        // At most MAX_DISTINCT (32): always a byte.
        index.push(at as u8 + 1);
    }
    (index, distinct)
}

/// A consumed operation to give back.
pub struct Refund {
    pub key: String,
    pub op: WireOp,
    /// What the batch script returned to name the state it consumed from.
    pub token: i64,
}

/// The refund script's EVALSHA for `refunds` (all on one hash slot). `now_ms` is for
/// tests only, as [`batch_cmd`]'s: production passes `None` and the script reads the
/// shard's clock.
pub fn refund_cmd(refunds: &[&Refund], now_ms: Option<u64>) -> Cmd {
    let mut cmd = Cmd::new();
    cmd.arg("EVALSHA").arg(REFUND.get_hash()).arg(refunds.len());
    for refund in refunds {
        cmd.arg(refund.key.as_str());
    }
    match now_ms {
        Some(ms) => cmd.arg(ms),
        None => cmd.arg(""),
    };
    // A refund follows its batch call at once: the periods around now hold the one
    // its token names.
    let around = now_ms.unwrap_or_else(redis_clock_estimate);
    for refund in refunds {
        refund.op.write(&mut cmd, Flag::Continues, around);
        cmd.arg(refund.token);
    }
    cmd
}

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
