//! The tonic `RateLimitService`: protocol translation only. The decision is the
//! [`Limiter`]'s; errors become statuses through the one mapping in [`crate::error`].
//! Each call runs in a request span whose parent is the `traceparent` Envoy sends in
//! the call's metadata ([`crate::telemetry::propagation`]).

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::limiter::Limiter;
use crate::proto::{RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer};
use crate::telemetry::propagation::{self, MetadataExtractor};

/// Envoy's `envoy.service.ratelimit.v3.RateLimitService`.
#[derive(Clone)]
pub struct RateLimitGrpc {
    limiter: Arc<Limiter>,
}

impl RateLimitGrpc {
    pub fn new(limiter: Arc<Limiter>) -> Self {
        Self { limiter }
    }

    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let span = propagation::request_span(
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            &request.get_ref().domain,
            &MetadataExtractor(request.metadata()),
        );
        let request = request.into_inner();
        let result = self
            .limiter
            .should_rate_limit(&request)
            .instrument(span.clone())
            .await;
        propagation::record_decision(&span, &result);
        match result {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                tracing::debug!(domain = %request.domain, %error, "request refused");
                Err(error.into())
            }
        }
    }
}
