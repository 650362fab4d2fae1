//! Envoy's Rate Limit Quota Service (`StreamRateLimitQuotas`): tollgate allocates,
//! Envoy decides. Each Envoy stream reports every bucket's usage periodically; tollgate
//! answers with a token bucket whose rate is that stream's share of the rule's limit,
//! divided by reported demand among every stream of every replica (the [`ledger`]),
//! so no request waits on tollgate.
//!
//! In the order a report meets them: [`service`] (the stream's task, its bounds and
//! end), [`stream`] (one message: validate, observe demand, claim), [`bucket`] (a
//! `BucketId` under the served config, through the same matcher as descriptors),
//! [`ledger`] (each bucket's [`claims`], in memory or Redis), [`share`] (the
//! arithmetic of a share, pure), [`answer`] and [`assign`] (the actions, shaped for
//! Envoy 1.40). [`budget`] bounds the bytes of it all, [`view`] is `/rlqs`.
//! docs/rlqs.md says how to configure Envoy, the bounds kept, and when to prefer this
//! over `ShouldRateLimit`.

mod answer;
pub mod assign;
pub mod bucket;
pub mod budget;
pub mod claims;
pub mod error;
pub mod ledger;
pub mod options;
pub mod service;
pub mod share;
mod state;
mod stream;
pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

pub use self::budget::Budget;
pub use self::error::RlqsError;
pub use self::ledger::Ledger;
pub use self::options::RlqsOptions;
pub use self::service::{CLIENT_ID_HEADER, RlqsGrpc};
use self::state::StreamState;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::store::Backend;
use crate::store::breaker::BreakerOptions;

/// The quota service of one server: the config it reads (the limiter's snapshot), the
/// ledger, its bounds and its live streams.
pub struct Rlqs {
    limiter: Arc<Limiter>,
    ledger: Arc<dyn Ledger>,
    options: RlqsOptions,
    metrics: Arc<Metrics>,
    /// Every stream, bucket and memory-ledger claim is charged here.
    budget: Arc<Budget>,
    /// The Redis key prefix the ledger keys start with (also in memory: one encoding).
    prefix: String,
    /// Names this process's streams apart from other replicas' in a shared ledger.
    replica: String,
    next_stream: AtomicU64,
    streams: Mutex<Streams>,
    /// Set once the server stops: every stream ends.
    shutdown: watch::Sender<bool>,
}

/// The live streams, for `/rlqs` and the bounds.
#[derive(Default)]
struct Streams {
    by_id: BTreeMap<u64, Arc<StreamEntry>>,
    /// Open streams per peer (address and port: one connection).
    per_peer: HashMap<SocketAddr, usize>,
}

/// One live stream: where it comes from and its state (locked briefly by its task,
/// twice a message, and by `/rlqs`).
pub(crate) struct StreamEntry {
    peer: Option<SocketAddr>,
    opened: Instant,
    state: Mutex<StreamState>,
}

impl StreamEntry {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Rlqs {
    /// The service on `ledger`, its state within `options.max_bytes`.
    pub fn new(
        limiter: Arc<Limiter>,
        ledger: Arc<dyn Ledger>,
        options: RlqsOptions,
        prefix: &str,
    ) -> Self {
        let budget = Arc::new(Budget::new(options.max_bytes));
        Self::with_budget(limiter, ledger, budget, options, prefix)
    }

    fn with_budget(
        limiter: Arc<Limiter>,
        ledger: Arc<dyn Ledger>,
        budget: Arc<Budget>,
        options: RlqsOptions,
        prefix: &str,
    ) -> Self {
        let metrics = limiter.metrics().clone();
        Self {
            limiter,
            ledger,
            options,
            metrics,
            budget,
            prefix: prefix.to_owned(),
            replica: format!("{:08x}", fastrand::u32(..)),
            next_stream: AtomicU64::new(1),
            streams: Mutex::default(),
            shutdown: watch::Sender::new(false),
        }
    }

