//! The store seam: a batch of counter operations in, one decision per operation out,
//! decided atomically for the batch. Implementations: [`memory`] (one process) and
//! [`redis`] (standalone, Sentinel or cluster, shared by every replica), chosen once
//! as a [`Backend`] that [`stack`] builds the server's store from; wrappers:
//! [`breaker`] (fail fast while the store is down), [`cache`] (answer known denials
//! locally) and [`metered`] (time and count the calls that reach the backend);
//! [`side`]: other callers' Redis calls (the RLQS ledger's) under the same protections.

pub mod backend;
pub mod breaker;
pub mod cache;
pub mod memory;
pub mod metered;
pub mod redis;
pub mod side;
pub mod stack;

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;

use compact_str::CompactString;
use smallvec::SmallVec;

pub use self::backend::Backend;
use crate::algorithm::{Algorithm, Decision, Mode, Params};
use crate::metrics::BackendErrorKind;

/// A counter key's descriptor entries, `(key, value)`. A key is built per limit per
/// descriptor per request, so a typical one must own no heap memory: each string holds
/// up to 24 bytes inline (`remote_address`, `203.0.113.42`, `acme-corp`), and two
/// entries sit inline. Longer strings and more entries spill to the heap, as they all did.
pub type Entries = SmallVec<[(CompactString, CompactString); 2]>;

/// Names one counter: the domain, the rule (its config path), the request's descriptor
/// entries that reached it, the algorithm and the window length. Two requests share a
/// counter iff these are equal.
#[derive(Debug, Clone)]
pub struct CounterKey {
    pub domain: Arc<str>,
    pub rule: Arc<str>,
    pub entries: Entries,
    pub algorithm: Algorithm,
    pub window_secs: u64,
    /// `time_zone`: calendar periods of this zone, a counter apart from the same
    /// window counted from the epoch or in another zone.
    pub time_zone: Option<chrono_tz::Tz>,
    /// `hash_tag`: the entry keys that form the Redis Cluster hash tag (`None`: all).
    /// It decides where the counter lives, never which requests share it.
    pub hash_tag: Option<Arc<[Arc<str>]>>,
}

/// Every field, as a derived `==` would, but cheapest first: keys compared on the hot
/// path (a request's operations with each other, a cache's bucket) mostly differ in
/// their entries or window, and mostly share the domain's and rule's `Arc` (so their
/// text is compared only when they do not: a config reload makes new ones).
impl PartialEq for CounterKey {
    fn eq(&self, other: &Self) -> bool {
        fn same(a: &Arc<str>, b: &Arc<str>) -> bool {
            Arc::ptr_eq(a, b) || a == b
        }
        self.window_secs == other.window_secs
            && self.algorithm == other.algorithm
            && self.time_zone == other.time_zone
            && self.entries == other.entries
            && same(&self.rule, &other.rule)
            && same(&self.domain, &other.domain)
            && match (&self.hash_tag, &other.hash_tag) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}

impl Eq for CounterKey {}

/// By content, every field, as `==` compares them (equal keys, equal hashes).
impl Hash for CounterKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.domain.hash(state);
        self.rule.hash(state);
        self.entries.hash(state);
        self.algorithm.hash(state);
        self.window_secs.hash(state);
        self.time_zone.hash(state);
        self.hash_tag.hash(state);
    }
}

impl CounterKey {
    /// The heap bytes the entries own beyond the key's own size: none for a typical
    /// key (see [`Entries`]), else the strings and the array that spilled.
    pub fn entries_heap_bytes(&self) -> usize {
        fn spilled(s: &CompactString) -> usize {
            if s.is_heap_allocated() {
                s.capacity()
            } else {
                0
            }
        }
        let strings: usize = self
            .entries
            .iter()
            .map(|(k, v)| spilled(k) + spilled(v))
            .sum();
        let array = if self.entries.spilled() {
            self.entries.capacity() * std::mem::size_of::<(CompactString, CompactString)>()
        } else {
            0
        };
        strings + array
    }
}

/// One operation of a request on one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterOp {
    pub key: CounterKey,
    /// The arithmetic of the limit (its algorithm and window match the key's).
    pub params: Params,
    /// Hits this request adds; 0 only checks.
    pub cost: u64,
    /// Whether a denial of this operation denies the request, so nothing in the batch
    /// is consumed. False for shadow-mode rules: they are decided and reported, but the
    /// request goes through, so the batch's other counters are consumed.
    pub vetoes: bool,
    /// Limit, charge (always consumed) or release (given back): see
    /// [`crate::algorithm::Mode`]. An operation that commits
    /// ([`CounterOp::commits`]) is written whatever the request's answer, never
    /// refunded, and never answered from the over-limit cache.
    pub mode: Mode,
    /// The request's own lease (`lease_key`: the value of the descriptor entry that
    /// identifies the request), on a rule that counts leases; `None` elsewhere. Not
    /// part of the counter: every request of a tenant shares the counter, each with
    /// its own lease in it.
    pub lease: Option<CompactString>,
}

impl CounterOp {
    /// Whether its new state is written whatever its answer and the request's.
    pub fn commits(&self) -> bool {
        self.mode.commits_on(self.params.algorithm)
    }

