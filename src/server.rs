//! Wires a [`Limiter`] to sockets: the gRPC port (rate-limit service, grpc.health.v1,
//! reflection) and the HTTP admin port. Tests call [`run`] on listeners bound to port 0.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

use crate::error::Error;
use crate::limiter::Limiter;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::service::RateLimitGrpc;

/// Names under which grpc.health.v1 reports: the whole server (""), the name
/// envoyproxy/ratelimit registers ("ratelimit"), and the service's full name.
const HEALTH_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// The two bound sockets, so callers learn the real ports before serving.
pub struct Listeners {
    pub grpc: TcpListener,
    pub http: TcpListener,
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
        })
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
/// lets in-flight calls finish.
pub async fn run<F>(listeners: Listeners, limiter: Arc<Limiter>, shutdown: F) -> Result<(), Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    let grpc_addr = listeners.grpc_addr();
    let http_addr = listeners.http_addr();
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in HEALTH_NAMES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: reporting NOT_SERVING and draining");
        for name in HEALTH_NAMES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        let _ = stop_tx.send(true);
    });

    // Rate-limit calls are tiny and latency-bound: send each answer at once.
    let incoming = TcpListenerStream::new(listeners.grpc).map(|stream| {
        if let Ok(s) = &stream {
            let _ = s.set_nodelay(true);
        }
        stream
    });
    let grpc = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(RateLimitGrpc::new(limiter.clone()).into_server())
        .serve_with_incoming_shutdown(incoming, stopped());
    let http =
        axum::serve(listeners.http, crate::http::router(limiter)).with_graceful_shutdown(stopped());

    tracing::info!(grpc = %grpc_addr, http = %http_addr, "tollgate serving");
    let (grpc_result, http_result) = tokio::join!(grpc, http);
    grpc_result?;
    http_result.map_err(|e| Error::io("HTTP server", e))?;
    Ok(())
}
