//! `time_zone` calendar periods on both stores, with an injected clock: the memory
//! store (the Rust models on a manual clock) and the batch script on a real Redis (the
//! time passed as the script's injected clock, the periods as tollgate sends them).
//!
//! Here: months, days and weeks of their real lengths across month ends, a leap day
//! and daylight-saving changes, and Redis's clock choosing its own period among those
//! sent. `differential`: the two stores agree on every decision of random requests
//! near those edges. Both take their periods from tollgate's own arithmetic, so
//! `oracle` checks the periods themselves, and the stores' counting in them, against
//! Python's `zoneinfo`, which shares none of it. `config`: the config key itself (the
//! limiter end to end, what is refused, xDS).

mod config;
mod differential;
mod oracle;

use crate::common;
use crate::differential::loaded_connection;

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDateTime;
use tollgate::algorithm::calendar::{Calendar, CalendarUnit};
use tollgate::algorithm::{Algorithm, Decision, Mode, Params};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::scripts::{self, Segment, WireOp};
use tollgate::store::{CounterKey, CounterOp};

const ZONES: [&str; 5] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "Asia/Kolkata",
    "UTC",
];

/// Milliseconds of a UTC time written `2024-03-31T01:00:00`.
fn utc(text: &str) -> u64 {
    let t = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S").expect("a UTC time");
    t.and_utc().timestamp_millis() as u64
}

fn calendar(zone: &str, unit: CalendarUnit, every: u32) -> Calendar {
    Calendar {
        zone: zone.parse().expect("a zone"),
        unit,
        every,
    }
}

fn nominal_secs(unit: CalendarUnit) -> u64 {
    match unit {
        CalendarUnit::Day => 86_400,
        CalendarUnit::Week => 7 * 86_400,
        CalendarUnit::Month => 30 * 86_400,
        CalendarUnit::Year => 365 * 86_400,
    }
}

fn op(algorithm: Algorithm, rule: &str, limit: u64, cal: Calendar, cost: u64) -> CounterOp {
    op_in(Mode::Limit, algorithm, rule, limit, cal, cost)
}

fn op_in(
    mode: Mode,
    algorithm: Algorithm,
    rule: &str,
    limit: u64,
    cal: Calendar,
    cost: u64,
) -> CounterOp {
    let window_secs = nominal_secs(cal.unit) * u64::from(cal.every);
    CounterOp {
        key: CounterKey {
            domain: Arc::from("calendar"),
            rule: Arc::from(rule),
            entries: Default::default(),
            algorithm,
            window_secs,
            time_zone: Some(cal.zone),
            hash_tag: None,
        },
        params: Params {
            algorithm,
            limit,
            window_ms: window_secs * 1000,
            burst: limit,
            max_delay_ms: None,
            calendar: Some(cal),
        },
        cost,
        vetoes: mode != Mode::Release,
        mode,
        lease: None,
    }
}

/// One request of `ops` decided by the batch script at the injected `now`.
async fn lua(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    ops: &[CounterOp],
    now: u64,
) -> Vec<Decision> {
    let keys: Vec<String> = ops
        .iter()
        .map(|o| format!("{prefix}{}", o.key.rule))
        .collect();
    let wire: Vec<WireOp> = ops.iter().map(WireOp::new).collect();
    let segments = [Segment {
        keys: &keys,
        ops: &wire,
        dry_run: false,
    }];
    let reply: Vec<u8> = scripts::batch_cmd(&segments, Some(now))
        .query_async(conn)
        .await
        .expect("batch script runs");
    scripts::parse_batch_reply(&reply, ops.len())
        .expect("well-formed reply")
        .into_iter()
        .map(|r| r.decision)
        .collect()
}

/// The store under test: decides one operation at an instant.
enum Under {
    Memory(Arc<ManualClock>, MemoryStore),
    Redis(redis::aio::MultiplexedConnection, String),
}

impl Under {
    async fn decide(&mut self, op: &CounterOp, now: u64) -> Decision {
        match self {
            Under::Memory(clock, store) => {
                clock.set_millis(now);
                store.decide_now(std::slice::from_ref(op))[0]
            }
            Under::Redis(conn, prefix) => lua(conn, prefix, std::slice::from_ref(op), now).await[0],
        }
    }
}

