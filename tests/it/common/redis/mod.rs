//! Real `redis-server` processes for integration tests (README, "What scripts/test
//! does"): the entry
//! points [`standalone()`] and [`cluster()`], the handles they return, and re-exports of
//! the helpers the tests use.
//!
//! [`standalone()`] and [`cluster()`] start servers lazily, once per test binary, on
//! free loopback ports; every test of the binary shares them and isolates itself by key
//! prefix ([`unique_prefix`]), never by restarting Redis. A failed start is remembered,
//! so every test that asks afterwards fails fast with the same message.
//!
//! Layout: [`launch`] starts servers on free ports and waits for them to answer;
//! [`teardown`] owns the run directory, the watchdog and the `atexit` clean-up, so no
//! server outlives the test binary; [`cluster_setup`] creates the cluster and waits for
//! it to converge; [`topology`] parses `CLUSTER NODES`; [`commands`] runs `redis-cli`
//! (`std::process::Command`, no async runtime, every call with a timeout); [`keys`]
//! holds the key-level helpers and [`KeyTarget`].

mod cluster_setup;
mod commands;
pub mod custom;
mod keys;
mod launch;
mod teardown;
mod topology;

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

// The public helpers, reachable as `common::redis::NAME`.
pub use self::commands::{
    cli, command_calls, fixed_window_count, info_field, redis_cli, redis_cli_cluster, script_calls,
    try_redis_cli,
};
pub use self::keys::{KeyTarget, keyslot, pttl, scan_keys, unique_prefix};
pub use self::topology::{ClusterNode, cluster_nodes};

use self::launch::{Node, start_nodes};
use self::topology::try_cluster_nodes;

const HOST: &str = "127.0.0.1";
/// Readiness polling period.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Bound for one `redis-cli` probe while polling.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

static STANDALONE_LAUNCHES: AtomicUsize = AtomicUsize::new(0);
static CLUSTER_LAUNCHES: AtomicUsize = AtomicUsize::new(0);

/// The standalone server of this test binary, started on first use.
///
/// Panics (in every test that calls it) if the server could not be started.
pub fn standalone() -> &'static RedisStandalone {
    static STANDALONE: OnceLock<Result<RedisStandalone, String>> = OnceLock::new();
    let started = STANDALONE.get_or_init(|| {
        STANDALONE_LAUNCHES.fetch_add(1, Ordering::SeqCst);
        let began = Instant::now();
        let mut nodes = start_nodes("standalone", 1, &[])?;
        let server = RedisStandalone {
            node: nodes.remove(0),
            startup: began.elapsed(),
        };
        eprintln!(
            "redis harness: standalone on port {} ready in {:?}",
            server.port(),
            server.startup
        );
        Ok(server)
    });
    match started {
        Ok(server) => server,
        Err(message) => panic!("redis harness: standalone redis-server failed to start: {message}"),
    }
}

/// The 3-master / 3-replica cluster of this test binary, started on first use. When it
/// returns, every node reports `cluster_state:ok` with all 16384 slots assigned, every
/// node has the same view of the topology, and every replica is in sync with its master.
///
/// Panics (in every test that calls it) if the cluster could not be started.
pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    let started = CLUSTER.get_or_init(|| {
        CLUSTER_LAUNCHES.fetch_add(1, Ordering::SeqCst);
        cluster_setup::start_cluster()
    });
    match started {
        Ok(cluster) => cluster,
        Err(message) => panic!("redis harness: redis cluster failed to start: {message}"),
    }
}

/// How many times this process started (or tried to start) the standalone server: 0 or 1.
pub fn standalone_launches() -> usize {
    STANDALONE_LAUNCHES.load(Ordering::SeqCst)
}

/// How many times this process started (or tried to start) the cluster: 0 or 1.
pub fn cluster_launches() -> usize {
    CLUSTER_LAUNCHES.load(Ordering::SeqCst)
}

/// One standalone `redis-server`.
#[derive(Debug)]
pub struct RedisStandalone {
    node: Node,
    startup: Duration,
}

impl RedisStandalone {
    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        self.node.url()
    }

    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> String {
        self.node.addr()
    }

    pub fn pid(&self) -> u32 {
        self.node.pid
    }

    /// The server's working directory; its output is in `redis.log` there.
    pub fn dir(&self) -> &Path {
        &self.node.dir
    }

    /// Time from the start request to the server answering.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Runs `redis-cli` against this server; see [`redis_cli`].
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.node.port, args)
    }
}

/// Six cluster-enabled `redis-server`s: 3 masters with 1 replica each.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    masters: Vec<String>,
    replicas: Vec<String>,
    startup: Duration,
}

impl RedisCluster {
    /// All six nodes as `127.0.0.1:PORT`, in start order (masters and replicas mixed).
    pub fn nodes(&self) -> Vec<String> {
        self.nodes.iter().map(Node::addr).collect()
    }

    /// Seeds for a cluster client: all six nodes as `127.0.0.1:PORT` (same as
    /// [`Self::nodes`]); see [`Self::seed_urls`] for URLs.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes()
    }

    /// All six nodes as `redis://127.0.0.1:PORT/`.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Client ports of all six nodes, in the order of [`Self::nodes`].
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// The three masters as `127.0.0.1:PORT`, read from `CLUSTER NODES` once the cluster
    /// was ready, ordered by the first slot they serve. See [`Self::topology`] for the
    /// live view.
    pub fn masters(&self) -> Vec<String> {
        self.masters.clone()
    }

    /// The three replicas as `127.0.0.1:PORT`, in the order of their masters in
    /// [`Self::masters`].
    pub fn replicas(&self) -> Vec<String> {
        self.replicas.clone()
    }

    /// The live `CLUSTER NODES` view, asked of the first node that answers.
    pub fn topology(&self) -> Vec<ClusterNode> {
        let mut failures = Vec::new();
        for node in &self.nodes {
            match try_cluster_nodes(node.port) {
                Ok(view) => return view,
                Err(error) => failures.push(error),
            }
        }
        panic!(
            "no cluster node answered CLUSTER NODES:\n{}",
            failures.join("\n")
        );
    }

    /// The master currently serving `key`'s slot, as `127.0.0.1:PORT`.
    pub fn master_for_key(&self, key: &str) -> String {
        let slot = keyslot(self, key);
        self.topology()
            .into_iter()
            .find(|node| node.is_master() && node.owns_slot(slot))
            .map(|node| node.addr)
            .unwrap_or_else(|| panic!("no master serves slot {slot} (key {key:?})"))
    }

    /// Time from the start request to the cluster being ready (see [`cluster()`]).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Runs `redis-cli -c` (following MOVED/ASK) against a master; see [`redis_cli`].
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self, args)
    }
}
