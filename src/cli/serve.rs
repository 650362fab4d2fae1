//! `tollgate serve`: resolve settings, validate the config before binding anything,
//! then serve until SIGTERM or SIGINT (NOT_SERVING at once, a drain period, then the
//! listeners close and calls in flight finish). The config is reloaded when its
//! directory changes and on SIGHUP; Redis reachability feeds health.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use crate::config::watch::WatchOptions;
use crate::limiter::{Limiter, LimiterOptions};
use crate::metrics::Metrics;
use crate::server::health::{self, Health};
use crate::server::reload::{self, ReloadStatus, Reloader, Trigger};
use crate::server::{self, Listeners, ServeOptions};
use crate::settings::{ServeFlags, ServeSettings};
use crate::store::stack;
use crate::telemetry;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file or directory, watched for changes [default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY, else config/]
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// gRPC listen address [default: $GRPC_HOST:$GRPC_PORT, else 0.0.0.0:8081]
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP listen address for /healthcheck, /json, /rlconfig, /config.json, /metrics [default: $HOST:$PORT, else 0.0.0.0:8080]
    #[arg(long)]
    pub http_addr: Option<String>,
    /// Answer OK overall even when over a limit (also $SHADOW_MODE)
    #[arg(long)]
    pub shadow_mode: bool,
    /// Standalone Redis: redis://[user:pass@]host:port/db, rediss:// for TLS [default: $REDIS_URL]
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes: host:port,host:port,... [default: $REDIS_URL with $REDIS_TYPE=cluster]
    #[arg(long)]
    pub redis_cluster: Option<String>,
    /// Redis Sentinel: the master group's name, then the sentinels: name,host:port,... [default: $REDIS_URL with $REDIS_TYPE=sentinel]
    #[arg(long, value_name = "NAME,HOST:PORT,...")]
    pub redis_sentinel: Option<String>,
    /// Budget in milliseconds for one request's Redis work; beyond it the domain's failure_mode answers
    #[arg(long, value_name = "MS")]
    pub redis_timeout_ms: Option<u64>,
    /// Prefix of every Redis key [default: $CACHE_KEY_PREFIX]
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// After SIGTERM, keep answering (health NOT_SERVING) this long before closing the listeners
    #[arg(long, value_name = "SECONDS", default_value_t = crate::settings::DEFAULT_DRAIN_SECONDS)]
    pub drain_seconds: f64,
    /// Do not watch the config for changes; reload only on SIGHUP
    #[arg(long)]
    pub no_watch: bool,
    /// Whether an unreachable Redis makes health NOT_SERVING [default: $REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, else true]
    #[arg(long, value_name = "BOOL")]
    pub health_check_redis: Option<bool>,
    /// Rate-limit headers on responses: none, ratelimit (RateLimit-Limit/-Remaining/-Reset) or ietf [default: ratelimit if $LIMIT_RESPONSE_HEADERS_ENABLED, else none]
    #[arg(long, value_name = "STYLE")]
    pub response_headers: Option<String>,
    /// Add up to this many milliseconds at random to Retry-After, so denied clients do not return together
    #[arg(long, value_name = "MS")]
    pub retry_after_jitter_ms: Option<u64>,
    /// Replicas sharing the limits; with failure_mode: local each admits 1/N [default: $TOLLGATE_REPLICAS, else 1]
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Memory for the local over-limit cache, in bytes; 0 turns it off [default: $LOCAL_CACHE_SIZE_IN_BYTES, else 16 MiB]
    #[arg(long, value_name = "BYTES")]
    pub local_cache_bytes: Option<u64>,
    /// Consecutive Redis failures that open the circuit breaker [default: 5]
    #[arg(long)]
    pub breaker_failures: Option<u32>,
    /// How long an open breaker fails fast before probing Redis again [default: 1000]
    #[arg(long, value_name = "MS")]
    pub breaker_open_ms: Option<u64>,
    /// TLS on the gRPC port: certificate chain (PEM), reloaded when it changes [default: $GRPC_SERVER_TLS_CERT if $GRPC_SERVER_USE_TLS]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_cert: Option<std::path::PathBuf>,
    /// TLS on the gRPC port: private key (PEM) [default: $GRPC_SERVER_TLS_KEY]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_key: Option<std::path::PathBuf>,
    /// mTLS: clients must present a certificate signed by this CA (PEM) [default: $GRPC_CLIENT_TLS_CACERT]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_client_ca: Option<std::path::PathBuf>,
    /// mTLS: a DNS name or IP the client certificate must be valid for [default: $GRPC_CLIENT_TLS_SAN]
    #[arg(long, value_name = "NAME")]
    pub grpc_tls_client_san: Option<String>,
}

