//! The result of a run: throughput, latency percentiles, errors by code and the
//! OVER_LIMIT share, as a few lines of text or one JSON object; and the progress line.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::record::{Recorder, Totals, code_name};
use super::workload::SharedEntry;

/// Latency percentiles in milliseconds (of answered calls).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// Everything `tollgate bench` measured, as printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: String,
    /// `closed` (C calls always in flight) or `open` (a fixed offered rate).
    pub mode: &'static str,
    pub connections: usize,
    pub concurrency: usize,
    /// Offered rate (open loop only), requests per second.
    pub rate: Option<f64>,
    pub descriptors: usize,
    pub keys: u64,
    pub distribution: String,
    /// Entries every descriptor of a request shares, each drawn once per request.
    pub shared_entries: Vec<SharedEntry>,
    pub warmup_s: f64,
    /// The measured window as it happened (wall time): shorter than asked when
    /// `--requests` ran out first.
    pub duration_s: f64,
    /// The measured window asked for (`--duration`).
    pub requested_duration_s: f64,
    /// Calls that completed inside the measured window (answered or failed).
    pub requests: u64,
    /// Completed calls per second of measured wall time.
    pub rps: f64,
    /// Answered calls per second (the throughput that counts).
    pub ok_rps: f64,
    pub answered: u64,
    pub over_limit: u64,
    /// OVER_LIMIT answers / answered calls.
    pub over_limit_share: f64,
    /// Answers in which no descriptor carried a limit (unknown domain, no rule).
    pub answers_without_limit: u64,
    /// Set when the run measured nothing worth having (no answer carried a limit).
    pub warning: Option<String>,
    /// Errors by gRPC code name.
    pub errors: BTreeMap<String, u64>,
    /// Open loop: requests whose intended send time passed but that were never sent
    /// (the in-flight bound was reached): a sign the offered rate was too high.
    pub unsent: u64,
    pub latency_ms: Latency,
    /// Every call of the run, warm-up included.
    pub totals: Totals,
}

/// What the report is about, besides the measurements.
pub struct Setup {
    pub target: String,
    pub mode: &'static str,
    pub connections: usize,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub descriptors: usize,
    pub keys: u64,
    pub distribution: String,
    pub shared: Vec<SharedEntry>,
    pub warmup: Duration,
    /// The measured window asked for.
    pub duration: Duration,
    /// The measured window as it happened: from the end of the warm-up to when the
    /// load stopped (the window's end, or earlier when the request budget ran out).
    pub measured: Duration,
    /// The request domain (named in the warning).
    pub domain: String,
    pub totals: Totals,
}

/// Seconds, to the millisecond.
fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Every answer came back without a limit: the server counted nothing, so the figures
/// measure a lookup that found no rule, not rate limiting.
fn no_limit_warning(domain: &str) -> String {
    format!(
        "no answer carried a limit: domain '{domain}' is unknown to the server or no rule \
         matches the descriptors sent (--entry-keys), so nothing was rate limited and these \
         figures do not measure counting; pick a domain and keys the server's config limits"
    )
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 1000.0).round() / 1000.0
}

