//! The store a server runs on: Redis (standalone or cluster) behind the circuit
//! breaker and the local over-limit cache, or the in-memory store when no Redis is
//! configured. The order matters: the cache answers known denials before anything
//! else; the breaker sees only calls that really go to Redis.

use std::sync::Arc;

use super::breaker::{Breaker, BreakerOptions};
use super::cache::OverLimitCache;
use super::memory::MemoryStore;
use super::redis::RedisStore;
use super::redis::connect::RedisOptions;
use super::{Store, StoreError};

pub async fn build(
    redis: Option<&RedisOptions>,
    breaker: BreakerOptions,
    local_cache_bytes: u64,
) -> Result<Arc<dyn Store>, StoreError> {
    let Some(options) = redis else {
        tracing::warn!(
            "no Redis configured: using the in-memory store, so every limit is counted per process; \
             with N replicas a client may get up to N times its limit"
        );
        return Ok(Arc::new(MemoryStore::new()));
    };
    let redis = RedisStore::connect(options).await?;
    tracing::info!(redis = ?options, local_cache_bytes, ?breaker, "connected to Redis");
    let protected = Breaker::new(redis, breaker);
    if local_cache_bytes == 0 {
        return Ok(Arc::new(protected));
    }
    Ok(Arc::new(OverLimitCache::new(protected, local_cache_bytes)))
}
