//! The store a server runs on, built from its [`Backend`]: Redis (standalone,
//! Sentinel or Cluster) behind the circuit breaker and the local over-limit cache, or
//! the in-memory store. The order matters: the cache answers known denials before
//! anything else; the breaker sees only calls that really go to Redis. A cluster has
//! one breaker per master inside the store (`redis/nodes.rs`) and none around it, so
//! one stalled master cannot open a breaker for every request. With metrics, the
//! calls that pass the cache are timed and counted ([`Metered`]) on their way to the
//! breaker (the memory store is metered too). Redis need not be up at start-up: the
//! Redis store then fails fast until its background connector reaches it.

use std::sync::Arc;

use super::backend::Backend;
use super::breaker::{Breaker, BreakerOptions};
use super::cache::OverLimitCache;
use super::memory::MemoryStore;
use super::metered::Metered;
use super::redis::RedisStore;
use super::redis::connect::{RedisOptions, RedisTarget, redact};
use super::{Store, StoreError};
use crate::metrics::Metrics;
use crate::telemetry::Json;

/// The server's store on `backend`; with `metrics`, every call that reaches the
/// backend is recorded. `breaker` and `local_cache_bytes` protect a remote backend.
pub async fn build(
    backend: &Backend,
    breaker: BreakerOptions,
    local_cache_bytes: u64,
    metrics: Option<&Arc<Metrics>>,
) -> Result<Arc<dyn Store>, StoreError> {
    match backend {
        Backend::Memory { max_bytes } => Ok(memory(*max_bytes, metrics)),
        // Boxed: the Redis start-up future nests deep enough that, inlined into
        // `serve`'s, its layout overflowed the compiler's query depth.
        Backend::Redis { options, .. } => {
            Box::pin(redis(
                options,
                backend.kind(),
                breaker,
                local_cache_bytes,
                metrics,
            ))
            .await
        }
    }
}

fn memory(max_bytes: u64, metrics: Option<&Arc<Metrics>>) -> Arc<dyn Store> {
    tracing::warn!(
        event = "memory_store",
        "no Redis configured: using the in-memory store, so every limit is counted per process; \
         with N replicas a client may get up to N times its limit"
    );
    let evictions = metrics.map(|m| m.memory_store_evictions("memory"));
    let memory = MemoryStore::bounded(max_bytes, "memory", evictions);
    match metrics {
        Some(metrics) => Arc::new(Metered::new(memory, metrics.clone())),
        None => Arc::new(memory),
    }
}

async fn redis(
    options: &RedisOptions,
    kind: &'static str,
    breaker: BreakerOptions,
    local_cache_bytes: u64,
    metrics: Option<&Arc<Metrics>>,
) -> Result<Arc<dyn Store>, StoreError> {
    // Redis away at start-up is not an error: the store fails fast and keeps
    // connecting, so a pod started during an outage serves by failure_mode instead of
    // crash-looping. Only settings no retry can fix stop the start.
    let redis = RedisStore::start(options, breaker, metrics).await?;
    // The cache keeps only denials no refund can undo (store/cache.rs): on a cluster
    // no denial is known to be final, so there is nothing it may keep.
    let local_cache_bytes = if redis.refunds() {
        0
    } else {
        local_cache_bytes
    };
    if redis.is_connected() {
        log_connected(options, kind, breaker, local_cache_bytes);
    }
    if redis.breaks_per_node() {
        return Ok(metered(redis, metrics, local_cache_bytes));
    }
    let protected = Breaker::new(redis, breaker).with_metrics(metrics);
    Ok(metered(protected, metrics, local_cache_bytes))
}

/// `store` metered (with metrics) and behind the cache (with a budget).
fn metered<S: Store>(
    store: S,
    metrics: Option<&Arc<Metrics>>,
    local_cache_bytes: u64,
) -> Arc<dyn Store> {
    match metrics {
        Some(metrics) => cached(Metered::new(store, metrics.clone()), local_cache_bytes),
        None => cached(store, local_cache_bytes),
    }
}

/// One field per fact, so JSON logs carry values rather than a Debug dump; the
/// addresses never carry credentials.
fn log_connected(
    options: &RedisOptions,
    kind: &'static str,
    breaker: BreakerOptions,
    local_cache_bytes: u64,
) {
    let (addresses, master) = match &options.target {
        RedisTarget::Standalone(url) => (vec![redact(url)], None),
        RedisTarget::Cluster(urls) => (urls.iter().map(|u| redact(u)).collect(), None),
        RedisTarget::Sentinel {
            master, sentinels, ..
        } => (
            sentinels.iter().map(|u| redact(u)).collect(),
            Some(master.as_str()),
        ),
    };
    tracing::info!(
        event = "redis_connected",
        redis_type = kind,
        addresses = %Json(&addresses),
        sentinel_master = master,
        key_prefix = %options.key_prefix,
        timeout_ms = options.timeout.as_millis() as u64,
        connect_timeout_ms = options.connect_timeout.as_millis() as u64,
        tls_files = options.tls.ca_cert.is_some() || options.tls.client_cert.is_some(),
        local_cache_bytes,
        breaker_failures_to_open = breaker.failures_to_open,
        breaker_open_for_ms = breaker.open_for.as_millis() as u64,
        "connected to Redis"
    );
}

/// `store` behind the over-limit cache, unless its budget is 0.
fn cached<S: Store>(store: S, local_cache_bytes: u64) -> Arc<dyn Store> {
    if local_cache_bytes == 0 {
        return Arc::new(store);
    }
    Arc::new(OverLimitCache::new(store, local_cache_bytes))
}
