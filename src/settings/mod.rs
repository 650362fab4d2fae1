//! Resolving `tollgate serve`'s settings: our flags first, then the environment
//! variables envoyproxy/ratelimit deployments already set, then defaults. Where the
//! limits come from is [`source`] (files, or the xDS source of [`xds`]); where the
//! counters live is `redis.rs` (a [`Backend`]); [`compat`] lists the variables
//! tollgate ignores or refuses; `env.rs` reads booleans as Go spells them; the tests
//! are in `tests.rs`.

pub mod compat;
pub mod connections;
mod env;
mod flags;
pub mod global;
pub mod observability;
pub mod protection;
mod redis;
pub mod rlqs;
pub mod source;
#[cfg(test)]
mod tests;
pub mod tls;
pub mod xds;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use self::env::env_bool;
pub use self::env::parse_bool;
pub use self::flags::{RedisFlags, ServeFlags};
pub use self::source::{FileSettings, SourceSettings};
use crate::error::Error;
use crate::store::Backend;

pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:8081";
/// envoyproxy/ratelimit's debug port, for `DEBUG_HOST` / `DEBUG_PORT`.
pub const DEFAULT_DEBUG_ADDR: &str = "0.0.0.0:6070";
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:8080";
/// Budget for one request's Redis work. Not "well under Envoy's 20 ms": the calls of
/// a burst on one hot key are answered together, when the last queued is, which
/// takes tens of milliseconds on a busy machine (docs/operations.md, "Why the Redis
/// timeout is 250 ms"). A timeout inside that range turns a burst into
/// fallback answers and, since the script may already have run, into miscounts. Fast
/// answers during an outage are the circuit breaker's job (and a refused connection
/// fails at once). Deployments that want tollgate's failure mode to win over Envoy's
/// should raise Envoy's ratelimit `timeout` above this.
pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 250;
pub const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stopping server keeps answering, NOT_SERVING, before it closes its
/// listeners. Kubernetes' preStop hook usually covers endpoint removal; this covers
/// the callers that still hold a connection.
pub const DEFAULT_DRAIN_SECONDS: f64 = 5.0;
/// A drain longer than this is a typo (Kubernetes' default grace period is 30 s).
pub const MAX_DRAIN_SECONDS: f64 = 3600.0;

/// Fully resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSettings {
    /// Where the limits come from: files, or an xDS control plane.
    pub source: SourceSettings,
    /// Where the counters live: in this process, or Redis.
    pub backend: Backend,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// Where the config views are served apart from the HTTP port (`None`: on it).
    pub debug_addr: Option<SocketAddr>,
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor is quota-mode.
    pub quota_mode: bool,
    /// `--overdraft-domains` / `OVERDRAFT_DOMAINS`: every rule of these charges with
    /// `overdraft`.
    pub overdraft_domains: Vec<String>,
    /// `RESPONSE_DYNAMIC_METADATA`: describe the request in the answer's metadata.
    pub response_dynamic_metadata: bool,
    /// Keep answering (NOT_SERVING) this long after SIGTERM before closing.
    pub drain: Duration,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: a served set without domains is NOT_SERVING.
    pub require_domains: bool,
    /// envoyproxy/ratelimit variables that are set but have no effect, with why.
    pub ignored: Vec<(&'static str, &'static str)>,
    /// Response headers, jitter, replicas, local cache and breaker.
    pub protection: protection::Protection,
    /// TLS (and mTLS) on the gRPC port; `None`: plain text.
    pub grpc_tls: Option<tls::GrpcTls>,
    /// Metrics (`USE_PROMETHEUS`, `NEAR_LIMIT_RATIO`) and traces (`TRACING_*`, `OTEL_*`).
    pub observability: observability::Observability,
    /// The quota service's (RLQS) timing and bounds.
    pub rlqs: crate::rlqs::RlqsOptions,
    /// The bounds on every port's connections.
    pub connections: connections::ConnectionLimits,
    /// Global rules' region and ledger; `None`: no ledger, global rules are local.
    pub global: Option<global::GlobalSettings>,
}

