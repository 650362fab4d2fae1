//! Connecting to Redis: a standalone server through a reconnecting
//! `ConnectionManager`, a cluster through redis-rs' async cluster client (which
//! follows MOVED/ASK and retries TRYAGAIN), or the master of a Sentinel group
//! ([`sentinel`], which follows failovers). All multiplex concurrent requests over
//! one connection per node, pipelining them. `rediss://` URLs use TLS (rustls), with
//! the system's roots or the CA of [`RedisTls`], and a client certificate if given.

pub mod sentinel;

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, ConnectionInfo, IntoConnectionInfo, TlsCertificates};

use self::sentinel::SentinelConnection;

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
    fn certificates(&self) -> Result<Option<TlsCertificates>, String> {
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
    let list = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
    match target {
        RedisTarget::Standalone(url) => redact(url),
        RedisTarget::Cluster(urls) => list(urls),
        RedisTarget::Sentinel {
            master, sentinels, ..
        } => format!("sentinel group '{master}' via {}", list(sentinels)),
    }
}

/// redis-rs' own response timeout, kept well above ours: the store's timeout answers
/// the request, and the client's must not also fire on a slow burst (it may drop the
/// multiplexed connection every other request is waiting on).
fn client_timeout(ours: Duration) -> Duration {
    (ours * 4).max(Duration::from_secs(1))
}

/// A standalone server's connection: direct, or to whichever server Sentinel names.
#[derive(Clone)]
pub enum Standalone {
    Direct(ConnectionManager),
    Sentinel(SentinelConnection),
}

impl redis::aio::ConnectionLike for Standalone {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Standalone::Direct(c) => c.req_packed_command(cmd),
            Standalone::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Standalone::Direct(c) => c.req_packed_commands(pipeline, offset, count),
            Standalone::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Standalone::Direct(c) => c.get_db(),
            Standalone::Sentinel(c) => c.get_db(),
        }
    }
}

pub enum Connection {
    /// One server (directly or through Sentinel): no slots to respect.
    Standalone(Standalone),
    Cluster(ClusterConnection),
}

/// `password` or `user:password`.
fn split_auth(auth: &str) -> (Option<&str>, &str) {
    match auth.split_once(':') {
        Some((user, password)) => (Some(user), password),
        None => (None, auth),
    }
}

fn with_auth(url: &str, auth: Option<&str>) -> redis::RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let Some(auth) = auth else {
        return Ok(info);
    };
    let settings = info.redis_settings().clone();
    let settings = match split_auth(auth) {
        (Some(user), password) => settings.set_username(user).set_password(password),
        (None, password) => settings.set_password(password),
    };
    Ok(info.set_redis_settings(settings))
}

/// A Sentinel client for `master`: `REDIS_AUTH` (and TLS, for `rediss://` sentinels or
/// `REDIS_TLS`) towards the master, `REDIS_SENTINEL_AUTH` towards the sentinels.
fn sentinel_client(
    master: &str,
    sentinels: &[String],
    sentinel_auth: Option<&str>,
    options: &RedisOptions,
    certificates: Option<TlsCertificates>,
) -> redis::RedisResult<redis::sentinel::SentinelClient> {
    let infos = sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<Result<Vec<_>, _>>()?;
    let tls = infos.iter().find_map(|info| match info.addr() {
        redis::ConnectionAddr::TcpTls { insecure, .. } => Some(if *insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        }),
        _ => None,
    });
    let db = infos
        .first()
        .map(|info| info.redis_settings().db())
        .unwrap_or(0);
    let addrs = infos.iter().map(|info| info.addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
        .set_client_to_redis_db(db);
    if let Some(auth) = options.auth.as_deref() {
        let (user, password) = split_auth(auth);
        if let Some(user) = user {
            builder = builder.set_client_to_redis_username(user);
        }
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(auth) = sentinel_auth {
        let (user, password) = split_auth(auth);
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(mode) = tls {
        builder = builder
            .set_client_to_redis_tls_mode(mode)
            .set_client_to_sentinel_tls_mode(mode);
        if let Some(certs) = certificates {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    builder.build()
}

/// Opens the connection and proves it works (one PING), so a wrong address or
/// password fails at start-up with a message naming the target, never the password.
pub async fn connect(options: &RedisOptions) -> Result<Connection, String> {
    let target = redact_target(&options.target);
    let fail =
        |e: redis::RedisError| format!("cannot connect to Redis at {target}: {}", describe(&e));
    let certificates = options
        .tls
        .certificates()
        .map_err(|e| format!("cannot connect to Redis at {target}: {e}"))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(client_timeout(options.timeout)))
        .set_number_of_retries(2);
    let connection = match &options.target {
        RedisTarget::Standalone(url) => {
            let info = with_auth(url, options.auth.as_deref()).map_err(fail)?;
            let client = match &certificates {
                Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
                None => redis::Client::open(info),
            }
            .map_err(fail)?;
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
            Connection::Standalone(Standalone::Direct(manager))
        }
        RedisTarget::Cluster(urls) => {
            let infos = urls
                .iter()
                .map(|u| with_auth(u, options.auth.as_deref()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let mut builder = ClusterClientBuilder::new(infos)
                .connection_timeout(options.connect_timeout)
                .response_timeout(client_timeout(options.timeout));
            if let Some(certs) = &certificates {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(fail)?;
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
        RedisTarget::Sentinel {
            master,
            sentinels,
            sentinel_auth,
        } => {
            let sentinel = sentinel_client(
                master,
                sentinels,
                sentinel_auth.as_deref(),
                options,
                certificates.clone(),
            )
            .map_err(fail)?;
            let conn = tokio::time::timeout(
                options.connect_timeout,
                SentinelConnection::connect(sentinel, master, config),
            )
            .await
            .map_err(|_| {
                format!(
                    "cannot connect to Redis through {target}: no answer within {:?}",
                    options.connect_timeout
                )
            })?
            .map_err(fail)?;
            Connection::Standalone(Standalone::Sentinel(conn))
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
    Standalone(Standalone),
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
