//! Which backend holds the counters, chosen once from the settings: the memory
//! store, or Redis (standalone, Sentinel or Cluster, as [`RedisOptions::target`]
//! says). `stack::build` builds the server's store from it, `serve` asks it whether
//! readiness follows the store ([`Backend::probed`]) and `tollgate inspect` takes
//! the Redis options from it (it reads Redis only, and refuses the memory store). A new backend is a variant here, its store (a [`super::Store`]
//! that passes `tests/it/store_contract.rs`) and its arm in `stack::build`.

use super::redis::connect::{RedisOptions, RedisTarget};

/// Where the counters live.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// In this process: limits per replica, within `max_bytes` (`--memory-store-bytes`).
    Memory { max_bytes: u64 },
    /// Redis, shared by every replica (boxed: the options are most of the size).
    Redis {
        options: Box<RedisOptions>,
        /// Whether an unreachable Redis makes the server NOT_SERVING
        /// (`REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, true by default).
        health_check: bool,
    },
}

impl Backend {
    /// The Redis connection settings; `None` for the memory store.
    pub fn redis(&self) -> Option<&RedisOptions> {
        match self {
            Backend::Redis { options, .. } => Some(options.as_ref()),
            Backend::Memory { .. } => None,
        }
    }

    /// Whether readiness follows the store's answers to `Store::ping`: the memory
    /// store always answers, so only a remote store that was not told otherwise.
    pub fn probed(&self) -> bool {
        match self {
            Backend::Redis { health_check, .. } => *health_check,
            Backend::Memory { .. } => false,
        }
    }

    /// Its kind in logs: `memory`, `standalone`, `sentinel` or `cluster`.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Memory { .. } => "memory",
            Backend::Redis { options, .. } => match options.target {
                RedisTarget::Standalone(_) => "standalone",
                RedisTarget::Sentinel { .. } => "sentinel",
                RedisTarget::Cluster(_) => "cluster",
            },
        }
    }
}
