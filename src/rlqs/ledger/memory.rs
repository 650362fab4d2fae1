//! The claims in this process: right for one replica (with several, each divides the
//! whole limit among its own Envoys). One [`Claims`] per bucket, dropped when its last
//! claim is; its bytes are charged to the RLQS budget, and a new bucket that does not
//! fit is refused ([`LedgerError::Full`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{ClaimRequest, Granted, Ledger, LedgerError, LedgerFuture, Timing};
use crate::hash::FastMap;
use crate::rlqs::budget::{Budget, CLAIM_BYTES, LEDGER_BUCKET_BYTES};
use crate::rlqs::claims::Claims;

/// A bucket's claims and what they are charged.
struct Bucket {
    claims: Claims,
    charged: u64,
}

pub struct MemoryLedger {
    buckets: Mutex<FastMap<String, Bucket>>,
    budget: Arc<Budget>,
    /// The ledger's clock starts here (milliseconds since).
    epoch: Instant,
}

impl MemoryLedger {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            buckets: Mutex::default(),
            budget,
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn claim_at(&self, request: &ClaimRequest<'_>, now: Instant) -> Result<Granted, LedgerError> {
        let now = self.now_ms(now);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(request.key) {
            let charged = charge(request.key, 0);
            if !self.budget.take(charged) {
                return Err(LedgerError::Full(self.budget.limit()));
            }
            let claims = Claims::new(now);
            buckets.insert(request.key.to_owned(), Bucket { claims, charged });
        }
        let bucket = buckets.get_mut(request.key).expect("inserted above");
        let grant = bucket.claims.claim(&request.report, &request.timing, now);
        self.recharge(request.key, bucket);
        Ok(Granted {
            tokens: grant.tokens,
            streams: grant.streams as usize,
            age: Duration::from_millis(grant.age_ms),
            on_alias: grant.on_alias,
            partial: grant.partial,
        })
    }

    /// Charges the bucket what it costs now: its claims grow and shrink by report.
    fn recharge(&self, key: &str, bucket: &mut Bucket) {
        let now = charge(key, bucket.claims.len());
        if now > bucket.charged {
            self.budget.force(now - bucket.charged);
        } else {
            self.budget.give(bucket.charged - now);
        }
        bucket.charged = now;
    }

    fn release_at(&self, key: &str, names: [&str; 3], timing: &Timing, now: Instant) {
        let now = self.now_ms(now);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get_mut(key) else {
            return;
        };
        let [name, alias, owner] = names;
        bucket.claims.release(name, alias, owner, timing, now);
        if bucket.claims.is_empty() {
            self.budget.give(bucket.charged);
            buckets.remove(key);
        } else {
            self.recharge(key, bucket);
        }
    }
}

/// What a bucket with `claims` claims costs.
fn charge(key: &str, claims: usize) -> u64 {
    LEDGER_BUCKET_BYTES + key.len() as u64 + claims as u64 * CLAIM_BYTES
}

impl Ledger for MemoryLedger {
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted> {
        let result = self.claim_at(&request, Instant::now());
        Box::pin(async move { result })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        name: &'a str,
        alias: &'a str,
        owner: &'a str,
        timing: Timing,
    ) -> LedgerFuture<'a, ()> {
        self.release_at(key, [name, alias, owner], &timing, Instant::now());
        Box::pin(async { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rlqs::claims::Report;

    const TIMING: Timing = Timing {
        stale_ms: 15_000,
        hold_ms: 32_000,
        grace_ms: 2_000,
    };

    fn request<'a>(key: &'a str, stream: &'a str) -> ClaimRequest<'a> {
        ClaimRequest {
            key,
            report: Report {
                name: stream,
                alias: stream,
                owner: stream,
                weight: Some(crate::rlqs::share::SCALE),
                resumed: false,
                tokens: 600,
            },
            timing: TIMING,
        }
    }

    #[test]
    fn a_bucket_is_charged_while_it_has_claims() {
        let budget = Arc::new(Budget::new(1 << 20));
        let ledger = MemoryLedger::new(budget.clone());
        let t0 = Instant::now();
        ledger.claim_at(&request("b", "a"), t0).unwrap();
        let one = budget.used();
        assert!(one > 0);
        ledger.claim_at(&request("b", "c"), t0).unwrap();
        assert!(budget.used() > one, "a second claim costs");
        // Neither holds tokens past its release once the holds run out.
        let later = t0 + Duration::from_millis(TIMING.hold_ms + 1);
        ledger.release_at("b", ["a", "a", "a"], &TIMING, later);
        ledger.release_at("b", ["c", "c", "c"], &TIMING, later);
        assert_eq!(budget.used(), 0, "the bucket is gone");
    }

    #[test]
    fn a_new_bucket_that_does_not_fit_is_refused() {
        let ledger = MemoryLedger::new(Arc::new(Budget::new(700)));
        let t0 = Instant::now();
        ledger.claim_at(&request("b", "a"), t0).unwrap();
        assert!(matches!(
            ledger.claim_at(&request("c", "a"), t0),
            Err(LedgerError::Full(700))
        ));
    }
}
