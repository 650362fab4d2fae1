//! The gRPC floor for `scripts/bench`: a tonic `RateLimitService` that answers OK to
//! every call and does nothing else. Whatever tollgate spends above this server's CPU
//! per request is tollgate's own work (matching, counting, answering, metrics).
//!
//! `cargo run --release --example noop_server -- 127.0.0.1:8081`
//!
//! It shares only the generated protocol types with tollgate, so nothing of
//! tollgate's serving path (limiter, metrics, tracing) is in the figure.

use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{
    RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer,
};
use tonic::{Request, Response, Status};

struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8081".to_owned())
        .parse()?;
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Noop))
        .serve(addr)
        .await?;
    Ok(())
}
