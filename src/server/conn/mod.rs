//! The ports' connections, one owner for the gRPC port and the HTTP ports (admin,
//! debug, metrics): accept, at most `max_connections` open per port, each served by
//! hyper within the bounds of [`ConnectionLimits`] (`connection.rs`: streams,
//! keepalive, handshake, idle and request timeouts), at most `max_calls` calls in
//! progress on a port's connections together (the rest refused at once, an HTTP/2
//! stream reset with REFUSED_STREAM: `activity.rs`), and a shutdown whose wait for the calls in flight is bounded
//! ([`FINISH_WITHIN`]).
//!
//! Why a bound on calls across connections as well as on streams per connection:
//! a call whose body never comes holds its stream, its request and its future (about
//! 14 KiB, most of it the gRPC decoder's buffer) until the request timeout, so the
//! stream limit alone let `max_connections` x `max_concurrent_streams` of them hold
//! GiBs. Refused at once, a call costs its stream's reset (docs/operations.md,
//! "Connections", has the figures).
//!
//! Why not tonic's and axum's own servers: tonic's has no handshake or idle timeout,
//! no bound on a stream whose client stops reading, retries a failed accept at once
//! (a core spinning at the fd limit, silently), and its graceful stop waits for every
//! stream for ever, so one connection holding streams open kept `serve` from
//! stopping; `axum::serve` sets none of hyper's HTTP/2 bounds. Both are hyper
//! underneath, as is this: hyper-util's connection builder, tonic's routes and axum's
//! router as the services.
//!
//! A failed accept (out of file descriptors: EMFILE, ENFILE; or memory) pauses the
//! port before the next one, doubling from [`PAUSE_FIRST`] to [`PAUSE_MAX`], and is
//! counted (`tollgate_accept_errors_total{port}`) and logged at most once a second;
//! errors that concern only the connection being accepted (reset or aborted before
//! it was taken) are counted and the loop goes on at once.

mod activity;
mod call;
mod connection;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

pub use self::call::{Calls, Received};
use super::tls::ServerTls;
use crate::metrics::PortMetrics;
pub use crate::settings::connections::ConnectionLimits;
use crate::telemetry::ratelimited;

/// After the listener closes, how long a connection's calls in flight get before it
/// is closed, unless the server is still working on one of them (its request in,
/// its answer not made: a store call, a tarpit's delay), which it then finishes
/// first. A call waiting on its client (a body that never comes, an answer it does
/// not take) must not keep the process from exiting after its drain; a call the
/// server works on is answered within the request timeout, and its client is owed
/// the answer.
pub const FINISH_WITHIN: Duration = Duration::from_secs(2);

/// The first pause after a failed accept; it doubles up to [`PAUSE_MAX`].
pub const PAUSE_FIRST: Duration = Duration::from_millis(5);
pub const PAUSE_MAX: Duration = Duration::from_secs(1);

/// Where a port is in its life, as its connections follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Serving,
    /// The listener is closed: connections finish their calls (GOAWAY).
    Draining,
    /// [`FINISH_WITHIN`] is over: connections still open are closed.
    Closing,
}

/// How a connection starts: plain, or with the gRPC port's TLS handshake.
pub enum Handshake {
    Plain,
    Tls(Arc<ServerTls>),
}

/// The services a port serves: tonic's routes, axum's router.
pub trait PortService<B>:
    tower_service::Service<
        Request<Received>,
        Response = Response<B>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S, B> PortService<B> for S where
    S: tower_service::Service<
            Request<Received>,
            Response = Response<B>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// The bodies of their answers.
pub trait PortBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError>> + Default + Unpin + Send + 'static
{
}

