//! Failure isolation per cluster master: every slot group's call is made under the
//! circuit breaker of the master serving its slot, and its failures are counted for
//! that master. One stalled master (SIGSTOP, a long fork, a saturated NIC) then
//! fails only the calls meant for it: after `failures_to_open` of them its breaker
//! opens and those fail at once, while groups on the other masters are decided as
//! usual. A request with a group on that master follows its domain's failure_mode;
//! one whose groups all live elsewhere never notices. (With one breaker for the
//! whole cluster, one stopped master of three would open it and deny every request:
//! `tests/it/node_isolation.rs` stops one.)
//!
//! Which master serves a slot comes from `CLUSTER SLOTS` ([`SlotMap`]), asked when
//! the cluster is reached, every [`REFRESH_EVERY`], and soon after a call fails (at
//! most once per [`REFRESH_GAP`]), since a failure is how a failover shows first.
//! The map only attributes calls: redis-rs still routes them by its own map and
//! follows MOVED and ASK. Between a failover and the next refresh the new master's
//! calls are counted against the old one's breaker; a success there (its half-open
//! probe reaching the new master through redis-rs) closes it again. Slots the map
//! does not know (before the first answer) share one breaker, `unmapped`, published
//! as `node="unmapped"` while the map leaves any slot without a master.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use futures_util::future::select_ok;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::connect::describe;
use super::slot_batch::SLOTS;
use super::slots::SlotMap;
use crate::metrics::Metrics;
use crate::store::StoreError;
use crate::store::breaker::{BreakerOptions, CircuitBreaker};
use crate::telemetry::Json;

/// How often the slot map is asked for while nothing fails: a topology change with
/// no failed call (a planned resharding) is seen within this.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// The shortest time between two refreshes caused by failures: a stalled master
/// fails calls continuously, and one question a second is plenty.
pub const REFRESH_GAP: Duration = Duration::from_secs(1);
/// How often the slot map is asked for while a master's breaker is open: a
/// failover's new map is seen within this (see docs/operations.md).
pub const REFRESH_WHILE_OPEN: Duration = Duration::from_millis(200);
/// Bound on one `CLUSTER SLOTS`: it may be routed to the stalled master itself.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(1);

/// Nodes asked at random on each refresh, besides the known masters.
const RANDOM_ASKS: usize = 3;
const NO_MASTER: &str = "CLUSTER SLOTS listed no master";

/// The breaker of slots the map has no master for.
pub const UNMAPPED: &str = "unmapped";

pub struct Nodes {
    connection: ClusterConnection,
    options: BreakerOptions,
    metrics: Option<Arc<Metrics>>,
    known: RwLock<Known>,
    /// One refresh at a time; and when the last one started, in ms since `epoch`.
    refreshing: AtomicBool,
    last_refresh_ms: AtomicU64,
    epoch: Instant,
}

struct Known {
    map: SlotMap,
    /// Each slot's master, by slot, for routing the any-slot batch calls: looked up
    /// per key, so a table and not the map's search.
    owners: Box<[Option<Arc<str>>]>,
    breakers: HashMap<String, Arc<CircuitBreaker>>,
    unmapped: Arc<CircuitBreaker>,
}

