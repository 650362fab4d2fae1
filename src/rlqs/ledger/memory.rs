//! The claims in this process: right for one replica (with several, each divides the
//! whole limit among its own Envoys). Bounded: at most `max_buckets` buckets; when
//! full, buckets whose every claim is stale go first, then a new bucket is refused.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{ClaimRequest, Granted, Ledger, LedgerError, LedgerFuture};
use crate::hash::FastMap;
use crate::rlqs::share::{self, Claim};

struct Bucket {
    born: Instant,
    /// By stream, so the claims are in the same order as the Lua twin sorts them.
    claims: BTreeMap<String, (Option<f64>, Instant)>,
    stale_after: Duration,
}

impl Bucket {
    fn drop_stale(&mut self, now: Instant) {
        let stale_after = self.stale_after;
        self.claims
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) <= stale_after);
    }
}

pub struct MemoryLedger {
    buckets: Mutex<FastMap<String, Bucket>>,
    max_buckets: usize,
}

impl MemoryLedger {
    pub fn new(max_buckets: usize) -> Self {
        Self {
            buckets: Mutex::default(),
            max_buckets,
        }
    }

    fn claim_now(&self, request: &ClaimRequest<'_>, now: Instant) -> Result<Granted, LedgerError> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(request.key) && buckets.len() >= self.max_buckets {
            buckets.retain(|_, b| {
                b.drop_stale(now);
                !b.claims.is_empty()
            });
            if buckets.len() >= self.max_buckets {
                return Err(LedgerError::Full(self.max_buckets));
            }
        }
        let bucket = buckets
            .entry(request.key.to_owned())
            .or_insert_with(|| Bucket {
                born: now,
                claims: BTreeMap::new(),
                stale_after: request.stale_after,
            });
        bucket.stale_after = request.stale_after;
        bucket.drop_stale(now);
        bucket
            .claims
            .insert(request.stream.to_owned(), (request.demand, now));
        let claims: Vec<Claim> = bucket
            .claims
            .iter()
            .map(|(stream, (demand, _))| Claim {
                stream: stream.clone(),
                demand: *demand,
            })
            .collect();
        let me = claims
            .iter()
            .position(|c| c.stream == request.stream)
            .unwrap_or(0);
        Ok(Granted {
            tokens: share::share_of(&claims, me, request.tokens),
            streams: claims.len(),
            age: now.saturating_duration_since(bucket.born),
        })
    }
}

impl Ledger for MemoryLedger {
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted> {
        let result = self.claim_now(&request, Instant::now());
        Box::pin(async move { result })
    }

    fn release<'a>(&'a self, key: &'a str, stream: &'a str) -> LedgerFuture<'a, ()> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(key) {
            bucket.claims.remove(stream);
            if bucket.claims.is_empty() {
                buckets.remove(key);
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(stream: &'a str, demand: Option<f64>) -> ClaimRequest<'a> {
        ClaimRequest {
            key: "b",
            stream,
            demand,
            tokens: 600,
            stale_after: Duration::from_secs(15),
        }
    }

    #[test]
    fn stale_claims_go_and_their_share_with_them() {
        let ledger = MemoryLedger::new(10);
        let t0 = Instant::now();
        ledger.claim_now(&request("a", Some(10.0)), t0).unwrap();
        let b = ledger.claim_now(&request("b", Some(10.0)), t0).unwrap();
        assert_eq!((b.tokens, b.streams), (300, 2));
        let later = t0 + Duration::from_secs(16);
        let b = ledger.claim_now(&request("b", Some(10.0)), later).unwrap();
        assert_eq!((b.tokens, b.streams), (600, 1));
        assert_eq!(b.age, Duration::from_secs(16));
    }

    #[test]
    fn the_bound_refuses_a_new_bucket_when_every_claim_is_live() {
        let ledger = MemoryLedger::new(1);
        let t0 = Instant::now();
        ledger.claim_now(&request("a", None), t0).unwrap();
        let other = ClaimRequest {
            key: "c",
            ..request("a", None)
        };
        assert!(matches!(
            ledger.claim_now(&other, t0),
            Err(LedgerError::Full(1))
        ));
        assert!(
            ledger
                .claim_now(&other, t0 + Duration::from_secs(20))
                .is_ok()
        );
    }
}
