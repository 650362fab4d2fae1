//! The tonic `RateLimitQuotaService`: one task per stream reads reports and writes
//! actions ([`super::stream`] decides them). A stream that sends garbage, breaks a
//! bound or sends nothing for `--rlqs-idle-stream-secs` ends alone; a server shutting
//! down ends every stream with UNAVAILABLE (Envoy reopens it elsewhere and keeps its
//! assignments meanwhile). When a stream ends its claims lose their weight at once;
//! the tokens they hold stay counted until the assignments they were sent in expire.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::error::RlqsError;
use super::options::DELIVERY_MARGIN;
use super::stream::{self, metered};
use super::{Registration, Rlqs};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use crate::proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::telemetry::ratelimited;

/// The gRPC metadata naming an Envoy across its streams (set it in the filter's
/// `grpc_service.initial_metadata`): a reopened stream then takes over its old claim
/// instead of waiting for it to run out.
pub const CLIENT_ID_HEADER: &str = "rlqs-client-id";

/// How long releasing a finished stream's claims may take.
const RELEASE_BUDGET: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct RlqsGrpc {
    rlqs: Arc<Rlqs>,
}

impl RlqsGrpc {
    pub fn new(rlqs: Arc<Rlqs>) -> Self {
        Self { rlqs }
    }

    pub fn into_server(self) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsGrpc {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let client = client_id(request.metadata())?;
        let peer = request.remote_addr();
        let registration = self.rlqs.register(client, peer).map_err(|e| {
            self.rlqs.metrics.rlqs().stream_error(e.reason());
            Status::from(e)
        })?;
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(serve_stream(
            self.rlqs.clone(),
            registration,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn client_id(metadata: &tonic::metadata::MetadataMap) -> Result<Option<String>, Status> {
    let Some(value) = metadata.get(CLIENT_ID_HEADER) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| Status::from(RlqsError::BadClientId))?;
    if text.is_empty() || text.len() > 128 || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RlqsError::BadClientId.into());
    }
    Ok(Some(text.to_owned()))
}

/// Reads reports and answers them until the stream ends, fails, idles, or the server
/// stops.
async fn serve_stream(
    rlqs: Arc<Rlqs>,
    registration: Registration,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
) {
    let mut shutdown = rlqs.shutdown.subscribe();
    let idle = rlqs.options.idle_after;
    let entry = registration.entry.clone();
    let ended: Option<RlqsError> = loop {
        if *shutdown.borrow_and_update() {
            break Some(RlqsError::ShuttingDown);
        }
        let message = tokio::select! {
            message = tokio::time::timeout(idle, inbound.message()) => message,
            _ = shutdown.changed() => continue,
            () = tx.closed() => break None,
        };
        let message = match message {
            Err(_) => {
                break Some(RlqsError::Idle {
                    secs: idle.as_secs(),
                });
            }
            Ok(Ok(Some(message))) => message,
            Ok(Ok(None)) => break None,
            // A message that does not decode is the client's fault; a transport
            // error (Envoy went away) is nobody's to answer.
            Ok(Err(status)) if status.code() == tonic::Code::Internal => {
                break Some(RlqsError::Undecodable(status.message().to_owned()));
            }
            Ok(Err(_)) => break None,
        };
        let handled = stream::handle(&entry, &rlqs, message).await;
        rlqs.metrics.rlqs().state_bytes(rlqs.budget.used());
        match handled {
            // An answer must reach Envoy within the margin the ledger allows it; a
            // client that does not read its answers has none in force.
            Ok(Some(response)) => {
                match tokio::time::timeout(DELIVERY_MARGIN / 2, tx.send(Ok(response))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break None,
                    Err(_) => break Some(RlqsError::NotReading),
                }
            }
            Ok(None) => {}
            Err(error) => break Some(error),
        }
    };
    if let Some(error) = ended {
        if !matches!(error, RlqsError::ShuttingDown) {
            rlqs.metrics.rlqs().stream_error(error.reason());
            // Per reason at most once a second: a client can end many streams at once.
            if let Some(suppressed) = ratelimited::admit(&["rlqs_stream_refused", error.reason()]) {
                let stream = entry.lock().own.clone();
                tracing::info!(event = "rlqs_stream_refused", %stream, %error, suppressed, "RLQS stream ended");
            }
        }
        // Never waits: a client that does not read gets no status either.
        let _ = tx.try_send(Err(error.into()));
    }
    release(&rlqs, &registration).await;
    drop(registration);
    rlqs.metrics.rlqs().state_bytes(rlqs.budget.used());
}

/// Releases the stream's claims, within a budget (a stuck Redis must not keep the
/// task alive; the claims then go stale on their own).
async fn release(rlqs: &Rlqs, registration: &Registration) {
    let (keys, name, own) = {
        let state = registration.entry.lock();
        let keys: Vec<Box<str>> = state
            .buckets
            .values()
            .filter_map(|b| b.ledger_key.clone())
            .collect();
        (keys, state.name.clone(), state.own.clone())
    };
    let timing = rlqs.options.timing();
    let all = futures_util::future::join_all(
        keys.iter()
            .map(|key| metered(rlqs, rlqs.ledger.release(key, &name, &own, &own, timing))),
    );
    let _ = tokio::time::timeout(RELEASE_BUDGET, all).await;
}
