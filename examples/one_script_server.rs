//! The straightforward Redis-backed server for `scripts/bench`: tonic + redis-rs, and
//! a script that runs INCRBY and PEXPIRE on one fixed-window counter per descriptor
//! (keyed by the descriptor's entries and the current window), answering OVER_LIMIT
//! when any count passes the limit. No batching across requests, no rules, no metrics:
//! what a service built the obvious way costs, to compare tollgate's Redis path with.
//!
//! - Standalone (`REDIS` is one URL): redis-rs' `ConnectionManager`, one EVALSHA per
//!   request carrying every descriptor's key; with `--per-descriptor`, one EVALSHA per
//!   descriptor, all of a request's sent at once (as the cluster mode does).
//! - Cluster (`--cluster`, `REDIS` a comma-separated list of nodes): a redis-rs cluster
//!   connection, one EVALSHA per descriptor, all of a request's sent at once. A
//!   descriptor's counters are hash-tagged by its entries, so every window of one
//!   counter lives in one slot; one key per script, so no script can meet CROSSSLOT.
//!
//! `cargo run --release --example one_script_server -- 127.0.0.1:8082 redis://127.0.0.1:6379`
//! `cargo run --release --example one_script_server -- --cluster 127.0.0.1:8082 redis://127.0.0.1:7000,redis://127.0.0.1:7001`
//!
//! `--window-ms` is the counters' window (scripts/bench gives the bench rules' hour, so
//! both servers keep the same counters alive); `--limit` the count past which a
//! descriptor is OVER_LIMIT. It shares only the generated protocol types with tollgate;
//! its flags, connection and serving are `support/baseline.rs`, shared with
//! `pipeline_server.rs`.

use std::fmt::Write as _;

use clap::Parser;
use redis::aio::ConnectionLike;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitService};
use tonic::{Request, Response, Status};

#[path = "support/baseline.rs"]
mod baseline;

use baseline::{Common, Redis};

/// One fixed-window counter per key: add the hits, start the window's expiry on the
/// first, return every count (in its own file, so `lua_cost` measures the same text).
const SCRIPT: &str = include_str!("support/one_script.lua");

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Standalone: one script per descriptor instead of one per request
    #[arg(long)]
    per_descriptor: bool,
    /// The keys' first word (two servers on one Redis keep their own counters)
    #[arg(long, default_value = "one")]
    prefix: String,
}

struct OneScript {
    redis: Redis,
    script: redis::Script,
    limit: u32,
    window_ms: u64,
    per_descriptor: bool,
    prefix: String,
}

impl OneScript {
    /// The counter of `descriptor` in window `window`: `one:{domain:k=v...}:window`.
    fn key(&self, domain: &str, descriptor: &RateLimitDescriptor, window: u64) -> String {
        let mut key = format!("{}:{{{domain}", self.prefix);
        for entry in &descriptor.entries {
            let _ = write!(key, ":{}={}", entry.key, entry.value);
        }
        let _ = write!(key, "}}:{window}");
        key
    }

    /// Runs the script on `keys` through `connection`: their counts, in order.
    async fn run<C: ConnectionLike>(
        &self,
        mut connection: C,
        keys: &[String],
        hits: u32,
    ) -> Result<Vec<u64>, Status> {
        let mut invocation = self.script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(hits).arg(self.window_ms);
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// One script per key, all sent at once: their counts, in order.
    async fn each<C: ConnectionLike + Clone>(
        &self,
        redis: &C,
        keys: &[String],
        hits: u32,
    ) -> Result<Vec<u64>, Status> {
        let calls = keys.chunks(1).map(|key| self.run(redis.clone(), key, hits));
        let counts = futures_util::future::try_join_all(calls).await?;
        Ok(counts.into_iter().flatten().collect())
    }

    /// Every key's count: one script for all (standalone) or one per key (cluster, or
    /// standalone with `--per-descriptor`).
    async fn counts(&self, keys: &[String], hits: u32) -> Result<Vec<u64>, Status> {
        match &self.redis {
            Redis::Standalone(redis) if self.per_descriptor => self.each(redis, keys, hits).await,
            Redis::Standalone(redis) => self.run(redis.clone(), keys, hits).await,
            Redis::Cluster(redis) => self.each(redis, keys, hits).await,
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for OneScript {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let hits = request.hits_addend.max(1);
        let window = baseline::now_ms()? / self.window_ms.max(1);
        let keys: Vec<String> = request
            .descriptors
            .iter()
            .map(|d| self.key(&request.domain, d, window))
            .collect();
        let counts = self.counts(&keys, hits).await?;
        let statuses: Vec<DescriptorStatus> = counts
            .iter()
            .map(|&count| DescriptorStatus {
                code: if count > u64::from(self.limit) {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                limit_remaining: u32::try_from(u64::from(self.limit).saturating_sub(count))
                    .unwrap_or(u32::MAX),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(baseline::answer(statuses)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let server = OneScript {
        redis: Redis::connect(&args.common).await?,
        script: redis::Script::new(SCRIPT),
        limit: args.common.limit,
        window_ms: args.common.window_ms,
        per_descriptor: args.per_descriptor,
        prefix: args.prefix,
    };
    baseline::serve(&args.common.addr, server).await
}
