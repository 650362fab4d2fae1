//! Where the records live ([`super::record`]): one value per global counter, read in
//! bulk and replaced by compare-and-swap, so a division ([`super::divide`]) applies to
//! the record it read or not at all, whichever replica of whichever region runs it.
//! [`redis`] is the ledger of a deployment (a Redis or Redis Cluster every region
//! reaches); [`memory`] serves tests and a single process.

pub mod memory;
pub mod redis;

use std::future::Future;
use std::pin::Pin;

/// One compare-and-swap: `key` becomes `new` (expiring after `ttl_ms`) iff it holds
/// `expected` (`None`: absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Swap {
    pub key: String,
    pub expected: Option<String>,
    pub new: String,
    pub ttl_ms: u64,
}

/// What a swap found.
#[derive(Debug, Clone, PartialEq)]
pub enum Swapped {
    Done,
    /// The value was not the expected one: here is what it is (`None`: absent).
    Conflict(Option<String>),
}

/// Why the ledger could not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LedgerError {
    #[error("global ledger unavailable: {0}")]
    Unavailable(String),
    #[error("global ledger did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("global ledger answered something unexpected: {0}")]
    Protocol(String),
}

pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// The records of every global counter.
pub trait Ledger: Send + Sync + 'static {
    /// The values of `keys`, in order (`None`: absent).
    fn read<'a>(&'a self, keys: &'a [String]) -> LedgerFuture<'a, Vec<Option<String>>>;

    /// Each swap, in order, each atomic on its own.
    fn swap<'a>(&'a self, swaps: &'a [Swap]) -> LedgerFuture<'a, Vec<Swapped>>;

    /// Which ledger, for logs and `/global`.
    fn kind(&self) -> &'static str;
}
