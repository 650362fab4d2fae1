//! The Redis Cluster path. A request's counter operations are grouped by hash slot,
//! each group is decided by one atomic batch-script call (groups run concurrently,
//! one round trip per shard), and when any group denies the request the groups that
//! did consume are refunded, so a denied request consumes nothing.

use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;

use super::connect::describe;
use super::scripts::{self, Refund, Reply, Segment, WireOp};
use crate::algorithm::Decision;
use crate::store::{CounterOp, StoreError};

/// A cluster connection (redis-rs follows MOVED/ASK and retries TRYAGAIN).
pub struct Cluster {
    connection: ClusterConnection,
}

impl Cluster {
    pub fn new(connection: ClusterConnection) -> Self {
        Self { connection }
    }

    /// Decides `ops` (whose encoded keys are `keys`), all or nothing across slots.
    pub async fn decide(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let groups = group_by_slot(keys.iter().map(String::as_str));
        let results = join_all(
            groups
                .iter()
                .map(|indices| self.run_group(keys, ops, indices, dry_run)),
        )
        .await;

        // Which groups wrote: a group commits unless one of its vetoing ops was denied.
        let mut replies: Vec<Option<Reply>> = vec![None; ops.len()];
        let mut failure = None;
        let mut vetoed = false;
        let mut committed = Vec::new();
        for (indices, result) in groups.iter().zip(results) {
            match result {
                Ok(group_replies) => {
                    let group_vetoed = dry_run
                        || indices
                            .iter()
                            .zip(&group_replies)
                            .any(|(&i, r)| ops[i].vetoes && !r.decision.allowed);
                    vetoed |= group_vetoed;
                    if !group_vetoed {
                        committed.push(indices);
                    }
                    for (&i, reply) in indices.iter().zip(group_replies) {
                        replies[i] = Some(reply);
                    }
                }
                Err(e) => failure = Some(e),
            }
        }

        if vetoed || failure.is_some() {
            // Give back what the committed groups consumed: the request is not admitted.
            // A committed group is one slot, so its refunds are one refund call.
            let refunds: Vec<Vec<Refund>> = committed
                .iter()
                .map(|indices| {
                    indices
                        .iter()
                        .filter(|&&i| {
                            ops[i].cost > 0 && replies[i].is_some_and(|r| r.decision.allowed)
                        })
                        .map(|&i| Refund {
                            key: keys[i].clone(),
                            op: WireOp::new(&ops[i]),
                            token: replies[i].map_or(0, |r| r.token),
                        })
                        .collect()
                })
                .collect();
            self.refund(&refunds).await;
            for &i in committed.iter().flat_map(|indices| indices.iter()) {
                if let Some(reply) = replies[i].as_mut().filter(|r| r.decision.allowed) {
                    reply.decision.remaining = reply
                        .decision
                        .remaining
                        .saturating_add(ops[i].cost)
                        .min(ops[i].params.limit.max(ops[i].params.burst));
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(replies
            .into_iter()
            .map(|r| r.expect("every group replied").decision)
            .collect())
    }

    /// One batch script call for the operations `indices` of `ops` (one slot).
    async fn run_group(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        indices: &[usize],
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        let group_keys: Vec<&str> = indices.iter().map(|&i| keys[i].as_str()).collect();
        let group_ops: Vec<WireOp> = indices.iter().map(|&i| WireOp::new(&ops[i])).collect();
        let cmd = scripts::batch_cmd(
            &[Segment {
                keys: &group_keys,
                ops: &group_ops,
                dry_run,
            }],
            None,
        );
        let values: Vec<i64> =
            scripts::evalsha(&mut self.connection.clone(), &cmd, &scripts::BATCH)
                .await
                .map_err(|e| StoreError::Unavailable(describe(&e)))?;
        scripts::parse_batch_reply(&values, indices.len()).map_err(StoreError::Unavailable)
    }

    /// One refund call per slot group, concurrently. Best effort: a refund that fails
    /// leaves a counter briefly high (under-admission), which is the safe direction;
    /// it is logged, not returned.
    async fn refund(&self, groups: &[Vec<Refund>]) {
        let results =
            join_all(
                groups.iter().filter(|g| !g.is_empty()).map(|group| {
                    let refs: Vec<&Refund> = group.iter().collect();
                    let cmd = scripts::refund_cmd(&refs);
                    let mut connection = self.connection.clone();
                    async move {
                        scripts::evalsha::<_, i64>(&mut connection, &cmd, &scripts::REFUND).await
                    }
                }),
            )
            .await;
        for result in results {
            if let Err(e) = result {
                tracing::warn!(error = %describe(&e), "refund failed; a counter stays high until its window ends");
            }
        }
    }
}

/// Indices of `keys` grouped by hash slot, groups in first-seen order and request order
/// within each group (so duplicate counters are decided in request order).
fn group_by_slot<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_hash_tag_in_first_seen_then_request_order() {
        let keys = ["a{x}", "b{y}", "c{x}", "a{x}", "d{z}"];
        assert_eq!(group_by_slot(keys), vec![vec![0, 2, 3], vec![1], vec![4]]);
    }
}
