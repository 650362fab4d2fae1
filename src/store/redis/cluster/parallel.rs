//! Taking every slot group of a request at once (the fast path of
//! [`super::acquire`]), as work that runs to its end even if its caller goes away.
//!
//! Why: the groups' calls are in flight together, and a request future
//! dropped by its caller (Envoy gave up, the connection closed) would otherwise drop
//! them with it, leaving whatever they consumed taken by nobody: the walk's refund
//! guard covers the groups it has answers for, but these have no answers yet. The
//! work owns the calls, their keys and operations, and the refunds they may owe; it
//! always runs to its end (each call is bounded by the request's deadline), records
//! what the replies say ([`super::headroom`]), and hands its caller the replies with a
//! [`RefundGuard`] holding every group that consumed. The caller disarms the guard if
//! the request is admitted, settles it otherwise. The caller runs the work itself
//! ([`Detachable`]): only if it goes away first does the rest move to a task of its
//! own, where the guard is dropped with the undelivered answer and its refunds are
//! sent anyway: a request nobody hears admitted consumes nothing. (A task for every
//! request cost a spawn and a wake-up across threads each.)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::super::misroute;
use super::super::refund::RefundGuard;
use super::super::scripts::{Refund, Reply, WireOp};
use super::Cluster;
use super::acquire::Request;
use super::headroom::{Headroom, Ids};
use crate::store::StoreError;

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

impl Cluster {
    /// Check-and-consume of every group at once. `None` when some group denied: what
    /// the others consumed is given back before this returns (within the deadline), so
    /// the request's walk does not meet its own hits.
    pub(super) async fn all_at_once(
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
        let calls: Vec<_> = groups
            .iter()
            .map(|indices| self.group_call(keys, ops, indices, false, deadline))
            .collect();
        let plans = plan(req);
        let mut owed = RefundGuard::new(
            self.connection.clone(),
            self.timeout,
            self.abandoned.clone(),
        );
        let headroom = std::sync::Arc::clone(&self.headroom);
        let work = Detachable(Some(Box::pin(async move {
            let results = futures_util::future::join_all(calls).await;
            for (plan, result) in plans.into_iter().zip(&results) {
                if let Ok(replies) = result {
                    settle_group(&headroom, &mut owed, plan, replies);
                }
            }
            // Detached (the caller is gone), the answer is dropped with the task's
            // output, and the guard's drop sends the refunds.
            (results, owed)
        })));
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

/// A future its caller polls in place, whose rest moves to a task of its own if the
/// caller drops it unfinished: work that must run to its end (the calls in flight and
/// the refunds they owe) without a task and a cross-thread wake-up per request.
struct Detachable<F: Future + Send + 'static>(Option<Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: Future + Send + 'static> Future for Detachable<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = self
            .0
            .as_mut()
            .expect("a Detachable is not polled after it finished");
        let output = ready!(work.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Detachable<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        // Dropped while its own poll panics: the rest would only panic again.
        if std::thread::panicking() {
            return;
        }
        if let Some(rest) = self.0.take() {
            // A store only runs on a runtime; without one (shutting down) there is
            // nothing left to run the rest on, as there was for a spawned task.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(rest);
            }
        }
    }
}
