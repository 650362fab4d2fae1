//! The batcher's way back after a lost connection: while the store is marked down,
//! one task PINGs through the same connection (which makes redis-rs reconnect) until
//! Redis answers, then lets requests through again. Requests never wait on it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::Health;
use crate::store::StoreError;

/// Bound on one recovery PING (it includes redis-rs' reconnection attempts).
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// The first pause between failed PINGs; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Whether `error` says the connection itself is gone: refused, reset, closed, or
/// any I/O failure, as opposed to a slow Redis or an error reply to this one call.
pub(super) fn connection_lost(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
}

/// Marks the store down and starts the recovery task, unless it is down already.
pub(super) fn mark_down<C>(health: &Arc<Health>, connection: &C, error: &StoreError)
where
    C: ConnectionLike + Clone + Send + 'static,
{
    if health.down.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        event = "redis_connection_lost",
        %error,
        "lost the connection to Redis: requests are answered by failure_mode at once until it answers a PING again"
    );
    tokio::spawn(recover(connection.clone(), Arc::downgrade(health)));
}

/// PINGs until Redis answers, then clears the mark; ends early when the batcher is
/// gone (only it holds the health strongly besides the queue's task).
async fn recover<C: ConnectionLike>(mut connection: C, health: Weak<Health>) {
    let mut wait = RETRY_FIRST;
    let mut attempts: u64 = 0;
    loop {
        attempts += 1;
        let ping = redis::cmd("PING");
        let answered = matches!(
            tokio::time::timeout(PING_TIMEOUT, ping.query_async::<()>(&mut connection)).await,
            Ok(Ok(()))
        );
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
