//! The store a server runs on: Redis (standalone or cluster) behind the circuit
//! breaker and the local over-limit cache, or the in-memory store when no Redis is
//! configured. The order matters: the cache answers known denials before anything
//! else; the breaker sees only calls that really go to Redis. With metrics, the
//! calls that pass the cache are timed and counted ([`Metered`]) on their way to the
//! breaker (the memory store is metered too).

use std::sync::Arc;

use super::breaker::{Breaker, BreakerOptions};
use super::cache::OverLimitCache;
use super::memory::MemoryStore;
use super::metered::Metered;
use super::redis::RedisStore;
use super::redis::connect::RedisOptions;
use super::{Store, StoreError};
use crate::metrics::Metrics;

/// The server's store; with `metrics`, every call that reaches the backend is recorded.
pub async fn build(
    redis: Option<&RedisOptions>,
    breaker: BreakerOptions,
    local_cache_bytes: u64,
    metrics: Option<&Arc<Metrics>>,
) -> Result<Arc<dyn Store>, StoreError> {
    let Some(options) = redis else {
        tracing::warn!(
            "no Redis configured: using the in-memory store, so every limit is counted per process; \
             with N replicas a client may get up to N times its limit"
        );
        return Ok(match metrics {
            Some(metrics) => Arc::new(Metered::new(MemoryStore::new(), metrics.clone())),
            None => Arc::new(MemoryStore::new()),
        });
    };
    let redis = RedisStore::connect(options).await?;
    tracing::info!(redis = ?options, local_cache_bytes, ?breaker, "connected to Redis");
    let protected = Breaker::new(redis, breaker).with_metrics(metrics);
    match metrics {
        Some(metrics) => Ok(cached(
            Metered::new(protected, metrics.clone()),
            local_cache_bytes,
        )),
        None => Ok(cached(protected, local_cache_bytes)),
    }
}

/// `store` behind the over-limit cache, unless its budget is 0.
fn cached<S: Store>(store: S, local_cache_bytes: u64) -> Arc<dyn Store> {
    if local_cache_bytes == 0 {
        return Arc::new(store);
    }
    Arc::new(OverLimitCache::new(store, local_cache_bytes))
}
