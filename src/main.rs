//! The `tollgate` binary (also `ratelimit`, see `cli::args`): parse the command line and
//! hand over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let args = tollgate::cli::args(std::env::args_os(), &env);
    let cli = tollgate::cli::Cli::parse_from(args);
    match tollgate::cli::runtime::build(&cli) {
        Ok(runtime) => runtime.block_on(tollgate::cli::run(cli)),
        Err(error) => {
            tollgate::cli::console::eprintln(&format!(
                "tollgate: cannot start the runtime: {error}"
            ));
            std::process::ExitCode::FAILURE
        }
    }
}

/// mimalloc instead of glibc's malloc: fewer CPU microseconds per request under load,
/// most with many descriptors (BENCHMARKS.md, "Allocation and the allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
