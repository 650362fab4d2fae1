//! Acquiring a request's groups (one per master, [`super::route`]), all or nothing:
//! all at once when every counter is far from its limit (or cold), one after another
//! in the one global order ([`super::route::Route`]) otherwise.
//!
//! Why two ways. The ordered walk is what keeps contention from starving anybody
//! ([`Cluster::walk_in_order`] argues it), but it costs one round trip per group in
//! sequence after the check: a 3-group request takes 4 round trips and 6 script
//! segments. Starvation needs
//! counters at their limit; a counter far from it admits every request racing for it,
//! in any order. So "check first and consume second": when the check (or a fresh hint
//! standing in for it, [`super::headroom`]) shows every group leaves a margin after
//! the request's cost, the groups are acquired in parallel, one round trip; a margin
//! beaten anyway (some group denies) is refunded and the request walks in order.
//! Near a limit the walk decides. On hot counters the hints skip the check too: 3
//! segments and one round trip per 3-group request (docs/architecture.md, "Requests
//! across masters", has what each way costs, with the command).
//!
//! What it keeps: no counter admits more than its limit (each group is checked and
//! consumed atomically, a refund gives back only what its request took), and a denied
//! request consumes nothing (refunded), even when its caller stops waiting mid-flight
//! ([`super::parallel`] runs the groups and their refunds in a task of its own).
//! What the parallel path can cost others: until its refund lands (about two round
//! trips), a request that lost its race holds hits in its other groups. It only raced
//! because every counter had its margin, so for those hits to turn a walking request
//! away, more than a margin must be spent within those milliseconds.
//! `tests/it/cross_slot.rs` fires such a burst (300 identical requests at once over 3
//! replicas on counters of limit 100: every check sees 99 left, so they race, and two
//! thirds lose and walk): never more than 100 are admitted and Redis holds exactly
//! what was. A walker that meets other losers' hits before their refunds land can be
//! denied: without the second look [`Cluster::acquire`] gives denials in a race's
//! shadow, a round admitted 97-99 in about one run in four; with it, 100 in 75 of 75
//! rounds. That is a test, not a proof: what it can leave is under-admission, never
//! over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::super::refund::RefundGuard;
use super::super::scripts::Reply;
use super::headroom::{Ids, Reading};
use super::{Cluster, Group, decisions};
use crate::algorithm::Decision;
use crate::store::{CounterOp, StoreError};

/// How the multi-group requests this store decided went; for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrossSlotPaths {
    /// Acquired all at once after fresh hints showed the margins (no check).
    pub hinted: u64,
    /// Raced all at once without a check because some counter had no fresh reading
    /// (see [`super::headroom::Reading::Cold`]).
    pub cold: u64,
    /// Acquired all at once after the check showed the margins.
    pub checked: u64,
    /// Raced all at once, a group denied: refunded, then walked in order.
    pub fell_back: u64,
    /// Walked in order because some counter was within its margin.
    pub ordered: u64,
    /// Denied by the check, nothing consumed.
    pub denied: u64,
    /// Denied soon after a lost race, and decided once more after [`SECOND_LOOK`].
    pub second_looks: u64,
    /// Requests (of one group or several) decided again by slot after a call to a
    /// master met a key that master does not serve ([`super::super::misroute`]).
    pub misrouted: u64,
}

/// How long after a lost race a denial is not trusted at once: the racers' refunds
/// (one round trip each, sent as their replies arrive) land well within it.
pub const RACE_SHADOW: Duration = Duration::from_millis(100);
/// The pause before a denial in a race's shadow is decided once more.
pub const SECOND_LOOK: Duration = Duration::from_millis(5);

pub struct PathCounters {
    hinted: AtomicU64,
    cold: AtomicU64,
    checked: AtomicU64,
    fell_back: AtomicU64,
    ordered: AtomicU64,
    denied: AtomicU64,
    second_looks: AtomicU64,
    misrouted: AtomicU64,
    /// When this process last lost a race, in ms since `epoch` (0: never).
    lost_race_ms: AtomicU64,
    epoch: std::time::Instant,
}

