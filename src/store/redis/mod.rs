//! The Redis store, standalone (direct or through Sentinel) or cluster. A standalone
//! server decides a whole request in one script call, shared with the requests
//! queued beside it (`batcher.rs`); a cluster splits it by hash slot and acquires the
//! groups in slot order (`cluster.rs`, refunds in `refund.rs`).
//! This module connects, picks the path, bounds each request by the store's timeout
//! and answers readiness probes (node by node, `connect/probe.rs`).

mod batcher;
mod cluster;
pub mod connect;
pub mod inspect;
pub mod keys;
mod refund;
pub mod scripts;

use std::time::Duration;

use self::batcher::Batcher;
use self::cluster::Cluster;
use self::connect::probe::Probe;
use self::connect::{Connection, RedisOptions};
use self::scripts::WireOp;
use super::{CounterOp, PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::Decision;

pub use connect::RedisTarget;

/// Bound on one readiness PING.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where decisions go: the choice is made once, at connect time, by the server kind.
enum Backend {
    /// No slots to respect: one script decides everything, atomically, so there is
    /// nothing to group, to join or to refund.
    Standalone(Batcher),
    Cluster(Cluster),
}

pub struct RedisStore {
    backend: Backend,
    /// Connections of its own for [`Store::ping`] (every master of a cluster), so a
    /// readiness probe never queues behind rate-limit traffic.
    probe: Probe,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    pub async fn connect(options: &RedisOptions) -> Result<Self, StoreError> {
        keys::check_prefix(&options.key_prefix).map_err(StoreError::Unavailable)?;
        let mut connection = connect::connect(options)
            .await
            .map_err(StoreError::Unavailable)?;
        // Load the scripts everywhere now (on a cluster SCRIPT LOAD reaches every
        // node), so the first burst of traffic does not meet NOSCRIPT all at once and
        // resend every body within its request's timeout.
        let load = async {
            for script in [&*scripts::BATCH, &*scripts::REFUND] {
                script.load_async(&mut connection).await?;
            }
            Ok::<(), redis::RedisError>(())
        };
        tokio::time::timeout(options.connect_timeout, load)
            .await
            .map_err(|_| StoreError::Unavailable("loading the scripts timed out".into()))?
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot load the scripts: {}",
                    connect::describe(&e)
                ))
            })?;
        let backend = match connection {
            Connection::Cluster(c) => Backend::Cluster(Cluster::new(c, options.timeout)),
            standalone => Backend::Standalone(Batcher::start(standalone, options.timeout)),
        };
        let mut probe_options = options.clone();
        // A PING is tiny, but the request budget (tens of ms) is no bound for a probe.
        probe_options.timeout = PROBE_TIMEOUT;
        probe_options.connect_timeout = options.connect_timeout.min(PROBE_TIMEOUT * 5);
        Ok(Self {
            backend,
            probe: Probe::new(probe_options, PROBE_TIMEOUT),
            prefix: options.key_prefix.clone(),
            timeout: options.timeout,
        })
    }

    /// Whether a denial can later be undone by a refund (another request giving back
    /// what it consumed): only on a cluster, where a request spans several calls. The
    /// over-limit cache must not keep such denials (`store/stack.rs`).
    pub fn refunds(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    /// Refunded operations given up on so far (cluster only; see `refund.rs`).
    pub fn refunds_abandoned(&self) -> u64 {
        match &self.backend {
            Backend::Cluster(cluster) => cluster.refunds_abandoned(),
            Backend::Standalone(_) => 0,
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
        match &self.backend {
            Backend::Standalone(batcher) => {
                let wire = ops.iter().map(WireOp::new).collect();
                match tokio::time::timeout(self.timeout, batcher.decide(keys, wire, dry_run)).await
                {
                    Ok(replies) => Ok(replies?.into_iter().map(|r| r.decision).collect()),
                    Err(_) => Err(StoreError::Timeout(self.timeout)),
                }
            }
            // The cluster applies the deadline call by call itself: cut short from
            // outside, a walk could not refund what it had already consumed.
            Backend::Cluster(cluster) => {
                let deadline = tokio::time::Instant::now() + self.timeout;
                cluster.decide(&keys, ops, dry_run, deadline).await
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

    fn ping(&self) -> PingFuture<'_> {
        Box::pin(self.probe.ping())
    }
}
