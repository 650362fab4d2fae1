//! One bucket's claims and what each holds: the state a ledger keeps per bucket and
//! the steps of one report, pure (the caller passes the time in milliseconds). The
//! memory ledger keeps one [`Claims`] per bucket; `lua/rlqs.lua` keeps the same fields
//! in Redis and takes the same steps in the same order, so the two agree exactly
//! (`tests/it/rlqs_lua.rs` drives both).
//!
//! The bound it keeps: the tokens assigned to a bucket's streams, counted until the
//! assignment they were sent in can no longer be in force in an Envoy, never sum to
//! more than the limit. So a claim holds its tokens beyond its stream:
//! - a grant holds for the assignment's TTL plus a margin for delivery
//!   ([`Timing::hold_ms`]): an Envoy whose stream ends keeps its assignment that long;
//! - tokens given back are reusable only after [`Timing::grace_ms`]: the answer that
//!   lowers a share reaches its Envoy a little after the ledger counts it;
//! - a claim's weight (its say in the division) leaves when its stream ends or stops
//!   reporting ([`Timing::stale_ms`]); its tokens leave when their hold runs out.
//!
//! Every per-report step touches the reporter's claim and the bucket's running totals
//! only: the cost of a report does not grow with the streams. Deadlines (stale, hold,
//! grace) wait in an ordered set, at most [`EXPIRE_BATCH`] handled per call.
//!
//! Who claims under which name (client ids, aliases, takeovers) is [`names`]'s.

mod names;

use std::collections::{BTreeMap, BTreeSet};

use super::share;

/// Deadlines handled per call, at most: a burst of them (every stream of a bucket
/// gone at once) is worked off over the following reports.
pub const EXPIRE_BATCH: usize = 16;

/// The ledger's clock, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A claim not renewed this long loses its weight.
    pub stale_ms: u64,
    /// A grant holds its tokens this long: the assignment's TTL and a margin.
    pub hold_ms: u64,
    /// Tokens given back are reusable after this long.
    pub grace_ms: u64,
}

/// One report of the bucket by one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report<'a> {
    /// The claim the stream asks for: its client id's, or its own.
    pub name: &'a str,
    /// Its own claim, when `name` belongs to another live stream (`name` without a
    /// client id).
    pub alias: &'a str,
    /// The stream itself (unique per stream).
    pub owner: &'a str,
    /// Its weight ([`share::weight`]); `None`: not known yet.
    pub weight: Option<u64>,
    /// Whether its first report of the bucket covered time before the stream.
    pub resumed: bool,
    /// L: tokens per window.
    pub tokens: u64,
}

/// The reporter's grant and what the ledger knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub tokens: u64,
    /// Live claims, the reporter's included.
    pub streams: u64,
    /// How long the ledger has held this bucket.
    pub age_ms: u64,
    /// Whether the grant is on the stream's alias (its client id is another's).
    pub on_alias: bool,
    /// Whether it is less than the division's share for the stream (the rest is
    /// still held by others).
    pub partial: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    owner: String,
    /// Since when `owner` has held it.
    since: u64,
    weight: u64,
    known: bool,
    /// Last report, while the claim is live (reporting); `None` once it is not.
    seen: Option<u64>,
    /// Last report, live or not.
    last: u64,
    held: u64,
    hold_until: u64,
    /// Tokens given back, reusable from `pend_until`.
    pend: u64,
    pend_until: u64,
    /// Live, and granted less than its target rounded down at its last report.
    short: bool,
    /// The stream resuming the bucket that waits to take it over, and when it last
    /// asked.
    waiter: Option<(String, u64)>,
    /// Its place in [`Claims::due`].
    due: u64,
}

/// One bucket's claims and running totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    born: u64,
    /// Weights of the live claims, of those with a known demand, and their counts.
    weights: u64,
    known_weights: u64,
    known: u64,
    live: u64,
    /// Tokens held and pending, all claims.
    assigned: u64,
    /// Live claims that are short.
    short: u64,
    claims: BTreeMap<String, Claim>,
    due: BTreeSet<(u64, String)>,
    /// Client ids known to be presented by several Envoys, until when.
    shared: BTreeMap<String, u64>,
}

impl Claims {
    pub fn new(now: u64) -> Self {
        Self {
            born: now,
            weights: 0,
            known_weights: 0,
            known: 0,
            live: 0,
            assigned: 0,
            short: 0,
            claims: BTreeMap::new(),
            due: BTreeSet::new(),
            shared: BTreeMap::new(),
        }
    }

    /// Claim records kept (live or still holding tokens).
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Tokens assigned and not yet reusable.
    pub fn assigned(&self) -> u64 {
        self.assigned
    }

    /// The running totals, in the order `lua/rlqs.lua` keeps them: weights of the
    /// live claims, of those with a known demand, their count, live claims, tokens
    /// assigned, live claims short of their share, claim records.
    pub fn totals(&self) -> [u64; 7] {
        [
            self.weights,
            self.known_weights,
            self.known,
            self.live,
            self.assigned,
            self.short,
            self.claims.len() as u64,
        ]
    }

