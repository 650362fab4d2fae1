//! `tollgate serve`: resolve settings, validate the config before binding anything,
//! then serve until SIGTERM or SIGINT.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use crate::config;
use crate::limiter::{Limiter, LimiterOptions};
use crate::server::{self, Listeners};
use crate::settings::{ServeFlags, ServeSettings};
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::store::redis::RedisStore;
use crate::telemetry;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file or directory [default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config, else config/]
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// gRPC listen address [default: $GRPC_HOST:$GRPC_PORT, else 0.0.0.0:8081]
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP listen address for /healthcheck and /json [default: $HOST:$PORT, else 0.0.0.0:8080]
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
    /// Budget in milliseconds for one request's Redis work; beyond it the request gets UNAVAILABLE
    #[arg(long, value_name = "MS")]
    pub redis_timeout_ms: Option<u64>,
    /// Prefix of every Redis key [default: $CACHE_KEY_PREFIX]
    #[arg(long)]
    pub key_prefix: Option<String>,
}

pub async fn run(args: ServeArgs) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let level = env("LOG_LEVEL");
    let json = env("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json"));
    telemetry::init(level.as_deref(), json);

    let flags = ServeFlags {
        config: args.config,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        shadow_mode: args.shadow_mode,
        redis_url: args.redis_url,
        redis_cluster: args.redis_cluster,
        redis_timeout_ms: args.redis_timeout_ms,
        key_prefix: args.key_prefix,
    };
    let settings = match ServeSettings::resolve(&flags, &env) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match config::load_path(&settings.config) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("tollgate: cannot start: {errors}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(path = %settings.config.display(), domains = config.domains().len(), "config loaded");
    let store: Arc<dyn Store> = match &settings.redis {
        Some(options) => match RedisStore::connect(options).await {
            Ok(store) => {
                tracing::info!(redis = ?options, "connected to Redis");
                Arc::new(store)
            }
            Err(e) => {
                eprintln!("tollgate: cannot start: {e}");
                return ExitCode::from(2);
            }
        },
        None => {
            tracing::warn!(
                "no Redis configured: using the in-memory store, so every limit is counted per process; \
                 with N replicas a client may get up to N times its limit"
            );
            Arc::new(MemoryStore::new())
        }
    };
    let limiter = Arc::new(Limiter::new(
        config,
        store,
        LimiterOptions {
            global_shadow_mode: settings.shadow_mode,
        },
    ));
    let listeners = match Listeners::bind(settings.grpc_addr, settings.http_addr).await {
        Ok(listeners) => listeners,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(2);
        }
    };
    match server::run(listeners, limiter, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
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
