//! The Redis Cluster path. A request's counter operations are grouped by hash slot;
//! each group is decided atomically by one segment of a batch-script call, which
//! concurrent groups in the same slot share ([`super::slot_batch`]). A request with
//! several groups acquires them all at once when every counter is far from its limit,
//! otherwise one after another in ascending slot order ([`acquire`], the margin in
//! [`headroom`]); a group that denies gets the groups already consumed refunded
//! ([`super::refund`]), so a denied request consumes nothing. A single group is one
//! call; dry runs consume nothing and ask every group at once.
//!
//! Every group call is bounded by the request's deadline and made under the breaker
//! of the master serving its slot ([`super::nodes`]): a stalled master fails only
//! the requests with a group on it.

mod acquire;
mod headroom;
mod parallel;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;
use redis::cluster_async::ClusterConnection;
use tokio::time::Instant;

use super::keys;
use super::nodes::Nodes;
use super::scripts::{Reply, WireOp};
use super::slot_batch::SlotBatchers;
use crate::algorithm::Decision;
use crate::metrics::Metrics;
use crate::store::breaker::BreakerOptions;
use crate::store::{CounterOp, StoreError};

pub use self::acquire::CrossSlotPaths;
use self::acquire::PathCounters;
use self::headroom::Headroom;

/// A group's timeout counts against its master only when the group had at least
/// the store's timeout divided by this left of the request's budget.
const FAIR_SHARE: u32 = 4;

/// How much of its budget a group may have spent before it is queued and still go
/// without a timer of its own: at most this late, whatever its queue holds.
const QUEUE_SLACK: Duration = Duration::from_millis(2);

/// A cluster connection (redis-rs follows MOVED/ASK and retries TRYAGAIN).
pub struct Cluster {
    connection: ClusterConnection,
    /// The store's per-call budget: it bounds each refund attempt, which may outlive
    /// the request that made it.
    timeout: Duration,
    /// Refunded operations given up on (a counter left high until its window ends):
    /// `tollgate_refunds_abandoned_total` when the server has metrics.
    abandoned: Counter,
    /// Each master's breaker, by slot.
    nodes: Arc<Nodes>,
    /// One queue per slot: concurrent groups in a slot share a call.
    batchers: Arc<SlotBatchers>,
    /// What the last replies said each counter still admits (bounded), and what the
    /// parallel acquisitions in flight hold.
    headroom: Arc<Headroom>,
    /// Which way multi-group requests went.
    paths: PathCounters,
}

impl Cluster {
    /// The cluster path over `connection`, with a breaker of `breaker` options per
    /// master (their states, failures and abandoned refunds go to `metrics`).
    pub async fn start(
        connection: ClusterConnection,
        timeout: Duration,
        breaker: BreakerOptions,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        let abandoned = metrics
            .as_ref()
            .map(|m| m.refunds_abandoned())
            .unwrap_or_default();
        let nodes = Nodes::start(connection.clone(), breaker, metrics).await;
        Self {
            batchers: Arc::new(SlotBatchers::new(connection.clone(), timeout)),
            connection,
            timeout,
            abandoned,
            nodes,
            headroom: Arc::new(Headroom::default()),
            paths: PathCounters::default(),
        }
    }

    /// Which way the multi-group requests went so far (see [`acquire`]).
    pub fn cross_slot_paths(&self) -> CrossSlotPaths {
        self.paths.get()
    }

    /// Refunded operations that could not be given back (see [`super::refund`]).
    pub fn refunds_abandoned(&self) -> u64 {
        self.abandoned.get()
    }

    /// Decides `ops` (whose encoded keys are `keys`), all or nothing across slots, by
    /// `deadline`. The caller must not cancel this future on a timer of its own: the
    /// deadline is applied here, per call, so that a walk cut short still refunds.
    pub async fn decide(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        dry_run: bool,
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let groups = group_by_slot(keys.iter().map(String::as_str));
        if let [only] = groups.as_slice() {
            // One slot: one atomic call, nothing to order or refund.
            let replies = self.group_call(keys, ops, only, dry_run, deadline).await?;
            return Ok(replies.into_iter().map(|r| r.decision).collect());
        }
        if dry_run {
            let mut replies = vec![None; ops.len()];
            self.dry_run_groups(keys, ops, &groups, deadline, &mut replies)
                .await?;
            return Ok(decisions(replies));
        }
        self.acquire(keys, ops, &groups, deadline).await
    }

    /// Dry runs of `groups`, concurrently, their replies put into `replies`.
    async fn dry_run_groups(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        groups: &[Vec<usize>],
        deadline: Instant,
        replies: &mut [Option<Reply>],
    ) -> Result<(), StoreError> {
        let results = join_all(
            groups
                .iter()
                .map(|indices| self.group_call(keys, ops, indices, true, deadline)),
        )
        .await;
        for (indices, result) in groups.iter().zip(results) {
            for (&i, reply) in indices.iter().zip(result?) {
                replies[i] = Some(reply);
            }
        }
        Ok(())
    }

