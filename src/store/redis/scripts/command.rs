//! The batch and refund scripts' commands: one operation's encoding ([`WireOp`]),
//! a request's operations as a [`Segment`], and the EVALSHA of each script written
//! straight into one command buffer, with its keys declared ([`Layout::Declared`]: one
//! standalone server, or one hash slot) or passed as arguments to the cluster's
//! any-slot variant ([`Layout::AnySlot`]: every slot of one master).

use redis::{Cmd, Script};

use super::library::LIBRARY;
use super::runs;
use super::{BATCH, BATCH_ANY_SLOT, REFUND};
use crate::algorithm::calendar::Calendar;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::clock::{Clock, SystemClock};
use crate::store::CounterOp;

/// One operation as both scripts read it, owned and `Copy` so a request can wait in
/// the batcher's queue, or for its refund, without borrowing from its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireOp {
    pub(super) algorithm: u8,
    pub(super) limit: u64,
    pub(super) window_ms: u64,
    pub(super) burst: u64,
    pub(super) max_delay_ms: i64,
    pub(super) cost: u64,
    pub(super) vetoes: bool,
    /// `time_zone`: the periods are sent with the operation ([`CALENDAR_LEN`]).
    pub(super) calendar: Option<Calendar>,
    /// The mode's bits, `Mode::wire_bits` (bits 1-2 of the flags byte).
    pub(super) mode: u8,
}

/// The bytes [`WireOp::write`] makes: struct format `<BBddddBd` in the scripts (a
/// flag, the algorithm id, limit, window, burst, max delay as little-endian doubles,
/// the flags byte (vetoes, mode), the cost as a double).
const OP_LEN: usize = 1 + 1 + 4 * 8 + 1 + 8;

/// Redis's clock minus tollgate's (ms), as the batch script last reported it when a
/// calendar's periods missed Redis's clock ([`learn_redis_clock`]); 0 until then.
/// The periods are chosen around tollgate's clock plus this, so clocks that differ
/// by more than a period (a host whose clock is off, a test that sets Redis's) cost
/// one failed call, not wrong periods.
static REDIS_AHEAD_MS: AtomicI64 = AtomicI64::new(0);

/// Notes that Redis's clock read `redis_ms` just now.
pub fn learn_redis_clock(redis_ms: u64) {
    let ours = i128::from(SystemClock.now_millis());
    let ahead = (i128::from(redis_ms) - ours).clamp(i128::from(i64::MIN), i128::from(i64::MAX));
    REDIS_AHEAD_MS.store(ahead as i64, Ordering::Relaxed);
}

/// Tollgate's best idea of Redis's clock: its own, moved by what it learned.
pub fn redis_clock_estimate() -> u64 {
    SystemClock
        .now_millis()
        .saturating_add_signed(REDIS_AHEAD_MS.load(Ordering::Relaxed))
}

/// The bytes an operation with a calendar adds after [`OP_LEN`]: the starts of six
/// consecutive periods around tollgate's clock (`Calendar::bounds_around`), as
/// little-endian doubles (whole milliseconds, exact below 2^53). The script cannot
/// read a time-zone database, so it picks Redis's period among these.
const CALENDAR_LEN: usize = 6 * 8;

