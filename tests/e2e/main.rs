//! End to end with the programs of the Python venv that `scripts/bootstrap` builds:
//! Envoy (`TOLLGATE_ENVOY`; `e2e_envoy`, `e2e_answers`) and the independent grpcio
//! client (`TOLLGATE_PYTHON`; `interop_python`). Its own binary so that the main one
//! (`tests/it`) needs nothing but Rust and redis-server, and so that the Envoy stacks
//! (Envoy, two `tollgate serve` replicas, the echo upstream each) with their
//! minute-aligned waits do not hold the main binary's test threads.

// Only the Envoy stack, the child-process server and the shared cluster of `common`
// are used here.
#[allow(dead_code, unused_imports)]
#[path = "../it/common/mod.rs"]
mod common;

mod e2e_answers;
mod e2e_envoy;
mod interop_python;
