//! Time for global rules. Windows of W are aligned to the Unix epoch, as the fixed
//! window counts them, so every region names a window by the same number (its
//! index, `now / W`); a bucket's shares follow the same epochs. A share is granted
//! per window, and this module says for which windows ([`granted`]: the lease) and
//! which grant a request takes near a boundary ([`candidates`]), where this host and
//! its Redis may put the same instant in different windows.
//!
//! The lease: a report at `now` is granted shares for the window in progress and for
//! every window that starts within `lead` of now, with lead = W clamped to
//! [3 report periods, 1 hour]. For W of a minute that is the current and the next
//! window, so a region cut off from the ledger keeps deciding on its shares for at
//! least one whole window after its last contact; the ledger, for its part, never
//! hands a window's share to anyone else once granted, so a region that vanished
//! holds what it was granted until those windows end, and the windows after them are
//! divided without it.

use std::ops::RangeInclusive;

/// The longest lead: windows of a day or a month get their next share an hour ahead.
pub const MAX_LEAD_MS: u64 = 3_600_000;
/// Report periods the lead spans at least, so a window shorter than a few periods
/// still has its share before it starts.
pub const LEAD_PERIODS: u64 = 3;

/// The window holding `now_ms`.
pub fn index(now_ms: u64, window_ms: u64) -> u64 {
    now_ms / window_ms.max(1)
}

/// When window `index` starts, ms since the epoch.
pub fn start(index: u64, window_ms: u64) -> u64 {
    index.saturating_mul(window_ms)
}

/// When window `index` ends (the next one's start).
pub fn end(index: u64, window_ms: u64) -> u64 {
    start(index.saturating_add(1), window_ms)
}

/// How far ahead of its start a window's share is granted.
pub fn lead(window_ms: u64, report_period_ms: u64) -> u64 {
    let least = report_period_ms.saturating_mul(LEAD_PERIODS);
    window_ms.clamp(least.min(MAX_LEAD_MS), MAX_LEAD_MS.max(least))
}

/// The windows a report at `now_ms` is granted shares for: the one in progress and
/// each one starting within `lead_ms` of now.
pub fn granted(now_ms: u64, window_ms: u64, lead_ms: u64) -> RangeInclusive<u64> {
    let first = index(now_ms, window_ms);
    let last = index(now_ms.saturating_add(lead_ms), window_ms).max(first);
    first..=last
}

/// How close to a boundary a request takes the smaller of the two windows' grants:
/// the clock skew allowed between this host and its Redis, but at most a quarter of
/// the window (a longer guard would cover most of a short window).
pub fn guard(window_ms: u64, skew_ms: u64) -> u64 {
    skew_ms.min(window_ms / 4)
}

/// The windows a request at `now_ms` (by this host's clock) may be counted in, by a
/// Redis whose clock is within `guard_ms` of this host's: the window in progress,
/// and its neighbour when the boundary is nearer than the guard. The request takes
/// the smallest grant among them, so it never counts against more than the share of
/// the window Redis puts it in.
pub fn candidates(now_ms: u64, window_ms: u64, guard_ms: u64) -> RangeInclusive<u64> {
    let current = index(now_ms, window_ms);
    let into = now_ms - start(current, window_ms);
    let first = if into < guard_ms && current > 0 {
        current - 1
    } else {
        current
    };
    let last = if window_ms - into <= guard_ms {
        current + 1
    } else {
        current
    };
    first..=last
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    #[test]
    fn windows_are_epoch_aligned() {
        assert_eq!(index(119_999, MINUTE), 1);
        assert_eq!(index(120_000, MINUTE), 2);
        assert_eq!((start(2, MINUTE), end(2, MINUTE)), (120_000, 180_000));
    }

    #[test]
    fn a_minute_is_granted_with_the_next_and_a_second_a_few_periods_ahead() {
        assert_eq!(lead(MINUTE, 2_000), MINUTE);
        assert_eq!(lead(1_000, 2_000), 6_000);
        assert_eq!(lead(86_400_000, 2_000), MAX_LEAD_MS);
        // Just after a boundary and just before the next: always the current and next.
        assert_eq!(granted(120_000, MINUTE, MINUTE), 2..=3);
        assert_eq!(granted(179_999, MINUTE, MINUTE), 2..=3);
        // One-second windows: the current and those starting within 6 s.
        assert_eq!(granted(10_500, 1_000, 6_000), 10..=16);
        // A day: tomorrow only in the last hour of today.
        let day = 86_400_000;
        assert_eq!(granted(day + 1, day, MAX_LEAD_MS), 1..=1);
        assert_eq!(granted(2 * day - MAX_LEAD_MS + 1, day, MAX_LEAD_MS), 1..=2);
    }

    #[test]
    fn near_a_boundary_both_windows_are_candidates() {
        let guard = guard(MINUTE, 250);
        assert_eq!(guard, 250);
        assert_eq!(candidates(130_000, MINUTE, guard), 2..=2);
        assert_eq!(candidates(120_100, MINUTE, guard), 1..=2);
        assert_eq!(candidates(179_800, MINUTE, guard), 2..=3);
        assert_eq!(candidates(179_749, MINUTE, guard), 2..=2);
        // A short window: the guard is at most a quarter of it.
        assert_eq!(super::guard(1_000, 600), 250);
        assert_eq!(candidates(5, 1_000, 250), 0..=0);
    }
}
