//! Redis faults under load: a cluster master killed and slots resharded
//! (`cluster_faults`), a Sentinel master killed (`sentinel`). Its own binary: these
//! tests SIGKILL servers and move slots while load runs, and time the failover for the
//! README's figures; they must not share the 2 CPUs and the test threads with the
//! main binary's suites. The servers they break are their own (`common::redis::custom`).

// Only the private servers, `redis-cli` helpers and the in-process server of `common`
// are used here.
#[allow(dead_code, unused_imports)]
#[path = "../it/common/mod.rs"]
mod common;
mod fault_load;

mod cluster_faults;
mod sentinel;
