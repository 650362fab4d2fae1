//! The command line: `serve`, `validate`, `check`, `inspect`, `simulate`, `bench` and `migrate-check`.
//! Each subcommand lives in its own file; [`run`] turns its outcome into the process
//! exit code, and `main.rs` only parses and dispatches. Every write to stdout or
//! stderr goes through [`out`], so a closed pipe never panics.

pub mod bench;
pub mod check;
pub mod console;
pub mod inspect;
pub mod migrate_check;
pub mod serve;
pub mod simulate;
pub mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    // The same version and commit as `tollgate_build_info`.
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TOLLGATE_COMMIT"), ")"),
    about = "Global rate-limit service for Envoy (RateLimitService v3)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve ShouldRateLimit over gRPC, plus /healthcheck and /json over HTTP.
    Serve(crate::settings::ServeFlags),
    /// Validate a config file or directory; exit non-zero listing every error.
    Validate {
        /// A YAML file or a directory of them.
        path: PathBuf,
    },
    /// Ask a running server for a decision and print it as a table; exit 0 OK, 1 OVER_LIMIT, 2 error.
    Check(check::CheckArgs),
    /// Show the counters a request would touch, read from Redis without consuming.
    Inspect(inspect::InspectArgs),
    /// Replay a traffic pattern through the algorithm models; print a table, draw an SVG.
    Simulate(simulate::SimulateArgs),
    /// List everything that will behave differently from envoyproxy/ratelimit for an environment and config; exit 1 if anything does.
    MigrateCheck(migrate_check::MigrateCheckArgs),
    /// Load any ShouldRateLimit server; report throughput and latency percentiles.
    Bench(bench::BenchArgs),
}

pub async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(flags) => match serve::run(flags).await {
            Ok(()) => ExitCode::SUCCESS,
            // A failure while serving was logged where it happened.
            Err(e @ serve::ServeError::Serve(_)) => e.exit_code(),
            Err(e) => {
                console::eprintln(&format!("tollgate: {e}"));
                e.exit_code()
            }
        },
        Command::Validate { path } => validate::run(&path),
        Command::Check(args) => check::run(args).await,
        Command::Inspect(args) => inspect::run(args).await,
        Command::Simulate(args) => simulate::run(args),
        Command::Bench(args) => bench::run(args).await,
        Command::MigrateCheck(args) => migrate_check::run(args),
    }
}