async fn both_stores(test: &str) -> [Under; 2] {
    let clock = Arc::new(ManualClock::new(0));
    let memory = MemoryStore::with_clock(clock.clone());
    let conn = loaded_connection(common::redis::standalone()).await;
    [
        Under::Memory(clock, memory),
        Under::Redis(conn, common::redis::unique_prefix(test)),
    ]
}

/// A month of 3 in Berlin: the last second of March (CEST) is still March, its reset
/// is the one second to 1 April 00:00 Berlin, and April starts empty; the April after
/// it (30 days, all CEST) reports its real end too. Without a time_zone the same
/// limit's windows would be upstream's 30 days from the epoch.
#[tokio::test]
async fn a_berlin_month_ends_at_local_midnight_on_both_stores() {
    let berlin = calendar("Europe/Berlin", CalendarUnit::Month, 1);
    for mut store in both_stores("calendar_berlin_month").await {
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let name = format!("berlin_{}", algorithm.name());
            let one = op(algorithm, &name, 3, berlin, 1);
            let last_second = utc("2024-03-31T21:59:59");
            for left in [2, 1, 0] {
                let d = store.decide(&one, last_second).await;
                assert!(d.allowed);
                assert_eq!(d.remaining, left);
                assert_eq!(d.reset_after, Duration::from_secs(1), "{name}");
            }
            let d = store.decide(&one, last_second + 500).await;
            assert!(!d.allowed, "{name}: the fourth in March is denied");
            let april = utc("2024-03-31T22:00:00");
            if algorithm == Algorithm::FixedWindow {
                assert_eq!(d.retry_after, Some(Duration::from_secs(1)));
                let d = store.decide(&one, april).await;
                assert!(d.allowed, "{name}: April starts at Berlin midnight");
                assert_eq!(d.remaining, 2);
            }
            // April: 30 days to 1 May 00:00 CEST (22:00 UTC). (The sliding window
            // still weighs March's 3 at its full weight: denied, but in April.)
            let d = store.decide(&one, april).await;
            assert_eq!(d.reset_after, Duration::from_secs(30 * 86_400), "{name}");
        }
    }
}

/// Days across daylight-saving changes: New York's 3 November 2024 is 25 hours,
/// Berlin's 31 March 2024 23 hours, Sydney's 7 April 2024 25; a Kolkata day ends at
/// 18:30 UTC and a UTC year on 31 December.
#[tokio::test]
async fn days_and_years_have_their_real_lengths_on_both_stores() {
    let cases = [
        (
            "America/New_York",
            CalendarUnit::Day,
            "2024-11-03T04:00:00",
            25 * 3600,
        ),
        (
            "Europe/Berlin",
            CalendarUnit::Day,
            "2024-03-30T23:00:00",
            23 * 3600,
        ),
        (
            "Australia/Sydney",
            CalendarUnit::Day,
            "2024-04-06T13:00:00",
            25 * 3600,
        ),
        (
            "Asia/Kolkata",
            CalendarUnit::Day,
            "2024-02-29T18:30:00",
            24 * 3600,
        ),
        (
            "UTC",
            CalendarUnit::Year,
            "2024-01-01T00:00:00",
            366 * 86_400,
        ),
        (
            "Europe/Berlin",
            CalendarUnit::Week,
            "2024-10-20T22:00:00",
            7 * 86_400 + 3600,
        ),
    ];
    for mut store in both_stores("calendar_lengths").await {
        for (i, (zone, unit, start, secs)) in cases.into_iter().enumerate() {
            let cal = calendar(zone, unit, 1);
            for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
                let one = op(
                    algorithm,
                    &format!("len{i}_{}", algorithm.name()),
                    5,
                    cal,
                    1,
                );
                let d = store.decide(&one, utc(start)).await;
                assert!(d.allowed);
                assert_eq!(
                    d.reset_after,
                    Duration::from_secs(secs),
                    "{zone} {unit:?} {}",
                    algorithm.name()
                );
                // One second before the end, the same period, one second left.
                let d = store.decide(&one, utc(start) + secs * 1000 - 1000).await;
                assert_eq!(d.remaining, 3, "{zone} {unit:?}: still the same period");
                assert_eq!(d.reset_after, Duration::from_secs(1));
            }
        }
    }
}

