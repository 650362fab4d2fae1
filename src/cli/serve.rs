//! `tollgate serve`: resolve settings, load the config before binding anything, then
//! serve until SIGTERM or SIGINT (NOT_SERVING at once, a drain period, then the
//! listeners close and calls in flight finish). The config is reloaded when its
//! directory changes and on SIGHUP; the served set and Redis reachability feed health.
//!
//! With `CONFIG_TYPE=GRPC_XDS_SOTW` the limits come from an xDS control plane
//! ([`crate::xds`]) instead of files: nothing is read from disk or watched, and the
//! process is NOT_SERVING (no domain limits anything) until the first config arrives,
//! unless `FORCE_START_WITHOUT_INITIAL_CONFIG` asks to serve at once without domains.
//!
//! A start-up config that does not validate is served as envoyproxy/ratelimit does:
//! the process stays up, NOT_SERVING (no domain limits anything meanwhile), until the
//! watcher or SIGHUP loads a valid set; `--exit-on-invalid-config` exits with code 2
//! instead (docs/operations.md argues the default).

use std::process::ExitCode;
use std::sync::Arc;

use crate::config::Config;
use crate::config::watch::WatchOptions;
use crate::error::Error;
use crate::limiter::{Limiter, LimiterOptions};
use crate::metrics::Metrics;
use crate::server::health::{self, Health};
use crate::server::reload::{self, ConfigSource, ReloadError, ReloadStatus, Reloader, Trigger};
use crate::server::{self, Listeners, ServeOptions};
use crate::settings::{ServeFlags, ServeSettings, compat};
use crate::store::{StoreError, stack};
use crate::telemetry::{self, LogSettings, TelemetryError};
use crate::xds::{XdsClient, XdsError};

