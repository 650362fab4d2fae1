//! The `tollgate` binary: parse the command line and hand over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tollgate::cli::run(tollgate::cli::Cli::parse()).await
}
