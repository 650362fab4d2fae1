//! The division: one replica's report applied to a counter's [`Record`], giving the
//! record to store and what the replica's region may use now. Pure (no I/O, no
//! clock of its own), so every replica of every region divides the same way, and a
//! compare-and-swap (`ledger/`) makes each step atomic per counter.
//!
//! A step, in order: the report's facts are merged (the replica's demand; the grants
//! it holds, which a ledger that lost them takes back; a release it carried out; what
//! the region's counter holds), then the region gets more of each window it is
//! granted (`window::granted`) where its target is above its share and some of the
//! limit is free, or, in the window in progress, is asked to release what it holds
//! beyond its target while another region is short.
//!
//! Targets follow demand. For the window in progress each active region (one that
//! reported within the stale period) needs what it used plus its rate for the rest
//! of the window; when all needs fit, each gets its need and the rest by weight,
//! else what it used plus the rest by weight (weights are the rates, each at least
//! [`FLOOR`] of their mean). A target is capped at used + twice the need + 1/20 of
//! the limit: a share granted is spent for good (a window's grant is never taken
//! back), so ahead of the demand the ledger hands out only a margin.
//!
//! The invariants (asserted by the tests, and kept by construction):
//! - a grant only grows, and only out of what no region holds (`Window::free`), so a
//!   record that held before the step holds after it;
//! - a release is counted once (it names its pending request) and only up to the
//!   region's effective share;
//! - a region is never asked to release below what it used.

use super::record::{Demand, Pending, Record, Share, Window};
use super::window;
use crate::algorithm::Division;

/// A region's least weight, as a fraction of the mean weight: an idle region keeps
/// a little share, so its first requests need not wait for a report.
pub const FLOOR: f64 = 0.05;

/// The margin a target keeps above twice the need, as a fraction of the limit.
const MARGIN: u64 = 20;

/// One replica's report on one counter.
#[derive(Debug, Clone, PartialEq)]
pub struct Report<'a> {
    pub region: &'a str,
    pub replica: &'a str,
    /// L, as this replica's config has it.
    pub limit: u64,
    pub window_ms: u64,
    /// [`Division::Window`] or [`Division::Rate`].
    pub division: Division,
    /// Requests per second this replica saw on the counter, admitted and denied.
    pub rate: f64,
    /// What the region's counter holds in a window (admitted plus released), read
    /// without consuming; a rate has none.
    pub count: Option<(u64, u64)>,
    /// The grants this replica holds, by window.
    pub held: &'a [(u64, u64)],
    /// A release this replica carried out.
    pub released: Option<Released>,
}

/// A release carried out: `amount` consumed on the region's counter in `window`, for
/// the pending request `id` (0 when the counter refused it).
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    pub window: u64,
    pub id: String,
    pub amount: u64,
}

/// The instants and periods a step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub now_ms: u64,
    /// How far ahead windows are granted (`window::lead`).
    pub lead_ms: u64,
    /// A region not heard from this long is left out of the division.
    pub stale_ms: u64,
    /// How long a replica has to carry out a release.
    pub pending_ms: u64,
}

/// What the region may use after the step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The region's grant of each window the record has, from the window in progress.
    pub grants: Vec<(u64, u64)>,
    /// A release asked of this replica.
    pub release: Option<Pending>,
    /// The window it is asked in.
    pub release_window: u64,
    /// The record did not hold on arrival (a ledger that lost grants and took them
    /// back from the regions, or regions whose configs disagree): nothing more was
    /// granted.
    pub overcommitted: bool,
}

