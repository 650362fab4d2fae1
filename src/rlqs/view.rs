//! What `/rlqs` shows: this replica's live streams, their buckets and shares.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct RlqsView {
    /// `memory` or `redis`.
    pub ledger: &'static str,
    pub streams: Vec<StreamView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamView {
    /// The claimant name the ledger knows this stream by.
    pub stream: String,
    pub domain: Option<String>,
    pub buckets: Vec<BucketView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketView {
    pub bucket: BTreeMap<String, String>,
    pub domain: String,
    pub rule: String,
    /// Requests per second last reported (allowed + denied).
    pub demand_per_second: Option<f64>,
    /// Tokens per window assigned to this stream; `None`: allowed in full, or not yet.
    pub share_tokens: Option<u64>,
    pub window_seconds: Option<u64>,
    pub rate_per_second: Option<f64>,
    /// Streams (all replicas) the ledger divides the bucket between.
    pub ledger_streams: usize,
}
