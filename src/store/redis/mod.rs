//! The Redis store, standalone or cluster. On a cluster a request's counter operations
//! are grouped by hash slot, each group is decided by one atomic script call (groups
//! run concurrently, one round trip per shard), and when any group denies the request
//! the groups that did consume are refunded, so a denied request consumes nothing. A
//! standalone server decides a whole request in one script call, shared with the
//! requests queued beside it (`batcher.rs`).

mod batcher;
pub mod connect;
pub mod keys;
pub mod scripts;

use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ScriptInvocation, ServerErrorKind,
};

use self::batcher::Batcher;
use self::connect::{Connection, RedisOptions};
use self::scripts::{Refund, Reply, Segment, WireOp};
use super::{CounterOp, PingFuture, Store, StoreError, StoreFuture};
use crate::algorithm::Decision;

pub use connect::RedisTarget;

/// Bound on one readiness PING.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct RedisStore {
    connection: Connection,
    /// A connection of its own for [`Store::ping`], opened on first use, so a
    /// readiness probe never queues behind rate-limit traffic.
    probe: tokio::sync::Mutex<Option<Connection>>,
    /// What the probe connects with (its timeouts are the probe's, not a request's).
    probe_options: RedisOptions,
    /// Standalone only: the queue that merges concurrent requests into one call.
    batcher: Option<Batcher>,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    pub async fn connect(options: &RedisOptions) -> Result<Self, StoreError> {
        keys::check_prefix(&options.key_prefix).map_err(StoreError::Unavailable)?;
        let connection = connect::connect(options)
            .await
            .map_err(StoreError::Unavailable)?;
        // Load the scripts everywhere now (on a cluster SCRIPT LOAD reaches every
        // node), so the first burst of traffic does not meet NOSCRIPT all at once and
        // resend every body within its request's timeout.
        let load = async {
            for script in [&*scripts::BATCH, &*scripts::REFUND] {
                match &connection {
                    Connection::Standalone(c) => script.load_async(&mut c.clone()).await?,
                    Connection::Cluster(c) => script.load_async(&mut c.clone()).await?,
                };
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
        let batcher = match &connection {
            Connection::Standalone(c) => Some(Batcher::start(c.clone(), options.timeout)),
            Connection::Cluster(_) => None,
        };
        let mut probe_options = options.clone();
        // A PING is tiny, but the request budget (tens of ms) is no bound for a probe.
        probe_options.timeout = PROBE_TIMEOUT;
        probe_options.connect_timeout = options.connect_timeout.min(PROBE_TIMEOUT * 5);
        Ok(Self {
            connection,
            probe: tokio::sync::Mutex::new(None),
            probe_options,
            batcher,
            prefix: options.key_prefix.clone(),
            timeout: options.timeout,
        })
    }

    async fn invoke<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<T> {
        match &self.connection {
            Connection::Standalone(c) => invocation.invoke_async(&mut c.clone()).await,
            Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }

    /// One batch script call (a cluster's slot group) for the operations `indices` of
    /// `ops`, whose encoded keys are `keys`.
    async fn run_group(
        &self,
        keys: &[String],
        ops: &[CounterOp],
        indices: &[usize],
        dry_run: bool,
    ) -> Result<Vec<Reply>, StoreError> {
        let group_keys: Vec<&str> = indices.iter().map(|&i| keys[i].as_str()).collect();
        let group_ops: Vec<WireOp> = indices.iter().map(|&i| WireOp::new(&ops[i])).collect();
        let cmd = scripts::batch_cmd(
            &[Segment {
                keys: &group_keys,
                ops: &group_ops,
                dry_run,
            }],
            None,
        );
        let values: Vec<i64> = match &self.connection {
            Connection::Standalone(c) => evalsha(&mut c.clone(), &cmd, &scripts::BATCH).await,
            Connection::Cluster(c) => evalsha(&mut c.clone(), &cmd, &scripts::BATCH).await,
        }
        .map_err(|e| StoreError::Unavailable(connect::describe(&e)))?;
        scripts::parse_batch_reply(&values, indices.len()).map_err(StoreError::Unavailable)
    }

    async fn decide_batch(
        &self,
        ops: &[CounterOp],
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        let keys: Vec<String> = ops
            .iter()
            .map(|op| keys::encode(&self.prefix, &op.key))
            .collect();
        // A standalone server has no slots to respect: one script decides everything,
        // atomically, so there is nothing to group, to join or to refund.
        if let Some(batcher) = &self.batcher {
            let wire = ops.iter().map(WireOp::new).collect();
            let replies = batcher.decide(keys, wire, dry_run).await?;
            return Ok(replies.into_iter().map(|r| r.decision).collect());
        }
        let groups = group_by_slot(&keys);
        let results = join_all(
            groups
                .iter()
                .map(|indices| self.run_group(&keys, ops, indices, dry_run)),
        )
        .await;

        // Which groups wrote: a group commits unless one of its vetoing ops was denied.
        let mut replies: Vec<Option<Reply>> = vec![None; ops.len()];
        let mut failure = None;
        let mut vetoed = false;
        let mut committed = Vec::new();
        for (indices, result) in groups.iter().zip(results) {
            match result {
                Ok(group_replies) => {
                    let group_vetoed = dry_run
                        || indices
                            .iter()
                            .zip(&group_replies)
                            .any(|(&i, r)| ops[i].vetoes && !r.decision.allowed);
                    vetoed |= group_vetoed;
                    if !group_vetoed {
                        committed.push(indices);
                    }
                    for (&i, reply) in indices.iter().zip(group_replies) {
                        replies[i] = Some(reply);
                    }
                }
                Err(e) => failure = Some(e),
            }
        }

        if vetoed || failure.is_some() {
            // Give back what the committed groups consumed: the request is not admitted.
            let refunds: Vec<Refund<'_>> = committed
                .iter()
                .flat_map(|indices| indices.iter())
                .filter(|&&i| ops[i].cost > 0 && replies[i].is_some_and(|r| r.decision.allowed))
                .map(|&i| Refund {
                    key: keys[i].clone(),
                    op: &ops[i],
                    token: replies[i].map_or(0, |r| r.token),
                })
                .collect();
            self.refund(refunds).await;
            for &i in committed.iter().flat_map(|indices| indices.iter()) {
                if let Some(reply) = replies[i].as_mut().filter(|r| r.decision.allowed) {
                    reply.decision.remaining = reply
                        .decision
                        .remaining
                        .saturating_add(ops[i].cost)
                        .min(ops[i].params.limit.max(ops[i].params.burst));
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(replies
            .into_iter()
            .map(|r| r.expect("every group replied").decision)
            .collect())
    }

    /// Best effort: a refund that fails leaves a counter briefly high (under-admission),
    /// which is the safe direction; it is logged, not returned.
    async fn refund(&self, refunds: Vec<Refund<'_>>) {
        if refunds.is_empty() {
            return;
        }
        let mut by_slot: Vec<(Slot, Vec<Refund<'_>>)> = Vec::new();
        for refund in refunds {
            let slot = match self.connection {
                Connection::Standalone(_) => Slot::for_key(b"standalone"),
                Connection::Cluster(_) => Slot::for_key(refund.key.as_bytes()),
            };
            match by_slot.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(refund),
                None => by_slot.push((slot, vec![refund])),
            }
        }
        let results = join_all(by_slot.iter().map(|(_, group)| async move {
            let invocation = scripts::refund_invocation(group);
            self.invoke::<i64>(&invocation).await
        }))
        .await;
        for result in results {
            if let Err(e) = result {
                tracing::warn!(error = %connect::describe(&e), "refund failed; a counter stays high until its window ends");
            }
        }
    }
}

/// Sends `cmd` (an EVALSHA of `script`); on NOSCRIPT loads the script with SCRIPT LOAD
/// and sends it once more. The body never travels with EVAL.
async fn evalsha<C: redis::aio::ConnectionLike, T: FromRedisValue>(
    con: &mut C,
    cmd: &Cmd,
    script: &Script,
) -> RedisResult<T> {
    match cmd.query_async(con).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// Indices of `keys` grouped by hash slot, groups in first-seen order and request order
/// within each group (so duplicate counters are decided in request order).
fn group_by_slot(keys: &[String]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

impl RedisStore {
    async fn within_timeout(
        &self,
        ops: &[CounterOp],
        dry_run: bool,
    ) -> Result<Vec<Decision>, StoreError> {
        match tokio::time::timeout(self.timeout, self.decide_batch(ops, dry_run)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
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
        Box::pin(async move {
            let mut probe = self.probe.lock().await;
            if probe.is_none() {
                // The connection reconnects by itself after errors, so it is kept.
                *probe = Some(
                    connect::connect(&self.probe_options)
                        .await
                        .map_err(StoreError::Unavailable)?,
                );
            }
            let Some(connection) = probe.as_ref() else {
                return Err(StoreError::Unavailable("no probe connection".into()));
            };
            let cmd = redis::cmd("PING");
            let reply = match connection {
                Connection::Standalone(c) => {
                    tokio::time::timeout(PROBE_TIMEOUT, cmd.query_async::<()>(&mut c.clone())).await
                }
                Connection::Cluster(c) => {
                    tokio::time::timeout(PROBE_TIMEOUT, cmd.query_async::<()>(&mut c.clone())).await
                }
            };
            match reply {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Unavailable(connect::describe(&e))),
                Err(_) => Err(StoreError::Timeout(PROBE_TIMEOUT)),
            }
        })
    }
}
