//! The ledger client of one replica: every report period (sooner when a request was
//! denied or met a counter without a share, at most four times a period) it reads
//! what its region's counters hold, reports each global counter's demand and count
//! to the ledger, takes the grants back into the table, and carries out the releases
//! the ledger asked for (`burn.rs`), reporting them in a second exchange. Requests
//! never wait for any of it.
//!
//! What a replica sends is only what it knows for sure: the demand it saw, what the
//! counter held when read, the grants it holds (so a ledger that lost them takes them
//! back), and a release once consumed. A failed exchange changes nothing in the
//! table: the region keeps deciding on the grants it holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::burn;
use super::entry_sync::EntrySync;
use super::exchange::{self, Exchanged, Reporter, Submission};
use super::ledger::Ledger;
use super::ledger::redis::RedisLedger;
use super::record::Pending;
use super::status::LinkStatus;
use super::table::{Entry, Table};
use super::{GlobalOptions, window};
use crate::clock::Clock;
use crate::metrics::{GlobalRuleFigures, Metrics};
use crate::store::Store;

/// What one sync did, for tests and logs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Synced {
    pub counters: usize,
    /// Counters whose records the exchange stored.
    pub exchanged: usize,
    /// Tokens released (consumed and reported).
    pub released: u64,
}

/// One replica's link to the ledger.
pub struct Client {
    table: Arc<Table>,
    store: Arc<dyn Store>,
    ledger: Arc<dyn Ledger>,
    options: GlobalOptions,
    status: Arc<LinkStatus>,
    clock: Arc<dyn Clock>,
    metrics: Option<Arc<Metrics>>,
    /// Counters the table had forgotten at the last sync (the metric counts the rest).
    forgotten: AtomicU64,
}

