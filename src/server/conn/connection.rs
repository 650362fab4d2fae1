//! One connection, from accept to close: the TLS handshake (gRPC port with TLS), then
//! hyper serving it (HTTP/2 only on the gRPC port, HTTP/1 or HTTP/2 on the HTTP
//! ports) with the stream and keepalive settings, under a watchdog that closes it
//!
//! - when the client has not spoken (sent the HTTP/2 preface, or a request) within the
//!   handshake timeout, TLS handshake included: dropped, nothing to say to it;
//! - when no call has been in progress for the idle timeout: GOAWAY, then closed;
//! - when a call's answer is held far past the request timeout (its client stopped
//!   reading: hyper waits for flow-control credit that never comes, and no timer of
//!   the call can reach it there): dropped with every stream on it;
//! - when the shutdown's wait for the calls in flight is over: dropped, once the calls
//!   the server is working on are answered (those waiting on their client, for the
//!   rest of their request or to take their answer, are not waited for).
//!
//! hyper's own bounds do the rest: `SETTINGS_MAX_CONCURRENT_STREAMS` (streams past it
//! are refused, and a client that keeps opening them is sent GOAWAY after hyper's
//! limit of locally reset streams), PINGs every keepalive interval with the
//! connection closed when one goes unanswered, and the read timeout of an HTTP/1
//! request's headers.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use tonic::transport::server::TcpConnectInfo;

use super::activity::{Activity, Watched};
use super::call::Tracked;
use super::{Handshake, Phase, Port, PortService};
use crate::metrics::ClosedBy;
use crate::telemetry::ratelimited;

/// Serves `tcp` until it closes; why a bound closed it, if one did.
pub(super) async fn serve<S, B>(
    tcp: TcpStream,
    port: &Port<S, B>,
    phase: &mut watch::Receiver<Phase>,
) -> Option<ClosedBy>
where
    S: PortService<B>,
    B: super::PortBody,
{
    // Calls are small and latency-bound: each answer leaves at once.
    let _ = tcp.set_nodelay(true);
    let handshake_by = Instant::now() + port.limits.handshake_timeout;
    // What tonic's `Request::remote_addr` reads: its own accept loop would set it, ours
    // must (the quota service bounds streams per peer by it).
    let info = TcpConnectInfo {
        local_addr: tcp.local_addr().ok(),
        remote_addr: tcp.peer_addr().ok(),
    };
    match &port.handshake {
        Handshake::Plain => drive(tcp, info, port, phase, handshake_by).await,
        Handshake::Tls(tls) => {
            let peer = info.remote_addr;
            let accepted = tokio::select! {
                accepted = tokio::time::timeout_at(handshake_by, tls.accept(tcp, peer)) => accepted,
                () = closing(phase) => return None,
            };
            match accepted {
                Ok(Some(stream)) => drive(stream, info, port, phase, handshake_by).await,
                // Refused (and logged) by the TLS side: a bad certificate, no bound.
                Ok(None) => None,
                Err(_) => {
                    tls.refused(peer, "handshake timed out");
                    Some(ClosedBy::HandshakeTimeout)
                }
            }
        }
    }
}

/// Resolves once the port is shutting down (or gone).
async fn closing(phase: &mut watch::Receiver<Phase>) {
    let _ = phase.wait_for(|p| *p != Phase::Serving).await;
}

async fn drive<IO, S, B>(
    io: IO,
    info: TcpConnectInfo,
    port: &Port<S, B>,
    phase: &mut watch::Receiver<Phase>,
    handshake_by: Instant,
) -> Option<ClosedBy>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: PortService<B>,
    B: super::PortBody,
{
    let limits = &port.limits;
    let activity = Arc::new(Activity::new(
        limits.request_timeout,
        Arc::clone(&port.in_progress),
    ));
    let service = Tracked {
        inner: port.service.clone(),
        activity: Arc::clone(&activity),
        timeout: limits.request_timeout,
        max_calls: limits.max_calls,
        calls: port.calls,
        refusals: port.refusals.clone(),
        info,
    };
    let io = TokioIo::new(Watched::new(io, Arc::clone(&activity)));
    let conn = port.builder.serve_connection(io, service);
    tokio::pin!(conn);
    // The watchdog's look: a quarter of the request timeout (the resolution a held
    // call is found with), and often enough to close an idle connection within a
    // quarter of the idle timeout past it.
    let every = activity
        .quarter()
        .min(limits.idle_timeout / 4)
        .max(MIN_LOOK);
    let mut idle = Idle::new(&activity);
    let mut closed_by = None;
    let mut shutting_down = false;
    let mut phase_open = true;
    // The shutdown's wait is over: closed once the calls the server works on are
    // answered (each within the request timeout).
    let mut closing = false;
    loop {
        let look = if closing {
            Instant::now() + MIN_LOOK
        } else if activity.spoke() {
            Instant::now() + every
        } else {
            handshake_by.min(Instant::now() + every)
        };
        tokio::select! {
            served = &mut conn => {
                if let Err(error) = served {
                    tracing::debug!(port = port.name, %error, "connection ended with an error");
                }
                return closed_by;
            }
            () = tokio::time::sleep_until(look) => {
                let now = Instant::now();
                if closing && activity.working() == 0 {
                    return Some(ClosedBy::Shutdown);
                }
                if !activity.spoke() && now >= handshake_by {
                    return Some(ClosedBy::HandshakeTimeout);
                }
                if activity.stalled(now) {
                    stalled(port.name, limits.request_timeout);
                    return Some(ClosedBy::Stalled);
                }
                if !shutting_down && idle.for_at_least(&activity, now, limits.idle_timeout) {
                    conn.as_mut().graceful_shutdown();
                    shutting_down = true;
                    closed_by = Some(ClosedBy::IdleTimeout);
                }
            }
            changed = phase.changed(), if phase_open => {
                phase_open = changed.is_ok();
                match *phase.borrow_and_update() {
                    Phase::Serving if phase_open => {}
                    Phase::Draining if phase_open => {
                        if !shutting_down {
                            conn.as_mut().graceful_shutdown();
                            shutting_down = true;
                        }
                    }
                    // Closing (or the port gone): the calls waiting on their client
                    // (for the rest of their request, or to take their answer) are
                    // dropped with the connection, those the server works on finish.
                    _ if activity.working() == 0 => return Some(ClosedBy::Shutdown),
                    _ => closing = true,
                }
            }
        }
    }
}

/// The shortest time between two looks of a watchdog.
const MIN_LOOK: Duration = Duration::from_millis(10);

/// Since when a connection has had no call in progress and none begun, as its
/// watchdog's looks see it.
struct Idle {
    since: Option<Instant>,
    begun: u64,
}

impl Idle {
    fn new(activity: &Activity) -> Self {
        Self {
            since: Some(Instant::now()),
            begun: activity.begun(),
        }
    }

    fn for_at_least(&mut self, activity: &Activity, now: Instant, idle: Duration) -> bool {
        let begun = activity.begun();
        if activity.in_flight() > 0 || begun != self.begun {
            self.begun = begun;
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= idle
    }
}

fn stalled(port: &'static str, request_timeout: Duration) {
    if let Some(suppressed) = ratelimited::admit(&["connection_stalled", port]) {
        tracing::warn!(
            event = "connection_stalled",
            port,
            request_timeout_ms = request_timeout.as_millis() as u64,
            suppressed,
            "closed a connection holding a call's answer far past the request timeout (its client stopped reading)"
        );
    }
}
