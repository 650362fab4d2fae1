//! Cluster topology as `CLUSTER NODES` reports it: [`ClusterNode`], the parser, and
//! the `127.0.0.1:PORT` address helpers.

use std::ops::RangeInclusive;

use super::commands::try_cli;
use super::{HOST, PROBE_TIMEOUT};

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    /// `127.0.0.1:PORT` (the `@busport` and hostname parts removed).
    pub addr: String,
    /// e.g. `["myself", "master"]`, `["slave"]`, `["master", "fail?"]`.
    pub flags: Vec<String>,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// `link-state` is `connected`.
    pub connected: bool,
    /// Slot ranges served (migration markers `[slot->-id]` are left out).
    pub slots: Vec<RangeInclusive<u16>>,
}

impl ClusterNode {
    pub fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    pub fn is_replica(&self) -> bool {
        self.has_flag("slave")
    }

    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub fn port(&self) -> u16 {
        port_of(&self.addr)
    }

    pub fn owns_slot(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    pub fn slot_count(&self) -> u32 {
        self.slots
            .iter()
            .map(|range| u32::from(*range.end()) - u32::from(*range.start()) + 1)
            .sum()
    }

    /// Whether this node names `master` as its master.
    pub(super) fn is_replica_of(&self, master: &ClusterNode) -> bool {
        self.master_id.as_deref() == Some(master.id.as_str())
    }
}

/// `CLUSTER NODES` of the node on `port`, parsed. Panics when it fails.
pub fn cluster_nodes(port: u16) -> Vec<ClusterNode> {
    try_cluster_nodes(port).unwrap_or_else(|error| panic!("{error}"))
}

/// `CLUSTER NODES` of the node on `port`, parsed, or why it could not be had.
pub(super) fn try_cluster_nodes(port: u16) -> Result<Vec<ClusterNode>, String> {
    let reply = try_cli(port, false, &["CLUSTER", "NODES"], PROBE_TIMEOUT)?;
    reply
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            parse_cluster_node(line)
                .ok_or_else(|| format!("{HOST}:{port}: bad CLUSTER NODES line {line:?}"))
        })
        .collect()
}

/// The ports of the masters in `view` that serve slots: the nodes that hold keys.
pub(super) fn serving_master_ports(view: &[ClusterNode]) -> Vec<u16> {
    view.iter()
        .filter(|node| node.is_master() && !node.slots.is_empty())
        .map(ClusterNode::port)
        .collect()
}

/// The port of a `HOST:PORT` address. Panics when there is none.
pub(super) fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in address {addr:?}"))
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
fn parse_cluster_node(line: &str) -> Option<ClusterNode> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let mut slots = Vec::new();
    for slot in &fields[8..] {
        if slot.starts_with('[') {
            continue;
        }
        let range = match slot.split_once('-') {
            Some((start, end)) => start.parse().ok()?..=end.parse().ok()?,
            None => {
                let single = slot.parse().ok()?;
                single..=single
            }
        };
        slots.push(range);
    }
    Some(ClusterNode {
        id: fields[0].to_owned(),
        addr: fields[1].split('@').next()?.to_owned(),
        flags: fields[2].split(',').map(str::to_owned).collect(),
        master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        connected: fields[7] == "connected",
        slots,
    })
}
