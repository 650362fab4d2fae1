//! The `tollgate` binary (also `ratelimit`, see `cli::args`): parse the command line and
//! hand over to the library.

use clap::Parser;

/// Stack of the runtime's threads. Config sets compile on blocking threads, and a
/// descriptor tree nested to the YAML parser's limit (64 levels of lists and mappings)
/// took more than the default 2 MiB in a debug build: a hostile xDS resource aborted
/// the process. Reserved address space; only what is used is resident.
const THREAD_STACK: usize = 16 << 20;

fn main() -> std::process::ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let args = tollgate::cli::args(std::env::args_os(), &env);
    let cli = tollgate::cli::Cli::parse_from(args);
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK)
        .build()
    {
        Ok(runtime) => runtime.block_on(tollgate::cli::run(cli)),
        Err(error) => {
            tollgate::cli::console::eprintln(&format!(
                "tollgate: cannot start the runtime: {error}"
            ));
            std::process::ExitCode::FAILURE
        }
    }
}

/// mimalloc instead of glibc's malloc: fewer CPU microseconds per request under load
/// (side by side in BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
