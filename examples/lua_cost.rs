//! Script time per decision: what Redis spends inside the batch script for each
//! counter operation, by algorithm and batch size, read from Redis itself.
//!
//! Starts a private `redis-server` on a free loopback port (no persistence), loads the
//! batch script exactly as tollgate assembles it (`scripts::BATCH`), and sends it the
//! calls the standalone batcher sends under load, built by the same
//! `scripts::batch_cmd`: N one-operation requests (segments) per EVALSHA (on one hot
//! counter, one key and operation with a run length of N), on the server's clock (so
//! TTLs are written, as in production). For
//! each algorithm and N it makes `--calls` calls in 5 rounds, each from a reset
//! `INFO commandstats`, and reports the best round's EVALSHA `usec_per_call` and that
//! divided by N: microseconds of script time per decision.
//!
//! Three key layouts: `hot` (every operation of every call on one counter: one
//! descriptor under load), `spread` (N counters, each hit once per call, the same N in
//! every call) and `cold` (every operation on a counter never seen before, as most of
//! a distinct-key load's are: the key is created and gets its TTL). With
//! `--descriptors D` each request has D operations, on D counters (hot: the same D in
//! every request, as the bench's D-descriptor body; spread: D of its own), and the
//! time per decision divides by N x D.
//! Limits are high enough that every operation is admitted (the write path), except
//! the sliding log's, whose state is the list of its hits: it is measured at 100 per
//! minute, so its log stays small and most operations are denied once it is full.
//!
//! The times are Redis's own, so the example's build profile does not change them (a
//! debug build will do); the machine's other load does: compare in alternating runs.
//!
//! With `--via function` the calls are FCALLs of the function library (what tollgate
//! sends to a Redis 7), timed from FCALL's `usec_per_call`.
//!
//! `--script` measures another script on the same layouts, to compare with:
//! `one-script` is the one-script server's (`examples/support/one_script.lua`, by
//! EVALSHA, one request of D counters per call, as that server sends; its spread
//! layout cycles through N requests' counters, so they exist: warm), and `incrby` a
//! script that only runs `redis.pcall('INCRBY')` on each of a call's N x D keys (by
//! EVALSHA, or FCALL with `--via function`): the least a decision through Lua costs.
//!
//! With `--redis-server scripts/callgrind-redis` Redis runs under callgrind, one dump
//! per script call (see that script): instructions per call instead of time.
//!
//! ```text
//! cargo run --release --example lua_cost -- [--calls 2000] [--sizes 1,13,64]
//!     [--descriptors 1] [--algorithms fixed_window,gcra] [--redis-server redis-server]
//!     [--via eval|function] [--script batch|one-script|incrby]
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::algorithm::{Algorithm, Params};
use tollgate::store::redis::scripts::{self, Layout, Segment, Via, WireOp};
use tollgate::store::{CounterKey, CounterOp};

#[path = "support/lua_cost_scripts.rs"]
mod other;

use other::Script;

