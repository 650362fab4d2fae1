//! End to end with the programs of the Python venv that `scripts/bootstrap` builds:
//! Envoy (`TOLLGATE_ENVOY`; `e2e_envoy`, `e2e_answers`, on the stack of [`stack`]) and
//! the independent grpcio client (`TOLLGATE_PYTHON`; `interop_python`), and our Python
//! xDS control plane (`xds_plane`), serving limits to `tollgate serve` (`xds_sotw`) and
//! through it to Envoy (`e2e_xds`) and to tollgate run as Envoy Gateway runs it
//! (`envoy_gateway`). Its own binary
//! so that the main one (`tests/it`) needs nothing but Rust and redis-server, and so
//! that the Envoy stacks (Envoy, two `tollgate serve` replicas and the echo upstream
//! each) with their minute-aligned waits do not hold the main binary's test threads.

// The main binary's support code, of which this binary uses only a part (the
// child-process server, the shared cluster, the deployment's Envoy config, the
// in-process server): the rest would warn here as dead code and unused re-exports.
#[allow(dead_code, unused_imports)]
#[path = "../it/common/mod.rs"]
mod common;
mod stack;

mod budgets;
mod budgets_enforced;
mod budgets_wire;

mod e2e_answers;
mod e2e_envoy;
mod e2e_xds;
mod envoy_gateway;
mod interop_python;
mod rlqs;
mod rlqs_deploy;
mod rlqs_load;
mod rlqs_measure;
mod xds_plane;
mod xds_sotw;
