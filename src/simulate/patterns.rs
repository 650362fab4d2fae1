//! Where a simulation's arrivals come from: the built-in traffic patterns ([`Pattern`],
//! with defaults derived from the limit) and CSV files of timestamps ([`parse_csv`]).
//! Built-in patterns start at time 0, which is a window boundary.

use super::error::invalid;
use super::{Arrival, MAX_ARRIVALS, SimulateError, format_span};

/// The names `--pattern` accepts.
pub const NAMES: [&str; 4] = ["steady", "burst", "boundary", "idle-burst"];

/// A built-in traffic pattern.
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    /// Evenly spaced requests at `per_second`, for the whole duration.
    Steady { per_second: f64 },
    /// `count` requests at once, at time 0.
    Burst { count: u64 },
    /// The classic fixed-window double burst: `count` requests in the last `spread_ms`
    /// before the boundary at W (the last one 1 ms before it) and `count` in the first
    /// `spread_ms` after it (the first one on it), evenly spaced. `spread_ms` 0 puts
    /// each half at one instant.
    Boundary { count: u64, spread_ms: u64 },
    /// A client at the sustained rate goes quiet, then bursts: `lead_in` requests
    /// evenly over the first window, nothing for `idle_ms`, then `count` at once.
    IdleBurst {
        lead_in: u64,
        idle_ms: u64,
        count: u64,
    },
}

impl Pattern {
    /// The pattern called `name` with its defaults for `limit` per `window_ms`: steady
    /// at twice the limit; bursts of twice the limit; boundary halves of the limit,
    /// each spread over a tenth of the window; idle for half a window.
    pub fn named(name: &str, limit: u64, window_ms: u64) -> Option<Pattern> {
        let pattern = match name {
            "steady" => Pattern::Steady {
                per_second: 2.0 * limit as f64 * 1000.0 / window_ms.max(1) as f64,
            },
            "burst" => Pattern::Burst {
                count: limit.saturating_mul(2),
            },
            "boundary" => Pattern::Boundary {
                count: limit,
                spread_ms: window_ms / 10,
            },
            "idle-burst" => Pattern::IdleBurst {
                lead_in: limit,
                idle_ms: window_ms / 2,
                count: limit.saturating_mul(2),
            },
            _ => return None,
        };
        Some(pattern)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Pattern::Steady { .. } => "steady",
            Pattern::Burst { .. } => "burst",
            Pattern::Boundary { .. } => "boundary",
            Pattern::IdleBurst { .. } => "idle-burst",
        }
    }

    /// One line for the table and the chart's title.
    pub fn describe(&self, window_ms: u64) -> String {
        match *self {
            Pattern::Steady { per_second } => {
                format!("steady: {} requests/s", trim_float(per_second))
            }
            Pattern::Burst { count } => format!("burst: {count} requests at once"),
            Pattern::Boundary {
                count,
                spread_ms: 0,
            } => {
                format!("boundary: {count} requests 1 ms before a window boundary, {count} on it")
            }
            Pattern::Boundary { count, spread_ms } => format!(
                "boundary: {count} requests in the last {} of a window, {count} in the first {} of the next",
                format_span(spread_ms),
                format_span(spread_ms)
            ),
            Pattern::IdleBurst {
                lead_in,
                idle_ms,
                count,
            } => format!(
                "idle-burst: {lead_in} requests over {}, idle for {}, then {count} at once",
                format_span(window_ms),
                format_span(idle_ms)
            ),
        }
    }

    /// How long to simulate by default: long enough to see the traffic leave the
    /// trailing window.
    pub fn default_duration_ms(&self, window_ms: u64) -> u64 {
        match *self {
            Pattern::Steady { .. } | Pattern::Boundary { .. } => window_ms.saturating_mul(3),
            Pattern::Burst { .. } => window_ms.saturating_mul(2),
            Pattern::IdleBurst { idle_ms, .. } => {
                window_ms.saturating_mul(2).saturating_add(idle_ms)
            }
        }
    }

    /// The arrivals in `[0, duration_ms)`, each of `cost` hits, in time order.
    pub fn arrivals(
        &self,
        window_ms: u64,
        duration_ms: u64,
        cost: u64,
    ) -> Result<Vec<Arrival>, SimulateError> {
        let at = |at_ms: u64| Arrival { at_ms, cost };
        let too_many = |n: u64| {
            invalid(format!(
                "{n} requests: more than the {MAX_ARRIVALS} a simulation replays"
            ))
        };
        let mut arrivals = Vec::new();
        match *self {
            Pattern::Steady { per_second } => {
                if !(per_second.is_finite() && per_second > 0.0) {
                    return invalid(format!(
                        "rate must be a positive number of requests per second (got {per_second})"
                    ));
                }
                let n = (duration_ms as f64 * per_second / 1000.0).ceil();
                if n > MAX_ARRIVALS as f64 {
                    return too_many(n as u64);
                }
                let interval = 1000.0 / per_second;
                let times = (0..n as u64).map(|i| (i as f64 * interval).round() as u64);
                arrivals.extend(times.filter(|&t| t < duration_ms).map(at));
            }
            Pattern::Burst { count } => {
                check_count(count)?;
                arrivals.extend((0..count).map(|_| at(0)));
            }
            Pattern::Boundary { count, spread_ms } => {
                check_count(count.saturating_mul(2))?;
                if spread_ms >= window_ms {
                    return invalid(format!(
                        "spread must be shorter than the window ({} >= {})",
                        format_span(spread_ms),
                        format_span(window_ms)
                    ));
                }
                let offset =
                    |i: u64| (u128::from(i) * u128::from(spread_ms) / u128::from(count)) as u64;
                arrivals.extend((0..count).rev().map(|i| at(window_ms - 1 - offset(i))));
                arrivals.extend((0..count).map(|i| at(window_ms + offset(i))));
            }
            Pattern::IdleBurst {
                lead_in,
                idle_ms,
                count,
            } => {
                check_count(lead_in.saturating_add(count))?;
                let step =
                    |i: u64| (u128::from(i) * u128::from(window_ms) / u128::from(lead_in)) as u64;
                arrivals.extend((0..lead_in).map(|i| at(step(i))));
                let burst_at = window_ms.saturating_add(idle_ms);
                arrivals.extend((0..count).map(|_| at(burst_at)));
            }
        }
        if arrivals.iter().all(|a| a.at_ms >= duration_ms) {
            return invalid(format!(
                "the {} pattern starts after the {} simulated",
                self.name(),
                format_span(duration_ms)
            ));
        }
        Ok(arrivals)
    }
}

