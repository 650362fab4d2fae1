//! The tokio runtime a command runs on. `serve`'s has no LIFO slot; every other
//! command (the `bench` load generator among them) keeps tokio's defaults.
//!
//! Why no LIFO slot for `serve`: a batched Redis call answers ~16 requests at once,
//! and each answer wakes its request's HTTP/2 stream task, which hands the response
//! to its connection's task. With the LIFO slot, the connection task woken by the
//! first stream runs next, before the other streams have answered, and writes one
//! response per `writev`; without it, the woken connection task queues behind the
//! streams woken with it and writes their responses together: fewer system calls and
//! less server CPU per request (BENCHMARKS.md, "`serve` without tokio's LIFO slot",
//! has both, with the commands). The setting is
//! `tokio_unstable` API (.cargo/config.toml sets the cfg); a build without the cfg
//! still works, with the slot.

use tokio::runtime::{Builder, Runtime};

use super::{Cli, Command};

/// Stack of the runtime's threads. Config sets compile on blocking threads, and a
/// descriptor tree nested to the YAML parser's limit (64 levels of lists and mappings)
/// takes more than the default 2 MiB in a debug build: a hostile xDS resource would
/// abort the process. Reserved address space; only what is used is resident.
const THREAD_STACK: usize = 16 << 20;

/// The runtime `cli`'s command runs on.
pub fn build(cli: &Cli) -> std::io::Result<Runtime> {
    let mut builder = Builder::new_multi_thread();
    builder.enable_all().thread_stack_size(THREAD_STACK);
    if matches!(cli.command, Command::Serve(_)) {
        without_lifo_slot(&mut builder);
    }
    builder.build()
}

#[cfg(tokio_unstable)]
fn without_lifo_slot(builder: &mut Builder) {
    builder.disable_lifo_slot();
}

#[cfg(not(tokio_unstable))]
fn without_lifo_slot(_: &mut Builder) {}

#[cfg(test)]
mod tests {
    #[test]
    fn the_build_can_take_the_lifo_slot_out() {
        let with_the_cfg = cfg!(tokio_unstable);
        assert!(
            with_the_cfg,
            "built without --cfg tokio_unstable (.cargo/config.toml; a RUSTFLAGS \
             variable replaces it): serve keeps tokio's LIFO slot and spends about a \
             quarter more CPU per request"
        );
    }
}
