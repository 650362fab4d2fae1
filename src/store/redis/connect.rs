//! Connecting to Redis: a standalone server through a reconnecting
//! `ConnectionManager`, or a cluster through redis-rs' async cluster client (which
//! follows MOVED/ASK and retries TRYAGAIN). Both multiplex concurrent requests over
//! one connection per node, pipelining them.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, IntoConnectionInfo};

/// Where the counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://[user:pass@]host:port/db`, or `rediss://` for TLS.
    Standalone(String),
    /// Seed nodes of a cluster, each a URL as above.
    Cluster(Vec<String>),
}

/// Everything needed to reach Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub target: RedisTarget,
    /// `REDIS_AUTH`: `password` or `user:password`; overrides credentials in URLs.
    pub auth: Option<String>,
    /// Prepended to every key (`CACHE_KEY_PREFIX`).
    pub key_prefix: String,
    /// Budget for one request's Redis work; beyond it the request gets UNAVAILABLE.
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for RedisOptions {
    /// Credentials never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &redact_target(&self.target))
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
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

fn redact_target(target: &RedisTarget) -> String {
    match target {
        RedisTarget::Standalone(url) => redact(url),
        RedisTarget::Cluster(urls) => urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(","),
    }
}

/// redis-rs' own response timeout, kept well above ours: the store's timeout answers
/// the request, and the client's must not also fire on a slow burst (it may drop the
/// multiplexed connection every other request is waiting on).
fn client_timeout(ours: Duration) -> Duration {
    (ours * 4).max(Duration::from_secs(1))
}

pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

fn with_auth(url: &str, auth: Option<&str>) -> redis::RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let Some(auth) = auth else {
        return Ok(info);
    };
    let settings = info.redis_settings().clone();
    let settings = match auth.split_once(':') {
        Some((user, password)) => settings.set_username(user).set_password(password),
        None => settings.set_password(auth),
    };
    Ok(info.set_redis_settings(settings))
}

/// Opens the connection and proves it works (one PING), so a wrong address or
/// password fails at start-up with a message naming the target, never the password.
pub async fn connect(options: &RedisOptions) -> Result<Connection, String> {
    let target = redact_target(&options.target);
    let fail =
        |e: redis::RedisError| format!("cannot connect to Redis at {target}: {}", describe(&e));
    let connection = match &options.target {
        RedisTarget::Standalone(url) => {
            let client =
                redis::Client::open(with_auth(url, options.auth.as_deref()).map_err(fail)?)
                    .map_err(fail)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(options.connect_timeout))
                .set_response_timeout(Some(client_timeout(options.timeout)))
                .set_number_of_retries(2);
            let manager = tokio::time::timeout(
                options.connect_timeout,
                ConnectionManager::new_with_config(client, config),
            )
            .await
            .map_err(|_| {
                format!(
                    "cannot connect to Redis at {target}: no answer within {:?}",
                    options.connect_timeout
                )
            })?
            .map_err(fail)?;
            Connection::Standalone(manager)
        }
        RedisTarget::Cluster(urls) => {
            let infos = urls
                .iter()
                .map(|u| with_auth(u, options.auth.as_deref()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let client = ClusterClientBuilder::new(infos)
                .connection_timeout(options.connect_timeout)
                .response_timeout(client_timeout(options.timeout))
                .build()
                .map_err(fail)?;
            let conn = tokio::time::timeout(options.connect_timeout, client.get_async_connection())
                .await
                .map_err(|_| {
                    format!(
                        "cannot connect to Redis Cluster at {target}: no answer within {:?}",
                        options.connect_timeout
                    )
                })?
                .map_err(fail)?;
            Connection::Cluster(conn)
        }
    };
    let mut probe = match &connection {
        Connection::Standalone(c) => Probe::Standalone(c.clone()),
        Connection::Cluster(c) => Probe::Cluster(c.clone()),
    };
    tokio::time::timeout(options.connect_timeout, probe.ping())
        .await
        .map_err(|_| {
            format!(
                "Redis at {target} did not answer PING within {:?}",
                options.connect_timeout
            )
        })?
        .map_err(fail)?;
    Ok(connection)
}

enum Probe {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Probe {
    async fn ping(&mut self) -> redis::RedisResult<()> {
        let cmd = redis::cmd("PING");
        match self {
            Probe::Standalone(c) => cmd.query_async(c).await,
            Probe::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// A Redis error in words, without echoing connection details that may hold secrets.
pub fn describe(error: &redis::RedisError) -> String {
    let text = error.to_string();
    if text.contains("WRONGPASS")
        || text
            .to_ascii_lowercase()
            .contains("invalid username-password")
    {
        "authentication failed (check REDIS_AUTH or the credentials in the URL)".to_owned()
    } else if text.contains("NOAUTH") {
        "authentication required (set REDIS_AUTH or put credentials in the URL)".to_owned()
    } else {
        text
    }
}
