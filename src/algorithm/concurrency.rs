//! Concurrency: requests in flight. Every acquisition is a lease that expires one
//! window (the lease time: `unit` x `unit_multiplier`, or `lease`) after it was taken
//! unless a release (`is_negative_hits`) gives it back first, so an Envoy that dies
//! mid-request gives its slots back within the lease. Envoy sends the stream-done
//! release for denied requests too, so a release must never free a slot an admitted
//! request still holds. Two ways to keep that, by whether the rule names the entry
//! that identifies a request (`lease_key`):
//!
//! - **Named leases** (`lease_key: request_id`, the entry carrying `x-request-id`): a
//!   lease is the request's own, and a release frees exactly its own lease; a release
//!   of an unknown or expired lease frees nothing. A denied acquisition holds no slot
//!   but is remembered until its release (a marker), so that an id denied once and
//!   admitted later cannot have the earlier request's release free the later one's
//!   slot. An id acquired again while its lease lives (ids are the client's to send:
//!   Envoy keeps an incoming `x-request-id` from a trusted client) is refused, and
//!   its lease is then `reused`: no release can say which of the two requests it
//!   ends, so none frees it, and it stays until it expires, extended to the lease of
//!   the latest acquisition. So whatever ids arrive, a slot is freed only by the one
//!   request that took it, or by its expiry after that request's own lease: never more
//!   than the limit in flight while every request releases within its lease.
//! - **Anonymous leases** (no `lease_key`): a release cannot say whose lease it ends.
//!   Every acquisition counts, admitted or not (the denied request's release comes
//!   all the same), and a release gives back the **earliest-expiring** lease. That
//!   keeps the limit: while every request releases within its lease, the leases held
//!   are at least the requests in flight, because removing the earliest leaves
//!   leases that expire no sooner than the ones a matched release would have left
//!   (an exchange argument: see `tests::anonymous_never_over_admits`). Giving back
//!   the latest instead let a request that finished early remove a newer request's
//!   lease while its own older one expired under that newer request. The price, and
//!   it is unavoidable without identities: leases of an Envoy that died are renewed
//!   by any traffic that keeps arriving (each acquisition and release pair leaves the
//!   newer lease behind), so they come back only once the counter sees no acquisition
//!   for a whole lease. Name the lease to have them back within the lease.
//!
//! Anonymous leases are kept per whole second of expiry (a lease lasts its lease time,
//! rounded up to the second), so a counter holds at most one entry per second of the
//! lease however many requests are in flight; named leases are kept per id, to the
//! millisecond.

use std::collections::BTreeMap;

use super::{Division, Decision, Layout, Mode, Model, Params, Stored};

/// Leases held.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Anonymous leases: how many expire at each second (since the epoch).
    pub leases: BTreeMap<u64, u64>,
    /// Named leases, by the request's id.
    pub named: BTreeMap<String, Lease>,
}

/// One named lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// When it expires unless released first (ms since the epoch).
    pub expires_ms: u64,
    /// Whether it holds a slot: false for a denied acquisition's marker.
    pub holds: bool,
    /// The id was acquired again while this lived: no release frees it.
    pub reused: bool,
}

/// The second an anonymous lease taken at `now_ms` expires.
fn expiry(params: &Params, now_ms: u64) -> u64 {
    (now_ms + params.window_ms).div_ceil(1000)
}

/// The leases still held at `now_ms` (expired ones dropped) and how many slots they hold.
fn held(state: Option<&State>, now_ms: u64) -> (State, u64) {
    let mut s = state.cloned().unwrap_or_default();
    s.leases.retain(|&at, _| at * 1000 > now_ms);
    s.named.retain(|_, lease| lease.expires_ms > now_ms);
    let anonymous = s.leases.values().fold(0u64, |a, &b| a.saturating_add(b));
    let named = s.named.values().filter(|l| l.holds).count() as u64;
    (s, anonymous.saturating_add(named))
}

/// The expiries (ms) of the slots held, earliest first, with how many expire then.
fn slots(s: &State) -> Vec<(u64, u64)> {
    let mut slots: Vec<(u64, u64)> = s.leases.iter().map(|(&at, &n)| (at * 1000, n)).collect();
    slots.extend(
        s.named
            .values()
            .filter(|l| l.holds)
            .map(|l| (l.expires_ms, 1)),
    );
    slots.sort_unstable();
    slots
}

/// Until the last slot held frees (the counter admits its whole limit then).
fn reset_ms(s: &State, now_ms: u64) -> u64 {
    slots(s)
        .last()
        .map_or(0, |&(at, _)| at.saturating_sub(now_ms))
}

/// When a slot frees with `n` held: the (n - L + 1)-th earliest expiry (or sooner, by a
/// release).
fn retry_ms(s: &State, params: &Params, now_ms: u64, n: u64) -> u64 {
    let mut freed = 0u64;
    for (at, count) in slots(s) {
        freed = freed.saturating_add(count);
        if freed > n.saturating_sub(params.limit) {
            return at.saturating_sub(now_ms);
        }
    }
    reset_ms(s, now_ms)
}

