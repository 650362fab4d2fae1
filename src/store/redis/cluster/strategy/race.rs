//! The race: every group of a request checked and consumed at once, one round trip,
//! when what this process read of its counters (fresh hints, a cold counter's
//! capacity, or the check) shows each leaves its margin after the request's cost
//! (`cluster/headroom.rs`); a lost race (some group denied anyway) is refunded and the
//! request walks in order ([`super::OrderedWalk`]).
//!
//! Why race at all: the walk costs one round trip per group in sequence after the
//! check (a 3-group request takes 4 round trips and 6 script segments). Starvation
//! needs counters at their limit; a counter with more than a margin left admits every
//! request racing for it, in whatever order they arrive, so checking first and
//! consuming second in parallel admits everybody, as the walk would. On hot counters
//! the hints skip the check too: 3 segments and one round trip per 3-group request
//! (docs/architecture.md, "Requests across masters", has the figures under load).
//!
//! Why a task of its own when abandoned: the groups' calls are in flight together,
//! and a request future dropped by its caller (Envoy gave up, the connection closed)
//! would otherwise drop them with it, leaving whatever they consumed taken by nobody:
//! the walk's refund guard covers the groups it has answers for, but these have no
//! answers yet. The work owns the calls, their keys and operations, and the refunds
//! they may owe; it always runs to its end (each call is bounded by the request's
//! deadline), records what the replies say, and hands its caller the replies with a
//! [`RefundGuard`] holding every group that consumed. The caller disarms the guard if
//! the request is admitted, settles it otherwise. The caller runs the work itself
//! ([`Detachable`]): only if it goes away first does the rest move to a task of its
//! own, where the guard is dropped with the undelivered answer and its refunds are
//! sent anyway: a request nobody hears admitted consumes nothing
//! (`tests/it/cross_slot/dropped.rs`).

use std::sync::Arc;

use super::super::super::misroute;
use super::super::super::refund::RefundGuard;
use super::super::super::scripts::{Refund, Reply, WireOp};
use super::super::Cluster;
use super::super::detachable::Detachable;
use super::super::headroom::{Headroom, Ids};
use super::tally::Path;
use super::{OrderedWalk, Request, decisions};
use crate::algorithm::Decision;
use crate::store::StoreError;

/// The race: every group at once; if one denies, the others are refunded and the
/// request walks.
///
/// Invariant: never over-admits, and a lost race consumes nothing. Each group is
/// checked and consumed atomically, a refund gives back only what its own request
/// took, and a request nobody hears admitted (it lost, or its caller left) has every
/// group that consumed given back. What it does not keep on its own is the walk's
/// min(N, L): the bound on what it can cost others is an argument from the margin.
///
/// The argument. A racer trusts a reading (a dry run, a hint at most
/// `headroom::TTL` old, or a cold counter's capacity) that left the margin
/// (max(64 x cost, an eighth of the limit or burst)). It loses only if more than a
/// margin was spent on one of its counters since, by this replica's concurrent racers
/// or walkers or by other replicas. Until its refund lands (about two round trips) a
/// loser holds hits in its other groups, and those hits can turn away a walker only if
/// the walker reaches the limit meanwhile, that is, if more than the margin was spent
/// within those milliseconds. Nothing in one process bounds that for a burst of its
/// own (a burst of N at once on a fresh counter all read the same room): reserving
/// in-flight costs was tried and split such a burst into racers and walkers that
/// block each other (`cluster/headroom.rs` records it). Beaten, losers refund and
/// walk; a loser's or a walker's check may meet other losers' not yet refunded hits
/// and be denied: fewer admissions than min(N, L) for that burst, never more than L.
///
/// Measured, not proven: `tests/it/cross_slot.rs` fires exactly such a burst, 300
/// identical 2-group requests at once over 3 replicas on counters of limit 100, so
/// every check sees 99 left, above the margin of 64, and every request races; about
/// two thirds lose, refund and walk (over 900 fall-backs per 5 rounds). Never more
/// than 100 are admitted and Redis holds exactly what was; how close to 100 each
/// round comes is [`super::SecondLook`]'s part.
pub(super) struct Race<'c>(pub(super) &'c Cluster);

