//! Calendar periods in a time zone (`rate_limit.time_zone`): the day, week (from
//! Monday), month and year as a clock on the wall of that zone counts them, so across
//! month ends, leap years and daylight-saving changes a period is as long as the
//! calendar says (a Berlin day in March can be 23 hours, February 29 days).
//!
//! Pure arithmetic on the IANA database compiled into `chrono-tz`: the models of
//! `fixed_window` and `sliding_window` ask [`Calendar::period_at`] for the period that
//! holds an instant. The Lua twins cannot run a time-zone database, so the Redis store
//! sends the starts of six consecutive periods around tollgate's own clock
//! ([`Calendar::bounds_around`]) and the script takes, among the middle three, the
//! one holding Redis's clock (`calendar` in `lua/common.lua`): the clocks may differ
//! by up to a whole period (at least 23 hours) and the period is still Redis's.

use std::cell::Cell;

use chrono::{DateTime, Datelike, Days, LocalResult, NaiveDate, Offset, TimeZone};
use chrono_tz::Tz;

/// The units that are calendar periods in a zone. A second, minute and hour are not:
/// they keep their fixed lengths from the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day,
    Week,
    Month,
    Year,
}

/// A limit's period: `every` consecutive `unit`s of the calendar in `zone`, counted
/// from the first one of 1970 (so `every: 3` months are the quarters from January;
/// weeks count from Monday 29 December 1969).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub zone: Tz,
    pub unit: CalendarUnit,
    /// The unit multiplier, at least 1.
    pub every: u32,
}

/// One period and its neighbours' edges, all in milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// The start of the period before (the sliding window's previous count).
    pub prev_start: u64,
    pub start: u64,
    /// The end of this period: the start of the next, and the reset reported.
    pub end: u64,
    /// The end of the period after (a sliding window's state matters until then).
    pub next_end: u64,
}

/// The latest instant the arithmetic accepts (the end of year 9999 UTC): a later
/// clock is read as this one, so no input can step outside chrono's dates.
const LAST_MS: u64 = 253_402_300_799_999;

/// 1970-01-01 as days from the common era's first day (chrono's day numbering).
const EPOCH_DAYS_CE: i64 = 719_163;

/// The bounds last computed on this thread, a few calendars' worth: they hold for a
/// whole period, so a hot rule computes its periods once a day or a month rather than
/// on every decision (each is a handful of time-zone conversions).
const CACHED: usize = 4;

/// A calendar, the six period starts last computed for it, and the first's number.
type Known = Option<(Calendar, [u64; 6], i64)>;

thread_local! {
    /// The entries, and which one the next miss replaces.
    static RECENT: Cell<([Known; CACHED], usize)> = const { Cell::new(([None; CACHED], 0)) };
}

impl Calendar {
    /// The period that holds `now_ms`.
    pub fn period_at(&self, now_ms: u64) -> Period {
        let b = self.bounds_around(now_ms);
        Period {
            prev_start: b[1],
            start: b[2],
            end: b[3],
            next_end: b[4],
        }
    }

    /// The starts of six consecutive periods: two before the one holding `now_ms`,
    /// that one, and three after. A clock anywhere in the middle three periods finds
    /// its own period, its predecessor's start and its successor's end among them.
    pub fn bounds_around(&self, now_ms: u64) -> [u64; 6] {
        self.numbered_bounds_around(now_ms).0
    }

    /// [`Calendar::bounds_around`], and the number of the first of the six periods
    /// (periods counted from 1970's first), which tells consecutive periods apart
    /// (the sliding window's identity of its window).
    pub fn numbered_bounds_around(&self, now_ms: u64) -> ([u64; 6], i64) {
        let now = now_ms.min(LAST_MS);
        let (mut recent, next) = RECENT.get();
        let hit = recent.iter().flatten().find(|(calendar, b, _)| {
            calendar == self && b[2] <= now && (now < b[3] || b[3] == LAST_MS)
        });
        if let Some((_, bounds, first)) = hit {
            return (*bounds, *first);
        }
        let index = self.index_at(now_ms);
        let bounds = [-2, -1, 0, 1, 2, 3].map(|d| self.start_of(index + d));
        recent[next] = Some((*self, bounds, index - 2));
        RECENT.set((recent, (next + 1) % CACHED));
        (bounds, index - 2)
    }

