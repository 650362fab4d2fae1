//! The tonic `RateLimitService`: protocol translation only. The decision is the
//! [`Limiter`]'s; errors become statuses through the one mapping in [`crate::error`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::limiter::Limiter;
use crate::proto::{RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer};

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
        let request = request.into_inner();
        match self.limiter.should_rate_limit(&request).await {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                tracing::debug!(domain = %request.domain, %error, "request refused");
                Err(error.into())
            }
        }
    }
}
