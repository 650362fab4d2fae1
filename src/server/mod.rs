//! Wires a [`Limiter`] to sockets: the gRPC port (rate-limit service, the quota
//! service [`Rlqs`], grpc.health.v1, reflection) and the HTTP admin port. Tests call [`run`] on listeners bound to port 0.
//!
//! Health follows [`Health`]: SERVING only with a config loaded and the backend
//! reachable. Shutdown, when the `shutdown` future resolves: NOT_SERVING at once (gRPC
//! health and `/healthcheck`), both ports keep answering for [`ServeOptions::drain`]
//! (time for Envoy and Kubernetes to stop sending), then the listeners close (new
//! connections are refused) and the calls in flight finish.
//!
//! With [`ServeOptions::tls`] the gRPC port speaks TLS (mTLS with a client CA); see
//! [`tls`]. The HTTP admin port stays plain. With a debug listener
//! ([`Listeners::bind_debug`]) the config views move there, off the HTTP port. With a
//! metrics listener ([`Listeners::bind_prometheus`], `PROMETHEUS_ADDR`) the metrics are
//! served there too, at their own path.

pub mod admin;
pub mod config_view;
pub mod conn;
pub mod grpc;
pub mod health;
mod ports;
pub mod reload;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use self::admin::AdminState;
use self::conn::ConnectionLimits;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::rlqs::{Rlqs, RlqsGrpc};
use crate::server::grpc::RateLimitGrpc;
use crate::server::health::{Health, HealthState};
use crate::server::reload::ReloadStatus;

/// What the server needs besides the limiter.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Readiness; the server flips it to draining on shutdown.
    pub health: Arc<Health>,
    /// The reload state shown by `/config.json`.
    pub reload: Arc<ReloadStatus>,
    /// How long both ports keep answering after shutdown begins, NOT_SERVING.
    pub drain: Duration,
    /// TLS on the gRPC port; `None`: plain text.
    pub tls: Option<Arc<tls::ServerTls>>,
    /// The quota service (RLQS) beside `ShouldRateLimit`; `None`: one on the memory
    /// ledger with default bounds.
    pub rlqs: Option<Arc<Rlqs>>,
    /// The bounds on every port's connections.
    pub connections: ConnectionLimits,
    /// Global rules' shares and ledger link (`/global`, the health detail); `None`
    /// without a ledger.
    pub global: Option<Arc<crate::global::Global>>,
}

/// Names under which grpc.health.v1 reports: the whole server (""), the name
/// envoyproxy/ratelimit registers ("ratelimit"), and the service's full name.
const HEALTH_NAMES: [&str; 4] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
];

/// The bound sockets, so callers learn the real ports before serving.
pub struct Listeners {
    pub grpc: TcpListener,
    pub http: TcpListener,
    /// Set by [`Listeners::bind_debug`]: the config views are served here, and not on
    /// the HTTP port, so they can be bound to loopback while `/json` and `/metrics`
    /// stay reachable.
    pub debug: Option<TcpListener>,
    /// Set by [`Listeners::bind_prometheus`]: `GET <path>` answers the metrics here
    /// as well as on the HTTP port.
    pub prometheus: Option<(TcpListener, String)>,
}

impl Listeners {
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> Result<Self, Error> {
        let grpc_listener = TcpListener::bind(grpc)
            .await
            .map_err(|e| Error::io(format!("cannot bind gRPC address {grpc}"), e))?;
        let http_listener = TcpListener::bind(http)
            .await
            .map_err(|e| Error::io(format!("cannot bind HTTP address {http}"), e))?;
        Ok(Self {
            grpc: grpc_listener,
            http: http_listener,
            debug: None,
            prometheus: None,
        })
    }

    /// Binds the debug port (`--debug-addr`), which takes the config views.
    pub async fn bind_debug(mut self, debug: SocketAddr) -> Result<Self, Error> {
        let listener = TcpListener::bind(debug)
            .await
            .map_err(|e| Error::io(format!("cannot bind debug address {debug}"), e))?;
        self.debug = Some(listener);
        Ok(self)
    }

    /// Binds the metrics listener (`PROMETHEUS_ADDR`), serving them at `path`.
    pub async fn bind_prometheus(mut self, addr: SocketAddr, path: &str) -> Result<Self, Error> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("cannot bind Prometheus address {addr}"), e))?;
        self.prometheus = Some((listener, path.to_owned()));
        Ok(self)
    }

    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.prometheus
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
    }

    pub fn debug_addr(&self) -> Option<SocketAddr> {
        self.debug.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
            .local_addr()
            .expect("bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
            .local_addr()
            .expect("bound listener has an address")
    }
}

/// Serves until `shutdown` resolves, then reports NOT_SERVING, stops accepting and
/// lets in-flight calls finish (no drain period).
pub async fn run<F>(listeners: Listeners, limiter: Arc<Limiter>, shutdown: F) -> Result<(), Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    let options = ServeOptions {
        reload: Arc::new(ReloadStatus::new(None)),
        ..ServeOptions::default()
    };
    run_with(listeners, limiter, options, shutdown).await
}