    /// The number of the period holding `now_ms` (periods counted from 1970's first).
    fn index_at(&self, now_ms: u64) -> i64 {
        let now = now_ms.min(LAST_MS);
        let local = match DateTime::from_timestamp_millis(now as i64) {
            Some(utc) => utc.with_timezone(&self.zone).date_naive(),
            None => NaiveDate::default(),
        };
        let every = i64::from(self.every.max(1));
        let mut index = self.ordinal(local).div_euclid(every);
        // Where the local date runs backwards for an hour (a zone that falls back
        // across midnight), the date alone can name the wrong period: settle it
        // against the very boundaries the periods are made of. It is off by one
        // period at most; the bound keeps the ends of chrono's range (where every
        // start reads as the last instant) from stepping on forever.
        for _ in 0..3 {
            if self.start_of(index + 1) <= now {
                index += 1;
            } else if self.start_of(index) > now {
                index -= 1;
            } else {
                break;
            }
        }
        index
    }

    /// `date`'s unit counted from 1970's first (days, weeks from Monday, months,
    /// years).
    fn ordinal(&self, date: NaiveDate) -> i64 {
        let days = i64::from(date.num_days_from_ce()) - EPOCH_DAYS_CE;
        match self.unit {
            CalendarUnit::Day => days,
            // 1970-01-01 was a Thursday: Monday 1969-12-29 starts week 0.
            CalendarUnit::Week => (days + 3).div_euclid(7),
            CalendarUnit::Month => (i64::from(date.year()) - 1970) * 12 + i64::from(date.month0()),
            CalendarUnit::Year => i64::from(date.year()) - 1970,
        }
    }

    /// The first local day of period `index`.
    fn first_day(&self, index: i64) -> Option<NaiveDate> {
        let n = index.checked_mul(i64::from(self.every.max(1)))?;
        let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
        let from_epoch = |days: i64| {
            if days >= 0 {
                epoch.checked_add_days(Days::new(days as u64))
            } else {
                epoch.checked_sub_days(Days::new(days.unsigned_abs()))
            }
        };
        match self.unit {
            CalendarUnit::Day => from_epoch(n),
            CalendarUnit::Week => from_epoch(n.checked_mul(7)?.checked_sub(3)?),
            CalendarUnit::Month => {
                let year = i32::try_from(1970 + n.div_euclid(12)).ok()?;
                NaiveDate::from_ymd_opt(year, n.rem_euclid(12) as u32 + 1, 1)
            }
            CalendarUnit::Year => NaiveDate::from_ymd_opt(i32::try_from(1970 + n).ok()?, 1, 1),
        }
    }