impl Client {
    pub fn new(
        table: Arc<Table>,
        store: Arc<dyn Store>,
        ledger: Arc<dyn Ledger>,
        options: GlobalOptions,
        status: Arc<LinkStatus>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            table,
            store,
            ledger,
            options,
            status,
            clock,
            metrics: None,
            forgotten: AtomicU64::new(0),
        }
    }

    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Syncs every report period, and when a request asks, until dropped.
    pub async fn run(self) {
        let period = self.options.report_period;
        let least_gap = period / 4;
        let mut last = tokio::time::Instant::now() - period;
        loop {
            // Up to a tenth early or late, so the replicas of a region spread out.
            let jitter = period.mul_f64(0.9 + 0.2 * fastrand::f64());
            tokio::select! {
                () = tokio::time::sleep_until(last + jitter) => {}
                () = self.table.woken() => {}
            }
            tokio::time::sleep_until(last + least_gap).await;
            last = tokio::time::Instant::now();
            let _ = self.sync_once().await;
        }
    }

    /// One sync: read, exchange, apply, release.
    pub async fn sync_once(&self) -> Synced {
        let now = self.clock.now_millis();
        let entries = self.live(now);
        let mut synced = Synced {
            counters: entries.len(),
            ..Synced::default()
        };
        if entries.is_empty() {
            self.publish(&entries);
            return synced;
        }
        let skew = self.table.skew_ms();
        let counts = burn::counts(&*self.store, &*self.clock, skew, &entries).await;
        let submissions: Vec<Submission> = entries
            .iter()
            .zip(counts)
            .map(|(entry, count)| self.submission(entry, count, now))
            .collect();
        let Some(results) = self.exchange(&submissions).await else {
            self.publish(&entries);
            return synced;
        };
        synced.exchanged = results.iter().flatten().count();
        self.apply(&entries, &submissions, results, now);
        let asked: Vec<(Arc<Entry>, u64, Pending)> = entries
            .iter()
            .filter_map(|e| {
                let (w, pending) = lock(e).asked.clone()?;
                (pending.until_ms > now).then(|| (e.clone(), w, pending))
            })
            .collect();
        if !asked.is_empty() {
            synced.released = self.release(&asked).await;
        }
        self.publish(&entries);
        synced
    }

    /// The counters still in use; the others are forgotten (their grants stay in
    /// the ledger until their windows end).
    fn live(&self, now: u64) -> Vec<Arc<Entry>> {
        let mut live = Vec::new();
        for entry in self.table.entries() {
            let idle_after = (2 * entry.base.window_ms).clamp(60_000, 3_600_000);
            let pending = lock(&entry).done.is_some();
            if now.saturating_sub(entry.last_used_ms()) > idle_after && !pending {
                self.table.forget(&entry.key);
            } else {
                live.push(entry);
            }
        }
        live
    }

    fn submission(&self, entry: &Entry, count: Option<(u64, u64)>, now: u64) -> Submission {
        let mut s = lock(entry);
        // A rate over at least half a period: a sync the wake brought early reports
        // the last rate and leaves the hits to the next, so a handful of requests is
        // never read as a rate.
        // A new counter's first report says what it has, over a quarter second at least.
        let span = now.saturating_sub(s.last_report_ms);
        let first = s.record.is_none();
        let rate = if first || span >= period_ms(self.options.report_period) / 2 {
            let rate = entry.take_hits() as f64 * 1000.0 / span.max(250) as f64;
            s.last_report_ms = now;
            s.last_rate = rate;
            rate
        } else {
            s.last_rate
        };
        Submission {
            key: RedisLedger::key(&self.options.prefix, &entry.id),
            limit: entry.base.limit,
            window_ms: entry.base.window_ms,
            division: entry.division,
            rate,
            count,
            held: entry.grants(),
            released: s.done.clone(),
        }
    }

    /// The exchange, with its outcome recorded in the status; `None` when the ledger
    /// did not answer.
    async fn exchange(&self, submissions: &[Submission]) -> Option<Vec<Exchanged>> {
        let who = Reporter {
            region: &self.options.region,
            replica: &self.options.replica,
            report_period: self.options.report_period,
        };
        match exchange::exchange(&*self.ledger, &*self.clock, who, submissions).await {
            Ok(results) => {
                self.status.ok(self.clock.now_millis());
                Some(results)
            }
            Err(error) => {
                self.status
                    .failed(self.clock.now_millis(), &error.to_string());
                if let Some(metrics) = &self.metrics {
                    metrics.global().ledger_error(&self.options.region);
                }
                None
            }
        }
    }

    /// Grants into the table, and the releases asked for into each entry.
    fn apply(
        &self,
        entries: &[Arc<Entry>],
        submissions: &[Submission],
        results: Vec<Exchanged>,
        now: u64,
    ) {
        for ((entry, submission), result) in entries.iter().zip(submissions).zip(results) {
            let Some((record, outcome)) = result else {
                continue;
            };
            if outcome.overcommitted {
                self.overcommitted(entry);
            }
            // The ledger's grants, and the previous window's as held (a request near
            // the boundary may still take it: `window::candidates`).
            let current = window::index(now, entry.base.window_ms);
            let mut grants: BTreeMap<u64, u64> = entry
                .grants()
                .into_iter()
                .filter(|(w, _)| w + 1 >= current)
                .collect();
            for (w, g) in outcome.grants {
                let held = grants.entry(w).or_insert(0);
                *held = (*held).max(g);
            }
            entry.set_grants(grants.into_iter().collect());
            let mut s = lock(entry);
            if submission.released.is_some() {
                // Counted, or lapsed and never to be counted: either way, said.
                s.done = None;
            }
            if let Some(pending) = outcome.release {
                s.asked = Some((outcome.release_window, pending));
            }
            s.record = Some(record);
        }
    }

    /// Carries out the releases and reports them in a second exchange.
    async fn release(&self, asked: &[(Arc<Entry>, u64, Pending)]) -> u64 {
        let skew = self.table.skew_ms();
        let done = burn::release(&*self.store, &*self.clock, skew, asked).await;
        let now = self.clock.now_millis();
        let mut entries = Vec::new();
        let mut submissions = Vec::new();
        for ((entry, _, _), released) in asked.iter().zip(done) {
            let mut s = lock(entry);
            s.asked = None;
            s.done = Some(released.clone());
            let rate = s.last_rate;
            drop(s);
            entries.push(entry.clone());
            submissions.push(Submission {
                key: RedisLedger::key(&self.options.prefix, &entry.id),
                limit: entry.base.limit,
                window_ms: entry.base.window_ms,
                division: entry.division,
                rate,
                count: None,
                held: entry.grants(),
                released: Some(released),
            });
        }
        let Some(results) = self.exchange(&submissions).await else {
            return 0;
        };
        let mut released = 0;
        for ((entry, submission), result) in entries.iter().zip(&submissions).zip(&results) {
            if result.is_some()
                && let Some(done) = &submission.released
                && done.amount > 0
            {
                released += done.amount;
                if let Some(metrics) = &self.metrics {
                    metrics.global().released(
                        &entry.key.domain,
                        &entry.key.rule,
                        &self.options.region,
                        done.amount,
                    );
                }
            }
        }
        self.apply(&entries, &submissions, results, now);
        released
    }

    fn overcommitted(&self, entry: &Entry) {
        if let Some(metrics) = &self.metrics {
            metrics.global().overcommitted(&self.options.region);
        }
        if let Some(suppressed) =
            crate::telemetry::ratelimited::admit(&["global_overcommitted", &entry.key.rule])
        {
            tracing::error!(
                event = "global_overcommitted",
                counter = %entry.id,
                suppressed,
                "the global ledger holds more grants than the limit for this counter (it lost records and the regions gave their grants back, or the regions' configs disagree on the limit): nothing more is granted until the windows end"
            );
        }
    }

    /// The metrics after a sync: per rule, the window in progress.
    fn publish(&self, entries: &[Arc<Entry>]) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let region = &self.options.region;
        let now = self.clock.now_millis();
        let mut rules: BTreeMap<(String, String), GlobalRuleFigures> = BTreeMap::new();
        for entry in entries {
            let (domain, rule) = (entry.key.domain.to_string(), entry.key.rule.to_string());
            metrics
                .global()
                .unshared(&domain, &rule, region, entry.take_unshared());
            let s = lock(entry);
            let figures = rules
                .entry((domain.clone(), rule.clone()))
                .or_insert_with(|| GlobalRuleFigures {
                    domain,
                    rule,
                    ..GlobalRuleFigures::default()
                });
            let current = window::index(now, entry.base.window_ms);
            if let Some(share) = s
                .record
                .as_ref()
                .and_then(|r| r.windows.get(&current))
                .and_then(|w| w.shares.get(region))
            {
                figures.share += share.effective();
                figures.used += share.used;
            }
            figures.limit += entry.base.limit;
        }
        let rules: Vec<GlobalRuleFigures> = rules.into_values().collect();
        metrics.global().rules(region, &rules);
        let up = self.status.state().failing_since_ms.is_none();
        metrics.global().link(region, entries.len(), up);
        let forgotten = self.table.evicted();
        let before = self.forgotten.swap(forgotten, Ordering::Relaxed);
        if forgotten > before {
            metrics.global().forgotten(region, forgotten - before);
        }
    }
}

fn period_ms(period: Duration) -> u64 {
    u64::try_from(period.as_millis()).unwrap_or(u64::MAX)
}

fn lock(entry: &Entry) -> std::sync::MutexGuard<'_, EntrySync> {
    entry.sync.lock().unwrap_or_else(|e| e.into_inner())
}