impl<B> PortBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Default + Unpin + Send + 'static
{
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One port: what it serves and how.
pub struct Port<S, B> {
    /// Its name in metrics and logs: `grpc`, `http`, `debug`, `prometheus`.
    pub name: &'static str,
    pub service: S,
    pub handshake: Handshake,
    pub limits: ConnectionLimits,
    pub calls: Calls<B>,
    builder: Builder<TokioExecutor>,
    /// The bounded calls in progress on all the port's connections.
    in_progress: Arc<AtomicUsize>,
    /// `tollgate_calls_refused_total{port}`.
    refusals: Counter,
}

impl<S, B> Port<S, B> {
    /// A port serving `service` within `limits`, HTTP/2 only (gRPC) or HTTP/1 and
    /// HTTP/2 (the HTTP ports); see the fields for the rest.
    pub fn new(
        name: &'static str,
        service: S,
        handshake: Handshake,
        http2_only: bool,
        limits: ConnectionLimits,
        calls: Calls<B>,
    ) -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        if http2_only {
            builder = builder.http2_only();
        }
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout);
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.handshake_timeout);
        Self {
            name,
            service,
            handshake,
            limits,
            calls,
            builder,
            in_progress: Arc::default(),
            refusals: Counter::default(),
        }
    }
}

/// Accepts on `listener` and serves each connection until `stopped` resolves; then
/// closes the listener, lets the calls in flight finish for at most
/// [`FINISH_WITHIN`], closes what is left and returns.
pub async fn serve<S, B>(
    listener: TcpListener,
    port: Port<S, B>,
    metrics: PortMetrics,
    stopped: impl Future<Output = ()>,
) where
    S: PortService<B>,
    B: PortBody,
{
    let port = Arc::new(Port {
        refusals: metrics.calls_refused(),
        ..port
    });
    let open = Arc::new(Semaphore::new(port.limits.max_connections));
    let (phase, _) = watch::channel(Phase::Serving);
    tokio::pin!(stopped);
    let mut pause = PAUSE_FIRST;
    loop {
        if open.available_permits() == 0 {
            at_the_bound(port.name, port.limits.max_connections);
        }
        let permit = tokio::select! {
            () = &mut stopped => break,
            permit = Arc::clone(&open).acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let accepted = tokio::select! {
            () = &mut stopped => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                pause = PAUSE_FIRST;
                tcp
            }
            Err(error) => {
                metrics.accept_failed();
                if only_this_connection(&error) {
                    continue;
                }
                accept_failed(port.name, &error, pause);
                tokio::select! {
                    () = &mut stopped => break,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(PAUSE_MAX);
                continue;
            }
        };
        let (port, metrics, mut phase) = (Arc::clone(&port), metrics.clone(), phase.subscribe());
        tokio::spawn(async move {
            metrics.opened();
            let closed_by = connection::serve(tcp, &port, &mut phase).await;
            metrics.closed(closed_by);
            drop(permit);
        });
    }
    drop(listener);
    finish(port.name, phase, port.limits.request_timeout).await;
}

/// The shutdown's end: GOAWAY on every connection, [`FINISH_WITHIN`] for their calls,
/// then the rest closed as soon as the server has answered the calls it works on
/// (within `request_timeout`).
async fn finish(name: &'static str, phase: watch::Sender<Phase>, request_timeout: Duration) {
    let _ = phase.send(Phase::Draining);
    if tokio::time::timeout(FINISH_WITHIN, phase.closed())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        event = "connections_closed_at_shutdown",
        port = name,
        connections = phase.receiver_count(),
        finish_within_ms = FINISH_WITHIN.as_millis() as u64,
        "connections still open after the shutdown's wait: closed, each once the calls the server works on are answered"
    );
    let _ = phase.send(Phase::Closing);
    let answered = request_timeout + Duration::from_secs(1);
    let _ = tokio::time::timeout(answered, phase.closed()).await;
}

/// Whether an accept error concerns only the connection being accepted (the next
/// accept may well succeed at once), not the process (descriptors, memory).
fn only_this_connection(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset | Interrupted
    )
}

fn accept_failed(port: &'static str, error: &std::io::Error, pause: Duration) {
    if let Some(suppressed) = ratelimited::admit(&["accept_failed", port]) {
        tracing::warn!(
            event = "accept_failed",
            port,
            %error,
            pause_ms = pause.as_millis() as u64,
            suppressed,
            "cannot accept a connection (out of file descriptors?): pausing the port"
        );
    }
}

fn at_the_bound(port: &'static str, max: usize) {
    if let Some(suppressed) = ratelimited::admit(&["connections_at_bound", port]) {
        tracing::warn!(
            event = "connections_at_bound",
            port,
            max_connections = max,
            suppressed,
            "the port has --max-connections open: no more accepted until one closes"
        );
    }
}
