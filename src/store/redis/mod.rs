//! The Redis store, standalone (direct or through Sentinel) or cluster. A standalone
//! server decides a whole request in one script call, shared with the requests
//! queued beside it (`batcher/`); a cluster splits it by master and acquires the
//! groups at once or in one order (`cluster/`, refunds in `refund.rs`, the fallback to
//! slots in `misroute.rs`), each call under the
//! circuit breaker of the master serving its slot (`nodes.rs`, slot map in
//! `slots.rs`); a standalone store gets one breaker around it (`store/stack.rs`).
//! This module connects, picks the path, bounds each request by the store's timeout
//! and answers readiness probes (node by node, `connect/probe.rs`).
//!
//! A server started while Redis is away still starts ([`RedisStore::start`]): until a
//! background task reaches Redis (retrying with backoff) every call fails at once
//! with [`StoreError::Unavailable`], so each domain's `failure_mode` answers, and
//! readiness probes say the node is down. Settings that can never work (a malformed
//! URL, unreadable TLS files, a bad key prefix, refused credentials) still fail.

mod batcher;
mod cluster;
pub mod connect;
pub mod inspect;
pub mod keys;
mod misroute;
mod nodes;
mod paths;
mod refund;
pub mod scripts;
mod slot_batch;
mod slots;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use self::batcher::Batcher;
use self::cluster::Cluster;
use self::connect::probe::Probe;
use self::connect::{Connection, RedisOptions};
use self::scripts::WireOp;
use super::breaker::BreakerOptions;
use super::{CounterOp, PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::Decision;
use crate::metrics::Metrics;
use crate::telemetry::ratelimited;

pub use cluster::{CrossSlotPaths, RACE_SHADOW, slot_of};
pub use connect::RedisTarget;

/// Bound on one readiness PING.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The background connector's first wait after a failed attempt; it doubles up to
/// [`RETRY_MAX`]. Short, because a pod waiting for Redis serves only fallbacks.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between attempts: Redis is found within about this (plus the
/// connect timeout) of its arrival, and a Redis that stays away costs one attempt
/// every couple of seconds.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Where decisions go: the choice is made once, at connect time, by the server kind.
enum Backend {
    /// No slots to respect: one script decides everything, atomically, so there is
    /// nothing to group, to join or to refund.
    Standalone(Batcher),
    Cluster(Cluster),
}

/// What a cluster's per-master breakers are made with (a standalone store is
/// protected from outside, by one breaker around the whole store).
#[derive(Clone, Default)]
struct Protection {
    breaker: BreakerOptions,
    metrics: Option<Arc<Metrics>>,
}

pub struct RedisStore {
    /// Set once: at start, or by the background connector when Redis arrives. Empty
    /// means not reached yet, and every call fails fast.
    backend: Arc<OnceLock<Backend>>,
    /// The background connector while Redis has not been reached; stopped with the
    /// store.
    connector: Option<tokio::task::AbortHandle>,
    /// Connections of its own for [`Store::ping`] (every master of a cluster), so a
    /// readiness probe never queues behind rate-limit traffic.
    probe: Probe,
    prefix: String,
    timeout: Duration,
    /// A cluster: requests span several calls, so a denial may be refunded.
    cluster: bool,
}

impl RedisStore {
    /// Connects now, or fails: for callers with nothing to fall back on (`inspect`,
    /// tests). The server uses [`RedisStore::start`].
    pub async fn connect(options: &RedisOptions) -> Result<Self, StoreError> {
        keys::check_prefix(&options.key_prefix).map_err(StoreError::Unavailable)?;
        let backend = open(options, &Protection::default())
            .await
            .map_err(StoreError::Unavailable)?;
        Ok(Self::new(options, Arc::new(OnceLock::from(backend)), None))
    }

    /// Connects now if Redis answers; otherwise returns a store that fails every call
    /// at once while a background task keeps connecting (with backoff) and loads the
    /// scripts when it gets through. Errors only for settings no retry can fix.
    /// A cluster's masters each get a breaker of `breaker` options, published to
    /// `metrics`; a standalone store's breaker is the caller's (see [`Self::breaks_per_node`]).
    pub async fn start(
        options: &RedisOptions,
        breaker: BreakerOptions,
        metrics: Option<&Arc<Metrics>>,
    ) -> Result<Self, StoreError> {
        keys::check_prefix(&options.key_prefix).map_err(StoreError::Unavailable)?;
        connect::check(options).map_err(StoreError::Unavailable)?;
        let protection = Protection {
            breaker,
            metrics: metrics.cloned(),
        };
        let error = match open(options, &protection).await {
            Ok(backend) => return Ok(Self::new(options, Arc::new(OnceLock::from(backend)), None)),
            Err(error) if connect::refused_by_settings(&error) => {
                return Err(StoreError::Unavailable(error));
            }
            Err(error) => error,
        };
        tracing::warn!(
            event = "redis_unreachable_at_start",
            error = %error,
            "Redis is not reachable: serving by each domain's failure_mode and connecting in the background"
        );
        let cell = Arc::new(OnceLock::new());
        let connector = tokio::spawn(keep_connecting(options.clone(), protection, cell.clone()));
        Ok(Self::new(options, cell, Some(connector.abort_handle())))
    }

    /// Whether Redis has been reached (the scripts are loaded and calls go to it).
    pub fn is_connected(&self) -> bool {
        self.backend.get().is_some()
    }

    fn new(
        options: &RedisOptions,
        backend: Arc<OnceLock<Backend>>,
        connector: Option<tokio::task::AbortHandle>,
    ) -> Self {
        let mut probe_options = options.clone();
        // A PING is tiny, but the request budget (tens of ms) is no bound for a probe.
        probe_options.timeout = PROBE_TIMEOUT;
        probe_options.connect_timeout = options.connect_timeout.min(PROBE_TIMEOUT * 5);
        Self {
            backend,
            connector,
            probe: Probe::new(probe_options, PROBE_TIMEOUT),
            prefix: options.key_prefix.clone(),
            timeout: options.timeout,
            cluster: matches!(options.target, RedisTarget::Cluster(_)),
        }
    }

    /// Whether a denial can later be undone by a refund (another request giving back
    /// what it consumed): only on a cluster, where a request spans several calls. The
    /// over-limit cache must not keep such denials (`store/stack.rs`).
    pub fn refunds(&self) -> bool {
        // Known from the settings, so also before Redis is first reached.
        self.cluster
    }

    /// Whether each node has a circuit breaker of its own inside the store (a
    /// cluster's masters), so no breaker may wrap the whole store: one stalled master
    /// would open it for every request.
    pub fn breaks_per_node(&self) -> bool {
        self.cluster
    }

    /// Refunded operations given up on so far (cluster only; see `refund.rs`).
    pub fn refunds_abandoned(&self) -> u64 {
        match self.backend.get() {
            Some(Backend::Cluster(cluster)) => cluster.refunds_abandoned(),
            _ => 0,
        }
    }

    /// Which way multi-slot requests went (cluster only; see `cluster/strategy/`).
    pub fn cross_slot_paths(&self) -> CrossSlotPaths {
        match self.backend.get() {
            Some(Backend::Cluster(cluster)) => cluster.cross_slot_paths(),
            _ => CrossSlotPaths::default(),
        }
    }

    async fn within_timeout(
        &self,
        ops: &[CounterOp],
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let keys: Vec<String> = ops
            .iter()
            .map(|op| keys::encode(&self.prefix, &op.key))
            .collect();
        // Before Redis is first reached there is nothing to wait for: failing at once
        // lets the failure_mode answer instead of a timeout per request.
        let Some(backend) = self.backend.get() else {
            return Err(StoreError::Unavailable(NOT_CONNECTED.to_owned()));
        };
        match backend {
            // The batcher keeps each request's deadline itself (one timer per call,
            // not one per request).
            Backend::Standalone(batcher) => {
                let wire = ops.iter().map(WireOp::new).collect();
                let replies = batcher.decide(keys, wire, dry_run).await?;
                Ok(replies.into_iter().map(|r| r.decision).collect())
            }
            // The cluster applies the deadline call by call itself: cut short from
            // outside, a walk could not refund what it had already consumed. Boxed:
            // inline, its future (about 2 KB) made this one as big, on the standalone
            // path too, which is otherwise about 100 bytes.
            Backend::Cluster(cluster) => {
                let deadline = tokio::time::Instant::now() + self.timeout;
                Box::pin(cluster.decide(&keys, ops, dry_run, deadline)).await
            }
        }
    }
}

const NOT_CONNECTED: &str = "not connected to Redis yet (connecting in the background)";

impl Drop for RedisStore {
    fn drop(&mut self) {
        if let Some(connector) = &self.connector {
            connector.abort();
        }
    }
}

/// Connects, loads the scripts everywhere and picks the path by the server kind.
async fn open(options: &RedisOptions, protection: &Protection) -> Result<Backend, String> {
    let mut connection = connect::connect(options).await?;
    // Load the scripts everywhere now (on a cluster SCRIPT LOAD reaches every node),
    // so the first burst of traffic does not meet NOSCRIPT all at once and resend
    // every body within its request's timeout.
    let load = async {
        for script in [&*scripts::BATCH, &*scripts::REFUND] {
            script.load_async(&mut connection).await?;
        }
        Ok::<(), redis::RedisError>(())
    };
    tokio::time::timeout(options.connect_timeout, load)
        .await
        .map_err(|_| "loading the scripts timed out".to_owned())?
        .map_err(|e| format!("cannot load the scripts: {}", connect::describe(&e)))?;
    // And the library (FCALL, `scripts/library.rs`), without failing: a Redis before 7
    // refuses it, and the calls go by EVALSHA.
    let functions = scripts::Engine::new(options.state_layout);
    let library = functions.load(&mut connection);
    match tokio::time::timeout(options.connect_timeout, library).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %connect::describe(&e), "the function library does not load (Redis before 7?): batch calls go by EVALSHA");
        }
        Err(_) => {
            tracing::warn!("loading the function library timed out: batch calls go by EVALSHA")
        }
    }
    Ok(match connection {
        Connection::Cluster(mut c) => Backend::Cluster({
            // The any-slot script too, but without failing: a Redis before 7 cannot
            // compile it, and every call then goes by slot, as before per-master
            // batching (`cluster/route.rs`).
            let load = scripts::BATCH_ANY_SLOT.load_async(&mut c);
            let by_master = match tokio::time::timeout(options.connect_timeout, load).await {
                Ok(Err(e)) => {
                    tracing::warn!(error = %connect::describe(&e), "the any-slot batch script does not load (Redis before 7?): every call goes by hash slot");
                    false
                }
                // Loaded, or no answer in time: the calls will tell (`misroute.rs`).
                _ => true,
            };
            Cluster::start(
                c,
                by_master,
                (options.timeout, functions),
                protection.breaker,
                protection.metrics.clone(),
            )
            .await
        }),
        standalone => Backend::Standalone(Batcher::start(standalone, options.timeout, functions)),
    })
}

