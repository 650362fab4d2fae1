//! tollgate: a global rate-limit service for Envoy's `RateLimitService` v3.
//!
//! The pieces, in the order a request meets them: [`server`] (the process edges: the
//! gRPC service, the HTTP admin port, health, hot reload), [`limiter`] (one decision:
//! plan, store or fallback, answer, hold), [`config`] (compiled rules behind an atomic
//! snapshot, and the matcher that finds a descriptor's rule), [`store`] (where the
//! counters live, decided atomically per request) and [`algorithm`] (the pure models).
//! [`metrics`] (Prometheus) and [`telemetry`] (logs, OTLP traces) are what operators
//! see; [`settings`] resolves flags and environment; [`cli`] is the command line,
//! [`xds`] reads limits from a control plane instead of files (`CONFIG_TYPE=GRPC_XDS_SOTW`);
//! [`bench`] the load generator behind `tollgate bench`, [`simulate`] the offline
//! replay behind `tollgate simulate`; [`background`] the tasks a server owns; `main.rs`
//! only parses the command line.
//! docs/architecture.md draws the request's path through them.

pub mod algorithm;
pub mod background;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod global;
pub mod hash;
pub mod limiter;
pub mod metrics;
pub mod proto;
pub mod rlqs;
pub mod server;
pub mod settings;
pub mod simulate;
pub mod store;
pub mod telemetry;
pub mod xds;

pub use error::Error;
