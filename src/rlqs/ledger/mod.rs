//! Where each bucket's claims live ([`super::claims`]: which streams report it, their
//! weights, what each holds and until when). One call per report of a bucket records
//! the reporter's claim and returns its grant, atomically per bucket, so replicas on
//! one Redis divide one limit ([`redis`], through the store's protections); [`memory`]
//! serves one replica. Both take the same steps (`claims/`, its Lua twin
//! `lua/rlqs.lua`), and neither reads every claim of a bucket per report.

pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use super::claims::{Report, Timing};
use crate::store::StoreError;

/// One report of a bucket by one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaimRequest<'a> {
    /// The bucket's ledger key (`rlqs::bucket::Shared::ledger_key`).
    pub key: &'a str,
    pub report: Report<'a>,
    pub timing: Timing,
}

/// The reporter's grant and what the ledger knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Tokens per window for the reporter; 0: deny until the next division.
    pub tokens: u64,
    /// Live claims on the bucket, the reporter's included.
    pub streams: usize,
    /// How long the ledger has held this bucket: a young ledger after a restart has
    /// not heard every stream yet.
    pub age: Duration,
    /// Whether the grant is on the stream's own alias (its client id is another's).
    pub on_alias: bool,
    /// Whether it is less than the division's share for the stream (the rest is
    /// still held by others).
    pub partial: bool,
}

/// Why the ledger could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    #[error("RLQS ledger: {0}")]
    Store(#[from] StoreError),
    #[error("RLQS ledger full: the RLQS state budget of {0} bytes is spent (--rlqs-max-bytes)")]
    Full(u64),
}

impl LedgerError {
    /// Its `kind` label in `tollgate_rlqs_ledger_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            LedgerError::Store(StoreError::Timeout(_)) => "timeout",
            LedgerError::Store(StoreError::Unavailable(_)) => "unavailable",
            LedgerError::Store(StoreError::CircuitOpen(_)) => "circuit_open",
            LedgerError::Full(_) => "full",
        }
    }
}

pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// The claims of every bucket.
pub trait Ledger: Send + Sync + 'static {
    /// Records `request`'s claim and returns its grant.
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted>;

    /// The stream `owner` ended: its claim on `key` (under `name` or `alias`) loses
    /// its weight at once; its tokens stay held until their hold runs out.
    fn release<'a>(
        &'a self,
        key: &'a str,
        name: &'a str,
        alias: &'a str,
        owner: &'a str,
        timing: Timing,
    ) -> LedgerFuture<'a, ()>;

    /// Which ledger, for logs and `/rlqs`.
    fn kind(&self) -> &'static str;
}
