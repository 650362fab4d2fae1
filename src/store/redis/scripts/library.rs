//! The batch scripts as a Redis 7 function library (`FUNCTION LOAD`, called with
//! `FCALL`), and the switch between it and EVALSHA.
//!
//! Why: an EVALSHA runs its script's whole top level on every call: the shared helpers
//! and each algorithm module used are made anew (their functions and tables, then
//! collected), about 30k instructions per call before a decision (callgrind, BENCHMARKS.md).
//! On standalone a call carries ~20 decisions; on a cluster a master's call carries a
//! few, and that fixed part is most of it. A library's code stays in Redis: its helpers
//! and modules are built on a function's first call and kept (a library's top level
//! runs at load, where Redis 7.0 offers no `math` or `string`, hence on first call).
//!
//! One library per build: its name and its functions' carry the hash of its source,
//! so replicas of two releases in a rolling upgrade each call their own, and
//! `FUNCTION LOAD REPLACE` of the same build is idempotent. Functions replicate and
//! persist with the data, so a promoted replica serves them; a server that lost them
//! (`FUNCTION FLUSH`) answers "Function not found", and the call loads the library on
//! that connection and goes again, as EVALSHA does on NOSCRIPT. A server without
//! functions (Redis before 7) refuses the load at start, or FCALL later ("unknown
//! command"): that store's calls then go by EVALSHA ([`Engine::enabled`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, RedisResult};
use sha2::{Digest, Sha256};

use super::batch_code;
use super::contract::StateLayout;

/// The library's source, name and function names.
pub struct Library {
    pub source: String,
    pub name: String,
    /// Keys declared ([`super::Layout::Declared`]).
    pub batch: String,
    /// Keys in ARGV, any slot of the node ([`super::Layout::AnySlot`]).
    pub batch_any_slot: String,
}

pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    // Each function's code, built by its first call (see the module's header): what
    // lua/batch.lua makes once, ending with its entry point.
    let (declared, any) = (
        batch_code(false, "return batch"),
        batch_code(true, "return batch"),
    );
    let digest = Sha256::digest(format!("{declared}{any}").as_bytes());
    let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let name = format!("tollgate_{tag}");
    let batch = format!("tollgate_batch_{tag}");
    let batch_any_slot = format!("tollgate_batch_any_slot_{tag}");
    let source = format!(
        "#!lua name={name}\n\
         local function build_declared()\n{declared}\nend\n\
         local function build_any_slot()\n{any}\nend\n\
         local declared, any_slot\n\
         redis.register_function{{function_name = '{batch}', callback = function(keys, args)\n\
         \x20 if declared == nil then declared = build_declared() end\n\
         \x20 return declared(keys, args)\n\
         end}}\n\
         redis.register_function{{function_name = '{batch_any_slot}', flags = {{'allow-cross-slot-keys'}},\n\
         \x20 callback = function(keys, args)\n\
         \x20 if any_slot == nil then any_slot = build_any_slot() end\n\
         \x20 return any_slot(keys, args)\n\
         end}}\n"
    );
    Library {
        source,
        name,
        batch,
        batch_any_slot,
    }
});

/// How one store's batch calls reach the engine, and what they ask of it. One per
/// store, shared by its queues.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    /// By FCALL: set when the library loaded at start, cleared for good when its server
    /// does not know FCALL (a flag per process would let one store's old Redis turn
    /// every other's off).
    fcall: Arc<AtomicBool>,
    /// The layouts the engine writes counters in.
    layouts: StateLayout,
}

impl Engine {
    /// An engine writing `layouts`, by EVALSHA until the library is loaded.
    pub fn new(layouts: StateLayout) -> Self {
        Self {
            fcall: Arc::default(),
            layouts,
        }
    }

    pub fn enabled(&self) -> bool {
        self.fcall.load(Ordering::Relaxed)
    }

    /// The layouts its calls ask for.
    pub fn layouts(&self) -> StateLayout {
        self.layouts
    }

    /// Loads the library on `con` (on a cluster connection, every master). On success
    /// batch calls go by FCALL from now on.
    pub async fn load<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&LIBRARY.source)
            .query_async(con)
            .await?;
        self.fcall.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// Sends `cmd`, an FCALL of the library: loads the library and sends again when the
/// server lacks it; falls back to EVALSHA of `script` when the server has no functions.
pub async fn fcall<C: ConnectionLike>(
    con: &mut C,
    cmd: &Cmd,
    script: &redis::Script,
    functions: &Engine,
) -> RedisResult<Vec<u8>> {
    let result = match cmd.query_async(con).await {
        Err(e) if e.to_string().contains("Function not found") => {
            functions.load(con).await?;
            cmd.query_async(con).await
        }
        Err(e) if e.to_string().contains("unknown command") => {
            tracing::warn!(error = %e, "Redis has no functions (before 7?): batch calls go by EVALSHA from now on");
            functions.fcall.store(false, Ordering::Relaxed);
            return super::evalsha(con, &as_evalsha(cmd, script), script).await;
        }
        other => other,
    };
    if let Err(e) = &result {
        super::learn_from(e);
    }
    result
}

/// The EVALSHA of `script` with the arguments of `cmd` (an FCALL: name, key count, ...).
fn as_evalsha(cmd: &Cmd, script: &redis::Script) -> Cmd {
    let mut out = Cmd::new();
    out.arg("EVALSHA").arg(script.get_hash());
    for arg in cmd.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            out.arg(bytes);
        }
    }
    out
}