impl Default for PathCounters {
    fn default() -> Self {
        Self {
            hinted: AtomicU64::new(0),
            cold: AtomicU64::new(0),
            checked: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
            ordered: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            second_looks: AtomicU64::new(0),
            misrouted: AtomicU64::new(0),
            lost_race_ms: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }
}

impl PathCounters {
    pub fn get(&self) -> CrossSlotPaths {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CrossSlotPaths {
            hinted: get(&self.hinted),
            cold: get(&self.cold),
            checked: get(&self.checked),
            fell_back: get(&self.fell_back),
            ordered: get(&self.ordered),
            denied: get(&self.denied),
            second_looks: get(&self.second_looks),
            misrouted: get(&self.misrouted),
        }
    }

    pub(super) fn misrouted(&self) {
        count(&self.misrouted);
    }

    fn lost_race(&self) {
        // +1: 0 means never.
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.lost_race_ms.store(now, Ordering::Relaxed);
    }

    fn in_race_shadow(&self) -> bool {
        let last = self.lost_race_ms.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        last != 0 && now.saturating_sub(last) < RACE_SHADOW.as_millis() as u64
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One multi-group request on its way through the paths below: its keys and
/// operations, their hint ids ([`super::headroom`]), its groups in the global
/// order, and the deadline every call of it shares.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    pub keys: &'a [String],
    pub ops: &'a [CounterOp],
    pub ids: &'a [Ids],
    pub groups: &'a [Group],
    pub deadline: Instant,
}

/// Whether any vetoing operation of `replies` was denied.
fn vetoed(ops: &[CounterOp], replies: &[Option<Reply>]) -> bool {
    replies
        .iter()
        .zip(ops)
        .any(|(r, op)| op.vetoes && r.is_some_and(|r| !r.decision.allowed))
}

impl Cluster {
    /// Decides a request of several groups, consuming: see the module docs.
    ///
    /// The race, bounded. A racer trusts a reading (a dry run, or a hint at most
    /// [`super::headroom::TTL`] old) that left the margin: it loses only if more than a
    /// margin (64 requests of its cost, or an eighth of the limit) was spent on one of
    /// its counters since, by this replica's concurrent racers or walkers or by other
    /// replicas. Nothing in one process bounds that for a burst of its own (a burst
    /// of N at once on a fresh counter all read the same room): reserving in-flight
    /// costs was tried and split such a burst into racers and walkers that block each
    /// other (see [`super::headroom`]). Beaten, losers refund and walk; a loser's or a
    /// walker's check may meet other losers' not yet refunded hits and be denied:
    /// fewer admissions than min(N, L) for that burst, never more than L
    /// (`tests/it/cross_slot.rs` fires such bursts).
    ///
    /// A denial soon after this process lost a race gets a second look: the racers'
    /// hits are refunded within a round trip or two, and a request that met them at a
    /// counter's limit was turned away by hits that are not there any more: a burst
    /// of identical requests on one limit, every one racing, would otherwise now and
    /// then admit one fewer than the limit. The second look is one pause and one more
    /// check for denials in a race's shadow only.
    pub(super) async fn acquire(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Group],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        // A charge or a release is never refunded, so a request carrying one must run
        // each group once: no race (a lost race walks again) and no second look.
        if ops.iter().any(CounterOp::commits) {
            let ids = self.headroom.ids(keys, ops);
            return self
                .check_then_walk(Request {
                    keys,
                    ops,
                    ids: &ids,
                    groups,
                    deadline,
                })
                .await;
        }
        let decisions = self.acquire_once(keys, ops, groups, deadline).await?;
        let denied = decisions
            .iter()
            .zip(ops)
            .any(|(d, op)| op.vetoes && !d.allowed);
        if !denied || !self.paths.in_race_shadow() {
            return Ok(decisions);
        }
        let pause = Instant::now() + SECOND_LOOK;
        if pause >= deadline {
            return Ok(decisions);
        }
        tokio::time::sleep_until(pause).await;
        count(&self.paths.second_looks);
        let ids = self.headroom.ids(keys, ops);
        self.check_then_walk(Request {
            keys,
            ops,
            ids: &ids,
            groups,
            deadline,
        })
        .await
    }

