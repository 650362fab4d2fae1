//! Cross-request batching on a cluster, per hash slot: concurrent requests whose slot
//! groups fall in the same slot share one script call, as the segments of one EVALSHA
//! of `lua/batch.lua`, exactly as a standalone server's requests do (`batcher.rs`,
//! whose queue this reuses, one per slot: every key of a call must share its slot).
//! Segments run in queue order, each all or nothing on its own, so a shared call
//! answers as separate calls would, and the slot order of the cross-slot walk holds.
//! Calls for different slots of one master are pipelined on its one multiplexed
//! connection by redis-rs.
//!
//! The queues are made on first use. A busy cluster may touch thousands of slots, so
//! their number is bounded ([`MAX_QUEUES`]): past it the set starts afresh. A queue
//! dropped that way still sends what it holds, then its task ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;

use super::batcher::Batcher;
use super::scripts::{Reply, WireOp};
use crate::store::StoreError;

/// Slot queues kept at most (each an idle task and a channel when unused).
pub const MAX_QUEUES: usize = 4096;

pub struct SlotBatchers {
    connection: ClusterConnection,
    /// The store's per-call budget, given to each queue.
    timeout: Duration,
    queues: Mutex<HashMap<u16, Arc<Batcher>>>,
}

impl SlotBatchers {
    pub fn new(connection: ClusterConnection, timeout: Duration) -> Self {
        Self {
            connection,
            timeout,
            queues: Mutex::new(HashMap::new()),
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
        let queue = self.queue(slot);
        queue.decide(keys, ops, dry_run).await
    }

    fn queue(&self, slot: u16) -> Arc<Batcher> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(&slot) {
            return queue.clone();
        }
        if queues.len() >= MAX_QUEUES {
            queues.clear();
        }
        let queue = Arc::new(Batcher::start(self.connection.clone(), self.timeout));
        queues.insert(slot, queue.clone());
        queue
    }
}
