//! Limits over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): an ADS state-of-the-world client
//! that subscribes to envoyproxy/ratelimit's `RateLimitConfig` resources and swaps
//! every accepted response into the limiter, as a file reload does.
//!
//! [`translate`] turns a response's resources into a [`crate::config::Config`] through
//! the file loader (with [`extensions`] for tollgate's own fields); [`client`] runs
//! the stream (ACK, NACK with the error, reconnect with [`backoff`]); [`connect`]
//! dials the control plane (TLS, mTLS, extra headers).

pub mod extensions;
pub mod translate;

pub use translate::{RATE_LIMIT_CONFIG_TYPE, compile};
