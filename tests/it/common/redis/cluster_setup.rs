//! Creating the 3-master / 3-replica cluster (`redis-cli --cluster create`) and waiting
//! until it has converged: state ok, all slots served, one shared healthy topology, and
//! every replica in sync.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::commands::{info_field, run, try_cli};
use super::launch::{Node, logs_of, start_nodes};
use super::topology::{ClusterNode, try_cluster_nodes};
use super::{HOST, POLL_INTERVAL, PROBE_TIMEOUT, RedisCluster};

/// Bound for `redis-cli --cluster create`.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound for the cluster to converge after creation (state ok, replicas in sync).
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const CLUSTER_SIZE: usize = 6;
const CLUSTER_MASTERS: usize = 3;
const CLUSTER_SLOTS: u32 = 16384;

const CLUSTER_NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
];

/// Starts six cluster-enabled servers, creates the cluster, and waits until it is ready
/// (see [`super::cluster()`]).
pub(super) fn start_cluster() -> Result<RedisCluster, String> {
    let began = Instant::now();
    let nodes = start_nodes("cluster", CLUSTER_SIZE, CLUSTER_NODE_ARGS)?;
    let servers_up = began.elapsed();
    let all: Vec<&Node> = nodes.iter().collect();

    let mut create = Command::new("redis-cli");
    create.args(["--cluster", "create"]);
    create.args(nodes.iter().map(Node::addr));
    create.args(["--cluster-replicas", "1", "--cluster-yes"]);
    let output = run(&mut create, CLUSTER_CREATE_TIMEOUT)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !stdout.contains("All 16384 slots covered") {
        return Err(format!(
            "redis-cli --cluster create failed ({}):\n{stdout}\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            logs_of(&all)
        ));
    }
    let created = began.elapsed();

    let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
    let view = loop {
        match cluster_converged(&nodes) {
            Ok(view) => break view,
            Err(why) if Instant::now() >= deadline => {
                return Err(format!(
                    "the cluster did not become ready within {CLUSTER_READY_TIMEOUT:?}: {why}\n{}",
                    logs_of(&all)
                ));
            }
            Err(_) => thread::sleep(POLL_INTERVAL),
        }
    };
    let startup = began.elapsed();

    let mut masters: Vec<&ClusterNode> = view.iter().filter(|node| node.is_master()).collect();
    masters.sort_by_key(|node| node.slots.iter().map(|range| *range.start()).min());
    let replicas = masters
        .iter()
        .map(|master| {
            view.iter()
                .find(|node| node.is_replica_of(master))
                .map(|replica| replica.addr.clone())
                .expect("convergence checked one replica per master")
        })
        .collect();
    let cluster = RedisCluster {
        masters: masters.iter().map(|node| node.addr.clone()).collect(),
        replicas,
        nodes,
        startup,
    };
    eprintln!(
        "redis harness: cluster {:?} ready in {startup:?} (servers up {servers_up:?}, \
         created {created:?}); masters {:?}",
        cluster.ports(),
        cluster.masters
    );
    Ok(cluster)
}

/// `Ok(topology)` when every node reports `cluster_state:ok` with all slots assigned,
/// all nodes share one healthy 3-master/3-replica view, and every replica is in sync.
/// Otherwise the first reason found.
fn cluster_converged(nodes: &[Node]) -> Result<Vec<ClusterNode>, String> {
    for node in nodes {
        let info = try_cli(node.port, false, &["CLUSTER", "INFO"], PROBE_TIMEOUT)?;
        for (field, expected) in [
            ("cluster_state", "ok".to_owned()),
            ("cluster_slots_assigned", CLUSTER_SLOTS.to_string()),
            ("cluster_known_nodes", CLUSTER_SIZE.to_string()),
            ("cluster_size", CLUSTER_MASTERS.to_string()),
        ] {
            let value = info_field(&info, field);
            if value != Some(expected.as_str()) {
                return Err(format!("{}: {field} is {value:?}", node.addr()));
            }
        }
    }

    /// Per node: (id, is master, master id).
    type Roles = Vec<(String, bool, Option<String>)>;
    let mut reference: Option<(u16, Roles)> = None;
    let mut topology = Vec::new();
    for node in nodes {
        let view = try_cluster_nodes(node.port)?;
        check_topology(&view).map_err(|why| format!("{} sees {why}", node.addr()))?;
        let mut summary: Roles = view
            .iter()
            .map(|entry| (entry.id.clone(), entry.is_master(), entry.master_id.clone()))
            .collect();
        summary.sort();
        match &reference {
            None => reference = Some((node.port, summary)),
            Some((port, expected)) if *expected != summary => {
                return Err(format!(
                    "{} and {HOST}:{port} disagree on the topology",
                    node.addr()
                ));
            }
            Some(_) => {}
        }
        topology = view;
    }

    for node in nodes {
        let info = try_cli(node.port, false, &["INFO", "replication"], PROBE_TIMEOUT)?;
        match info_field(&info, "role") {
            Some("master") => {
                let connected = info_field(&info, "connected_slaves");
                let online =
                    info_field(&info, "slave0").is_some_and(|s| s.contains("state=online"));
                if connected != Some("1") || !online {
                    return Err(format!(
                        "master {}: connected_slaves {connected:?}, slave0 {:?}",
                        node.addr(),
                        info_field(&info, "slave0")
                    ));
                }
            }
            Some("slave") => {
                let link = info_field(&info, "master_link_status");
                let syncing = info_field(&info, "master_sync_in_progress");
                if link != Some("up") || syncing != Some("0") {
                    return Err(format!(
                        "replica {}: master_link_status {link:?}, master_sync_in_progress {syncing:?}",
                        node.addr()
                    ));
                }
            }
            role => return Err(format!("{}: role {role:?}", node.addr())),
        }
    }
    Ok(topology)
}

/// 3 masters serving all slots, each with exactly one replica, all links up, no node
/// failing or in handshake.
fn check_topology(view: &[ClusterNode]) -> Result<(), String> {
    if view.len() != CLUSTER_SIZE {
        return Err(format!("{} nodes", view.len()));
    }
    for node in view {
        if let Some(flag) = node
            .flags
            .iter()
            .find(|flag| ["fail", "fail?", "handshake", "noaddr"].contains(&flag.as_str()))
        {
            return Err(format!("{} flagged {flag}", node.addr));
        }
        if !node.connected {
            return Err(format!("{} disconnected", node.addr));
        }
    }
    let masters: Vec<&ClusterNode> = view.iter().filter(|node| node.is_master()).collect();
    if masters.len() != CLUSTER_MASTERS {
        return Err(format!("{} masters", masters.len()));
    }
    let slots: u32 = masters.iter().map(|master| master.slot_count()).sum();
    if slots != CLUSTER_SLOTS {
        return Err(format!("{slots} slots served"));
    }
    for master in &masters {
        let replicas = view
            .iter()
            .filter(|node| node.is_replica() && node.is_replica_of(master))
            .count();
        if replicas != 1 {
            return Err(format!("{replicas} replicas of {}", master.addr));
        }
    }
    Ok(())
}
