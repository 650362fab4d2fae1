//! Readiness on the connections requests take: a node counts as answering only when
//! it answers the probe on a connection of its own and also on the connection its
//! requests are sent on (the batcher's; on a cluster, the cluster connection routed
//! to that master). The probe's own connection says whether Redis is there; only the
//! data connection says whether a request would reach it: after a restart in a quiet
//! moment that connection was dead while the probe's had reconnected, and health said
//! SERVING while the first requests met a broken pipe and fell to the failure mode.

use super::batcher::Batcher;
use crate::store::{NodePing, StoreError};

/// `pings` (the standalone server or Sentinel master, on the probe's connection),
/// failed where the batcher's connection does not answer.
pub(super) async fn standalone(batcher: &Batcher, mut pings: Vec<NodePing>) -> Vec<NodePing> {
    if let Err(error) = batcher.check().await {
        for ping in &mut pings {
            if ping.result.is_ok() {
                ping.result = Err(on_path(error.clone()));
            }
        }
    }
    pings
}

/// `error`, met on the connection requests take, in words that say so.
pub(super) fn on_path(error: StoreError) -> StoreError {
    match error {
        StoreError::Unavailable(why) => {
            StoreError::Unavailable(format!("on the connection requests take: {why}"))
        }
        other => other,
    }
}
