//! What tollgate needs to reach Redis: the target (standalone, cluster or Sentinel),
//! credentials, key prefix, timeouts and TLS files, and how they appear in logs (never
//! with a password).

use std::path::PathBuf;
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};

/// Where the counters live.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://[user:pass@]host:port/db`, or `rediss://` for TLS.
    Standalone(String),
    /// Seed nodes of a cluster, each a URL as above.
    Cluster(Vec<String>),
    /// The master of a Sentinel group (envoyproxy/ratelimit's
    /// `REDIS_TYPE=sentinel`, `REDIS_URL=name,host:port,host:port`).
    Sentinel {
        /// The group's name, as in `sentinel monitor <name> ...`.
        master: String,
        /// The sentinels, each a URL (`redis://host:port`).
        sentinels: Vec<String>,
        /// `REDIS_SENTINEL_AUTH`: `password` or `user:password` for the sentinels.
        sentinel_auth: Option<String>,
    },
}

impl std::fmt::Debug for RedisTarget {
    /// Credentials never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact_target(self))
    }
}

/// Files for Redis over TLS (`REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`,
/// `REDIS_TLS_CLIENT_KEY`): used by `rediss://` connections only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM CA certificates to trust instead of the built-in web roots.
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate and key, for servers that ask for one.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl RedisTls {
    fn is_empty(&self) -> bool {
        self.ca_cert.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }

    /// The files' contents, read now; errors name the file.
    pub(super) fn certificates(&self) -> Result<Option<TlsCertificates>, String> {
        if self.is_empty() {
            return Ok(None);
        }
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| format!("Redis TLS {what} {}: {e}", path.display()))
        };
        let root_cert = match &self.ca_cert {
            Some(path) => Some(read(path, "CA certificate")?),
            None => None,
        };
        let client_tls = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert, "client certificate")?,
                client_key: read(key, "client key")?,
            }),
            (None, None) => None,
            _ => {
                return Err(
                    "Redis TLS: a client certificate needs its key and the other way round \
                     (REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY)"
                        .into(),
                );
            }
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// Everything needed to reach Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub target: RedisTarget,
    /// `REDIS_AUTH`: `password` or `user:password`; overrides credentials in URLs.
    pub auth: Option<String>,
    /// Prepended to every key (`CACHE_KEY_PREFIX`).
    pub key_prefix: String,
    /// Budget for one request's Redis work; beyond it the domain's `failure_mode` answers.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// CA and client certificate for `rediss://`; empty: the built-in roots.
    pub tls: RedisTls,
    /// The layouts counters are written in (`--state-layout`): 0.1's during a rolling
    /// upgrade from it.
    pub state_layout: crate::store::redis::scripts::StateLayout,
}

impl std::fmt::Debug for RedisOptions {
    /// Credentials never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &redact_target(&self.target))
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .field("state_layout", &self.state_layout)
            .finish()
    }
}

/// A URL with any password replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}<credentials>{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

pub(super) fn redact_target(target: &RedisTarget) -> String {
    let list = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
    match target {
        RedisTarget::Standalone(url) => redact(url),
        RedisTarget::Cluster(urls) => list(urls),
        RedisTarget::Sentinel {
            master, sentinels, ..
        } => format!("sentinel group '{master}' via {}", list(sentinels)),
    }
}
