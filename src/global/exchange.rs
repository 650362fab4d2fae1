//! One exchange with the ledger: every counter's report applied to its record by
//! compare-and-swap. The records are read in one call, divided here
//! (`divide::step`), and swapped in one call; a record another replica changed in
//! between comes back with the swap's answer and is divided again, a few rounds at
//! most (a counter that keeps losing waits for the next report; nothing is lost by
//! that, its grants stay as they were).

use std::time::Duration;

use super::divide::{self, Outcome, Released, Report, Timing};
use super::ledger::{Ledger, LedgerError, Swap, Swapped};
use super::record::Record;
use super::window;
use crate::algorithm::Division;
use crate::clock::Clock;

/// Rounds of read-divide-swap before a counter waits for its next report.
const ROUNDS: usize = 4;

/// How long a record outlives its last window at least: idle counters go, and a
/// region cut off for a while finds its grants again.
const KEEP_MS: u64 = 10 * 60 * 1000;

/// One counter's report, owning its parts.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The record's key in the ledger.
    pub key: String,
    pub limit: u64,
    pub window_ms: u64,
    pub division: Division,
    pub rate: f64,
    pub count: Option<(u64, u64)>,
    pub held: Vec<(u64, u64)>,
    pub released: Option<Released>,
}

/// What one counter's exchange gave: the record stored and the outcome; `None` when
/// the counter kept losing the race or its record could not be read (both logged by
/// the caller, and the counter keeps its grants).
pub type Exchanged = Option<(Record, Outcome)>;

/// Who reports, and the timing of a step apart from "now".
#[derive(Debug, Clone, Copy)]
pub struct Reporter<'a> {
    pub region: &'a str,
    pub replica: &'a str,
    pub report_period: Duration,
}

/// Applies every submission to its record; `Err` when the ledger did not answer.
pub async fn exchange(
    ledger: &dyn Ledger,
    clock: &dyn Clock,
    who: Reporter<'_>,
    submissions: &[Submission],
) -> Result<Vec<Exchanged>, LedgerError> {
    let keys: Vec<String> = submissions.iter().map(|s| s.key.clone()).collect();
    let mut current = ledger.read(&keys).await?;
    let mut results: Vec<Exchanged> = vec![None; submissions.len()];
    let mut todo: Vec<usize> = (0..submissions.len()).collect();
    for _ in 0..ROUNDS {
        if todo.is_empty() {
            break;
        }
        let timing = timing(clock.now_millis(), who.report_period);
        let mut swaps = Vec::with_capacity(todo.len());
        let mut computed = Vec::with_capacity(todo.len());
        for &i in &todo {
            let record = match current[i].as_deref().map(Record::decode).transpose() {
                Ok(record) => record,
                Err(error) => {
                    tracing::error!(
                        event = "global_record_unreadable",
                        key = %submissions[i].key,
                        error,
                        "a global ledger record cannot be read: left as it is, and this counter keeps the grants it holds"
                    );
                    continue;
                }
            };
            let s = &submissions[i];
            let report = Report {
                region: who.region,
                replica: who.replica,
                limit: s.limit,
                window_ms: s.window_ms,
                division: s.division,
                rate: s.rate,
                count: s.count,
                held: &s.held,
                released: s.released.clone(),
            };
            let t = Timing {
                lead_ms: window::lead(s.window_ms, period_ms(who.report_period)),
                ..timing
            };
            let (next, outcome) = divide::step(record, &report, &t);
            swaps.push(Swap {
                key: s.key.clone(),
                expected: current[i].clone(),
                new: next.encode(),
                ttl_ms: ttl_ms(&next, t.now_ms),
            });
            computed.push((i, next, outcome));
        }
        let answers = ledger.swap(&swaps).await?;
        todo.clear();
        for ((i, next, outcome), answer) in computed.into_iter().zip(answers) {
            match answer {
                Swapped::Done => results[i] = Some((next, outcome)),
                Swapped::Conflict(now) => {
                    current[i] = now;
                    todo.push(i);
                }
            }
        }
    }
    Ok(results)
}

fn period_ms(period: Duration) -> u64 {
    u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The step's timing at `now_ms` (the lead is the counter's).
fn timing(now_ms: u64, report_period: Duration) -> Timing {
    let period = period_ms(report_period);
    Timing {
        now_ms,
        lead_ms: period,
        // Three missed reports: a region is cut off or gone.
        stale_ms: period.saturating_mul(3),
        // Time to consume a release and say so: a few calls, well within a period.
        pending_ms: period.saturating_mul(2).max(5_000),
    }
}

/// The record's TTL: past the end of its last window, by a window and at least
/// [`KEEP_MS`].
fn ttl_ms(record: &Record, now_ms: u64) -> u64 {
    let w = record.window_ms.max(1);
    let last_end = record
        .windows
        .keys()
        .last()
        .map_or(now_ms, |last| window::end(*last, w));
    last_end
        .saturating_sub(now_ms)
        .saturating_add(w.max(KEEP_MS))
}