    /// The call deciding the operations `indices` of `ops` (all in one slot) in the
    /// slot's shared call, by `deadline`, under the breaker of the group's master; a
    /// future that owns all it needs, so that it can run on after its request is gone
    /// (the parallel acquisition's task).
    fn group_call(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        indices: &[usize],
        dry_run: bool,
        deadline: Instant,
    ) -> impl Future<Output = Result<Vec<Reply>, StoreError>> + Send + 'static {
        let slot = indices.first().map(|&i| slot_of(&keys[i]));
        let group_keys: Vec<String> = indices.iter().map(|&i| keys[i].clone()).collect();
        let group_ops: Vec<WireOp> = indices.iter().map(|&i| WireOp::new(&ops[i])).collect();
        let (batchers, nodes, timeout) = (
            Arc::clone(&self.batchers),
            Arc::clone(&self.nodes),
            self.timeout,
        );
        async move {
            let Some(slot) = slot else {
                return Ok(Vec::new());
            };
            // A group queued with its request's whole budget left (its only group,
            // the check, the groups taken at once) needs no timer of its own: its slot
            // queue answers it within the store's timeout of now (each call is given
            // up at the earliest deadline it carries, and every call ahead of it was
            // queued earlier), so at most QUEUE_SLACK past `deadline` (or later by as
            // long as the thread is pre-empted between taking its deadline and
            // queueing, as a timer fires late on a loaded machine). A walk's later
            // group, queued after earlier groups spent part of the budget, keeps one.
            // Its deadline is not handed to the queue: a shared call would be cut
            // short at it for every request in it. (A timer per group was 4% of a
            // 3-group request's instructions.)
            let bounded =
                deadline.saturating_duration_since(Instant::now()) + QUEUE_SLACK >= timeout;
            let call = batchers.decide(slot, group_keys, group_ops, dry_run);
            // All groups of a request share `deadline`: a group left with less than a
            // fair share because an earlier one waited on a slow master is failed
            // without charging its own master's breaker (issue: one slow master opened
            // a healthy one's breaker). A healthy master answers in a few ms even
            // busy; a quarter of the store's timeout is a trial it should pass.
            let fair = timeout / FAIR_SHARE;
            nodes
                .call(slot, (deadline, bounded), fair, timeout, call)
                .await
        }
    }
}

fn decisions(replies: Vec<Option<Reply>>) -> Vec<Decision> {
    replies
        .into_iter()
        .map(|r| r.expect("every group replied").decision)
        .collect()
}

/// Indices of `keys` grouped by hash slot, groups in ascending slot order (the one
/// global order every request acquires them in) and request order within each group
/// (so duplicate counters are decided in request order).
fn group_by_slot<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let slot = slot_of(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    // Slots are distinct, so the order is total: no two groups tie.
    groups.sort_unstable_by_key(|(slot, _)| *slot);
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The hash slot of `key`, as Redis computes it (CRC16/XMODEM of the hash tag, or of
/// the whole key when it has no non-empty tag, modulo 16384). Computed here because
/// the order needs the slot's number, which redis-rs's `Slot` does not expose; the
/// CRC is the crate redis-rs itself uses.
fn slot_of(key: &str) -> u16 {
    let hashed = keys::tag(key).filter(|tag| !tag.is_empty()).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_hash_tag_in_slot_then_request_order() {
        let keys = ["a{x}", "b{y}", "c{x}", "a{x}", "d{z}"];
        let slot = |tag: &str| slot_of(tag);
        let mut expected = vec![
            (slot("x"), vec![0, 2, 3]),
            (slot("y"), vec![1]),
            (slot("z"), vec![4]),
        ];
        expected.sort();
        let expected: Vec<Vec<usize>> = expected.into_iter().map(|(_, g)| g).collect();
        assert_eq!(group_by_slot(keys), expected);
        assert!(slot("x") != slot("y") && slot("y") != slot("z"));
    }

    #[test]
    fn slot_numbers_agree_with_redis() {
        use redis::cluster_routing::Slot;
        // CRC16/XMODEM's check value, then the tag rules against redis-rs's own slots:
        // the first '{', the first '}' after it, an empty tag hashes the whole key.
        // (0x31C3, already below 16384).
        assert_eq!(slot_of("123456789"), 0x31C3);
        for key in [
            "foo",
            "{user1000}.following",
            "a{}b",
            "{}",
            "x{a}{b}",
            "{{a}}",
            "t{\u{e9}}z",
            "",
        ] {
            assert_eq!(
                Slot::new(slot_of(key)),
                Some(Slot::for_key(key.as_bytes())),
                "{key}"
            );
        }
    }
}
