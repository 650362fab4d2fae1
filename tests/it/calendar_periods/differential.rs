//! The two stores decide the same random requests (limits, charges and releases,
//! costs from a check to more than the limit) at instants near every edge below, in
//! every zone of [`ZONES`], for both algorithms that take a `time_zone`: zero
//! disagreements. Both sides take their periods from `Calendar`; `oracle` checks
//! those against an arithmetic of its own.

use std::sync::Arc;

use super::{ZONES, calendar, loaded_connection, lua, op_in, utc};
use crate::common;
use tollgate::algorithm::calendar::CalendarUnit;
use tollgate::algorithm::{Algorithm, Mode};
use tollgate::clock::ManualClock;
use tollgate::store::memory::MemoryStore;

/// Instants near the boundaries that matter: the 2024 and 2025 daylight-saving
/// changes of the zones above (UTC), month ends, the 2024 leap day, year ends.
const EDGES: [&str; 16] = [
    "2024-03-31T00:59:00", // Berlin springs forward at 01:00 UTC
    "2024-10-27T00:30:00", // Berlin falls back at 01:00 UTC
    "2024-03-10T06:59:00", // New York springs forward at 07:00 UTC
    "2024-11-03T05:50:00", // New York falls back at 06:00 UTC
    "2024-04-06T15:55:00", // Sydney falls back at 16:00 UTC
    "2024-10-05T15:58:00", // Sydney springs forward at 16:00 UTC
    "2024-02-29T18:29:00", // Kolkata's 1 March starts at 18:30 UTC
    "2024-02-29T23:59:00", // the leap day's end in UTC
    "2024-02-28T23:58:00", // the leap day's start in UTC
    "2024-03-31T21:59:00", // Berlin's April starts at 22:00 UTC
    "2024-04-30T13:59:00", // Sydney's May starts at 14:00 UTC
    "2024-12-31T22:59:00", // Berlin's 2025 starts at 23:00 UTC
    "2024-12-31T23:59:00", // UTC's 2025
    "2025-03-30T00:59:00", // Berlin springs forward in 2025
    "2025-11-02T05:59:00", // New York falls back in 2025
    "2025-02-28T23:59:00", // a February without a leap day
];

/// SplitMix64, as in differential.rs: a failure names the seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// Both stores decide the same random requests from instants near every edge, in
/// every zone, for both algorithms that take a time_zone: zero disagreements.
#[tokio::test]
async fn both_stores_agree_across_month_ends_leap_days_and_dst_changes() {
    let redis = common::redis::standalone();
    let mut conn = loaded_connection(redis).await;
    let prefix = common::redis::unique_prefix("calendar_differential");
    let units = [
        (CalendarUnit::Day, 1),
        (CalendarUnit::Day, 2),
        (CalendarUnit::Week, 1),
        (CalendarUnit::Month, 1),
        (CalendarUnit::Month, 3),
        (CalendarUnit::Year, 1),
    ];
    let mut rng = Rng(25);
    let mut disagreements = Vec::new();
    let mut decided = 0;
    let mut round = 0;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for edge in EDGES {
            for zone in ZONES {
                let (unit, every) = units[rng.below(units.len() as u64) as usize];
                let cal = calendar(zone, unit, every);
                let limit = [1, 3, 7][rng.below(3) as usize];
                let start = utc(edge) - rng.below(120_000);
                let clock = Arc::new(ManualClock::new(start));
                let model = MemoryStore::with_clock(clock.clone());
                let rules = [0, 1].map(|i| format!("r{round}c{i}"));
                round += 1;
                let mut now = start;
                for _ in 0..40 {
                    // Mostly seconds to minutes, so the edge itself is crossed, now
                    // and then hours or a day (into the period after).
                    now += match rng.below(10) {
                        0..=5 => rng.below(20_000),
                        6..=8 => rng.below(600_000),
                        _ => rng.below(2 * 86_400_000),
                    };
                    clock.set_millis(now);
                    let cost = [0, 1, 1, 1, 2, limit + 1][rng.below(6) as usize];
                    let rule = &rules[rng.below(2) as usize];
                    // Now and then a charge (a budget's overdraft, upstream's quota)
                    // or a release, which count in the same periods.
                    let mode = [Mode::Overdraft, Mode::Quota, Mode::Release]
                        .get(rng.below(8) as usize)
                        .copied()
                        .unwrap_or(Mode::Limit);
                    let ops = [op_in(mode, algorithm, rule, limit, cal, cost)];
                    let expected = model.decide_now(&ops);
                    let got = lua(&mut conn, &prefix, &ops, now).await;
                    decided += 1;
                    if got != expected && disagreements.len() < 5 {
                        disagreements.push(format!(
                            "{} {zone} {unit:?}x{every} at {now} {mode:?} {cost}: model {expected:?} lua {got:?}",
                            algorithm.name()
                        ));
                    }
                }
            }
        }
    }
    assert!(decided >= 6_000, "{decided} decisions");
    assert!(
        disagreements.is_empty(),
        "disagreed:\n{}",
        disagreements.join("\n")
    );
}
