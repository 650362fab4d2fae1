//! The single group: a request whose counters all live on one master (or, decided
//! by slot, in one slot) is one call, consuming or a dry run.
//!
//! Why this is the common case worth its own line: grouping by master
//! (`cluster/route.rs`) puts every slot one master serves in one any-slot call, so
//! with `hash_tag` (a tenant's counters in one slot), or on a cluster of one master,
//! a request never needs more than this.

use super::super::{Cluster, Group};
use crate::algorithm::Decision;
use crate::store::{CounterOp, StoreError};

/// The single group: the request's one group decided by one segment of its master's
/// (or slot's) shared call.
///
/// Invariant: all or nothing, with nothing to order or refund. The segment checks
/// every counter of the group and then consumes all or none, in one script run that
/// Redis runs alone on the shard; the other requests sharing the call are segments of
/// their own, each all or nothing, in queue order, so a shared call answers as the
/// same calls one after another would (`lua/segment.lua`). A dry run's segment
/// writes nothing.
pub(super) struct Single<'c>(pub(super) &'c Cluster);

impl Single<'_> {
    /// `ops` (keys `keys`), all in `group`, by `deadline`.
    pub(super) async fn decide(
        self,
        keys: &[String],
        ops: &[CounterOp],
        group: &Group,
        dry_run: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let replies = self
            .0
            .group_call(keys, ops, group, dry_run, deadline)
            .await?;
        Ok(replies.into_iter().map(|r| r.decision).collect())
    }
}