impl Report {
    pub fn new(setup: Setup, recorder: &Recorder, unsent: u64) -> Self {
        let secs = setup.measured.as_secs_f64().max(1e-9);
        let requests = recorder.answered + recorder.error_count();
        let h = &recorder.latency;
        let q = |quantile: f64| {
            if h.is_empty() {
                0.0
            } else {
                ms(h.value_at_quantile(quantile))
            }
        };
        let errors = recorder
            .errors
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(code, n)| (code_name(code), *n))
            .collect();
        Report {
            target: setup.target,
            mode: setup.mode,
            connections: setup.connections,
            concurrency: setup.concurrency,
            rate: setup.rate,
            descriptors: setup.descriptors,
            keys: setup.keys,
            distribution: setup.distribution,
            shared_entries: setup.shared,
            warmup_s: setup.warmup.as_secs_f64(),
            duration_s: round_ms(setup.measured),
            requested_duration_s: setup.duration.as_secs_f64(),
            requests,
            rps: (requests as f64 / secs).round(),
            ok_rps: (recorder.answered as f64 / secs).round(),
            answered: recorder.answered,
            over_limit: recorder.over_limit,
            over_limit_share: if recorder.answered == 0 {
                0.0
            } else {
                recorder.over_limit as f64 / recorder.answered as f64
            },
            answers_without_limit: recorder.without_limit,
            warning: (recorder.answered > 0 && recorder.without_limit == recorder.answered)
                .then(|| no_limit_warning(&setup.domain)),
            errors,
            unsent,
            latency_ms: Latency {
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                p999: q(0.999),
                max: if h.is_empty() { 0.0 } else { ms(h.max()) },
                mean: if h.is_empty() {
                    0.0
                } else {
                    (h.mean() / 1e3).round() / 1e3
                },
            },
            totals: setup.totals,
        }
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        let load = match self.rate {
            Some(rate) => format!(
                "open loop at {rate} req/s, up to {} in flight",
                self.concurrency
            ),
            None => format!("closed loop, {} in flight", self.concurrency),
        };
        let l = &self.latency_ms;
        let errors = if self.errors.is_empty() {
            "none".to_owned()
        } else {
            self.errors
                .iter()
                .map(|(code, n)| format!("{code}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let shared = if self.shared_entries.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = self
                .shared_entries
                .iter()
                .map(|e| format!("{} of {}", e.key, e.values))
                .collect();
            format!(
                "; in every descriptor, one per request: {}",
                each.join(", ")
            )
        };
        let mut out = format!(
            "target       {} ({load}, {} connection(s))\n\
             workload     {} descriptor(s)/request, {} keys, {}{shared}\n\
             measured     {:.3}s after {:.1}s warm-up{}\n\
             requests     {} ({} req/s, {} answered/s)\n\
             latency ms   p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  mean {:.3}\n\
             over limit   {} ({:.2}%)\n\
             errors       {errors}\n",
            self.target,
            self.connections,
            self.descriptors,
            self.keys,
            self.distribution,
            self.duration_s,
            self.warmup_s,
            if self.duration_s + 0.001 < self.requested_duration_s {
                format!(
                    " (stopped by the request budget; {:.1}s asked)",
                    self.requested_duration_s
                )
            } else {
                String::new()
            },
            self.requests,
            self.rps,
            self.ok_rps,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            l.mean,
            self.over_limit,
            self.over_limit_share * 100.0,
        );
        if self.unsent > 0 {
            out.push_str(&format!(
                "unsent       {} (the in-flight bound was reached: offered rate too high)\n",
                self.unsent
            ));
        }
        if let Some(warning) = &self.warning {
            out.push_str(&format!("WARNING      {warning}\n"));
        }
        out
    }
}

/// One progress line: the last second's throughput and the totals so far.
pub fn progress_line(
    elapsed: Duration,
    warming: bool,
    per_second: u64,
    totals: (u64, u64, u64, u64),
) -> String {
    let (completed, errors, over_limit, in_flight) = totals;
    format!(
        "[{:>5.1}s{}] {per_second:>7} req/s  total {completed}  errors {errors}  over_limit {over_limit}  in flight {in_flight}",
        elapsed.as_secs_f64(),
        if warming { " warm-up" } else { "" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::Outcome;

    #[test]
    fn report_counts_and_renders() {
        let mut recorder = Recorder::default();
        for i in 1..=100u64 {
            recorder.record(
                Outcome::Answered {
                    over_limit: i % 4 == 0,
                    limited: true,
                },
                Duration::from_micros(i * 10),
            );
        }
        recorder.record(
            Outcome::Failed(tonic::Code::DeadlineExceeded),
            Duration::ZERO,
        );
        let setup = Setup {
            target: "http://127.0.0.1:1".into(),
            mode: "closed",
            connections: 2,
            concurrency: 8,
            rate: None,
            descriptors: 1,
            keys: 10,
            distribution: "uniform".into(),
            shared: vec![SharedEntry {
                key: "tenant_id".into(),
                values: 100,
            }],
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(100),
            measured: Duration::from_secs(2),
            domain: "bench".into(),
            totals: Totals {
                sent: 130,
                answered: 120,
                over_limit: 30,
                errors: 2,
                in_flight: 8,
            },
        };
        let report = Report::new(setup, &recorder, 0);
        assert_eq!(report.requests, 101);
        assert_eq!(report.answered, 100);
        assert_eq!(report.rps, 51.0);
        assert_eq!(report.over_limit, 25);
        assert!((report.over_limit_share - 0.25).abs() < 1e-9);
        assert_eq!(report.errors.get("DeadlineExceeded"), Some(&1));
        assert!(
            (report.latency_ms.p50 - 0.5).abs() < 0.01,
            "{:?}",
            report.latency_ms
        );
        assert!((report.latency_ms.p99 - 0.99).abs() < 0.01);
        assert_eq!(report.duration_s, 2.0);
        assert_eq!(report.requested_duration_s, 100.0);
        assert_eq!(report.warning, None);
        let text = report.render();
        assert!(text.contains("p99 0.99"), "{text}");
        assert!(text.contains("measured     2.000s"), "{text}");
        assert!(text.contains("100.0s asked"), "{text}");
        assert!(text.contains("DeadlineExceeded=1"), "{text}");
        assert!(
            text.contains("in every descriptor, one per request: tenant_id of 100"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(
            json["latency_ms"]["p50"],
            serde_json::json!(report.latency_ms.p50)
        );
        assert_eq!(json["mode"], "closed");
        assert_eq!(json["totals"]["answered"], 120);
        assert_eq!(json["totals"]["in_flight"], 8);
        assert_eq!(
            json["shared_entries"],
            serde_json::json!([{"key": "tenant_id", "values": 100}])
        );
    }
}