/// Applies `report` to `record` (`None`: the counter is new to the ledger).
pub fn step(record: Option<Record>, report: &Report<'_>, t: &Timing) -> (Record, Outcome) {
    let w_ms = report.window_ms.max(1);
    let mut r = record.unwrap_or_else(|| Record {
        window_ms: w_ms,
        division: division_name(report.division).to_owned(),
        born_ms: t.now_ms,
        ..Record::default()
    });
    let current = window::index(t.now_ms, w_ms);
    forget_the_past(&mut r, current, t);
    merge(&mut r, report, current, t);
    let overcommitted = !r.holds();
    let mut outcome = Outcome {
        overcommitted,
        ..Outcome::default()
    };
    // A window not yet begun is granted only once the record has heard every region
    // that reports (a stale period): its grants are never taken back, and the first
    // region to report a new counter would otherwise hold the whole next window.
    let settled = t.now_ms.saturating_sub(r.born_ms) >= t.stale_ms;
    if !overcommitted {
        for w in window::granted(t.now_ms, w_ms, t.lead_ms) {
            if w == current || settled {
                divide(&mut r, report, w, current, t, &mut outcome);
            }
        }
    }
    outcome.grants = r
        .windows
        .iter()
        .filter(|(w, _)| **w >= current)
        .filter_map(|(w, win)| Some((*w, win.shares.get(report.region)?.granted)))
        .collect();
    (r, outcome)
}

fn division_name(division: Division) -> &'static str {
    match division {
        Division::Window => "window",
        Division::Rate => "rate",
        Division::Refused(_) => "none",
    }
}

/// Windows before the previous one go (a skewed clock may still count in the
/// previous); so do replicas silent for four stale periods, regions without any,
/// and lapsed release requests.
fn forget_the_past(r: &mut Record, current: u64, t: &Timing) {
    r.windows.retain(|w, _| w.saturating_add(1) >= current);
    let gone = t.now_ms.saturating_sub(t.stale_ms.saturating_mul(4));
    for region in r.regions.values_mut() {
        region.replicas.retain(|_, d| d.at_ms >= gone);
    }
    let windows = &r.windows;
    r.regions.retain(|name, region| {
        !region.replicas.is_empty() || windows.values().any(|w| w.shares.contains_key(name))
    });
    for win in r.windows.values_mut() {
        for share in win.shares.values_mut() {
            if share
                .pending
                .as_ref()
                .is_some_and(|p| p.until_ms < t.now_ms)
            {
                share.pending = None;
            }
        }
    }
}

/// The report's facts into the record.
fn merge(r: &mut Record, report: &Report<'_>, current: u64, t: &Timing) {
    r.regions
        .entry(report.region.to_owned())
        .or_default()
        .replicas
        .insert(
            report.replica.to_owned(),
            Demand {
                rate: if report.rate.is_finite() {
                    report.rate.max(0.0)
                } else {
                    0.0
                },
                at_ms: t.now_ms,
            },
        );
    // Grants the replica holds: the ledger knows them already, unless it lost them
    // (a restart without persistence); taken back here, they count against the
    // limit again. Never more than the window's limit.
    for &(w, granted) in report.held {
        if w.saturating_add(1) < current {
            continue;
        }
        let share = share_of(r, w, report);
        share.granted = share.granted.max(granted);
    }
    if let Some(done) = &report.released
        && let Some(share) = r
            .windows
            .get_mut(&done.window)
            .and_then(|w| w.shares.get_mut(report.region))
        && share.pending.as_ref().is_some_and(|p| p.id == done.id)
    {
        let asked = share.pending.take().map_or(0, |p| p.amount);
        share.released += done.amount.min(asked).min(share.effective());
    }
    if let Some((w, count)) = report.count
        && w.saturating_add(1) >= current
        && r.windows.contains_key(&w)
    {
        let share = share_of(r, w, report);
        share.used = share.used.max(count.saturating_sub(share.released));
    }
}

/// The region's share of window `w`, made (with the report's limit for a new window).
fn share_of<'r>(r: &'r mut Record, w: u64, report: &Report<'_>) -> &'r mut Share {
    r.windows
        .entry(w)
        .or_insert_with(|| Window {
            limit: report.limit,
            ..Window::default()
        })
        .shares
        .entry(report.region.to_owned())
        .or_default()
}

/// One region's need, weight and what it holds, in one window.
struct Claim<'a> {
    region: &'a str,
    used: u64,
    need: u64,
    weight: f64,
    effective: u64,
}

