//! Cross-request batching on a cluster, per hash slot: concurrent requests whose slot
//! groups fall in the same slot share one script call, as the segments of one EVALSHA
//! of `lua/batch.lua`, exactly as a standalone server's requests do (`batcher/`,
//! whose queue this reuses, one per slot: every key of a call must share its slot).
//! Segments run in queue order, each all or nothing on its own, so a shared call
//! answers as separate calls would, and the slot order of the cross-slot walk holds.
//! Calls for different slots of one master are pipelined on its one multiplexed
//! connection by redis-rs.
//!
//! A slot's queue is made on first use and kept: there are only [`SLOTS`] slots, so
//! the table is bounded by the protocol itself. (An earlier cap of 4096 queues,
//! cleared when full, defeated batching with the default hash tag, which spreads
//! counters over every slot: most calls then started a queue of their own.)

use std::sync::OnceLock;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;

use super::batcher::Batcher;
use super::scripts::{Reply, WireOp};
use crate::store::StoreError;

/// Hash slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

pub struct SlotBatchers {
    connection: ClusterConnection,
    /// The store's per-call budget, given to each queue.
    timeout: Duration,
    /// One queue per slot, indexed by slot. The table is 16384 empty cells up front
    /// (16 bytes each: 256 KiB); a queue in use adds its parked task and its channel's
    /// first block, about 3.4 KiB (measured: 16384 idle queues on one connection grew
    /// a debug build's RSS by 55 MiB). That worst case needs every slot in use, and
    /// an idle queue costs no CPU: its task sleeps on the channel.
    queues: Box<[OnceLock<Batcher>]>,
}

impl SlotBatchers {
    pub fn new(connection: ClusterConnection, timeout: Duration) -> Self {
        Self {
            connection,
            timeout,
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
        let queue = cell.get_or_init(|| Batcher::start(self.connection.clone(), self.timeout));
        queue.decide(keys, ops, dry_run).await
    }
}
