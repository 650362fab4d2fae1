//! `tollgate bench`: a load generator for any `ShouldRateLimit` server (it needs only
//! the protocol). K HTTP/2 connections; C calls in flight (closed loop) or a fixed
//! offered rate (open loop, latency from the intended send time); requests with D
//! descriptors drawn from N keys, uniform or Zipf, optionally sharing entries drawn
//! once per request (one tenant per request, [`workload`]); a warm-up, then a measured
//! window. Reports throughput, HDR-histogram percentiles, errors by gRPC code and the
//! OVER_LIMIT share ([`report`]). Bounded in time and count by [`Limits`].

pub mod driver;
pub mod record;
pub mod report;
pub mod workload;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::driver::Window;
use self::record::Live;
use self::report::{Report, Setup};
use self::workload::{Workload, WorkloadSpec};

/// Upper bounds on what one run may ask for.
pub struct Limits;

impl Limits {
    pub const MAX_CONNECTIONS: usize = 1024;
    pub const MAX_CONCURRENCY: usize = 100_000;
    pub const MAX_RATE: f64 = 10_000_000.0;
    pub const MAX_SECONDS: f64 = 3600.0;
    pub const MAX_KEYS: u64 = 10_000_000;
    /// As the server's validation (envoyproxy/ratelimit has no bound; tollgate: 64).
    pub const MAX_DESCRIPTORS: usize = 64;
    /// Entries per descriptor, shared ones included (tollgate's validation: 32).
    pub const MAX_ENTRIES: usize = 32;
}

/// How the load is offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Keep this many calls in flight.
    Closed { concurrency: usize },
    /// Send this many requests per second, with at most `max_in_flight` outstanding.
    Open { rate: f64, max_in_flight: usize },
}

/// One run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `http://host:port`.
    pub url: String,
    pub connections: usize,
    pub load: Load,
    pub workload: WorkloadSpec,
    pub warmup: Duration,
    pub duration: Duration,
    /// Stop after this many requests (warm-up included), if given.
    pub max_requests: Option<u64>,
    pub call_timeout: Duration,
    /// Print a progress line on stderr once a second.
    pub progress: bool,
}

impl BenchOptions {
    /// Refuses runs outside [`Limits`] or that could not measure anything.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |what: &str| Err(what.to_owned());
        if self.connections == 0 || self.connections > Limits::MAX_CONNECTIONS {
            return bad("--connections must be in 1..=1024");
        }
        match self.load {
            Load::Closed { concurrency } => {
                if concurrency == 0 || concurrency > Limits::MAX_CONCURRENCY {
                    return bad("--concurrency must be in 1..=100000");
                }
            }
            Load::Open {
                rate,
                max_in_flight,
            } => {
                if !(rate.is_finite() && rate > 0.0 && rate <= Limits::MAX_RATE) {
                    return bad("--rate must be in (0, 10000000] requests per second");
                }
                if max_in_flight == 0 || max_in_flight > Limits::MAX_CONCURRENCY {
                    return bad("--concurrency (the in-flight bound) must be in 1..=100000");
                }
            }
        }
        let w = &self.workload;
        if w.descriptors == 0 || w.descriptors > Limits::MAX_DESCRIPTORS {
            return bad("--descriptors must be in 1..=64");
        }
        if w.entry_keys.is_empty() || w.entry_keys.iter().any(String::is_empty) {
            return bad("--entry-keys needs at least one non-empty key");
        }
        if w.shared.iter().any(|e| e.key.is_empty()) {
            return bad("--shared-entry needs a non-empty key");
        }
        if w.shared
            .iter()
            .any(|e| e.values == 0 || e.values > Limits::MAX_KEYS)
        {
            return bad("--shared-entry KEY=N needs N in 1..=10000000");
        }
        if w.shared.len() + w.entry_keys.len() > Limits::MAX_ENTRIES {
            return bad("--shared-entry and --entry-keys give a descriptor at most 32 entries");
        }
        if w.keys == 0 || w.keys > Limits::MAX_KEYS {
            return bad("--keys must be in 1..=10000000");
        }
        if w.domain.is_empty() {
            return bad("--domain must not be empty");
        }
        let total = self.warmup.as_secs_f64() + self.duration.as_secs_f64();
        if self.duration.is_zero() || total > Limits::MAX_SECONDS {
            return bad("--duration must be positive and warm-up + duration at most 3600 s");
        }
        if self.call_timeout.is_zero() {
            return bad("--timeout-ms must be at least 1");
        }
        Ok(())
    }
}

/// Runs the benchmark and returns its report.
pub async fn run(options: BenchOptions) -> Result<Report, String> {
    options.validate()?;
    let clients =
        driver::connect(&options.url, options.connections, Duration::from_secs(5)).await?;
    let workload = Arc::new(Workload::new(options.workload.clone()));
    let live = Arc::new(Live::default());
    let start = Instant::now();
    let window = Window {
        start,
        measure_from: start + options.warmup,
        end: start + options.warmup + options.duration,
        call_timeout: options.call_timeout,
    };
    let progress = options
        .progress
        .then(|| tokio::spawn(progress(live.clone(), window)));
    let (recorder, unsent, concurrency, rate, mode) = match options.load {
        Load::Closed { concurrency } => {
            let recorder = driver::closed_loop(
                &clients,
                concurrency,
                workload,
                window,
                live.clone(),
                options.max_requests,
            )
            .await;
            (recorder, 0, concurrency, None, "closed")
        }
        Load::Open {
            rate,
            max_in_flight,
        } => {
            let (recorder, unsent) = driver::open_loop(
                clients,
                rate,
                max_in_flight,
                workload,
                window,
                live.clone(),
                options.max_requests,
            )
            .await;
            (recorder, unsent, max_in_flight, Some(rate), "open")
        }
    };
    // The measured window as it happened: a request budget may end the load before
    // the window does, and the rates must be per second of this, not of the window.
    let stopped = Instant::now().min(window.end);
    let measured = stopped.saturating_duration_since(window.measure_from);
    if let Some(task) = progress {
        task.abort();
        let _ = writeln!(std::io::stderr());
    }
    let spec = &options.workload;
    let setup = Setup {
        target: options.url.clone(),
        mode,
        connections: options.connections,
        concurrency,
        rate,
        descriptors: spec.descriptors,
        keys: spec.keys,
        distribution: spec.distribution.to_string(),
        shared: spec.shared.clone(),
        warmup: options.warmup,
        duration: options.duration,
        measured,
        domain: spec.domain.clone(),
        totals: live.totals(),
    };
    Ok(Report::new(setup, &recorder, unsent))
}

/// Once a second until aborted: the last second's completions and the totals, on one
/// line that rewrites itself on a terminal.
async fn progress(live: Arc<Live>, window: Window) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    let mut last = 0;
    loop {
        ticker.tick().await;
        let totals = live.snapshot();
        let now = Instant::now();
        let line = report::progress_line(
            now - window.start,
            now < window.measure_from,
            totals.0 - last,
            totals,
        );
        last = totals.0;
        let mut err = std::io::stderr().lock();
        let _ = if tty {
            write!(err, "\r{line}\x1b[K")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }
}