    /// Records `report` and returns its grant.
    pub fn claim(&mut self, report: &Report<'_>, timing: &Timing, now: u64) -> Grant {
        self.expire(timing, now);
        let on_alias = self.choose(report, timing, now);
        let key = if on_alias { report.alias } else { report.name };
        if !on_alias && report.alias != report.name {
            self.merge(report.alias, report.name, report.owner, now);
        }
        let mut claim = self
            .take(key)
            .unwrap_or_else(|| Claim::new(report.owner, now));
        claim.pass_to(report.owner, now);
        self.leave(&mut claim);
        let weight = match report.weight {
            Some(w) => w,
            None if self.known > 0 => self.known_weights / self.known,
            None => share::SCALE,
        };
        claim.weight = share::floored(weight, self.weights, self.live);
        claim.known = report.weight.is_some();
        claim.seen = Some(now);
        claim.last = now;
        self.join(&claim);
        let target = share::target(report.tokens, claim.weight, self.weights, self.live);
        let free = report.tokens.saturating_sub(self.assigned);
        let desired = share::desired(claim.held, target, free, self.short > 0);
        let tokens = share::grant(desired, claim.held, self.assigned, report.tokens);
        claim.short = tokens < target.0;
        self.short += u64::from(claim.short);
        if tokens < claim.held {
            claim.pend += claim.held - tokens;
            claim.pend_until = claim.pend_until.max(now + timing.grace_ms);
        } else {
            self.assigned += tokens - claim.held;
        }
        claim.held = tokens;
        if tokens > 0 {
            claim.hold_until = now + timing.hold_ms;
        }
        self.put(key, claim, timing);
        Grant {
            tokens,
            streams: self.live,
            age_ms: now.saturating_sub(self.born),
            on_alias,
            partial: tokens < desired,
        }
    }

    /// The stream `owner` ended: its claims under `name` and `alias` lose their
    /// weight now; their tokens stay held until their hold runs out.
    pub fn release(&mut self, name: &str, alias: &str, owner: &str, timing: &Timing, now: u64) {
        self.expire(timing, now);
        let keys: &[&str] = if alias == name {
            &[name]
        } else {
            &[name, alias]
        };
        for &key in keys {
            let Some(mut claim) = self.take(key) else {
                continue;
            };
            if claim.owner == owner {
                self.leave(&mut claim);
            }
            self.put(key, claim, timing);
        }
    }

    /// Handles the deadlines due by `now`, [`EXPIRE_BATCH`] at most.
    fn expire(&mut self, timing: &Timing, now: u64) {
        let due: Vec<String> = self
            .due
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(EXPIRE_BATCH)
            .map(|(_, name)| name.clone())
            .collect();
        for name in due {
            let Some(mut claim) = self.take(&name) else {
                continue;
            };
            if claim.seen.is_some_and(|seen| seen + timing.stale_ms <= now) {
                self.leave(&mut claim);
            }
            if claim.pend > 0 && claim.pend_until <= now {
                self.assigned -= claim.pend;
                claim.pend = 0;
            }
            if claim.held > 0 && claim.hold_until <= now {
                self.assigned -= claim.held;
                claim.held = 0;
            }
            self.put(&name, claim, timing);
        }
    }

    /// Takes a claim out of the map and the deadlines.
    fn take(&mut self, name: &str) -> Option<Claim> {
        let claim = self.claims.remove(name)?;
        self.due.remove(&(claim.due, name.to_owned()));
        Some(claim)
    }

    /// Puts a claim back with its next deadline, or drops it when it has none (not
    /// live, nothing held).
    fn put(&mut self, name: &str, mut claim: Claim, timing: &Timing) {
        let deadlines = [
            claim.seen.map(|seen| seen + timing.stale_ms),
            (claim.held > 0).then_some(claim.hold_until),
            (claim.pend > 0).then_some(claim.pend_until),
        ];
        let Some(due) = deadlines.into_iter().flatten().min() else {
            return;
        };
        claim.due = due;
        self.due.insert((due, name.to_owned()));
        self.claims.insert(name.to_owned(), claim);
    }

    /// The claim's weight (and shortness) out of the totals: it stops being live.
    fn leave(&mut self, claim: &mut Claim) {
        if claim.seen.take().is_some() {
            if std::mem::take(&mut claim.short) {
                self.short -= 1;
            }
            self.weights -= claim.weight;
            self.live -= 1;
            if claim.known {
                self.known_weights -= claim.weight;
                self.known -= 1;
            }
        }
    }

    /// The claim's weight into the totals.
    fn join(&mut self, claim: &Claim) {
        self.weights += claim.weight;
        self.live += 1;
        if claim.known {
            self.known_weights += claim.weight;
            self.known += 1;
        }
    }
}

impl Claim {
    fn new(owner: &str, now: u64) -> Self {
        Self {
            owner: owner.to_owned(),
            since: now,
            weight: 0,
            known: false,
            seen: None,
            last: 0,
            held: 0,
            hold_until: 0,
            pend: 0,
            pend_until: 0,
            short: false,
            waiter: None,
            due: 0,
        }
    }

    /// The claim is now `owner`'s (a takeover, when it was another's).
    fn pass_to(&mut self, owner: &str, now: u64) {
        if self.owner != owner {
            self.owner = owner.to_owned();
            self.since = now;
            self.waiter = None;
        }
    }
}

#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
