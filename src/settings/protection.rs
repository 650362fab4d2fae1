//! Settings of what answers carry and how the store is protected: response headers
//! (envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED` and header names, or our
//! IETF style), Retry-After jitter, the replica count for `failure_mode: local`, the
//! local over-limit cache's size (`LOCAL_CACHE_SIZE_IN_BYTES`), the memory store's
//! budget (`MEMORY_STORE_BYTES`) and the breaker.

use std::time::Duration;

use super::{ServeFlags, parse_bool};
use crate::error::Error;
use crate::limiter::answer::HeaderStyle;
use crate::store::breaker::BreakerOptions;
use crate::store::memory::DEFAULT_MAX_BYTES;

/// On by default: a flood of 429s must not become a flood of Redis calls.
pub const DEFAULT_LOCAL_CACHE_BYTES: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protection {
    pub headers: HeaderStyle,
    pub retry_after_jitter: Duration,
    pub replicas: u32,
    /// 0 turns the local over-limit cache off.
    pub local_cache_bytes: u64,
    /// The memory store's budget (also the `failure_mode: local` counts'), at least 1.
    pub memory_store_bytes: u64,
    pub breaker: BreakerOptions,
}

pub fn resolve(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Protection, Error> {
    let number = |name: &str| -> Result<Option<u64>, Error> {
        var(name)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| Error::Settings(format!("{name}: '{v}' is not a whole number")))
            })
            .transpose()
    };
    let headers = match flags.response_headers.as_deref() {
        Some("none") => HeaderStyle::None,
        Some("ietf") => HeaderStyle::Ietf,
        Some("ratelimit") => names(var),
        Some(other) => {
            return Err(Error::Settings(format!(
                "--response-headers: '{other}' (expected none, ratelimit or ietf)"
            )));
        }
        None => match var("LIMIT_RESPONSE_HEADERS_ENABLED") {
            Some(v) => match parse_bool(&v) {
                Some(true) => names(var),
                Some(false) => HeaderStyle::None,
                None => {
                    return Err(Error::Settings(format!(
                        "LIMIT_RESPONSE_HEADERS_ENABLED: '{v}' is not a boolean"
                    )));
                }
            },
            None => HeaderStyle::None,
        },
    };
    let replicas = match flags.replicas {
        Some(n) => n,
        None => number("TOLLGATE_REPLICAS")?.map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX)),
    };
    if replicas == 0 {
        return Err(Error::Settings("--replicas must be at least 1".into()));
    }
    let local_cache_bytes = match flags.local_cache_bytes {
        Some(n) => n,
        None => number("LOCAL_CACHE_SIZE_IN_BYTES")?.unwrap_or(DEFAULT_LOCAL_CACHE_BYTES),
    };
    let memory_store_bytes = match flags.memory_store_bytes {
        Some(n) => n,
        None => number("MEMORY_STORE_BYTES")?.unwrap_or(DEFAULT_MAX_BYTES),
    };
    if memory_store_bytes == 0 {
        return Err(Error::Settings(
            "--memory-store-bytes must be at least 1 (the memory store cannot be turned off)"
                .into(),
        ));
    }
    let defaults = BreakerOptions::default();
    let breaker = BreakerOptions {
        failures_to_open: flags
            .breaker_failures
            .unwrap_or(defaults.failures_to_open)
            .max(1),
        open_for: flags
            .breaker_open_ms
            .map_or(defaults.open_for, Duration::from_millis),
    };
    Ok(Protection {
        headers,
        retry_after_jitter: Duration::from_millis(flags.retry_after_jitter_ms.unwrap_or(0)),
        replicas,
        local_cache_bytes,
        memory_store_bytes,
        breaker,
    })
}

/// envoyproxy/ratelimit's header names, each overridable by its variable.
fn names(var: &dyn Fn(&str) -> Option<String>) -> HeaderStyle {
    let HeaderStyle::RateLimit {
        limit,
        remaining,
        reset,
    } = HeaderStyle::envoy_ratelimit_defaults()
    else {
        unreachable!("the defaults are the RateLimit style")
    };
    HeaderStyle::RateLimit {
        limit: var("LIMIT_LIMIT_HEADER").unwrap_or(limit),
        remaining: var("LIMIT_REMAINING_HEADER").unwrap_or(remaining),
        reset: var("LIMIT_RESET_HEADER").unwrap_or(reset),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(flags: ServeFlags, vars: &[(&str, &str)]) -> Result<Protection, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(&flags, &|name| map.get(name).cloned())
    }

    #[test]
    fn envoyproxy_ratelimit_header_settings() {
        let p = resolve_with(ServeFlags::default(), &[]).unwrap();
        assert_eq!(p.headers, HeaderStyle::None);
        assert_eq!(p.local_cache_bytes, DEFAULT_LOCAL_CACHE_BYTES);
        assert_eq!(p.memory_store_bytes, DEFAULT_MAX_BYTES);
        let p = resolve_with(
            ServeFlags::default(),
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_REMAINING_HEADER", "X-Left"),
                ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
            ],
        )
        .unwrap();
        assert_eq!(
            p.headers,
            HeaderStyle::RateLimit {
                limit: "RateLimit-Limit".into(),
                remaining: "X-Left".into(),
                reset: "RateLimit-Reset".into()
            }
        );
        assert_eq!(p.local_cache_bytes, 0, "0 turns the cache off");
    }

    #[test]
    fn flags_win_and_bad_values_are_named() {
        let flags = ServeFlags {
            response_headers: Some("ietf".into()),
            replicas: Some(3),
            ..Default::default()
        };
        let p = resolve_with(
            flags,
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("TOLLGATE_REPLICAS", "9"),
            ],
        )
        .unwrap();
        assert_eq!((p.headers, p.replicas), (HeaderStyle::Ietf, 3));
        let bad = ServeFlags {
            response_headers: Some("fancy".into()),
            ..Default::default()
        };
        assert!(
            resolve_with(bad, &[])
                .unwrap_err()
                .to_string()
                .contains("fancy")
        );
        let err = resolve_with(
            ServeFlags::default(),
            &[("LOCAL_CACHE_SIZE_IN_BYTES", "lots")],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("LOCAL_CACHE_SIZE_IN_BYTES"),
            "{err}"
        );
    }

    #[test]
    fn memory_store_bytes_from_flag_then_env_and_zero_is_refused() {
        let p = resolve_with(ServeFlags::default(), &[("MEMORY_STORE_BYTES", "1048576")]).unwrap();
        assert_eq!(p.memory_store_bytes, 1_048_576);
        let flags = ServeFlags {
            memory_store_bytes: Some(4096),
            ..Default::default()
        };
        let p = resolve_with(flags, &[("MEMORY_STORE_BYTES", "1048576")]).unwrap();
        assert_eq!(p.memory_store_bytes, 4096, "the flag wins");
        let err = resolve_with(ServeFlags::default(), &[("MEMORY_STORE_BYTES", "0")]).unwrap_err();
        assert!(err.to_string().contains("memory-store-bytes"), "{err}");
        let err =
            resolve_with(ServeFlags::default(), &[("MEMORY_STORE_BYTES", "big")]).unwrap_err();
        assert!(err.to_string().contains("MEMORY_STORE_BYTES"), "{err}");
    }
}