    /// When period `index` starts: its first day's first instant in the zone, in ms
    /// since the epoch (0 before 1970, [`LAST_MS`] past the dates chrono knows).
    fn start_of(&self, index: i64) -> u64 {
        let Some(day) = self.first_day(index) else {
            return if index < 0 { 0 } else { LAST_MS };
        };
        let midnight = day.and_time(chrono::NaiveTime::MIN);
        let utc_ms = match self.zone.from_local_datetime(&midnight) {
            LocalResult::Single(t) => t.timestamp_millis(),
            // Midnight twice (clocks set back across it): the day starts at the first.
            LocalResult::Ambiguous(first, _) => first.timestamp_millis(),
            // Midnight skipped (clocks set forward across it, as in Santiago or
            // Beirut): the day starts when the clocks jump, midnight read with the
            // offset in force before the jump.
            LocalResult::None => {
                let before = midnight - chrono::Duration::days(1);
                let offset = self.zone.offset_from_utc_datetime(&before).fix();
                (midnight - offset).and_utc().timestamp_millis()
            }
        };
        u64::try_from(utc_ms).unwrap_or(0).min(LAST_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Params};
    use chrono::NaiveDateTime;

    fn cal(zone: &str, unit: CalendarUnit, every: u32) -> Calendar {
        Calendar {
            zone: zone.parse().unwrap(),
            unit,
            every,
        }
    }

    /// Milliseconds of a UTC time written `2024-03-31T01:00:00`.
    fn utc(text: &str) -> u64 {
        let t = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S").unwrap();
        t.and_utc().timestamp_millis() as u64
    }

    const HOUR: u64 = 3_600_000;

    #[test]
    fn berlin_days_around_the_spring_and_autumn_changes() {
        let c = cal("Europe/Berlin", CalendarUnit::Day, 1);
        // 31 March 2024: clocks 02:00 -> 03:00, a 23-hour day.
        let p = c.period_at(utc("2024-03-31T12:00:00"));
        assert_eq!(p.start, utc("2024-03-30T23:00:00"));
        assert_eq!(p.end, utc("2024-03-31T22:00:00"));
        assert_eq!(p.end - p.start, 23 * HOUR);
        // 27 October 2024: 03:00 -> 02:00, a 25-hour day.
        let p = c.period_at(utc("2024-10-27T12:00:00"));
        assert_eq!(p.end - p.start, 25 * HOUR);
        assert_eq!(p.prev_start, utc("2024-10-25T22:00:00"));
        assert_eq!(p.next_end, utc("2024-10-28T23:00:00"));
    }

    #[test]
    fn months_end_on_the_local_first_across_leap_days() {
        let c = cal("America/New_York", CalendarUnit::Month, 1);
        let p = c.period_at(utc("2024-02-29T23:59:59"));
        assert_eq!(p.start, utc("2024-02-01T05:00:00"));
        // Still February in New York at 04:59 UTC on 1 March.
        assert_eq!(p.end, utc("2024-03-01T05:00:00"));
        assert_eq!(c.period_at(utc("2024-03-01T04:59:59")).start, p.start);
        assert_eq!(c.period_at(utc("2024-03-01T05:00:00")).start, p.end);
        // March has the spring change (10 March): EST start, EDT end.
        assert_eq!(c.period_at(p.end).end, utc("2024-04-01T04:00:00"));
    }

    #[test]
    fn sydney_and_kolkata_offsets_and_utc() {
        let sydney = cal("Australia/Sydney", CalendarUnit::Month, 1);
        // Sydney's April starts at AEDT (+11), its end at AEST (+10).
        let p = sydney.period_at(utc("2024-04-15T00:00:00"));
        assert_eq!(p.start, utc("2024-03-31T13:00:00"));
        assert_eq!(p.end, utc("2024-04-30T14:00:00"));
        let kolkata = cal("Asia/Kolkata", CalendarUnit::Day, 1);
        let p = kolkata.period_at(utc("2024-01-01T18:29:59"));
        assert_eq!(p.end, utc("2024-01-01T18:30:00"));
        let y = cal("UTC", CalendarUnit::Year, 1);
        let p = y.period_at(utc("2024-12-31T23:59:59"));
        assert_eq!(p.end - p.start, 366 * 24 * HOUR);
    }

    #[test]
    fn weeks_start_on_monday_and_multipliers_group_from_1970() {
        let w = cal("UTC", CalendarUnit::Week, 1);
        // Wednesday 2024-05-15 is in the week of Monday 13 May.
        assert_eq!(
            w.period_at(utc("2024-05-15T10:00:00")).start,
            utc("2024-05-13T00:00:00")
        );
        let q = cal("Europe/Berlin", CalendarUnit::Month, 3);
        let p = q.period_at(utc("2024-05-15T10:00:00"));
        assert_eq!(p.start, utc("2024-03-31T22:00:00"));
        assert_eq!(p.end, utc("2024-06-30T22:00:00"));
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_the_jump() {
        // Santiago, 8 September 2024: 00:00 -> 01:00 (UTC-4 -> UTC-3).
        let c = cal("America/Santiago", CalendarUnit::Day, 1);
        let p = c.period_at(utc("2024-09-08T12:00:00"));
        assert_eq!(p.start, utc("2024-09-08T04:00:00"));
        assert_eq!(p.end, utc("2024-09-09T03:00:00"));
    }

    #[test]
    fn bounds_around_hold_the_period_and_its_neighbours() {
        let c = cal("Europe/Berlin", CalendarUnit::Month, 1);
        let now = utc("2024-03-15T00:00:00");
        let b = c.bounds_around(now);
        let p = c.period_at(now);
        assert_eq!(b[1..5], [p.prev_start, p.start, p.end, p.next_end]);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn extreme_clocks_stay_total() {
        let c = cal("Pacific/Kiritimati", CalendarUnit::Year, 7);
        for now in [0, 1, u64::MAX, LAST_MS, LAST_MS - 1] {
            let p = c.period_at(now);
            assert!(p.prev_start <= p.start && p.start <= p.end && p.end <= p.next_end);
            // The models that use it decide at such clocks without a panic.
            for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
                let params = Params {
                    algorithm,
                    limit: 3,
                    window_ms: 365 * 86_400_000,
                    burst: 3,
                    max_delay_ms: None,
                    calendar: Some(c),
                };
                let (state, _) = crate::algorithm::decide(None, &params, now, 1);
                let _ = crate::algorithm::decide(Some(&state), &params, now, 1);
                let _ = crate::algorithm::expires_at_ms(&state, &params, now);
            }
        }
    }

    proptest::proptest! {
        /// Every instant lies in the period reported for it, in any of these zones.
        #[test]
        fn the_period_holds_the_instant(
            now in 0u64..4_102_444_800_000,
            zone in proptest::sample::select(vec![
                "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata",
                "UTC", "America/Santiago", "Australia/Lord_Howe", "Pacific/Apia",
            ]),
            unit in proptest::sample::select(vec![
                CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month, CalendarUnit::Year,
            ]),
            every in 1u32..4,
        ) {
            let p = cal(zone, unit, every).period_at(now);
            proptest::prop_assert!(p.start <= now && now < p.end, "{:?} at {}", p, now);
            // Apia skipped 30 December 2011: a period may be empty, never negative.
            proptest::prop_assert!(p.prev_start <= p.start && p.end <= p.next_end);
        }
    }
}
