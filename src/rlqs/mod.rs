//! Envoy's Rate Limit Quota Service (`StreamRateLimitQuotas`): tollgate allocates,
//! Envoy decides. Each Envoy stream reports every bucket's usage periodically; tollgate
//! answers with a token bucket whose rate is that stream's share of the rule's limit,
//! divided by reported demand among every stream of every replica (the [`ledger`]),
//! so no request waits on tollgate.
//!
//! In the order a report meets them: [`service`] (the stream's task, its bounds and
//! end), [`stream`] (one message: validate, observe demand, claim, answer),
//! [`bucket`] (a `BucketId` under the served config, through the same matcher as
//! descriptors), [`ledger`] (claims and shares, in memory or Redis), [`share`] (the
//! division, pure), [`assign`] (the actions, shaped for Envoy 1.40). docs/rlqs.md
//! says how to configure Envoy and when to prefer this over `ShouldRateLimit`.

pub mod assign;
pub mod bucket;
pub mod error;
pub mod ledger;
pub mod options;
pub mod service;
pub mod share;
mod stream;
pub mod view;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

pub use self::error::RlqsError;
pub use self::ledger::Ledger;
pub use self::options::RlqsOptions;
pub use self::service::{CLIENT_ID_HEADER, RlqsGrpc};
use self::stream::StreamState;
use self::view::{RlqsView, StreamView};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::store::Backend;

/// The quota service of one server: the config it reads (the limiter's snapshot), the
/// ledger, its bounds and its live streams.
pub struct Rlqs {
    limiter: Arc<Limiter>,
    ledger: Arc<dyn Ledger>,
    options: RlqsOptions,
    metrics: Arc<Metrics>,
    /// The Redis key prefix the ledger keys start with (also in memory: one encoding).
    prefix: String,
    /// Names this process's streams apart from other replicas' in a shared ledger.
    replica: String,
    next_stream: AtomicU64,
    /// Live streams and what each showed last, for `/rlqs` and the stream bound.
    streams: Mutex<BTreeMap<u64, StreamView>>,
    /// Set once the server stops: every stream ends.
    shutdown: watch::Sender<bool>,
}

impl Rlqs {
    pub fn new(
        limiter: Arc<Limiter>,
        ledger: Arc<dyn Ledger>,
        options: RlqsOptions,
        prefix: &str,
    ) -> Self {
        let metrics = limiter.metrics().clone();
        Self {
            limiter,
            ledger,
            options,
            metrics,
            prefix: prefix.to_owned(),
            replica: format!("{:08x}", fastrand::u32(..)),
            next_stream: AtomicU64::new(1),
            streams: Mutex::default(),
            shutdown: watch::Sender::new(false),
        }
    }

    /// One replica's service on the memory ledger, default options.
    pub fn in_memory(limiter: Arc<Limiter>) -> Self {
        let options = RlqsOptions::default();
        let ledger = Arc::new(ledger::memory::MemoryLedger::new(buckets_bound(&options)));
        Self::new(limiter, ledger, options, "")
    }

    /// The service on the server's backend: claims in Redis when the counters are,
    /// so replicas divide one limit; in memory otherwise.
    pub fn on_backend(
        limiter: Arc<Limiter>,
        backend: &Backend,
        options: RlqsOptions,
    ) -> Result<Self, String> {
        options.check()?;
        Ok(match backend.redis() {
            Some(redis) => {
                let ledger = ledger::redis::RedisLedger::new(redis.clone())?;
                let prefix = redis.key_prefix.clone();
                Self::new(limiter, Arc::new(ledger), options, &prefix)
            }
            None => {
                let ledger = ledger::memory::MemoryLedger::new(buckets_bound(&options));
                Self::new(limiter, Arc::new(ledger), options, "")
            }
        })
    }

    /// Ends every stream (UNAVAILABLE): the server is stopping.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// This replica's streams, buckets and shares.
    pub fn view(&self) -> RlqsView {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        RlqsView {
            ledger: self.ledger.kind(),
            streams: streams.values().cloned().collect(),
        }
    }

    /// Admits a new stream within the bound; `client` is the id Envoy sent, if any.
    fn register(self: &Arc<Self>, client: Option<String>) -> Result<Registration, RlqsError> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams.len() >= self.options.max_streams {
            return Err(RlqsError::TooManyStreams {
                max: self.options.max_streams,
            });
        }
        let seq = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let claimant = match client {
            Some(client) => format!("client:{client}"),
            None => format!("stream:{}-{seq}", self.replica),
        };
        streams.insert(
            seq,
            StreamView {
                stream: claimant.clone(),
                domain: None,
                buckets: Vec::new(),
            },
        );
        self.metrics.rlqs().stream_opened();
        Ok(Registration {
            rlqs: self.clone(),
            seq,
            claimant,
        })
    }
}

/// The memory ledger's bucket bound: every stream full.
fn buckets_bound(options: &RlqsOptions) -> usize {
    options
        .max_streams
        .saturating_mul(options.max_buckets_per_stream)
        .min(1_000_000)
}

/// A live stream's place in [`Rlqs::streams`]; dropping it removes the stream.
struct Registration {
    rlqs: Arc<Rlqs>,
    seq: u64,
    claimant: String,
}

impl Registration {
    fn publish(&self, state: &StreamState) {
        let view = StreamView {
            stream: self.claimant.clone(),
            domain: state.domain.clone(),
            buckets: state.views(),
        };
        let mut streams = self.rlqs.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.insert(self.seq, view);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut streams = self.rlqs.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.remove(&self.seq);
        self.rlqs.metrics.rlqs().stream_closed();
    }
}
