//! The Redis part of `serve`'s settings: `--redis-url` / `--redis-cluster` /
//! `--redis-sentinel`, else envoyproxy/ratelimit's `REDIS_*` variables (with
//! `REDIS_TYPE=sentinel`, `REDIS_SENTINEL_AUTH` and the `REDIS_TLS_*` files) and
//! `CACHE_KEY_PREFIX`.

use crate::store::redis::scripts::StateLayout;
use std::time::Duration;

use super::env::env_bool;
use super::{DEFAULT_REDIS_TIMEOUT_MS, REDIS_CONNECT_TIMEOUT, RedisFlags, ServeFlags};
use crate::error::Error;
use crate::store::Backend;
use crate::store::redis::connect::{RedisOptions, RedisTarget, RedisTls};

/// Redis when one is named (with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`, or
/// `--health-check-redis`, saying whether health follows it), else the memory store
/// within `memory_store_bytes`.
pub(super) fn backend(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
    memory_store_bytes: u64,
) -> Result<Backend, Error> {
    // Read whatever the backend: a bad value is a mistake in the deployment either
    // way, and it always stopped the process (exit 2), on the memory store too.
    let health_check = match flags.health_check_redis {
        Some(check) => check,
        None => env_bool(var, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", true)?,
    };
    let Some(options) = redis_options(&flags.redis, var)? else {
        return Ok(Backend::Memory {
            max_bytes: memory_store_bytes,
        });
    };
    Ok(Backend::Redis {
        options: Box::new(options),
        health_check,
    })
}

/// `--redis-url` / `--redis-cluster` / `--redis-sentinel`, else envoyproxy/ratelimit's
/// `REDIS_TYPE`, `REDIS_URL`, `REDIS_SOCKET_TYPE`, `REDIS_AUTH`, `REDIS_TLS`; no URL
/// at all means no Redis.
pub(super) fn redis_options(
    flags: &RedisFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<RedisOptions>, Error> {
    let tls = env_bool(var, "REDIS_TLS", false)?;
    let sentinel_auth = var("REDIS_SENTINEL_AUTH");
    let Some(target) = target(flags, var, tls, sentinel_auth.clone())? else {
        return Ok(None);
    };
    let timeout_ms = flags.redis_timeout_ms.unwrap_or(DEFAULT_REDIS_TIMEOUT_MS);
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
    if sentinel_auth.is_some() && !matches!(target, RedisTarget::Sentinel { .. }) {
        return Err(Error::Settings(
            "REDIS_SENTINEL_AUTH is set but Redis is not reached through Sentinel \
             (REDIS_TYPE=sentinel or --redis-sentinel)"
                .into(),
        ));
    }
    let redis_tls = RedisTls {
        ca_cert: var("REDIS_TLS_CACERT").map(Into::into),
        client_cert: var("REDIS_TLS_CLIENT_CERT").map(Into::into),
        client_key: var("REDIS_TLS_CLIENT_KEY").map(Into::into),
    };
    if redis_tls != RedisTls::default() && !uses_tls(&target) {
        return Err(Error::Settings(
            "REDIS_TLS_CACERT / REDIS_TLS_CLIENT_CERT / REDIS_TLS_CLIENT_KEY need TLS: \
             set REDIS_TLS=true or use rediss:// URLs"
                .into(),
        ));
    }
    let state_layout = match flags.state_layout.as_deref() {
        None => StateLayout::Compact,
        Some(text) => StateLayout::parse(text).ok_or_else(|| {
            Error::Settings(format!(
                "--state-layout: '{text}' is not a layout (expected compact, or 0.1 while replicas of tollgate 0.1 share the Redis)"
            ))
        })?,
    };
    Ok(Some(RedisOptions {
        target,
        tls: redis_tls,
        auth: var("REDIS_AUTH"),
        key_prefix,
        timeout: Duration::from_millis(timeout_ms),
        connect_timeout: REDIS_CONNECT_TIMEOUT,
        state_layout,
    }))
}

/// Which Redis: one flag (they exclude each other), else `REDIS_TYPE` and `REDIS_URL`.
fn target(
    flags: &RedisFlags,
    var: &dyn Fn(&str) -> Option<String>,
    tls: bool,
    sentinel_auth: Option<String>,
) -> Result<Option<RedisTarget>, Error> {
    let given = [
        flags.redis_url.is_some(),
        flags.redis_cluster.is_some(),
        flags.redis_sentinel.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(Error::Settings(
            "--redis-url, --redis-cluster and --redis-sentinel exclude each other".into(),
        ));
    }
    let target = match (
        &flags.redis_url,
        &flags.redis_cluster,
        &flags.redis_sentinel,
    ) {
        (Some(url), _, _) => RedisTarget::Standalone(to_url(url, tls, false)),
        (_, Some(nodes), _) => RedisTarget::Cluster(split_nodes(nodes, tls)?),
        (_, _, Some(list)) => sentinel(list, tls, sentinel_auth)?,
        (None, None, None) => {
            let Some(url) = var("REDIS_URL") else {
                return Ok(None);
            };
            let unix = var("REDIS_SOCKET_TYPE").is_some_and(|t| t.eq_ignore_ascii_case("unix"));
            match var("REDIS_TYPE")
                .unwrap_or_else(|| "single".into())
                .to_ascii_lowercase()
                .as_str()
            {
                "single" => RedisTarget::Standalone(to_url(&url, tls, unix)),
                "cluster" => RedisTarget::Cluster(split_nodes(&url, tls)?),
                "sentinel" => sentinel(&url, tls, sentinel_auth)?,
                other => {
                    return Err(Error::Settings(format!(
                        "REDIS_TYPE: '{other}' is not supported (expected single, cluster or sentinel)"
                    )));
                }
            }
        }
    };
    Ok(Some(target))
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

/// envoyproxy/ratelimit's Sentinel form: `name,host:port,host:port` (the group's name,
/// then the sentinels).
fn sentinel(list: &str, tls: bool, sentinel_auth: Option<String>) -> Result<RedisTarget, Error> {
    let mut parts = list.split(',').map(str::trim).filter(|p| !p.is_empty());
    let master = parts.next().unwrap_or_default().to_owned();
    let sentinels: Vec<String> = parts.map(|n| to_url(n, tls, false)).collect();
    if master.contains(':') || sentinels.is_empty() {
        return Err(Error::Settings(format!(
            "Redis Sentinel: '{list}' is not 'name,host:port[,host:port...]' \
             (the master group's name, then at least one sentinel)"
        )));
    }
    Ok(RedisTarget::Sentinel {
        master,
        sentinels,
        sentinel_auth,
    })
}

fn uses_tls(target: &RedisTarget) -> bool {
    let tls = |url: &String| url.starts_with("rediss://");
    match target {
        RedisTarget::Standalone(url) => tls(url),
        RedisTarget::Cluster(urls) => urls.iter().any(tls),
        RedisTarget::Sentinel { sentinels, .. } => sentinels.iter().any(tls),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: &RedisFlags, pairs: &[(&str, &str)]) -> Result<Option<RedisOptions>, Error> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        redis_options(flags, &|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn sentinel_in_envoyproxy_ratelimit_form() {
        let o = options(
            &RedisFlags::default(),
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,10.0.0.1:26379, 10.0.0.2:26379"),
                ("REDIS_SENTINEL_AUTH", "s3cret"),
                ("REDIS_AUTH", "app:pw"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            o.target,
            RedisTarget::Sentinel {
                master: "mymaster".into(),
                sentinels: vec![
                    "redis://10.0.0.1:26379".into(),
                    "redis://10.0.0.2:26379".into()
                ],
                sentinel_auth: Some("s3cret".into()),
            }
        );
        let shown = format!("{o:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw"),
            "{shown}"
        );
        let flag = RedisFlags {
            redis_sentinel: Some("g,127.0.0.1:1".into()),
            ..RedisFlags::default()
        };
        assert!(matches!(
            options(&flag, &[]).unwrap().unwrap().target,
            RedisTarget::Sentinel { .. }
        ));
    }

    #[test]
    fn sentinel_mistakes_are_named() {
        for bad in ["10.0.0.1:26379,10.0.0.2:26379", "mymaster", ""] {
            let e = options(
                &RedisFlags::default(),
                &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", bad)],
            );
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let stray = options(
            &RedisFlags::default(),
            &[("REDIS_URL", "h:1"), ("REDIS_SENTINEL_AUTH", "x")],
        );
        assert!(stray.unwrap_err().to_string().contains("Sentinel"));
    }

    #[test]
    fn tls_files_need_tls() {
        let plain = options(
            &RedisFlags::default(),
            &[("REDIS_URL", "h:1"), ("REDIS_TLS_CACERT", "/ca.pem")],
        );
        assert!(plain.unwrap_err().to_string().contains("REDIS_TLS=true"));
        let o = options(
            &RedisFlags::default(),
            &[
                ("REDIS_URL", "h:1"),
                ("REDIS_TLS", "true"),
                ("REDIS_TLS_CACERT", "/ca.pem"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.target, RedisTarget::Standalone("rediss://h:1".into()));
        assert_eq!(o.tls.ca_cert, Some("/ca.pem".into()));
    }
}
