//! Where each bucket's claims live: which streams report it, the demand each
//! reported, when each was last heard. One call per report of a bucket records the
//! reporter's claim, drops stale claims and returns the reporter's share, atomically
//! per bucket, so replicas on one Redis divide one limit ([`redis`]); [`memory`]
//! serves one replica. Both divide with `rlqs::share` (the Lua twin in `lua/rlqs.lua`).

pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// One report of a bucket by one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest<'a> {
    /// The bucket's ledger key (`rlqs::bucket::Shared::ledger_key`).
    pub key: &'a str,
    /// The claimant: unique per stream, or the client id Envoy sends.
    pub stream: &'a str,
    /// Requests per second reported; `None`: not known yet (a new bucket).
    pub demand: Option<f64>,
    /// L, tokens per window, to divide.
    pub tokens: u64,
    /// Claims not renewed this long are dropped.
    pub stale_after: Duration,
}

/// The reporter's share and what the ledger knew.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Granted {
    /// Tokens per window for the reporter.
    pub tokens: u64,
    /// Live claims on the bucket, the reporter's included.
    pub streams: usize,
    /// How long the ledger has held this bucket: a young ledger after a restart has
    /// not heard every stream yet.
    pub age: Duration,
}

/// Why the ledger could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    #[error("RLQS ledger unavailable: {0}")]
    Unavailable(String),
    #[error("RLQS ledger full: {0} buckets")]
    Full(usize),
}

pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// The claims of every bucket.
pub trait Ledger: Send + Sync + 'static {
    /// Records `request`'s claim and returns its share.
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted>;

    /// Drops `stream`'s claim on `key` (its stream ended): the others share at once.
    fn release<'a>(&'a self, key: &'a str, stream: &'a str) -> LedgerFuture<'a, ()>;

    /// Which ledger, for logs and `/rlqs`.
    fn kind(&self) -> &'static str;
}
