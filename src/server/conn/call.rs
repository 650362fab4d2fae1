//! One call of a connection, as the service every call goes through ([`Tracked`])
//! sees it: its place among the connection's and the port's calls in progress
//! (`activity.rs`) from its arrival until its answer's body is dropped (sent in full,
//! or the stream reset); refused at once when the port already has `max_calls` in
//! progress; answered with the port's timeout answer when it takes longer than the
//! request timeout; and its request's body ([`Received`]) saying when the request is
//! in whole, so that a shutdown waits for the calls the server is working on and not
//! for those waiting on their client.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use tonic::transport::server::TcpConnectInfo;

use super::activity::{Activity, Call, CallGuard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a port says about its calls.
pub struct Calls<B> {
    /// Which calls stay open by design (a stream of reports or of health changes),
    /// by path: neither the request timeout nor the bound on calls in progress
    /// applies to them.
    pub stay_open: fn(&str) -> bool,
    /// The answer to a call not answered within the request timeout.
    pub timed_out: fn(Duration) -> Response<B>,
}

impl<B> Clone for Calls<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Calls<B> {}

/// The service every call of one connection goes through (see the module's header).
pub struct Tracked<S, B> {
    pub inner: S,
    pub activity: Arc<Activity>,
    pub timeout: Duration,
    pub max_calls: usize,
    pub calls: Calls<B>,
    /// `tollgate_calls_refused_total{port}`.
    pub refusals: Counter,
    /// The connection's addresses (what tonic's `Request::remote_addr` reads), in the
    /// extensions of the calls that stay open.
    pub info: TcpConnectInfo,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S, B>
where
    S: tower_service::Service<Request<Received>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Default + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let bounded = !(self.calls.stay_open)(request.uri().path());
        let Some(guard) = self.activity.begin(bounded, self.max_calls) else {
            self.refusals.inc();
            return Box::pin(std::future::ready(refuse(request.version())));
        };
        let mut request = request.map(|body| Received::new(body, guard.call()));
        // The calls that stay open are the ones that read their peer (the quota service
        // bounds its streams per connection by it); a ShouldRateLimit call never does,
        // and would pay for the extension map's allocations.
        if !bounded {
            request.extensions_mut().insert(self.info.clone());
        }
        let mut inner = self.inner.clone();
        let (timeout, timed_out) = (self.timeout, self.calls.timed_out);
        Box::pin(async move {
            let call = async move {
                poll_fn(|cx| inner.poll_ready(cx)).await?;
                inner.call(request).await
            };
            let response = match tokio::time::timeout(timeout, call).await {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(_) => timed_out(timeout),
            };
            guard.answered();
            Ok(response.map(|body| TrackedBody {
                body,
                _guard: Some(guard),
            }))
        })
    }
}

/// A call refused because the port has `max_calls` in progress. On HTTP/2 its
/// stream is reset with REFUSED_STREAM (hyper finds the reason in the error), which
/// says the call was not processed and may be retried, and frees the stream at once:
/// an answer instead would leave a stream whose client never ends it (a call
/// without a body) half-open, about 3 KiB each until the connection closes. HTTP/1
/// has no streams: 503.
fn refuse<B: Default>(version: http::Version) -> Result<Response<TrackedBody<B>>, BoxError> {
    if version == http::Version::HTTP_2 {
        return Err(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
    }
    let mut response = Response::new(TrackedBody::without_guard(B::default()));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    Ok(response)
}

/// An answer's body, holding its call's place among those in progress until hyper
/// is done with it.
pub struct TrackedBody<B> {
    body: B,
    _guard: Option<CallGuard>,
}

impl<B> TrackedBody<B> {
    /// The body of an answer that held no place (a refused call's).
    fn without_guard(body: B) -> Self {
        Self { body, _guard: None }
    }
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A call's request body: says when the request is in whole (its end read, or its
/// last frame marked so).
pub struct Received {
    body: Incoming,
    call: Option<Arc<Call>>,
}

impl Received {
    fn new(body: Incoming, call: Arc<Call>) -> Self {
        let mut received = Self {
            body,
            call: Some(call),
        };
        // A request without a body (a GET) is in whole already.
        if received.body.is_end_stream() {
            received.whole();
        }
        received
    }

    fn whole(&mut self) {
        if let Some(call) = self.call.take() {
            call.received();
        }
    }
}

impl Body for Received {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.body.is_end_stream() {
            self.whole();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
