//! The Redis part of `serve`'s settings: `--redis-url` / `--redis-cluster`, else
//! envoyproxy/ratelimit's `REDIS_*` variables and `CACHE_KEY_PREFIX`.

use std::time::Duration;

use super::{DEFAULT_REDIS_TIMEOUT_MS, REDIS_CONNECT_TIMEOUT, ServeFlags, parse_bool};
use crate::error::Error;
use crate::store::redis::connect::{RedisOptions, RedisTarget};

/// `--redis-url` / `--redis-cluster`, else envoyproxy/ratelimit's `REDIS_TYPE`,
/// `REDIS_URL`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS`; no URL at all means
/// no Redis.
pub(super) fn redis_options(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<RedisOptions>, Error> {
    let tls = match var("REDIS_TLS") {
        Some(v) => parse_bool(&v)
            .ok_or_else(|| Error::Settings(format!("REDIS_TLS: '{v}' is not a boolean")))?,
        None => false,
    };
    let unix = var("REDIS_SOCKET_TYPE").is_some_and(|t| t.eq_ignore_ascii_case("unix"));
    let target = match (&flags.redis_url, &flags.redis_cluster) {
        (Some(_), Some(_)) => {
            return Err(Error::Settings(
                "--redis-url and --redis-cluster exclude each other".into(),
            ));
        }
        (Some(url), None) => RedisTarget::Standalone(to_url(url, tls, false)),
        (None, Some(nodes)) => RedisTarget::Cluster(split_nodes(nodes, tls)?),
        (None, None) => {
            let Some(url) = var("REDIS_URL") else {
                return Ok(None);
            };
            match var("REDIS_TYPE")
                .unwrap_or_else(|| "single".into())
                .to_ascii_lowercase()
                .as_str()
            {
                "single" => RedisTarget::Standalone(to_url(&url, tls, unix)),
                "cluster" => RedisTarget::Cluster(split_nodes(&url, tls)?),
                other => {
                    return Err(Error::Settings(format!(
                        "REDIS_TYPE: '{other}' is not supported (expected single or cluster)"
                    )));
                }
            }
        }
    };
    let timeout_ms = match flags.redis_timeout_ms {
        Some(ms) => ms,
        None => DEFAULT_REDIS_TIMEOUT_MS,
    };
    if timeout_ms == 0 {
        return Err(Error::Settings(
            "--redis-timeout-ms must be at least 1".into(),
        ));
    }
    let key_prefix = flags
        .key_prefix
        .clone()
        .or_else(|| var("CACHE_KEY_PREFIX"))
        .unwrap_or_default();
    crate::store::redis::keys::check_prefix(&key_prefix).map_err(Error::Settings)?;
    Ok(Some(RedisOptions {
        target,
        auth: var("REDIS_AUTH"),
        key_prefix,
        timeout: Duration::from_millis(timeout_ms),
        connect_timeout: REDIS_CONNECT_TIMEOUT,
    }))
}

/// envoyproxy/ratelimit takes `host:port` (or a socket path); we also take URLs.
fn to_url(address: &str, tls: bool, unix: bool) -> String {
    let address = address.trim();
    if address.contains("://") {
        match address.strip_prefix("redis://") {
            Some(rest) if tls => format!("rediss://{rest}"),
            _ => address.to_owned(),
        }
    } else if unix || address.starts_with('/') {
        format!("redis+unix://{address}")
    } else if tls {
        format!("rediss://{address}")
    } else {
        format!("redis://{address}")
    }
}

fn split_nodes(list: &str, tls: bool) -> Result<Vec<String>, Error> {
    let nodes: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| to_url(n, tls, false))
        .collect();
    if nodes.is_empty() {
        return Err(Error::Settings(
            "Redis Cluster needs at least one seed node".into(),
        ));
    }
    Ok(nodes)
}