/// [`run`] with readiness, reload state and a drain period.
pub async fn run_with<F>(
    listeners: Listeners,
    limiter: Arc<Limiter>,
    options: ServeOptions,
    shutdown: F,
) -> Result<(), Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    let grpc_addr = listeners.grpc_addr();
    let http_addr = listeners.http_addr();
    let debug_addr = listeners.debug_addr();
    let prometheus_addr = listeners.prometheus_addr();
    let grpc_tls = match &options.tls {
        Some(tls) if tls.mutual() => "mtls",
        Some(_) => "tls",
        None => "off",
    };
    // Everything that can fail first: the tasks started below (the health follower,
    // the drain) would outlive an early return and act on a server that never ran.
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let (health_service, follower) = health_service(&options.health).await;
    let (stop, drainer) = drain_after(shutdown, options.health.clone(), options.drain);
    let rlqs = options
        .rlqs
        .unwrap_or_else(|| Arc::new(Rlqs::in_memory(limiter.clone())));
    // RLQS streams never end on their own: the listeners' graceful stop would wait for
    // them for ever, so they are ended (UNAVAILABLE, Envoy reconnects) when it begins.
    let rlqs_closer = tokio::spawn({
        let (stopped, rlqs) = (stop.stopped(), rlqs.clone());
        async move {
            stopped.await;
            rlqs.shut_down();
        }
    });
    let routes = tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RateLimitGrpc::new(limiter.clone()).into_server())
        .add_service(RlqsGrpc::new(rlqs.clone()).into_server());
    let bounds = (options.connections, &**limiter.metrics());
    // Boxed, as the HTTP ports' below: each port's accept loop holds its hyper
    // builder and would make `serve`'s whole future as big.
    let grpc = Box::pin(ports::grpc(
        routes,
        listeners.grpc,
        options.tls,
        bounds,
        stop.stopped(),
    ));
    let listeners = (listeners.http, listeners.debug, listeners.prometheus);
    let http = ports::http(
        AdminState {
            limiter: limiter.clone(),
            health: options.health,
            reload: options.reload,
            rlqs,
            global: options.global,
        },
        listeners,
        bounds,
        || stop.stopped(),
    );
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        debug = debug_addr.map(|a| a.to_string()),
        prometheus = prometheus_addr.map(|a| a.to_string()),
        grpc_tls,
        "tollgate serving"
    );
    tokio::join!(grpc, http);
    follower.abort();
    drainer.abort();
    rlqs_closer.abort();
    tracing::info!(event = "shutdown_finished", "every call answered; stopped");
    Ok(())
}

/// grpc.health.v1, set before the port answers (so no check ever sees an unset
/// status), and the task that keeps it following `health`.
async fn health_service(
    health: &Health,
) -> (
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    JoinHandle<()>,
) {
    let (reporter, service) = tonic_health::server::health_reporter();
    let mut changes = health.subscribe();
    let serving = changes.borrow_and_update().serving();
    report(&reporter, serving).await;
    let follower = tokio::spawn(follow_health(reporter, changes, serving));
    (service, follower)
}

/// When the listeners stop: `drain` after `shutdown` resolves, NOT_SERVING meanwhile.
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// The shutdown sequence: `shutdown`, then NOT_SERVING at once, then `drain` of
/// answering still, then [`Stop`] closes the listeners.
fn drain_after<F>(shutdown: F, health: Arc<Health>, drain: Duration) -> (Stop, JoinHandle<()>)
where
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let drainer = tokio::spawn(async move {
        shutdown.await;
        health.start_draining();
        tracing::info!(
            event = "shutdown_started",
            drain_seconds = drain.as_secs_f64(),
            "shutting down: NOT_SERVING, still answering during the drain period"
        );
        tokio::time::sleep(drain).await;
        tracing::info!(
            event = "drain_finished",
            "drain over: closing the listeners, finishing calls in flight"
        );
        let _ = stop_tx.send(true);
    });
    (Stop(stop_rx), drainer)
}

/// Mirrors [`Health`] into grpc.health.v1 (until aborted), logging each transition.
async fn follow_health(
    reporter: HealthReporter,
    mut changes: tokio::sync::watch::Receiver<HealthState>,
    mut serving: bool,
) {
    loop {
        if changes.changed().await.is_err() {
            return;
        }
        let state = *changes.borrow_and_update();
        if state.serving() == serving {
            continue;
        }
        serving = state.serving();
        report(&reporter, serving).await;
        match state.reason() {
            Some(reason) => tracing::info!(
                event = "health_changed",
                serving,
                reason,
                "health: NOT_SERVING"
            ),
            None => tracing::info!(event = "health_changed", serving, "health: SERVING"),
        }
    }
}

async fn report(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
}
