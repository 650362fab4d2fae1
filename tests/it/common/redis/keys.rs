//! Key-level helpers: [`KeyTarget`] (where a key command goes and which servers hold
//! keys), per-test key prefixes, and key inspection (`SCAN`, `PTTL`, `CLUSTER KEYSLOT`).

use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::commands::{cli, redis_cli};
use super::topology::{port_of, serving_master_ports, try_cluster_nodes};
use super::{RedisCluster, RedisStandalone};

/// What key-level helpers ([`cli`], [`scan_keys`], [`pttl`]) can talk to: a port, the
/// [`RedisStandalone`], the [`RedisCluster`], a list of node addresses (and references
/// to them).
pub trait KeyTarget {
    /// The port to send a key command to, and whether to follow cluster redirections.
    fn entry(&self) -> (u16, bool);
    /// The ports of the servers that hold keys: the server itself, or the cluster's
    /// current masters.
    fn key_ports(&self) -> Vec<u16>;
}

impl KeyTarget for u16 {
    fn entry(&self) -> (u16, bool) {
        (*self, false)
    }

    fn key_ports(&self) -> Vec<u16> {
        vec![*self]
    }
}

impl KeyTarget for RedisStandalone {
    fn entry(&self) -> (u16, bool) {
        self.node.port.entry()
    }

    fn key_ports(&self) -> Vec<u16> {
        self.node.port.key_ports()
    }
}

impl KeyTarget for RedisCluster {
    fn entry(&self) -> (u16, bool) {
        let master = self.masters.first().expect("a cluster has masters");
        (port_of(master), true)
    }

    fn key_ports(&self) -> Vec<u16> {
        serving_master_ports(&self.topology())
    }
}

impl<T: KeyTarget + ?Sized> KeyTarget for &T {
    fn entry(&self) -> (u16, bool) {
        (**self).entry()
    }

    fn key_ports(&self) -> Vec<u16> {
        (**self).key_ports()
    }
}

/// A list of `127.0.0.1:PORT` addresses, e.g. [`RedisCluster::nodes`]: commands go to
/// the first with `-c`; keys are on the masters the first answering node reports in
/// `CLUSTER NODES`, or, for servers without cluster support, on all of them.
impl KeyTarget for [String] {
    fn entry(&self) -> (u16, bool) {
        let first = self.first().expect("an empty address list");
        (port_of(first), true)
    }

    fn key_ports(&self) -> Vec<u16> {
        let ports: Vec<u16> = self.iter().map(|addr| port_of(addr)).collect();
        for &port in &ports {
            match try_cluster_nodes(port) {
                Ok(view) => return serving_master_ports(&view),
                Err(error) if error.contains("cluster support disabled") => return ports,
                Err(_) => {} // that node is down: ask the next one
            }
        }
        ports
    }
}

impl KeyTarget for Vec<String> {
    fn entry(&self) -> (u16, bool) {
        self.as_slice().entry()
    }

    fn key_ports(&self) -> Vec<u16> {
        self.as_slice().key_ports()
    }
}

/// `CLUSTER KEYSLOT key`, asked of the real cluster.
pub fn keyslot(cluster: &RedisCluster, key: &str) -> u16 {
    let (port, _) = cluster.entry();
    let reply = redis_cli(port, &["CLUSTER", "KEYSLOT", key]);
    parse_reply(&reply, || format!("CLUSTER KEYSLOT {key:?}"))
}

/// A key prefix unique to this test and this run: `NAME:PID.RUN.N:` where RUN is the
/// process start time in ms and N a per-process counter. Characters of `test_name` that
/// are glob-special or would form a cluster hash tag (`{}*?[]\`, whitespace) become `_`,
/// so `{prefix}*` is a safe SCAN pattern and a `{tag}` after the prefix decides the slot.
pub fn unique_prefix(test_name: &str) -> String {
    static RUN: LazyLock<u128> = LazyLock::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis())
            .unwrap_or(0)
    });
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name: String = test_name
        .chars()
        .map(|c| {
            if c.is_whitespace() || "{}*?[]\\".contains(c) {
                '_'
            } else {
                c
            }
        })
        .collect();
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    format!("{name}:{}.{}.{n}:", std::process::id(), *RUN)
}

/// Keys matching `pattern` (SCAN glob syntax), sorted: on the server, or on every
/// current master of the cluster.
pub fn scan_keys<T: KeyTarget + ?Sized>(target: &T, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for port in target.key_ports() {
        let out = redis_cli(port, &["--scan", "--pattern", pattern]);
        keys.extend(out.lines().filter(|l| !l.is_empty()).map(str::to_owned));
    }
    keys.sort();
    keys.dedup();
    keys
}

/// `PTTL key`: milliseconds left, -1 without expiry, -2 when missing.
pub fn pttl<T: KeyTarget + ?Sized>(target: &T, key: &str) -> i64 {
    let reply = cli(target, &["PTTL", key]);
    parse_reply(&reply, || format!("PTTL {key:?}"))
}

/// An integer reply, trimmed and parsed; panics with `"{request} replied {reply:?}"`.
fn parse_reply<N: FromStr>(reply: &str, request: impl FnOnce() -> String) -> N {
    reply
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{} replied {reply:?}", request()))
}
