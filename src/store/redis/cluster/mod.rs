//! The Redis Cluster path. A request's counter operations are grouped by the master
//! serving their slots ([`route`]); each group is decided atomically by one segment of
//! a batch-script call, which concurrent groups on the same master share
//! ([`super::slot_batch`]). How a request of several groups is decided (a single
//! group, a dry run, the race, the ordered walk, the second look) is [`strategy`]'s:
//! one type per strategy, each with its invariant, and the dispatch that picks one;
//! the margin that lets a request race is [`headroom`]'s. A call that met a key its
//! master does not serve (a slot moved) decided nothing: the request is decided again
//! by hash slot ([`super::misroute`]).
//!
//! Every group call is bounded by the request's deadline and made under the breaker
//! of the master serving its slot ([`super::nodes`]): a stalled master fails only
//! the requests with a group on it.

mod detachable;
mod headroom;
mod route;
mod strategy;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;
use redis::cluster_async::ClusterConnection;
use tokio::time::Instant;

use super::misroute;
use super::nodes::Nodes;
use super::paths;
use super::scripts::{Engine, Reply, WireOp};
use super::slot_batch::{MasterBatchers, SlotBatchers};
use crate::algorithm::Decision;
use crate::metrics::Metrics;
use crate::store::breaker::BreakerOptions;
use crate::store::{CounterOp, NodePing, StoreError};

use self::headroom::Headroom;
use self::route::{Group, Route};
pub use self::strategy::{CrossSlotPaths, RACE_SHADOW};
use self::strategy::{Path, PathCounters, Shadow};
pub use super::keys::slot_of;

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
    /// One queue per master: concurrent groups on a master share a call.
    masters: Arc<MasterBatchers>,
    /// One queue per slot, for the groups decided by slot (see [`route`]).
    batchers: Arc<SlotBatchers>,
    /// What the last replies said each counter still admits (bounded): whether a
    /// request may race.
    headroom: Arc<Headroom>,
    /// Which way multi-group requests went.
    paths: PathCounters,
    /// When this process last lost a race: a denial soon after gets a second look.
    shadow: Shadow,
    /// Whether groups are formed per master (the any-slot script loaded), or per
    /// slot only.
    by_master: bool,
    /// Whether every master that answered the last readiness probe also answered on
    /// the connection its calls take ([`Cluster::check_paths`]).
    paths_ready: AtomicBool,
}

impl Cluster {
    /// The cluster path over `connection`, with a breaker of `breaker` options per
    /// master (their states, failures and abandoned refunds go to `metrics`); groups
    /// per master when `by_master`, else per slot.
    pub async fn start(
        connection: ClusterConnection,
        by_master: bool,
        (timeout, functions): (Duration, Engine),
        breaker: BreakerOptions,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        let abandoned = metrics
            .as_ref()
            .map(|m| m.refunds_abandoned())
            .unwrap_or_default();
        let nodes = Nodes::start(connection.clone(), breaker, metrics).await;
        Self {
            masters: Arc::new(MasterBatchers::new(
                connection.clone(),
                timeout,
                functions.clone(),
            )),
            batchers: Arc::new(SlotBatchers::new(connection.clone(), timeout, functions)),
            connection,
            timeout,
            abandoned,
            nodes,
            headroom: Arc::new(Headroom::default()),
            paths: PathCounters::default(),
            shadow: Shadow::default(),
            by_master,
            paths_ready: AtomicBool::new(true),
        }
    }

    /// `pings` (each master on the probe's own connection), failed where the master
    /// does not answer on the connection its calls take (`slot_batch.rs`'s
    /// [`MasterBatchers::check`]). A master that answers there has its breaker
    /// closed: SERVING then means its requests go to it. A master down on both
    /// counts as down, as before; one that answers the probe but not the calls'
    /// connection keeps the store from being ready ([`Cluster::paths_ready`]).
    pub async fn check_paths(&self, pings: Vec<NodePing>) -> Vec<NodePing> {
        let checked = join_all(pings.into_iter().map(|ping| async move {
            if ping.result.is_err() {
                return (ping, true);
            }
            let master: Arc<str> = Arc::from(ping.node.as_str());
            match self.masters.check(&master).await {
                Ok(()) => {
                    self.nodes.answered(&ping.node);
                    (ping, true)
                }
                Err(error) => {
                    let node = ping.node;
                    let result = Err(paths::on_path(error));
                    (NodePing { node, result }, false)
                }
            }
        }))
        .await;
        let ready = checked.iter().all(|(_, ready)| *ready);
        self.paths_ready.store(ready, Ordering::Relaxed);
        checked.into_iter().map(|(ping, _)| ping).collect()
    }

