//! The `tollgate` binary (also `ratelimit`, see `cli::args`): parse the command line and
//! hand over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let args = tollgate::cli::args(std::env::args_os(), &env);
    tollgate::cli::run(tollgate::cli::Cli::parse_from(args)).await
}

/// mimalloc instead of glibc's malloc: fewer CPU microseconds per request under load
/// (side by side in BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
