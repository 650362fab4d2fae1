//! Refunds on the cluster path: giving back what the slot groups a request already
//! consumed took, when a later group denied it or failed. [`RefundGuard`] holds the
//! refunds while a request walks its groups, or while a parallel acquisition's answer
//! waits for its request; settled or dropped, it sends them from a task of its own,
//! so neither the request's deadline nor a dropped request future can lose them.
//!
//! The bound, stated: a refund is retried (up to [`ATTEMPTS`] calls, each within the
//! store timeout) only after errors that prove the script did not run (connection
//! refused, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, LOADING). A refund whose call timed out
//! or broke mid-flight is not resent, because it may have run, and refunding twice
//! would let a counter admit more than its limit; it is logged (rate-limited) and
//! counted instead. Such a counter stays high by at most the request's cost until its
//! window or bucket moves on: under-admission, the safe direction. The same holds for
//! the group whose own call timed out: it may have consumed, and nothing names it.

use std::time::Duration;

use futures_util::future::join_all;
use prometheus_client::metrics::counter::Counter;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::time::{Instant, timeout, timeout_at};

use super::connect::describe;
use super::keys::slot_of;
use super::scripts::{self, Refund, Reply, WireOp};
use crate::store::CounterOp;
use crate::telemetry::ratelimited;

/// Refund calls per slot group at most (the first and two retries).
pub const ATTEMPTS: u32 = 3;

/// Pause before a retry, times the attempt number: a shard that refused a connection
/// or is failing over needs a moment, and the whole sequence stays within tens of ms.
const BACKOFF: Duration = Duration::from_millis(5);

/// The refunds a request owes while it walks its groups (one `Vec` per slot group).
pub struct RefundGuard {
    connection: ClusterConnection,
    attempt_timeout: Duration,
    abandoned: Counter,
    owed: Vec<Vec<Refund>>,
}

impl RefundGuard {
    pub fn new(
        connection: ClusterConnection,
        attempt_timeout: Duration,
        abandoned: Counter,
    ) -> Self {
        Self {
            connection,
            attempt_timeout,
            abandoned,
            owed: Vec::new(),
        }
    }

    /// Records what the group `indices` consumed (its allowed, costed operations).
    pub fn hold(
        &mut self,
        keys: &[String],
        ops: &[CounterOp],
        indices: &[usize],
        replies: &[Option<Reply>],
    ) {
        let group: Vec<Refund> = indices
            .iter()
            .filter_map(|&i| {
                // A charge or a release is never given back: it happened whatever the answer.
                let reply = replies[i]
                    .filter(|r| ops[i].cost > 0 && r.decision.allowed && !ops[i].commits())?;
                Some(Refund {
                    key: keys[i].clone(),
                    op: WireOp::new(&ops[i]),
                    token: reply.token,
                })
            })
            .collect();
        self.owe(group);
    }

    /// Records a group's refunds made elsewhere (by the parallel acquisition's task).
    /// A group of one master spans several slots: its refunds are sent per slot,
    /// each call declaring its keys, so that redis-rs routes each where its slot is now.
    pub fn owe(&mut self, group: Vec<Refund>) {
        let mut by_slot: Vec<(u16, Vec<Refund>)> = Vec::new();
        for refund in group {
            let slot = slot_of(&refund.key);
            match by_slot.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, refunds)) => refunds.push(refund),
                None => by_slot.push((slot, vec![refund])),
            }
        }
        self.owed
            .extend(by_slot.into_iter().map(|(_, refunds)| refunds));
    }

    /// The request was admitted: nothing is owed.
    pub fn disarm(mut self) {
        self.owed.clear();
    }

    /// Sends the refunds and waits for them until `deadline`; past it they carry on
    /// in their task and the request answers on time.
    pub async fn settle(mut self, deadline: Instant) {
        if let Some(task) = self.spawn() {
            let _ = timeout_at(deadline, task).await;
        }
    }

    fn spawn(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        if self.owed.is_empty() {
            return None;
        }
        let owed = std::mem::take(&mut self.owed);
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let connection = self.connection.clone();
        let (attempt_timeout, abandoned) = (self.attempt_timeout, self.abandoned.clone());
        Some(runtime.spawn(async move {
            join_all(
                owed.into_iter().map(|group| {
                    refund_group(connection.clone(), group, attempt_timeout, &abandoned)
                }),
            )
            .await;
        }))
    }
}

impl Drop for RefundGuard {
    /// A request future dropped mid-walk (its caller gave up) still owes its refunds.
    fn drop(&mut self) {
        self.spawn();
    }
}

/// One slot group's refund call, retried while the errors say it did not run.
async fn refund_group(
    mut connection: ClusterConnection,
    group: Vec<Refund>,
    attempt_timeout: Duration,
    abandoned: &Counter,
) {
    let refs: Vec<&Refund> = group.iter().collect();
    let cmd = scripts::refund_cmd(&refs, None);
    let mut attempt = 1;
    let failure = loop {
        let call = scripts::evalsha::<_, i64>(&mut connection, &cmd, &scripts::REFUND);
        match timeout(attempt_timeout, call).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) if attempt < ATTEMPTS && did_not_run(&e) => {
                tokio::time::sleep(BACKOFF * attempt).await;
                attempt += 1;
            }
            Ok(Err(e)) => break describe(&e),
            Err(_) => break format!("timed out after {attempt_timeout:?}"),
        }
    };
    abandoned.inc_by(group.len() as u64);
    if let Some(suppressed) = ratelimited::admit(&["refund_abandoned"]) {
        tracing::warn!(
            event = "refund_abandoned",
            error = %failure,
            attempts = attempt,
            suppressed,
            "a refund could not be given back: its counters stay high (under-admit) until their windows end"
        );
    }
}

/// Whether `e` proves the script never ran, so sending it again cannot refund twice.
fn did_not_run(e: &RedisError) -> bool {
    e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
            )
        )
}