    async fn acquire_once(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Group],
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let paths = &self.paths;
        let ids = self.headroom.ids(keys, ops);
        let req = Request {
            keys,
            ops,
            ids: &ids,
            groups,
            deadline,
        };
        let reading = self.headroom.reading(&ids, ops);
        if reading != Reading::Ask {
            // The hints are a guess, a cold counter's room more so: a group that
            // denies is refunded and the request walks, so a wrong guess costs time,
            // never an admission. A request of shadow operations only has nothing to
            // deny it and needed no hint.
            if ops.iter().any(|op| op.vetoes) {
                count(match reading {
                    Reading::Cold => &paths.cold,
                    _ => &paths.hinted,
                });
            }
            return self.race(req).await;
        }
        let replies = self.check(req).await?;
        if vetoed(ops, &replies) {
            count(&paths.denied);
            return Ok(decisions(replies));
        }
        if !self.headroom.checked(ops, &replies) {
            count(&paths.ordered);
            return self.walk_in_order(req, replies).await;
        }
        count(&paths.checked);
        self.race(req).await
    }

    /// Every group at once ([`super::parallel`]); a lost race (some group denied,
    /// the others refunded) checks again and walks in order.
    async fn race(&self, req: Request<'_>) -> Result<Vec<Decision>, StoreError> {
        if let Some(replies) = self.all_at_once(req).await? {
            return Ok(decisions(replies));
        }
        count(&self.paths.fell_back);
        self.paths.lost_race();
        self.check_then_walk(req).await
    }

    /// The check: a dry run of every group at once (one round trip), remembered as
    /// hints. A request that some group would deny anyway is denied by it without
    /// consuming anything, so it never holds a counter that others are racing for:
    /// without it, {x, y} requests denied at a full y each took one of x's hits for a
    /// round trip and gave it back, and {x} requests meeting those hits were denied (a
    /// limit of 5 admitted 4 of 60). The acquisition still decides: the check is an
    /// optimisation of the common case, never a commitment.
    async fn check(&self, req: Request<'_>) -> Result<Vec<Option<Reply>>, StoreError> {
        let Request {
            keys,
            ops,
            ids,
            groups,
            deadline,
        } = req;
        let mut replies = vec![None; ops.len()];
        self.dry_run_groups(keys, ops, groups, deadline, &mut replies)
            .await?;
        for indices in groups {
            self.headroom.record(ids, indices, &replies);
        }
        Ok(replies)
    }

    /// The path the request takes after its margin was beaten: today's, check and walk.
    async fn check_then_walk(&self, req: Request<'_>) -> Result<Vec<Decision>, StoreError> {
        let replies = self.check(req).await?;
        if vetoed(req.ops, &replies) {
            return Ok(decisions(replies));
        }
        self.walk_in_order(req, replies).await
    }

    /// Acquires the groups in the global order, each check-and-consume in one
    /// atomic call, stopping at the first that denies.
    ///
    /// Why in order, and not all at once: with consume-then-refund in parallel, N
    /// requests on two nearly full counters can each win one slot and lose the other,
    /// and all of them refund: nobody is admitted. Here every request meets the
    /// groups in the same order, so a
    /// request waiting on group k holds hits only in groups before k, never after.
    /// Hits in the last group belong to requests that are through, hence admitted;
    /// and a request can hold a hit in group j only after getting one in each group
    /// before j. So for identical requests on limit L, the first L to pass group 1
    /// find room at every later group (only they can be ahead of them there), and
    /// exactly min(N, L) are admitted: nobody starves anybody. The cost: one round
    /// trip for the check plus one per group in sequence, instead of one in parallel
    /// (the figures are in docs/architecture.md, "Requests across slots").
    ///
    /// `replies` holds what the check found, reported for the groups after a denial.
    async fn walk_in_order(
        &self,
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
        // Built only on this (multi-group) path; if this future is dropped mid-walk,
        // the guard still sends the refunds from a task of its own.
        let mut guard = RefundGuard::new(
            self.connection.clone(),
            self.timeout,
            self.abandoned.clone(),
        );
        let mut denied_at = None;
        for (g, indices) in groups.iter().enumerate() {
            let group_replies = match self.group_call(keys, ops, indices, false, deadline).await {
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
            self.headroom.record(ids, indices, &replies);
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
