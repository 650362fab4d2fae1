//! What `/rlqs` shows, bounded whatever the streams hold: a summary (streams, buckets,
//! bytes of state against the budget) with one page of streams, each in one line
//! (`?after=<id>&limit=<n>`, at most [`MAX_PAGE`]), or one stream's buckets
//! (`?stream=<id>`, at most `--rlqs-max-buckets-per-stream` of them).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

use super::{Rlqs, StreamEntry};

/// Streams per page unless `limit` says otherwise.
pub const PAGE: usize = 100;
/// The most streams one page lists.
pub const MAX_PAGE: usize = 1_000;

#[derive(Debug, Clone, Serialize)]
pub struct RlqsView {
    /// `memory` or `redis`.
    pub ledger: &'static str,
    pub streams: usize,
    pub buckets: usize,
    /// Bytes of RLQS state charged, and the budget (`--rlqs-max-bytes`).
    pub state_bytes: u64,
    pub max_bytes: u64,
    /// Streams after the page's `after`, in id order.
    pub page: Vec<StreamSummary>,
    /// The `after` of the next page; `None`: this is the last.
    pub next: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    /// Ask `?stream=<id>` for its buckets.
    pub id: u64,
    /// The claim it asks for (`client:<rlqs-client-id>`, or its own name).
    pub stream: String,
    pub peer: Option<String>,
    pub domain: Option<String>,
    pub buckets: usize,
    pub open_seconds: u64,
    /// Since its last message.
    pub idle_seconds: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamView {
    #[serde(flatten)]
    pub summary: StreamSummary,
    pub buckets: Vec<BucketView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketView {
    pub bucket: BTreeMap<String, String>,
    pub domain: String,
    pub rule: String,
    /// Requests per second last reported (allowed + denied).
    pub demand_per_second: Option<f64>,
    /// Tokens per window last assigned (0: denied); `None`: allowed in full, or not yet.
    pub share_tokens: Option<u64>,
    pub window_seconds: Option<u64>,
    pub rate_per_second: Option<f64>,
    /// Streams (all replicas) the ledger divides the bucket between.
    pub ledger_streams: usize,
}

/// What `/rlqs` was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Page { after: u64, limit: usize },
    Stream(u64),
}

impl Query {
    /// Reads `stream`, `after` and `limit` from a query string; anything else is an
    /// error naming it.
    pub fn parse(raw: Option<&str>) -> Result<Self, String> {
        let (mut after, mut limit, mut stream) = (0, PAGE, None);
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{name}: expected a number, got '{value}'"))
            };
            match name {
                "after" => after = number()?,
                "limit" => limit = (number()? as usize).clamp(1, MAX_PAGE),
                "stream" => stream = Some(number()?),
                other => {
                    return Err(format!(
                        "unknown parameter '{other}' (expected stream, after, limit)"
                    ));
                }
            }
        }
        Ok(match stream {
            Some(id) => Query::Stream(id),
            None => Query::Page { after, limit },
        })
    }
}

impl Rlqs {
    /// The summary and one page of streams.
    pub fn view(&self, after: u64, limit: usize) -> RlqsView {
        let entries: Vec<(u64, std::sync::Arc<StreamEntry>)> = {
            let streams = self.streams();
            streams
                .by_id
                .iter()
                .map(|(id, e)| (*id, e.clone()))
                .collect()
        };
        let buckets = entries.iter().map(|(_, e)| e.lock().buckets.len()).sum();
        let mut page: Vec<StreamSummary> = entries
            .iter()
            .filter(|(id, _)| *id > after)
            .take(limit + 1)
            .map(|(id, e)| summary(*id, e))
            .collect();
        let next = (page.len() > limit).then(|| {
            page.pop();
            page.last().map_or(after, |s| s.id)
        });
        RlqsView {
            ledger: self.ledger.kind(),
            streams: entries.len(),
            buckets,
            state_bytes: self.budget.used(),
            max_bytes: self.budget.limit(),
            page,
            next,
        }
    }

    /// One stream and its buckets.
    pub fn stream_view(&self, id: u64) -> Option<StreamView> {
        let entry = self.streams().by_id.get(&id)?.clone();
        let buckets = entry.lock().views();
        Some(StreamView {
            summary: summary(id, &entry),
            buckets,
        })
    }
}

fn summary(id: u64, entry: &StreamEntry) -> StreamSummary {
    let state = entry.lock();
    StreamSummary {
        id,
        stream: state.name.clone(),
        peer: entry.peer.map(|p: SocketAddr| p.to_string()),
        domain: state.domain.clone(),
        buckets: state.buckets.len(),
        open_seconds: entry.opened.elapsed().as_secs(),
        idle_seconds: state.last_message.elapsed().as_secs(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_read_pages_and_streams_and_refuse_the_rest() {
        assert_eq!(
            Query::parse(None),
            Ok(Query::Page {
                after: 0,
                limit: PAGE
            })
        );
        assert_eq!(
            Query::parse(Some("after=7&limit=100000")),
            Ok(Query::Page {
                after: 7,
                limit: MAX_PAGE
            })
        );
        assert_eq!(Query::parse(Some("stream=3")), Ok(Query::Stream(3)));
        assert!(Query::parse(Some("limit=x")).unwrap_err().contains("limit"));
        assert!(Query::parse(Some("all=1")).unwrap_err().contains("all"));
    }
}
