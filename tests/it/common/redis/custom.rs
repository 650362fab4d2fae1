//! Servers a test owns alone, built from the harness's own parts: extra standalone
//! servers with any arguments (TLS ports, ACLs), a private standalone server for a
//! test that pauses it or reads server-wide counters (`CLIENT PAUSE`, `INFO
//! commandstats`), a private cluster that a destructive test may break without
//! disturbing the shared one, a Sentinel group
//! (a master, a replica, three sentinels), and killing a server by its port and
//! starting it again. All of
//! them are stopped when the test binary exits, like the shared servers.

use std::fs::{self, File};
use std::process::{Command, Stdio};
use std::sync::PoisonError;
use std::thread;
use std::time::{Duration, Instant};

use super::cluster_setup::start_cluster;
use super::commands::{info_field, try_cli};
use super::launch::{respawn, start_nodes};
use super::teardown::run_root;
use super::{HOST, POLL_INTERVAL, PROBE_TIMEOUT, RedisCluster, RedisStandalone};

/// One server started by [`start_servers`].
#[derive(Debug, Clone)]
pub struct Server {
    pub port: u16,
}

impl Server {
    pub fn addr(&self) -> String {
        format!("{HOST}:{}", self.port)
    }
}

/// `count` new `redis-server`s with `extra_args` appended (`--port` and `--bind` are
/// set), ready when this returns.
pub fn start_servers(kind: &str, count: usize, extra_args: &[&str]) -> Result<Vec<Server>, String> {
    Ok(start_nodes(kind, count, extra_args)?
        .into_iter()
        .map(|node| Server { port: node.port })
        .collect())
}

/// A new standalone server of the calling test's own, with the API of the shared one
/// ([`super::standalone()`]): for a test that pauses its server or counts its calls
/// server-wide, which the other tests on the shared server would disturb, or be
/// disturbed by.
pub fn private_standalone(kind: &str) -> Result<RedisStandalone, String> {
    let began = Instant::now();
    let mut nodes = start_nodes(kind, 1, &[])?;
    Ok(RedisStandalone {
        node: nodes.remove(0),
        startup: began.elapsed(),
    })
}

/// A new 3-master/3-replica cluster of this test binary's own (a few seconds).
pub fn private_cluster() -> Result<RedisCluster, String> {
    start_cluster()
}

/// A free loopback port (for ports a server opens besides its main one, e.g.
/// `--tls-port`).
pub use crate::common::ports::free_port;

/// The pid of the server answering on `port` (`INFO server`).
pub fn pid_of(port: u16) -> Result<u32, String> {
    let info = try_cli(port, false, &["INFO", "server"], PROBE_TIMEOUT)?;
    info_field(&info, "process_id")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("no process_id from port {port}"))
}

/// SIGKILLs the server on `port`: a crash, not a shutdown.
pub fn kill_server(port: u16) -> Result<(), String> {
    let pid = pid_of(port)?;
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| format!("kill: {e}"))?;
    if !status.success() {
        return Err(format!("kill -KILL {pid} failed: {status}"));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while try_cli(port, false, &["PING"], Duration::from_millis(500)).is_ok() {
        if Instant::now() >= deadline {
            return Err(format!("port {port} still answers after kill"));
        }
        thread::sleep(POLL_INTERVAL);
    }
    Ok(())
}

/// Starts the server [`kill_server`] killed on `port` again, with its directory and
/// arguments (a cluster node rejoins from its `nodes.conf`), empty of data; ready when
/// this returns.
pub fn restart_server(port: u16) -> Result<(), String> {
    respawn(port)
}

/// A master, one replica, and three sentinels watching them as `group`.
#[derive(Debug)]
pub struct SentinelGroup {
    pub group: String,
    pub master: Server,
    pub replica: Server,
    /// The sentinels' ports.
    pub sentinels: Vec<u16>,
}

impl SentinelGroup {
    /// envoyproxy/ratelimit's `REDIS_URL` form: `group,host:port,host:port,...`.
    pub fn url(&self) -> String {
        let mut parts = vec![self.group.clone()];
        parts.extend(self.sentinels.iter().map(|p| format!("{HOST}:{p}")));
        parts.join(",")
    }

