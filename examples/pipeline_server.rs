//! The "pipeline server" for `scripts/bench`: a server that counts as
//! envoyproxy/ratelimit does, so tollgate is measured against the service it replaces.
//! Per request, ONE Redis pipeline of `INCRBY key hits` + `EXPIRE key window` per
//! descriptor (redis-rs, async, the multiplexed connection), no script: not atomic
//! across descriptors, and a denied request has consumed its hits, as upstream.
//!
//! - The key is upstream's cache key (`limiter/cache_key.go`): the prefix, then
//!   `domain_`, each entry's `key_value_`, and the window's start in seconds,
//!   `now - now % window`, from the server's own clock; the window is in the key, so
//!   a new window is a new key and EXPIRE (the whole window, renewed on every hit, as
//!   upstream) only collects the old ones.
//! - A descriptor is OVER_LIMIT when its INCRBY result passes the limit (upstream's
//!   `after > limit`); every status carries upstream's fields: `current_limit`,
//!   `limit_remaining` (0 when over), `duration_until_reset` (to the window's end).
//! - On a cluster (`--cluster`) one pipeline per descriptor, all of a request's sent at
//!   once through redis-rs' cluster connection, which routes each by its key: a
//!   pipeline goes to one slot, and the keys carry no hash tag (upstream's do not), so
//!   a request's counters spread over the masters.
//!
//! No rules: one limit and one window for every descriptor (`--limit`, `--window-ms`:
//! one of upstream's units, a second to a year), as `one_script_server.rs` takes them
//! and `scripts/bench` gives both (benches/config/'s one rule per key, 10^9 per hour).
//! No near-limit statistics, local cache or per-second Redis: upstream's defaults.
//!
//! `cargo run --release --example pipeline_server -- --window-ms 3600000 127.0.0.1:8083 redis://127.0.0.1:6379`
//! `cargo run --release --example pipeline_server -- --cluster 127.0.0.1:8083 redis://127.0.0.1:7000,redis://127.0.0.1:7001`

use clap::Parser;
use redis::aio::ConnectionLike;
use tollgate::proto::rate_limit_response::rate_limit::Unit;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitService};
use tonic::{Request, Response, Status};

#[path = "support/baseline.rs"]
mod baseline;

use baseline::{Common, Redis};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// The keys' first word, as upstream's CACHE_KEY_PREFIX (two servers on one Redis
    /// keep their own counters)
    #[arg(long, default_value = "pipeline:")]
    prefix: String,
}

/// Upstream's units and their lengths in seconds (`utils.UnitToDivider`).
const UNITS: [(Unit, u64); 7] = [
    (Unit::Second, 1),
    (Unit::Minute, 60),
    (Unit::Hour, 3600),
    (Unit::Day, 86_400),
    (Unit::Week, 604_800),
    (Unit::Month, 2_592_000),
    (Unit::Year, 31_536_000),
];

struct PipelineServer {
    redis: Redis,
    prefix: String,
    limit: u32,
    /// The window, in seconds.
    window: u64,
    /// The window as upstream names it, for `current_limit`.
    unit: Unit,
}

impl PipelineServer {
    /// Writes `descriptor`'s counter key in the window starting at `start` into `key`
    /// (cleared first): `<prefix><domain>_<k>_<v>_..._<start>`.
    fn key(&self, key: &mut Vec<u8>, domain: &str, descriptor: &RateLimitDescriptor, start: u64) {
        key.clear();
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(domain.as_bytes());
        key.push(b'_');
        for entry in &descriptor.entries {
            key.extend_from_slice(entry.key.as_bytes());
            key.push(b'_');
            key.extend_from_slice(entry.value.as_bytes());
            key.push(b'_');
        }
        key.extend_from_slice(itoa::Buffer::new().format(start).as_bytes());
    }

    /// Appends one descriptor's commands: INCRBY (its reply kept), EXPIRE (ignored).
    fn append(&self, pipe: &mut redis::Pipeline, key: &[u8], hits: u32) {
        pipe.cmd("INCRBY").arg(key).arg(hits);
        pipe.cmd("EXPIRE").arg(key).arg(self.window).ignore();
    }

    /// Sends `pipe` on `connection`: its INCRBY results, in order.
    async fn send<C: ConnectionLike>(
        pipe: &redis::Pipeline,
        mut connection: C,
    ) -> Result<Vec<u64>, Status> {
        pipe.query_async(&mut connection)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// Every descriptor's count after this request's hits: one pipeline for the
    /// request, or on a cluster one per descriptor, all at once.
    async fn counts(
        &self,
        request: &RateLimitRequest,
        hits: u32,
        start: u64,
    ) -> Result<Vec<u64>, Status> {
        let mut key = Vec::with_capacity(64);
        match &self.redis {
            Redis::Standalone(redis) => {
                let mut pipe = redis::Pipeline::with_capacity(2 * request.descriptors.len());
                for descriptor in &request.descriptors {
                    self.key(&mut key, &request.domain, descriptor, start);
                    self.append(&mut pipe, &key, hits);
                }
                Self::send(&pipe, redis.clone()).await
            }
            Redis::Cluster(redis) => {
                let pipes = request.descriptors.iter().map(|descriptor| {
                    self.key(&mut key, &request.domain, descriptor, start);
                    let mut pipe = redis::Pipeline::with_capacity(2);
                    self.append(&mut pipe, &key, hits);
                    async move { Self::send(&pipe, redis.clone()).await }
                });
                let counts = futures_util::future::try_join_all(pipes).await?;
                Ok(counts.into_iter().flatten().collect())
            }
        }
    }

    /// A descriptor's status after its INCRBY returned `count`, as upstream's
    /// `GetResponseDescriptorStatus`.
    fn status(&self, count: u64, reset: u64) -> DescriptorStatus {
        let over = count > u64::from(self.limit);
        DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: self.limit,
                unit: self.unit as i32,
            }),
            limit_remaining: if over {
                0
            } else {
                // count <= limit, a u32.
                self.limit - u32::try_from(count).unwrap_or(self.limit)
            },
            duration_until_reset: Some(prost_types::Duration {
                seconds: i64::try_from(reset).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            quota: None,
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for PipelineServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let hits = request.hits_addend.max(1);
        let now = baseline::now_ms()? / 1000;
        let into = now % self.window;
        let counts = self.counts(&request, hits, now - into).await?;
        let statuses: Vec<DescriptorStatus> = counts
            .into_iter()
            .map(|count| self.status(count, self.window - into))
            .collect();
        Ok(Response::new(baseline::answer(statuses)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let common = &args.common;
    let Some(&(unit, window)) = UNITS.iter().find(|(_, s)| s * 1000 == common.window_ms) else {
        let units: Vec<String> = UNITS.iter().map(|(_, s)| (s * 1000).to_string()).collect();
        return Err(format!(
            "--window-ms {} is none of upstream's units (ms: {})",
            common.window_ms,
            units.join(", ")
        )
        .into());
    };
    let server = PipelineServer {
        redis: Redis::connect(common).await?,
        prefix: args.prefix.clone(),
        limit: common.limit,
        window,
        unit,
    };
    baseline::serve(&common.addr, server).await
}
