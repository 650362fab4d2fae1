//! Cross-request batching on a cluster, per master and per hash slot: concurrent
//! requests whose groups fall on the same master (or, decided by slot, in the same
//! slot) share one script call, as the segments of one EVALSHA of `lua/batch.lua`,
//! exactly as a standalone server's requests do (`batcher/`, whose queue this reuses).
//! Segments run in queue order, each all or nothing on its own, so a shared call
//! answers as separate calls would, and the order of the cross-slot walk holds.
//!
//! A master's queue sends the any-slot script ([`Layout::AnySlot`]) to the master's
//! address, on redis-rs' connection to that node: no key is declared, so nothing
//! redirects it, and a key the node does not serve fails the call
//! (`misroute.rs`). There are as many master queues as masters; a topology that
//! keeps changing could name new ones forever, so past [`MAX_MASTERS`] the table is
//! emptied and refilled by the calls that follow.
//!
//! A slot's queue is made on first use and kept: there are only [`SLOTS`] slots, so
//! the table is bounded by the protocol itself. (A smaller cap, cleared when full,
//! would defeat batching with the default hash tag, which spreads counters over every
//! slot: most calls would start a queue of their own.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::batcher::Batcher;
use super::connect::describe;
use super::scripts::{Engine, Layout, Reply, WireOp};
use crate::store::StoreError;

/// Master queues kept at most (see the module docs).
pub const MAX_MASTERS: usize = 256;

/// Hash slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

/// Bound on readiness's `CLUSTER INFO` to one master.
const STATE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct SlotBatchers {
    connection: ClusterConnection,
    /// The store's per-call budget, given to each queue.
    timeout: Duration,
    functions: Engine,
    /// One queue per slot, indexed by slot. The table is 16384 empty cells up front
    /// (16 bytes each: 256 KiB); a queue in use adds its parked task and its channel's
    /// first block, a few KiB. That worst case needs every slot in use, and
    /// an idle queue costs no CPU: its task sleeps on the channel.
    queues: Box<[OnceLock<Batcher>]>,
}

impl SlotBatchers {
    pub fn new(connection: ClusterConnection, timeout: Duration, functions: Engine) -> Self {
        Self {
            connection,
            timeout,
            functions,
            queues: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Decides one slot group (`keys` all in `slot`), sharing the call with whatever
    /// else is queued for that slot.
    pub async fn decide(
        &self,
        slot: u16,
        keys: Vec<String>,
        ops: Vec<WireOp>,
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        // A slot number past the table cannot come from `slot_of` (it is taken
        // modulo 16384); refused rather than trusted.
        let cell = self
            .queues
            .get(usize::from(slot))
            .ok_or_else(|| StoreError::Unavailable(format!("no hash slot {slot}")))?;
        let queue = cell.get_or_init(|| {
            Batcher::start(
                self.connection.clone(),
                self.timeout,
                self.functions.clone(),
            )
        });
        queue.decide(keys, ops, dry_run).await
    }
}

/// One queue per master, by its `host:port`, made on first use.
pub struct MasterBatchers {
    connection: ClusterConnection,
    timeout: Duration,
    functions: Engine,
    queues: Mutex<HashMap<Arc<str>, Arc<Batcher>>>,
}

impl MasterBatchers {
    pub fn new(connection: ClusterConnection, timeout: Duration, functions: Engine) -> Self {
        Self {
            connection,
            timeout,
            functions,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Decides one group (`keys` all on `master`, by the slot map), sharing the call
    /// with whatever else is queued for that master.
    pub async fn decide(
        &self,
        master: &Arc<str>,
        keys: Vec<String>,
        ops: Vec<WireOp>,
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        let queue = self.queue(master)?;
        queue.decide(keys, ops, dry_run).await
    }

    /// For readiness: whether `master` would decide a group sent to it now, asked on
    /// the connection its queue's calls take: it answers a PING (a dead connection is
    /// replaced and asked again, [`Batcher::check`]) and says `cluster_state:ok`. A
    /// node restarted with its cluster answers PING before the nodes agree again, and
    /// refuses every key with CLUSTERDOWN until they do.
    pub async fn check(&self, master: &Arc<str>) -> Result<(), StoreError> {
        self.queue(master)?.check().await?;
        let mut node = AtNode::new(self.connection.clone(), master)?;
        let info = redis::cmd("CLUSTER").arg("INFO").clone();
        let asked = tokio::time::timeout(STATE_TIMEOUT, info.query_async::<String>(&mut node));
        match asked.await {
            Ok(Ok(info)) if info.lines().any(|line| line.trim() == "cluster_state:ok") => Ok(()),
            Ok(Ok(_)) => Err(StoreError::Unavailable(format!(
                "{master}: cluster_state is not ok (keys are refused with CLUSTERDOWN)"
            ))),
            Ok(Err(e)) => Err(StoreError::Unavailable(format!(
                "{master}: {}",
                describe(&e)
            ))),
            Err(_) => Err(StoreError::Timeout(STATE_TIMEOUT)),
        }
    }

    fn queue(&self, master: &Arc<str>) -> Result<Arc<Batcher>, StoreError> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(master) {
            return Ok(Arc::clone(queue));
        }
        let node = AtNode::new(self.connection.clone(), master)?;
        if queues.len() >= MAX_MASTERS {
            // The queues dropped finish the calls they have in flight.
            queues.clear();
        }
        let queue = Arc::new(Batcher::start_in(
            Layout::AnySlot,
            node,
            self.timeout,
            self.functions.clone(),
        ));
        queues.insert(Arc::clone(master), Arc::clone(&queue));
        Ok(queue)
    }
}

/// The cluster connection, every command sent to one node by address.
#[derive(Clone)]
struct AtNode {
    connection: ClusterConnection,
    route: RoutingInfo,
}

impl AtNode {
    fn new(connection: ClusterConnection, address: &str) -> Result<Self, StoreError> {
        let bad = || StoreError::Unavailable(format!("a master with no port: {address}"));
        let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse().map_err(|_| bad())?;
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        });
        Ok(Self { connection, route })
    }
}

impl ConnectionLike for AtNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(
            self.connection
                .route_command(cmd.clone(), self.route.clone()),
        )
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // Not used by the batcher; sent as the cluster connection sends a pipeline.
        self.connection.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}
