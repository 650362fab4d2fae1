//! Limits over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): an ADS state-of-the-world client
//! that subscribes to envoyproxy/ratelimit's `RateLimitConfig` resources and swaps
//! every accepted response into the limiter, as a file reload does.
//!
//! [`translate`] turns a response's resources into a [`crate::config::Config`] through
//! the file loader (with [`extensions`] for tollgate's own fields); [`client`] runs
//! the stream (ACK, NACK with the errors, reconnect with [`backoff`]); [`connect`]
//! dials the control plane (TLS, mTLS, extra headers); [`source`] is the config
//! source `serve` starts ([`crate::server::reload::Source`]).

pub mod backoff;
pub mod client;
pub mod connect;
pub mod extensions;
pub mod source;
pub mod translate;

pub use client::XdsClient;
pub use source::XdsSource;
pub use translate::{RATE_LIMIT_CONFIG_TYPE, compile};

/// Why the control plane could not be used.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// A setting that cannot be used (start-up only).
    #[error("{0}")]
    Settings(String),
    #[error("xDS TLS: {0}")]
    Tls(String),
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("stream failed: {0}")]
    Stream(String),
    #[error("the server closed the stream")]
    Closed,
}