    /// What [`crate::algorithm::apply`] takes of it besides the state and clock.
    pub fn lease_args(&self) -> (u64, Mode, Option<&str>) {
        (self.cost, self.mode, self.lease.as_deref())
    }
}

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open after consecutive failures: not even tried.
    #[error("store circuit open after repeated failures (retrying in {0:?})")]
    CircuitOpen(std::time::Duration),
}

impl StoreError {
    /// The kind the metrics label this error with.
    pub fn kind(&self) -> BackendErrorKind {
        match self {
            StoreError::Timeout(_) => BackendErrorKind::Timeout,
            StoreError::Unavailable(_) => BackendErrorKind::Unavailable,
            StoreError::CircuitOpen(_) => BackendErrorKind::CircuitOpen,
        }
    }
}

pub type StoreFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Decision>, StoreError>> + Send + 'a>>;

/// One backend node's answer to a readiness probe: the node (`host:port`, or the
/// Sentinel group's name) and whether it answered.
#[derive(Debug, Clone)]
pub struct NodePing {
    pub node: String,
    pub result: Result<(), StoreError>,
}

/// What a readiness probe found, node by node (every master of a cluster); empty for
/// a store without nodes (memory).
pub type PingFuture<'a> = Pin<Box<dyn Future<Output = Vec<NodePing>> + Send + 'a>>;

/// Decides a request's operations together.
///
/// Contract, for every implementation: decisions come back in `ops` order; operations
/// are decided in order, each seeing those before it (two operations on one counter
/// add up); if any vetoing operation is denied, nothing is consumed and the allowed
/// operations report what remains without this request; otherwise every allowed
/// operation is consumed. A counter never admits more than its limit.
pub trait Store: Send + Sync + 'static {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a>;

    /// [`Store::decide`], also pushing onto `local` the index of every operation that
    /// was answered without asking the backend (the over-limit cache's denials), for
    /// the metrics. Only wrappers that answer locally, or wrap one that does, override
    /// it; `local` stays empty otherwise.
    fn decide_noting_local<'a>(
        &'a self,
        ops: &'a [CounterOp],
        local: &'a mut Vec<usize>,
    ) -> StoreFuture<'a> {
        let _ = local;
        self.decide(ops)
    }

    /// Decides as if the request were already denied: the same decisions, nothing
    /// consumed. For true statuses of a request denied before the store was asked.
    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a>;

    /// Whether the backend answers, for readiness: asked apart from rate-limit traffic
    /// (never queued behind it, never counted by the breaker), node by node. The
    /// memory store has no nodes and always answers; wrappers pass the question through.
    fn ping(&self) -> PingFuture<'_> {
        Box::pin(async { Vec::new() })
    }

    /// Whether a call would go to the backend now, for readiness beside [`Store::ping`]:
    /// a node can answer PING on the probe's own connection while the store's path is
    /// not there yet (still connecting after start-up, its connection being recovered)
    /// or a breaker still refuses calls. Cheap and synchronous; wrappers pass it
    /// through, adding their own refusals.
    fn ready(&self) -> bool {
        true
    }
}

impl<S: Store> Store for Arc<S> {
    fn decide<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        (**self).decide(ops)
    }

    fn decide_noting_local<'a>(
        &'a self,
        ops: &'a [CounterOp],
        local: &'a mut Vec<usize>,
    ) -> StoreFuture<'a> {
        (**self).decide_noting_local(ops, local)
    }

    fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
        (**self).dry_run(ops)
    }

    fn ping(&self) -> PingFuture<'_> {
        (**self).ping()
    }

    fn ready(&self) -> bool {
        (**self).ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::FastState;
    use std::hash::BuildHasher;

    fn key() -> CounterKey {
        CounterKey {
            domain: Arc::from("d"),
            rule: Arc::from("d.k_v"),
            entries: [("k".into(), "v".into())].into_iter().collect(),
            algorithm: Algorithm::FixedWindow,
            window_secs: 60,
            time_zone: None,
            hash_tag: Some(Arc::from([Arc::from("k")])),
        }
    }

    /// Equal text in other `Arc`s (a reloaded config's) is the same counter, with the
    /// same hash; any one field differing is another.
    #[test]
    fn keys_are_equal_by_content_in_every_field() {
        let (a, b) = (key(), key());
        assert!(!Arc::ptr_eq(&a.rule, &b.rule));
        assert_eq!(a, b);
        let hasher = FastState::default();
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
        let changes: [fn(&mut CounterKey); 7] = [
            |k| k.domain = Arc::from("e"),
            |k| k.rule = Arc::from("d.k"),
            |k| k.entries[0].1 = "w".into(),
            |k| k.algorithm = Algorithm::Gcra,
            |k| k.window_secs = 1,
            |k| k.hash_tag = None,
            |k| k.hash_tag = Some(Arc::from([Arc::from("j")])),
        ];
        for (i, change) in changes.into_iter().enumerate() {
            let mut other = key();
            change(&mut other);
            assert_ne!(a, other, "change {i}");
            assert_ne!(other, a, "change {i}");
        }
    }
}
