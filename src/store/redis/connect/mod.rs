//! Connecting to Redis: a standalone server through a reconnecting
//! `ConnectionManager`, a cluster through redis-rs' async cluster client (which
//! follows MOVED/ASK and retries TRYAGAIN), or the master of a Sentinel group
//! ([`sentinel`], which follows failovers). All multiplex concurrent requests over
//! one connection per node, pipelining them. `rediss://` URLs use TLS (rustls), with
//! the system's roots or the CA of [`RedisTls`], and a client certificate if given.
//! What to connect to is described in `options.rs`; what comes back is one
//! [`Connection`], whatever the kind of server.

mod options;
pub mod probe;
pub mod sentinel;

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, TlsCertificates, Value,
};

use self::options::redact_target;
pub use self::options::{RedisOptions, RedisTarget, RedisTls, redact};
use self::sentinel::SentinelConnection;

/// redis-rs' own response timeout, kept well above ours: the store's timeout answers
/// the request, and the client's must not also fire on a slow burst (it may drop the
/// multiplexed connection every other request is waiting on).
fn client_timeout(ours: Duration) -> Duration {
    (ours * 4).max(Duration::from_secs(1))
}

/// The one connection abstraction: a standalone server (directly or through
/// Sentinel) or a cluster. Every variant multiplexes concurrent requests over one
/// connection per node, and clones share it. Code that only sends commands (loading
/// the scripts, PING, the batcher's EVALSHA) uses it through `ConnectionLike` and
/// never asks which it is; only the choice of store path does.
#[derive(Clone)]
pub enum Connection {
    /// One server: no slots to respect.
    Direct(ConnectionManager),
    /// Whichever server Sentinel names master: no slots either.
    Sentinel(SentinelConnection),
    /// redis-rs routes each command by its keys' slot (and `SCRIPT LOAD` to every
    /// master).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Direct(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Direct(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Direct(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// `password` or `user:password`.
fn split_auth(auth: &str) -> (Option<&str>, &str) {
    match auth.split_once(':') {
        Some((user, password)) => (Some(user), password),
        None => (None, auth),
    }
}

/// Every connection to Redis (and to a sentinel) sends at once: redis-rs leaves
/// TCP_NODELAY off, and with Nagle's algorithm a call written while an earlier one's
/// bytes are not yet acknowledged waits for that ACK, which the peer may delay; one
/// multiplexed connection carries several calls in flight (the batcher's depth, a
/// cluster master's queue), so a delayed ACK stalls the calls behind it (BENCHMARKS.md,
/// "TCP_NODELAY on the connections to Redis", has the runs).
fn tcp() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn with_auth(url: &str, auth: Option<&str>) -> redis::RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?.set_tcp_settings(tcp());
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
        .set_client_to_redis_db(db)
        .set_client_to_redis_tcp_settings(tcp())
        .set_client_to_sentinel_tcp_settings(tcp());
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

/// Checks everything about `options` that needs no server: the URLs parse, the TLS
/// files load, the Sentinel client builds. A start with settings that can never work
/// must stop, while a server that is merely not there yet is waited for (see
/// `RedisStore::start`), so the two are told apart before anything is dialled.
pub fn check(options: &RedisOptions) -> Result<(), String> {
    let target = redact_target(&options.target);
    let fail = |e: redis::RedisError| format!("bad Redis settings for {target}: {}", describe(&e));
    let certificates = options
        .tls
        .certificates()
        .map_err(|e| format!("bad Redis settings for {target}: {e}"))?;
    match &options.target {
        RedisTarget::Standalone(url) => {
            with_auth(url, options.auth.as_deref()).map_err(fail)?;
        }
        RedisTarget::Cluster(urls) => {
            if urls.is_empty() {
                return Err(format!("bad Redis settings for {target}: no cluster nodes"));
            }
            for url in urls {
                with_auth(url, options.auth.as_deref()).map_err(fail)?;
            }
        }
        RedisTarget::Sentinel {
            master,
            sentinels,
            sentinel_auth,
        } => {
            sentinel_client(
                master,
                sentinels,
                sentinel_auth.as_deref(),
                options,
                certificates,
            )
            .map_err(fail)?;
        }
    }
    Ok(())
}

/// Whether a failed connect says the settings are wrong (credentials), rather than
/// that the server is not reachable yet: retrying cannot fix the former.
pub fn refused_by_settings(error: &str) -> bool {
    error.contains("authentication failed") || error.contains("authentication required")
}

/// Opens the connection and proves it works (one PING), so a wrong address or
/// password fails at start-up with a message naming the target, never the password.
pub async fn connect(options: &RedisOptions) -> Result<Connection, String> {
    let target = redact_target(&options.target);
    let mut connection = open(options, &target).await?;
    let ping = redis::cmd("PING");
    tokio::time::timeout(
        options.connect_timeout,
        ping.query_async::<()>(&mut connection),
    )
    .await
    .map_err(|_| {
        format!(
            "Redis at {target} did not answer PING within {:?}",
            options.connect_timeout
        )
    })?
    .map_err(|e| format!("cannot connect to Redis at {target}: {}", describe(&e)))?;
    Ok(connection)
}

/// The connection of `options.target`'s kind (`target` is its redacted name).
async fn open(options: &RedisOptions, target: &str) -> Result<Connection, String> {
    let fail =
        |e: redis::RedisError| format!("cannot connect to Redis at {target}: {}", describe(&e));
    // A server that accepts the TCP connection and then says nothing must not hold
    // start-up (or a readiness probe) longer than the connect timeout.
    let within =
        |what: String| move |_| format!("{what}: no answer within {:?}", options.connect_timeout);
    let certificates = options
        .tls
        .certificates()
        .map_err(|e| format!("cannot connect to Redis at {target}: {e}"))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(client_timeout(options.timeout)))
        .set_number_of_retries(2);
    Ok(match &options.target {
        RedisTarget::Standalone(url) => {
            let info = with_auth(url, options.auth.as_deref()).map_err(fail)?;
            let client = match &certificates {
                Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
                None => redis::Client::open(info),
            }
            .map_err(fail)?;
            let manager = ConnectionManager::new_with_config(client, config);
            tokio::time::timeout(options.connect_timeout, manager)
                .await
                .map_err(within(format!("cannot connect to Redis at {target}")))?
                .map(Connection::Direct)
                .map_err(fail)?
        }
        RedisTarget::Cluster(urls) => {
            let infos = urls
                .iter()
                .map(|u| with_auth(u, options.auth.as_deref()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let mut builder = ClusterClientBuilder::new(infos)
                .tcp_settings(tcp())
                .connection_timeout(options.connect_timeout)
                .response_timeout(client_timeout(options.timeout));
            if let Some(certs) = &certificates {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(fail)?;
            tokio::time::timeout(options.connect_timeout, client.get_async_connection())
                .await
                .map_err(within(format!(
                    "cannot connect to Redis Cluster at {target}"
                )))?
                .map(Connection::Cluster)
                .map_err(fail)?
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
            let conn = SentinelConnection::connect(sentinel, master, config);
            tokio::time::timeout(options.connect_timeout, conn)
                .await
                .map_err(within(format!("cannot connect to Redis through {target}")))?
                .map(Connection::Sentinel)
                .map_err(fail)?
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Standalone and cluster nodes are dialled from these: each sends at once.
    #[test]
    fn every_redis_url_connects_without_nagle() {
        for auth in [None, Some("secret"), Some("user:secret")] {
            let info = with_auth("redis://127.0.0.1:6379/0", auth).expect("parses");
            assert!(info.tcp_settings().nodelay(), "auth {auth:?}");
        }
    }
}