/// One operation as the work needs it to refund and to remember it.
struct Planned {
    key: String,
    op: WireOp,
    ids: Ids,
    vetoes: bool,
    /// Whether an allowed reply means hits were taken (a check-only op takes none).
    costed: bool,
}

/// What the work hands back: each group's result, and the refunds of the groups that
/// consumed.
type Answer = (Vec<Result<Vec<Reply>, StoreError>>, RefundGuard);

impl Race<'_> {
    /// The race, and the walk after a lost one.
    pub(super) async fn decide(self, req: Request<'_>) -> Result<Vec<Decision>, StoreError> {
        let cluster = self.0;
        if let Some(replies) = self.all_at_once(req).await? {
            return Ok(decisions(replies));
        }
        cluster.paths.count(Path::FellBack);
        cluster.shadow.cast();
        OrderedWalk(cluster).after_check(req).await
    }

    /// Check-and-consume of every group at once. `None` when some group denied: what
    /// the others consumed is given back before this returns (within the deadline), so
    /// the request's walk does not meet its own hits.
    async fn all_at_once(
        &self,
        req: Request<'_>,
    ) -> Result<Option<Vec<Option<Reply>>>, StoreError> {
        let Request {
            keys,
            ops,
            groups,
            deadline,
            ..
        } = req;
        let cluster = self.0;
        let calls: Vec<_> = groups
            .iter()
            .map(|indices| cluster.group_call(keys, ops, indices, false, deadline))
            .collect();
        let plans = plan(req);
        let mut owed = RefundGuard::new(
            cluster.connection.clone(),
            cluster.timeout,
            cluster.abandoned.clone(),
        );
        let headroom = Arc::clone(&cluster.headroom);
        let work = Detachable::new(async move {
            let results = futures_util::future::join_all(calls).await;
            for (plan, result) in plans.into_iter().zip(&results) {
                if let Ok(replies) = result {
                    settle_group(&headroom, &mut owed, plan, replies);
                }
            }
            // Detached (the caller is gone), the answer is dropped with the task's
            // output, and the guard's drop sends the refunds.
            (results, owed)
        });
        let (results, owed): Answer = work.await;

        let mut replies: Vec<Option<Reply>> = vec![None; ops.len()];
        // May or may not have consumed (a timeout says nothing): as in the walk.
        let failure = misroute::reported(results.iter().filter_map(|r| r.as_ref().err())).cloned();
        for (indices, result) in groups.iter().zip(results) {
            let Ok(group) = result else { continue };
            for (&i, reply) in indices.iter().zip(group) {
                replies[i] = Some(reply);
            }
        }
        let denied = replies
            .iter()
            .zip(ops)
            .any(|(r, op)| op.vetoes && r.is_some_and(|r| !r.decision.allowed));
        if failure.is_none() && !denied {
            owed.disarm();
            return Ok(Some(replies));
        }
        owed.settle(deadline).await;
        match failure {
            Some(error) => Err(error),
            None => Ok(None),
        }
    }
}

/// Each group's operations as the work needs them.
fn plan(req: Request<'_>) -> Vec<Vec<Planned>> {
    let Request {
        keys,
        ops,
        ids,
        groups,
        ..
    } = req;
    groups
        .iter()
        .map(|indices| {
            indices
                .iter()
                .map(|&i| Planned {
                    key: keys[i].clone(),
                    op: WireOp::new(&ops[i]),
                    ids: ids[i],
                    vetoes: ops[i].vetoes,
                    costed: ops[i].cost > 0,
                })
                .collect()
        })
        .collect()
}

/// What one group's `replies` leave: hints for its counters, and its refunds owed
/// if it consumed (a segment that denies consumes nothing of its own).
fn settle_group(
    headroom: &Headroom,
    owed: &mut RefundGuard,
    plan: Vec<Planned>,
    replies: &[Reply],
) {
    for (planned, reply) in plan.iter().zip(replies) {
        headroom.remember(planned.ids, *reply);
    }
    let denied = plan
        .iter()
        .zip(replies)
        .any(|(p, r)| p.vetoes && !r.decision.allowed);
    if !denied {
        owed.owe(
            plan.into_iter()
                .zip(replies)
                .filter(|(p, r)| p.costed && r.decision.allowed)
                .map(|(p, r)| Refund {
                    key: p.key,
                    op: p.op,
                    token: r.token,
                })
                .collect(),
        );
    }
}
