//! The claims in Redis (standalone, Sentinel or Cluster), so Envoys connected to
//! different replicas divide one limit. Each bucket is one hash under its counter's
//! hash tag; `lua/rlqs.lua` reads and rewrites it in one atomic call (EVALSHA with the
//! NOSCRIPT fallback of `store/redis/scripts`). The connection is made as the store's
//! are (`store/redis/connect`, the same settings, TLS and Sentinel), on first use and
//! again after a failure, never more than once a second: reports arrive every few
//! seconds, and a bucket whose ledger cannot answer keeps its last assignment.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Script;
use tokio::sync::Mutex;

use super::{ClaimRequest, Granted, Ledger, LedgerError, LedgerFuture};
use crate::store::redis::connect::{self, Connection, RedisOptions};
use crate::store::redis::scripts::evalsha;

static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/rlqs.lua")));

/// Between two connection attempts after a failure.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

pub struct RedisLedger {
    options: RedisOptions,
    /// The connection once made (clones share it), and when it was last tried.
    connection: Mutex<(Option<Connection>, Option<Instant>)>,
}

impl RedisLedger {
    /// Checks the settings now; connects on first use.
    pub fn new(options: RedisOptions) -> Result<Self, String> {
        connect::check(&options)?;
        Ok(Self {
            options,
            connection: Mutex::new((None, None)),
        })
    }

    async fn connection(&self) -> Result<Connection, LedgerError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = &slot.0 {
            return Ok(c.clone());
        }
        if slot.1.is_some_and(|at| at.elapsed() < RECONNECT_EVERY) {
            return Err(LedgerError::Unavailable(
                "not connected to Redis yet".into(),
            ));
        }
        slot.1 = Some(Instant::now());
        let made = tokio::time::timeout(
            self.options.connect_timeout,
            connect::connect(&self.options),
        )
        .await
        .map_err(|_| LedgerError::Unavailable("connecting to Redis timed out".into()))?
        .map_err(LedgerError::Unavailable)?;
        slot.0 = Some(made.clone());
        Ok(made)
    }

    /// A call that failed on the connection: the next call makes a new one (the
    /// connection types reconnect themselves too; this covers a cluster whose
    /// topology changed under a connection that gave up).
    async fn forget(&self) {
        let mut slot = self.connection.lock().await;
        slot.0 = None;
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
        script: Option<&Script>,
    ) -> Result<T, LedgerError> {
        let mut con = self.connection().await?;
        let budget = self.options.timeout.max(Duration::from_secs(1));
        let call = async {
            match script {
                Some(script) => evalsha(&mut con, &cmd, script).await,
                None => cmd.query_async(&mut con).await,
            }
        };
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() {
                    self.forget().await;
                }
                Err(LedgerError::Unavailable(connect::describe(&e)))
            }
            Err(_) => Err(LedgerError::Unavailable(format!(
                "no answer within {budget:?}"
            ))),
        }
    }
}

/// A demand as the script stores it: shortest round-trip text, "" when unknown.
fn demand_text(demand: Option<f64>) -> String {
    demand.map_or_else(String::new, |d| format!("{d:e}"))
}

impl Ledger for RedisLedger {
    fn claim<'a>(&'a self, request: ClaimRequest<'a>) -> LedgerFuture<'a, Granted> {
        Box::pin(async move {
            let stale_ms = request.stale_after.as_millis() as u64;
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(CLAIM.get_hash())
                .arg(1)
                .arg(request.key)
                .arg(request.stream)
                .arg(demand_text(request.demand))
                .arg(request.tokens)
                .arg(stale_ms)
                // The key outlives its last claim by a little, then goes on its own.
                .arg(stale_ms.saturating_mul(2));
            let (tokens, streams, age_ms): (u64, u64, u64) = self.run(cmd, Some(&CLAIM)).await?;
            Ok(Granted {
                tokens,
                streams: streams as usize,
                age: Duration::from_millis(age_ms),
            })
        })
    }

    fn release<'a>(&'a self, key: &'a str, stream: &'a str) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(key).arg(format!("c:{stream}"));
            let _: i64 = self.run(cmd, None).await?;
            Ok(())
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
