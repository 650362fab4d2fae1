//! The arithmetic of one stream's share of a bucket's limit: pure integers, no I/O, no
//! clock, no state. [`super::claims`] applies it to a bucket's claims; `lua/rlqs.lua`
//! repeats it step for step (the same integer operations), so a bucket divides the
//! same way whichever ledger holds it.
//!
//! Shares follow demand, within three bounds:
//! - a stream's weight is its demand (allowed + denied per second) as a fraction of
//!   the limit's rate, counted up to the whole rate: no Envoy could use more than the
//!   whole limit, so a stream reporting u64::MAX weighs what one honest Envoy that
//!   wants everything weighs, and no more ([`weight`]);
//! - every stream weighs at least [`FLOOR_PERCENT`] of the others' mean, so an idle
//!   Envoy can still admit the first requests that arrive before its next report;
//! - a share is whole tokens per window, and what a stream is granted never takes the
//!   bucket's assigned total past the limit ([`grant`]): a stream whose target rose
//!   (a newcomer, or one whose demand grew) takes only what is unassigned, and gets the
//!   rest once the others have reported and given theirs back. So a stream may get
//!   zero until the next division.
//!
//! Small moves are not made ([`HYSTERESIS_PERCENT`], and a stream whose share is a
//! fraction of a token keeps the whole token it holds): Envoy rebuilds a changed token
//! bucket full, so a share that jitters would admit a bucket's worth at every change.
//! Rounding up goes first to whoever finds a token free, and back while another
//! stream holds less than its share rounded down ([`desired`]), so whole tokens end up
//! within one of every stream's exact share when there are enough to go round.

/// A weight is millionths of the limit's rate (1,000,000: the whole limit).
pub const SCALE: u64 = 1_000_000;

/// The least weight of a stream, in percent of the others' mean weight.
pub const FLOOR_PERCENT: u64 = 5;

/// A share within this percentage of the one held is kept.
pub const HYSTERESIS_PERCENT: u64 = 5;

/// The weight of a demand of `demand` requests per second on a limit of `tokens` per
/// `window_secs`: the fraction of the limit's rate it could use, at most [`SCALE`].
pub fn weight(demand: f64, tokens: u64, window_secs: u64) -> u64 {
    let rate = tokens as f64 / window_secs.max(1) as f64;
    // NaN, negative and zero demands weigh nothing; so does anything on a zero limit.
    if demand.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || rate <= 0.0 {
        return 0;
    }
    ((demand / rate).min(1.0) * SCALE as f64).round() as u64
}

/// `weight`, at least [`FLOOR_PERCENT`] of the mean of `others` weights summing to
/// `others_sum`.
pub fn floored(weight: u64, others_sum: u64, others: u64) -> u64 {
    if others == 0 {
        return weight;
    }
    weight.max(others_sum * FLOOR_PERCENT / (100 * others))
}

/// A stream's exact share of `tokens`, `tokens * weight / total`, rounded down and up;
/// with no weight at all (every stream idle) an equal part of `live` streams.
pub fn target(tokens: u64, weight: u64, total: u64, live: u64) -> (u64, u64) {
    let (numerator, denominator) = if total == 0 {
        (tokens, live.max(1))
    } else {
        // At most 2^32 tokens times SCALE (2^20): no overflow, and exact in Lua too.
        (tokens * weight, total)
    };
    let floor = numerator / denominator;
    (floor, floor + u64::from(numerator % denominator > 0))
}

/// The share a stream holding `held` tokens should have for a target of
/// `floor..=ceil`, with `free` tokens unassigned and, `others_short`, another stream
/// holding less than its target rounded down:
/// - while another is short, the target rounded down: what rounding up took goes back
///   to it;
/// - else what it holds when that is within rounding of the target (taking the
///   rounded-up target when it is free) or within [`HYSTERESIS_PERCENT`] of it;
/// - else the target rounded up, so a fraction of a token is a token, for as long as
///   there are tokens to give.
pub fn desired(held: u64, (floor, ceil): (u64, u64), free: u64, others_short: bool) -> u64 {
    let near = |apart: u64| 100 * apart <= HYSTERESIS_PERCENT * held;
    if held > 0 && held < floor && near(floor - held) {
        return held;
    }
    if others_short {
        return floor;
    }
    if held > 0 && (floor..=ceil).contains(&held) {
        return if free >= ceil - held { ceil } else { held };
    }
    if held > ceil && near(held - ceil) {
        return held;
    }
    ceil
}

