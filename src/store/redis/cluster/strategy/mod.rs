//! How the cluster decides a request, by strategy: each strategy a type in a file of
//! its own, with the invariant it keeps stated on it ("Invariant:") and the argument
//! for it, and one dispatch ([`Cluster::decide_groups`], below) that picks the
//! strategy for a request. A request's groups are formed first (`cluster/route.rs`:
//! one per master, in one global order); this module decides them.
//!
//! The strategies (what picks each; the invariant it keeps):
//!
//! - [`Single`]: the request's counters on one master, consuming or a dry run; all or
//!   nothing in one atomic call.
//! - [`DryRun`]: a dry run of several groups; consumes nothing.
//! - [`OrderedWalk`]: a request carrying a charge or a release, a counter within its
//!   margin, a lost race; of N identical requests on limit L, exactly min(N, L) are
//!   admitted.
//! - [`Race`]: every counter leaves its margin after the cost, by fresh hints, a cold
//!   counter's capacity, or the check; never over-admits, and a lost race is refunded
//!   and walks.
//! - [`SecondLook`]: a denial within [`RACE_SHADOW`] of a lost race; decided again by
//!   the walk, it narrows under-admission and never over-admits.
//!
//! The check ([`DryRun::check`]) is not a strategy but the step that chooses between
//! the race and the walk when no reading lets the request skip it: a dry run of every
//! group, remembered as hints; it denies, with nothing consumed, a request some group
//! would deny anyway.
//!
//! Why types: each strategy is a thing a reader looks for by name (the walk's proof,
//! the race's margin), and a type is where its invariant can sit beside the only code
//! that has to keep it. Each borrows the [`Cluster`] (its calls, its hints, its
//! refund guard's connection) for one request and is consumed by its `decide` (the
//! walk also has `after_check`, for a request that has no check yet).
//! Why not a trait: the strategies take different inputs (the walk the check's
//! replies, the second look a first answer), so a common signature would be a
//! pretence, and a `dyn` strategy would box one more future per request on the hot
//! path; the dispatch is a list the compiler sees whole.
//!
//! What every strategy shares: a [`Request`] (keys, operations, hint ids, groups, one
//! deadline); every group call through `Cluster::group_call` (the master's breaker,
//! the request's deadline, the master's shared call); refunds through
//! `store/redis/refund.rs`'s guard; readings through `cluster/headroom.rs`. Which way
//! each multi-group request went is counted ([`CrossSlotPaths`], `tally.rs`),
//! and the tests assert the path, not the timing.

mod dry_run;
mod race;
mod second_look;
mod single;
mod tally;
mod walk;

use tokio::time::Instant;

use super::super::scripts::Reply;
use super::Cluster;
use super::headroom::{Ids, Reading};
use super::route::Group;
use crate::algorithm::Decision;
use crate::store::{CounterOp, StoreError};

use self::dry_run::DryRun;
use self::race::Race;
use self::second_look::SecondLook;
pub use self::second_look::{RACE_SHADOW, Shadow};
use self::single::Single;
pub use self::tally::{CrossSlotPaths, Path, PathCounters};
use self::walk::OrderedWalk;

/// One multi-group request on its way through the strategies: its keys and
/// operations, their hint ids (`cluster/headroom.rs`), its groups in the global order,
/// and the deadline every call of it shares.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    pub keys: &'a [String],
    pub ops: &'a [CounterOp],
    pub ids: &'a [Ids],
    pub groups: &'a [Group],
    pub deadline: Instant,
}

impl Cluster {
    /// Decides `ops` (keys `keys`) in `groups`, all or nothing across them, by
    /// `deadline`: the dispatch. The first line that fits the request picks its
    /// strategy.
    pub(super) async fn decide_groups(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Group],
        dry_run: bool,
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        // One group, consuming or not: one atomic call.
        if let [only] = groups {
            return Single(self)
                .decide(keys, ops, only, dry_run, deadline)
                .await;
        }
        // Several groups, nothing written: all at once.
        if dry_run {
            return DryRun(self).decide(keys, ops, groups, deadline).await;
        }
        let ids = self.headroom.ids(keys, ops);
        let req = Request {
            keys,
            ops,
            ids: &ids,
            groups,
            deadline,
        };
        // A charge or a release is never refunded, so a request carrying one must run
        // each group once: no race (a lost race walks again) and no second look.
        if ops.iter().any(CounterOp::commits) {
            return OrderedWalk(self).after_check(req).await;
        }
        // Otherwise the race or the walk, by the margins; and a denial in the shadow
        // of a race this process lost, a second look.
        let first = self.race_or_walk(req).await?;
        SecondLook(self).decide(req, first).await
    }

    /// The race when what this process read of the counters shows every margin (no
    /// check), else the check, and then the race, the walk, or a denial with nothing
    /// consumed.
    async fn race_or_walk(&self, req: Request<'_>) -> Result<Vec<Decision>, StoreError> {
        // A request of shadow operations only has nothing to deny it and needed no
        // hint: it races uncounted.
        let vetoes = req.ops.iter().any(|op| op.vetoes);
        match self.headroom.reading(req.ids, req.ops) {
            Reading::Hinted => {
                if vetoes {
                    self.paths.count(Path::Hinted);
                }
                Race(self).decide(req).await
            }
            Reading::Cold => {
                if vetoes {
                    self.paths.count(Path::Cold);
                }
                Race(self).decide(req).await
            }
            Reading::Ask => {
                let check = DryRun(self).check(req).await?;
                if vetoed(req.ops, &check) {
                    self.paths.count(Path::Denied);
                    return Ok(decisions(check));
                }
                if !self.headroom.checked(req.ops, &check) {
                    self.paths.count(Path::Ordered);
                    return OrderedWalk(self).decide(req, check).await;
                }
                self.paths.count(Path::Checked);
                Race(self).decide(req).await
            }
        }
    }
}

/// Whether any vetoing operation of `replies` was denied.
pub(super) fn vetoed(ops: &[CounterOp], replies: &[Option<Reply>]) -> bool {
    replies
        .iter()
        .zip(ops)
        .any(|(r, op)| op.vetoes && r.is_some_and(|r| !r.decision.allowed))
}

/// The decisions of a request every group of which replied.
pub(super) fn decisions(replies: Vec<Option<Reply>>) -> Vec<Decision> {
    replies
        .into_iter()
        .map(|r| r.expect("every group replied").decision)
        .collect()
}