impl Nodes {
    /// Per-master breakers for `connection`, the slot map asked for now (bounded)
    /// and then kept fresh by a task that ends when the returned `Nodes` is dropped.
    pub async fn start(
        connection: ClusterConnection,
        options: BreakerOptions,
        metrics: Option<Arc<Metrics>>,
    ) -> Arc<Self> {
        let nodes = Arc::new(Nodes {
            known: RwLock::new(Known {
                map: SlotMap::default(),
                owners: vec![None; SLOTS].into_boxed_slice(),
                breakers: HashMap::new(),
                unmapped: Arc::new(CircuitBreaker::new(UNMAPPED, options, metrics.as_ref())),
            }),
            connection,
            options,
            metrics,
            refreshing: AtomicBool::new(false),
            last_refresh_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        nodes.refresh().await;
        tokio::spawn(keep_fresh(Arc::downgrade(&nodes)));
        nodes
    }

    /// The breaker of the master serving `slot`.
    pub fn breaker(&self, slot: u16) -> Arc<CircuitBreaker> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known
            .map
            .master_of(slot)
            .and_then(|master| known.breakers.get(master))
            .unwrap_or(&known.unmapped)
            .clone()
    }

    /// `master` answered readiness's questions on the connection its calls take:
    /// its breaker, if open, closes (see [`CircuitBreaker::answered`]).
    pub fn answered(&self, master: &str) {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        if let Some(breaker) = known.breakers.get(master) {
            breaker.answered();
        }
    }

    /// The master serving each of `slots` (`host:port`), as the map knows it.
    pub fn owners(&self, slots: impl IntoIterator<Item = u16>) -> Vec<Option<Arc<str>>> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        slots
            .into_iter()
            .map(|slot| known.owners.get(usize::from(slot)).cloned().flatten())
            .collect()
    }

    /// Runs `call` (one slot group on `slot`) by `deadline` under its master's
    /// breaker (`bounded`: the call ends by about `deadline` itself, within the
    /// caller's slack, and gets no timer); a
    /// failure charged to that master (see [`CircuitBreaker::call_by`]: a timeout after
    /// less than `fair` is not) is counted for it and asks for a fresh slot map soon.
    pub async fn call<T>(
        self: &Arc<Self>,
        slot: u16,
        (deadline, bounded): (tokio::time::Instant, bool),
        fair: Duration,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let breaker = self.breaker(slot);
        let (result, charged) = if bounded {
            breaker.call_within(deadline, fair, timeout, call).await
        } else {
            breaker.call_by(deadline, fair, timeout, call).await
        };
        if let Err(error) = &result
            && charged
        {
            if let Some(metrics) = &self.metrics {
                metrics.node_error(breaker.node(), error.kind());
            }
            // Refused by an open breaker: no new evidence about the topology.
            if !matches!(error, StoreError::CircuitOpen(_)) {
                self.refresh_soon();
            }
        }
        result
    }

    /// Asks for a fresh slot map soon (at most once per [`REFRESH_GAP`]).
    pub fn refresh_soon(self: &Arc<Self>) {
        let now = self.now_ms();
        let last = self.last_refresh_ms.load(Ordering::Relaxed);
        // Claimed here, before spawning, so a burst of failed calls spawns one
        // refresh and not one each (the task stores the time again when it starts).
        if now.saturating_sub(last) < REFRESH_GAP.as_millis() as u64
            || self
                .last_refresh_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let nodes = self.clone();
        tokio::spawn(async move { nodes.refresh().await });
    }