/// An anonymous acquisition (or a check, `cost` 0).
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
    let retry = retry_ms(&s, params, now_ms, n);
    (s, Decision::deny(reset, Some(retry)))
}

/// Gives back the `cost` earliest-expiring anonymous leases (see the module's note).
pub fn release(state: Option<&State>, params: &Params, now_ms: u64, cost: u64) -> (State, Decision) {
    let (mut s, n) = held(state, now_ms);
    let mut left = cost;
    while left > 0 {
        let Some(mut first) = s.leases.first_entry() else {
            break;
        };
        let take = left.min(*first.get());
        *first.get_mut() -= take;
        left -= take;
        if *first.get() == 0 {
            first.remove();
        }
    }
    let remaining = params
        .limit
        .saturating_sub(n.saturating_sub(cost - left));
    let reset = reset_ms(&s, now_ms);
    (s, Decision::allow(remaining, reset))
}

/// A named acquisition by the request `id` (one slot, whatever its hits; `cost` 0
/// only checks): see the module's note.
pub fn acquire_named(
    state: Option<&State>,
    params: &Params,
    now_ms: u64,
    cost: u64,
    id: &str,
) -> (State, Decision) {
    let (mut s, n) = held(state, now_ms);
    if cost == 0 {
        return check(s, params, now_ms, n);
    }
    let expires_ms = now_ms + params.window_ms;
    if let Some(lease) = s.named.get_mut(id) {
        // The id again while its lease lives: refused, and the lease reused.
        lease.reused = true;
        lease.expires_ms = lease.expires_ms.max(expires_ms);
        let retry = lease.expires_ms - now_ms;
        let reset = reset_ms(&s, now_ms);
        return (s, Decision::deny(reset, Some(retry)));
    }
    let holds = n < params.limit;
    s.named.insert(
        id.to_owned(),
        Lease {
            expires_ms,
            holds,
            reused: false,
        },
    );
    let reset = reset_ms(&s, now_ms);
    if holds {
        return (s, Decision::allow(params.limit - n - 1, reset));
    }
    let retry = retry_ms(&s, params, now_ms, n);
    (s, Decision::deny(reset, Some(retry)))
}

/// The release of the request `id`: its own lease (or a denied acquisition's marker)
/// goes, unless reused; an unknown or expired one frees nothing.
pub fn release_named(
    state: Option<&State>,
    params: &Params,
    now_ms: u64,
    id: &str,
) -> (State, Decision) {
    let (mut s, mut n) = held(state, now_ms);
    if let Some(lease) = s.named.get(id).copied()
        && !lease.reused
    {
        s.named.remove(id);
        n -= u64::from(lease.holds);
    }
    let reset = reset_ms(&s, now_ms);
    (
        s,
        Decision::allow(params.limit.saturating_sub(n), reset),
    )
}

/// A check: what an acquisition would be told, nothing taken.
fn check(s: State, params: &Params, now_ms: u64, n: u64) -> (State, Decision) {
    let reset = reset_ms(&s, now_ms);
    if n < params.limit {
        return (s, Decision::allow(params.limit - n, reset));
    }
    let retry = retry_ms(&s, params, now_ms, n);
    (s, Decision::deny(reset, Some(retry)))
}

pub fn expires_at_ms(state: &State, now_ms: u64) -> u64 {
    let anonymous = state.leases.keys().next_back().map(|&at| at * 1000);
    let named = state.named.values().map(|l| l.expires_ms).max();
    anonymous.max(named).unwrap_or(now_ms)
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
    const DIVISION: Division = Division::Refused(
        "it counts requests in flight, not hits per window: a share of them cannot follow demand",
    );
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

    fn apply_named(
        state: Option<&State>,
        params: &Params,
        now_ms: u64,
        cost: u64,
        mode: Mode,
        id: &str,
    ) -> (State, Decision) {
        match mode {
            Mode::Release => release_named(state, params, now_ms, id),
            _ => acquire_named(state, params, now_ms, cost, id),
        }
    }

    fn expires_at_ms(state: &State, _params: &Params, now_ms: u64) -> u64 {
        expires_at_ms(state, now_ms)
    }

    /// Never sent: a lease is counted whatever the request's answer (it commits).
    fn refund(state: &State, _params: &Params, _now_ms: u64, _token: i64, _cost: u64) -> State {
        state.clone()
    }

    // concurrency.lua: anonymous leases in a hash {expiry second (unix s) = leases
    // expiring then}; named ones in a sorted set (read as a hash's fields here).
    fn describe(stored: &Stored) -> String {
        match stored {
            Stored::SortedSet { members } => format!("{members} named leases and markers"),
            _ => format!("leases by expiry second (unix s): {}", stored.fields_text()),
        }
    }

    /// A map node per expiry second, each about two words and the tree's share; a
    /// named lease its id and its node.
    fn heap_bytes(state: &State) -> usize {
        let named: usize = state
            .named
            .keys()
            .map(|id| id.capacity() + 6 * std::mem::size_of::<u64>())
            .sum();
        state.leases.len() * 4 * std::mem::size_of::<u64>() + named
    }
}

#[cfg(test)]
#[path = "concurrency_tests.rs"]
mod tests;