    /// See [`Cluster::check_paths`].
    pub fn paths_ready(&self) -> bool {
        self.paths_ready.load(Ordering::Relaxed)
    }

    /// Which way the multi-group requests went so far (see [`strategy`]).
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
        let groups = route::group(keys, Some(&*self.nodes).filter(|_| self.by_master));
        match self
            .decide_groups(keys, ops, &groups, dry_run, deadline)
            .await
        {
            // Nothing written by the misrouted call, and what other groups consumed
            // was refunded: decided again, by slot, where redis-rs follows MOVED and
            // ASK. The map is asked for again, so the next requests go right.
            Err(e) if misroute::is(&e) => {
                self.paths.count(Path::Misrouted);
                self.nodes.refresh_soon();
                let groups = route::group(keys, None);
                self.decide_groups(keys, ops, &groups, dry_run, deadline)
                    .await
            }
            other => other,
        }
    }

    /// The call deciding the operations of `group` (of `ops`) in its master's (or
    /// slot's) shared call, by `deadline`, under the breaker of the group's master; a
    /// future that owns all it needs, so that it can run on after its request is gone
    /// (the parallel acquisition's task). A misrouted call's error is not charged to
    /// the master: the master is fine, the map was stale.
    ///
    /// Boxed: the future holds the breaker's layers and the queue's (about 3 KB), and
    /// every future that awaits one inline grows by as much, up to the request's
    /// whole store future, even on paths that never make the call (the walk's). A
    /// future is moved by copying it: the request's groups into their `join_all`,
    /// each caller's future into the next layer's box, and those copies showed as
    /// `memmove` under `race`, `join_all` and the store's `Box::pin`: two allocations
    /// per group (this and `call` below) cost less (BENCHMARKS.md, "Instructions per
    /// request of `tollgate serve`").
    fn group_call(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        group: &Group,
        dry_run: bool,
        deadline: Instant,
    ) -> GroupCall {
        let (route, slot) = (group.route.clone(), group.slot);
        let group_keys: Vec<String> = group.iter().map(|&i| keys[i].clone()).collect();
        let group_ops: Vec<WireOp> = group.iter().map(|&i| WireOp::new(&ops[i])).collect();
        let (masters, batchers, nodes, timeout) = (
            Arc::clone(&self.masters),
            Arc::clone(&self.batchers),
            Arc::clone(&self.nodes),
            self.timeout,
        );
        Box::pin(async move {
            if group_keys.is_empty() {
                return Ok(Vec::new());
            }
            // A group queued with its request's whole budget left (its only group,
            // the check, the groups taken at once) needs no timer of its own: its slot
            // queue answers it within the store's timeout of now (each call is given
            // up at the earliest deadline it carries, and every call ahead of it was
            // queued earlier), so at most QUEUE_SLACK past `deadline` (or later by as
            // long as the thread is pre-empted between taking its deadline and
            // queueing, as a timer fires late on a loaded machine). A walk's later
            // group, queued after earlier groups spent part of the budget, keeps one.
            // Its deadline is not handed to the queue: a shared call would be cut
            // short at it for every request in it. (A timer per group would be one
            // more registration and wake-up for each group of every request.)
            let bounded =
                deadline.saturating_duration_since(Instant::now()) + QUEUE_SLACK >= timeout;
            // Boxed for the same reason: each of the breaker's layers below holds it.
            let call = Box::pin(async move {
                let decided = match route {
                    Route::Master(master) => {
                        masters
                            .decide(&master, group_keys, group_ops, dry_run)
                            .await
                    }
                    Route::Slot(slot) => {
                        batchers.decide(slot, group_keys, group_ops, dry_run).await
                    }
                };
                match decided {
                    Err(e) if misroute::is(&e) => Ok(Err(e)),
                    other => other.map(Ok),
                }
            });
            // All groups of a request share `deadline`: a group left with less than a
            // fair share because an earlier one waited on a slow master is failed
            // without charging its own master's breaker (issue: one slow master opened
            // a healthy one's breaker). A healthy master answers in a few ms even
            // busy; a quarter of the store's timeout is a trial it should pass.
            let fair = timeout / FAIR_SHARE;
            nodes
                .call(slot, (deadline, bounded), fair, timeout, call)
                .await
                .and_then(|decided| decided)
        })
    }
}

/// One group's call ([`Cluster::group_call`]): owns all it needs, so it can run on
/// after its request is gone.
type GroupCall = Pin<Box<dyn Future<Output = Result<Vec<Reply>, StoreError>> + Send + 'static>>;