struct Options {
    calls: usize,
    sizes: Vec<usize>,
    /// Operations per request, each on its own counter.
    descriptors: usize,
    redis_server: String,
    /// Only these algorithms (all when empty).
    algorithms: Vec<Algorithm>,
    via: Via,
    script: Script,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        calls: 2000,
        sizes: vec![1, 13, 64],
        descriptors: 1,
        redis_server: "redis-server".into(),
        algorithms: vec![],
        via: Via::Eval,
        script: Script::Batch,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--calls" => o.calls = value.parse().map_err(|e| format!("--calls: {e}"))?,
            "--sizes" => {
                o.sizes = value
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sizes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--descriptors" => {
                o.descriptors = value.parse().ok().filter(|&d| d > 0).ok_or(format!(
                    "--descriptors: {value} is not a count of one or more"
                ))?
            }
            "--redis-server" => o.redis_server = value,
            "--via" => {
                o.via = match value.as_str() {
                    "eval" => Via::Eval,
                    "function" => Via::Function,
                    _ => return Err(format!("--via: {value} is not eval or function")),
                }
            }
            "--script" => {
                o.script = match value.as_str() {
                    "batch" => Script::Batch,
                    "one-script" => Script::OneScriptServer,
                    "incrby" => Script::Incrby,
                    _ => {
                        return Err(format!(
                            "--script: {value} is not batch, one-script or incrby"
                        ));
                    }
                }
            }
            "--algorithms" => {
                o.algorithms = value
                    .split(',')
                    .map(|name| Algorithm::parse(name).ok_or(format!("no algorithm {name}")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(o)
}

/// The private server, stopped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(binary: &str) -> Result<(Server, redis::Connection), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let child = Command::new(binary)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--dir", "/tmp"])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {binary}: {e}"))?;
    let server = Server(child);
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.get_connection() {
            Ok(con) => return Ok((server, con)),
            Err(e) if Instant::now() > deadline => return Err(format!("redis: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn op(algorithm: Algorithm) -> CounterOp {
    let limit = match algorithm {
        Algorithm::SlidingLog => 100,
        _ => 1_000_000_000,
    };
    let params = Params {
        algorithm,
        limit,
        window_ms: 60_000,
        burst: limit,
        max_delay_ms: None,
        calendar: None,
    };
    CounterOp {
        key: CounterKey {
            domain: Arc::from("lua_cost"),
            rule: Arc::from("r"),
            entries: Default::default(),
            algorithm,
            window_secs: 60,
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

/// The script calls' (calls, usec) from `INFO commandstats` (EVALSHA or FCALL).
fn evalsha_stats(con: &mut redis::Connection, via: Via) -> redis::RedisResult<(u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con)?;
    let name = match via {
        Via::Eval => "cmdstat_evalsha:",
        Via::Function => "cmdstat_fcall:",
    };
    let line = info.lines().find(|l| l.starts_with(name)).unwrap_or("");
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok((field("calls="), field("usec=")))
}

/// Microseconds of script time per call for `calls` calls of `n` segments, the best
/// round's mean.
fn measure(
    con: &mut redis::Connection,
    (script, algorithm): (Script, Algorithm),
    (n, d): (usize, usize),
    (layout, via): (KeyLayout, Via),
    calls: usize,
) -> redis::RedisResult<f64> {
    let _: () = redis::cmd("FLUSHALL").query(con)?;
    let wire = vec![WireOp::new(&op(algorithm)); d];
    let name = algorithm.name();
    // The keys of request `i` of call `call` (`call` names fresh counters in the cold
    // layout), as long as a real counter key (prefix, domain, entries, tail).
    let request_keys = |call: usize, i: usize| -> Vec<String> {
        (0..d)
            .map(|j| match layout {
                KeyLayout::Hot => format!("lua_cost_{{bench\x1fkey{j}\x1f0}}{name}"),
                KeyLayout::Spread => format!("lua_cost_{{bench\x1fkey{j}\x1f{i}}}{name}"),
                KeyLayout::Cold => format!("lua_cost_{{bench\x1fkey{j}\x1f{call}.{i}}}{name}"),
            })
            .collect()
    };
    let command = |call: usize| match script {
        Script::Batch => {
            let keys: Vec<Vec<String>> = (0..n).map(|i| request_keys(call, i)).collect();
            let segments: Vec<Segment<'_, String>> = keys
                .iter()
                .map(|k| Segment {
                    keys: k,
                    ops: &wire,
                    dry_run: false,
                })
                .collect();
            scripts::batch_cmd_via((Layout::Declared, via), &segments, None)
        }
        Script::OneScriptServer => other::one_script_call(request_keys(call, call % n)),
        Script::Incrby => {
            other::incrby_call(via, (0..n).flat_map(|i| request_keys(call, i)).collect())
        }
    };
    let mut cmd = command(0);
    let mut call = 0;
    // The best of ROUNDS rounds: commandstats times are wall-clock, and other
    // processes on the machine only ever add to them.
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con)?;
        for _ in 0..calls.div_ceil(ROUNDS) {
            if layout == KeyLayout::Cold {
                call += 1;
                cmd = command(call);
            }
            if script != Script::Batch {
                let _: redis::Value = cmd.query(con)?;
                continue;
            }
            let reply: Vec<u8> = cmd.query(con)?;
            if let Err(e) = scripts::parse_batch_reply(&reply, n * d) {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "malformed reply",
                    e,
                )));
            }
        }
        let via = if script == Script::OneScriptServer {
            Via::Eval
        } else {
            via
        };
        let (made, usec) = evalsha_stats(con, via)?;
        best = best.min(usec as f64 / made.max(1) as f64);
    }
    Ok(best)
}

/// Which counters a call's operations hit (see the module's header).
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyLayout {
    Hot,
    Spread,
    Cold,
}

impl KeyLayout {
    fn name(self) -> &'static str {
        match self {
            KeyLayout::Hot => "hot",
            KeyLayout::Spread => "spread",
            KeyLayout::Cold => "cold",
        }
    }
}

/// Rounds per measurement (see [`measure`]).
const ROUNDS: usize = 5;

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lua_cost: {e}");
            std::process::exit(2);
        }
    };
    let (_server, mut con) = match start(&o.redis_server) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("lua_cost: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = other::load(&mut con, o.script, o.via) {
        eprintln!("lua_cost: {e}");
        std::process::exit(1);
    }
    println!("| script | keys | decisions per call | us per call | us per decision |");
    println!("|---|---|---|---|---|");
    // The other scripts know no algorithm: measured once.
    let algorithms = match o.script {
        Script::Batch => Algorithm::ALL.to_vec(),
        Script::OneScriptServer | Script::Incrby => vec![Algorithm::FixedWindow],
    };
    for algorithm in algorithms {
        if o.script == Script::Batch
            && !o.algorithms.is_empty()
            && !o.algorithms.contains(&algorithm)
        {
            continue;
        }
        let label = match o.script {
            Script::Batch => algorithm.name(),
            Script::OneScriptServer => "one-script server's script",
            Script::Incrby => "INCRBY only",
        };
        for layout in [KeyLayout::Hot, KeyLayout::Spread, KeyLayout::Cold] {
            for &n in &o.sizes {
                if layout == KeyLayout::Spread && n == 1 {
                    continue;
                }
                // The one-script server's call is one request: only spread has an N.
                if o.script == Script::OneScriptServer
                    && layout != KeyLayout::Spread
                    && n != o.sizes[0]
                {
                    continue;
                }
                let d = o.descriptors;
                // The one-script server's call carries one request.
                let decisions = if o.script == Script::OneScriptServer {
                    d
                } else {
                    n * d
                };
                let shape = (o.script, algorithm);
                match measure(&mut con, shape, (n, d), (layout, o.via), o.calls) {
                    Ok(per_call) => println!(
                        "| {label} | {} | {decisions} | {per_call:.1} | {:.2} |",
                        layout.name(),
                        per_call / decisions as f64
                    ),
                    Err(e) => {
                        eprintln!("lua_cost: {label}: {e}");
                        std::process::exit(1);
                    }
                }
            }
        }
    }
}
