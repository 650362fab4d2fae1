//! Redis instructions per decision: what one `redis-server` process executes (all of
//! it: reading the calls, parsing, the script, the replies) for tollgate's batch calls
//! on a distinct-key load, counted by callgrind, so the figure does not move with the
//! machine's other load.
//!
//! Starts `valgrind --tool=callgrind redis-server` on a free loopback port, loads the
//! function library exactly as tollgate builds it, and sends the calls the standalone
//! batcher sends under the bench's distinct-key load (`tollgate bench -d D
//! --entry-keys 'key{d}'`): requests of D descriptors, descriptor j on `key<j>` with a
//! value drawn uniformly from `--keys`, each a counter of its own rule (10^9 per
//! hour), `--per-call` requests per FCALL, built by tollgate's own command builder.
//! One warm-up pass over the same draw first, so every counter exists (as most do a
//! few seconds into a bench); then the count is zeroed, the same calls sent again, and
//! the dump read. With `--baseline pipeline` it sends what a server counting as
//! envoyproxy/ratelimit does instead: per request, per descriptor, `INCRBY key 1` and
//! `EXPIRE key 3600` (the window's start in the key), pipelined.
//!
//! ```text
//! cargo run --release --example redis_instructions -- [--algorithm fixed_window]
//!     [--descriptors 3] [--per-call 20] [--calls 300] [--keys 100000] [--seed 1]
//!     [--baseline pipeline] [--cold] [--dump FILE] [--redis-server PATH] [--emit DIR]
//! ```
//!
//! `--cold` skips the warm-up: every counter is new. Prints one line: instructions per
//! decision (per descriptor of a request), and per request. `--dump FILE` keeps
//! callgrind's dump of the measured calls, for `callgrind_annotate FILE`. `--emit DIR`
//! starts no server: it writes the function library (`DIR/library.lua`) and the calls
//! as RESP (`DIR/calls.resp`), for a Lua interpreter that counts the engine's own
//! instructions line by line (what callgrind shows only as `luaV_execute`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::algorithm::{Algorithm, Mode, Params};
use tollgate::store::redis::keys;
use tollgate::store::redis::scripts::{self, Layout, Segment, Via, WireOp};
use tollgate::store::{CounterKey, CounterOp};

struct Options {
    algorithm: Algorithm,
    descriptors: usize,
    per_call: usize,
    calls: usize,
    keys: u64,
    seed: u64,
    pipeline: bool,
    cold: bool,
    /// Where to copy callgrind's dump (for `callgrind_annotate`).
    dump: Option<String>,
    /// The redis-server binary (one built with symbols names the functions).
    redis_server: String,
    /// Where to write the library and the calls instead of running them.
    emit: Option<String>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        algorithm: Algorithm::FixedWindow,
        descriptors: 3,
        per_call: 20,
        calls: 300,
        keys: 100_000,
        seed: 1,
        pipeline: false,
        cold: false,
        dump: None,
        redis_server: "redis-server".into(),
        emit: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--cold" {
            o.cold = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--algorithm" => {
                o.algorithm = Algorithm::parse(&value).ok_or(format!("no algorithm {value}"))?
            }
            "--descriptors" => o.descriptors = number(&value)? as usize,
            "--per-call" => o.per_call = number(&value)? as usize,
            "--calls" => o.calls = number(&value)? as usize,
            "--keys" => o.keys = number(&value)?,
            "--seed" => o.seed = number(&value)?,
            "--baseline" if value == "pipeline" => o.pipeline = true,
            "--dump" => o.dump = Some(value),
            "--redis-server" => o.redis_server = value,
            "--emit" => o.emit = Some(value),
            _ => return Err(format!("unknown flag {flag} {value}")),
        }
    }
    Ok(o)
}

