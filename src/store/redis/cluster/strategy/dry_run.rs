//! The dry run: every group asked at once, nothing written. It is a strategy of its
//! own (`Store::dry_run`, as `tollgate inspect` reads counters) and the first
//! step of the others, the check ([`DryRun::check`]), which is the same calls with
//! their readings remembered as hints.

use tokio::time::Instant;

use super::super::super::misroute;
use super::super::super::scripts::Reply;
use super::super::{Cluster, Group};
use super::{Request, decisions};
use crate::algorithm::Decision;
use crate::store::{CounterOp, StoreError};

/// The dry run: a dry-run segment of every group, all at once (one round trip).
///
/// Invariant: consumes nothing. Each segment is run in dry-run mode, which decides
/// every operation and writes no counter, so no order is needed and nothing can be
/// owed: the groups go in parallel, and a failed group fails the request with nothing
/// to give back. What it answers is what a consuming request would have been told at
/// that instant, group by group; across groups it is not one instant (the calls land
/// on different masters), which a dry run does not promise.
pub(super) struct DryRun<'c>(pub(super) &'c Cluster);

impl DryRun<'_> {
    /// The answers to a dry run of `ops` (keys `keys`) in `groups`.
    pub(super) async fn decide(
        self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Group],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let mut replies = vec![None; ops.len()];
        self.ask(keys, ops, groups, deadline, &mut replies).await?;
        Ok(decisions(replies))
    }

    /// The check: the dry run of a request about to consume, its readings remembered
    /// as hints (`cluster/headroom.rs`). A request that some group would deny anyway
    /// is denied by it without consuming anything, so it never holds a counter that
    /// others are racing for: without it, {x, y} requests denied at a full y each took
    /// one of x's hits for a round trip and gave it back, and {x} requests meeting
    /// those hits were denied (a limit of 5 admitted 4 of 60); with it, a limit of 5
    /// admits exactly 5 of 60 mixed requests in each of 10 repeats while the other 30
    /// name a used-up counter in a higher slot (`tests/it/cross_slot.rs`). The
    /// acquisition after it still decides: the check is an optimisation of the common
    /// case, never a commitment.
    pub(super) async fn check(self, req: Request<'_>) -> Result<Vec<Option<Reply>>, StoreError> {
        let Request {
            keys,
            ops,
            ids,
            groups,
            deadline,
        } = req;
        let mut replies = vec![None; ops.len()];
        self.ask(keys, ops, groups, deadline, &mut replies).await?;
        for indices in groups {
            self.0.headroom.record(ids, indices, &replies);
        }
        Ok(replies)
    }

    /// Dry runs of `groups`, concurrently, their replies put into `replies`. When
    /// groups failed, the error is one that is not a misroute if any
    /// ([`misroute::reported`]): only a request whose every failure was a misroute is
    /// decided again by slot.
    async fn ask(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Group],
        deadline: Instant,
        replies: &mut [Option<Reply>],
    ) -> Result<(), StoreError> {
        let results = futures_util::future::join_all(
            groups
                .iter()
                .map(|group| self.0.group_call(keys, ops, group, true, deadline)),
        )
        .await;
        if let Some(e) = misroute::reported(results.iter().filter_map(|r| r.as_ref().err())) {
            return Err(e.clone());
        }
        for (indices, result) in groups.iter().zip(results) {
            for (&i, reply) in indices.iter().zip(result?) {
                replies[i] = Some(reply);
            }
        }
        Ok(())
    }
}
