//! The concurrency model's tests: the two kinds of lease, and the promise both keep
//! (never more than the limit in flight while every request releases within its
//! lease) over random schedules.

use super::*;
use crate::algorithm::Algorithm;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Duration;

fn params(limit: u64, lease_secs: u64) -> Params {
    Params {
        algorithm: Algorithm::Concurrency,
        limit,
        window_ms: lease_secs * 1000,
        burst: limit,
        max_delay_ms: None,
        calendar: None,
    }
}

#[test]
fn admits_while_fewer_than_the_limit_are_held_and_counts_every_acquisition() {
    let p = params(2, 60);
    let (s, d) = decide(None, &p, 1_000, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    let (s, d) = decide(Some(&s), &p, 1_000, 1);
    assert!(d.allowed);
    let (s, d) = decide(Some(&s), &p, 2_000, 1);
    assert!(!d.allowed, "two held");
    assert_eq!(d.retry_after, Some(Duration::from_secs(59)), "the first leases end");
    assert_eq!(s.leases.values().sum::<u64>(), 3, "the denied one counts too");
    // The denied request's release, then an admitted one's: one slot free.
    let (s, _) = release(Some(&s), &p, 3_000, 1);
    let (s, d) = release(Some(&s), &p, 3_000, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    let (_, d) = decide(Some(&s), &p, 3_000, 1);
    assert!(d.allowed);
}

#[test]
fn leases_expire_and_releases_never_go_below_zero() {
    let p = params(1, 10);
    let (s, _) = decide(None, &p, 0, 1);
    let (_, d) = decide(Some(&s), &p, 9_999, 1);
    assert!(!d.allowed, "still leased");
    let (s, d) = decide(Some(&s), &p, 10_000, 1);
    assert!(d.allowed, "the lease expired: an Envoy that died gave it back");
    let (s, d) = release(Some(&s), &p, 10_000, 5);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    assert!(s.leases.is_empty());
}

/// The case that over-admitted when a release gave back the newest lease: limit 5,
/// lease 10 s; A at 0 s, B1-B4 at 2 s (running to 11.5 s), A released at 3 s. At
/// 11.1 s four are in flight: one more is admitted, not two.
#[test]
fn an_early_release_never_frees_a_newer_requests_slot() {
    let p = params(5, 10);
    let (mut s, _) = decide(None, &p, 0, 1);
    for _ in 0..4 {
        s = decide(Some(&s), &p, 2_000, 1).0;
    }
    s = release(Some(&s), &p, 3_000, 1).0;
    let (s, d) = decide(Some(&s), &p, 11_100, 1);
    assert!(d.allowed);
    assert!(!decide(Some(&s), &p, 11_100, 1).1.allowed, "five in flight");

    let (mut s, _) = acquire_named(None, &p, 0, 1, "a");
    for b in ["b1", "b2", "b3", "b4"] {
        s = acquire_named(Some(&s), &p, 2_000, 1, b).0;
    }
    s = release_named(Some(&s), &p, 3_000, "a").0;
    let (s, d) = acquire_named(Some(&s), &p, 11_100, 1, "c1");
    assert!(d.allowed);
    assert!(!acquire_named(Some(&s), &p, 11_100, 1, "c2").1.allowed);
}

#[test]
fn a_named_release_frees_its_own_lease_and_nothing_else() {
    let p = params(2, 60);
    let (s, _) = acquire_named(None, &p, 0, 1, "a");
    let (s, _) = acquire_named(Some(&s), &p, 0, 1, "b");
    let (s, d) = acquire_named(Some(&s), &p, 0, 1, "c");
    assert!(!d.allowed, "two held");
    assert_eq!(d.retry_after, Some(Duration::from_secs(60)));
    // The denied request's release, and a release nobody acquired: nothing freed.
    let (s, _) = release_named(Some(&s), &p, 1, "c");
    let (s, d) = release_named(Some(&s), &p, 1, "nobody");
    assert_eq!(d.remaining, 0);
    assert!(!acquire_named(Some(&s), &p, 2, 1, "d").1.allowed);
    // A's release frees A's slot.
    let (s, d) = release_named(Some(&s), &p, 3, "a");
    assert_eq!(d.remaining, 1);
    let (s, d) = acquire_named(Some(&s), &p, 4, 1, "e");
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // A check (cost 0) takes nothing.
    let (_, d) = acquire_named(Some(&s), &p, 5, 0, "f");
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Duration::from_millis(59_995)), "b's lease ends");
}