/// Where an operation stands in its call, the first byte of its encoding (see
/// `lua/batch.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flag {
    /// The first operation of a request.
    Starts = b'+' as isize,
    /// The first operation of a request decided as a dry run.
    StartsDry = b'-' as isize,
    /// A further operation of the same request (and every refund operation).
    Continues = b'.' as isize,
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
            // Lua numbers are doubles: costs above the burst or limit are all equally
            // impossible, so they are clamped to stay exact. A charge, a release or a
            // lease counts in full (up to 2^53, where doubles stop being exact).
            cost: if !op.commits() {
                op.cost.min(p.limit.max(p.burst).saturating_add(1))
            } else {
                op.cost.min(1 << 53)
            },
            vetoes: op.vetoes,
            calendar: p.calendar,
            mode: op.mode.wire_bits(),
        }
    }

    /// The encoder: appends this operation to `cmd` as one argument of [`OP_LEN`]
    /// bytes, numbers as the doubles Lua computes with. Why one argument: the script
    /// parses each distinct operation once per call, and a call's operations mostly
    /// repeat (same rule, same cost); why binary: one `struct.unpack` reads it, where
    /// matching a text made a Lua string per field and converted each (about a
    /// microsecond per call, as much as a decision), and formatting decimals here
    /// cost tollgate too. A u64 becomes the double nearest to it, as Lua's
    /// `tonumber` of its decimal did. A calendar's periods are those around
    /// `around_ms` (tollgate's clock, or a test's injected one).
    fn write(&self, cmd: &mut Cmd, flag: Flag, around_ms: u64) {
        let mut buf = [0u8; OP_LEN + CALENDAR_LEN];
        buf[0] = flag as u8;
        buf[1] = self.algorithm;
        let numbers = [
            self.limit as f64,
            self.window_ms as f64,
            self.burst as f64,
            self.max_delay_ms as f64,
        ];
        for (i, x) in numbers.into_iter().enumerate() {
            buf[2 + 8 * i..10 + 8 * i].copy_from_slice(&x.to_le_bytes());
        }
        buf[34] = u8::from(self.vetoes) | self.mode;
        buf[35..OP_LEN].copy_from_slice(&(self.cost as f64).to_le_bytes());
        let Some(calendar) = self.calendar else {
            cmd.arg(&buf[..OP_LEN]);
            return;
        };
        for (i, start) in calendar.bounds_around(around_ms).into_iter().enumerate() {
            let at = OP_LEN + 8 * i;
            buf[at..at + 8].copy_from_slice(&(start as f64).to_le_bytes());
        }
        cmd.arg(&buf[..]);
    }
}

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
/// the same order), as one command: a key and operation pair per operation, alike
/// one-operation requests in a row sharing one ([`runs`]), their run lengths last when
/// any is above one; the keys where `layout` puts them. `now_ms` is for tests only:
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
    batch_cmd_with((layout, via), segments, now_ms, around)
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
    functions: &super::Functions,
) -> Cmd {
    let via = if functions.enabled() {
        Via::Function
    } else {
        Via::Eval
    };
    batch_cmd_with((layout, via), segments, None, redis_clock_estimate())
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
        (Layout::Declared, Via::Eval),
        segments,
        Some(now_ms),
        tollgate_ms,
    )
}

/// The command of [`batch_cmd_in`], calendar periods chosen around `around_ms`.
fn batch_cmd_with<K: AsRef<str>>(
    (layout, via): (Layout, Via),
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
    for entry in &entries {
        entry.op.write(&mut cmd, entry.flag, around_ms);
    }
    if entries.iter().any(|e| e.run > 1) {
        let runs: Vec<u8> = entries.iter().map(|e| e.run).collect();
        cmd.arg(runs);
    }
    cmd
}

/// A consumed operation to give back.
pub struct Refund {
    pub key: String,
    pub op: WireOp,
    /// What the batch script returned to name the state it consumed from.
    pub token: i64,
}

