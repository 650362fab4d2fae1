//! The command line: `serve`, `validate`, `check`, `inspect`, `simulate`, `bench` and `migrate-check`.
//! Each subcommand lives in its own file; [`run`] turns its outcome into the process
//! exit code, and `main.rs` only parses and dispatches. Every write to stdout or
//! stderr goes through [`out`], so a closed pipe never panics.
//!
//! Invoked as `ratelimit` (the image's `/bin/ratelimit`, which Envoy Gateway and
//! envoyproxy/ratelimit's manifests run with no arguments), [`args`] makes it behave as
//! that binary: no subcommand means `serve`, with the debug port on by default.

pub mod bench;
pub mod check;
pub mod console;
pub mod inspect;
pub mod migrate_check;
pub mod runtime;
pub mod serve;
pub mod simulate;
pub mod validate;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// The program name under which tollgate stands in for envoyproxy/ratelimit.
pub const UPSTREAM_NAME: &str = "ratelimit";

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
    Serve(Box<crate::settings::ServeFlags>),
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

/// How long the exit waits for queued log lines to reach stderr (a stuck reader must
/// not hold the exit for longer).
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn run(cli: Cli) -> ExitCode {
    let code = run_command(cli).await;
    crate::telemetry::nonblocking::flush(LOG_FLUSH);
    code
}

async fn run_command(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(flags) => match serve::run(*flags).await {
            Ok(()) => ExitCode::SUCCESS,
            // A failure while serving was logged where it happened.
            Err(e @ serve::ServeError::Serve(_)) => e.exit_code(),
            // One line per refused setting, each saying who speaks.
            Err(e) => {
                for line in e.to_string().lines() {
                    console::eprintln(&format!("tollgate: {line}"));
                }
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

/// The command line to parse: `args` as given, except under the name `ratelimit`
/// without a subcommand, which is `serve` as envoyproxy/ratelimit's binary would run:
/// its flags (if any) follow, and its debug port (`/rlconfig`, which `egctl` reads on
/// 6070) is on, at `DEBUG_HOST:6070` unless `DEBUG_PORT` says otherwise. `env` looks a
/// variable up (std::env::var in production).
pub fn args(
    args: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    let Some(program) = args.first() else {
        return args;
    };
    let as_upstream = Path::new(program)
        .file_name()
        .is_some_and(|name| name == UPSTREAM_NAME);
    let subcommand = args.get(1).and_then(|a| a.to_str()).is_some_and(|first| {
        Cli::command()
            .get_subcommands()
            .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first))
            // clap's own: `help`, and the top-level version flags.
            || ["help", "-V", "--version"].contains(&first)
    });
    if !as_upstream || subcommand {
        return args;
    }
    let mut serve = vec![OsString::from("serve")];
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    // Only when DEBUG_PORT is unset: then the settings would leave the debug port off,
    // where upstream's default is 6070. A flag would beat DEBUG_HOST, so it is folded in.
    // A --debug-addr given by hand wins (clap refuses the flag twice).
    let given = args[1..].iter().any(|a| {
        a.to_str()
            .is_some_and(|a| a == "--debug-addr" || a.starts_with("--debug-addr="))
    });
    if set("DEBUG_PORT").is_none() && !given {
        let host = set("DEBUG_HOST").unwrap_or_else(|| "0.0.0.0".into());
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        serve.push("--debug-addr".into());
        serve.push(format!("{host}:{UPSTREAM_DEBUG_PORT}").into());
    }
    args.splice(1..1, serve);
    args
}

/// envoyproxy/ratelimit's `DEBUG_PORT` default.
const UPSTREAM_DEBUG_PORT: u16 = 6070;

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(argv: &[&str], vars: &[(&str, &str)]) -> Vec<String> {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        args(argv.iter().map(OsString::from), &env)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn ratelimit_without_a_subcommand_serves_with_the_debug_port_on() {
        assert_eq!(
            parsed(&["/bin/ratelimit"], &[]),
            ["/bin/ratelimit", "serve", "--debug-addr", "0.0.0.0:6070"]
        );
        assert_eq!(
            parsed(&["ratelimit", "--shadow-mode"], &[("DEBUG_HOST", "::1")]),
            [
                "ratelimit",
                "serve",
                "--debug-addr",
                "[::1]:6070",
                "--shadow-mode"
            ]
        );
        // DEBUG_PORT set: the settings read DEBUG_HOST and DEBUG_PORT themselves.
        assert_eq!(
            parsed(&["ratelimit"], &[("DEBUG_PORT", "7000")]),
            ["ratelimit", "serve"]
        );
        let cli = Cli::try_parse_from(parsed(&["/bin/ratelimit"], &[])).unwrap();
        assert!(matches!(cli.command, Command::Serve(f) if f.debug_addr.is_some()));
    }

    #[test]
    fn a_debug_addr_given_by_hand_is_not_doubled() {
        for argv in [
            &["ratelimit", "--debug-addr", "127.0.0.1:7000"][..],
            &["ratelimit", "--debug-addr=127.0.0.1:7000"][..],
        ] {
            let line = parsed(argv, &[]);
            assert_eq!(line[..2], ["ratelimit", "serve"]);
            assert_eq!(
                line.iter()
                    .filter(|a| a.starts_with("--debug-addr"))
                    .count(),
                1
            );
            let cli = Cli::try_parse_from(&line).unwrap();
            let Command::Serve(flags) = cli.command else {
                panic!("{line:?} is not serve");
            };
            assert_eq!(flags.debug_addr.unwrap().to_string(), "127.0.0.1:7000");
        }
    }

    #[test]
    fn ratelimit_help_is_the_help_of_serve() {
        // `ratelimit` serves, so its help lists serve's flags and variables.
        let error = Cli::try_parse_from(parsed(&["ratelimit", "-h"], &[])).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = error.to_string();
        assert!(text.contains("serve"), "{text}");
        assert!(text.contains("--debug-addr"), "{text}");
    }

    #[test]
    fn subcommands_and_other_names_are_left_alone() {
        assert_eq!(
            parsed(&["ratelimit", "validate", "x"], &[]),
            ["ratelimit", "validate", "x"]
        );
        assert_eq!(parsed(&["ratelimit", "help"], &[]), ["ratelimit", "help"]);
        assert_eq!(parsed(&["ratelimit", "-V"], &[]), ["ratelimit", "-V"]);
        assert_eq!(parsed(&["/usr/bin/tollgate"], &[]), ["/usr/bin/tollgate"]);
        assert_eq!(parsed(&["tollgate", "serve"], &[]), ["tollgate", "serve"]);
        assert!(parsed(&[], &[]).is_empty());
    }
}
