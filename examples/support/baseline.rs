//! What `scripts/bench`'s Redis baselines share (`one_script_server.rs`,
//! `pipeline_server.rs`): their common flags (where to serve, which Redis, the one
//! limit and window every descriptor counts against), the connection (redis-rs'
//! multiplexed `ConnectionManager` on one server, the cluster connection on a
//! cluster), the server's clock and serving a `RateLimitService`, and tollgate's
//! allocator. Each server owns only how it counts.

use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::{RateLimitResponse, RateLimitService, RateLimitServiceServer};
use tonic::Status;

/// tollgate's allocator (`src/main.rs` says why): like its release profile, a setting
/// the baselines share with it, so a ratio compares code.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The flags both baselines take, in the same spelling, so `scripts/bench` starts them
/// alike.
#[derive(Args)]
pub struct Common {
    /// gRPC address to serve on
    #[arg(default_value = "127.0.0.1:8082")]
    pub addr: String,
    /// redis://HOST:PORT; with --cluster, the nodes, comma-separated
    #[arg(default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    /// REDIS names a cluster's nodes
    #[arg(long)]
    pub cluster: bool,
    /// A descriptor whose count passes this is OVER_LIMIT (one rule for every key, as
    /// benches/config/ has for scripts/bench's descriptors)
    #[arg(long, default_value_t = 1_000_000_000)]
    pub limit: u32,
    /// The counters' window, in milliseconds
    #[arg(long, default_value_t = 1000)]
    pub window_ms: u64,
}

/// Where the commands go.
pub enum Redis {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Redis {
    /// Connects to `common.redis`: one server, or the cluster it names.
    pub async fn connect(common: &Common) -> Result<Self, redis::RedisError> {
        Ok(if common.cluster {
            let nodes: Vec<&str> = common.redis.split(',').collect();
            Self::Cluster(ClusterClient::new(nodes)?.get_async_connection().await?)
        } else {
            let client = redis::Client::open(common.redis.as_str())?;
            Self::Standalone(ConnectionManager::new(client).await?)
        })
    }
}

/// The server's clock, in milliseconds since the epoch.
pub fn now_ms() -> Result<u64, Status> {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The answer of a request whose descriptors got `statuses`: OVER_LIMIT when any is.
pub fn answer(statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        ..Default::default()
    }
}

/// Serves `service` on `addr` until the process ends.
pub async fn serve<S: RateLimitService>(
    addr: &str,
    service: S,
) -> Result<(), Box<dyn std::error::Error>> {
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .serve(addr.parse()?)
        .await?;
    Ok(())
}
