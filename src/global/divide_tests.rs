use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const MINUTE: u64 = 60_000;
/// 10 s into window 1000 of a minute.
const T0: u64 = 1000 * MINUTE + 10_000;

fn timing(now_ms: u64) -> Timing {
    Timing {
        now_ms,
        lead_ms: MINUTE,
        stale_ms: 6_000,
        pending_ms: 10_000,
    }
}

fn report<'a>(region: &'a str, rate: f64, held: &'a [(u64, u64)]) -> Report<'a> {
    Report {
        region,
        replica: region,
        limit: 6000,
        window_ms: MINUTE,
        division: Division::Window,
        rate,
        count: None,
        held,
        released: None,
    }
}

fn granted(record: &Record, w: u64, region: &str) -> u64 {
    record.windows[&w]
        .shares
        .get(region)
        .map_or(0, |s| s.granted)
}

#[test]
fn a_new_counter_is_granted_a_margin_not_the_whole_limit_and_the_next_window_once_settled() {
    let (record, outcome) = step(None, &report("eu", 0.0, &[]), &timing(T0));
    assert_eq!(outcome.grants, vec![(1000, 300)]);
    assert!(record.holds() && !outcome.overcommitted);
    // A stale period on, every region that reports has: the next window is divided.
    let held = outcome.grants;
    let (record, outcome) = step(Some(record), &report("eu", 0.0, &held), &timing(T0 + 6_000));
    assert_eq!(outcome.grants, vec![(1000, 300), (1001, 300)]);
    assert!(record.holds());
}

#[test]
fn the_first_region_of_a_new_counter_does_not_take_the_next_window() {
    let (record, _) = step(None, &report("a", 105.0, &[]), &timing(T0));
    let (record, _) = step(Some(record), &report("b", 30.0, &[]), &timing(T0 + 1_000));
    let (record, _) = step(Some(record), &report("c", 15.0, &[]), &timing(T0 + 2_000));
    let (record, _) = step(Some(record), &report("a", 105.0, &[]), &timing(T0 + 6_000));
    assert_eq!(granted(&record, 1001, "a"), 4200, "{record:?}");
    assert_eq!(record.windows[&1001].free(), 1800);
}

#[test]
fn saturated_regions_converge_to_their_demand() {
    // 70:20:10 of 150 requests/s: every region wants more than a minute's share.
    let rates = [("a", 105.0), ("b", 30.0), ("c", 15.0)];
    let mut record = None;
    let mut held: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for round in 0..4 {
        for (region, rate) in rates {
            let mine = held.get(region).cloned().unwrap_or_default();
            let at = timing(1000 * MINUTE - 9_000 + round * 2_000);
            let (r, outcome) = step(record.take(), &report(region, rate, &mine), &at);
            assert!(r.holds());
            held.insert(region, outcome.grants);
            record = Some(r);
        }
    }
    // The first to report took its need of window 1000 before the others were known
    // (a grant is never taken back: the others get theirs there by its releases).
    // Window 1001, granted during 1000, is divided with every demand known.
    for (region, rate) in rates {
        let mine = held.get(region).cloned().unwrap_or_default();
        let at = timing(1000 * MINUTE + 1_000);
        let (r, outcome) = step(record.take(), &report(region, rate, &mine), &at);
        held.insert(region, outcome.grants);
        record = Some(r);
    }
    let record = record.unwrap();
    let next: Vec<u64> = ["a", "b", "c"].map(|r| granted(&record, 1001, r)).to_vec();
    assert_eq!(next.iter().sum::<u64>(), 6000, "{next:?}");
    assert!(
        next[0] >= 4100 && next[1] >= 1100 && next[2] >= 550,
        "{next:?}"
    );
}

#[test]
fn a_region_holding_more_than_its_target_is_asked_to_release_while_another_is_short() {
    let mut record = Record::default();
    let mut window = Window {
        limit: 1000,
        ..Window::default()
    };
    window.shares.insert(
        "idle".into(),
        Share {
            granted: 800,
            used: 100,
            ..Share::default()
        },
    );
    window.shares.insert(
        "busy".into(),
        Share {
            granted: 200,
            used: 200,
            ..Share::default()
        },
    );
    record.window_ms = MINUTE;
    record.windows.insert(1000, window);
    let now = T0;
    let (record, _) = step(Some(record), &report("busy", 20.0, &[]), &timing(now));
    let held = [(1000, 800)];
    let idle = Report {
        count: Some((1000, 100)),
        ..report("idle", 0.0, &held)
    };
    let (record, outcome) = step(Some(record), &idle, &timing(now + 1));
    let asked = outcome.release.expect("a release is asked");
    assert_eq!(outcome.release_window, 1000);
    // Never below what it used (100), and it keeps the margin of its target.
    assert!(asked.amount >= 600 && asked.amount <= 700, "{asked:?}");
    // Reported twice (a retry after a lost answer): counted once.
    let done = Released {
        window: 1000,
        id: asked.id.clone(),
        amount: asked.amount,
    };
    let again = Report {
        released: Some(done),
        ..idle.clone()
    };
    let (record, _) = step(Some(record), &again, &timing(now + 2));
    let released = record.windows[&1000].shares["idle"].released;
    let (record, _) = step(Some(record), &again, &timing(now + 3));
    assert_eq!(record.windows[&1000].shares["idle"].released, released);
    assert_eq!(released, asked.amount);
    // The busy region gets it at its next report.
    let (record, outcome) = step(Some(record), &report("busy", 20.0, &[]), &timing(now + 4));
    assert!(outcome.grants[0].1 > 200 + asked.amount / 2, "{outcome:?}");
    assert!(record.holds());
}

