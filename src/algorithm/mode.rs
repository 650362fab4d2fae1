//! What one counter operation does to its counter: limit (today's admission, a
//! denial consumes nothing), charge (always consumes; `overdraft` and upstream's
//! `quota_mode` differ only in the admission test) or release (gives hits back).
//! Each [`super::Model`] defines the charge and the release for itself; this is the
//! one place that names the modes and their wire bits.

use std::time::Duration;

use super::{Algorithm, Decision};

/// How an operation treats its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Admit iff the cost fits; a denial consumes nothing (tollgate's default).
    #[default]
    Limit,
    /// `overdraft: true`: always consume; admit while the counter was below its limit
    /// before the request (what remains is at least one), so one charge may overdraw
    /// the budget and the next request waits until the debt is paid back.
    Overdraft,
    /// `quota_mode` (envoyproxy/ratelimit's INCRBY): always consume; admit iff the
    /// cost fits in what remained before the request, as upstream's `after <= limit`.
    Quota,
    /// `is_negative_hits`: give the cost back, never below zero, never denied.
    Release,
}

impl Mode {
    /// Every mode, for the contract the Lua engine is generated with.
    pub const ALL: [Mode; 4] = [Mode::Limit, Mode::Overdraft, Mode::Quota, Mode::Release];

    /// Whether the operation's new state is written whatever its answer and whatever
    /// the rest of the request's answer (charges and releases are facts about the
    /// past: the tokens were spent, the request finished).
    pub fn commits(self) -> bool {
        self != Mode::Limit
    }

    /// What must remain before a charge of `cost` for it to be admitted.
    pub fn need(self, cost: u64) -> u64 {
        match self {
            Mode::Overdraft => 1,
            _ => cost,
        }
    }

    /// Its bits in the wire operation's bits byte (bit 0 is `vetoes`); the Lua engine
    /// reads them through the contract (`store/redis/scripts/contract.rs`).
    pub fn wire_bits(self) -> u8 {
        match self {
            Mode::Limit => 0,
            Mode::Overdraft => 2,
            Mode::Quota => 4,
            Mode::Release => 6,
        }
    }

    /// The name logs and metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Limit => "limit",
            Mode::Overdraft => "overdraft",
            Mode::Quota => "quota",
            Mode::Release => "release",
        }
    }
}

impl Mode {
    /// Whether an operation in this mode writes its state whatever the answers: a
    /// charge where the algorithm defines charges, a release where it gives back.
    pub fn commits_on(self, algorithm: Algorithm) -> bool {
        match self {
            Mode::Limit => algorithm.counts_denials(),
            Mode::Overdraft | Mode::Quota => {
                algorithm.charge_refusal().is_none() || algorithm.counts_denials()
            }
            Mode::Release => algorithm.releases(),
        }
    }
}

/// A charge in terms of a model's own limit decision (`decide(state, cost)` at the
/// operation's instant), so every model charges with the windows, refills and
/// rounding it already has; `add` puts the cost on the state at now, past the limit
/// if need be. The Lua twin is `charge_with` in `lua/common.lua`, in the same order.
pub(super) fn charge<S>(
    decide: impl Fn(Option<&S>, u64) -> (S, Decision),
    add: impl FnOnce(&S) -> S,
    state: Option<&S>,
    need: u64,
) -> (S, Decision) {
    // The state at now (window rolled, bucket refilled): a check changes nothing else.
    let (rolled, _) = decide(state, 0);
    let admitted = decide(Some(&rolled), need).1.allowed;
    let after = add(&rolled);
    let check = decide(Some(&after), 0).1;
    let retry_after = if admitted {
        None
    } else {
        // When `need` fits again on the charged state: the debt paid back.
        decide(Some(&after), need).1.retry_after
    };
    let decision = Decision {
        allowed: admitted,
        // A check on an overdrawn counter is denied with 0 remaining: "0 while
        // overdrawn"; a denial reports 0, as every denial does.
        remaining: if admitted && check.allowed {
            check.remaining
        } else {
            0
        },
        reset_after: check.reset_after,
        retry_after,
        delay: Duration::ZERO,
    };
    (after, decision)
}

/// A release in terms of the model's limit decision: `sub` gives the cost back on the
/// state at now (never below empty); the answer is a check's, always allowed. The Lua
/// twin is `release_with` in `lua/common.lua`.
pub(super) fn release<S>(
    decide: impl Fn(Option<&S>, u64) -> (S, Decision),
    sub: impl FnOnce(&S) -> S,
    state: Option<&S>,
) -> (S, Decision) {
    let (rolled, _) = decide(state, 0);
    let after = sub(&rolled);
    let check = decide(Some(&after), 0).1;
    let decision = Decision {
        allowed: true,
        remaining: if check.allowed { check.remaining } else { 0 },
        reset_after: check.reset_after,
        retry_after: None,
        delay: Duration::ZERO,
    };
    (after, decision)
}
