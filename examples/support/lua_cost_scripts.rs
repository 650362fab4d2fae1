//! `examples/lua_cost.rs`'s other scripts (`--script one-script|incrby`): what they
//! are, how they are loaded, and one call of each.

use redis::Cmd;
use tollgate::store::redis::scripts::{self, Via};

/// Which script the calls run (`lua_cost.rs`'s header says what each is).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Script {
    Batch,
    OneScriptServer,
    Incrby,
}

/// The one-script server's script.
const ONE_SCRIPT: &str = include_str!("one_script.lua");
/// INCRBY on every key, nothing else: as a script, and as a function library.
const INCRBY: &str = "for _, k in ipairs(KEYS) do redis.pcall('INCRBY', k, 1) end return 1";
const INCRBY_LIBRARY: &str = "#!lua name=lua_cost_incrby
redis.register_function('lua_cost_incrby', function(keys)
  for _, k in ipairs(keys) do redis.pcall('INCRBY', k, 1) end
  return 1
end)";

/// One call of the one-script server's script: one request, its counters' `keys`, one
/// hit each, an expiry of a minute on a new one.
pub fn one_script_call(keys: Vec<String>) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(redis::Script::new(ONE_SCRIPT).get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(1)
        .arg(60_000);
    cmd
}

/// One call of the INCRBY-only script (or function, `via`) on `keys`.
pub fn incrby_call(via: Via, keys: Vec<String>) -> Cmd {
    let mut cmd = match via {
        Via::Eval => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(redis::Script::new(INCRBY).get_hash());
            cmd
        }
        Via::Function => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg("lua_cost_incrby");
            cmd
        }
    };
    cmd.arg(keys.len()).arg(keys);
    cmd
}

/// Loads what `script` measures: the batch script, and the library when `via` is a
/// function; or the other script.
pub fn load(con: &mut redis::Connection, script: Script, via: Via) -> Result<(), String> {
    let function = |con: &mut redis::Connection, source: &str| -> Result<(), String> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(source)
            .query::<String>(con)
            .map(|_| ())
            .map_err(|e| format!("FUNCTION LOAD: {e}"))
    };
    match script {
        Script::Batch => {
            let loaded: redis::RedisResult<String> = scripts::BATCH.prepare_invoke().load(con);
            loaded.map_err(|e| format!("SCRIPT LOAD: {e}"))?;
            if via == Via::Function {
                function(con, &scripts::LIBRARY.source)?;
            }
        }
        Script::OneScriptServer => {
            let loaded: redis::RedisResult<String> =
                redis::Script::new(ONE_SCRIPT).prepare_invoke().load(con);
            loaded.map_err(|e| format!("SCRIPT LOAD: {e}"))?;
        }
        Script::Incrby => {
            let loaded: redis::RedisResult<String> =
                redis::Script::new(INCRBY).prepare_invoke().load(con);
            loaded.map_err(|e| format!("SCRIPT LOAD: {e}"))?;
            if via == Via::Function {
                function(con, INCRBY_LIBRARY)?;
            }
        }
    }
    Ok(())
}
