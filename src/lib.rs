//! tollgate: a global rate-limit service for Envoy's `RateLimitService` v3.
//!
//! The pieces, in the order a request meets them: [`service`] (gRPC translation),
//! [`config`] (compiled rules behind an atomic snapshot), [`matcher`] (descriptor ->
//! rule), [`limiter`] (rules -> counter operations -> statuses), [`store`] (where the
//! counters live, decided atomically per request) and [`algorithm`] (the pure models).
//! [`server`] wires them to sockets; `main.rs` only parses the command line.

pub mod algorithm;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod http;
pub mod limiter;
pub mod matcher;
pub mod proto;
pub mod server;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;

pub use error::Error;