/// The period is Redis's even when tollgate's clock (which chose the periods sent)
/// is up to a period away: the script picks among the neighbours.
#[tokio::test]
async fn redis_picks_its_own_period_among_those_sent() {
    let mut conn = loaded_connection(common::redis::standalone()).await;
    let prefix = common::redis::unique_prefix("calendar_skew");
    let cal = calendar("Europe/Berlin", CalendarUnit::Day, 1);
    let one = op(Algorithm::FixedWindow, "skew", 5, cal, 1);
    let wire = [WireOp::new(&one)];
    let keys = [format!("{prefix}skew")];
    let redis_now = utc("2024-03-31T21:59:30"); // 23:59:30 Berlin, 31 March
    for tollgate_now in [
        redis_now - 20 * 3_600_000,
        redis_now,
        redis_now + 3_600_000,
        redis_now + 20 * 3_600_000,
    ] {
        let segments = [Segment {
            keys: &keys,
            ops: &wire,
            dry_run: false,
        }];
        let cmd = scripts::batch_cmd_around(&segments, redis_now, tollgate_now);
        let reply: Vec<u8> = cmd.query_async(&mut conn).await.expect("runs");
        let d = scripts::parse_batch_reply(&reply, 1).expect("reply")[0].decision;
        assert!(d.allowed);
        assert_eq!(
            d.reset_after,
            Duration::from_secs(30),
            "tollgate at {tollgate_now}, Redis at {redis_now}"
        );
    }
}

/// Clocks more than a period apart: the script refuses the call with the contract's
/// code and Redis's clock, having written nothing; tollgate learns the difference
/// and sends the call again at once (`scripts::send_batch`), so the request is
/// decided on Redis's period, not answered by the failure mode.
#[tokio::test]
async fn a_clock_beyond_the_periods_sent_is_learned_and_the_call_sent_again() {
    let mut conn = loaded_connection(common::redis::standalone()).await;
    let prefix = common::redis::unique_prefix("calendar_far");
    let cal = calendar("America/New_York", CalendarUnit::Day, 1);
    let one = op(Algorithm::SlidingWindow, "far", 5, cal, 1);
    let wire = [WireOp::new(&one)];
    let keys = [format!("{prefix}far")];
    let segments = [Segment {
        keys: &keys,
        ops: &wire,
        dry_run: false,
    }];
    // 23:59:00 in New York on 3 November 2024 (the 25-hour day), tollgate 5 days behind.
    let redis_now = utc("2024-11-04T04:59:00");
    let cmd = scripts::batch_cmd_around(&segments, redis_now, redis_now - 5 * 86_400_000);
    let failed: Result<Vec<u8>, _> = scripts::evalsha(&mut conn, &cmd, &scripts::BATCH).await;
    let error = failed.expect_err("periods that miss Redis's clock");
    assert_eq!(
        error.code(),
        Some(scripts::contract::code::CLOCK),
        "{error}"
    );
    assert_eq!(
        error.detail().and_then(|d| d.split_whitespace().next()),
        Some(redis_now.to_string().as_str()),
        "{error}"
    );
    let written: bool = redis::cmd("EXISTS")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert!(!written, "a refused call writes nothing");
    let learned = scripts::redis_clock_estimate();
    assert!(
        learned.abs_diff(redis_now) < 60_000,
        "learned {learned}, Redis {redis_now}"
    );
    // Back to this host's clock for whatever runs next in this process.
    scripts::learn_redis_clock(tollgate::clock::SystemClock.now_millis());

    // Through the store, on Redis's real clock, with tollgate's idea of it 5 days
    // off: refused once, learned, sent again, decided.
    let store = common::stores::standalone("calendar_far_store").await;
    let now = tollgate::clock::SystemClock.now_millis();
    scripts::learn_redis_clock(now - 5 * 86_400_000);
    let decided = tollgate::store::Store::decide(&store, std::slice::from_ref(&one))
        .await
        .expect("decided, not failed");
    assert!(decided[0].allowed);
    assert!(
        scripts::redis_clock_estimate().abs_diff(now) < 60_000,
        "learned again"
    );
    scripts::learn_redis_clock(tollgate::clock::SystemClock.now_millis());
}