/// The background connector: tries until Redis answers, waiting a little longer
/// after each failure (with jitter, so replicas started together spread out), then
/// hands the backend to the store and ends. Failures are logged at most once a
/// second, with how many were not.
async fn keep_connecting(
    options: RedisOptions,
    protection: Protection,
    cell: Arc<OnceLock<Backend>>,
) {
    let mut wait = RETRY_FIRST;
    let mut attempts: u64 = 1;
    loop {
        let jitter = wait.mul_f64(fastrand::f64() * 0.2);
        tokio::time::sleep(wait + jitter).await;
        attempts += 1;
        match open(&options, &protection).await {
            Ok(backend) => {
                let _ = cell.set(backend);
                tracing::info!(
                    event = "redis_connected",
                    attempts,
                    "connected to Redis after start-up; the scripts are loaded"
                );
                return;
            }
            Err(error) => {
                if let Some(suppressed) = ratelimited::admit(&["redis_connect"]) {
                    tracing::warn!(
                        event = "redis_connect_failed",
                        error = %error,
                        attempts,
                        suppressed,
                        "still cannot reach Redis; retrying"
                    );
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

impl Store for RedisStore {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.within_timeout(ops, false))
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        Box::pin(self.within_timeout(ops, true))
    }

    /// Each node on the probe's connection, and on the connection requests take
    /// (see [`paths`]): a node answers only when both do.
    fn ping(&self) -> PingFuture<'_> {
        Box::pin(async {
            let pings = self.probe.ping().await;
            match self.backend.get() {
                None => pings,
                Some(Backend::Standalone(batcher)) => paths::standalone(batcher, pings).await,
                Some(Backend::Cluster(cluster)) => cluster.check_paths(pings).await,
            }
        })
    }

    /// Connected, and the connections requests take usable: (standalone) the
    /// batcher's not known lost; (cluster) every master that answers its probe
    /// answered on the data connection at the last probe.
    fn ready(&self) -> bool {
        match self.backend.get() {
            None => false,
            Some(Backend::Standalone(batcher)) => !batcher.is_down(),
            Some(Backend::Cluster(cluster)) => cluster.paths_ready(),
        }
    }
}
