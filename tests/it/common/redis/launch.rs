//! Launching `redis-server` processes: free loopback ports, one working directory per
//! server, and polling until every server of a start attempt answers (retrying with
//! fresh ports when a port was taken between probe and bind).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::PoisonError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::commands::{info_field, try_cli};
use super::teardown::run_root;
use super::{HOST, POLL_INTERVAL, PROBE_TIMEOUT};

/// Bound for every server of one start attempt to answer.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(20);
/// Start attempts with fresh ports when a port was taken between probe and bind.
const START_ATTEMPTS: usize = 5;
/// Log lines quoted in failure messages, per server.
const LOG_TAIL_LINES: usize = 30;
/// A server's output, in its directory.
const LOG_FILE: &str = "redis.log";

/// One started server.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) port: u16,
    pub(super) pid: u32,
    pub(super) dir: PathBuf,
}

impl Node {
    /// `127.0.0.1:PORT`
    pub(super) fn addr(&self) -> String {
        format!("{HOST}:{}", self.port)
    }

    /// `redis://127.0.0.1:PORT/`
    pub(super) fn url(&self) -> String {
        format!("redis://{HOST}:{}/", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_else(|error| {
            format!("(cannot read {}: {error})", self.log_path().display())
        });
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!(
            "--- last lines of {} (port {}, pid {}):\n{tail}",
            self.log_path().display(),
            self.port,
            self.pid
        )
    }
}

/// The last log lines of each of `nodes`, for a failure message.
pub(super) fn logs_of(nodes: &[&Node]) -> String {
    nodes
        .iter()
        .map(|node| node.log_tail())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts `count` servers in parallel and waits until all answer. Retries with fresh
/// ports when one was taken in the meantime. Non-empty `extra_args` mean cluster nodes,
/// which also need their bus ports free.
pub(super) fn start_nodes(
    kind: &str,
    count: usize,
    extra_args: &[&str],
) -> Result<Vec<Node>, String> {
    let with_bus_ports = !extra_args.is_empty();
    let mut last_failure = String::new();
    for _ in 0..START_ATTEMPTS {
        let ports = crate::common::ports::free_ports(count, with_bus_ports);
        let mut started = Vec::new();
        let mut failure = None;
        for port in ports {
            match spawn_node(kind, port, extra_args) {
                Ok(node) => started.push(node),
                Err(error) => {
                    failure = Some(StartFailure::Fatal(error));
                    break;
                }
            }
        }
        let result = match failure {
            Some(failure) => Err(failure),
            None => wait_ready(&mut started, Instant::now() + SERVER_START_TIMEOUT),
        };
        match result {
            Ok(()) => {
                let mut servers = run_root()
                    .servers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let nodes = started
                    .into_iter()
                    .map(|(child, node)| {
                        servers.push(child);
                        node
                    })
                    .collect();
                return Ok(nodes);
            }
            Err(StartFailure::PortTaken(message)) => {
                discard(started);
                last_failure = message;
            }
            Err(StartFailure::Fatal(message)) => {
                discard(started);
                return Err(message);
            }
        }
    }
    Err(format!(
        "could not start {count} {kind} redis-server(s) in {START_ATTEMPTS} attempts: \
         their ports kept being taken before redis-server bound them; last failure:\n\
         {last_failure}"
    ))
}

/// Spawns one `redis-server` on `port` in a new directory under the run root, output
/// to `redis.log` there, and records its pid for the watchdog.
fn spawn_node(kind: &str, port: u16, extra_args: &[&str]) -> Result<(Child, Node), String> {
    static SEQUENCE: AtomicUsize = AtomicUsize::new(0);
    let sequence = SEQUENCE.fetch_add(1, Ordering::SeqCst);
    let dir = run_root().dir.join(format!("{kind}-{sequence:02}-{port}"));
    fs::create_dir_all(&dir)
        .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    let log_path = dir.join(LOG_FILE);
    let log = File::create(&log_path)
        .map_err(|error| format!("cannot create {}: {error}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|error| format!("cannot clone {}: {error}", log_path.display()))?;
    // Kept beside the server, so that [`respawn`] starts it again exactly as it was.
    fs::write(dir.join(ARGS_FILE), extra_args.join("\n"))
        .map_err(|error| format!("cannot write {}/{ARGS_FILE}: {error}", dir.display()))?;
    let child = spawn_in(&dir, port, extra_args, log, log_err)?;
    let pid = child.id();
    Ok((child, Node { port, pid, dir }))
}

/// Where [`spawn_node`] keeps a server's extra arguments, one a line.
const ARGS_FILE: &str = "args";

/// `redis-server` on `port` in `dir` (its data, `nodes.conf` and pid file there) with
/// the harness's arguments and `extra_args`, output to `log`.
fn spawn_in(
    dir: &Path,
    port: u16,
    extra_args: &[&str],
    log: File,
    log_err: File,
) -> Result<Child, String> {
    let port_arg = port.to_string();
    let mut command = Command::new("redis-server");
    command
        .args(["--port", &port_arg, "--bind", HOST])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        // Replicas sync at once instead of after the default 5 s wait for more replicas.
        .args(["--repl-diskless-sync-delay", "0"])
        // Lets tests use DEBUG (e.g. DEBUG SLEEP) from loopback.
        .args(["--enable-debug-command", "local"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let mut child = command.spawn().map_err(|error| {
        format!("cannot run redis-server (not installed? run scripts/bootstrap): {error}")
    })?;
    if let Err(error) = fs::write(dir.join("pid"), child.id().to_string()) {
        kill_and_reap(&mut child);
        return Err(format!("cannot write {}/pid: {error}", dir.display()));
    }
    Ok(child)
}

/// Starts the server this run started on `port` again (after a kill), in its own
/// directory with its own arguments (a cluster node finds its `nodes.conf` there and
/// rejoins), and waits until it answers. Its data is gone: the harness keeps none.
pub(super) fn respawn(port: u16) -> Result<(), String> {
    let suffix = format!("-{port}");
    let root = &run_root().dir;
    let entries = fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let dir = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.join(ARGS_FILE).is_file())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.ends_with(&suffix))
        })
        .ok_or_else(|| format!("no server of this run was started on port {port}"))?;
    let args = fs::read_to_string(dir.join(ARGS_FILE)).map_err(|e| e.to_string())?;
    let args: Vec<&str> = args.lines().filter(|l| !l.is_empty()).collect();
    let log = File::options()
        .append(true)
        .open(dir.join(LOG_FILE))
        .map_err(|e| e.to_string())?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;
    let child = spawn_in(&dir, port, &args, log, log_err)?;
    let pid = child.id();
    let mut started = vec![(child, Node { port, pid, dir })];
    let ready = wait_ready(&mut started, Instant::now() + SERVER_START_TIMEOUT);
    let (child, node) = started.pop().expect("one server");
    run_root()
        .servers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(child);
    ready.map_err(|failure| match failure {
        StartFailure::PortTaken(message) | StartFailure::Fatal(message) => {
            format!("restarting port {}: {message}", node.port)
        }
    })
}

/// Kills servers of a failed attempt and removes their directories.
fn discard(started: Vec<(Child, Node)>) {
    for (mut child, node) in started {
        kill_and_reap(&mut child);
        let _ = fs::remove_dir_all(&node.dir);
    }
}

fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

enum StartFailure {
    /// A port was taken between the probe and the server's bind: retry with new ports.
    PortTaken(String),
    Fatal(String),
}

/// Polls until every server answers `INFO server` with its own pid (so a foreign
/// process on the port is not mistaken for it), or one exits, or the deadline passes.
fn wait_ready(started: &mut [(Child, Node)], deadline: Instant) -> Result<(), StartFailure> {
    let mut ready = vec![false; started.len()];
    loop {
        for (i, (child, node)) in started.iter_mut().enumerate() {
            if ready[i] {
                continue;
            }
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    let tail = node.log_tail();
                    let message = format!(
                        "redis-server on port {} exited during startup ({status})\n{tail}",
                        node.port
                    );
                    return Err(if tail.contains("Address already in use") {
                        StartFailure::PortTaken(message)
                    } else {
                        StartFailure::Fatal(message)
                    });
                }
                Err(error) => {
                    return Err(StartFailure::Fatal(format!(
                        "cannot check redis-server pid {}: {error}",
                        node.pid
                    )));
                }
            }
            if let Ok(info) = try_cli(node.port, false, &["INFO", "server"], PROBE_TIMEOUT) {
                ready[i] = info_field(&info, "process_id") == Some(node.pid.to_string().as_str());
            }
        }
        if ready.iter().all(|&r| r) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let late: Vec<&Node> = started
                .iter()
                .zip(&ready)
                .filter(|(_, ready)| !**ready)
                .map(|((_, node), _)| node)
                .collect();
            return Err(StartFailure::Fatal(format!(
                "redis-server did not answer within {SERVER_START_TIMEOUT:?}\n{}",
                logs_of(&late)
            )));
        }
        thread::sleep(POLL_INTERVAL);
    }
}
