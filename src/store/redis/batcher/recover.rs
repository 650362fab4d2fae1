//! The state of the connection the batcher's calls take, and its way back: while the
//! store is marked down, one task PINGs through that connection (which makes redis-rs
//! reconnect) until Redis answers, then lets requests through again. Requests never
//! wait on it.
//!
//! Readiness asks the same connection ([`check`]), not only a connection of its own:
//! a connection that died while nothing was sent on it (Redis restarted in a quiet
//! moment) looks fine until a call meets it, and the first calls after SERVING then
//! met a broken pipe and were answered by the failure mode. Asked every probe, a dead
//! connection is found and replaced before traffic meets it, and SERVING waits for it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;

use super::{DOWN, Health};
use crate::store::StoreError;
use crate::store::redis::connect::describe;

/// Bound on one recovery or readiness PING (it includes redis-rs' reconnection
/// attempts).
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// The first pause between failed PINGs; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Sends one PING on the connection the calls take (a clone of it: clones share the
/// connection).
pub(super) type Pinger = Arc<dyn Fn() -> BoxFuture<'static, redis::RedisResult<()>> + Send + Sync>;

/// The [`Pinger`] of `connection`.
pub(super) fn pinger<C>(connection: &C) -> Pinger
where
    C: ConnectionLike + Clone + Send + 'static,
{
    // Behind a lock only to be shared between threads (the connection types need not
    // be `Sync`); it is held for a clone.
    let connection = std::sync::Mutex::new(connection.clone());
    Arc::new(move || {
        let mut connection = connection.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { redis::cmd("PING").query_async::<()>(&mut connection).await })
    })
}

/// Whether `error` says the connection itself is gone: refused, reset, closed, or
/// any I/O failure, as opposed to a slow Redis or an error reply to this one call.
pub(super) fn connection_lost(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
}

/// Marks the store down and starts the recovery task, unless it is down already.
pub(super) fn mark_down(health: &Arc<Health>, ping: &Pinger, error: &StoreError) {
    if health.down.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        event = "redis_connection_lost",
        %error,
        "lost the connection to Redis: requests are answered by failure_mode at once until it answers a PING again"
    );
    tokio::spawn(recover(Arc::clone(ping), Arc::downgrade(health)));
}

/// Readiness's question to the connection the calls take: whether it answers a PING
/// now. A connection found dead is replaced at once (redis-rs reconnects on the
/// failure) and asked once more: a PING is harmless to repeat, and a Redis that came
/// back answers on the new connection. One still lost marks the store down, so
/// requests fail fast and recovery takes over, as after a failed call.
pub(super) async fn check(health: &Arc<Health>, ping: &Pinger) -> Result<(), StoreError> {
    if health.is_down() {
        return Err(StoreError::Unavailable(DOWN.to_owned()));
    }
    let error = match bounded(ping).await {
        Ok(()) => return Ok(()),
        Err(error) => error,
    };
    if !matches!(&error, Asked::Failed(e) if connection_lost(e)) {
        return Err(error.into_store());
    }
    match bounded(ping).await {
        Ok(()) => Ok(()),
        Err(again) => {
            let lost = matches!(&again, Asked::Failed(e) if connection_lost(e));
            let again = again.into_store();
            if lost {
                mark_down(health, ping, &again);
            }
            Err(again)
        }
    }
}

/// What a bounded PING met.
enum Asked {
    Failed(redis::RedisError),
    Late,
}

impl Asked {
    fn into_store(self) -> StoreError {
        match self {
            Asked::Failed(e) => StoreError::Unavailable(describe(&e)),
            Asked::Late => StoreError::Timeout(PING_TIMEOUT),
        }
    }
}

async fn bounded(ping: &Pinger) -> Result<(), Asked> {
    match tokio::time::timeout(PING_TIMEOUT, ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Asked::Failed(e)),
        Err(_) => Err(Asked::Late),
    }
}

/// PINGs until Redis answers, then clears the mark; ends early when the batcher is
/// gone (only it holds the health strongly besides the queue's task).
async fn recover(ping: Pinger, health: Weak<Health>) {
    let mut wait = RETRY_FIRST;
    let mut attempts: u64 = 0;
    loop {
        attempts += 1;
        let answered = bounded(&ping).await.is_ok();
        let Some(health) = health.upgrade() else {
            return;
        };
        if answered {
            health.down.store(false, Ordering::Relaxed);
            tracing::info!(
                event = "redis_connection_restored",
                attempts,
                "Redis answers again: requests go to it"
            );
            return;
        }
        drop(health);
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}