/// The reporter's grant of window `w` grows toward its target, or (in the window in
/// progress, for a count) it is asked to release what it holds beyond it.
fn divide(
    r: &mut Record,
    report: &Report<'_>,
    w: u64,
    current: u64,
    t: &Timing,
    outcome: &mut Outcome,
) {
    let w_ms = r.window_ms.max(1);
    share_of(r, w, report);
    let fresh_since = t.now_ms.saturating_sub(t.stale_ms);
    let left_ms = if w == current {
        window::end(w, w_ms).saturating_sub(t.now_ms)
    } else {
        w_ms
    };
    let win = &r.windows[&w];
    let mut claims: Vec<Claim<'_>> = Vec::new();
    let mut silent_hold = 0;
    let names = r.regions.keys().map(String::as_str);
    for name in names.chain(win.shares.keys().map(String::as_str)) {
        if claims.iter().any(|c| c.region == name) {
            continue;
        }
        let share = win.shares.get(name);
        let effective = share.map_or(0, Share::effective);
        let Some(rate) = r.demand(name, fresh_since) else {
            // Cut off or gone: it keeps what it holds, and gets nothing more.
            silent_hold += effective;
            continue;
        };
        let used = if w == current {
            share.map_or(0, |s| s.used.min(effective))
        } else {
            0
        };
        claims.push(Claim {
            region: name,
            used,
            need: (rate * left_ms as f64 / 1000.0).ceil() as u64,
            weight: rate,
            effective,
        });
    }
    let targets = targets(win.limit, silent_hold, &mut claims);
    let Some(me) = claims.iter().position(|c| c.region == report.region) else {
        return;
    };
    let (target, mine) = (targets[me], &claims[me]);
    let hysteresis = (win.limit / 50).max(1);
    let someone_short = claims
        .iter()
        .zip(&targets)
        .any(|(c, t)| c.region != report.region && *t > c.effective + hysteresis);
    let free = win.free();
    let (effective, used) = (mine.effective, mine.used);
    let share = r
        .windows
        .get_mut(&w)
        .and_then(|w| w.shares.get_mut(report.region))
        .expect("made above");
    if target > effective && share.pending.is_none() {
        share.granted += (target - effective).min(free);
    } else if w == current
        && report.division == Division::Window
        && share.pending.is_none()
        && someone_short
        && effective > target.max(used) + hysteresis
    {
        let pending = Pending {
            id: format!("{}/{}/{}", report.replica, w, t.now_ms),
            amount: effective - target.max(used),
            until_ms: t.now_ms.saturating_add(t.pending_ms),
        };
        share.pending = Some(pending.clone());
        outcome.release = Some(pending);
        outcome.release_window = w;
    }
}

/// Each active claim's target, in `claims` order: see the module's doc.
fn targets(limit: u64, silent_hold: u64, claims: &mut [Claim<'_>]) -> Vec<u64> {
    let total: f64 = claims.iter().map(|c| c.weight).sum();
    if total <= 0.0 {
        claims.iter_mut().for_each(|c| c.weight = 1.0);
    } else {
        let floor = FLOOR * total / claims.len().max(1) as f64;
        claims
            .iter_mut()
            .for_each(|c| c.weight = c.weight.max(floor));
    }
    let weights: f64 = claims.iter().map(|c| c.weight).sum();
    let used: u64 = claims.iter().map(|c| c.used).sum();
    let needs: u64 = claims.iter().map(|c| c.need).sum();
    let room = limit.saturating_sub(silent_hold).saturating_sub(used);
    // When every need fits, each gets its need and the rest is spread by weight;
    // otherwise what is left after use is spread by weight.
    let fits = needs <= room;
    let spread = if fits { room - needs } else { room };
    claims
        .iter()
        .map(|c| {
            let by_weight = (spread as f64 * c.weight / weights).floor() as u64;
            let cap = c.used + 2 * c.need.min(limit) + limit / MARGIN;
            let base = if fits { c.used + c.need } else { c.used };
            (base + by_weight).min(cap)
        })
        .collect()
}

#[cfg(test)]
#[path = "divide_tests.rs"]
mod tests;
