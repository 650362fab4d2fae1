//! Concurrency: requests in flight. Every acquisition is a lease that expires one
//! window (the lease time: `unit` x `unit_multiplier`) after it was taken unless a
//! release (`is_negative_hits`) gives it back first, so an Envoy that dies
//! mid-request gives its slots back within the lease. Admit while fewer than the
//! limit were held before the request; every acquisition counts, admitted or not,
//! because Envoy sends the stream-done release for denied requests too: were a denied
//! acquisition not counted, its release would free a slot an admitted request holds.
//! A release gives back the latest-expiring leases: the leases are anonymous, and
//! giving back the earliest would hand a dead Envoy's old leases the expiry of the
//! newest acquisitions; under steady traffic (each denied try taking a lease and
//! releasing one) they would never expire. Given back from the newest, every lease
//! left is as old as it really is, so a dead Envoy's slots come back within the
//! lease whatever the traffic; a live request runs on an older lease only when it
//! outlives the lease, which the lease time is chosen to exceed.
//!
//! Leases are kept per whole second of expiry (a lease lasts its lease time, rounded
//! up to the second), so a counter holds at most one entry per second of the lease
//! however many requests are in flight.

use std::collections::BTreeMap;

use super::{Decision, Layout, Model, Params, Stored};

/// Leases held: how many expire at each second (since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    pub leases: BTreeMap<u64, u64>,
}

/// The second a lease taken at `now_ms` expires.
fn expiry(params: &Params, now_ms: u64) -> u64 {
    (now_ms + params.window_ms).div_ceil(1000)
}

/// The leases still held at `now_ms` (expired ones dropped) and how many.
fn held(state: Option<&State>, now_ms: u64) -> (State, u64) {
    let mut s = state.cloned().unwrap_or_default();
    s.leases.retain(|&at, _| at * 1000 > now_ms);
    let n = s.leases.values().fold(0u64, |a, &b| a.saturating_add(b));
    (s, n)
}

/// Until the last lease expires (the counter is empty then).
fn reset_ms(s: &State, now_ms: u64) -> u64 {
    s.leases
        .keys()
        .next_back()
        .map_or(0, |&at| (at * 1000).saturating_sub(now_ms))
}

pub fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let (mut s, n) = held(state, now_ms);
    let admitted = n < params.limit;
    if cost > 0 {
        let leases = s.leases.entry(expiry(params, now_ms)).or_default();
        *leases = leases.saturating_add(cost);
    }
    let reset = reset_ms(&s, now_ms);
    if admitted {
        let remaining = params.limit.saturating_sub(n.saturating_add(cost));
        return (s, Decision::allow(remaining, reset));
    }
    // A slot frees when the (n - L + 1)-th earliest lease expires, or sooner by a release.
    let mut freed = 0;
    let mut retry = reset;
    for (&at, &count) in &s.leases {
        freed = count.saturating_add(freed);
        if freed > n - params.limit {
            retry = (at * 1000).saturating_sub(now_ms);
            break;
        }
    }
    (s, Decision::deny(reset, Some(retry)))
}

/// Gives back the `cost` latest-expiring leases (see the module's note).
pub fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let (mut s, n) = held(state, now_ms);
    let mut left = cost;
    while left > 0 {
        let Some(mut last) = s.leases.last_entry() else {
            break;
        };
        let take = left.min(*last.get());
        *last.get_mut() -= take;
        left -= take;
        if *last.get() == 0 {
            last.remove();
        }
    }
    let remaining = params
        .limit
        .saturating_sub(n.saturating_sub(cost - left));
    let reset = reset_ms(&s, now_ms);
    (s, Decision::allow(remaining, reset))
}

pub fn expires_at_ms(state: &State, now_ms: u64) -> u64 {
    state
        .leases
        .keys()
        .next_back()
        .map_or(now_ms, |&at| at * 1000)
}

/// This model in the list of `algorithm/mod.rs`; its Lua twin is `lua/concurrency.lua`.
pub struct Concurrency;

impl Model for Concurrency {
    const NAME: &'static str = "concurrency";
    const KEY_NAME: &'static str = "cc";
    const LUA: &'static str = include_str!("../../lua/concurrency.lua");
    const USES_BURST: bool = false;
    const MAX_LIMIT: Option<u64> = None;
    const ALLOWS_ZERO_RATE: bool = false;
    const TAKES_MAX_DELAY: bool = false;
    const TAKES_TIME_ZONE: bool = false;
    const TAKES_LEASE: bool = true;
    const LAYOUT: Layout = Layout::Hash;
    const CHARGE_REFUSAL: Option<&'static str> = Some(
        "concurrency already counts every acquisition, admitted or not, until its \
         release or its lease gives it back: overdraft and quota_mode have nothing to add",
    );
    const RELEASES: bool = true;
    const COUNTS_DENIALS: bool = true;
    type State = State;

    fn decide(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        decide(state, params, now_ms, cost)
    }

    /// Never called: [`Self::CHARGE_REFUSAL`] refuses charges at load.
    fn charge(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        _need: u64,
    ) -> (State, Decision) {
        decide(state, params, now_ms, cost)
    }

    fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
        release(state, params, now_ms, cost)
    }

    fn expires_at_ms(state: &State, _params: &Params, now_ms: u64) -> u64 {
        expires_at_ms(state, now_ms)
    }

    // concurrency.lua: a hash {expiry second (unix s) = leases expiring then}
    fn describe(stored: &Stored) -> String {
        format!("leases by expiry second (unix s): {}", stored.fields_text())
    }

    /// A map node per expiry second, each about two words and the tree's share.
    fn heap_bytes(state: &State) -> usize {
        state.leases.len() * 4 * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
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
}