impl ServeSettings {
    /// `env` looks a variable up (std::env::var in production, a map in tests). Every
    /// setting that cannot be used is named, one line each (a deployment with several
    /// learns them in one start, not one per restart); a setting that depends on a
    /// refused one is checked once that one is fixed.
    pub fn resolve(
        flags: &ServeFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut refused = Refused(compat::refused_all(&var));
        let drain = refused.take(drain(flags));
        let require_domains = refused.take(match flags.healthy_with_at_least_one_config_loaded {
            Some(require) => Ok(require),
            None => env_bool(&var, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false),
        });
        let protection = refused.take(protection::resolve(flags, &var));
        let addresses = refused.take(addresses(flags, &var));
        let shadow_mode = refused.take(flag_or_env(flags.shadow_mode, &var, "SHADOW_MODE"));
        let quota_mode = refused.take(flag_or_env(flags.quota_mode, &var, "QUOTA_MODE"));
        let response_dynamic_metadata = refused.take(flag_or_env(
            flags.response_dynamic_metadata,
            &var,
            "RESPONSE_DYNAMIC_METADATA",
        ));
        let source = refused.take(source::resolve(flags, &var));
        let backend = protection
            .as_ref()
            .and_then(|p| refused.take(redis::backend(flags, &var, p.memory_store_bytes)));
        let grpc_tls = refused.take(tls::grpc_tls(flags, &var));
        let observability = refused.take(observability::resolve(flags, &var));
        let rlqs = shadow_mode.and_then(|shadow| refused.take(rlqs::resolve(&flags.rlqs, shadow)));
        let connections = refused.take(connections::resolve(&flags.connections));
        let global = refused.take(global::resolve(&flags.global, &var));
        let (
            Some(drain),
            Some(require_domains),
            Some(protection),
            Some((grpc_addr, http_addr, debug_addr)),
            Some(shadow_mode),
            Some(quota_mode),
            Some(response_dynamic_metadata),
            Some(source),
            Some(backend),
            Some(grpc_tls),
            Some(observability),
            Some(rlqs),
            Some(connections),
            Some(global),
        ) = (
            drain,
            require_domains,
            protection,
            addresses,
            shadow_mode,
            quota_mode,
            response_dynamic_metadata,
            source,
            backend,
            grpc_tls,
            observability,
            rlqs,
            connections,
            global,
        )
        else {
            return Err(refused.error());
        };
        if !refused.0.is_empty() {
            return Err(refused.error());
        }
        Ok(Self {
            source,
            backend,
            grpc_addr,
            http_addr,
            debug_addr,
            shadow_mode,
            quota_mode,
            overdraft_domains: overdraft_domains(flags, &var),
            response_dynamic_metadata,
            drain,
            require_domains,
            ignored: compat::ignored(&var),
            protection,
            grpc_tls,
            observability,
            rlqs,
            connections,
            global,
        })
    }
}

/// The settings refused so far, one message each.
struct Refused(Vec<String>);

impl Refused {
    /// The value, or `None` with its refusal noted.
    fn take<T>(&mut self, result: Result<T, Error>) -> Option<T> {
        result.map_err(|e| self.0.push(e.to_string())).ok()
    }

    /// Every refusal, one line each.
    fn error(self) -> Error {
        Error::Settings(self.0.join("\n"))
    }
}

fn drain(flags: &ServeFlags) -> Result<Duration, Error> {
    let drain_seconds = flags.drain_seconds.unwrap_or(DEFAULT_DRAIN_SECONDS);
    if !(0.0..=MAX_DRAIN_SECONDS).contains(&drain_seconds) {
        return Err(Error::Settings(format!(
            "--drain-seconds: {drain_seconds} is not between 0 and {MAX_DRAIN_SECONDS}"
        )));
    }
    Ok(Duration::from_secs_f64(drain_seconds))
}

/// `--overdraft-domains`, else `OVERDRAFT_DOMAINS` (comma-separated).
fn overdraft_domains(flags: &ServeFlags, var: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    if flags.overdraft_domains.is_empty() {
        var("OVERDRAFT_DOMAINS")
            .map(|list| list.split(',').map(|d| d.trim().to_owned()).collect())
            .unwrap_or_default()
    } else {
        flags.overdraft_domains.clone()
    }
    .into_iter()
    .filter(|d: &String| !d.is_empty())
    .collect()
}

/// A switch set by its flag, else by its variable.
fn flag_or_env(
    flag: bool,
    var: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<bool, Error> {
    if flag {
        Ok(true)
    } else {
        env_bool(var, name, false)
    }
}

/// The gRPC, HTTP and (opt-in) debug addresses.
fn addresses(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(SocketAddr, SocketAddr, Option<SocketAddr>), Error> {
    let grpc_addr = address(
        flags.grpc_addr.clone(),
        var("GRPC_HOST"),
        var("GRPC_PORT"),
        DEFAULT_GRPC_ADDR,
        "--grpc-addr / GRPC_HOST:GRPC_PORT",
    )?;
    let http_addr = address(
        flags.http_addr.clone(),
        var("HOST"),
        var("PORT"),
        DEFAULT_HTTP_ADDR,
        "--http-addr / HOST:PORT",
    )?;
    // envoyproxy/ratelimit always serves /rlconfig on its debug port (6070); here it
    // is opt-in, so a deployment that sets nothing keeps everything on one port.
    let debug_addr = match (&flags.debug_addr, var("DEBUG_PORT")) {
        (None, None) => None,
        (flag, port) => Some(address(
            flag.clone(),
            var("DEBUG_HOST"),
            port,
            DEFAULT_DEBUG_ADDR,
            "--debug-addr / DEBUG_HOST:DEBUG_PORT",
        )?),
    };
    Ok((grpc_addr, http_addr, debug_addr))
}

/// The flag wins; otherwise HOST and PORT override the default's parts one by one.
fn address(
    flag: Option<String>,
    host: Option<String>,
    port: Option<String>,
    default: &str,
    what: &str,
) -> Result<SocketAddr, Error> {
    let text = match flag {
        Some(flag) => flag,
        None => {
            let (default_host, default_port) = default.rsplit_once(':').unwrap_or((default, ""));
            let host = host.unwrap_or_else(|| default_host.to_owned());
            let port = port.unwrap_or_else(|| default_port.to_owned());
            if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        }
    };
    text.to_socket_addrs()
        .map_err(|e| Error::Settings(format!("{what}: cannot use '{text}': {e}")))?
        .next()
        .ok_or_else(|| Error::Settings(format!("{what}: '{text}' resolves to no address")))
}