    /// The master's address as the first sentinel that answers reports it.
    pub fn current_master(&self) -> Option<String> {
        self.sentinels.iter().find_map(|port| {
            let reply = try_cli(
                *port,
                false,
                &["SENTINEL", "get-master-addr-by-name", &self.group],
                PROBE_TIMEOUT,
            )
            .ok()?;
            let mut lines = reply.lines().map(str::trim).filter(|l| !l.is_empty());
            Some(format!("{}:{}", lines.next()?, lines.next()?))
        })
    }
}

/// Starts a Sentinel group: replication set up and in sync, and every sentinel
/// knowing the master, its replica and the other sentinels. `down_after_ms` is how
/// long the master may be silent before the sentinels fail over.
pub fn sentinel_group(group: &str, down_after_ms: u64) -> Result<SentinelGroup, String> {
    let mut data = start_servers("sentinel-data", 2, &[])?;
    let replica = data.pop().expect("two servers");
    let master = data.pop().expect("two servers");
    try_cli(
        replica.port,
        false,
        &["REPLICAOF", HOST, &master.port.to_string()],
        PROBE_TIMEOUT,
    )?;
    wait_for("the replica to sync", Duration::from_secs(20), || {
        let info = try_cli(replica.port, false, &["INFO", "replication"], PROBE_TIMEOUT)?;
        (info_field(&info, "master_link_status") == Some("up"))
            .then_some(())
            .ok_or_else(|| "link not up".to_owned())
    })?;
    let mut sentinels = Vec::new();
    for i in 0..3 {
        sentinels.push(spawn_sentinel(i, group, master.port, down_after_ms)?);
    }
    wait_for(
        "the sentinels to see each other",
        Duration::from_secs(30),
        || {
            for port in &sentinels {
                let reply = try_cli(*port, false, &["SENTINEL", "MASTER", group], PROBE_TIMEOUT)?;
                let fields: Vec<&str> = reply.lines().map(str::trim).collect();
                let field = |name: &str| {
                    fields
                        .iter()
                        .position(|f| *f == name)
                        .and_then(|i| fields.get(i + 1))
                        .copied()
                };
                if field("num-other-sentinels") != Some("2") || field("num-slaves") != Some("1") {
                    return Err(format!("sentinel {port}: {fields:?}"));
                }
            }
            Ok(())
        },
    )?;
    Ok(SentinelGroup {
        group: group.to_owned(),
        master,
        replica,
        sentinels,
    })
}

fn spawn_sentinel(
    index: usize,
    group: &str,
    master_port: u16,
    down_after_ms: u64,
) -> Result<u16, String> {
    let port = free_port();
    let dir = run_root().dir.join(format!("sentinel-{index}-{port}"));
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let conf = dir.join("sentinel.conf");
    fs::write(
        &conf,
        format!(
            "port {port}\nbind {HOST}\ndir {dir}\n\
             sentinel monitor {group} {HOST} {master_port} 2\n\
             sentinel down-after-milliseconds {group} {down_after_ms}\n\
             sentinel failover-timeout {group} 10000\n\
             sentinel parallel-syncs {group} 1\n",
            dir = dir.display()
        ),
    )
    .map_err(|e| format!("{}: {e}", conf.display()))?;
    let log = File::create(dir.join("redis.log")).map_err(|e| e.to_string())?;
    let log_err = log.try_clone().map_err(|e| e.to_string())?;
    // `redis-server --sentinel` (what the redis-sentinel package runs), so the
    // harness's watchdog, which looks for redis-server, also cleans sentinels up.
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("cannot start a sentinel: {e}"))?;
    fs::write(dir.join("pid"), child.id().to_string()).map_err(|e| e.to_string())?;
    run_root()
        .servers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(child);
    wait_for("a sentinel to answer", Duration::from_secs(10), || {
        try_cli(port, false, &["PING"], PROBE_TIMEOUT).map(|_| ())
    })?;
    Ok(port)
}

/// Polls `check` until it succeeds or `limit` passes (then its last error).
pub fn wait_for(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => {
                return Err(format!("waited {limit:?} for {what}: {why}"));
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    }
}
