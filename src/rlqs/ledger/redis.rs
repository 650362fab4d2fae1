//! The claims in Redis (standalone, Sentinel or Cluster), so Envoys connected to
//! different replicas divide one limit. A bucket is a hash of running totals and one
//! field per claim, and a sorted set of the claims' deadlines, both under the hash
//! tag its counter would have; `lua/rlqs.lua` (the twin of `rlqs/claims/`) reads and
//! writes the reporter's claim, the totals and a few due deadlines in one atomic call.
//! Calls go through the store's protections (`store::side`: its connection settings,
//! timeout and breaker); a bucket whose ledger cannot answer keeps its last assignment
//! while its hold lasts.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::{ClaimRequest, Granted, Ledger, LedgerFuture, Timing};
use crate::store::breaker::BreakerOptions;
use crate::store::redis::connect::RedisOptions;
use crate::store::side::SideCalls;

static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/rlqs.lua")));

/// The breaker's name in its log lines.
const NODE: &str = "rlqs-ledger";

pub struct RedisLedger {
    calls: SideCalls,
}

impl RedisLedger {
    /// Checks the settings now; connects on first use.
    pub fn new(options: &RedisOptions, breaker: BreakerOptions) -> Result<Self, String> {
        let calls =
            SideCalls::new(options, breaker, NODE, vec![&*SCRIPT]).map_err(|e| e.to_string())?;
        Ok(Self { calls })
    }
}

/// The deadlines' set beside the bucket's hash (same hash tag, same slot).
fn due_key(key: &str) -> String {
    format!("{key}:due")
}

/// The script's timing arguments, and the keys' TTL: long enough that every
/// deadline in them has passed when they go (a claim's latest is its hold's end).
fn timing_args(timing: &Timing) -> [String; 4] {
    let ttl = 2 * (timing.stale_ms + timing.hold_ms + timing.grace_ms);
    [timing.stale_ms, timing.hold_ms, timing.grace_ms, ttl].map(|ms| ms.to_string())
}

impl Ledger for RedisLedger {
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted> {
        Box::pin(async move {
            let report = &request.report;
            let due = due_key(request.key);
            let weight = report.weight.map(|w| w.to_string()).unwrap_or_default();
            let tokens = report.tokens.to_string();
            let timing = timing_args(&request.timing);
            let mut args: Vec<&str> = vec![
                "claim",
                report.name,
                report.alias,
                report.owner,
                &weight,
                if report.resumed { "1" } else { "0" },
                &tokens,
            ];
            args.extend(timing.iter().map(String::as_str));
            let (tokens, streams, age_ms, on_alias, partial): (u64, u64, u64, u8, u8) = self
                .calls
                .script(&SCRIPT, &[request.key, &due], &args)
                .await?;
            Ok(Granted {
                tokens,
                streams: streams as usize,
                age: Duration::from_millis(age_ms),
                on_alias: on_alias == 1,
                partial: partial == 1,
            })
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        name: &'a str,
        alias: &'a str,
        owner: &'a str,
        timing: Timing,
    ) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let due = due_key(key);
            let timing = timing_args(&timing);
            let mut args: Vec<&str> = vec!["release", name, alias, owner, "", "0", "0"];
            args.extend(timing.iter().map(String::as_str));
            let _: i64 = self.calls.script(&SCRIPT, &[key, &due], &args).await?;
            Ok(())
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
