//! `tollgate bench`: load any `ShouldRateLimit` server and report throughput and
//! latency (see [`crate::bench`]). Exit 0 when the run completed, 1 when it could not
//! start, 2 for bad arguments.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::console;
use crate::bench::workload::{Distribution, SharedEntry, WorkloadSpec};
use crate::bench::{self, BenchOptions, Load};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server address (http://host:port or host:port)
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    /// HTTP/2 connections (K)
    #[arg(long, short = 'k', default_value_t = 4)]
    pub connections: usize,
    /// Closed loop: calls kept in flight (C). Open loop: the bound on calls in flight
    #[arg(long, short = 'c', default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: offered requests per second (latency from the intended send time)
    #[arg(long)]
    pub rate: Option<f64>,
    /// Request domain
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// Descriptors per request
    #[arg(long, short = 'd', default_value_t = 1)]
    pub descriptors: usize,
    /// Entry keys of each descriptor, comma-separated (several: a nested descriptor);
    /// `{d}` becomes the descriptor's index (key{d} -> key0, key1, ...)
    #[arg(long, default_value = "key", value_delimiter = ',')]
    pub entry_keys: Vec<String>,
    /// An entry every descriptor of a request carries first, its value drawn once per
    /// request from N values (by --distribution), as Envoy sends one tenant_id in each
    /// descriptor: a request's counters are one tenant's. Repeat for several
    #[arg(long = "shared-entry", value_name = "KEY=N")]
    pub shared_entries: Vec<SharedEntry>,
    /// Distinct values each descriptor draws from (N)
    #[arg(long, short = 'n', default_value_t = 10_000)]
    pub keys: u64,
    /// How values are drawn: uniform, zipf or zipf:S
    #[arg(long, default_value = "uniform")]
    pub distribution: Distribution,
    /// Request-level hits_addend (0: one hit)
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    /// Seed of the key draws: the same seed sends the same keys, another fresh ones
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Seconds to measure
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of load before measuring
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Stop after this many requests (warm-up included)
    #[arg(long)]
    pub requests: Option<u64>,
    /// A call not answered within this many milliseconds counts as DeadlineExceeded
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Print a progress line every second even when stderr is not a terminal
    #[arg(long)]
    pub progress: bool,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

fn seconds(value: f64, flag: &str) -> Result<Duration, String> {
    if value.is_finite() && (0.0..=bench::Limits::MAX_SECONDS).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!("{flag} must be between 0 and 3600 seconds"))
    }
}

impl BenchArgs {
    pub fn options(&self) -> Result<BenchOptions, String> {
        let url = if self.addr.contains("://") {
            self.addr.clone()
        } else {
            format!("http://{}", self.addr)
        };
        let load = match self.rate {
            Some(rate) => Load::Open {
                rate,
                max_in_flight: self.concurrency,
            },
            None => Load::Closed {
                concurrency: self.concurrency,
            },
        };
        let options = BenchOptions {
            url,
            connections: self.connections,
            load,
            workload: WorkloadSpec {
                domain: self.domain.clone(),
                descriptors: self.descriptors,
                shared: self.shared_entries.clone(),
                entry_keys: self.entry_keys.clone(),
                keys: self.keys,
                distribution: self.distribution,
                hits_addend: self.hits,
                seed: self.seed,
            },
            warmup: seconds(self.warmup, "--warmup")?,
            duration: seconds(self.duration, "--duration")?,
            max_requests: self.requests,
            call_timeout: Duration::from_millis(self.timeout_ms),
            progress: self.progress || std::io::stderr().is_terminal(),
        };
        options.validate()?;
        Ok(options)
    }
}

pub async fn run(args: BenchArgs) -> ExitCode {
    let options = match args.options() {
        Ok(options) => options,
        Err(e) => {
            console::eprintln(&format!("tollgate bench: {e}"));
            return ExitCode::from(2);
        }
    };
    match bench::run(options).await {
        Ok(report) => {
            let text = if args.json {
                match serde_json::to_string(&report) {
                    Ok(json) => json + "\n",
                    Err(e) => {
                        console::eprintln(&format!("tollgate bench: {e}"));
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                report.render()
            };
            // Also on stderr, where a run piped into a file or `jq` still shows it.
            if let Some(warning) = &report.warning {
                console::eprintln(&format!("tollgate bench: WARNING: {warning}"));
            }
            if console::print_or_report("bench", &text) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            console::eprintln(&format!("tollgate bench: {e}"));
            ExitCode::FAILURE
        }
    }
}