/// The refund script's EVALSHA for `refunds` (all on one hash slot).
pub fn refund_cmd(refunds: &[&Refund]) -> Cmd {
    let mut cmd = Cmd::new();
    cmd.arg("EVALSHA").arg(REFUND.get_hash()).arg(refunds.len());
    for refund in refunds {
        cmd.arg(refund.key.as_str());
    }
    // A refund follows its batch call at once: the periods around now hold the one
    // its token names.
    let around = redis_clock_estimate();
    for refund in refunds {
        refund.op.write(&mut cmd, Flag::Continues, around);
        cmd.arg(refund.token);
    }
    cmd
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
                entries: [("k".into(), "v".into())].into_iter().collect(),
                algorithm: limit.algorithm,
                window_secs: limit.window_secs(),
                time_zone: None,
                hash_tag: None,
            },
            params: limit.params(),
            cost,
            vetoes,
            mode: crate::algorithm::Mode::Limit,
        }
    }

    /// The bytes of one operation as the scripts unpack them (`<BBddddBd`).
    fn encoded(flag: u8, id: u8, numbers: [f64; 4], vetoes: u8, cost: f64) -> Vec<u8> {
        let mut bytes = vec![flag, id];
        for x in numbers {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        bytes.push(vetoes);
        bytes.extend_from_slice(&cost.to_le_bytes());
        bytes
    }

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => b"<other>".to_vec(),
            })
            .collect()
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
        let text = |s: &str| s.as_bytes().to_vec();
        let expected = [
            text("EVALSHA"),
            text(BATCH.get_hash()),
            text("3"),
            text("a{x}"),
            text("b{x}"),
            text("c{y}"),
            text(""),
            // The first segment is a dry run: "-" starts it, "." continues it.
            encoded(b'-', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0),
            encoded(b'.', 1, [5.0, 60000.0, 5.0, -1.0], 0, 2.0),
            encoded(b'+', 1, [7.0, 60000.0, 7.0, -1.0], 1, 1.0),
        ];
        assert_eq!(args(&cmd), expected);
        assert!(expected[7..].iter().all(|op| op.len() == OP_LEN));
        let one = [Segment {
            keys: &keys[..1],
            ops: &wire[..1],
            dry_run: false,
        }];
        let injected = args(&batch_cmd(&one, Some(1234)));
        assert_eq!(injected[4], b"1234");
        assert_eq!(
            injected[5],
            encoded(b'+', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0)
        );
    }

    /// The any-slot layout declares no key: their count, the keys, then the
    /// arguments exactly as the declared layout sends them.
    #[test]
    fn any_slot_cmd_passes_its_keys_after_their_count() {
        let wire = [WireOp::new(&op(10, 1, true)), WireOp::new(&op(5, 2, false))];
        let keys = ["a{x}", "b{y}"];
        let segments = [Segment {
            keys: &keys[..],
            ops: &wire[..],
            dry_run: false,
        }];
        let declared = args(&batch_cmd(&segments, None));
        let any = args(&batch_cmd_in(Layout::AnySlot, &segments, None));
        let text = |s: &str| s.as_bytes().to_vec();
        assert_eq!(
            any[..3],
            [text("EVALSHA"), text(BATCH_ANY_SLOT.get_hash()), text("0")]
        );
        // Declared: EVALSHA, sha, 2, keys, ...; any-slot: EVALSHA, sha, 0, 2, keys, ...
        assert_eq!(any[3..], declared[2..]);
        assert!(BATCH_ANY_SLOT.get_hash() != BATCH.get_hash());
    }

    /// Alike one-operation requests in a row on one counter are one pair; their run
    /// lengths follow the operations, one byte per pair.
    #[test]
    fn a_hot_counter_is_one_pair_with_its_run_length() {
        let wire = [WireOp::new(&op(10, 1, true))];
        let (hot, other) = (["hot"], ["other"]);
        let segment = |keys| Segment {
            keys,
            ops: &wire[..],
            dry_run: false,
        };
        let segments = [
            segment(&hot[..]),
            segment(&hot),
            segment(&hot),
            segment(&other),
        ];
        let op = encoded(b'+', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0);
        let text = |s: &str| s.as_bytes().to_vec();
        assert_eq!(
            args(&batch_cmd(&segments, None)),
            [
                text("EVALSHA"),
                text(BATCH.get_hash()),
                text("2"),
                text("hot"),
                text("other"),
                text(""),
                op.clone(),
                op,
                vec![3, 1],
            ]
        );
    }

    /// The extremes arrive as the doubles Lua would have read from their decimals.
    #[test]
    fn the_extremes_are_encoded_as_the_nearest_doubles() {
        let wire = WireOp {
            algorithm: u8::MAX,
            limit: u64::MAX,
            window_ms: u64::MAX,
            burst: u64::MAX,
            max_delay_ms: i64::MIN,
            cost: u64::MAX,
            vetoes: true,
            calendar: None,
            mode: 0,
        };
        let mut cmd = Cmd::new();
        wire.write(&mut cmd, Flag::StartsDry, 0);
        let max: f64 = u64::MAX.to_string().parse().expect("a number");
        let min: f64 = i64::MIN.to_string().parse().expect("a number");
        assert_eq!(
            args(&cmd),
            [encoded(b'-', 255, [max, max, max, min], 1, max)]
        );
    }

    #[test]
    fn refund_cmd_is_evalsha_with_the_batch_encoding_then_the_token() {
        let ops = [op(10, 1, true), op(5, 2, false)];
        let refunds: Vec<Refund> = ops
            .iter()
            .zip(["a{x}", "b{x}"])
            .zip([7, -3])
            .map(|((o, key), token)| Refund {
                key: key.into(),
                op: WireOp::new(o),
                token,
            })
            .collect();
        let refs: Vec<&Refund> = refunds.iter().collect();
        let text = |s: &str| s.as_bytes().to_vec();
        // Per operation: its encoding as the batch script reads it, then the token.
        let expected = [
            text("EVALSHA"),
            text(REFUND.get_hash()),
            text("2"),
            text("a{x}"),
            text("b{x}"),
            encoded(b'.', 1, [10.0, 60000.0, 10.0, -1.0], 1, 1.0),
            text("7"),
            encoded(b'.', 1, [5.0, 60000.0, 5.0, -1.0], 0, 2.0),
            text("-3"),
        ];
        assert_eq!(args(&refund_cmd(&refs)), expected);
    }
}
