//! The ordered walk: a request's groups acquired one after another in the one global
//! order (`cluster/route.rs`'s `Route`: masters by address, then slots by number),
//! stopping at the first group that denies, the groups before it refunded. The
//! strategy near a limit, for a request carrying a charge or a release, and after a
//! lost race.
//!
//! Why it exists (issue 12): consuming every group in parallel and refunding on a
//! denial lets N requests on two nearly full counters each win one group, lose the
//! other, and all refund: nobody is admitted. Issue 12 saw it on two 1/hour counters,
//! 30 concurrent requests over 3 replicas: in 10 rounds of 50, no request was
//! admitted. In one global order every round admits exactly one
//! (`tests/it/cross_slot.rs`, 50 rounds of 30 over 3 servers).
//!
//! What it costs: one round trip for the check plus one per group in sequence,
//! instead of one for all groups at once (docs/architecture.md, "Requests across
//! masters", has the figures and the command); which is why far from the limits the
//! request races instead ([`super::Race`]).

use super::super::super::refund::RefundGuard;
use super::super::super::scripts::Reply;
use super::super::Cluster;
use super::{DryRun, Request, decisions, vetoed};
use crate::algorithm::Decision;
use crate::store::StoreError;

/// The ordered walk: each group checked and consumed in one atomic call, in the one
/// global order, stopping at the first that denies; the groups consumed before it are
/// refunded (`lua/refund.lua`), the groups after it report what the check found.
///
/// Invariant: of N concurrent identical requests on limit L, exactly min(N, L) are
/// admitted, and no counter admits more than its limit.
///
/// The argument. Every request meets the groups in the same order, so a request
/// waiting on group k holds hits only in groups before k, never after. Hits in the
/// last group belong to requests that are through it, hence admitted; and a request
/// can hold a hit in group j only after getting one in every group before j. So for
/// identical requests on limit L, the first L to pass group 1 find room at every
/// later group (only they can be ahead of them there), and exactly min(N, L) are
/// admitted: nobody starves anybody. Never more than L: each group is checked and
/// consumed atomically, and a refund gives back only what its own request took. A
/// denied request consumes nothing: the refunds are sent from a guard
/// (`store/redis/refund.rs`) that outlives the request's deadline and a caller that
/// stops waiting. The proof is about hits held by walkers; a racer's hits held until
/// its refund lands are [`super::Race`]'s to bound.
pub(super) struct OrderedWalk<'c>(pub(super) &'c Cluster);

impl OrderedWalk<'_> {
    /// The check ([`DryRun::check`]), then the walk unless the check denied: the walk
    /// of a request that has no check yet (a charge or a release, a lost race, a
    /// second look).
    pub(super) async fn after_check(self, req: Request<'_>) -> Result<Vec<Decision>, StoreError> {
        let replies = DryRun(self.0).check(req).await?;
        if vetoed(req.ops, &replies) {
            return Ok(decisions(replies));
        }
        self.decide(req, replies).await
    }

    /// The walk. `replies` holds what the check found, reported for the groups after
    /// a denial.
    pub(super) async fn decide(
        self,
        req: Request<'_>,
        mut replies: Vec<Option<Reply>>,
    ) -> Result<Vec<Decision>, StoreError> {
        let Request {
            keys,
            ops,
            ids,
            groups,
            deadline,
        } = req;
        let cluster = self.0;
        // Built only on this (multi-group) path; if this future is dropped mid-walk,
        // the guard still sends the refunds from a task of its own.
        let mut guard = RefundGuard::new(
            cluster.connection.clone(),
            cluster.timeout,
            cluster.abandoned.clone(),
        );
        let mut denied_at = None;
        for (g, indices) in groups.iter().enumerate() {
            let group_replies = match cluster
                .group_call(keys, ops, indices, false, deadline)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    // The failed call itself may or may not have consumed (a timeout
                    // says nothing); the groups before it surely did.
                    guard.settle(deadline).await;
                    return Err(e);
                }
            };
            let vetoed = indices
                .iter()
                .zip(&group_replies)
                .any(|(&i, r)| ops[i].vetoes && !r.decision.allowed);
            for (&i, reply) in indices.iter().zip(group_replies) {
                replies[i] = Some(reply);
            }
            cluster.headroom.record(ids, indices, &replies);
            if vetoed {
                denied_at = Some(g);
                break;
            }
            if g + 1 < groups.len() {
                guard.hold(keys, ops, indices, &replies);
            }
        }
        let Some(g) = denied_at else {
            guard.disarm();
            return Ok(decisions(replies));
        };

        // Denied at group g: give back the groups before it. The groups after it keep
        // the statuses the check found (nothing consumed there, no new round trip).
        guard.settle(deadline).await;
        // What the refunded operations report is what remains without this request.
        for &i in groups[..g].iter().flatten() {
            if let Some(reply) = replies[i].as_mut().filter(|r| r.decision.allowed) {
                reply.decision.remaining = reply
                    .decision
                    .remaining
                    .saturating_add(ops[i].cost)
                    .min(ops[i].params.limit.max(ops[i].params.burst));
            }
        }
        Ok(decisions(replies))
    }
}
