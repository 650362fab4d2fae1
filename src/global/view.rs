//! What an operator sees of global rules: `/global` (this replica: its region, the
//! link to the ledger, each counter's grants and the record the last exchange left)
//! and `tollgate inspect` (a counter's record read from the ledger, in words).

use std::fmt::Write as _;

use serde::Serialize;

use super::record::Record;
use super::status::LinkState;
use super::{Global, window};

/// `/global`'s document.
#[derive(Debug, Serialize)]
pub struct GlobalView {
    pub region: String,
    pub replica: String,
    pub ledger: &'static str,
    pub report_period_ms: u64,
    pub link: LinkState,
    /// While cut off: what `/healthcheck` adds.
    pub cut_off: Option<String>,
    pub counters: Vec<CounterView>,
}

/// One counter as this replica knows it.
#[derive(Debug, Serialize)]
pub struct CounterView {
    pub id: String,
    pub division: &'static str,
    pub limit: u64,
    pub window_ms: u64,
    pub window_in_progress: u64,
    /// This region's grant per window, as requests take them.
    pub grants: Vec<(u64, u64)>,
    /// Requests per second this replica reported last.
    pub reported_rate: f64,
    /// The record as the last exchange left it (every region's shares).
    pub record: Option<Record>,
}

impl Global {
    /// `/global`.
    pub fn view(&self) -> GlobalView {
        let now = self.table.now_ms();
        let mut counters: Vec<CounterView> = self
            .table
            .entries()
            .iter()
            .map(|e| {
                let s = e.sync.lock().unwrap_or_else(|p| p.into_inner());
                CounterView {
                    id: e.id.clone(),
                    division: match e.division {
                        crate::algorithm::Division::Window => "window",
                        crate::algorithm::Division::Rate => "rate",
                        crate::algorithm::Division::Refused(_) => "none",
                    },
                    limit: e.base.limit,
                    window_ms: e.base.window_ms,
                    window_in_progress: window::index(now, e.base.window_ms),
                    grants: e.grants(),
                    reported_rate: s.last_rate,
                    record: s.record.clone(),
                }
            })
            .collect();
        counters.sort_by(|a, b| a.id.cmp(&b.id));
        GlobalView {
            region: self.options.region.clone(),
            replica: self.options.replica.clone(),
            ledger: self.ledger_kind,
            report_period_ms: u64::try_from(self.options.report_period.as_millis())
                .unwrap_or(u64::MAX),
            link: self.status.state(),
            cut_off: self.health_detail(),
            counters,
        }
    }
}

/// A record in words, for `tollgate inspect`: each window's regions, their grants,
/// releases and use, and each region's demand.
pub fn describe(record: &Record, now_ms: u64, stale_ms: u64) -> String {
    let mut text = String::new();
    let w_ms = record.window_ms.max(1);
    let current = window::index(now_ms, w_ms);
    let _ = writeln!(
        text,
        "    divided   by {} over windows of {} s",
        record.division,
        w_ms / 1000
    );
    for (w, win) in &record.windows {
        let when = match w.cmp(&current) {
            std::cmp::Ordering::Less => "ended",
            std::cmp::Ordering::Equal => "in progress",
            std::cmp::Ordering::Greater => "next",
        };
        let _ = writeln!(
            text,
            "    window    {w} ({when}, from {} unix s): limit {}, held {}, free {}",
            window::start(*w, w_ms) / 1000,
            win.limit,
            win.held(),
            win.free()
        );
        for (region, share) in &win.shares {
            let pending = share
                .pending
                .as_ref()
                .map(|p| format!(", asked to release {}", p.amount))
                .unwrap_or_default();
            let _ = writeln!(
                text,
                "      {region}: share {} (granted {}, released {}), used {}{pending}",
                share.effective(),
                share.granted,
                share.released,
                share.used
            );
        }
    }
    for name in record.regions.keys() {
        let demand = record.demand(name, now_ms.saturating_sub(stale_ms));
        let _ = writeln!(
            text,
            "    demand    {name}: {}",
            demand.map_or(
                "not heard recently (keeps what it holds, gets nothing more)".into(),
                |d| { format!("{d:.1} requests/s") }
            )
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::record::{Demand, Share, Window};

    #[test]
    fn a_record_in_words() {
        let mut record = Record {
            window_ms: 60_000,
            division: "window".into(),
            ..Record::default()
        };
        let mut win = Window {
            limit: 6000,
            ..Window::default()
        };
        win.shares.insert(
            "eu".into(),
            Share {
                granted: 4500,
                released: 300,
                used: 4000,
                pending: None,
            },
        );
        record.windows.insert(10, win);
        record
            .regions
            .entry("eu".into())
            .or_default()
            .replicas
            .insert(
                "eu/a".into(),
                Demand {
                    rate: 70.0,
                    at_ms: 600_000,
                },
            );
        let text = describe(&record, 600_500, 6_000);
        assert!(text.contains("window    10 (in progress"), "{text}");
        assert!(text.contains("held 4200, free 1800"), "{text}");
        assert!(
            text.contains("eu: share 4200 (granted 4500, released 300), used 4000"),
            "{text}"
        );
        assert!(text.contains("eu: 70.0 requests/s"), "{text}");
    }
}
