//! The straightforward Redis-backed server for `scripts/bench`: tonic + redis-rs'
//! `ConnectionManager`, and per request one EVALSHA of a script that runs INCRBY and
//! PEXPIRE on one fixed-window counter per descriptor (keyed by the descriptor's
//! entries and the current second), answering OVER_LIMIT when any count passes the
//! limit. No batching across requests, no rules, no metrics: what a service built the
//! obvious way costs, to compare tollgate's Redis path with.
//!
//! `cargo run --release --example one_script_server -- 127.0.0.1:8082 redis://127.0.0.1:6379 [limit]`
//!
//! It shares only the generated protocol types with tollgate.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::{
    RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer,
};
use tonic::{Request, Response, Status};

/// One fixed-window counter per key: add the hits, start the window's expiry on the
/// first, return every count.
const SCRIPT: &str = r"
local counts = {}
for i, key in ipairs(KEYS) do
  local count = redis.call('INCRBY', key, ARGV[1])
  if count == tonumber(ARGV[1]) then
    redis.call('PEXPIRE', key, ARGV[2])
  end
  counts[i] = count
end
return counts
";

struct OneScript {
    redis: ConnectionManager,
    script: redis::Script,
    limit: u64,
}

#[tonic::async_trait]
impl RateLimitService for OneScript {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let hits = request.hits_addend.max(1);
        let window = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| Status::internal(e.to_string()))?
            .as_secs();
        let mut invocation = self.script.prepare_invoke();
        for descriptor in &request.descriptors {
            let mut key = format!("one:{}", request.domain);
            for entry in &descriptor.entries {
                let _ = write!(key, ":{}={}", entry.key, entry.value);
            }
            let _ = write!(key, ":{window}");
            invocation.key(key);
        }
        invocation.arg(hits).arg(1000);
        let mut redis = self.redis.clone();
        let counts: Vec<u64> = invocation
            .invoke_async(&mut redis)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let statuses: Vec<DescriptorStatus> = counts
            .iter()
            .map(|&count| DescriptorStatus {
                code: if count > self.limit {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                limit_remaining: u32::try_from(self.limit.saturating_sub(count))
                    .unwrap_or(u32::MAX),
                ..Default::default()
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8082".to_owned());
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let limit = match args.next() {
        Some(limit) => limit.parse()?,
        None => 1_000_000_000,
    };
    let redis = ConnectionManager::new(redis::Client::open(url)?).await?;
    let server = OneScript {
        redis,
        script: redis::Script::new(SCRIPT),
        limit,
    };
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(server))
        .serve(addr.parse()?)
        .await?;
    Ok(())
}