/// What a stream holding `held` of the bucket's `assigned` tokens (its own included)
/// may be granted of `desired`, on a limit of `tokens`: never so much that the
/// bucket's assigned total passes the limit. When it already does (the limit was
/// lowered by a reload), the reporter gives back what it can.
pub fn grant(desired: u64, held: u64, assigned: u64, tokens: u64) -> u64 {
    desired.min((tokens + held).saturating_sub(assigned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_counts_demand_up_to_the_whole_rate() {
        // 600 per minute is 10 per second.
        assert_eq!(weight(2.5, 600, 60), 250_000);
        assert_eq!(weight(10.0, 600, 60), SCALE);
        assert_eq!(weight(25.0, 600, 60), SCALE);
        assert_eq!(weight(u64::MAX as f64, 600, 60), SCALE);
        assert_eq!(weight(f64::INFINITY, 600, 60), SCALE);
        for nothing in [0.0, -1.0, f64::NAN] {
            assert_eq!(weight(nothing, 600, 60), 0);
        }
        assert_eq!(weight(5.0, 0, 60), 0);
    }

    #[test]
    fn the_floor_is_a_part_of_the_others_mean() {
        assert_eq!(floored(0, 2 * SCALE, 2), SCALE / 20);
        assert_eq!(floored(SCALE, 2 * SCALE, 2), SCALE);
        assert_eq!(floored(0, 0, 0), 0);
    }

    #[test]
    fn targets_round_both_ways() {
        assert_eq!(target(600, 1, 3, 3), (200, 200));
        assert_eq!(target(10, 1, 3, 3), (3, 4));
        assert_eq!(target(600, 0, 0, 4), (150, 150));
        assert_eq!(
            target(u64::from(u32::MAX), SCALE, SCALE, 1).0,
            u64::from(u32::MAX)
        );
    }

    #[test]
    fn small_moves_are_not_made() {
        assert_eq!(desired(400, (399, 400), 0, false), 400);
        assert_eq!(desired(400, (380, 381), 0, false), 400, "within 5%");
        assert_eq!(desired(400, (370, 371), 0, false), 371);
        assert_eq!(desired(400, (430, 431), 0, false), 431);
        assert_eq!(desired(400, (410, 411), 0, true), 400, "within 5%");
        // A fraction of a token: the token held is kept; none held asks for one.
        assert_eq!(desired(1, (0, 1), 0, false), 1);
        assert_eq!(desired(0, (0, 1), 0, false), 1);
        assert_eq!(desired(0, (0, 0), 0, false), 0);
    }

    #[test]
    fn rounding_gives_way_to_a_stream_short_of_its_share() {
        // 1.5 tokens each: rounded up while nobody lacks one, down while one does.
        assert_eq!(desired(2, (1, 2), 0, true), 1);
        assert_eq!(desired(0, (1, 2), 0, true), 1);
        assert_eq!(desired(1, (1, 2), 0, false), 1, "nothing free");
        assert_eq!(desired(1, (1, 2), 1, false), 2, "the rounding is free");
        assert_eq!(desired(2, (1, 2), 0, false), 2);
    }

    #[test]
    fn a_grant_never_takes_the_total_past_the_limit() {
        assert_eq!(grant(300, 0, 600, 600), 0, "nothing unassigned");
        assert_eq!(grant(300, 0, 500, 600), 100);
        assert_eq!(grant(300, 100, 500, 600), 200);
        assert_eq!(
            grant(50, 100, 500, 600),
            50,
            "giving back is always possible"
        );
        assert_eq!(
            grant(100, 100, 700, 600),
            0,
            "over a lowered limit: give back"
        );
    }
}
