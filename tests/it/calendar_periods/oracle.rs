//! tollgate's calendar periods against an oracle that shares none of its code:
//! `oracle.py` (Python's own date arithmetic and `zoneinfo`, the system's IANA
//! database, where tollgate has chrono and chrono-tz's) gives the period holding each
//! of about 12,500 instants: around every offset change, local midnight of those
//! days and weeks, month end, the leap day and the year ends of 2024 and 2025, in ten
//! zones (half-hour and 45-minute offsets, a half-hour change, midnights skipped and
//! repeated), for days, weeks, months and years, some in multiples.
//!
//! `Calendar::period_at` must give the oracle's four edges for every instant, and
//! both stores must count in the oracle's periods: a limit of 1 spent in the last
//! second of a period is refused a millisecond before the oracle's end and admitted
//! again at it, each time with the reset the oracle's periods give.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use super::{both_stores, calendar, op};
use tollgate::algorithm::Algorithm;
use tollgate::algorithm::calendar::CalendarUnit;

/// One line of the oracle: a calendar, an instant, and the period holding it.
struct Probe {
    zone: String,
    unit: CalendarUnit,
    every: u32,
    now: u64,
    /// The start of the period before, the period's start and end, the end of the
    /// period after.
    edges: [u64; 4],
}

impl Probe {
    fn parse(line: &str) -> Probe {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 8, "oracle line {line:?}");
        let number = |i: usize| -> u64 {
            fields[i]
                .parse()
                .unwrap_or_else(|_| panic!("oracle line {line:?}: field {i}"))
        };
        let unit = match fields[1] {
            "day" => CalendarUnit::Day,
            "week" => CalendarUnit::Week,
            "month" => CalendarUnit::Month,
            "year" => CalendarUnit::Year,
            other => panic!("oracle line {line:?}: unit {other}"),
        };
        Probe {
            zone: fields[0].to_owned(),
            unit,
            every: number(2) as u32,
            now: number(3),
            edges: [number(4), number(5), number(6), number(7)],
        }
    }

    fn name(&self) -> String {
        format!(
            "{} {:?}x{} at {}",
            self.zone, self.unit, self.every, self.now
        )
    }
}

/// The oracle's probes: `$TOLLGATE_PYTHON` (the test venv's), else `python3`; its
/// `zoneinfo` is in the standard library.
fn oracle() -> Vec<Probe> {
    let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/calendar_periods/oracle.py"
    );
    let output = Command::new(&python)
        .arg(script)
        .output()
        .unwrap_or_else(|e| panic!("{python} {script}: {e}"));
    assert!(
        output.status.success(),
        "{python} {script} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("the oracle prints text")
        .lines()
        .map(Probe::parse)
        .collect()
}

/// Every instant's period, as `Calendar::period_at` computes it, against the
/// oracle's; and the oracle itself reached what it is there for (days of 23, 23.5,
/// 24.5 and 25 hours).
#[test]
fn period_edges_match_an_independent_oracle() {
    let probes = oracle();
    assert!(probes.len() > 10_000, "{} probes", probes.len());
    let mut wrong = Vec::new();
    let mut day_lengths: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for p in &probes {
        let period = calendar(&p.zone, p.unit, p.every).period_at(p.now);
        let got = [period.prev_start, period.start, period.end, period.next_end];
        if got != p.edges {
            wrong.push(format!(
                "{}: oracle {:?}, tollgate {got:?}",
                p.name(),
                p.edges
            ));
        }
        if p.unit == CalendarUnit::Day && p.every == 1 {
            let minutes = (p.edges[2] - p.edges[1]) / 60_000;
            day_lengths.entry(&p.zone).or_default().insert(minutes);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} periods differ from the oracle's, e.g.:\n{}",
        wrong.len(),
        probes.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
    let hours = |h: f64| (h * 60.0) as u64;
    let berlin = &day_lengths["Europe/Berlin"];
    assert!(berlin.contains(&hours(23.0)) && berlin.contains(&hours(25.0)));
    let lord_howe = &day_lengths["Australia/Lord_Howe"];
    assert!(lord_howe.contains(&hours(23.5)) && lord_howe.contains(&hours(24.5)));
}

/// Both stores count in the oracle's periods: at every probe one second before its
/// period's end, a fixed window of 1 admits (reset 1 s), refuses a millisecond before
/// the end (retry 1 s), and admits again at the end, its reset the next period's.
#[tokio::test]
async fn both_stores_count_in_the_oracles_periods() {
    let ends: Vec<Probe> = oracle()
        .into_iter()
        .filter(|p| p.now + 1000 == p.edges[2])
        .collect();
    assert!(ends.len() > 1000, "{} period ends", ends.len());
    let second = Duration::from_secs(1);
    for mut store in both_stores("calendar_oracle").await {
        let mut wrong = Vec::new();
        for (i, p) in ends.iter().enumerate() {
            let one = op(
                Algorithm::FixedWindow,
                &format!("oracle{i}"),
                1,
                calendar(&p.zone, p.unit, p.every),
                1,
            );
            let [_, _, end, next_end] = p.edges;
            let last = store.decide(&one, p.now).await;
            let late = store.decide(&one, end - 1).await;
            let next = store.decide(&one, end).await;
            let next_reset = Duration::from_secs(next_end / 1000 - end / 1000);
            let right = last.allowed
                && last.reset_after == second
                && !late.allowed
                && late.retry_after == Some(second)
                && next.allowed
                && next.reset_after == next_reset;
            if !right {
                wrong.push(format!(
                    "{}: last second {last:?}, a millisecond before the end {late:?}, \
                     at the end {next:?} (the next period lasts {next_reset:?})",
                    p.name()
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} of {} period ends wrong, e.g.:\n{}",
            wrong.len(),
            ends.len(),
            wrong[..wrong.len().min(5)].join("\n")
        );
    }
}