/// xorshift64*: a draw a seed reproduces.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Redis under callgrind, stopped when dropped.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(redis_server: &str) -> Result<(Server, redis::Connection), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = dir.path().join("cg.out");
    let child = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args([
            redis_server,
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start valgrind redis-server: {e}"))?;
    let server = Server { child, dir };
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.get_connection() {
            Ok(con) => return Ok((server, con)),
            Err(e) if Instant::now() > deadline => return Err(format!("redis: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn op(algorithm: Algorithm, j: usize, value: u64) -> CounterOp {
    let limit = 1_000_000_000;
    let params = Params {
        algorithm,
        limit,
        window_ms: 3_600_000,
        burst: limit,
        max_delay_ms: None,
        calendar: None,
    };
    CounterOp {
        key: CounterKey {
            domain: Arc::from("bench"),
            rule: Arc::from(format!("key{j}").as_str()),
            entries: [(format!("key{j}").into(), value.to_string().into())]
                .into_iter()
                .collect(),
            algorithm,
            window_secs: 3600,
            time_zone: None,
            hash_tag: None,
        },
        params,
        cost: 1,
        vetoes: true,
        mode: Mode::Limit,
        lease: None,
    }
}

/// One call's commands: a batch FCALL of `per_call` requests, or the pipeline
/// baseline's commands for the same requests.
fn call(o: &Options, rng: &mut Rng) -> Vec<redis::Cmd> {
    let requests: Vec<Vec<CounterOp>> = (0..o.per_call)
        .map(|_| {
            (0..o.descriptors)
                .map(|j| op(o.algorithm, j, rng.below(o.keys)))
                .collect()
        })
        .collect();
    let encoded: Vec<Vec<String>> = requests
        .iter()
        .map(|ops| {
            ops.iter()
                .map(|op| keys::encode("tollgate_", &op.key))
                .collect()
        })
        .collect();
    if o.pipeline {
        let mut out = Vec::new();
        for keys in &encoded {
            for key in keys {
                out.push(redis::cmd("INCRBY").arg(key).arg(1).clone());
                out.push(redis::cmd("EXPIRE").arg(key).arg(3600).clone());
            }
        }
        return out;
    }
    let wire: Vec<Vec<WireOp>> = requests
        .iter()
        .map(|ops| ops.iter().map(WireOp::new).collect())
        .collect();
    let segments: Vec<Segment<'_, String>> = encoded
        .iter()
        .zip(&wire)
        .map(|(keys, ops)| Segment {
            keys,
            ops,
            dry_run: false,
        })
        .collect();
    vec![scripts::batch_cmd_via(
        (Layout::Declared, Via::Function),
        &segments,
        None,
    )]
}

fn send(con: &mut redis::Connection, o: &Options, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    for _ in 0..o.calls {
        let mut pipe = redis::pipe();
        for cmd in call(o, &mut rng) {
            pipe.add_command(cmd);
        }
        let _: Vec<redis::Value> = pipe.query(con).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `--emit`: the library and one pass of calls, as files.
fn emit(o: &Options, dir: &str) -> Result<(), String> {
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("library.lua"), &scripts::LIBRARY.source).map_err(|e| e.to_string())?;
    let mut rng = Rng(o.seed | 1);
    let mut resp = Vec::new();
    for _ in 0..o.calls {
        for cmd in call(o, &mut rng) {
            resp.extend(cmd.get_packed_command());
        }
    }
    std::fs::write(dir.join("calls.resp"), resp).map_err(|e| e.to_string())
}

fn callgrind_control(server: &Server, flag: &str) -> Result<(), String> {
    let status = Command::new("callgrind_control")
        .arg(flag)
        .arg(server.child.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if !status.success() {
        return Err(format!("callgrind_control {flag} failed"));
    }
    Ok(())
}

/// The instructions of the first dump (`cg.out.1`: what ran since the zeroing).
fn dumped(server: &Server) -> Result<u64, String> {
    let path = server.dir.path().join("cg.out.1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Some(total) = text
                .lines()
                .find_map(|l| l.strip_prefix("summary:").or(l.strip_prefix("totals:")))
        {
            return total.trim().parse().map_err(|e| format!("dump: {e}"));
        }
        if Instant::now() > deadline {
            return Err(format!("no dump at {}", path.display()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn main() {
    let o = options().unwrap_or_else(|e| {
        eprintln!("redis_instructions: {e}");
        std::process::exit(2)
    });
    if let Some(dir) = &o.emit {
        if let Err(e) = emit(&o, dir) {
            eprintln!("redis_instructions: {e}");
            std::process::exit(1);
        }
        return;
    }
    let run = || -> Result<u64, String> {
        let (server, mut con) = start(&o.redis_server)?;
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&scripts::LIBRARY.source)
            .query(&mut con)
            .map_err(|e| format!("FUNCTION LOAD: {e}"))?;
        if !o.cold {
            send(&mut con, &o, o.seed)?;
        }
        callgrind_control(&server, "-z")?;
        // The measured pass: the warm-up's draw again, so every counter exists (cold:
        // a draw of its own, on a server that has seen none).
        send(&mut con, &o, o.seed)?;
        callgrind_control(&server, "-d")?;
        let total = dumped(&server)?;
        if let Some(to) = &o.dump {
            std::fs::copy(server.dir.path().join("cg.out.1"), to).map_err(|e| e.to_string())?;
        }
        Ok(total)
    };
    match run() {
        Ok(total) => {
            let requests = (o.calls * o.per_call) as u64;
            let decisions = requests * o.descriptors as u64;
            let what = if o.pipeline {
                "pipeline".to_owned()
            } else {
                o.algorithm.name().to_owned()
            };
            println!(
                "{what}: {} descriptors, {} per call, {} calls, {} keys{}: {} instructions per decision, {} per request",
                o.descriptors,
                o.per_call,
                o.calls,
                o.keys,
                if o.cold { ", cold" } else { "" },
                total / decisions,
                total / requests
            );
        }
        Err(e) => {
            eprintln!("redis_instructions: {e}");
            std::process::exit(1);
        }
    }
}