/// Why `serve` stopped: every start-up failure (exit code 2, before any port opens),
/// or the server failing while it served (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A flag or variable that cannot be used.
    #[error("{0}")]
    Settings(Error),
    #[error("cannot start: {0}")]
    Telemetry(#[from] TelemetryError),
    #[error("cannot start: {0}")]
    Config(#[from] ReloadError),
    #[error("cannot start: {0}")]
    Tls(Error),
    #[error("cannot start: {0}")]
    Store(#[from] StoreError),
    #[error("cannot start: xDS: {0}")]
    Xds(#[from] XdsError),
    #[error("{0}")]
    Bind(Error),
    #[error("server failed: {0}")]
    Serve(Error),
}

impl ServeError {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            ServeError::Serve(_) => ExitCode::FAILURE,
            _ => ExitCode::from(2),
        }
    }
}

/// Serves until SIGTERM or SIGINT.
pub async fn run(flags: ServeFlags) -> Result<(), ServeError> {
    let env = |name: &str| std::env::var(name).ok();
    let logs = LogSettings::from_env(&env)?;
    let settings = ServeSettings::resolve(&flags, &env).map_err(ServeError::Settings)?;
    let observability = &settings.observability;
    let tracing_settings = observability.tracing.as_ref();
    let telemetry = telemetry::init_with_tracing(&logs, tracing_settings)?;
    if let Some(t) = tracing_settings {
        tracing::info!(
            event = "tracing_enabled",
            protocol = ?t.protocol,
            service_name = %t.service_name,
            sampling_rate = t.sampling_rate,
            "exporting trace spans over OTLP"
        );
    }
    let metrics = Arc::new(Metrics::with_bounds(
        observability.near_limit_ratio,
        observability.metrics,
        observability.metric_names,
        observability.series,
    ));
    // Named before the config: a user at LOG_LEVEL=warn must still learn that a
    // setting they rely on (USE_STATSD, ...) does nothing here.
    // A value that asks for what tollgate does anyway (USE_STATSD=false) stays at info.
    for (name, reason) in &settings.ignored {
        let value = std::env::var(name).unwrap_or_default();
        if compat::agrees(name, &value) {
            tracing::info!(
                event = "setting_ignored",
                setting = name,
                reason,
                "{name}={value} is ignored, as it asks for what tollgate does: {reason}"
            );
        } else {
            tracing::warn!(
                event = "setting_ignored",
                setting = name,
                reason,
                "{name} is set but ignored: {reason}"
            );
        }
    }
    let (config, status, config_loaded) = if let Some(xds) = &settings.xds {
        tracing::info!(
            event = "config_source",
            source = "xds",
            server = %xds.server_url,
            node_id = %xds.node_id,
            force_start = xds.force_start_without_initial_config,
            "limits come from the xDS control plane"
        );
        let serving = xds.force_start_without_initial_config
            && reload::config_counts(0, settings.require_domains);
        (
            Config::new(Vec::new()),
            ReloadStatus::waiting_for(ConfigSource::Xds),
            serving,
        )
    } else {
        load_files(&settings)?
    };
    if !settings.ignore_dotfiles {
        tracing::debug!(
            "names starting with '.' are skipped whatever RUNTIME_IGNOREDOTFILES says: \
             a ConfigMap's ..data would otherwise load every domain twice"
        );
    }
    // Certificates are read before anything connects, so a bad file stops the start.
    let tls = settings
        .grpc_tls
        .clone()
        .map(server::tls::ServerTls::load)
        .transpose()
        .map_err(ServeError::Tls)?;
    let _tls_reload = tls
        .as_ref()
        .map(|tls| AbortOnDrop(tls.spawn_reload(server::tls::RELOAD_INTERVAL)));
    let protection = &settings.protection;
    let store = stack::build(
        settings.redis.as_ref(),
        protection.breaker,
        protection.local_cache_bytes,
        protection.memory_store_bytes,
        Some(&metrics),
    )
    .await?;
    let limiter = Arc::new(Limiter::with_metrics(
        config,
        store.clone(),
        LimiterOptions {
            global_shadow_mode: settings.shadow_mode,
            global_quota_mode: settings.quota_mode,
            response_dynamic_metadata: settings.response_dynamic_metadata,
            headers: protection.headers.clone(),
            retry_after_jitter: protection.retry_after_jitter,
            replicas: protection.replicas,
            memory_store_bytes: Some(protection.memory_store_bytes),
        },
        metrics,
    ));
    let status = Arc::new(status);
    let health = Arc::new(Health::new(config_loaded));
    // Under xDS the "path" in reload logs is the control plane's URL.
    let origin = settings
        .xds
        .as_ref()
        .map_or_else(|| settings.config.clone(), |x| x.server_url.clone().into());
    let reloader = Arc::new(
        Reloader::new(limiter.clone(), origin, status.clone())
            .with_health(health.clone(), settings.require_domains),
    );
    // Before the ports open: a SIGHUP that arrives once we answer must find its handler
    // (SIGHUP's default action ends the process).
    let _sighup = reload_on_sighup(reloader.clone());
    let _xds = match &settings.xds {
        Some(xds) => {
            let metrics = limiter.metrics().source().clone();
            let client = XdsClient::new(xds.clone(), reloader.clone(), metrics)?;
            Some(watch_xds(tokio::spawn(client.run())))
        }
        None => None,
    };
    let _watch = (settings.watch && settings.xds.is_none()).then(|| {
        let mut options = WatchOptions::new(settings.config.clone());
        options.anchors = settings.watch_anchors.clone();
        reload::spawn_watch(reloader.clone(), options)
    });
    let _probe = (settings.redis.is_some() && settings.health_check_redis).then(|| {
        AbortOnDrop(health::spawn_probe(
            store.clone(),
            health.clone(),
            Some(limiter.metrics().clone()),
        ))
    });
    let mut listeners = Listeners::bind(settings.grpc_addr, settings.http_addr)
        .await
        .map_err(ServeError::Bind)?;
    if let Some(debug) = settings.debug_addr {
        listeners = listeners
            .bind_debug(debug)
            .await
            .map_err(ServeError::Bind)?;
    }
    if let Some(prometheus) = &settings.observability.prometheus {
        listeners = listeners
            .bind_prometheus(prometheus.addr, &prometheus.path)
            .await
            .map_err(ServeError::Bind)?;
    }
    let options = ServeOptions {
        health,
        reload: status,
        drain: settings.drain,
        tls,
    };
    let served = server::run_with(listeners, limiter, options, shutdown_signal()).await;
    telemetry.shutdown().await;
    served.map_err(|e| {
        tracing::error!(error = %e, "server failed");
        ServeError::Serve(e)
    })
}

/// The start-up set from the config files: what to serve, its reload state, and
/// whether it counts as a loaded config for health.
fn load_files(settings: &ServeSettings) -> Result<(Config, ReloadStatus, bool), ServeError> {
    match reload::load_set(&settings.config) {
        Ok(loaded) => {
            let domains = loaded.config.domains().len();
            tracing::info!(
                event = "config_loaded",
                path = %settings.config.display(),
                domains,
                hash = %loaded.hash,
                generation = 1,
                "config loaded"
            );
            let counts = reload::config_counts(domains, settings.require_domains);
            Ok((loaded.config, ReloadStatus::new(Some(loaded.hash)), counts))
        }
        Err(error) if settings.exit_on_invalid_config => Err(error.into()),
        Err(error) => {
            tracing::warn!(
                event = "config_invalid_at_start",
                path = %settings.config.display(),
                errors = %telemetry::Json(&error.messages()),
                "no valid config: NOT_SERVING until a valid set loads (on change or SIGHUP)"
            );
            Ok((
                Config::new(Vec::new()),
                ReloadStatus::nothing_loaded(),
                false,
            ))
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

/// The xDS client runs for the life of the process; if it ever ends (a panic, or a
/// return) tollgate would keep serving its last limits with nobody told, so its end is
/// logged at ERROR. Dropping the watcher aborts the client with it.
fn watch_xds(client: tokio::task::JoinHandle<()>) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut client = AbortOnDrop(client);
        match (&mut client.0).await {
            Ok(()) => tracing::error!(
                event = "xds_client_ended",
                "the xDS client stopped; limits will no longer be updated"
            ),
            Err(e) if e.is_cancelled() => {}
            Err(e) => tracing::error!(
                event = "xds_client_ended",
                error = %e,
                "the xDS client panicked; limits will no longer be updated"
            ),
        }
    }))
}

/// Reloads the config on every SIGHUP (the outcome is logged by the reloader).
fn reload_on_sighup(reloader: Arc<Reloader>) -> Option<AbortOnDrop> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangups) => Some(AbortOnDrop(tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    // Still handled under xDS: SIGHUP's default action ends the process.
                    if reloader.source() == ConfigSource::Xds {
                        tracing::info!(
                            event = "sighup",
                            "SIGHUP ignored: limits come from the xDS control plane"
                        );
                        continue;
                    }
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
