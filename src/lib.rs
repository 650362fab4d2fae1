//! tollgate: a global rate-limit service for Envoy's `RateLimitService` v3.
//!
//! The pieces, in the order a request meets them: [`service`] (gRPC translation),
//! [`config`] (compiled rules behind an atomic snapshot), [`matcher`] (descriptor ->
//! rule), [`limiter`] (rules -> counter operations -> statuses), [`store`] (where the
//! counters live, decided atomically per request) and [`algorithm`] (the pure models).
//! [`server`] wires them to sockets, with [`health`] (readiness), [`reload`] (hot
//! reload) and [`admin`] (the config views); [`metrics`] (Prometheus) and [`telemetry`]
//! (logs, OTLP traces) are what operators see; [`bench`] is the load generator behind
//! `tollgate bench`; `main.rs` only parses the command line.

pub mod admin;
pub mod algorithm;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod health;
pub mod http;
pub mod limiter;
pub mod matcher;
pub mod metrics;
pub mod proto;
pub mod reload;
pub mod server;
pub mod service;
pub mod settings;
pub mod simulate;
pub mod store;
pub mod telemetry;

pub use error::Error;
