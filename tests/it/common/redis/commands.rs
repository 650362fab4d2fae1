//! Running `redis-cli` (and other commands) to completion with a timeout, and reading
//! its replies: the `redis_cli` family, [`info_field`], and the script calls a server
//! counted ([`script_calls`]).

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::keys::KeyTarget;
use super::{HOST, RedisCluster};

/// Bound for one `redis-cli` call made by a test helper.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `redis-cli -e -h 127.0.0.1 -p PORT ARGS...` and returns its stdout without the
/// final newline (raw format: one line per array element, empty for nil). Panics with
/// stderr when it fails, including on an error reply.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    cli(&port, args)
}

/// Like [`redis_cli`], but returns the failure (stderr, e.g. an error reply) instead of
/// panicking.
pub fn try_redis_cli(port: u16, args: &[&str]) -> Result<String, String> {
    try_cli(port, false, args, CLI_TIMEOUT)
}

/// Like [`redis_cli`], against a target (`&port`, the standalone, the cluster, `&cluster.nodes()`);
/// for the cluster or an address list it follows MOVED/ASK (`-c`).
pub fn cli<T: KeyTarget + ?Sized>(target: &T, args: &[&str]) -> String {
    let (port, follow_redirects) = target.entry();
    try_cli(port, follow_redirects, args, CLI_TIMEOUT).unwrap_or_else(|error| panic!("{error}"))
}

/// `redis-cli -c` against the cluster (a master), following MOVED/ASK; see [`redis_cli`].
pub fn redis_cli_cluster(cluster: &RedisCluster, args: &[&str]) -> String {
    cli(cluster, args)
}

/// The value of `field` in an `INFO` / `CLUSTER INFO` reply (`field:value` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end_matches('\r').split_once(':')?;
        (key == field).then_some(value)
    })
}

/// `redis-cli -e -h 127.0.0.1 -p PORT [-c] ARGS...`: stdout without its final newline,
/// or an error with stderr when it fails (connection, error reply) or times out.
pub(super) fn try_cli(
    port: u16,
    follow_redirects: bool,
    args: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let port_arg = port.to_string();
    let mut command = Command::new("redis-cli");
    command.args(["-e", "-h", HOST, "-p", &port_arg]);
    if follow_redirects {
        command.arg("-c");
    }
    command.args(args);
    let output = run(&mut command, timeout)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "redis-cli -p {port}{} {args:?} failed ({}): {}{stdout}",
            if follow_redirects { " -c" } else { "" },
            output.status,
            String::from_utf8_lossy(&output.stderr).trim_end(),
        ));
    }
    Ok(stdout.strip_suffix('\n').unwrap_or(&stdout).to_owned())
}

/// Runs `command` to completion with stdin closed, stdout and stderr captured; kills it
/// after `timeout`.
pub(super) fn run(command: &mut Command, timeout: Duration) -> Result<Output, String> {
    let description = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot run {description}: {error}"))?;
    let pid = child.id();
    let (done, outcome) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match outcome.recv_timeout(timeout) {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(error)) => Err(format!("{description}: {error}")),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            Err(format!("{description} did not finish within {timeout:?}"))
        }
    }
}

/// The hits a fixed-window counter's stored value holds (`GET` output; 0 when absent):
/// the value is hits * 2^VALUE_SHIFT + the window's start mod 2^20 (`lua/fixed_window.lua`).
pub fn fixed_window_count(stored: &str) -> u64 {
    stored.trim().parse::<u64>().unwrap_or(0) >> tollgate::algorithm::fixed_window::VALUE_SHIFT
}

/// `calls=` of `command` (as `INFO commandstats` names it: `fcall`, `script|load`) on
/// the server at `port`; 0 when never called.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let info = redis_cli(port, &["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Script calls a server served, by kind, read from `INFO commandstats`: every way a
/// script can run (`EVALSHA`, `EVAL`, `FCALL` and their read-only forms), so a test
/// that counts calls cannot miss one because the store switched how it sends them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScriptCalls {
    pub evalsha: u64,
    pub eval: u64,
    pub fcall: u64,
    /// `FCALL_RO`, `EVALSHA_RO` and `EVAL_RO`.
    pub read_only: u64,
}

impl ScriptCalls {
    /// Script calls of every kind.
    pub fn total(&self) -> u64 {
        self.evalsha + self.eval + self.fcall + self.read_only
    }
}

impl std::ops::Sub for ScriptCalls {
    type Output = ScriptCalls;
    fn sub(self, before: ScriptCalls) -> ScriptCalls {
        ScriptCalls {
            evalsha: self.evalsha - before.evalsha,
            eval: self.eval - before.eval,
            fcall: self.fcall - before.fcall,
            read_only: self.read_only - before.read_only,
        }
    }
}

/// [`ScriptCalls`] summed over the servers at `ports`.
pub fn script_calls(ports: &[u16]) -> ScriptCalls {
    let mut total = ScriptCalls::default();
    for &port in ports {
        let info = redis_cli(port, &["INFO", "commandstats"]);
        for line in info.lines() {
            let Some((name, stats)) = line.trim_end_matches('\r').split_once(':') else {
                continue;
            };
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            match name {
                "cmdstat_evalsha" => total.evalsha += calls,
                "cmdstat_eval" => total.eval += calls,
                "cmdstat_fcall" => total.fcall += calls,
                "cmdstat_fcall_ro" | "cmdstat_evalsha_ro" | "cmdstat_eval_ro" => {
                    total.read_only += calls
                }
                _ => {}
            }
        }
    }
    total
}
