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
use crate::store::CounterOp;

mod reply;
mod runs;

pub use reply::{Reply, parse_batch_reply};

const COMMON: &str = include_str!("../../../lua/common.lua");

/// `lua/common.lua`, the generated dispatch, then `entry`.
///
/// The dispatch is a function `algorithm(id)` (an algorithm's position in
/// [`Algorithm::ALL`], from 1), generated from the Rust list so the ids cannot drift
/// from the enum. Each algorithm's module (`lua/<name>.lua`) sits in one branch of a
/// generated `algorithm(id)`, which builds a module on its first use in a call. Why
/// lazily: Redis keeps the compiled script, but its top level runs on every call, and
/// defining all six modules (their functions and tables) cost more per call than
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

pub static BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&assemble(include_str!("../../../lua/batch.lua"))));
pub static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(&assemble(include_str!("../../../lua/refund.lua"))));

/// Sends `cmd` (an EVALSHA of `script`); on NOSCRIPT loads the script with SCRIPT LOAD
/// and sends it once more. The body never travels with EVAL.
pub async fn evalsha<C: ConnectionLike, T: FromRedisValue>(
    con: &mut C,
    cmd: &Cmd,
    script: &Script,
) -> RedisResult<T> {
    match cmd.query_async(con).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// One operation as both scripts read it, owned and `Copy` so a request can wait in
/// the batcher's queue, or for its refund, without borrowing from its caller.
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

/// The bytes [`WireOp::write`] makes: struct format `<BBddddBd` in the scripts (a
/// flag, the algorithm id, limit, window, burst, max delay as little-endian doubles,
/// the vetoes flag, the cost as a double).
const OP_LEN: usize = 1 + 1 + 4 * 8 + 1 + 8;

/// Where an operation stands in its call, the first byte of its encoding (see
/// `lua/batch.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
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
            // impossible, so they are clamped to stay exact.
            cost: op.cost.min(p.limit.max(p.burst).saturating_add(1)),
            vetoes: op.vetoes,
        }
    }

    /// The encoder: appends this operation to `cmd` as one argument of [`OP_LEN`]
    /// bytes, numbers as the doubles Lua computes with. Why one argument: the script
    /// parses each distinct operation once per call, and a call's operations mostly
    /// repeat (same rule, same cost); why binary: one `struct.unpack` reads it, where
    /// matching a text made a Lua string per field and converted each (about a
    /// microsecond per call, as much as a decision), and formatting decimals here
    /// cost tollgate too. A u64 becomes the double nearest to it, as Lua's
    /// `tonumber` of its decimal did.
    fn write(&self, cmd: &mut Cmd, flag: Flag) {
        let mut buf = [0u8; OP_LEN];
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
        buf[34] = u8::from(self.vetoes);
        buf[35..].copy_from_slice(&(self.cost as f64).to_le_bytes());
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

/// The batch script's EVALSHA for `segments` (one per request; keys and operations in
/// the same order), as one command: a key and operation pair per operation, alike
/// one-operation requests in a row sharing one ([`runs`]), their run lengths last when
/// any is above one. `now_ms` is for tests only: production passes `None` and the
/// script reads the shard's clock. Written into the command's single buffer: a
/// `ScriptInvocation` would keep every key and argument in a `Vec` of its own, then
/// copy them all into a command again, two allocations per argument.
pub fn batch_cmd<K: AsRef<str>>(segments: &[Segment<'_, K>], now_ms: Option<u64>) -> Cmd {
    let entries = runs::entries(segments);
    let n = entries.len();
    let key_bytes: usize = entries.iter().map(|e| e.key.len()).sum();
    let mut cmd = Cmd::with_capacity(5 + 2 * n, 64 + key_bytes + n * (OP_LEN + 1));
    cmd.arg("EVALSHA").arg(BATCH.get_hash()).arg(n);
    for entry in &entries {
        cmd.arg(entry.key);
    }
    match now_ms {
        Some(ms) => cmd.arg(ms),
        None => cmd.arg(""),
    };
    for entry in &entries {
        entry.op.write(&mut cmd, entry.flag);
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
    for refund in refunds {
        refund.op.write(&mut cmd, Flag::Continues);
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
                hash_tag: None,
            },
            params: limit.params(),
            cost,
            vetoes,
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
        };
        let mut cmd = Cmd::new();
        wire.write(&mut cmd, Flag::StartsDry);
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

    /// The dispatch comes from the Rust list, in id order, before the entry point
    /// that indexes it.
    #[test]
    fn scripts_carry_the_generated_dispatch() {
        for entry in [
            include_str!("../../../lua/batch.lua"),
            include_str!("../../../lua/refund.lua"),
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
