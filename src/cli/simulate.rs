//! `tollgate simulate`: the command line of the simulator (`crate::simulate`). Turns
//! flags into a limit and a traffic pattern (or reads a CSV), prints the table and
//! writes the SVG chart. Exit 0 on success, 1 on bad input (with a message saying
//! which flag or which `file:line`), 2 on a usage error (clap).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::console;
use crate::algorithm::Algorithm;
use crate::config::Unit;
use crate::config::diagnostics::parse_duration;
use crate::simulate::patterns::{self, NAMES};
use crate::simulate::{Pattern, Setup, SimulateError, Simulation, svg, table};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Built-in traffic [default: boundary]. steady: evenly spaced at --rate; burst:
    /// --count at once; boundary: --count just before a window boundary and --count just
    /// after; idle-burst: L over one window, --idle of quiet, then --count at once.
    #[arg(long, value_name = "NAME", value_parser = NAMES, conflicts_with = "csv")]
    pub pattern: Option<String>,
    /// Replay a CSV instead: one request per line, `timestamp_ms` or
    /// `timestamp_ms,cost` (blank lines, `#` comments and a header line are skipped).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Algorithms to compare, comma-separated or repeated [default: all].
    #[arg(long = "algorithm", value_name = "NAME", value_delimiter = ',', value_parser = Algorithm::names())]
    pub algorithms: Vec<String>,
    /// L: requests per window.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub limit: u64,
    /// W, whole seconds: `1m`, `90s`, `2h` [default: 1m]. Or give --unit.
    #[arg(long, value_name = "DURATION", conflicts_with = "unit")]
    pub window: Option<String>,
    /// W as in the config: second, minute, hour, day, week, month, year.
    #[arg(long, value_name = "UNIT")]
    pub unit: Option<String>,
    /// W = unit x this (`rate_limit.unit_multiplier`).
    #[arg(long, value_name = "N", requires = "unit")]
    pub unit_multiplier: Option<u32>,
    /// B for token_bucket, gcra and leaky_bucket [default: the limit].
    #[arg(long, value_name = "N")]
    pub burst: Option<u64>,
    /// leaky_bucket: the longest an admitted request may wait (`250ms`, `5s`).
    #[arg(long, value_name = "DURATION")]
    pub max_delay: Option<String>,
    /// How long to simulate and chart [default: per pattern, 2 or 3 windows].
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,
    /// steady: requests per second [default: twice the limit's rate, 2L / W].
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// burst, idle-burst: requests in the burst [default: 2 x limit]; boundary:
    /// requests on each side of the boundary [default: the limit].
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// boundary: each half is spread over this long [default: a tenth of the window].
    #[arg(long, value_name = "DURATION")]
    pub spread: Option<String>,
    /// idle-burst: the quiet time before the burst [default: half a window].
    #[arg(long, value_name = "DURATION")]
    pub idle: Option<String>,
    /// Hits per request of a built-in pattern (0 checks only) [default: 1].
    #[arg(long, value_name = "N")]
    pub cost: Option<u32>,
    /// Write the chart here (SVG).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

pub fn run(args: SimulateArgs) -> ExitCode {
    match simulate(&args) {
        Ok(sim) => {
            let mut text = table::render(&sim);
            if let Some(path) = &args.svg {
                if let Err(e) = std::fs::write(path, svg::render(&sim)) {
                    console::eprintln(&format!(
                        "tollgate simulate: cannot write {}: {e}",
                        path.display()
                    ));
                    return ExitCode::FAILURE;
                }
                text.push_str(&format!("chart: {}\n", path.display()));
            }
            if console::print_or_report("simulate", &text) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            console::eprintln(&format!("tollgate simulate: {message}"));
            ExitCode::FAILURE
        }
    }
}

