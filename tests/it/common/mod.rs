//! Shared integration-test support: an in-process tollgate server on port 0
//! ([`server`]), `tollgate serve` as a child process ([`process`]), a TCP proxy
//! that delays or partitions a link ([`delay_proxy`]), real
//! `redis-server` processes, standalone and cluster ([`redis`]), stores on them
//! ([`stores`]), bursts of requests queued behind a held Redis ([`burst`]), load for
//! the fault tests ([`fault_load`]), the deployment's Envoy
//! config ([`envoy`]), test certificates ([`tls_certs`]), reading /metrics
//! ([`prometheus`]), an RLQS client ([`rlqs`]) and free ports for the processes they
//! start ([`ports`]).
//!
//! The `it` binary uses all of it; the other test binaries include it with `#[path]`
//! and use only part of it (they say so where they include it).

pub mod burst;
pub mod delay_proxy;
pub mod envoy;
pub mod fault_load;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod redis;
pub mod rlqs;
pub mod server;
pub mod stores;
pub mod tls_certs;
