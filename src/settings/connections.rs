//! The bounds on the connections of the gRPC and HTTP (admin, debug, metrics) ports:
//! how many at once, how many streams each, and how long a connection may take to
//! speak, sit idle, leave a PING unanswered or hold a call. Flags only (envoyproxy/
//! ratelimit has no such variables; its `GRPC_MAX_CONNECTION_AGE` is ignored, see
//! `compat.rs`). The defaults and why they are what they are: docs/operations.md,
//! "Connections".

use std::time::Duration;

use crate::error::Error;

/// `tollgate serve`'s connection flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectionFlags {
    /// Connections open at once on each port; at the bound the port stops accepting until one closes (the kernel's backlog holds the rest) [default: 10000]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Calls in progress at once on each port, all its connections together (not counting the streams that stay open by design: RLQS, health Watch, reflection); past it a call is refused at once: its HTTP/2 stream reset with REFUSED_STREAM (not processed: safe to retry), 503 on HTTP/1 [default: 2048]
    #[arg(long, value_name = "N")]
    pub max_calls: Option<usize>,
    /// HTTP/2 streams (calls) one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM [default: 100]
    #[arg(long, value_name = "N")]
    pub max_concurrent_streams: Option<u32>,
    /// A connection that has not sent its first request bytes (the HTTP/2 preface; with TLS, the handshake too) this long after it was accepted is closed [default: 10000]
    #[arg(long, value_name = "MS")]
    pub handshake_timeout_ms: Option<u64>,
    /// A connection with no call in progress this long is closed (HTTP/2 GOAWAY; clients reconnect when they next call) [default: 300000]
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Send an HTTP/2 PING on a connection this often [default: 30000]
    #[arg(long, value_name = "MS")]
    pub keepalive_interval_ms: Option<u64>,
    /// Close a connection whose PING is not answered within this [default: 10000]
    #[arg(long, value_name = "MS")]
    pub keepalive_timeout_ms: Option<u64>,
    /// A call not answered within this is answered DEADLINE_EXCEEDED (HTTP 503 on the HTTP port); a connection holding a call's answer unread this long past it (its client stopped reading) is closed. Streams that stay open by design (RLQS, health Watch, reflection) are not bounded [default: 60000]
    #[arg(long, value_name = "MS")]
    pub request_timeout_ms: Option<u64>,
}

/// The resolved bounds, the same for every port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_calls: usize,
    pub max_concurrent_streams: u32,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_calls: 2048,
            max_concurrent_streams: 100,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// The bounds `flags` name, the defaults for the rest; zero is refused (a bound of
/// zero would close or refuse everything).
pub fn resolve(flags: &ConnectionFlags) -> Result<ConnectionLimits, Error> {
    let d = ConnectionLimits::default();
    let ms = |flag: Option<u64>, name: &str, default: Duration| match flag {
        None => Ok(default),
        Some(0) => Err(Error::Settings(format!("--{name}: must be at least 1"))),
        Some(ms) => Ok(Duration::from_millis(ms)),
    };
    let limits = ConnectionLimits {
        max_connections: match flags.max_connections {
            Some(0) => {
                return Err(Error::Settings(
                    "--max-connections: must be at least 1".into(),
                ));
            }
            n => n.unwrap_or(d.max_connections),
        },
        max_calls: match flags.max_calls {
            Some(0) => return Err(Error::Settings("--max-calls: must be at least 1".into())),
            n => n.unwrap_or(d.max_calls),
        },
        max_concurrent_streams: match flags.max_concurrent_streams {
            Some(0) => {
                return Err(Error::Settings(
                    "--max-concurrent-streams: must be at least 1".into(),
                ));
            }
            n => n.unwrap_or(d.max_concurrent_streams),
        },
        handshake_timeout: ms(
            flags.handshake_timeout_ms,
            "handshake-timeout-ms",
            d.handshake_timeout,
        )?,
        idle_timeout: ms(flags.idle_timeout_ms, "idle-timeout-ms", d.idle_timeout)?,
        keepalive_interval: ms(
            flags.keepalive_interval_ms,
            "keepalive-interval-ms",
            d.keepalive_interval,
        )?,
        keepalive_timeout: ms(
            flags.keepalive_timeout_ms,
            "keepalive-timeout-ms",
            d.keepalive_timeout,
        )?,
        request_timeout: ms(
            flags.request_timeout_ms,
            "request-timeout-ms",
            d.request_timeout,
        )?,
    };
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_flags_and_zero_refused() {
        assert_eq!(
            resolve(&ConnectionFlags::default()).unwrap(),
            ConnectionLimits::default()
        );
        let flags = ConnectionFlags {
            max_concurrent_streams: Some(8),
            idle_timeout_ms: Some(1500),
            ..Default::default()
        };
        let limits = resolve(&flags).unwrap();
        assert_eq!(limits.max_concurrent_streams, 8);
        assert_eq!(limits.idle_timeout, Duration::from_millis(1500));
        let zero = ConnectionFlags {
            request_timeout_ms: Some(0),
            ..Default::default()
        };
        let error = resolve(&zero).unwrap_err().to_string();
        assert!(error.contains("--request-timeout-ms"), "{error}");
    }
}
