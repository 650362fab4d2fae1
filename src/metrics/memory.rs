//! The memory store's bound: `tollgate_memory_store_evictions_total{store}`, the
//! counters evicted because the store reached its byte budget (`store="memory"` for
//! the server's store, `"fallback"` for the `failure_mode: local` one). Counted when
//! an eviction happens, never per request.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

type StoreLabel = [(&'static str, &'static str); 1];

/// One store's eviction counter: the store keeps it and adds one per eviction.
#[derive(Debug, Clone, Default)]
pub struct EvictionCounter(Counter);

impl EvictionCounter {
    pub fn inc(&self) {
        self.0.inc();
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

pub(super) struct MemoryMetrics {
    evictions: Family<StoreLabel, Counter>,
}

impl MemoryMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let evictions = Family::default();
        registry.register(
            "tollgate_memory_store_evictions",
            "Counters evicted (least recently used first) because the memory store reached \
             --memory-store-bytes; an evicted counter starts again from zero",
            evictions.clone(),
        );
        Self { evictions }
    }
}

impl Metrics {
    /// The eviction counter of the memory store named `store`.
    pub fn memory_store_evictions(&self, store: &'static str) -> EvictionCounter {
        EvictionCounter(
            self.memory
                .evictions
                .get_or_create_owned(&[("store", store)]),
        )
    }
}
