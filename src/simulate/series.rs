//! The time series behind the table and the chart: the most hits in any interval of
//! length W ([`max_in_window`]) and the trailing-window count as a step function
//! ([`trailing_steps`]), reduced to a per-column envelope when it has too many steps
//! to draw.

/// Above this many steps a series is drawn as its per-column maximum.
const MAX_STEPS: usize = 3000;
const COLUMNS: u64 = 1000;

/// The most hits in any interval `[t, t + window_us)` of `events` ((time µs, hits),
/// sorted by time).
pub fn max_in_window(events: &[(u64, u64)], window_us: u64) -> u64 {
    let (mut best, mut sum, mut end) = (0u64, 0u64, 0usize);
    for (start, &(t0, hits0)) in events.iter().enumerate() {
        // `sum` holds the hits of events[start..end].
        end = end.max(start);
        while end < events.len() && events[end].0 < t0.saturating_add(window_us) {
            sum += events[end].1;
            end += 1;
        }
        best = best.max(sum);
        if end > start {
            sum -= hits0;
        }
    }
    best
}

/// The trailing-window count of `events` ((time µs, hits), in time order) as a step
/// function over `[start_us, end_us]`: (time, value from then on), starting at
/// `start_us`. An event at t counts during `[t, t + window)`.
pub fn trailing_steps(
    events: &[(u64, u64)],
    window_us: u64,
    start_us: u64,
    end_us: u64,
) -> Vec<(u64, u64)> {
    let mut changes: Vec<(u64, i128)> = Vec::with_capacity(events.len() * 2);
    for &(t, hits) in events {
        changes.push((t, i128::from(hits)));
        changes.push((t.saturating_add(window_us), -i128::from(hits)));
    }
    changes.sort_by_key(|&(t, _)| t);
    let mut value: i128 = 0;
    let mut steps = vec![(start_us, 0u64)];
    for (t, delta) in changes {
        value += delta;
        let v = u64::try_from(value).unwrap_or(0);
        if t >= end_us {
            break;
        }
        let t = t.max(start_us);
        match steps.last_mut() {
            Some(last) if last.0 == t => last.1 = v,
            _ => steps.push((t, v)),
        }
    }
    if steps.len() > MAX_STEPS {
        envelope(&steps, start_us, end_us)
    } else {
        steps
    }
}

/// The maximum of a step function in each of [`COLUMNS`] equal columns.
fn envelope(steps: &[(u64, u64)], start_us: u64, end_us: u64) -> Vec<(u64, u64)> {
    let width = (end_us.saturating_sub(start_us) / COLUMNS).max(1);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut current = 0;
    let mut next = 0;
    let mut column_start = start_us;
    while column_start < end_us {
        let column_end = column_start.saturating_add(width);
        let mut max = current;
        while next < steps.len() && steps[next].0 < column_end {
            current = steps[next].1;
            max = max.max(current);
            next += 1;
        }
        out.push((column_start, max));
        column_start = column_end;
    }
    out
}
