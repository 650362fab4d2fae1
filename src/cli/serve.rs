//! `tollgate serve`: resolve settings, load the config before binding anything, then
//! serve until SIGTERM or SIGINT (NOT_SERVING at once, a drain period, then the
//! listeners close and calls in flight finish; a second signal exits at once). The
//! config comes from its source (files, watched and reloaded on SIGHUP, or an xDS
//! control plane: `server::reload::Source`); the served set and the store's
//! reachability feed health.

use std::process::ExitCode;
use std::sync::Arc;

use crate::background::Background;
use crate::error::Error;
use crate::global::Global;
use crate::global::ledger::redis::RedisLedger;
use crate::limiter::{Limiter, LimiterOptions};
use crate::metrics::Metrics;
use crate::rlqs::Rlqs;
use crate::server::health::{self, Health};
use crate::server::reload::{FileSource, Reloader, Source, SourceError, Trigger};
use crate::server::tls::{self, ServerTls};
use crate::server::{self, Listeners, ServeOptions};
use crate::settings::{ServeFlags, ServeSettings, SourceSettings, compat};
use crate::store::{Store, StoreError, stack};
use crate::telemetry::{self, LogSettings, Telemetry, TelemetryError};
use crate::xds::XdsSource;

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
    Source(#[from] SourceError),
    #[error("cannot start: {0}")]
    Tls(Error),
    #[error("cannot start: {0}")]
    Store(#[from] StoreError),
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
    // Both read before either refuses, so every refused setting is named at once.
    let (logs, settings) = match (
        LogSettings::from_env(&env),
        ServeSettings::resolve(&flags, &env),
    ) {
        (Ok(logs), Ok(settings)) => (logs, settings),
        (Err(logs), Ok(_)) => return Err(logs.into()),
        (logs, Err(settings)) => {
            let lines = logs.err().map(|e| e.to_string()).into_iter();
            let all: Vec<String> = lines.chain([settings.to_string()]).collect();
            return Err(ServeError::Settings(Error::Settings(all.join("\n"))));
        }
    };
    let telemetry = start_telemetry(&logs, &settings)?;
    let metrics = Arc::new(Metrics::with_bounds(
        settings.observability.near_limit_ratio,
        settings.observability.metrics,
        settings.observability.metric_names,
        settings.observability.series,
    ));
    // Named before the config: a user at LOG_LEVEL=warn must still learn that a
    // setting they rely on (USE_STATSD, ...) does nothing here.
    log_ignored(&settings.ignored);
    let source = config_source(&settings.source);
    let first = source.first_set(settings.require_domains)?;
    // Certificates are read before anything connects, so a bad file stops the start.
    let tls = settings
        .grpc_tls
        .clone()
        .map(ServerTls::load)
        .transpose()
        .map_err(ServeError::Tls)?;
    let protection = &settings.protection;
    let store = stack::build(
        &settings.backend,
        protection.breaker,
        protection.local_cache_bytes,
        Some(&metrics),
    )
    .await?;
    let (global, global_sync) = start_global(&settings, &store, &metrics, &first.config)?;
    let mut options = limiter_options(&settings);
    options.global = global.as_ref().map(|g| g.table.clone());
    let limiter = Arc::new(Limiter::with_metrics(
        first.config,
        store.clone(),
        options,
        metrics,
    ));
    let health = Arc::new(Health::new(first.config_loaded));
    let status = Arc::new(first.status);
    let reloader = Arc::new(
        Reloader::for_source(limiter.clone(), source.as_ref(), status.clone())
            .with_health(health.clone(), settings.require_domains),
    );
    // Before the ports open: a SIGHUP that arrives once we answer must find its handler
    // (SIGHUP's default action ends the process).
    let mut tasks: Vec<Background> = reload_on_sighup(reloader.clone()).into_iter().collect();
    tasks.extend(global_sync);
    tasks.extend(source.follow(reloader, limiter.metrics().source().clone())?);
    tasks.extend(probe(&settings, store, &health, &limiter));
    tasks.extend(
        tls.as_ref()
            .map(|tls| Background::own(tls.spawn_reload(tls::RELOAD_INTERVAL))),
    );
    let rlqs = Rlqs::on_backend(
        limiter.clone(),
        &settings.backend,
        settings.rlqs.clone(),
        protection.breaker,
    )
    .map_err(|e| ServeError::Settings(Error::Settings(e)))?;
    let listeners = bind(&settings).await?;
    let options = ServeOptions {
        health,
        reload: status,
        drain: settings.drain,
        tls,
        rlqs: Some(Arc::new(rlqs)),
        connections: settings.connections,
        global,
    };
    let served = server::run_with(listeners, limiter, options, shutdown_signal()).await;
    drop(tasks);
    telemetry.shutdown().await;
    served.map_err(|e| {
        tracing::error!(error = %e, "server failed");
        ServeError::Serve(e)
    })
}

/// The one place a config source is picked: a new source is a variant of
/// [`SourceSettings`] and its [`Source`], named here.
fn config_source(settings: &SourceSettings) -> Box<dyn Source> {
    match settings {
        SourceSettings::Files(files) => Box::new(FileSource(files.clone())),
        SourceSettings::Xds(xds) => Box::new(XdsSource(xds.as_ref().clone())),
    }
}

/// Logs, and span export when tracing is on.
fn start_telemetry(logs: &LogSettings, settings: &ServeSettings) -> Result<Telemetry, ServeError> {
    let tracing_settings = settings.observability.tracing.as_ref();
    let telemetry = telemetry::init_with_tracing(logs, tracing_settings)?;
    if let Some(t) = tracing_settings {
        tracing::info!(
            event = "tracing_enabled",
            protocol = ?t.protocol,
            service_name = %t.service_name,
            sampling_rate = t.sampling_rate,
            "exporting trace spans over OTLP"
        );
    }
    Ok(telemetry)
}

/// Every envoyproxy/ratelimit variable that is set and does nothing here. A value
/// that asks for what tollgate does anyway (USE_STATSD=false) stays at info.
fn log_ignored(ignored: &[(&'static str, &'static str)]) {
    for (name, reason) in ignored {
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
}

fn limiter_options(settings: &ServeSettings) -> LimiterOptions {
    let protection = &settings.protection;
    LimiterOptions {
        global_shadow_mode: settings.shadow_mode,
        global_quota_mode: settings.quota_mode,
        overdraft_domains: settings.overdraft_domains.clone(),
        response_dynamic_metadata: settings.response_dynamic_metadata,
        headers: protection.headers.clone(),
        retry_after_jitter: protection.retry_after_jitter,
        replicas: protection.replicas,
        memory_store_bytes: Some(protection.memory_store_bytes),
        global: None,
    }
}

/// The region's part in global rules when a ledger is named: the table requests read
/// and the ledger client's task. Without one, global rules are local (said once, if
/// the config has any).
fn start_global(
    settings: &ServeSettings,
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
    config: &crate::config::Config,
) -> Result<(Option<Arc<Global>>, Option<Background>), ServeError> {
    let Some(global) = &settings.global else {
        if config.has_global_rules() {
            tracing::warn!(
                event = "global_without_ledger",
                "the config has global rules but no ledger is named (--global-ledger): \
                 each region decides them against the whole limit"
            );
        }
        return Ok((None, None));
    };
    let timeout = global.ledger.timeout;
    let ledger = RedisLedger::new(global.ledger.clone(), timeout)
        .map_err(|e| ServeError::Settings(Error::Settings(format!("--global-ledger: {e}"))))?;
    tracing::info!(
        event = "global_ledger",
        region = %global.options.region,
        replica = %global.options.replica,
        ledger = ?global.ledger.target,
        report_ms = global.options.report_period.as_millis() as u64,
        "global rules divide their limits through the ledger"
    );
    let (global, task) = Global::start(
        global.options.clone(),
        store.clone(),
        Arc::new(ledger),
        Some(metrics.clone()),
    );
    Ok((Some(global), Some(task)))
}

/// Readiness follows the store's answers when its backend says so.
fn probe(
    settings: &ServeSettings,
    store: Arc<dyn Store>,
    health: &Arc<Health>,
    limiter: &Limiter,
) -> Option<Background> {
    settings.backend.probed().then(|| {
        Background::own(health::spawn_probe(
            store,
            health.clone(),
            Some(limiter.metrics().clone()),
        ))
    })
}

/// The gRPC and HTTP ports, and the debug and metrics ports when asked for.
async fn bind(settings: &ServeSettings) -> Result<Listeners, ServeError> {
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
    Ok(listeners)
}

/// Reloads the config on every SIGHUP (the outcome is logged by the reloader).
fn reload_on_sighup(reloader: Arc<Reloader>) -> Option<Background> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangups) => Some(Background::spawn(async move {
                while hangups.recv().await.is_some() {
                    // Handled whatever the source: SIGHUP's default action ends the process.
                    let source = reloader.source();
                    if !source.rereads {
                        tracing::info!(
                            event = "sighup",
                            source = source.name,
                            "SIGHUP ignored: the {} source sends every change itself",
                            source.name
                        );
                        continue;
                    }
                    tracing::info!(event = "sighup", "SIGHUP: reloading the config");
                    let _ = reloader.reload(Trigger::Signal).await;
                }
            })),
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

/// Resolves on the first SIGTERM (Kubernetes) or SIGINT (a terminal). A second one
/// during the drain ends the process at once, as whoever sends it means it (exit
/// code 128 + the signal, as a shell reports a process a signal killed).
pub async fn shutdown_signal() {
    stop_signal().await;
    tokio::spawn(async {
        let code = stop_signal().await;
        tracing::warn!(
            event = "shutdown_forced",
            "a second stop signal: exiting now, without waiting for the drain"
        );
        std::process::exit(code);
    });
}

/// The next SIGINT or SIGTERM; returns the exit code it stands for.
async fn stop_signal() -> i32 {
    const SIGINT: i32 = 128 + 2;
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        const SIGTERM: i32 = 128 + 15;
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => SIGINT,
                    _ = term.recv() => SIGTERM,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                SIGINT
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
        SIGINT
    }
}