#[test]
fn a_silent_region_keeps_its_grants_and_the_windows_after_them_go_to_the_others() {
    let held: [(u64, u64); 0] = [];
    let (record, _) = step(None, &report("gone", 50.0, &held), &timing(T0));
    let (record, _) = step(
        Some(record),
        &report("gone", 50.0, &held),
        &timing(T0 + 7000),
    );
    let gone_now = granted(&record, 1000, "gone");
    let gone_next = granted(&record, 1001, "gone");
    assert!(gone_now > 0 && gone_next > 0);
    // A minute later "gone" has not reported: window 1001 is in progress, 1002 new.
    let later = T0 + MINUTE;
    let (record, outcome) = step(Some(record), &report("here", 100.0, &held), &timing(later));
    assert_eq!(
        granted(&record, 1001, "gone"),
        gone_next,
        "a grant is never taken back"
    );
    let here_next = outcome.grants.iter().find(|g| g.0 == 1002).unwrap().1;
    assert_eq!(here_next, 6000, "the next window is divided without it");
    assert_eq!(granted(&record, 1002, "gone"), 0);
}

#[test]
fn a_ledger_that_lost_its_record_takes_the_grants_back_and_grants_nothing_past_the_limit() {
    // Two regions each hold 4000 of window 1000 from a record the ledger lost.
    let a = [(1000, 4000)];
    let (record, outcome) = step(None, &report("a", 10.0, &a), &timing(T0));
    assert!(!outcome.overcommitted);
    let b = [(1000, 4000)];
    let (record, outcome) = step(Some(record), &report("b", 10.0, &b), &timing(T0 + 1));
    assert!(outcome.overcommitted, "8000 held of 6000 is reported");
    assert_eq!(
        outcome.grants[0],
        (1000, 4000),
        "and nothing more is granted"
    );
    assert!(!record.holds());
}

/// A replica's view between steps: what it holds and the release it was asked for.
#[derive(Debug, Clone, Default)]
struct Replica {
    held: Vec<(u64, u64)>,
    asked: Option<(u64, Pending)>,
    /// The simulated counter per window: (admitted, consumed by releases).
    count: BTreeMap<u64, (u64, u64)>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random reports of three regions, with random demand, counts, releases carried
    /// out or not, reports lost and time moving: every stored record holds, grants
    /// only grow, and a region's counter (admitting up to its grant, consuming what it
    /// releases) never pushes the regions' admissions past the limit.
    #[test]
    fn the_invariants_hold_whatever_the_reports(
        events in proptest::collection::vec(
            (0usize..3, 0.0f64..200.0, 0u64..4_000, any::<bool>(), 0u8..4, 0u64..300),
            1..120,
        ),
    ) {
        let names = ["a", "b", "c"];
        let mut replicas: Vec<Replica> = vec![Replica::default(); 3];
        let mut record: Option<Record> = None;
        let mut now = T0;
        let mut ever: BTreeMap<(u64, usize), u64> = BTreeMap::new();
        for (who, rate, advance, burn, lost, admit) in events {
            now += advance;
            let current = window::index(now, MINUTE);
            let me = &mut replicas[who];
            // The region admits up to its grant of the window in progress.
            let grant = me.held.iter().find(|g| g.0 == current).map_or(0, |g| g.1);
            let (admitted, burned) = me.count.entry(current).or_insert((0, 0));
            // A request is admitted iff the counter stays within the grant.
            let room = grant.saturating_sub(*admitted + *burned);
            *admitted += admit.min(room);
            let released = match me.asked.take() {
                Some((w, p)) if burn => {
                    let (a, b) = me.count.entry(w).or_insert((0, 0));
                    let g = me.held.iter().find(|g| g.0 == w).map_or(0, |g| g.1);
                    // The counter takes the release only if it fits under the grant.
                    let amount = if *a + *b + p.amount <= g { *b += p.amount; p.amount } else { 0 };
                    Some(Released { window: w, id: p.id, amount })
                }
                _ => None,
            };
            let held = me.held.clone();
            let (a, b) = me.count[&current];
            let rep = Report {
                count: Some((current, a + b)),
                released,
                ..report(names[who], rate, &held)
            };
            let (next, outcome) = step(record.clone(), &rep, &timing(now));
            prop_assert!(next.holds(), "{next:?}");
            if lost != 0 {
                for (w, win) in &next.windows {
                    for (i, name) in names.iter().enumerate() {
                        let g = win.shares.get(*name).map_or(0, |s| s.granted);
                        let before = ever.entry((*w, i)).or_insert(0);
                        prop_assert!(g >= *before, "a grant shrank");
                        *before = g;
                    }
                }
            }
            match lost {
                // The swap did not happen: nothing applies.
                0 => continue,
                // It happened, but its answer was lost: the replica learns nothing.
                1 => {
                    record = Some(next);
                    continue;
                }
                _ => record = Some(next),
            }
            let me = &mut replicas[who];
            me.held = outcome.grants;
            me.asked = outcome.release.map(|p| (outcome.release_window, p));
        }
        // What the regions admitted in any window is at most its limit.
        let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
        for replica in &replicas {
            for (w, (a, _)) in &replica.count {
                *admitted.entry(*w).or_insert(0) += a;
            }
        }
        for (w, total) in admitted {
            prop_assert!(total <= 6000, "window {w}: {total} admitted");
        }
    }
}