    /// One replica's service on the memory ledger (its claims within the same
    /// budget).
    pub fn memory(limiter: Arc<Limiter>, options: RlqsOptions) -> Self {
        let budget = Arc::new(Budget::new(options.max_bytes));
        let ledger = Arc::new(ledger::memory::MemoryLedger::new(budget.clone()));
        Self::with_budget(limiter, ledger, budget, options, "")
    }

    /// [`Rlqs::memory`] with the default options.
    pub fn in_memory(limiter: Arc<Limiter>) -> Self {
        Self::memory(limiter, RlqsOptions::default())
    }

    /// The service on the server's backend: claims in Redis when the counters are
    /// (through the store's protections, `breaker` among them), so replicas divide one
    /// limit; in memory otherwise.
    pub fn on_backend(
        limiter: Arc<Limiter>,
        backend: &Backend,
        options: RlqsOptions,
        breaker: BreakerOptions,
    ) -> Result<Self, String> {
        options.check()?;
        Ok(match backend.redis() {
            Some(redis) => {
                let ledger = ledger::redis::RedisLedger::new(redis, breaker)?;
                Self::new(limiter, Arc::new(ledger), options, &redis.key_prefix)
            }
            None => Self::memory(limiter, options),
        })
    }

    /// Ends every stream (UNAVAILABLE): the server is stopping.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    fn streams(&self) -> MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a new stream within the bounds; `client` is the id Envoy sent, if any,
    /// and `peer` where the stream comes from.
    fn register(
        self: &Arc<Self>,
        client: Option<String>,
        peer: Option<SocketAddr>,
    ) -> Result<Registration, RlqsError> {
        let mut streams = self.streams();
        let max = self.options.max_streams;
        if streams.by_id.len() >= max {
            return Err(RlqsError::TooManyStreams { max });
        }
        // Without a peer address (a transport that does not tell) only the global
        // bound applies.
        if let Some(peer) = peer {
            let max = self.options.max_streams_per_peer;
            if streams.per_peer.get(&peer).copied().unwrap_or(0) >= max {
                return Err(RlqsError::TooManyStreamsFromPeer { max });
            }
        }
        if !self.budget.take(budget::STREAM_BYTES) {
            return Err(RlqsError::OverBudget {
                max: self.budget.limit(),
            });
        }
        let seq = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let own = format!("stream:{}-{seq}", self.replica);
        let name = client.map_or_else(|| own.clone(), |client| format!("client:{client}"));
        let entry = Arc::new(StreamEntry {
            peer,
            opened: Instant::now(),
            state: Mutex::new(StreamState::new(name, own)),
        });
        streams.by_id.insert(seq, entry.clone());
        if let Some(peer) = peer {
            *streams.per_peer.entry(peer).or_default() += 1;
        }
        self.metrics.rlqs().stream_opened();
        Ok(Registration {
            rlqs: self.clone(),
            seq,
            entry,
        })
    }
}

/// A live stream's place in [`Rlqs::streams`]; dropping it removes the stream and
/// gives back what it was charged.
struct Registration {
    rlqs: Arc<Rlqs>,
    seq: u64,
    entry: Arc<StreamEntry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let rlqs = &self.rlqs;
        {
            let mut streams = rlqs.streams();
            streams.by_id.remove(&self.seq);
            if let Some(peer) = self.entry.peer
                && let Some(count) = streams.per_peer.get_mut(&peer)
            {
                *count -= 1;
                if *count == 0 {
                    streams.per_peer.remove(&peer);
                }
            }
        }
        let state = self.entry.lock();
        for bucket in state.buckets.values() {
            rlqs.metrics
                .rlqs()
                .bucket_removed(&bucket.domain, &bucket.rule, bucket.rate);
        }
        rlqs.budget.give(budget::STREAM_BYTES + state.charged);
        rlqs.metrics.rlqs().stream_closed();
    }
}