pub async fn run(args: ServeArgs) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let level = env("LOG_LEVEL");
    let json = env("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json"));

    let flags = ServeFlags {
        config: args.config,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        shadow_mode: args.shadow_mode,
        redis_url: args.redis_url,
        redis_cluster: args.redis_cluster,
        redis_sentinel: args.redis_sentinel,
        redis_timeout_ms: args.redis_timeout_ms,
        key_prefix: args.key_prefix,
        drain_seconds: Some(args.drain_seconds),
        no_watch: args.no_watch,
        health_check_redis: args.health_check_redis,
        response_headers: args.response_headers,
        retry_after_jitter_ms: args.retry_after_jitter_ms,
        replicas: args.replicas,
        local_cache_bytes: args.local_cache_bytes,
        breaker_failures: args.breaker_failures,
        breaker_open_ms: args.breaker_open_ms,
        grpc_tls_cert: args.grpc_tls_cert,
        grpc_tls_key: args.grpc_tls_key,
        grpc_tls_client_ca: args.grpc_tls_client_ca,
        grpc_tls_client_san: args.grpc_tls_client_san,
    };
    let settings = match ServeSettings::resolve(&flags, &env) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(2);
        }
    };
    let observability = &settings.observability;
    let tracing_settings = observability.tracing.as_ref();
    let telemetry = match telemetry::init_with_tracing(level.as_deref(), json, tracing_settings) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("tollgate: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(t) = tracing_settings {
        tracing::info!(
            event = "tracing_enabled",
            protocol = ?t.protocol,
            service_name = %t.service_name,
            sampling_rate = t.sampling_rate,
            "exporting trace spans over OTLP"
        );
    }
    let metrics = Arc::new(Metrics::new(
        observability.near_limit_ratio,
        observability.metrics,
    ));
    let loaded = match reload::load_set(&settings.config) {
        Ok(loaded) => loaded,
        Err(error) => {
            eprintln!("tollgate: cannot start: {error}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(
        event = "config_loaded",
        path = %settings.config.display(),
        domains = loaded.config.domains().len(),
        hash = %loaded.hash,
        generation = 1,
        "config loaded"
    );
    for (name, reason) in &settings.ignored {
        tracing::info!(
            event = "setting_ignored",
            setting = name,
            reason,
            "{name} is set but ignored: {reason}"
        );
    }
    if !settings.ignore_dotfiles {
        tracing::debug!(
            "names starting with '.' are skipped whatever RUNTIME_IGNOREDOTFILES says: \
             a ConfigMap's ..data would otherwise load every domain twice"
        );
    }
    // Certificates are read before anything connects, so a bad file stops the start.
    let tls = match settings.grpc_tls.clone().map(server::tls::ServerTls::load) {
        None => None,
        Some(Ok(tls)) => Some(tls),
        Some(Err(e)) => {
            eprintln!("tollgate: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    let _tls_reload = tls
        .as_ref()
        .map(|tls| AbortOnDrop(tls.spawn_reload(server::tls::RELOAD_INTERVAL)));
    let protection = &settings.protection;
    let store = match stack::build(
        settings.redis.as_ref(),
        protection.breaker,
        protection.local_cache_bytes,
        Some(&metrics),
    )
    .await
    {
        Ok(store) => store,
        Err(e) => {
            eprintln!("tollgate: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    let limiter = Arc::new(Limiter::with_metrics(
        loaded.config,
        store.clone(),
        LimiterOptions {
            global_shadow_mode: settings.shadow_mode,
            headers: protection.headers.clone(),
            retry_after_jitter: protection.retry_after_jitter,
            replicas: protection.replicas,
        },
        metrics,
    ));
    let status = Arc::new(ReloadStatus::new(Some(loaded.hash)));
    let reloader = Arc::new(Reloader::new(
        limiter.clone(),
        settings.config.clone(),
        status.clone(),
    ));
    // Before the ports open: a SIGHUP that arrives once we answer must find its handler
    // (SIGHUP's default action ends the process).
    let _sighup = reload_on_sighup(reloader.clone());
    let _watch = settings.watch.then(|| {
        let mut options = WatchOptions::new(settings.config.clone());
        options.anchors = settings.watch_anchors.clone();
        reload::spawn_watch(reloader.clone(), options)
    });
    let health = Arc::new(Health::new(true));
    let _probe = (settings.redis.is_some() && settings.health_check_redis)
        .then(|| AbortOnDrop(health::spawn_probe(store.clone(), health.clone())));
    let listeners = match Listeners::bind(settings.grpc_addr, settings.http_addr).await {
        Ok(listeners) => listeners,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(2);
        }
    };
    let options = ServeOptions {
        health,
        reload: status,
        drain: settings.drain,
        tls,
    };
    let served = server::run_with(listeners, limiter, options, shutdown_signal()).await;
    telemetry.shutdown().await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// A background task stopped when its owner goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reloads the config on every SIGHUP (the outcome is logged by the reloader).
fn reload_on_sighup(reloader: Arc<Reloader>) -> Option<AbortOnDrop> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangups) => Some(AbortOnDrop(tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    tracing::info!(event = "sighup", "SIGHUP: reloading the config");
                    let _ = reloader.reload(Trigger::Signal).await;
                }
            }))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reload by signal is off");
                None
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = reloader;
        None
    }
}

/// Resolves on the first SIGTERM (Kubernetes) or SIGINT (a terminal).
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