/// Runs the simulation the flags describe; the error is the message to print.
pub fn simulate(args: &SimulateArgs) -> Result<Simulation, String> {
    let setup = setup(args)?;
    setup.validate().map_err(|e| e.to_string())?;
    let duration = args
        .duration
        .as_deref()
        .map(|d| millis("--duration", d))
        .transpose()?;
    if let Some(path) = &args.csv {
        let pattern_flags = [
            ("--rate", args.rate.is_some()),
            ("--count", args.count.is_some()),
            ("--spread", args.spread.is_some()),
            ("--idle", args.idle.is_some()),
            ("--cost", args.cost.is_some()),
        ];
        if let Some((flag, _)) = pattern_flags.iter().find(|(_, given)| *given) {
            return Err(format!(
                "{flag} shapes a built-in pattern; a CSV gives its own timestamps and costs"
            ));
        }
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text =
            String::from_utf8(text).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
        let arrivals = patterns::parse_csv(&text).map_err(|e| match e {
            SimulateError::Csv { line, message } => format!("{}:{line}: {message}", path.display()),
            other => format!("{}: {other}", path.display()),
        })?;
        let description = format!("csv: {} ({} requests)", path.display(), arrivals.len());
        return Simulation::from_arrivals(&setup, description, arrivals, duration)
            .map_err(|e| e.to_string());
    }
    let name = args.pattern.as_deref().unwrap_or("boundary");
    let mut pattern = Pattern::named(name, setup.limit, setup.window_ms)
        .ok_or_else(|| format!("unknown pattern '{name}'"))?;
    let only =
        |flag: &str, which: &str| Err(format!("{flag} applies to the {which} pattern, not {name}"));
    if let Some(rate) = args.rate {
        match &mut pattern {
            Pattern::Steady { per_second } => *per_second = rate,
            _ => return only("--rate", "steady"),
        }
    }
    if let Some(n) = args.count {
        match &mut pattern {
            Pattern::Burst { count }
            | Pattern::Boundary { count, .. }
            | Pattern::IdleBurst { count, .. } => *count = n,
            Pattern::Steady { .. } => return only("--count", "burst, boundary or idle-burst"),
        }
    }
    if let Some(text) = &args.spread {
        match &mut pattern {
            Pattern::Boundary { spread_ms, .. } => *spread_ms = millis("--spread", text)?,
            _ => return only("--spread", "boundary"),
        }
    }
    if let Some(text) = &args.idle {
        match &mut pattern {
            Pattern::IdleBurst { idle_ms, .. } => *idle_ms = millis("--idle", text)?,
            _ => return only("--idle", "idle-burst"),
        }
    }
    let cost = u64::from(args.cost.unwrap_or(1));
    Simulation::from_pattern(&setup, &pattern, duration, cost).map_err(|e| e.to_string())
}

/// The limit from the flags (not yet validated).
fn setup(args: &SimulateArgs) -> Result<Setup, String> {
    let window_ms = match (&args.window, &args.unit) {
        (Some(text), _) => millis("--window", text)?,
        (None, Some(unit)) => {
            let unit = Unit::parse(unit).ok_or_else(|| {
                let names: Vec<&str> = Unit::ALL.iter().map(|(_, n)| *n).collect();
                format!(
                    "--unit: invalid unit '{unit}' (expected one of {})",
                    names.join(", ")
                )
            })?;
            let multiplier = args.unit_multiplier.unwrap_or(1);
            if multiplier == 0 {
                return Err("--unit-multiplier must be at least 1".to_owned());
            }
            unit.seconds()
                .saturating_mul(u64::from(multiplier))
                .saturating_mul(1000)
        }
        (None, None) => 60_000,
    };
    let mut algorithms: Vec<Algorithm> = Vec::new();
    for name in &args.algorithms {
        let algorithm =
            Algorithm::parse(name).ok_or_else(|| format!("unknown algorithm '{name}'"))?;
        if !algorithms.contains(&algorithm) {
            algorithms.push(algorithm);
        }
    }
    if algorithms.is_empty() {
        algorithms = Algorithm::rate_limits();
    }
    let max_delay_ms = args
        .max_delay
        .as_deref()
        .map(|d| millis("--max-delay", d))
        .transpose()?;
    if max_delay_ms.is_some() && !algorithms.iter().any(|a| a.takes_max_delay()) {
        return Err(format!(
            "--max-delay applies to {}, which is not simulated",
            Algorithm::names_where(Algorithm::takes_max_delay)
        ));
    }
    if args.burst.is_some() && !algorithms.iter().any(|a| a.uses_burst()) {
        return Err(format!(
            "--burst applies to {}, none of which is simulated",
            Algorithm::names_where(Algorithm::uses_burst)
        ));
    }
    Ok(Setup {
        limit: args.limit,
        window_ms,
        burst: args.burst,
        max_delay_ms,
        algorithms,
    })
}

/// A duration flag in whole milliseconds.
fn millis(flag: &str, text: &str) -> Result<u64, String> {
    let duration = parse_duration(text)
        .ok_or_else(|| format!("{flag}: '{text}' is not a duration (like 250ms, 2s, 1m, 1h)"))?;
    u64::try_from(duration.as_millis()).map_err(|_| format!("{flag}: '{text}' is too long"))
}
