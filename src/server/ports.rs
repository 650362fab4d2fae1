//! What each port serves on its connections (`conn/`): the gRPC port tonic's routes,
//! HTTP/2 only, with TLS when configured; the HTTP ports axum's routers, HTTP/1 and
//! HTTP/2. Each says which of its calls stay open by design and how it answers a
//! call not answered within the request timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::admin::{self, AdminState};
use super::conn::{self, ConnectionLimits};
use super::tls::ServerTls;
use crate::metrics::Metrics;

/// The gRPC port until `stopped` resolves: tonic's routes on the port's connections
/// (`conn/`), HTTP/2 only, with TLS when configured.
pub(super) fn grpc<F>(
    routes: tonic::service::Routes,
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    (limits, metrics): (ConnectionLimits, &Metrics),
    stopped: F,
) -> impl Future<Output = ()> + use<F>
where
    F: Future<Output = ()> + Send + 'static,
{
    let handshake = match tls {
        Some(tls) => conn::Handshake::Tls(tls),
        None => conn::Handshake::Plain,
    };
    let port = conn::Port::new(
        "grpc",
        routes.prepare(),
        handshake,
        true,
        limits,
        conn::Calls {
            stay_open,
            timed_out: grpc_timed_out,
        },
    );
    conn::serve(listener, port, metrics.port("grpc"), stopped)
}

/// The gRPC calls that stay open by design, which the request timeout does not bound:
/// the quota service's report streams, health's Watch, reflection. Only these are
/// given their connection's addresses (`Request::remote_addr`).
fn stay_open(path: &str) -> bool {
    path.starts_with("/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/")
        || path == "/grpc.health.v1.Health/Watch"
        || path.starts_with("/grpc.reflection.")
}

fn grpc_timed_out(timeout: Duration) -> http::Response<tonic::body::Body> {
    tonic::Status::from(crate::error::Error::RequestTimeout(timeout)).into_http()
}

fn http_timed_out(timeout: Duration) -> http::Response<axum::body::Body> {
    let why = format!("not answered within the request timeout ({timeout:?})\n");
    let mut response = http::Response::new(axum::body::Body::from(why));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    response
}

/// The HTTP admin port, and the debug and metrics ports when bound, until
/// `stopped()` resolves.
pub(super) fn http<F, S>(
    admin: AdminState,
    (http, debug, prometheus): (
        TcpListener,
        Option<TcpListener>,
        Option<(TcpListener, String)>,
    ),
    (limits, metrics): (ConnectionLimits, &Metrics),
    stopped: S,
) -> impl Future<Output = ()> + use<F, S>
where
    F: Future<Output = ()> + Send + 'static,
    S: Fn() -> F,
{
    let serve = |listener: TcpListener, router: axum::Router, name: &'static str| {
        let port = conn::Port::new(
            name,
            router,
            conn::Handshake::Plain,
            false,
            limits,
            conn::Calls {
                stay_open: |_| false,
                timed_out: http_timed_out,
            },
        );
        Box::pin(conn::serve(listener, port, metrics.port(name), stopped()))
    };
    let prometheus = prometheus.map(|(listener, path)| {
        serve(
            listener,
            admin::prometheus(admin.clone(), &path),
            "prometheus",
        )
    });
    let views = admin::config_views(admin.clone());
    let (http_router, debug) = match debug {
        Some(listener) => (admin::router(admin), Some(serve(listener, views, "debug"))),
        None => (admin::router(admin).merge(views), None),
    };
    let http = serve(http, http_router, "http");
    async move {
        let optional = |server: Option<_>| async move {
            if let Some(server) = server {
                server.await;
            }
        };
        tokio::join!(http, optional(debug), optional(prometheus));
    }
}
