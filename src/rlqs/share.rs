//! The division of one bucket's limit between the Envoy streams that report it: pure
//! arithmetic, no I/O, no clock. The memory ledger calls it; `lua/rlqs.lua` mirrors it
//! step for step (same order of operations, same rounding), so a bucket divides the
//! same way whichever ledger holds it.
//!
//! Shares follow demand: a stream's weight is the rate it reported (allowed + denied
//! over the time since its last report), so an Envoy offered ten times the traffic of
//! another gets ten times the share, and the shares of a saturated bucket sum to the
//! limit. Three corrections keep that workable:
//! - a stream whose demand is not known yet (its first report of a new bucket says
//!   nothing about a rate) weighs the mean of the known ones: a fair provisional share;
//! - every stream weighs at least [`FLOOR`] of the mean weight, so an idle Envoy can
//!   still admit the first requests that arrive before its next report raises it;
//! - the limit is a whole number of tokens per window and each stream gets whole
//!   tokens: the largest remainders get the tokens left over after rounding down, so
//!   the shares sum to the limit exactly, and nobody gets fewer than one token.

/// A stream's claim on a bucket, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The stream (or the client id it presented): unique within the bucket.
    pub stream: String,
    /// Requests per second it reported; `None`: not known yet.
    pub demand: Option<f64>,
}

/// The least weight of a stream, as a fraction of the mean weight.
pub const FLOOR: f64 = 0.05;

/// How many of `tokens` (the limit per window) go to `claims[me]`. `claims` holds every
/// live claim on the bucket, the reporter's included; ordered by stream for ties.
pub fn share_of(claims: &[Claim], me: usize, tokens: u64) -> u64 {
    shares(claims, tokens).get(me).copied().unwrap_or(0)
}

/// Every claim's tokens, in `claims` order.
pub fn shares(claims: &[Claim], tokens: u64) -> Vec<u64> {
    let weights = weights(claims);
    let total: f64 = weights.iter().sum();
    let limit = tokens as f64;
    let mut out: Vec<u64> = Vec::with_capacity(claims.len());
    let mut fractions: Vec<(f64, usize)> = Vec::with_capacity(claims.len());
    let mut given: u64 = 0;
    for (i, w) in weights.iter().enumerate() {
        let exact = limit * w / total;
        let whole = exact.floor();
        out.push(whole as u64);
        given += whole as u64;
        fractions.push((exact - whole, i));
    }
    // Largest remainder first; equal remainders by stream name, so both ledgers agree.
    fractions.sort_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| claims[a.1].stream.cmp(&claims[b.1].stream))
    });
    let mut left = tokens.saturating_sub(given);
    for (_, i) in fractions {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    for share in &mut out {
        *share = (*share).max(1);
    }
    out
}

/// Known demand, the mean for unknown demand, at least [`FLOOR`] of the mean; equal
/// weights when nobody has demand.
fn weights(claims: &[Claim]) -> Vec<f64> {
    let (mut known_sum, mut known) = (0.0, 0usize);
    for claim in claims {
        if let Some(d) = claim.demand {
            known_sum += d;
            known += 1;
        }
    }
    let mean_known = if known > 0 {
        known_sum / known as f64
    } else {
        1.0
    };
    let raw: Vec<f64> = claims
        .iter()
        .map(|c| c.demand.unwrap_or(mean_known))
        .collect();
    let sum: f64 = raw.iter().sum();
    if sum <= 0.0 {
        return vec![1.0; claims.len()];
    }
    let floor = FLOOR * sum / claims.len() as f64;
    raw.into_iter().map(|w| w.max(floor)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(demands: &[Option<f64>]) -> Vec<Claim> {
        demands
            .iter()
            .enumerate()
            .map(|(i, d)| Claim {
                stream: format!("s{i}"),
                demand: *d,
            })
            .collect()
    }

    #[test]
    fn shares_follow_demand_and_sum_to_the_limit() {
        let s = shares(&claims(&[Some(100.0), Some(10.0), Some(10.0)]), 600);
        assert_eq!(s.iter().sum::<u64>(), 600);
        assert!(s[0] >= 450, "{s:?}");
        assert_eq!(s[1], s[2]);
    }

    #[test]
    fn a_newcomer_gets_a_fair_provisional_share() {
        let s = shares(&claims(&[Some(10.0), Some(10.0), None]), 600);
        assert_eq!(s, vec![200, 200, 200]);
        assert_eq!(shares(&claims(&[None]), 600), vec![600]);
    }

    #[test]
    fn an_idle_stream_keeps_a_floor_and_the_rest_goes_to_the_busy() {
        let s = shares(&claims(&[Some(0.0), Some(5.0), Some(5.0)]), 600);
        assert_eq!(s.iter().sum::<u64>(), 600);
        assert!(s[0] >= 1 && s[0] < 20, "{s:?}");
        assert!(s[1] >= 290, "{s:?}");
        assert_eq!(shares(&claims(&[Some(0.0), Some(0.0)]), 10), vec![5, 5]);
    }

    #[test]
    fn nobody_gets_less_than_one_token() {
        let s = shares(&claims(&[Some(1000.0), Some(0.0), Some(0.0)]), 3);
        assert!(s.iter().all(|&t| t >= 1), "{s:?}");
    }
}