    /// Asks for `CLUSTER SLOTS` and installs the answer; on failure keeps the map it
    /// had (logged at debug: the failing calls are logged already).
    async fn refresh(&self) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        // Cleared however this ends, also when the future is dropped mid-way.
        let _refreshing = Refreshing(&self.refreshing);
        self.last_refresh_ms.store(self.now_ms(), Ordering::Relaxed);
        match self.ask_slots().await {
            Ok(map) => self.install(map),
            Err(error) => tracing::debug!(%error, "CLUSTER SLOTS failed; keeping the slot map"),
        }
    }

    /// `CLUSTER SLOTS` from several nodes at once, the first usable answer: every
    /// known master, plus [`RANDOM_ASKS`] nodes picked by redis-rs (the only way to
    /// reach a node before the first map, and new nodes after it). Asked one node
    /// at a time, a stalled node would hold the map back for [`REFRESH_TIMEOUT`].
    async fn ask_slots(&self) -> Result<SlotMap, String> {
        let mut routes: Vec<SingleNodeRoutingInfo> = {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            known
                .map
                .masters()
                .into_iter()
                .filter_map(|master| {
                    let (host, port) = master.rsplit_once(':')?;
                    Some(SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port: port.parse().ok()?,
                    })
                })
                .collect()
        };
        routes.extend((0..RANDOM_ASKS).map(|_| SingleNodeRoutingInfo::Random));
        let asks = routes.into_iter().map(|route| {
            let mut connection = self.connection.clone();
            Box::pin(async move {
                let ask = redis::cmd("CLUSTER").arg("SLOTS").clone();
                let reply = connection.route_command(ask, RoutingInfo::SingleNode(route));
                match tokio::time::timeout(REFRESH_TIMEOUT, reply).await {
                    Ok(Ok(reply)) => SlotMap::parse(&reply)
                        .and_then(|map| non_empty(map).ok_or_else(|| NO_MASTER.to_owned())),
                    Ok(Err(e)) => Err(describe(&e)),
                    Err(_) => Err(format!("no answer within {REFRESH_TIMEOUT:?}")),
                }
            })
        });
        // Never empty (select_ok panics on none): RANDOM_ASKS is above zero. The last
        // error stands for all of them: they are logged at debug only.
        const { assert!(RANDOM_ASKS > 0) };
        select_ok(asks).await.map(|(map, _)| map)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Installs `map`: a breaker for each new master (closed), the same breaker for a
    /// master still there (its state is the point), none for one that left.
    fn install(&self, map: SlotMap) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        if known.map == map {
            return;
        }
        let masters = map.masters();
        let mut breakers = HashMap::with_capacity(masters.len());
        for &master in &masters {
            let breaker = match known.breakers.remove(master) {
                // The map moved (a failover, a reshard): what opened a master that
                // stayed was the cluster being down, not the master. Probe at once.
                Some(stayed) => {
                    stayed.probe_now();
                    stayed
                }
                None => Arc::new(CircuitBreaker::new(
                    master,
                    self.options,
                    self.metrics.as_ref(),
                )),
            };
            breakers.insert(master.to_owned(), breaker);
        }
        for gone in known.breakers.keys() {
            if let Some(metrics) = &self.metrics {
                metrics.node_gone(gone);
            }
        }
        let mut names: Vec<&str> = breakers.keys().map(String::as_str).collect();
        names.sort_unstable();
        tracing::info!(
            event = "cluster_slot_map",
            masters = %Json(&names),
            "Redis Cluster slot map learnt: one circuit breaker per master"
        );
        known.breakers = breakers;
        let shared: HashMap<&str, Arc<str>> = masters.iter().map(|&m| (m, Arc::from(m))).collect();
        known.owners = (0..SLOTS)
            .map(|slot| {
                let slot = u16::try_from(slot).ok()?;
                map.master_of(slot).and_then(|m| shared.get(m)).cloned()
            })
            .collect();
        known.map = map;
        // A fresh, closed `unmapped` breaker: one left open by failures before this
        // map would stay so (its gauge too) until an unmapped slot is called again.
        // Published only while some slot has no master, so that a healthy cluster
        // shows one breaker per master and nothing else.
        let metrics = self.metrics.as_ref().filter(|_| !known.map.covers_all());
        if metrics.is_none()
            && let Some(all) = &self.metrics
        {
            all.node_gone(UNMAPPED);
        }
        known.unmapped = Arc::new(CircuitBreaker::new(UNMAPPED, self.options, metrics));
    }
}

fn non_empty(map: SlotMap) -> Option<SlotMap> {
    (!map.is_empty()).then_some(map)
}

/// Clears the one-refresh-at-a-time flag when dropped.
struct Refreshing<'a>(&'a AtomicBool);

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Refreshes every [`REFRESH_EVERY`] while the [`Nodes`] lives, and every
/// [`REFRESH_WHILE_OPEN`] while a breaker is open: the map that follows a failover
/// is what lets the breakers of the masters that stayed probe at once.
async fn keep_fresh(nodes: Weak<Nodes>) {
    let mut since = Duration::ZERO;
    loop {
        tokio::time::sleep(REFRESH_WHILE_OPEN).await;
        since += REFRESH_WHILE_OPEN;
        let Some(nodes) = nodes.upgrade() else { return };
        if since >= REFRESH_EVERY || nodes.any_open() {
            since = Duration::ZERO;
            nodes.refresh().await;
        }
    }
}

impl Nodes {
    fn any_open(&self) -> bool {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.breakers.values().any(|b| b.is_open())
    }
}