fn check_count(n: u64) -> Result<(), SimulateError> {
    if n == 0 {
        return invalid("count must be at least 1");
    }
    if n > MAX_ARRIVALS as u64 {
        return invalid(format!(
            "{n} requests: more than the {MAX_ARRIVALS} a simulation replays"
        ));
    }
    Ok(())
}

/// `2`, `0.5`, `0.333`.
fn trim_float(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The last millisecond of the year 9999: later timestamps are surely not
/// milliseconds since the epoch (and would overflow the models' arithmetic).
pub const MAX_TIMESTAMP_MS: u64 = 253_402_300_799_999;

/// Parses a CSV of arrivals: one request per line, `timestamp_ms` or
/// `timestamp_ms,cost` (whole milliseconds; cost defaults to 1, 0 checks only).
/// Fields may also be separated by `;`, a tab or spaces. Blank lines and `#` comments
/// are skipped, and so is a first line that is a header (starts with a letter). The
/// result is in time order (a stable sort: equal timestamps keep the file's order).
pub fn parse_csv(text: &str) -> Result<Vec<Arrival>, SimulateError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut arrivals = Vec::new();
    let mut seen_data = false;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let error = |message: String| Err(SimulateError::Csv { line, message });
        if !seen_data && content.starts_with(|c: char| c.is_alphabetic()) {
            seen_data = true;
            continue;
        }
        seen_data = true;
        let fields: Vec<&str> = content
            .split([',', ';', '\t', ' '])
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let (time, cost) = match fields.as_slice() {
            [time] => (*time, None),
            [time, cost] => (*time, Some(*cost)),
            _ => {
                return error(format!(
                    "expected 'timestamp_ms' or 'timestamp_ms,cost', got {} fields in '{}'",
                    fields.len(),
                    shorten(content)
                ));
            }
        };
        let Ok(at_ms) = time.parse::<u64>() else {
            return error(format!(
                "timestamp '{}' is not a whole number of milliseconds",
                shorten(time)
            ));
        };
        if at_ms > MAX_TIMESTAMP_MS {
            return error(format!(
                "timestamp {at_ms} is after the year 9999 (ms since the epoch expected)"
            ));
        }
        let cost = match cost {
            None => 1,
            Some(text) => match text.parse::<u32>() {
                Ok(cost) => u64::from(cost),
                Err(_) => {
                    return error(format!(
                        "cost '{}' is not a whole number from 0 to {} (hits_addend is a uint32)",
                        shorten(text),
                        u32::MAX
                    ));
                }
            },
        };
        if arrivals.len() >= MAX_ARRIVALS {
            return error(format!(
                "more than {MAX_ARRIVALS} requests; a simulation replays at most that many"
            ));
        }
        arrivals.push(Arrival { at_ms, cost });
    }
    if arrivals.is_empty() {
        return invalid("no timestamps in the CSV (one per line: timestamp_ms[,cost])");
    }
    arrivals.sort_by_key(|a| a.at_ms);
    Ok(arrivals)
}

/// At most 40 characters of a user's text, for an error message.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}