/// The marker of a denied acquisition: its id admitted later keeps its slot when the
/// earlier request's release arrives late.
#[test]
fn an_id_denied_then_sent_again_is_refused_and_kept_to_its_lease() {
    let p = params(1, 10);
    let (s, _) = acquire_named(None, &p, 0, 1, "x");
    let (s, d) = acquire_named(Some(&s), &p, 1_000, 1, "x");
    assert!(!d.allowed, "x holds a lease: the second x is refused");
    assert_eq!(d.retry_after, Some(Duration::from_secs(10)));
    // Both releases come; neither can say which x it ends, so neither frees it.
    let (s, _) = release_named(Some(&s), &p, 2_000, "x");
    let (s, _) = release_named(Some(&s), &p, 2_000, "x");
    assert!(!acquire_named(Some(&s), &p, 10_999, 1, "y").1.allowed);
    assert!(acquire_named(Some(&s), &p, 11_000, 1, "y").1.allowed, "expired");
}

#[test]
fn a_dead_envoys_named_leases_expire_while_the_tenant_retries() {
    let p = params(3, 15);
    let mut s = None;
    for id in ["dead1", "dead2", "dead3"] {
        s = Some(acquire_named(s.as_ref(), &p, 0, 1, id).0);
    }
    // Retries every 50 ms, each denied and released at once, with ids of their own.
    let mut now = 0;
    let mut first_admitted = None;
    for i in 0..400 {
        now += 50;
        let id = format!("retry{i}");
        let (next, d) = acquire_named(s.as_ref(), &p, now, 1, &id);
        if d.allowed {
            first_admitted = Some(now);
            break;
        }
        s = Some(release_named(Some(&next), &p, now + 1, &id).0);
    }
    assert_eq!(first_admitted, Some(15_000), "back exactly at the lease's end");
}

/// SplitMix64, for schedules a failure can name by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Random arrivals, each request releasing strictly within its lease (most after a
/// while, some at once, as a 429's release does), with ids drawn from `ids` (None:
/// anonymous). Returns the most admitted requests ever in flight, over the limit.
fn worst_overshoot(seed: u64, ids: Option<u64>) -> i64 {
    let mut rng = Rng(seed);
    let lease_secs = [1, 3, 10][rng.below(3) as usize];
    let p = params([1, 2, 3, 5][rng.below(4) as usize], lease_secs);
    // Events by time: (Reverse(at), kind, request, id); kind 0 arrival, 1 release.
    let mut events = BinaryHeap::new();
    let mut at = 0;
    for request in 0..200u64 {
        at += rng.below(p.window_ms / 2 + 1);
        events.push((std::cmp::Reverse(at), 0u8, request, 0u64));
    }
    let mut state: Option<State> = None;
    let mut in_flight = BTreeSet::new();
    let mut worst = i64::MIN;
    while let Some((std::cmp::Reverse(now), kind, request, id)) = events.pop() {
        if kind == 0 {
            let id = ids.map_or(0, |n| rng.below(n));
            let (next, d) = match ids {
                Some(_) => acquire_named(state.as_ref(), &p, now, 1, &id.to_string()),
                None => decide(state.as_ref(), &p, now, 1),
            };
            state = Some(next);
            if d.allowed {
                in_flight.insert(request);
            }
            let hold = if rng.below(4) == 0 {
                rng.below(3)
            } else {
                rng.below(p.window_ms - 1)
            };
            events.push((std::cmp::Reverse(now + hold), 1, request, id));
        } else {
            in_flight.remove(&request);
            state = Some(match ids {
                Some(_) => release_named(state.as_ref(), &p, now, &id.to_string()).0,
                None => release(state.as_ref(), &p, now, 1).0,
            });
        }
        worst = worst.max(in_flight.len() as i64 - p.limit as i64);
    }
    worst
}

#[test]
fn anonymous_never_over_admits() {
    for seed in 0..3_000 {
        assert!(worst_overshoot(seed, None) <= 0, "seed {seed}");
    }
}

/// Unique ids (Envoy's own `x-request-id`) and ids a client repeats on purpose.
#[test]
fn named_never_over_admits_whatever_ids_arrive() {
    for seed in 0..3_000 {
        for ids in [1_000_000, 5, 2, 1] {
            assert!(
                worst_overshoot(seed, Some(ids)) <= 0,
                "seed {seed}, {ids} ids"
            );
        }
    }
}

#[test]
fn expiry_covers_every_lease_and_marker() {
    let p = params(1, 10);
    let (s, _) = acquire_named(None, &p, 0, 1, "a");
    let (s, _) = acquire_named(Some(&s), &p, 5_000, 1, "b");
    assert!(!s.named["b"].holds, "a marker");
    assert_eq!(expires_at_ms(&s, 5_000), 15_000);
}
