//! Who claims under which name. A stream without a client id claims under its own name. With a client id,
//! it claims under the id's name, unless another live stream holds that claim: then
//! under its own alias, so streams sharing an id (one Envoy config for a fleet) are
//! told apart. A stream that resumes the bucket (Envoy reconnected: its first report
//! covers time before the stream) takes the id's claim over, tokens included, once
//! the claim's stream has ended or gone stale: they are its own Envoy's assignment,
//! and taking them spares it a wait for their hold. Unless the id is known to be
//! shared: presented by a stream new to the bucket while another held the claim, or
//! the claim renewed by its stream after this one began on its alias (two streams of
//! the id alive at once; the stream an Envoy reconnected from never reports again), or
//! two streams resuming the bucket both waiting for the claim. Then the tokens may be
//! another Envoy's assignment, and they wait out their hold.
//! Envoy reports every 5 s, so a live stream is never stale: the takeover rests on a
//! client id that no two Envoys share without ever reporting the bucket together.

use super::{Claim, Claims, Report, Timing};

impl Claims {
    /// Whether the report goes on the stream's alias, marking the id shared when
    /// the report shows it is (see the module docs).
    pub(super) fn choose(&mut self, report: &Report<'_>, timing: &Timing, now: u64) -> bool {
        if report.alias == report.name {
            return false;
        }
        let alias_since = self
            .claims
            .get(report.alias)
            .filter(|a| a.owner == report.owner)
            .map(|a| a.since);
        let Some(claim) = self.claims.get_mut(report.name) else {
            return false;
        };
        if claim.owner == report.owner {
            return false;
        }
        // Taken or renewed by its stream after this one began on its alias.
        let renewed_since = |since| claim.since.max(claim.last) > since;
        let live = |seen: u64| now.saturating_sub(seen) < timing.stale_ms;
        // Another stream resuming the bucket and waiting for the claim: two Envoys.
        let other_waiter = claim
            .waiter
            .as_ref()
            .is_some_and(|(w, seen)| w != report.owner && live(*seen));
        if !report.resumed || alias_since.is_some_and(renewed_since) || other_waiter {
            // Remembered beside the claims (the claim may go and come back) for as
            // long as tokens granted meanwhile can be held.
            let until = now + timing.hold_ms + timing.stale_ms;
            self.shared.insert(report.name.to_owned(), until);
            return true;
        }
        claim.waiter = Some((report.owner.to_owned(), now));
        let owner_live = claim.seen.is_some_and(live);
        owner_live
            || self
                .shared
                .get(report.name)
                .is_some_and(|&until| now < until)
    }

    /// Moves what the alias claim of `owner` holds into `name`'s claim (the stream
    /// is back on its id's claim): one Envoy, one assignment.
    pub(super) fn merge(&mut self, alias: &str, name: &str, owner: &str, now: u64) {
        if self.claims.get(alias).is_none_or(|a| a.owner != owner) {
            return;
        }
        let Some(mut from) = self.take(alias) else {
            return;
        };
        self.leave(&mut from);
        let mut into = self.take(name).unwrap_or_else(|| Claim::new(owner, now));
        into.pass_to(owner, now);
        into.held += from.held;
        into.hold_until = into.hold_until.max(from.hold_until);
        into.pend += from.pend;
        into.pend_until = into.pend_until.max(from.pend_until);
        // Rescheduled with its new deadlines when the report puts it back.
        self.claims.insert(name.to_owned(), into);
    }
}
